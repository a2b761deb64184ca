// SPDX-License-Identifier: GPL-2.0
//! The tool's error type: every way a run can fail, with a message that
//! says what happened on the wire.

use std::fmt;
use std::io;

use iwarp_core::mpa::MpaError;
use iwarp_core::rx::RxError;
use iwarp_core::terminate::{MpaCode, TermCode, TerminateRepr};
use iwarp_core::tx::TxError;

/// Result with the tool's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Why a run failed.
#[derive(Debug)]
pub enum Error {
    /// Bad command line.
    Usage(String),
    /// A socket operation failed; `what` names it.
    Io {
        /// The operation, e.g. "connect to 127.0.0.1:7174".
        what: String,
        /// The OS error.
        err: io::Error,
    },
    /// Nothing arrived within the timeout; `what` says what was awaited.
    Timeout(String),
    /// The MPA handshake failed.
    Mpa(MpaError),
    /// The responder rejected the connection.
    Rejected {
        /// Private data of the reject Reply.
        private_data: Vec<u8>,
    },
    /// The peer closed the connection (at an FPDU boundary).
    PeerClosed,
    /// The peer reset the connection.
    PeerReset,
    /// The peer closed the connection in the middle of an FPDU; a
    /// TERMINATE (LLP/MPA "connection lost") was sent back if possible.
    Truncated,
    /// The peer sent a TERMINATE.
    PeerTerminate(TerminateRepr),
    /// The peer sent a TERMINATE that does not parse.
    BadTerminate,
    /// An inbound frame was invalid: its TERMINATE was sent to the peer.
    LocalTerminate(RxError),
    /// The transmit builder refused a message (a local bug or bad option).
    Tx(TxError),
    /// A local resource limit or misuse (ORD exhausted, unknown STag, ...).
    Local(String),
    /// The peer broke the application protocol.
    Protocol(String),
    /// Verified data differs from what was expected.
    Mismatch {
        /// Which transfer (e.g. "ping 3 echo").
        what: String,
        /// Offset of the first differing octet.
        offset: usize,
        /// The expected octet.
        expected: u8,
        /// The octet found.
        actual: u8,
    },
}

/// Whether `err` is a read that timed out: a socket with a read timeout
/// reports it as `WouldBlock` (EAGAIN) on Linux, `TimedOut` elsewhere.
pub fn is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl Error {
    /// An error for operation `what`: a timeout becomes [`Error::Timeout`],
    /// a reset (or a write to a reset connection) [`Error::PeerReset`],
    /// anything else [`Error::Io`].
    pub fn io(what: impl Into<String>, err: io::Error) -> Self {
        let what = what.into();
        if is_timeout(&err) {
            return Error::Timeout(what);
        }
        match err.kind() {
            // EPIPE: writing to a connection the peer reset.
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Error::PeerReset,
            _ => Error::Io { what, err },
        }
    }
}

/// Formats a TERMINATE code as `layer/type/code (name)`.
pub fn term_code_str(code: TermCode) -> String {
    let (l, t, c) = code.wire();
    format!("{l}/{t}/{c:#04x} ({code:?})")
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(m) => write!(f, "usage: {m}"),
            Error::Io { what, err } => write!(f, "{what}: {err}"),
            Error::Timeout(what) => write!(f, "timed out: {what}"),
            Error::Mpa(e) => write!(f, "MPA handshake failed: {e}"),
            Error::Rejected { private_data } => write!(
                f,
                "connection rejected by the peer (private data: {})",
                if private_data.is_empty() { "none".to_string() } else { hex(private_data) }
            ),
            Error::PeerClosed => f.write_str("peer closed the connection"),
            Error::PeerReset => f.write_str("peer reset the connection"),
            Error::Truncated => write!(
                f,
                "peer closed the connection inside an FPDU: sent TERMINATE {}",
                term_code_str(TermCode::Mpa(MpaCode::ConnectionLost))
            ),
            Error::PeerTerminate(t) => {
                write!(f, "peer sent TERMINATE {}", term_code_str(t.code))
            }
            Error::BadTerminate => f.write_str("peer sent a malformed TERMINATE"),
            Error::LocalTerminate(e) => write!(
                f,
                "invalid frame from peer ({:?}): sent TERMINATE {}",
                e.kind,
                term_code_str(e.code())
            ),
            Error::Tx(e) => write!(f, "cannot build message: {e:?}"),
            Error::Local(m) => write!(f, "local error: {m}"),
            Error::Protocol(m) => write!(f, "protocol error: {m}"),
            Error::Mismatch { what, offset, expected, actual } => write!(
                f,
                "data mismatch in {what} at offset {offset}: expected {expected:#04x}, got {actual:#04x}"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<TxError> for Error {
    fn from(e: TxError) -> Self {
        Error::Tx(e)
    }
}

impl From<MpaError> for Error {
    fn from(e: MpaError) -> Self {
        Error::Mpa(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_map_to_timeout() {
        for kind in [io::ErrorKind::WouldBlock, io::ErrorKind::TimedOut] {
            assert!(is_timeout(&io::Error::from(kind)));
            assert!(
                matches!(Error::io("read", io::Error::from(kind)), Error::Timeout(w) if w == "read")
            );
        }
        for kind in [
            io::ErrorKind::Interrupted,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::UnexpectedEof,
        ] {
            assert!(!is_timeout(&io::Error::from(kind)));
        }
        assert!(matches!(
            Error::io("read", io::ErrorKind::BrokenPipe.into()),
            Error::PeerReset
        ));
        assert!(matches!(
            Error::io("read", io::ErrorKind::UnexpectedEof.into()),
            Error::Io { .. }
        ));
    }
}
