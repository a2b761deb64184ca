// SPDX-License-Identifier: GPL-2.0
//! One fuzz connection after the MPA handshake: frames built by the
//! core's `tx::Transmitter` (or crafted and framed with `mpa::emit_fpdu`),
//! inbound octets parsed by `rx::Receiver`.
//!
//! Unlike [`crate::qp::Qp`], the session hands every inbound message to
//! the case runner instead of serving it, because some cases must answer
//! the peer's RDMA Read Request with a hostile Read Response. It serves
//! what a correct rping client would (Read Requests of the buffer it
//! advertised), places RDMA Writes into its sink buffer, and refuses
//! anything else with a TERMINATE.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use iwarp_core::crc32c::{CrcEngine, SoftCrc32c};
use iwarp_core::mpa::{self, Negotiated};
use iwarp_core::rdmap::{Extensions, Opcode, ReadRequest, QN_READ_REQUEST, QN_SEND};
use iwarp_core::rx::{FixedPayload, Receiver, RxConfig, RxError, RxEvent, Target};
use iwarp_core::terminate::{RemoteProtectionCode, TermCode, TerminateRepr};
use iwarp_core::tx::{Message, Transmitter, TxConfig};

use crate::conn::Established;
use crate::error::is_timeout;
use crate::qp::EMSS;
use crate::rping::{self, BufferInfo};

/// STag of the buffer this side advertises (rping's start buffer).
pub const SRC_STAG: u32 = 0x0000_a15a;
/// Its Tagged Offset.
pub const SRC_TO: u64 = 0x7f00_0001_0000_0000;
/// STag of the buffer the peer's RDMA Write goes to (rping's sink).
pub const SINK_STAG: u32 = 0x0000_a25a;
/// Its Tagged Offset.
pub const SINK_TO: u64 = 0x7f00_0002_0000_0000;

/// A complete inbound message (or the part that matters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inbound {
    /// An RDMA Read Request.
    ReadRequest(ReadRequest),
    /// A Send of this many octets.
    Send(u64),
    /// An RDMA Write.
    Write {
        /// Its STag.
        stag: u32,
        /// Its length.
        len: u64,
    },
    /// An RDMA Read Response.
    ReadResponse {
        /// Its STag.
        stag: u32,
        /// Its length.
        len: u64,
    },
    /// A TERMINATE: parsed, or the first four octets of its payload (the
    /// Terminate Control field, if they arrived) when it does not parse.
    Terminate(Result<TerminateRepr, Option<[u8; 4]>>),
    /// Another complete message.
    Other(Opcode),
}

/// Why [`Session::next`] returned no message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// TCP FIN at an FPDU boundary.
    Closed,
    /// TCP FIN inside an FPDU.
    ClosedMidFpdu,
    /// TCP reset.
    Reset,
    /// Nothing before the deadline.
    Timeout,
    /// The peer sent a frame our parser refuses.
    Invalid(RxError),
    /// Another socket error.
    Io(String),
}

/// The connection, this side's two rping buffers, and the parsers.
#[derive(Debug)]
pub struct Session {
    stream: TcpStream,
    tx: Transmitter,
    crc: SoftCrc32c,
    rx: Receiver<SoftCrc32c>,
    negotiated: Negotiated,
    pending: Vec<u8>,
    rbuf: Vec<u8>,
    /// The advertised start buffer (the ping pattern).
    pub src: Vec<u8>,
    /// The sink buffer.
    pub sink: Vec<u8>,
    fin: bool,
    /// Octets of ours the socket refused (the peer had gone).
    pub write_failed: bool,
    /// The first octets of the inbound FPDU being parsed, for a TERMINATE
    /// that does not parse.
    fpdu: Vec<u8>,
    le_terminate: bool,
}

/// Octets of an FPDU kept for [`Inbound::Terminate`]: ULPDU_Length (2),
/// the untagged DDP/RDMAP header (18), the Terminate Control field (4).
const FPDU_HEAD: usize = 24;

impl Session {
    /// Starts the data path of an established connection with rping
    /// buffers of `size` octets; `le_terminate`: decode TERMINATEs as
    /// upstream siw lays them out (see [`crate::fuzz::Timing`]).
    pub fn new(est: Established, size: usize, le_terminate: bool) -> Self {
        let n = est.negotiated;
        let txc = TxConfig::from_negotiated(&n, mpa::mulpdu(EMSS, n.markers_tx), Extensions::NONE);
        Session {
            stream: est.stream,
            tx: Transmitter::new(txc),
            crc: SoftCrc32c::new(),
            rx: Receiver::new(
                RxConfig::from_negotiated(&n, Extensions::NONE),
                SoftCrc32c::new(),
            ),
            negotiated: n,
            pending: est.leftover,
            rbuf: vec![0; 64 * 1024],
            src: rping::ping_data(0, size),
            sink: vec![0; size],
            fin: false,
            write_failed: false,
            fpdu: Vec::new(),
            le_terminate,
        }
    }

    /// The negotiated parameters.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// The transmit builder.
    pub fn tx(&self) -> &Transmitter {
        &self.tx
    }

    /// The FPDUs of `msg` (the core assigns MSNs and advances the stream).
    pub fn emit(&mut self, msg: &Message, payload: &[u8]) -> Vec<u8> {
        let len = self.tx.message_wire_len(msg).unwrap_or(0);
        let mut out = vec![0u8; len];
        match self.tx.emit_message(msg, payload, &mut self.crc, &mut out) {
            Ok(n) => out.truncate(n),
            Err(e) => panic!("the core refused to build {msg:?}: {e:?}"),
        }
        out
    }

    /// One FPDU around a crafted ULPDU (DDP segment), with markers and CRC
    /// as negotiated, at the current stream position (which it does not
    /// advance: use it last, or only without markers).
    pub fn frame(&mut self, ulpdu: &[u8]) -> Vec<u8> {
        let mut markers = self.tx.marker_state();
        let ulen = u16::try_from(ulpdu.len()).unwrap_or(u16::MAX);
        let mut out = vec![0u8; mpa::fpdu_wire_len(ulen, markers.as_ref())];
        let crc: Option<&mut dyn CrcEngine> = if self.tx.crc_enabled() {
            Some(&mut self.crc)
        } else {
            None
        };
        match mpa::emit_fpdu(ulpdu, markers.as_mut(), crc, &mut out) {
            Ok(n) => out.truncate(n),
            Err(e) => panic!("the core refused to frame {} octets: {e:?}", ulpdu.len()),
        }
        out
    }

    /// The CRC of an FPDU's framed octets (ULPDU_Length, ULPDU, PAD).
    pub fn crc_of(&mut self, framed: &[u8]) -> u32 {
        mpa::compute_fpdu_crc(&mut self.crc, &[framed])
    }

    /// Sends octets; a failure (the peer closed or reset) is recorded, not
    /// returned: the reaction is read afterwards.
    pub fn write(&mut self, bytes: &[u8]) {
        if self.write_failed {
            return;
        }
        if self.stream.write_all(bytes).is_err() {
            self.write_failed = true;
        }
    }

    /// Sends octets one at a time, `delay` apart, stalling `stall` before
    /// octet `stall_at`.
    pub fn trickle(&mut self, bytes: &[u8], delay: Duration, stall_at: usize, stall: Duration) {
        for (i, b) in bytes.iter().enumerate() {
            if i == stall_at {
                thread::sleep(stall);
            }
            self.write(std::slice::from_ref(b));
            thread::sleep(delay);
        }
    }

    /// Builds and sends a message.
    pub fn send(&mut self, msg: &Message, payload: &[u8]) {
        let f = self.emit(msg, payload);
        self.write(&f);
    }

    /// The buffer-info message naming this side's start buffer.
    pub fn src_info(&self) -> [u8; 16] {
        BufferInfo {
            addr: SRC_TO,
            stag: SRC_STAG,
            size: self.src.len() as u32,
        }
        .encode()
    }

    /// The buffer-info message naming this side's sink buffer.
    pub fn sink_info(&self) -> [u8; 16] {
        BufferInfo {
            addr: SINK_TO,
            stag: SINK_STAG,
            size: self.sink.len() as u32,
        }
        .encode()
    }

    /// A zero-length RDMA Read Request: answered only by a peer that
    /// still serves the stream.
    pub fn probe(&mut self) {
        let rr = ReadRequest {
            sink_stag: SINK_STAG,
            sink_to: SINK_TO,
            read_size: 0,
            source_stag: 0,
            source_to: 0,
        };
        self.send(&Message::ReadRequest(rr), &[]);
    }

    /// TCP FIN (once).
    pub fn fin(&mut self) {
        if !self.fin {
            self.fin = true;
            let _ = self.stream.shutdown(Shutdown::Write);
        }
    }

    /// Whether our FIN went out.
    pub fn fin_sent(&self) -> bool {
        self.fin
    }

    /// Answers a Read Request as a correct rping client: from the start
    /// buffer, within its bounds. Anything else is refused with the RDMAP
    /// Remote Protection TERMINATE, and the connection is closed; the code
    /// is returned.
    pub fn answer(&mut self, rr: &ReadRequest) -> Result<(), TermCode> {
        let ok = |s: &Self| -> Option<std::ops::Range<usize>> {
            if rr.read_size == 0 {
                return Some(0..0);
            }
            if rr.source_stag != SRC_STAG {
                return None;
            }
            let off = usize::try_from(rr.source_to.checked_sub(SRC_TO)?).ok()?;
            let end = off.checked_add(rr.read_size as usize)?;
            (end <= s.src.len()).then_some(off..end)
        };
        match ok(self) {
            Some(r) => {
                let data = self.src[r].to_vec();
                self.send(&Message::read_response(rr), &data);
                Ok(())
            }
            None => {
                let code = TermCode::RdmapRemoteProtection(if rr.source_stag != SRC_STAG {
                    RemoteProtectionCode::InvalidStag
                } else {
                    RemoteProtectionCode::BaseBounds
                });
                self.send(&Message::Terminate(TerminateRepr::new(code)), &[]);
                self.fin();
                Err(code)
            }
        }
    }

    /// The next complete inbound message, or why there is none before
    /// `deadline`.
    pub fn next(&mut self, deadline: Instant) -> Result<Inbound, End> {
        loop {
            if !self.pending.is_empty() {
                let piece = std::mem::take(&mut self.pending);
                let (used, found) = self.parse(&piece);
                self.pending = piece[used..].to_vec();
                match found {
                    Ok(Some(m)) => return Ok(m),
                    Ok(None) => {}
                    Err(e) => return Err(End::Invalid(e)),
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(End::Timeout);
            }
            let wait = (deadline - now).max(Duration::from_millis(1));
            let _ = self.stream.set_read_timeout(Some(wait));
            match self.stream.read(&mut self.rbuf) {
                Ok(0) => {
                    return Err(if self.rx.at_fpdu_boundary() {
                        End::Closed
                    } else {
                        End::ClosedMidFpdu
                    })
                }
                Ok(n) => self.pending = self.rbuf[..n].to_vec(),
                Err(e) if is_timeout(&e) => return Err(End::Timeout),
                Err(e) => match e.kind() {
                    ErrorKind::Interrupted => {}
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
                        return Err(End::Reset)
                    }
                    _ => return Err(End::Io(e.to_string())),
                },
            }
        }
    }

    /// Parses `piece` up to the first complete message; returns the
    /// octets used.
    fn parse(&mut self, piece: &[u8]) -> (usize, Result<Option<Inbound>, RxError>) {
        let mut rest = piece;
        let mut posted = |qn: u32, _: u32, _: Opcode| {
            matches!(qn, QN_SEND | QN_READ_REQUEST).then_some(u32::MAX)
        };
        loop {
            let before = rest.len();
            if self.rx.at_fpdu_boundary() {
                self.fpdu.clear();
            }
            let start = piece.len() - before;
            let polled = self.rx.poll(&mut rest, &mut posted);
            let used = piece.len() - rest.len();
            let keep = FPDU_HEAD.saturating_sub(self.fpdu.len());
            let got = &piece[start..used];
            self.fpdu.extend_from_slice(&got[..got.len().min(keep)]);
            let ev = match polled {
                Ok(Some(ev)) => ev,
                Ok(None) => return (piece.len(), Ok(None)),
                Err(e) => return (start, Err(e)),
            };
            match ev {
                RxEvent::Header(_) => {}
                RxEvent::Data(p) => {
                    if let Target::Tagged { stag, to } = p.target {
                        if stag == SINK_STAG {
                            let off = to.wrapping_sub(SINK_TO) as usize;
                            if let Some(dst) = off
                                .checked_add(p.data.len())
                                .and_then(|end| self.sink.get_mut(off..end))
                            {
                                dst.copy_from_slice(p.data);
                            }
                        }
                    }
                }
                RxEvent::Done(d) => {
                    let h = d.header;
                    let Some(len) = d.message_len else { continue };
                    let tagged_stag = match h.target {
                        Target::Tagged { stag, .. } => stag,
                        Target::Untagged { .. } => 0,
                    };
                    let m = match (h.opcode, self.rx.fixed_payload().copied()) {
                        (Opcode::Terminate, Some(FixedPayload::Terminate(t))) => {
                            let ctrl = self.fpdu.get(20..24).map(|c| [c[0], c[1], c[2], c[3]]);
                            match (self.le_terminate, ctrl) {
                                (true, Some(c)) => {
                                    let (l, ty, code) = crate::fuzz::exec::le_bitfield_code(c);
                                    Inbound::Terminate(
                                        TermCode::from_wire(l, ty, code)
                                            .map(TerminateRepr::new)
                                            .ok_or(Some(c)),
                                    )
                                }
                                _ => Inbound::Terminate(t.map_err(|_| ctrl)),
                            }
                        }
                        (Opcode::RdmaReadRequest, Some(FixedPayload::ReadRequest(rr))) => {
                            Inbound::ReadRequest(rr)
                        }
                        (
                            Opcode::Send
                            | Opcode::SendSe
                            | Opcode::SendInvalidate
                            | Opcode::SendSeInvalidate,
                            _,
                        ) => Inbound::Send(len),
                        (Opcode::RdmaWrite, _) => Inbound::Write {
                            stag: tagged_stag,
                            len,
                        },
                        (Opcode::RdmaReadResponse, _) => Inbound::ReadResponse {
                            stag: tagged_stag,
                            len,
                        },
                        (op, _) => Inbound::Other(op),
                    };
                    return (used, Ok(Some(m)));
                }
            }
        }
    }
}
