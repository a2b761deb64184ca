// SPDX-License-Identifier: GPL-2.0
//! The data path of one connection: RDMAP Send, RDMA Write and RDMA Read
//! (both directions) over `tx::Transmitter` and `rx::Receiver`.
//!
//! A [`Qp`] is single-threaded and blocking: operations are written to the
//! socket when posted (a posted Send or Write is complete when the socket
//! took it, as for a kernel iWARP provider), and [`Qp::poll`] reads from the
//! socket until a completion is ready. While polling, the QP acts as a
//! correct RDMA responder: it places inbound Writes into registered memory,
//! delivers Sends into posted receive buffers, answers inbound Read
//! Requests (at most IRD at a time) and answers every invalid frame with the
//! TERMINATE the receive parser chose, then closes.
//!
//! In peer-to-peer mode the initiator sends the negotiated RTR message
//! first; the responder does not transmit before it has received it.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use iwarp_core::crc32c::{CrcEngine, SoftCrc32c};
use iwarp_core::ddp::check_bounds;
use iwarp_core::mpa::{self, Negotiated, Rtr};
use iwarp_core::rdmap::{Extensions, Opcode, ReadRequest, QN_READ_REQUEST, QN_SEND};
use iwarp_core::rx::{
    FixedPayload, Placement, Receiver, RxConfig, RxError, RxEvent, SegmentDone, SegmentHeader,
    Target,
};
use iwarp_core::terminate::{
    MpaCode, RemoteOperationCode, RemoteProtectionCode, TaggedCode, TermCode, TerminateRepr,
    UntaggedCode,
};
use iwarp_core::tx::{Message, Transmitter, TxConfig};

use crate::conn::Established;
use crate::error::{is_timeout, Error, Result};

/// Effective MSS assumed for segmentation (Ethernet MTU, TCP timestamps):
/// every FPDU fits one TCP segment, as a kernel peer expects.
pub const EMSS: u32 = 1448;

/// How long a closing side waits for the peer to close too.
const LINGER: Duration = Duration::from_secs(2);

/// Remote access rights of a memory region (local access is always
/// allowed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// The peer may RDMA Read the region.
    pub remote_read: bool,
    /// The peer may RDMA Write the region.
    pub remote_write: bool,
}

impl Access {
    /// Local access only.
    pub const LOCAL: Access = Access {
        remote_read: false,
        remote_write: false,
    };
    /// Remote Read and Write (what `rping` registers).
    pub const REMOTE_RW: Access = Access {
        remote_read: true,
        remote_write: true,
    };
}

/// A registered memory region: `buf` is addressed by Tagged Offsets from
/// `base` on (a made-up virtual address, as a real provider's would be).
#[derive(Debug)]
pub struct Mr {
    stag: u32,
    base: u64,
    access: Access,
    valid: bool,
    buf: Vec<u8>,
}

impl Mr {
    /// The STag.
    pub fn stag(&self) -> u32 {
        self.stag
    }
    /// Tagged Offset of the first octet.
    pub fn base(&self) -> u64 {
        self.base
    }
    /// Length in octets.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// The contents.
    pub fn data(&self) -> &[u8] {
        &self.buf
    }
    /// The contents, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The octets `to..to + len` (Tagged Offsets), if inside the region.
    fn range(&self, to: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let off = usize::try_from(to.checked_sub(self.base)?).ok()?;
        let end = off.checked_add(len)?;
        (end <= self.buf.len()).then_some(off..end)
    }
}

/// Why a remote access is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AccessError {
    InvalidStag,
    Bounds,
    Rights,
}

/// What a remote access wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    /// The peer writes (RDMA Write).
    RemoteWrite,
    /// The peer reads (RDMA Read Request source).
    RemoteRead,
    /// Placement into our own buffer (Read Response sink).
    Local,
}

/// The memory regions of a QP, found by STag.
#[derive(Debug, Default)]
struct MrTable {
    mrs: Vec<Mr>,
}

impl MrTable {
    fn register(&mut self, len: usize, access: Access) -> u32 {
        let idx = self.mrs.len() as u32 + 1;
        // Index in the upper 24 bits, a key in the low 8, like siw.
        let stag = (idx << 8) | 0x5a;
        let base = 0x7f00_0000_0000 + (u64::from(idx) << 32);
        self.mrs.push(Mr {
            stag,
            base,
            access,
            valid: true,
            buf: vec![0; len],
        });
        stag
    }

    fn get(&self, stag: u32) -> Option<&Mr> {
        self.mrs.iter().find(|m| m.stag == stag)
    }

    fn get_mut(&mut self, stag: u32) -> Option<&mut Mr> {
        self.mrs.iter_mut().find(|m| m.stag == stag)
    }

    fn check(
        &self,
        stag: u32,
        to: u64,
        len: u32,
        need: Need,
    ) -> std::result::Result<(), AccessError> {
        let mr = self
            .get(stag)
            .filter(|m| m.valid)
            .ok_or(AccessError::InvalidStag)?;
        let allowed = match need {
            Need::RemoteWrite => mr.access.remote_write,
            Need::RemoteRead => mr.access.remote_read,
            Need::Local => true,
        };
        if !allowed {
            return Err(AccessError::Rights);
        }
        check_bounds(to, len, mr.base, mr.buf.len() as u64).map_err(|_| AccessError::Bounds)
    }
}

/// A tagged-buffer error found by DDP placement (Write, Read Response):
/// RFC 5041 section 7, layer DDP, type Tagged Buffer (access rights are an
/// RDMAP Remote Protection error, RFC 5040 section 7).
fn ddp_code(e: AccessError) -> TermCode {
    match e {
        AccessError::InvalidStag => TermCode::DdpTagged(TaggedCode::InvalidStag),
        AccessError::Bounds => TermCode::DdpTagged(TaggedCode::BaseBounds),
        AccessError::Rights => TermCode::RdmapRemoteProtection(RemoteProtectionCode::AccessRights),
    }
}

/// An RDMA Read Request's data source refused by RDMAP: RFC 5040 section
/// 7, layer RDMAP, type Remote Protection.
fn rdmap_code(e: AccessError) -> TermCode {
    TermCode::RdmapRemoteProtection(match e {
        AccessError::InvalidStag => RemoteProtectionCode::InvalidStag,
        AccessError::Bounds => RemoteProtectionCode::BaseBounds,
        AccessError::Rights => RemoteProtectionCode::AccessRights,
    })
}

const UNEXPECTED_OPCODE: TermCode =
    TermCode::RdmapRemoteOperation(RemoteOperationCode::UnexpectedOpcode);
const LOCAL_CATASTROPHIC: TermCode = TermCode::RdmapLocalCatastrophic(0xff);

/// A completed work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// A Send arrived in the oldest posted receive buffer: its payload.
    Recv(Vec<u8>),
    /// An RDMA Read finished: `len` octets were placed into `stag`.
    ReadDone {
        /// Sink STag.
        stag: u32,
        /// Octets read.
        len: u32,
    },
}

/// An RDMA Read Request of ours awaiting its Response.
#[derive(Clone, Copy, Debug)]
struct OutRead {
    sink: u32,
    len: u32,
    /// False for the zero-length Read RTR (no completion).
    user: bool,
}

/// Receive-side state: everything the events of the receive parser touch.
#[derive(Debug, Default)]
struct Local {
    mrs: MrTable,
    /// Capacities of the posted receive buffers, oldest first.
    rq: VecDeque<usize>,
    /// The buffer of the Send being received.
    recv: Option<Vec<u8>>,
    /// Inbound Read Requests to answer, oldest first.
    inbound: VecDeque<ReadRequest>,
    ird: usize,
    outstanding: VecDeque<OutRead>,
    completions: VecDeque<Completion>,
    /// Responder in P2P mode: the RTR not yet received.
    awaiting_rtr: Option<Rtr>,
    /// The peer's TERMINATE (`Err` if it did not parse).
    peer_term: Option<std::result::Result<TerminateRepr, ()>>,
}

fn is_send(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate
    )
}

impl Local {
    /// The receive parser's question: the buffer for the next untagged
    /// message on `qn`.
    fn posted_len(&self, qn: u32) -> Option<u32> {
        match qn {
            QN_SEND if self.awaiting_rtr == Some(Rtr::Send) => Some(0),
            QN_SEND => self
                .rq
                .front()
                .map(|&n| u32::try_from(n).unwrap_or(u32::MAX)),
            QN_READ_REQUEST => (self.inbound.len() < self.ird).then_some(u32::MAX),
            _ => None,
        }
    }

    fn on_header(
        &mut self,
        h: &SegmentHeader,
        fixed: Option<&FixedPayload>,
    ) -> std::result::Result<(), TermCode> {
        match (h.opcode, h.target) {
            (op, _) if is_send(op) => {
                if h.first {
                    self.recv = if self.awaiting_rtr == Some(Rtr::Send) {
                        None
                    } else {
                        let cap = self
                            .rq
                            .pop_front()
                            .ok_or(TermCode::DdpUntagged(UntaggedCode::MsnNoBuffer))?;
                        Some(vec![0; cap])
                    };
                }
                Ok(())
            }
            (Opcode::RdmaWrite, Target::Tagged { stag, to }) => {
                if h.payload_len == 0 {
                    return Ok(()); // names no memory (RTR)
                }
                self.mrs
                    .check(stag, to, h.payload_len, Need::RemoteWrite)
                    .map_err(ddp_code)
            }
            (Opcode::RdmaReadResponse, Target::Tagged { stag, to }) => {
                let out = self.outstanding.front().ok_or(UNEXPECTED_OPCODE)?;
                if h.payload_len == 0 {
                    return Ok(());
                }
                if stag != out.sink {
                    return Err(TermCode::DdpTagged(TaggedCode::InvalidStag));
                }
                self.mrs
                    .check(stag, to, h.payload_len, Need::Local)
                    .map_err(ddp_code)
            }
            (Opcode::RdmaReadRequest, _) => match fixed {
                Some(&FixedPayload::ReadRequest(rr)) if rr.read_size > 0 => self
                    .mrs
                    .check(rr.source_stag, rr.source_to, rr.read_size, Need::RemoteRead)
                    .map_err(rdmap_code),
                Some(FixedPayload::ReadRequest(_)) => Ok(()),
                _ => Err(LOCAL_CATASTROPHIC),
            },
            (Opcode::Terminate, _) => Ok(()),
            _ => Err(UNEXPECTED_OPCODE),
        }
    }

    fn on_data(&mut self, p: &Placement<'_>) -> std::result::Result<(), TermCode> {
        let dst = match p.target {
            Target::Untagged { mo, .. } => {
                let off = mo as usize;
                self.recv
                    .as_mut()
                    .and_then(|b| b.get_mut(off..off.checked_add(p.data.len())?))
            }
            Target::Tagged { stag, to } => self.mrs.get_mut(stag).and_then(|m| {
                let r = m.range(to, p.data.len())?;
                m.buf.get_mut(r)
            }),
        };
        // The target was checked at the segment's header.
        let dst = dst.ok_or(LOCAL_CATASTROPHIC)?;
        dst.copy_from_slice(p.data);
        Ok(())
    }

    fn on_done(
        &mut self,
        d: &SegmentDone,
        fixed: Option<&FixedPayload>,
    ) -> std::result::Result<(), TermCode> {
        let h = &d.header;
        let Some(len) = d.message_len else {
            return Ok(());
        };
        match h.opcode {
            op if is_send(op) => self.send_done(len, h.invalidate_stag)?,
            Opcode::RdmaWrite if len == 0 && self.awaiting_rtr == Some(Rtr::Write) => {
                self.awaiting_rtr = None;
            }
            Opcode::RdmaReadResponse => {
                let out = self.outstanding.pop_front().ok_or(UNEXPECTED_OPCODE)?;
                if len != u64::from(out.len) {
                    // RFC 5040 has no specific code for a short Response.
                    return Err(TermCode::RdmapRemoteOperation(
                        RemoteOperationCode::Unspecified,
                    ));
                }
                if out.user {
                    self.completions.push_back(Completion::ReadDone {
                        stag: out.sink,
                        len: u32::try_from(len).unwrap_or(u32::MAX),
                    });
                }
            }
            Opcode::RdmaReadRequest => {
                if let Some(&FixedPayload::ReadRequest(rr)) = fixed {
                    if rr.read_size == 0 && self.awaiting_rtr == Some(Rtr::Read) {
                        self.awaiting_rtr = None;
                    }
                    self.inbound.push_back(rr);
                }
            }
            Opcode::Terminate => {
                if let Some(&FixedPayload::Terminate(t)) = fixed {
                    self.peer_term = Some(t.map_err(|_| ()));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn send_done(
        &mut self,
        len: u64,
        invalidate: Option<u32>,
    ) -> std::result::Result<(), TermCode> {
        if let Some(stag) = invalidate {
            let mr = self.mrs.get_mut(stag).filter(|m| m.valid).ok_or(
                TermCode::RdmapRemoteOperation(RemoteOperationCode::CannotInvalidate),
            )?;
            mr.valid = false;
        }
        match self.recv.take() {
            Some(mut buf) => {
                buf.truncate(usize::try_from(len).unwrap_or(usize::MAX));
                self.completions.push_back(Completion::Recv(buf));
            }
            None => self.awaiting_rtr = None, // the Send RTR
        }
        Ok(())
    }
}

/// The transmit side: socket, transmit builder and CRC engine. Public so
/// that [`crate::inject`] can put crafted frames on the wire.
#[derive(Debug)]
pub struct Wire {
    stream: TcpStream,
    tx: Transmitter,
    crc: SoftCrc32c,
    trickle: Option<Duration>,
}

impl Wire {
    /// Builds the FPDUs of `msg` with `payload` (the core assigns its MSN
    /// and advances the stream) without sending them.
    pub fn emit(&mut self, msg: &Message, payload: &[u8]) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.tx.message_wire_len(msg)?];
        let n = self
            .tx
            .emit_message(msg, payload, &mut self.crc, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Builds and sends `msg`.
    pub fn send(&mut self, msg: &Message, payload: &[u8]) -> Result<()> {
        let frames = self.emit(msg, payload)?;
        self.write_raw(&frames)
    }

    /// Frames a caller-built ULPDU (DDP segment) as one FPDU at the current
    /// stream position, with markers and CRC as negotiated. The transmit
    /// builder is not advanced: use it for the last frame of a stream.
    pub fn frame(&mut self, ulpdu: &[u8]) -> Result<Vec<u8>> {
        let mut markers = self.tx.marker_state();
        let ulen =
            u16::try_from(ulpdu.len()).map_err(|_| mpa::MpaError::UlpduTooLong(ulpdu.len()))?;
        let mut out = vec![0u8; mpa::fpdu_wire_len(ulen, markers.as_ref())];
        let crc: Option<&mut dyn CrcEngine> = if self.tx.crc_enabled() {
            Some(&mut self.crc)
        } else {
            None
        };
        let n = mpa::emit_fpdu(ulpdu, markers.as_mut(), crc, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Sends octets as they are (one at a time if [`trickle_next`]
    /// (Self::trickle_next) was called).
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        match self.trickle.take() {
            Some(delay) => {
                for b in bytes.chunks(1) {
                    self.stream.write_all(b).map_err(|e| Error::io("send", e))?;
                    thread::sleep(delay);
                }
                Ok(())
            }
            None => self
                .stream
                .write_all(bytes)
                .map_err(|e| Error::io("send", e)),
        }
    }

    /// Sends the next frame one octet at a time, `delay` apart.
    pub fn trickle_next(&mut self, delay: Duration) {
        self.trickle = Some(delay);
    }

    /// The transmit builder (MSNs, CRC and marker state).
    pub fn transmitter(&self) -> &Transmitter {
        &self.tx
    }

    /// Closes the sending direction (TCP FIN).
    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buf)
    }

    /// Reads and discards until the peer closes or `LINGER` passes, so that
    /// our last frames are not destroyed by a reset.
    fn linger(&mut self) {
        let deadline = Instant::now() + LINGER;
        let _ = self
            .stream
            .set_read_timeout(Some(Duration::from_millis(100)));
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            match self.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if is_timeout(&e) => {}
                Err(_) => break,
            }
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// One RDMA connection (queue pair) in operation.
#[derive(Debug)]
pub struct Qp {
    wire: Wire,
    rx: Receiver<SoftCrc32c>,
    local: Local,
    negotiated: Negotiated,
    pending: Vec<u8>,
    rbuf: Vec<u8>,
    closed: bool,
}

impl Qp {
    /// Starts the data path of an established connection. In peer-to-peer
    /// mode the initiator sends its RTR now.
    pub fn new(est: Established) -> Result<Self> {
        let n = est.negotiated;
        let txc = TxConfig::from_negotiated(&n, mpa::mulpdu(EMSS, n.markers_tx), Extensions::NONE);
        let rxc = RxConfig::from_negotiated(&n, Extensions::NONE);
        let mut qp = Qp {
            wire: Wire {
                stream: est.stream,
                tx: Transmitter::new(txc),
                crc: SoftCrc32c::new(),
                trickle: None,
            },
            rx: Receiver::new(rxc, SoftCrc32c::new()),
            local: Local {
                ird: usize::from(n.ird),
                ..Local::default()
            },
            negotiated: n,
            pending: est.leftover,
            rbuf: vec![0; 64 * 1024],
            closed: false,
        };
        match (n.rtr, est.initiator) {
            (Some(rtr), true) => qp.send_rtr(rtr)?,
            (Some(rtr), false) => qp.local.awaiting_rtr = Some(rtr),
            (None, _) => {}
        }
        Ok(qp)
    }

    fn send_rtr(&mut self, rtr: Rtr) -> Result<()> {
        let msg = match rtr {
            Rtr::Send => Message::Send { len: 0 },
            Rtr::Write => Message::RdmaWrite {
                len: 0,
                stag: 0,
                to: 0,
            },
            Rtr::Read => {
                self.local.outstanding.push_back(OutRead {
                    sink: 0,
                    len: 0,
                    user: false,
                });
                Message::ReadRequest(ReadRequest::default())
            }
        };
        self.wire.send(&msg, &[])
    }

    /// The negotiated connection parameters.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// Registers a zeroed region of `len` octets; returns its STag.
    pub fn register(&mut self, len: usize, access: Access) -> u32 {
        self.local.mrs.register(len, access)
    }

    /// The region `stag` (must have been registered).
    pub fn mr(&self, stag: u32) -> Result<&Mr> {
        self.local.mrs.get(stag).ok_or_else(|| unknown_mr(stag))
    }

    /// The region `stag`, writable.
    pub fn mr_mut(&mut self, stag: u32) -> Result<&mut Mr> {
        self.local.mrs.get_mut(stag).ok_or_else(|| unknown_mr(stag))
    }

    /// Posts a receive buffer of `len` octets.
    pub fn post_recv(&mut self, len: usize) {
        self.local.rq.push_back(len);
    }

    /// The transmit side, for crafted frames.
    pub fn wire(&mut self) -> &mut Wire {
        &mut self.wire
    }

    /// Waits until this side may transmit (a P2P responder needs the RTR).
    pub fn ready(&mut self) -> Result<()> {
        while self.local.awaiting_rtr.is_some() {
            self.pump()?;
        }
        Ok(())
    }

    /// Sends `data` as one RDMAP Send.
    pub fn send(&mut self, data: &[u8]) -> Result<()> {
        self.ready()?;
        let len = u32::try_from(data.len()).map_err(|_| Error::Local("Send too long".into()))?;
        self.wire.send(&Message::Send { len }, data)
    }

    /// RDMA Writes `len` octets at offset `off` of local region `stag` to
    /// the peer's (`remote_stag`, `remote_to`).
    pub fn write(
        &mut self,
        stag: u32,
        off: usize,
        len: u32,
        remote_stag: u32,
        remote_to: u64,
    ) -> Result<()> {
        self.ready()?;
        let mr = self.local.mrs.get(stag).ok_or_else(|| unknown_mr(stag))?;
        let data = off
            .checked_add(len as usize)
            .and_then(|end| mr.buf.get(off..end))
            .ok_or_else(|| Error::Local(format!("Write of {len} octets exceeds local region")))?;
        let msg = Message::RdmaWrite {
            len,
            stag: remote_stag,
            to: remote_to,
        };
        self.wire.send(&msg, data)
    }

    /// Posts an RDMA Read of `len` octets from the peer's (`remote_stag`,
    /// `remote_to`) into offset `off` of local region `stag`; it completes
    /// with [`Completion::ReadDone`]. Fails if ORD Reads are outstanding.
    pub fn read(
        &mut self,
        stag: u32,
        off: usize,
        len: u32,
        remote_stag: u32,
        remote_to: u64,
    ) -> Result<()> {
        self.ready()?;
        if self.local.outstanding.len() >= usize::from(self.negotiated.ord) {
            return Err(Error::Local(format!(
                "RDMA Read not allowed: ORD is {}",
                self.negotiated.ord
            )));
        }
        let mr = self.local.mrs.get(stag).ok_or_else(|| unknown_mr(stag))?;
        if mr.range(mr.base + off as u64, len as usize).is_none() {
            return Err(Error::Local(format!(
                "RDMA Read of {len} octets exceeds the local region of {} octets",
                mr.len()
            )));
        }
        let req = ReadRequest {
            sink_stag: stag,
            sink_to: mr.base + off as u64,
            read_size: len,
            source_stag: remote_stag,
            source_to: remote_to,
        };
        self.wire.send(&Message::ReadRequest(req), &[])?;
        self.local.outstanding.push_back(OutRead {
            sink: stag,
            len,
            user: true,
        });
        Ok(())
    }

    /// Waits for the next completion, serving the peer meanwhile.
    pub fn poll(&mut self) -> Result<Completion> {
        loop {
            if let Some(c) = self.local.completions.pop_front() {
                return Ok(c);
            }
            self.pump()?;
        }
    }

    /// Waits for a Send; returns its payload.
    pub fn wait_recv(&mut self) -> Result<Vec<u8>> {
        match self.poll()? {
            Completion::Recv(data) => Ok(data),
            c => Err(Error::Protocol(format!("expected a Send, got {c:?}"))),
        }
    }

    /// Waits for the oldest RDMA Read to complete.
    pub fn wait_read(&mut self) -> Result<u32> {
        match self.poll()? {
            Completion::ReadDone { len, .. } => Ok(len),
            c => Err(Error::Protocol(format!(
                "expected an RDMA Read completion, got {c:?}"
            ))),
        }
    }

    /// Disconnects gracefully: FIN, then wait (briefly) for the peer's.
    pub fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.wire.shutdown_write();
            self.wire.linger();
        }
    }

    /// Reads once from the socket (or the handshake's leftover octets) and
    /// processes what arrived; then answers queued Read Requests.
    fn pump(&mut self) -> Result<()> {
        if self.closed {
            return Err(Error::PeerClosed);
        }
        let result = if self.pending.is_empty() {
            match self.wire.read(&mut self.rbuf) {
                Ok(0) => return Err(self.on_eof()),
                Ok(n) => feed(&mut self.rx, &mut self.local, &self.rbuf[..n]),
                Err(e) => {
                    let e = Error::io("waiting for data from the peer", e);
                    if matches!(e, Error::PeerReset) {
                        self.closed = true;
                    }
                    return Err(e);
                }
            }
        } else {
            let piece = std::mem::take(&mut self.pending);
            feed(&mut self.rx, &mut self.local, &piece)
        };
        if let Err(e) = result {
            return Err(self.fail(e));
        }
        if let Some(t) = self.local.peer_term {
            self.close();
            return Err(t.map_or(Error::BadTerminate, Error::PeerTerminate));
        }
        self.serve_reads()
    }

    fn serve_reads(&mut self) -> Result<()> {
        while let Some(rr) = self.local.inbound.pop_front() {
            let data = match self.local.mrs.get(rr.source_stag) {
                Some(mr) if rr.read_size > 0 => mr
                    .range(rr.source_to, rr.read_size as usize)
                    .and_then(|r| mr.buf.get(r))
                    .ok_or_else(|| Error::Protocol("Read source vanished".into()))?,
                _ => &[][..],
            };
            self.wire.send(&Message::read_response(&rr), data)?;
        }
        Ok(())
    }

    /// The receive parser failed: send its TERMINATE and close.
    fn fail(&mut self, e: RxError) -> Error {
        if e.should_send_terminate() {
            let _ = self.wire.send(&Message::Terminate(e.terminate), &[]);
        }
        self.close();
        Error::LocalTerminate(e)
    }

    /// The peer closed its sending direction.
    fn on_eof(&mut self) -> Error {
        if self.rx.at_fpdu_boundary() {
            self.close();
            return Error::PeerClosed;
        }
        let t = TerminateRepr::new(TermCode::Mpa(MpaCode::ConnectionLost));
        let _ = self.wire.send(&Message::Terminate(t), &[]);
        self.close();
        Error::Truncated
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.close();
    }
}

fn unknown_mr(stag: u32) -> Error {
    Error::Local(format!("no local memory region with STag {stag:#x}"))
}

/// Feeds one piece of the inbound stream through the receive parser,
/// handling its events; an invalid frame yields the parser's error with
/// the TERMINATE to send.
fn feed(
    rx: &mut Receiver<SoftCrc32c>,
    local: &mut Local,
    piece: &[u8],
) -> std::result::Result<(), RxError> {
    let mut rest = piece;
    while local.peer_term.is_none() {
        let mut posted = |qn: u32, _msn: u32, _op: Opcode| local.posted_len(qn);
        let Some(ev) = rx.poll(&mut rest, &mut posted)? else {
            break;
        };
        let r = match ev {
            RxEvent::Header(h) => local.on_header(&h, rx.fixed_payload()),
            RxEvent::Data(p) => local.on_data(&p),
            RxEvent::Done(d) => local.on_done(&d, rx.fixed_payload()),
        };
        if let Err(code) = r {
            return Err(rx.reject(code));
        }
    }
    Ok(())
}
