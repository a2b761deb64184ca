// SPDX-License-Identifier: GPL-2.0
//! Running one case: connect, (mis)behave, watch the reaction, judge it.
//!
//! After the hostile octets the runner waits `quiet` for a reaction; if
//! none came it sends a probe (a zero-length RDMA Read Request, which a
//! peer still serving the stream answers), waits `timeout`, then sends
//! FIN and waits `timeout` again for the close. A peer that reacts to
//! none of this hangs the case.

use std::fmt;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use iwarp_core::ddp::{
    DdpHeader, CTRL_DV_MASK, CTRL_DV_SHIFT, CTRL_OPCODE_MASK, CTRL_RV_MASK, CTRL_RV_SHIFT,
};
use iwarp_core::mpa::{
    CrcPolicy, EnhancedData, FrameKind, MpaFlags, MpaFrameRepr, Revision, RtrSet, FRAME_HEADER_LEN,
    KEY_LEN,
};
use iwarp_core::rdmap::{Opcode, ReadRequest, QN_SEND};
use iwarp_core::terminate::{TermCode, TerminateRepr};
use iwarp_core::tx::Message;

use super::cases::{rtr_set, Case, Expect, Miss, Plan, MARKER_TERM};
use super::session::{End, Inbound, Session, SINK_STAG, SINK_TO};
use crate::conn::{self, MpaOptions};
use crate::error::{is_timeout, term_code_str, Error};
use crate::inject::{send_segment, set_control, PROBE};

/// Timing and sizes of a run.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Bound on every wait for a reaction.
    pub timeout: Duration,
    /// How long to wait for a reaction before probing.
    pub quiet: Duration,
    /// Bound for the peer to give up on a stalled MPA Request.
    pub stall_timeout: Duration,
    /// The rping buffer size this side advertises (at most the peer's).
    pub size: usize,
    /// Read the Terminate Control field as upstream siw writes it (C
    /// bitfields on a little-endian machine: the layer in the low nibble)
    /// instead of as RFC 5040 lays it out.
    pub le_terminate: bool,
    /// Pause between the peer's MPA Reply and the case's first octet (0:
    /// at once, the hostile timing; a pause steps around races of the
    /// peer's connection setup to reach what lies behind them).
    pub settle: Duration,
}

/// What came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The peer sent this TERMINATE.
    Terminate(TerminateRepr),
    /// The peer sent a TERMINATE that does not parse; its Terminate
    /// Control field if it arrived.
    BadTerminate(Option<[u8; 4]>),
    /// MPA reject Reply.
    Rejected,
    /// An accepting MPA Reply to a Request that must be refused.
    MpaAccepted,
    /// The MPA exchange failed on our side (the Reply broke a rule).
    MpaFailed(String),
    /// TCP FIN without TERMINATE.
    Closed,
    /// TCP FIN inside an FPDU of the peer's.
    ClosedMidFpdu,
    /// TCP reset.
    Reset,
    /// No reaction until our FIN; then a close.
    ClosedAfterFin,
    /// The probe was answered: the hostile frame was accepted silently.
    Accepted,
    /// All of the Read Requests beyond the IRD were answered.
    Served(u32),
    /// The rping exchange completed with verified data.
    Completed,
    /// Following the mutation the peer asked for something a correct
    /// client refuses: this side sent this TERMINATE.
    LocalTerminate(TermCode),
    /// The peer answered a Read of a guessed STag with data.
    LeakedRead(u64),
    /// The peer sent a frame the receive parser refuses.
    PeerInvalid(String),
    /// No reaction within the timeout, nor a close after our FIN.
    Hang(String),
    /// The case could not be run (connection refused, setup broke, ...).
    Error(String),
}

/// Layer, type and code of a Terminate Control field written through C
/// bitfields on a little-endian machine (`layer:4, etype:4` in the first
/// octet's low and high nibbles, as upstream siw declares them): the RFC
/// puts the layer in the high nibble.
pub fn le_bitfield_code(c: [u8; 4]) -> (u8, u8, u8) {
    (c[0] & 0xf, c[0] >> 4, c[1])
}

fn code3(c: TermCode) -> String {
    let (l, t, c) = c.wire();
    format!("{l}/{t}/{c:#04x}")
}

impl Outcome {
    /// Short label for histograms.
    pub fn label(&self) -> String {
        match self {
            Outcome::Terminate(t) => format!("terminate {}", code3(t.code)),
            Outcome::BadTerminate(None) => "malformed-terminate".into(),
            Outcome::BadTerminate(Some(c)) => {
                let (l, t, code) = le_bitfield_code(*c);
                format!("malformed-terminate [LE bitfield order {l}/{t}/{code:#04x}]")
            }
            Outcome::Rejected => "reject".into(),
            Outcome::MpaAccepted => "mpa-accepted".into(),
            Outcome::MpaFailed(_) => "mpa-failed".into(),
            Outcome::Closed => "close".into(),
            Outcome::ClosedMidFpdu => "close-mid-fpdu".into(),
            Outcome::Reset => "reset".into(),
            Outcome::ClosedAfterFin => "close-after-fin".into(),
            Outcome::Accepted => "accepted".into(),
            Outcome::Served(_) => "served".into(),
            Outcome::Completed => "completed".into(),
            Outcome::LocalTerminate(c) => format!("local-terminate {}", code3(*c)),
            Outcome::LeakedRead(_) => "leaked-read".into(),
            Outcome::PeerInvalid(_) => "peer-invalid".into(),
            Outcome::Hang(_) => "hang".into(),
            Outcome::Error(_) => "error".into(),
        }
    }

    fn is_close(&self) -> bool {
        matches!(
            self,
            Outcome::Closed | Outcome::ClosedMidFpdu | Outcome::Reset | Outcome::ClosedAfterFin
        )
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Terminate(t) => write!(f, "TERMINATE {}", term_code_str(t.code)),
            Outcome::BadTerminate(None) => f.write_str("malformed TERMINATE"),
            Outcome::BadTerminate(Some(c)) => {
                let (l, t, code) = le_bitfield_code(*c);
                write!(
                    f,
                    "malformed TERMINATE, control field {:02x} {:02x} {:02x} {:02x} (RFC order \
                     {}/{}/{:#04x}; little-endian bitfield order, as upstream siw lays it out: \
                     {l}/{t}/{code:#04x})",
                    c[0],
                    c[1],
                    c[2],
                    c[3],
                    c[0] >> 4,
                    c[0] & 0xf,
                    c[1]
                )
            }
            Outcome::Rejected => f.write_str("MPA reject Reply"),
            Outcome::MpaAccepted => f.write_str("accepting MPA Reply"),
            Outcome::MpaFailed(m) => write!(f, "MPA handshake failed: {m}"),
            Outcome::Closed => f.write_str("close without TERMINATE"),
            Outcome::ClosedMidFpdu => f.write_str("close inside an FPDU"),
            Outcome::Reset => f.write_str("reset"),
            Outcome::ClosedAfterFin => f.write_str("no reaction; closed after our FIN"),
            Outcome::Accepted => f.write_str("accepted silently (the probe was answered)"),
            Outcome::Served(n) => write!(f, "all {n} Read Requests answered"),
            Outcome::Completed => f.write_str("exchange completed, data verified"),
            Outcome::LocalTerminate(c) => {
                write!(
                    f,
                    "peer asked for the refused; we sent TERMINATE {}",
                    term_code_str(*c)
                )
            }
            Outcome::LeakedRead(n) => write!(f, "peer returned {n} octets of a guessed STag"),
            Outcome::PeerInvalid(m) => write!(f, "peer sent an invalid frame: {m}"),
            Outcome::Hang(m) => write!(f, "hang: {m}"),
            Outcome::Error(m) => write!(f, "error: {m}"),
        }
    }
}

/// How an outcome compares with the expectation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// What the RFCs ask for.
    Pass,
    /// A reaction, but not the RFC's (another code, a close instead of a
    /// TERMINATE, a Read served beyond the IRD).
    Mismatch,
    /// A hang, a forbidden frame accepted, data leaked, an invalid frame
    /// from the peer, or the case could not run.
    Fail,
}

impl Verdict {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Mismatch => "mismatch",
            Verdict::Fail => "fail",
        }
    }
}

/// Judges `o` against `e`.
pub fn judge(e: Expect, o: &Outcome) -> Verdict {
    use Verdict::*;
    match o {
        Outcome::Hang(_)
        | Outcome::Error(_)
        | Outcome::LeakedRead(_)
        | Outcome::PeerInvalid(_)
        | Outcome::BadTerminate(_) => return Fail,
        _ => {}
    }
    let term = |o: &Outcome| match o {
        Outcome::Terminate(t) => Some(t.code),
        _ => None,
    };
    match e {
        Expect::Term(c) => match o {
            _ if term(o) == Some(c) => Pass,
            Outcome::Accepted | Outcome::Completed | Outcome::MpaAccepted => Fail,
            _ => Mismatch,
        },
        Expect::AnyOf(cs) => match o {
            _ if term(o).is_some_and(|t| cs.contains(&t)) => Pass,
            Outcome::Accepted | Outcome::Completed | Outcome::MpaAccepted => Fail,
            _ => Mismatch,
        },
        Expect::TermOrClose(c) => match o {
            _ if term(o) == Some(c) || o.is_close() => Pass,
            Outcome::Accepted | Outcome::Completed => Fail,
            _ => Mismatch,
        },
        Expect::Protection => match term(o).map(|t| t.wire()) {
            Some((1, 1, _) | (0, 1, _)) => Pass,
            _ if matches!(o, Outcome::Accepted) => Fail,
            _ => Mismatch,
        },
        Expect::ProtectionOr(c) => match term(o) {
            Some(t) if t == c => Pass,
            _ => judge(Expect::Protection, o),
        },
        Expect::AnyTerm => match o {
            Outcome::Terminate(_) => Pass,
            Outcome::Accepted => Fail,
            _ => Mismatch,
        },
        Expect::NoAccept | Expect::GivesUp => match o {
            Outcome::Rejected | Outcome::Closed | Outcome::Reset | Outcome::ClosedMidFpdu => Pass,
            Outcome::MpaAccepted => Fail,
            _ => Mismatch,
        },
        Expect::Close => match o {
            _ if o.is_close() => Pass,
            _ => Mismatch,
        },
        Expect::Markers => match o {
            Outcome::Rejected | Outcome::Completed => Pass,
            _ if term(o) == Some(MARKER_TERM) => Pass,
            _ => Mismatch,
        },
        Expect::Completes => match o {
            Outcome::Completed => Pass,
            _ => Fail,
        },
        Expect::Reaction => Pass,
    }
}

/// The result of one case.
#[derive(Clone, Debug)]
pub struct Record {
    /// The case.
    pub case: Case,
    /// What was sent, with details found at run time.
    pub sent: String,
    /// What came back.
    pub outcome: Outcome,
    /// The judgement.
    pub verdict: Verdict,
    /// Wall time.
    pub elapsed: Duration,
}

/// State of the reaction watch.
#[derive(Default)]
struct Watch {
    probe_sent: bool,
    /// Read Requests whose answers are counted (IRD overflow).
    reads: u32,
    answered: u32,
    /// A Read of a guessed STag is outstanding.
    foreign_read: bool,
}

fn end_outcome(e: End) -> Option<Outcome> {
    Some(match e {
        End::Closed => Outcome::Closed,
        End::ClosedMidFpdu => Outcome::ClosedMidFpdu,
        End::Reset => Outcome::Reset,
        End::Timeout => return None,
        End::Invalid(e) => Outcome::PeerInvalid(e.to_string()),
        End::Io(m) => Outcome::Error(m),
    })
}

/// Reads until a reaction or `deadline`.
fn react(s: &mut Session, deadline: Instant, w: &mut Watch) -> Option<Outcome> {
    loop {
        match s.next(deadline) {
            Ok(Inbound::Terminate(Ok(t))) => return Some(Outcome::Terminate(t)),
            Ok(Inbound::Terminate(Err(c))) => return Some(Outcome::BadTerminate(c)),
            Ok(Inbound::ReadRequest(rr)) => {
                if let Err(code) = s.answer(&rr) {
                    return Some(Outcome::LocalTerminate(code));
                }
            }
            Ok(Inbound::ReadResponse { stag, len }) => {
                if w.foreign_read && len > 0 && stag == SINK_STAG {
                    return Some(Outcome::LeakedRead(len));
                }
                if w.reads > 0 {
                    w.answered += 1;
                    if w.answered >= w.reads {
                        return Some(Outcome::Served(w.answered));
                    }
                } else if w.probe_sent {
                    return Some(Outcome::Accepted);
                }
            }
            Ok(_) => {}
            Err(e) => return end_outcome(e),
        }
    }
}

/// Quiet wait, probe, FIN: see the module documentation.
fn observe(s: &mut Session, t: &Timing, w: &mut Watch, probe: bool) -> Outcome {
    if let Some(o) = react(s, Instant::now() + t.quiet, w) {
        return o;
    }
    if probe && w.reads == 0 && s.negotiated().ord > 0 && !s.fin_sent() {
        s.probe();
        w.probe_sent = true;
        if let Some(o) = react(s, Instant::now() + t.timeout, w) {
            return o;
        }
    }
    let fin_was_sent = s.fin_sent();
    s.fin();
    match react(s, Instant::now() + t.timeout, w) {
        Some(Outcome::Closed | Outcome::Reset) if !fin_was_sent => Outcome::ClosedAfterFin,
        Some(o) => o,
        None => Outcome::Hang(format!(
            "no reaction within {} s{}, nor a close within {} s of our FIN",
            t.quiet.as_secs_f32(),
            if w.probe_sent {
                format!(" + {} s after the probe", t.timeout.as_secs())
            } else {
                String::new()
            },
            t.timeout.as_secs()
        )),
    }
}

/// Waits for a message `want` accepts, answering Read Requests of our
/// buffer on the way if `serve`.
fn await_msg(
    s: &mut Session,
    deadline: Instant,
    serve: bool,
    want: impl Fn(&Inbound) -> bool,
) -> Result<Inbound, Outcome> {
    loop {
        let m = s.next(deadline).map_err(|e| {
            end_outcome(e).unwrap_or_else(|| Outcome::Hang("the peer stopped the exchange".into()))
        })?;
        if want(&m) {
            return Ok(m);
        }
        match m {
            Inbound::Terminate(Ok(t)) => return Err(Outcome::Terminate(t)),
            Inbound::Terminate(Err(c)) => return Err(Outcome::BadTerminate(c)),
            Inbound::ReadRequest(rr) if serve => {
                s.answer(&rr).map_err(Outcome::LocalTerminate)?;
            }
            _ => {}
        }
    }
}

/// Connects, retrying while the listener is down (a restarting server),
/// for at most `timeout`.
fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, Outcome> {
    let deadline = Instant::now() + timeout;
    loop {
        match conn::tcp_connect(addr, timeout) {
            Ok(s) => return Ok(s),
            Err(Error::Io { err, .. })
                if err.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(Outcome::Error(format!("connect: {e}"))),
        }
    }
}

fn mpa_options(crc: bool) -> MpaOptions {
    MpaOptions {
        crc: if crc {
            CrcPolicy::On
        } else {
            CrcPolicy::PreferOff
        },
        // rping asks IRD = ORD = 1; ask a little more ORD so that the
        // IRD the peer grants is its own choice.
        ord: 4,
        ..MpaOptions::default()
    }
}

/// An established session for a case, or the outcome that prevented it.
fn establish(addr: &str, t: &Timing, opts: &MpaOptions) -> Result<Session, Outcome> {
    let stream = connect(addr, t.timeout)?;
    match conn::initiate(stream, opts) {
        Ok(est) => {
            thread::sleep(t.settle);
            Ok(Session::new(est, t.size, t.le_terminate))
        }
        Err(Error::Rejected { .. }) => Err(Outcome::Rejected),
        Err(Error::PeerClosed) => Err(Outcome::Closed),
        Err(Error::PeerReset) => Err(Outcome::Reset),
        Err(Error::Timeout(w)) => Err(Outcome::Hang(format!("timed out {w}"))),
        Err(Error::Mpa(e)) => Err(Outcome::MpaFailed(e.to_string())),
        Err(e) => Err(Outcome::Error(e.to_string())),
    }
}

/// The valid MPA Request of this tool, with `pd` octets of private data.
fn request_bytes(crc: bool, pd: usize) -> Vec<u8> {
    request_with(crc, pd, RtrSet::EMPTY)
}

/// A valid Request; with RTR types in `rtr`, one asking for peer-to-peer
/// mode (RFC 6581) with them.
fn request_with(crc: bool, pd: usize, rtr: RtrSet) -> Vec<u8> {
    let private = vec![0x5a; pd];
    let repr = MpaFrameRepr {
        kind: FrameKind::Request,
        flags: MpaFlags {
            crc,
            ..MpaFlags::default()
        },
        revision: Revision::V2,
        enhanced: Some(EnhancedData {
            ird: 1,
            ord: 1,
            p2p: !rtr.is_empty(),
            rtr,
        }),
        private_data: &private,
    };
    let mut out = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut out).expect("valid request");
    out.truncate(n);
    out
}

/// Reads the answer to a raw MPA Request.
fn mpa_reply(stream: &mut TcpStream, deadline: Instant) -> Outcome {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if !buf.is_empty() {
            match MpaFrameRepr::parse(&buf) {
                Ok((f, _)) if f.kind == FrameKind::Reply && f.flags.reject => {
                    return Outcome::Rejected
                }
                Ok((f, _)) if f.kind == FrameKind::Reply => return Outcome::MpaAccepted,
                Ok(_) => return Outcome::PeerInvalid("an MPA Request in answer".into()),
                Err(iwarp_core::mpa::MpaError::Incomplete { .. }) => {}
                Err(e) => return Outcome::PeerInvalid(format!("MPA Reply: {e}")),
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Outcome::Hang(if buf.is_empty() {
                "no MPA Reply and no close".into()
            } else {
                format!("{} octets of an MPA Reply, then nothing", buf.len())
            });
        }
        let _ = stream.set_read_timeout(Some(deadline - now));
        match stream.read(&mut chunk) {
            Ok(0) if buf.is_empty() => return Outcome::Closed,
            Ok(0) => return Outcome::ClosedMidFpdu,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => match e.kind() {
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted => {
                    return Outcome::Reset
                }
                _ => return Outcome::Error(e.to_string()),
            },
        }
    }
}

/// After an accepting Reply in a case that allows one: FIN, and the peer
/// must close.
fn close_after_accept(stream: &mut TcpStream, t: &Timing) -> Outcome {
    use std::io::Read;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + t.timeout;
    let mut chunk = [0u8; 4096];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Outcome::Hang("accepted, then no close after our FIN".into());
        }
        let _ = stream.set_read_timeout(Some(deadline - now));
        match stream.read(&mut chunk) {
            Ok(0) => return Outcome::ClosedAfterFin,
            Ok(_) => {}
            Err(e) if is_timeout(&e) || e.kind() == std::io::ErrorKind::Interrupted => {}
            // A reset counts as the close this case waits for.
            Err(_) => return Outcome::ClosedAfterFin,
        }
    }
}

fn write_raw(stream: &mut TcpStream, b: &[u8]) {
    use std::io::Write;
    let _ = stream.write_all(b);
}

/// Raw MPA cases: the Request itself is hostile.
fn run_mpa(addr: &str, t: &Timing, case: &Case, sent: &mut String) -> Outcome {
    let mut stream = match connect(addr, t.timeout) {
        Ok(s) => s,
        Err(o) => return o,
    };
    let mut deadline = Instant::now() + t.timeout;
    match &case.plan {
        Plan::MpaBadKey { pos, xor } => {
            let mut r = request_bytes(case.crc, 0);
            r[usize::from(*pos) % KEY_LEN] ^= xor;
            write_raw(&mut stream, &r);
        }
        Plan::MpaBadRevision { rev } => {
            let mut r = request_bytes(case.crc, 0);
            r[KEY_LEN + 1] = *rev;
            write_raw(&mut stream, &r);
        }
        Plan::MpaPdTooLong { pd_len, sent: n } => {
            let mut r = request_bytes(case.crc, 0);
            r.truncate(FRAME_HEADER_LEN);
            r[KEY_LEN + 2..FRAME_HEADER_LEN].copy_from_slice(&pd_len.to_be_bytes());
            r.extend(std::iter::repeat_n(0u8, usize::from(*n)));
            write_raw(&mut stream, &r);
        }
        Plan::MpaTruncated { pd, cut } => {
            let r = request_bytes(case.crc, usize::from(*pd));
            let n = *cut as usize % r.len(); // 0..len-1 octets: always short
            *sent = format!("{sent}: {n} of {} octets", r.len());
            write_raw(&mut stream, &r[..n]);
            deadline = Instant::now() + t.stall_timeout;
        }
        Plan::MpaFields {
            flags,
            rev,
            block,
            pd,
        } => {
            let mut r = request_bytes(false, 0);
            r.truncate(FRAME_HEADER_LEN);
            r[KEY_LEN] = *flags;
            r[KEY_LEN + 1] = *rev;
            let enhanced = *rev == 2 && flags & 0x10 != 0;
            let total = usize::from(*pd) + if enhanced { 4 } else { 0 };
            r[KEY_LEN + 2..FRAME_HEADER_LEN].copy_from_slice(&(total as u16).to_be_bytes());
            if enhanced {
                r.extend_from_slice(block);
            }
            r.extend(std::iter::repeat_n(0xa5u8, usize::from(*pd)));
            write_raw(&mut stream, &r);
        }
        Plan::MpaEarlyData { data } => {
            let mut r = request_bytes(case.crc, 0);
            r.extend_from_slice(data);
            write_raw(&mut stream, &r);
        }
        Plan::MpaP2pClose { rtr } => {
            write_raw(&mut stream, &request_with(case.crc, 0, rtr_set(*rtr)));
        }
        p => return Outcome::Error(format!("not an MPA plan: {p:?}")),
    }
    let o = mpa_reply(&mut stream, deadline);
    match (o, case.expect()) {
        (Outcome::MpaAccepted, Expect::Reaction) => {
            thread::sleep(t.settle);
            close_after_accept(&mut stream, t)
        }
        (o, _) => o,
    }
}

/// Stage B: advertise the start buffer and wait for the peer's Read
/// Request of it (rping's first step); the Request names the peer's
/// remotely readable and writable rping buffer.
fn await_peer_read(s: &mut Session, t: &Timing) -> Result<ReadRequest, Outcome> {
    let info = s.src_info();
    s.send(&Message::Send { len: 16 }, &info);
    match await_msg(s, Instant::now() + t.timeout, false, |m| {
        matches!(m, Inbound::ReadRequest(_))
    }) {
        Ok(Inbound::ReadRequest(rr)) => Ok(rr),
        Ok(_) => unreachable!(),
        Err(o) => Err(Outcome::Error(format!(
            "setup: the peer did not Read the advertised buffer ({o})"
        ))),
    }
}

fn miss_to(base: u64, m: Miss) -> u64 {
    match m {
        Miss::Below(n) => base.wrapping_sub(n),
        Miss::Above(n) => base.wrapping_add(65536 + n),
        Miss::Wrap(n) => 0u64.wrapping_sub(n),
    }
}

/// A crafted untagged Send segment (header fields replaced), framed.
fn crafted_send(s: &mut Session, mask: u16, value: u16) -> Vec<u8> {
    let msn = s.tx().next_msn(QN_SEND).unwrap_or(1);
    let mut seg = send_segment(msn, PROBE).expect("DDP header");
    set_control(&mut seg, mask, value).expect("control field");
    s.frame(&seg)
}

/// A Send segment with its own QN, MSN and MO, framed.
fn send_with(s: &mut Session, qn: u32, msn: u32, mo: u32) -> Vec<u8> {
    let hdr = DdpHeader::untagged(Opcode::Send.value(), true, 0, qn, msn, mo);
    let mut seg = vec![0u8; hdr.header_len() + PROBE.len()];
    let n = hdr.emit(&mut seg).expect("DDP header");
    seg[n..].copy_from_slice(PROBE);
    s.frame(&seg)
}

/// One tagged segment (L set) built by hand and framed: the core's
/// transmit builder refuses ranges that wrap, which some cases want.
fn tagged(s: &mut Session, op: Opcode, stag: u32, to: u64, data: &[u8]) -> Vec<u8> {
    let hdr = DdpHeader::tagged(op.value(), true, stag, to);
    let mut seg = vec![0u8; hdr.header_len() + data.len()];
    let n = hdr.emit(&mut seg).expect("DDP header");
    seg[n..].copy_from_slice(data);
    s.frame(&seg)
}

/// The rest of an rping ping after the first buffer-info Send: serve the
/// peer's Read, take its go-ahead, advertise the sink, take its Write and
/// go-ahead, verify, FIN, wait for the close.
fn finish_ping(s: &mut Session, t: &Timing) -> Outcome {
    let deadline = Instant::now() + t.timeout;
    if let Err(o) = await_msg(s, deadline, true, |m| matches!(m, Inbound::Send(_))) {
        return o;
    }
    let info = s.sink_info();
    s.send(&Message::Send { len: 16 }, &info);
    let deadline = Instant::now() + t.timeout;
    let mut wrote = false;
    loop {
        match await_msg(s, deadline, true, |m| {
            matches!(m, Inbound::Send(_) | Inbound::Write { .. })
        }) {
            Ok(Inbound::Write { .. }) => wrote = true,
            Ok(_) => break,
            Err(o) => return o,
        }
    }
    if !wrote || s.sink != s.src {
        return Outcome::Error(format!("echo differs from the ping (Write seen: {wrote})"));
    }
    s.fin();
    match react(s, Instant::now() + t.timeout, &mut Watch::default()) {
        Some(Outcome::Closed | Outcome::Reset) => Outcome::Completed,
        Some(o) => o,
        None => Outcome::Hang("exchange done, no close after our FIN".into()),
    }
}

/// Markers: ask for them; corrupt ours if the peer wants them, check the
/// peer's if it sends them.
fn run_markers(addr: &str, t: &Timing, case: &Case, sent: &mut String) -> Outcome {
    let opts = MpaOptions {
        markers_rx: true,
        ..mpa_options(case.crc)
    };
    let mut s = match establish(addr, t, &opts) {
        Ok(s) => s,
        Err(o) => return o,
    };
    let n = *s.negotiated();
    *sent = format!("{sent}: markers rx {} tx {}", n.markers_rx, n.markers_tx);
    if n.markers_tx {
        // The first FPDU starts at stream offset 0: a marker (FPDUPTR 0)
        // leads it. Point it elsewhere.
        let info = s.src_info();
        let mut f = s.emit(&Message::Send { len: 16 }, &info);
        f[3] ^= 0x10;
        s.write(&f);
        return observe(&mut s, t, &mut Watch::default(), true);
    }
    let info = s.src_info();
    s.send(&Message::Send { len: 16 }, &info);
    finish_ping(&mut s, t)
}

/// Runs one case against the rping server at `addr`.
pub fn run_case(addr: &str, t: &Timing, case: &Case) -> Record {
    let start = Instant::now();
    let mut sent = case.to_string();
    let outcome = if case.family.is_mpa() {
        run_mpa(addr, t, case, &mut sent)
    } else if case.plan == Plan::MpaMarkers {
        run_markers(addr, t, case, &mut sent)
    } else {
        match establish(addr, t, &mpa_options(case.crc)) {
            Ok(mut s) => {
                if case.crc && !s.negotiated().crc {
                    Outcome::MpaFailed("the peer did not agree to CRC".into())
                } else {
                    run_fpdu(&mut s, t, case, &mut sent)
                }
            }
            // The Request was valid: any failure here is the peer's (or
            // its application's) and the case did not run.
            Err(Outcome::Hang(m)) => Outcome::Hang(format!("MPA handshake: {m}")),
            Err(o @ Outcome::Error(_)) => o,
            Err(o) => Outcome::Error(format!("MPA handshake of a valid Request: {o}")),
        }
    };
    let verdict = judge(case.expect(), &outcome);
    Record {
        case: case.clone(),
        sent,
        outcome,
        verdict,
        elapsed: start.elapsed(),
    }
}

/// Cases after a correct handshake.
fn run_fpdu(s: &mut Session, t: &Timing, case: &Case, sent: &mut String) -> Outcome {
    let mut w = Watch::default();
    let info = s.src_info();
    match &case.plan {
        Plan::BadCrc { bit } => {
            let mut f = s.emit(&Message::Send { len: 16 }, PROBE);
            let n = f.len();
            let b = usize::from(*bit);
            f[n - 4 + b / 8] ^= 1 << (b % 8);
            s.write(&f);
        }
        Plan::Flip {
            flips,
            payload_only,
        } => {
            let mut f = s.emit(&Message::Send { len: 16 }, &info);
            // ULPDU_Length (2) and the untagged header (18) lead the FPDU.
            let (lo, len) = if *payload_only {
                (20, f.len() - 20)
            } else {
                (0, f.len())
            };
            let mut done = Vec::new();
            for &(p, x) in flips {
                let pos = lo + p as usize % len;
                if !done.contains(&pos) {
                    f[pos] ^= x;
                    done.push(pos);
                }
            }
            *sent = format!("{sent}: octets {done:?} of {}", f.len());
            s.write(&f);
        }
        Plan::BadDdpVersion { dv } => {
            let f = crafted_send(s, CTRL_DV_MASK, u16::from(*dv) << CTRL_DV_SHIFT);
            s.write(&f);
        }
        Plan::BadRdmapVersion { rv } => {
            let f = crafted_send(s, CTRL_RV_MASK, u16::from(*rv) << CTRL_RV_SHIFT);
            s.write(&f);
        }
        Plan::UnknownOpcode { op } => {
            let f = crafted_send(s, CTRL_OPCODE_MASK, u16::from(*op));
            s.write(&f);
        }
        Plan::InvalidQn { qn } => {
            let f = send_with(s, *qn, 1, 0);
            s.write(&f);
        }
        Plan::MsnGap { delta } => {
            let msn = s.tx().next_msn(QN_SEND).unwrap_or(1).wrapping_add(*delta);
            let f = send_with(s, QN_SEND, msn, 0);
            s.write(&f);
        }
        Plan::BadMo { mo } => {
            let msn = s.tx().next_msn(QN_SEND).unwrap_or(1);
            let f = send_with(s, QN_SEND, msn, *mo);
            s.write(&f);
        }
        Plan::SendTooLong { len } => {
            let data = vec![0x5a; *len as usize];
            s.send(&Message::Send { len: *len }, &data);
        }
        Plan::InvalidStag { stag, len } => {
            let data = vec![0xa5; usize::from(*len)];
            let msg = Message::RdmaWrite {
                len: u32::from(*len),
                stag: *stag,
                to: 0,
            };
            s.send(&msg, &data);
        }
        Plan::ForeignStagWrite { stag, to, len } => {
            let rr = match await_peer_read(s, t) {
                Ok(rr) => rr,
                Err(o) => return o,
            };
            // The peer's own buffer is a legitimate target: skip it.
            let stag = if *stag == rr.sink_stag {
                stag ^ 0x100
            } else {
                *stag
            };
            *sent = format!("{sent} (peer's buffer {:#010x})", rr.sink_stag);
            let f = tagged(
                s,
                Opcode::RdmaWrite,
                stag,
                *to,
                &vec![0xa5; usize::from(*len)],
            );
            s.write(&f);
        }
        Plan::ForeignStagRead { stag, to, len } => {
            let rr = match await_peer_read(s, t) {
                Ok(rr) => rr,
                Err(o) => return o,
            };
            let stag = if *stag == rr.sink_stag {
                stag ^ 0x100
            } else {
                *stag
            };
            *sent = format!("{sent} (peer's buffer {:#010x})", rr.sink_stag);
            let req = ReadRequest {
                sink_stag: SINK_STAG,
                sink_to: SINK_TO,
                read_size: u32::from(*len),
                source_stag: stag,
                source_to: *to,
            };
            w.foreign_read = true;
            s.send(&Message::ReadRequest(req), &[]);
        }
        Plan::IrdOverflow { extra, sized } => {
            let ird = u32::from(s.negotiated().ord);
            let n = ird + u32::from(*extra);
            let (source_stag, source_to, read_size) = if *sized {
                match await_peer_read(s, t) {
                    Ok(rr) => (rr.sink_stag, rr.sink_to, rr.read_size.min(64)),
                    Err(o) => return o,
                }
            } else {
                (0, 0, 0)
            };
            *sent = format!("{sent}: IRD {ird}, {n} Reads of {read_size} octets");
            let mut all = Vec::new();
            for _ in 0..n {
                let req = ReadRequest {
                    sink_stag: SINK_STAG,
                    sink_to: SINK_TO,
                    read_size,
                    source_stag,
                    source_to,
                };
                all.extend(s.emit(&Message::ReadRequest(req), &[]));
            }
            w.reads = n;
            s.write(&all);
        }
        Plan::TruncatedFpdu { cut, stall_ms } => {
            let f = s.emit(&Message::Send { len: 16 }, &info);
            let n = 1 + *cut as usize % (f.len() - 1);
            *sent = format!("{sent}: {n} of {} octets", f.len());
            s.write(&f[..n]);
            thread::sleep(Duration::from_millis(u64::from(*stall_ms)));
            s.fin();
            return react(s, Instant::now() + t.timeout, &mut w).unwrap_or_else(|| {
                Outcome::Hang("no TERMINATE or close after the truncated FPDU and FIN".into())
            });
        }
        Plan::OversizedUlpdu { ulen, full } => {
            let msn = s.tx().next_msn(QN_SEND).unwrap_or(1);
            let hdr = DdpHeader::untagged(Opcode::Send.value(), true, 0, QN_SEND, msn, 0);
            let mut seg = vec![0x5au8; usize::from(*ulen)];
            hdr.emit(&mut seg).expect("DDP header");
            let f = s.frame(&seg);
            if *full {
                s.write(&f);
            } else {
                s.write(&f[..2 + hdr.header_len()]);
            }
        }
        Plan::TinyUlpdu { ulen } => {
            let mut f = vec![0u8; 2 + usize::from(*ulen) + 8];
            f[..2].copy_from_slice(&u16::from(*ulen).to_be_bytes());
            s.write(&f);
        }
        Plan::Garbage { data } => s.write(data),
        Plan::PeerTerminate { code } => {
            s.send(&Message::Terminate(TerminateRepr::new(*code)), &[]);
            // No probe: nothing may follow a TERMINATE.
            return observe(s, t, &mut w, false);
        }
        Plan::Trickle {
            delay_ms,
            stall_at,
            stall_ms,
        } => {
            let f = s.emit(&Message::Send { len: 16 }, &info);
            let at = *stall_at as usize % f.len();
            *sent = format!("{sent}: {} octets, stall before octet {at}", f.len());
            s.trickle(
                &f,
                Duration::from_millis(u64::from(*delay_ms)),
                at,
                Duration::from_millis(u64::from(*stall_ms)),
            );
            return finish_ping(s, t);
        }
        Plan::ResponseBadTo { miss } => {
            let rr = match await_peer_read(s, t) {
                Ok(rr) => rr,
                Err(o) => return o,
            };
            let to = miss_to(rr.sink_to, *miss);
            *sent = format!("{sent}: sink {:#010x} TO {to:#x}", rr.sink_stag);
            let data = s.src[..rr.read_size as usize].to_vec();
            let f = tagged(s, Opcode::RdmaReadResponse, rr.sink_stag, to, &data);
            s.write(&f);
        }
        Plan::ResponseBadStag { xor } => {
            let rr = match await_peer_read(s, t) {
                Ok(rr) => rr,
                Err(o) => return o,
            };
            let stag = rr.sink_stag ^ xor;
            *sent = format!("{sent}: STag {stag:#010x} for {:#010x}", rr.sink_stag);
            let data = s.src[..rr.read_size as usize].to_vec();
            let msg = Message::ReadResponse {
                len: rr.read_size,
                stag,
                to: rr.sink_to,
            };
            s.send(&msg, &data);
        }
        Plan::ResponseBadLength { delta } => {
            let rr = match await_peer_read(s, t) {
                Ok(rr) => rr,
                Err(o) => return o,
            };
            let len = (rr.read_size as i64 + i64::from(*delta)).max(1) as u32;
            *sent = format!("{sent}: {len} octets for {}", rr.read_size);
            let data = vec![0x5a; len as usize];
            let msg = Message::ReadResponse {
                len,
                stag: rr.sink_stag,
                to: rr.sink_to,
            };
            s.send(&msg, &data);
        }
        Plan::ResponseUnsolicited { stag, to, len } => {
            let f = tagged(
                s,
                Opcode::RdmaReadResponse,
                *stag,
                *to,
                &vec![0x5a; usize::from(*len)],
            );
            s.write(&f);
        }
        Plan::WriteOutOfBounds { miss, len } => {
            let rr = match await_peer_read(s, t) {
                Ok(rr) => rr,
                Err(o) => return o,
            };
            let to = miss_to(rr.sink_to, *miss);
            *sent = format!("{sent}: STag {:#010x} TO {to:#x}", rr.sink_stag);
            let f = tagged(
                s,
                Opcode::RdmaWrite,
                rr.sink_stag,
                to,
                &vec![0xa5; usize::from(*len)],
            );
            s.write(&f);
        }
        Plan::ReadOutOfBounds { miss, len } => {
            let rr = match await_peer_read(s, t) {
                Ok(rr) => rr,
                Err(o) => return o,
            };
            let to = miss_to(rr.sink_to, *miss);
            *sent = format!("{sent}: STag {:#010x} TO {to:#x}", rr.sink_stag);
            let req = ReadRequest {
                sink_stag: SINK_STAG,
                sink_to: SINK_TO,
                read_size: u32::from(*len),
                source_stag: rr.sink_stag,
                source_to: to,
            };
            s.send(&Message::ReadRequest(req), &[]);
        }
        p => return Outcome::Error(format!("not an FPDU plan: {p:?}")),
    }
    observe(s, t, &mut w, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp_core::terminate::{MpaCode, UntaggedCode};

    #[test]
    fn upstream_siw_control_field_is_decoded() {
        // siw's RDMAP/Remote Operation/Unexpected Opcode on x86: the layer
        // in the low nibble.
        assert_eq!(le_bitfield_code([0x20, 0x06, 0x01, 0x00]), (0, 2, 6));
        let o = Outcome::BadTerminate(Some([0x20, 0x06, 0x01, 0x00]));
        assert_eq!(
            o.label(),
            "malformed-terminate [LE bitfield order 0/2/0x06]"
        );
        assert!(o.to_string().contains("RFC order 2/0/0x06"), "{o}");
    }

    #[test]
    fn judgements() {
        let msn = TermCode::DdpUntagged(UntaggedCode::MsnRange);
        let t = |c| Outcome::Terminate(TerminateRepr::new(c));
        assert_eq!(judge(Expect::Term(msn), &t(msn)), Verdict::Pass);
        let crc = TermCode::Mpa(MpaCode::CrcError);
        assert_eq!(judge(Expect::Term(msn), &t(crc)), Verdict::Mismatch);
        assert_eq!(
            judge(Expect::Term(msn), &Outcome::Closed),
            Verdict::Mismatch
        );
        assert_eq!(judge(Expect::Term(msn), &Outcome::Accepted), Verdict::Fail);
        assert_eq!(
            judge(Expect::Reaction, &Outcome::Hang(String::new())),
            Verdict::Fail
        );
        assert_eq!(
            judge(Expect::Reaction, &Outcome::ClosedAfterFin),
            Verdict::Pass
        );
        assert_eq!(
            judge(Expect::NoAccept, &Outcome::MpaAccepted),
            Verdict::Fail
        );
        assert_eq!(judge(Expect::Protection, &t(msn)), Verdict::Mismatch);
        assert_eq!(judge(Expect::ProtectionOr(msn), &t(msn)), Verdict::Pass);
        let stag = TermCode::DdpTagged(iwarp_core::terminate::TaggedCode::InvalidStag);
        assert_eq!(judge(Expect::ProtectionOr(crc), &t(stag)), Verdict::Pass);
        assert_eq!(judge(Expect::ProtectionOr(crc), &t(msn)), Verdict::Mismatch);
        assert_eq!(
            judge(Expect::Protection, &Outcome::LeakedRead(8)),
            Verdict::Fail
        );
        assert_eq!(
            judge(Expect::TermOrClose(crc), &Outcome::Reset),
            Verdict::Pass
        );
        assert_eq!(
            judge(Expect::Close, &Outcome::BadTerminate(None)),
            Verdict::Fail
        );
    }
}
