// SPDX-License-Identifier: GPL-2.0

//! Transmit builder: turns RDMAP messages into MPA FPDUs around payload it
//! never copies.
//!
//! The kernel sends message payload straight from the caller's pages
//! (zero-copy) and only the small framing octets from its own memory. This
//! module therefore describes every FPDU as an ordered list of [`Piece`]s:
//!
//! - [`Piece::Bytes`]: octets in a [`Batch`]'s scratch area: ULPDU_Length,
//!   the DDP/RDMAP header and any fixed-format RDMAP payload (Read Request,
//!   Terminate, Immediate Data, Atomic headers), PAD, the CRC field, and MPA
//!   markers;
//! - [`Piece::Payload`]: a range of the message payload, which stays where
//!   the caller keeps it. Markers (every 512 stream octets when negotiated,
//!   see `super::mpa`) split payload ranges where they fall.
//!
//! The parts:
//!
//! - [`Transmitter`]: one per connection direction. It holds the negotiated
//!   parameters ([`TxConfig`]: CRC, markers and the marker stream position,
//!   MULPDU, RFC 7306 extensions) and the MSN counter of every untagged
//!   queue.
//! - [`Message`]: what to send, one variant per RDMAP operation;
//!   [`Transmitter::start`] validates it, assigns its MSN and returns a
//!   [`MessageTx`], the message's segmentation cursor.
//! - [`Transmitter::plan`] appends whole FPDUs of one message to a
//!   [`Batch`] (fixed capacity: `P` pieces, `S` scratch octets), bounded by
//!   a byte budget (socket space, GSO size). Several messages may be planned
//!   into one batch, so the kernel issues one `sendmsg` per batch. The batch
//!   is resumable: [`Batch::pending`] lists what is still to be sent (the
//!   first piece trimmed to the exact octet) and [`Batch::advance`] records
//!   what the socket accepted.
//! - The CRC is computed while planning, in wire order, through a
//!   [`CrcEngine`]; payload octets are fed to it by the caller's
//!   [`PayloadSource`] (the kernel maps its pages; [`Contiguous`] and
//!   [`Scattered`] serve plain slices). With CRC off the CRC field is four
//!   zero octets and the source is never asked for anything.
//! - [`Transmitter::emit_message`]: the convenience form that writes one
//!   whole message into a contiguous buffer (tests, fuzzing, the userspace
//!   peer).
//!
//! Planning commits: once an FPDU is in a batch, the stream position (and
//! the message's MSN, at [`Transmitter::start`]) are consumed, so every
//! planned batch must be sent completely and in order.
//!
//! # Example
//!
//! ```
//! use iwarp_core::crc32c::SoftCrc32c;
//! use iwarp_core::rdmap::Extensions;
//! use iwarp_core::tx::{Batch, Chunk, Contiguous, Message, PlanStatus, Transmitter, TxConfig};
//!
//! let config = TxConfig {
//!     crc: true,
//!     markers: false,
//!     stream_start: 0,
//!     mulpdu: 1448 - 6 - 2, // mpa::mulpdu(1448, false)
//!     extensions: Extensions::NONE,
//! };
//! let mut tx = Transmitter::new(config);
//! let payload = vec![0x5a_u8; 5000];
//! let mut msg = tx.start(&Message::Send { len: 5000 }).unwrap();
//! let mut batch: Batch<16, 256> = Batch::new();
//! let mut crc = SoftCrc32c::new();
//! let mut wire = Vec::new();
//! loop {
//!     let r = tx
//!         .plan(&mut batch, &mut msg, 0, &mut Contiguous(&payload), &mut crc, 4096)
//!         .unwrap();
//!     // "sendmsg": here the socket takes at most 1000 octets at a time.
//!     while !batch.is_done() {
//!         let mut room = 1000;
//!         for chunk in batch.chunks() {
//!             let bytes = match chunk {
//!                 Chunk::Bytes(b) => b,
//!                 Chunk::Payload { offset, len, .. } => {
//!                     &payload[offset as usize..(offset + len) as usize]
//!                 }
//!             };
//!             let n = bytes.len().min(room);
//!             wire.extend_from_slice(&bytes[..n]);
//!             room -= n;
//!             if room == 0 {
//!                 break;
//!             }
//!         }
//!         batch.advance(1000 - room).unwrap();
//!     }
//!     if r.status == PlanStatus::MessageDone {
//!         break;
//!     }
//! }
//! // The same octets as the contiguous form.
//! let mut tx2 = Transmitter::new(config);
//! let mut out = vec![0u8; 6000];
//! let n = tx2
//!     .emit_message(&Message::Send { len: 5000 }, &payload, &mut crc, &mut out)
//!     .unwrap();
//! assert_eq!(wire, &out[..n]);
//! ```
//!
//! # Driving it from the kernel
//!
//! ```text
//! // per QP: tx: Transmitter, batch: Batch<P, S> (allocated once, off the
//! // stack), cur: Option<(MessageTx, wqe)>
//! loop {
//!     if batch.is_done() {                        // all sent: plan more
//!         let budget = sk_stream_wspace(sk) (or the GSO size);
//!         loop {
//!             let (m, wqe) = cur.get_or_insert(tx.start(&next_wqe.message())?, next_wqe);
//!             let r = tx.plan(&mut batch, m, wqe.slot, &mut wqe.pages, crc, budget)?;
//!             if r.status != PlanStatus::MessageDone { break; }
//!             wqe completes once this batch is sent; cur = None;
//!             if no more work requests { break; }
//!         }
//!         if batch.is_done() { break; }           // nothing to send
//!         frag = page_frag copy of batch.scratch(); // once per batch
//!     }
//!     bvecs = batch.pending() (first k of them):
//!         Bytes { start, len }          -> frag page, frag offset + start, len
//!         Payload { tag, offset, len }  -> the pages of work request `tag`
//!     n = sock_sendmsg(ITER_BVEC(bvecs), MSG_SPLICE_PAGES | MSG_DONTWAIT
//!                      | MSG_MORE if more is queued);
//!     if n > 0 { batch.advance(n)?; }            // may be short: resume later
//!     if n == -EAGAIN { wait for write space; return; }
//!     if batch.is_done() { complete the work requests planned into it; }
//! }
//! ```
//!
//! Notes for the kernel side:
//!
//! - In 6.12 `skb_splice_from_iter` refuses slab pages (`WARN_ON_ONCE(
//!   !sendpage_ok(page))`, then `-EIO`), and spliced pages stay referenced
//!   by the skb until acknowledged. So do not splice the batch's scratch
//!   area itself: copy [`Batch::scratch`] (one contiguous run, a few dozen
//!   octets per FPDU; [`Piece::Bytes`] are offsets into it, not pointers)
//!   into a refcounted page fragment per batch, or send the scratch runs
//!   without `MSG_SPLICE_PAGES`.
//! - A batch reclaims its capacity only once fully sent; appending to a
//!   partly sent batch is allowed but uses what is left.
//! - The CRC is computed at planning time from the payload pages; the
//!   payload must not change between `plan` and transmission.

use super::crc32c::CrcEngine;
use super::ddp::{
    copy_octets, BufferFields, DdpHeader, EmitError, Segment, SegmentError, Segmenter,
    TaggedFields, UntaggedFields, INITIAL_MSN, UNTAGGED_HEADER_LEN,
};
use super::mpa::{self, MarkerState, Negotiated, CRC_LEN, ULPDU_LENGTH_LEN};
use super::rdmap::{
    AtomicRequest, AtomicResponse, Extensions, ImmediateData, Opcode, PayloadKind, ReadRequest,
    ATOMIC_REQUEST_LEN, QUEUE_COUNT,
};
use super::terminate::{self, TerminateRepr};

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// Largest fixed-format RDMAP payload a message carries in its header
/// octets (an Atomic Request or a Terminate with both headers: 52).
pub const MAX_FIXED_PAYLOAD: usize = max(ATOMIC_REQUEST_LEN, terminate::MAX_LEN);

/// Largest MULPDU used while markers are on. Above it an FPDU could hold a
/// marker whose FPDUPTR does not fit 16 bits; [`Transmitter`] clamps to it.
/// (An FPDU carrying 65002 octets is 65008 framed octets plus at most 129
/// markers, so no marker lies more than 65524 octets past its header.)
pub const MAX_MARKED_MULPDU: u16 = 65002;

/// Scratch octets of one FPDU apart from markers: ULPDU_Length, the longest
/// header with the longest fixed payload, PAD and the CRC field. Each marker
/// inside the FPDU adds [`MARKER_LEN`](super::mpa::MARKER_LEN) octets.
pub const FPDU_SCRATCH_LEN: usize =
    ULPDU_LENGTH_LEN + UNTAGGED_HEADER_LEN + MAX_FIXED_PAYLOAD + 3 + CRC_LEN;

/// Length of the octets before the payload: ULPDU_Length, header, fixed
/// payload.
const HEAD_LEN: usize = ULPDU_LENGTH_LEN + UNTAGGED_HEADER_LEN + MAX_FIXED_PAYLOAD;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a message could not be started, planned or emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxError {
    /// The message is an RFC 7306 operation the connection did not enable.
    ExtensionDisabled(Opcode),
    /// MULPDU leaves no room for the message: `needed` is the smallest
    /// MULPDU that would do (header plus fixed payload, or header plus one
    /// payload octet).
    MulpduTooSmall {
        /// The MULPDU in use.
        mulpdu: u16,
        /// The smallest MULPDU the message needs.
        needed: usize,
    },
    /// A tagged message would run past Tagged Offset 2^64 - 1.
    ToWrap,
    /// The Terminate repr violates its invariants
    /// ([`TerminateRepr::is_consistent`]).
    InvalidTerminate,
    /// The payload handed over does not have the message's length.
    PayloadLength {
        /// The message's payload length.
        expected: u32,
        /// The length given.
        actual: usize,
    },
    /// The [`PayloadSource`] cannot supply the requested payload range.
    PayloadUnavailable {
        /// Offset of the range within the message payload.
        offset: u32,
        /// Length of the range.
        len: u32,
    },
    /// Not even one FPDU fits an empty batch: its piece array or scratch
    /// area is too small for the MULPDU (and markers) in use.
    BatchTooSmall,
    /// The output buffer is too small; `needed` octets are required.
    BufferTooSmall {
        /// Wire length of the whole message.
        needed: usize,
    },
    /// [`Batch::advance`] was asked to step over more octets than are
    /// pending.
    AdvanceBeyondPending {
        /// Octets requested.
        requested: usize,
        /// Octets pending.
        pending: usize,
    },
    /// An internal inconsistency (unreachable; reported instead of a
    /// panic).
    Internal,
}

/// What the layout code runs into: a full destination, or a real error.
enum LayoutError {
    Full,
    Tx(TxError),
}

impl From<TxError> for LayoutError {
    fn from(e: TxError) -> Self {
        LayoutError::Tx(e)
    }
}

// ---------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------

/// One RDMAP message to send. ULP payload (`len` octets) is supplied
/// separately (a [`PayloadSource`] or a slice); fixed-format payloads are
/// part of the variant.
///
/// RFC 7306 "Write with Immediate Data" and "Send with Immediate Data" are
/// two messages each, an RDMA Write or Send followed by an Immediate Data
/// message: see [`Message::write_with_immediate`] and
/// [`Message::send_with_immediate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// Send (opcode 0x3).
    Send {
        /// Payload length.
        len: u32,
    },
    /// Send with Invalidate (opcode 0x4).
    SendInvalidate {
        /// Payload length.
        len: u32,
        /// The STag the peer is to invalidate.
        stag: u32,
    },
    /// Send with Solicited Event (opcode 0x5).
    SendSe {
        /// Payload length.
        len: u32,
    },
    /// Send with Solicited Event and Invalidate (opcode 0x6).
    SendSeInvalidate {
        /// Payload length.
        len: u32,
        /// The STag the peer is to invalidate.
        stag: u32,
    },
    /// RDMA Write (opcode 0x0).
    RdmaWrite {
        /// Payload length.
        len: u32,
        /// Data sink STag.
        stag: u32,
        /// Data sink Tagged Offset of the first payload octet.
        to: u64,
    },
    /// RDMA Read Request (opcode 0x1).
    ReadRequest(ReadRequest),
    /// RDMA Read Response (opcode 0x2).
    ReadResponse {
        /// Payload length (the Read Request's size).
        len: u32,
        /// Data sink STag (the Read Request's sink STag).
        stag: u32,
        /// Data sink Tagged Offset (the Read Request's sink TO).
        to: u64,
    },
    /// Terminate (opcode 0x7).
    Terminate(TerminateRepr),
    /// RFC 7306 Immediate Data (opcode 0x8) or Immediate Data with
    /// Solicited Event (opcode 0x9).
    ImmediateData {
        /// The eight octets.
        data: ImmediateData,
        /// Ask for a Solicited Event (opcode 0x9).
        solicited: bool,
    },
    /// RFC 7306 Atomic Request (opcode 0xA).
    AtomicRequest(AtomicRequest),
    /// RFC 7306 Atomic Response (opcode 0xB).
    AtomicResponse(AtomicResponse),
}

impl Message {
    /// The Send variant for the given flags: with `invalidate` the peer
    /// invalidates that STag, with `solicited` a Solicited Event is asked.
    pub const fn send(len: u32, solicited: bool, invalidate: Option<u32>) -> Self {
        match (solicited, invalidate) {
            (false, None) => Message::Send { len },
            (true, None) => Message::SendSe { len },
            (false, Some(stag)) => Message::SendInvalidate { len, stag },
            (true, Some(stag)) => Message::SendSeInvalidate { len, stag },
        }
    }

    /// The Read Response answering `req` (its payload is `req.read_size`
    /// octets of the source buffer).
    pub const fn read_response(req: &ReadRequest) -> Self {
        Message::ReadResponse {
            len: req.read_size,
            stag: req.sink_stag,
            to: req.sink_to,
        }
    }

    /// RFC 7306 RDMA Write with Immediate Data: the Write, then the
    /// Immediate Data message (with Solicited Event if `solicited`).
    pub const fn write_with_immediate(
        len: u32,
        stag: u32,
        to: u64,
        data: ImmediateData,
        solicited: bool,
    ) -> [Self; 2] {
        [
            Message::RdmaWrite { len, stag, to },
            Message::ImmediateData { data, solicited },
        ]
    }

    /// RFC 7306 Send with Immediate Data: a plain Send, then the Immediate
    /// Data message (with Solicited Event if `solicited`).
    pub const fn send_with_immediate(len: u32, data: ImmediateData, solicited: bool) -> [Self; 2] {
        [
            Message::Send { len },
            Message::ImmediateData { data, solicited },
        ]
    }

    /// The message's RDMAP opcode.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Message::Send { .. } => Opcode::Send,
            Message::SendInvalidate { .. } => Opcode::SendInvalidate,
            Message::SendSe { .. } => Opcode::SendSe,
            Message::SendSeInvalidate { .. } => Opcode::SendSeInvalidate,
            Message::RdmaWrite { .. } => Opcode::RdmaWrite,
            Message::ReadRequest(_) => Opcode::RdmaReadRequest,
            Message::ReadResponse { .. } => Opcode::RdmaReadResponse,
            Message::Terminate(_) => Opcode::Terminate,
            Message::ImmediateData {
                solicited: false, ..
            } => Opcode::ImmediateData,
            Message::ImmediateData {
                solicited: true, ..
            } => Opcode::ImmediateDataSe,
            Message::AtomicRequest(_) => Opcode::AtomicRequest,
            Message::AtomicResponse(_) => Opcode::AtomicResponse,
        }
    }

    /// Length of the caller-supplied payload: `len` for the ULP-data
    /// messages, 0 for the fixed-format ones.
    pub const fn payload_len(&self) -> u32 {
        match *self {
            Message::Send { len }
            | Message::SendInvalidate { len, .. }
            | Message::SendSe { len }
            | Message::SendSeInvalidate { len, .. }
            | Message::RdmaWrite { len, .. }
            | Message::ReadResponse { len, .. } => len,
            Message::ReadRequest(_)
            | Message::Terminate(_)
            | Message::ImmediateData { .. }
            | Message::AtomicRequest(_)
            | Message::AtomicResponse(_) => 0,
        }
    }

    /// The DDP buffer fields of the message (MSN given, MO 0).
    fn target(&self, msn: u32) -> BufferFields {
        let untagged = |qn: u32, rsvd_ulp: u32| {
            BufferFields::Untagged(UntaggedFields {
                rsvd_ulp,
                qn,
                msn,
                mo: 0,
            })
        };
        let qn = self.opcode().queue_number().unwrap_or(0);
        match *self {
            Message::RdmaWrite { stag, to, .. } | Message::ReadResponse { stag, to, .. } => {
                BufferFields::Tagged(TaggedFields { stag, to })
            }
            Message::SendInvalidate { stag, .. } | Message::SendSeInvalidate { stag, .. } => {
                untagged(qn, stag)
            }
            _ => untagged(qn, 0),
        }
    }

    /// Writes the fixed-format payload into `buf`; returns its length.
    fn emit_fixed(&self, buf: &mut [u8]) -> Result<usize, TxError> {
        let r = match self {
            Message::ReadRequest(rr) => rr.emit(buf),
            Message::Terminate(t) => {
                if !t.is_consistent() {
                    return Err(TxError::InvalidTerminate);
                }
                t.emit(buf)
            }
            Message::ImmediateData { data, .. } => data.emit(buf),
            Message::AtomicRequest(a) => a.emit(buf),
            Message::AtomicResponse(a) => a.emit(buf),
            _ => Ok(0),
        };
        r.map_err(|e| match e {
            EmitError::Inconsistent => TxError::InvalidTerminate,
            _ => TxError::Internal,
        })
    }
}

// ---------------------------------------------------------------------------
// Payload sources
// ---------------------------------------------------------------------------

/// Supplies message payload octets to the CRC computation (only called
/// when CRC is on). The planner asks for consecutive ranges in wire order,
/// split where markers fall.
pub trait PayloadSource {
    /// Feeds payload octets `offset..offset + len` of the message to `crc`
    /// (in order; the range may be fed in several `update` calls). Returns
    /// [`TxError::PayloadUnavailable`] if the range is not available.
    fn update_crc(&mut self, offset: u32, len: u32, crc: &mut dyn CrcEngine)
        -> Result<(), TxError>;
}

/// A payload held in one slice.
#[derive(Clone, Copy, Debug)]
pub struct Contiguous<'a>(pub &'a [u8]);

impl PayloadSource for Contiguous<'_> {
    fn update_crc(
        &mut self,
        offset: u32,
        len: u32,
        crc: &mut dyn CrcEngine,
    ) -> Result<(), TxError> {
        let data = range(self.0, offset, len).ok_or(TxError::PayloadUnavailable { offset, len })?;
        crc.update(data);
        Ok(())
    }
}

/// A payload held in consecutive slices (a scatter/gather list): the
/// message payload is their concatenation.
#[derive(Clone, Copy, Debug)]
pub struct Scattered<'a>(pub &'a [&'a [u8]]);

impl PayloadSource for Scattered<'_> {
    fn update_crc(
        &mut self,
        offset: u32,
        len: u32,
        crc: &mut dyn CrcEngine,
    ) -> Result<(), TxError> {
        let unavailable = TxError::PayloadUnavailable { offset, len };
        let mut skip = usize::try_from(offset).map_err(|_| unavailable)?;
        let mut left = usize::try_from(len).map_err(|_| unavailable)?;
        for s in self.0 {
            if left == 0 {
                break;
            }
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            let avail = s.len() - skip;
            let n = avail.min(left);
            let part = s.get(skip..skip + n).ok_or(TxError::Internal)?;
            crc.update(part);
            left -= n;
            skip = 0;
        }
        if left == 0 {
            Ok(())
        } else {
            Err(unavailable)
        }
    }
}

/// The source of a message without ULP payload (or with CRC off): every
/// non-empty request fails.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPayload;

impl PayloadSource for NoPayload {
    fn update_crc(
        &mut self,
        offset: u32,
        len: u32,
        _crc: &mut dyn CrcEngine,
    ) -> Result<(), TxError> {
        if len == 0 {
            Ok(())
        } else {
            Err(TxError::PayloadUnavailable { offset, len })
        }
    }
}

/// `data[offset..offset + len]`, if in bounds.
fn range(data: &[u8], offset: u32, len: u32) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    data.get(start..end)
}

// ---------------------------------------------------------------------------
// Pieces and batches
// ---------------------------------------------------------------------------

/// One contiguous run of wire octets of a [`Batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Octets `start..start + len` of the batch's scratch area
    /// ([`Batch::scratch`]).
    Bytes {
        /// Offset in the scratch area.
        start: u32,
        /// Number of octets.
        len: u32,
    },
    /// Octets `offset..offset + len` of the payload of the message planned
    /// with this `tag` (see [`Transmitter::plan`]).
    Payload {
        /// The caller's tag of the message.
        tag: u32,
        /// Offset within the message payload.
        offset: u32,
        /// Number of octets.
        len: u32,
    },
}

impl Piece {
    const EMPTY: Piece = Piece::Bytes { start: 0, len: 0 };

    /// Number of wire octets.
    pub const fn len(&self) -> usize {
        match *self {
            Piece::Bytes { len, .. } | Piece::Payload { len, .. } => len as usize,
        }
    }

    /// Whether the piece holds no octets (never the case for pieces of a
    /// batch).
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The piece without its first `n` octets (saturating).
    pub fn skip(&self, n: usize) -> Piece {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        match *self {
            Piece::Bytes { start, len } => {
                let k = n.min(len);
                Piece::Bytes {
                    start: start.saturating_add(k),
                    len: len - k,
                }
            }
            Piece::Payload { tag, offset, len } => {
                let k = n.min(len);
                Piece::Payload {
                    tag,
                    offset: offset.saturating_add(k),
                    len: len - k,
                }
            }
        }
    }
}

/// A [`Piece`] with its scratch octets resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunk<'a> {
    /// Framing octets (header, PAD, CRC, markers).
    Bytes(&'a [u8]),
    /// A payload range, as in [`Piece::Payload`].
    Payload {
        /// The caller's tag of the message.
        tag: u32,
        /// Offset within the message payload.
        offset: u32,
        /// Number of octets.
        len: u32,
    },
}

impl Chunk<'_> {
    /// Number of wire octets.
    pub const fn len(&self) -> usize {
        match *self {
            Chunk::Bytes(b) => b.len(),
            Chunk::Payload { len, .. } => len as usize,
        }
    }

    /// Whether the chunk holds no octets.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The pieces of a batch not yet sent, the first one trimmed to the first
/// unsent octet (see [`Batch::pending`]).
#[derive(Clone, Debug)]
pub struct Pending<'a> {
    pieces: core::slice::Iter<'a, Piece>,
    skip: usize,
}

impl Iterator for Pending<'_> {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        let p = self.pieces.next()?;
        let skip = core::mem::take(&mut self.skip);
        Some(p.skip(skip))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.pieces.size_hint()
    }
}

impl ExactSizeIterator for Pending<'_> {}

/// The unsent part of a batch with scratch octets resolved (see
/// [`Batch::chunks`]).
#[derive(Clone, Debug)]
pub struct Chunks<'a> {
    pending: Pending<'a>,
    scratch: &'a [u8],
}

impl<'a> Iterator for Chunks<'a> {
    type Item = Chunk<'a>;

    fn next(&mut self) -> Option<Chunk<'a>> {
        let p = self.pending.next()?;
        Some(resolve(self.scratch, &p))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.pending.size_hint()
    }
}

impl ExactSizeIterator for Chunks<'_> {}

fn resolve<'a>(scratch: &'a [u8], p: &Piece) -> Chunk<'a> {
    match *p {
        Piece::Bytes { start, len } => Chunk::Bytes(range(scratch, start, len).unwrap_or(&[])),
        Piece::Payload { tag, offset, len } => Chunk::Payload { tag, offset, len },
    }
}

/// The state of a batch before an FPDU is laid out, to undo it.
#[derive(Clone, Copy)]
struct Snapshot {
    npieces: usize,
    nscratch: usize,
    last: Option<Piece>,
}

/// A batch of FPDUs (of one or more messages) to be sent with one
/// `sendmsg`: up to `P` pieces and `S` scratch octets, no allocation.
///
/// Filled by [`Transmitter::plan`], drained by [`Batch::advance`]. Planning
/// into a batch whose octets were all sent clears it first, so a batch is
/// reused without an explicit [`clear`](Self::clear). Planning into a batch
/// that is partly sent appends (the budget then bounds the pending octets).
///
/// Sizing: an FPDU needs at most [`FPDU_SCRATCH_LEN`] scratch octets plus 4
/// per marker, and at most 3 pieces plus 2 per marker inside it (fewer when
/// consecutive scratch runs merge).
#[derive(Clone, Debug)]
pub struct Batch<const P: usize, const S: usize> {
    pieces: [Piece; P],
    npieces: usize,
    scratch: [u8; S],
    nscratch: usize,
    total: usize,
    sent: usize,
    cursor: usize,
    cursor_off: usize,
    fpdus: usize,
}

impl<const P: usize, const S: usize> Default for Batch<P, S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const P: usize, const S: usize> Batch<P, S> {
    /// An empty batch.
    pub const fn new() -> Self {
        Batch {
            pieces: [Piece::EMPTY; P],
            npieces: 0,
            scratch: [0; S],
            nscratch: 0,
            total: 0,
            sent: 0,
            cursor: 0,
            cursor_off: 0,
            fpdus: 0,
        }
    }

    /// Forgets everything in the batch, sent or not.
    pub fn clear(&mut self) {
        self.npieces = 0;
        self.nscratch = 0;
        self.total = 0;
        self.sent = 0;
        self.cursor = 0;
        self.cursor_off = 0;
        self.fpdus = 0;
    }

    /// Wire octets in the batch (sent or not).
    pub const fn len(&self) -> usize {
        self.total
    }

    /// Whether the batch holds nothing.
    pub const fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Wire octets already sent.
    pub const fn sent_len(&self) -> usize {
        self.sent
    }

    /// Wire octets still to be sent.
    pub const fn pending_len(&self) -> usize {
        self.total.saturating_sub(self.sent)
    }

    /// Whether every octet of the batch was sent (true for an empty batch).
    pub const fn is_done(&self) -> bool {
        self.sent >= self.total
    }

    /// Number of FPDUs in the batch.
    pub const fn fpdu_count(&self) -> usize {
        self.fpdus
    }

    /// Every piece of the batch, in wire order (sent ones included).
    pub fn pieces(&self) -> &[Piece] {
        self.pieces.get(..self.npieces).unwrap_or(&[])
    }

    /// The used part of the scratch area, which [`Piece::Bytes`] ranges
    /// index. It is one contiguous run, so the kernel may copy it into a
    /// refcounted page once per batch and point its `bio_vec`s there.
    pub fn scratch(&self) -> &[u8] {
        self.scratch.get(..self.nscratch).unwrap_or(&[])
    }

    /// Resolves a piece's scratch octets.
    pub fn resolve(&self, piece: &Piece) -> Chunk<'_> {
        resolve(self.scratch(), piece)
    }

    /// The pieces still to be sent, in wire order; the first is trimmed to
    /// the first unsent octet.
    pub fn pending(&self) -> Pending<'_> {
        Pending {
            pieces: self
                .pieces
                .get(self.cursor..self.npieces)
                .unwrap_or(&[])
                .iter(),
            skip: self.cursor_off,
        }
    }

    /// [`pending`](Self::pending) with the scratch octets resolved.
    pub fn chunks(&self) -> Chunks<'_> {
        Chunks {
            pending: self.pending(),
            scratch: self.scratch(),
        }
    }

    /// Records that the next `n` pending octets were sent. Fails, without
    /// change, if fewer than `n` octets are pending.
    pub fn advance(&mut self, n: usize) -> Result<(), TxError> {
        let pending = self.pending_len();
        if n > pending {
            return Err(TxError::AdvanceBeyondPending {
                requested: n,
                pending,
            });
        }
        let mut left = n;
        while left > 0 {
            let Some(p) = self.pieces.get(self.cursor) else {
                return Err(TxError::Internal); // unreachable: n <= pending
            };
            let avail = p.len().saturating_sub(self.cursor_off);
            if left < avail {
                self.cursor_off += left;
                left = 0;
            } else {
                left -= avail;
                self.cursor += 1;
                self.cursor_off = 0;
            }
        }
        self.sent = self.sent.saturating_add(n);
        Ok(())
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            npieces: self.npieces,
            nscratch: self.nscratch,
            last: self
                .npieces
                .checked_sub(1)
                .and_then(|i| self.pieces.get(i))
                .copied(),
        }
    }

    fn restore(&mut self, s: Snapshot) {
        self.npieces = s.npieces;
        self.nscratch = s.nscratch;
        if let (Some(i), Some(p)) = (s.npieces.checked_sub(1), s.last) {
            if let Some(slot) = self.pieces.get_mut(i) {
                *slot = p;
            }
        }
    }

    /// The last piece, if it may still be extended (not yet passed by the
    /// send cursor).
    fn last_open(&mut self) -> Option<&mut Piece> {
        let i = self.npieces.checked_sub(1)?;
        if i < self.cursor {
            return None;
        }
        self.pieces.get_mut(i)
    }

    fn push_piece(&mut self, p: Piece) -> Result<(), LayoutError> {
        let slot = self.pieces.get_mut(self.npieces).ok_or(LayoutError::Full)?;
        *slot = p;
        self.npieces += 1;
        Ok(())
    }

    fn put_bytes(&mut self, b: &[u8]) -> Result<(), LayoutError> {
        if b.is_empty() {
            return Ok(());
        }
        let start = self.nscratch;
        let end = start.checked_add(b.len()).ok_or(LayoutError::Full)?;
        let (Ok(start32), Ok(len32)) = (u32::try_from(start), u32::try_from(b.len())) else {
            return Err(LayoutError::Full);
        };
        if u32::try_from(end).is_err() || end > S {
            return Err(LayoutError::Full);
        }
        let merged = match self.last_open() {
            Some(Piece::Bytes { start: s, len }) if s.checked_add(*len) == Some(start32) => {
                *len = len.saturating_add(len32);
                true
            }
            _ => false,
        };
        if !merged {
            self.push_piece(Piece::Bytes {
                start: start32,
                len: len32,
            })?;
        }
        let dst = self.scratch.get_mut(start..end).ok_or(LayoutError::Full)?;
        copy_octets(dst, b);
        self.nscratch = end;
        Ok(())
    }

    fn put_payload(&mut self, tag: u32, offset: u32, len: u32) -> Result<(), LayoutError> {
        if len == 0 {
            return Ok(());
        }
        if let Some(Piece::Payload {
            tag: t,
            offset: o,
            len: l,
        }) = self.last_open()
        {
            if *t == tag && o.checked_add(*l) == Some(offset) {
                if let Some(sum) = l.checked_add(len) {
                    *l = sum;
                    return Ok(());
                }
            }
        }
        self.push_piece(Piece::Payload { tag, offset, len })
    }
}

// ---------------------------------------------------------------------------
// FPDU layout
// ---------------------------------------------------------------------------

/// Where laid-out FPDU octets go.
trait Sink {
    fn put_bytes(&mut self, b: &[u8]) -> Result<(), LayoutError>;
    fn put_payload(&mut self, offset: u32, len: u32) -> Result<(), LayoutError>;
}

struct BatchSink<'b, const P: usize, const S: usize> {
    batch: &'b mut Batch<P, S>,
    tag: u32,
}

impl<const P: usize, const S: usize> Sink for BatchSink<'_, P, S> {
    fn put_bytes(&mut self, b: &[u8]) -> Result<(), LayoutError> {
        self.batch.put_bytes(b)
    }

    fn put_payload(&mut self, offset: u32, len: u32) -> Result<(), LayoutError> {
        self.batch.put_payload(self.tag, offset, len)
    }
}

/// Writes into a contiguous buffer, copying payload from a slice.
struct BufSink<'o, 'p> {
    out: &'o mut [u8],
    off: usize,
    payload: &'p [u8],
}

impl BufSink<'_, '_> {
    fn put(&mut self, b: &[u8]) -> Result<(), LayoutError> {
        let end = self.off.checked_add(b.len()).ok_or(LayoutError::Full)?;
        let dst = self.out.get_mut(self.off..end).ok_or(LayoutError::Full)?;
        copy_octets(dst, b);
        self.off = end;
        Ok(())
    }
}

impl Sink for BufSink<'_, '_> {
    fn put_bytes(&mut self, b: &[u8]) -> Result<(), LayoutError> {
        self.put(b)
    }

    fn put_payload(&mut self, offset: u32, len: u32) -> Result<(), LayoutError> {
        let src = range(self.payload, offset, len)
            .ok_or(LayoutError::Tx(TxError::PayloadUnavailable { offset, len }))?;
        self.put(src)
    }
}

/// Lays out FPDUs: inserts markers, feeds the CRC in wire order, writes the
/// trailer. Works on a copy of the marker state; the caller commits it.
struct Framer<'a, K: Sink> {
    sink: &'a mut K,
    markers: Option<MarkerState>,
    crc: Option<&'a mut dyn CrcEngine>,
    source: &'a mut dyn PayloadSource,
    /// Whether the octets written now are covered by the CRC.
    covering: bool,
    written: usize,
}

impl<K: Sink> Framer<'_, K> {
    fn emit(&mut self, b: &[u8]) -> Result<(), LayoutError> {
        self.sink.put_bytes(b)?;
        if self.covering {
            if let Some(c) = self.crc.as_deref_mut() {
                c.update(b);
            }
        }
        self.written = self.written.saturating_add(b.len());
        Ok(())
    }

    fn flush_marker(&mut self) -> Result<(), LayoutError> {
        if let Some(m) = self.markers.as_mut() {
            if m.marker_due() {
                let marker = m.take_marker().map_err(|_| TxError::Internal)?;
                self.emit(&marker)?;
            }
        }
        Ok(())
    }

    /// Framed octets that may pass before the next marker.
    fn room(&self, want: usize) -> usize {
        match self.markers {
            Some(m) => want.min(m.bytes_before_marker() as usize),
            None => want,
        }
    }

    fn step(&mut self, n: usize) -> Result<(), LayoutError> {
        if let Some(m) = self.markers.as_mut() {
            m.advance(n).map_err(|_| TxError::Internal)?;
        }
        Ok(())
    }

    fn bytes(&mut self, mut b: &[u8]) -> Result<(), LayoutError> {
        while !b.is_empty() {
            self.flush_marker()?;
            let n = self.room(b.len());
            let (Some(head), Some(tail)) = (b.get(..n), b.get(n..)) else {
                return Err(TxError::Internal.into());
            };
            self.emit(head)?;
            self.step(n)?;
            b = tail;
        }
        Ok(())
    }

    fn payload(&mut self, mut offset: u32, mut len: u32) -> Result<(), LayoutError> {
        while len > 0 {
            self.flush_marker()?;
            // room() <= len, which is a u32.
            let n = u32::try_from(self.room(len as usize)).unwrap_or(len);
            self.sink.put_payload(offset, n)?;
            if self.covering {
                if let Some(c) = self.crc.as_deref_mut() {
                    self.source.update_crc(offset, n, c)?;
                }
            }
            self.written = self.written.saturating_add(n as usize);
            self.step(n as usize)?;
            offset = offset.wrapping_add(n);
            len -= n;
        }
        Ok(())
    }

    /// Lays out one FPDU; returns its wire length.
    fn fpdu(&mut self, seg: &Segment, fixed: &[u8]) -> Result<usize, LayoutError> {
        let hdr_len = seg.header.header_len();
        let head_len = ULPDU_LENGTH_LEN + hdr_len + fixed.len();
        let ulen = hdr_len
            .checked_add(fixed.len())
            .and_then(|n| n.checked_add(seg.len as usize))
            .and_then(|n| u16::try_from(n).ok())
            .ok_or(TxError::Internal)?;
        let expected = match self.markers {
            Some(m) => m.fpdu_wire_len(ulen),
            None => mpa::fpdu_len(ulen),
        };
        let mut head = [0u8; HEAD_LEN];
        mpa::write_ulpdu_length(&mut head, ulen).map_err(|_| TxError::Internal)?;
        let hdr_out = head.get_mut(ULPDU_LENGTH_LEN..).ok_or(TxError::Internal)?;
        seg.header.emit(hdr_out).map_err(|_| TxError::Internal)?;
        let fixed_out = head
            .get_mut(ULPDU_LENGTH_LEN + hdr_len..head_len)
            .filter(|o| o.len() == fixed.len())
            .ok_or(TxError::Internal)?;
        copy_octets(fixed_out, fixed);
        let start = self.written;
        if let Some(m) = self.markers.as_mut() {
            m.begin_fpdu();
        }
        if let Some(c) = self.crc.as_deref_mut() {
            c.reset();
        }
        self.covering = true;
        self.bytes(head.get(..head_len).ok_or(TxError::Internal)?)?;
        self.payload(seg.offset, seg.len)?;
        let pad = [0u8; 3];
        self.bytes(pad.get(..mpa::pad_len(usize::from(ulen))).unwrap_or(&[]))?;
        // A marker due right before the CRC field is covered by the CRC.
        self.flush_marker()?;
        let trailer = mpa::crc_trailer(self.crc.as_deref().map(|c| c.finish()));
        self.covering = false;
        self.bytes(&trailer)?;
        let len = self.written.saturating_sub(start);
        if len != expected {
            return Err(TxError::Internal.into());
        }
        Ok(len)
    }
}

// ---------------------------------------------------------------------------
// Transmitter
// ---------------------------------------------------------------------------

/// The negotiated parameters of one transmit direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxConfig {
    /// Compute CRCs (else the CRC field is sent as zero).
    pub crc: bool,
    /// Insert MPA markers (the peer asked for them).
    pub markers: bool,
    /// Marker stream position of the next FPDU (0 for a new connection:
    /// the first FPDU starts the marker stream).
    pub stream_start: u32,
    /// Largest ULPDU (DDP segment, header included) per FPDU: from
    /// `mpa::mulpdu` for one MSS, or larger when the peer accepts FPDUs
    /// spanning several segments (GSO). Clamped to [`MAX_MARKED_MULPDU`]
    /// with markers.
    pub mulpdu: u16,
    /// The RFC 7306 extensions the connection enabled.
    pub extensions: Extensions,
}

impl TxConfig {
    /// The configuration for the outcome of the MPA handshake.
    pub const fn from_negotiated(n: &Negotiated, mulpdu: u16, extensions: Extensions) -> Self {
        TxConfig {
            crc: n.crc,
            markers: n.markers_tx,
            stream_start: 0,
            mulpdu,
            extensions,
        }
    }
}

/// How a [`Transmitter::plan`] call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanStatus {
    /// Every FPDU of the message is planned.
    MessageDone,
    /// The next FPDU would exceed the byte budget.
    Budget,
    /// The next FPDU does not fit the batch's pieces or scratch area.
    BatchFull,
}

/// The result of a [`Transmitter::plan`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    /// FPDUs added to the batch.
    pub fpdus: usize,
    /// Wire octets added to the batch.
    pub bytes: usize,
    /// Why planning stopped.
    pub status: PlanStatus,
}

/// One message being segmented: the cursor [`Transmitter::plan`] advances.
#[derive(Clone, Debug)]
pub struct MessageTx {
    opcode: Opcode,
    msn: Option<u32>,
    segments: Segmenter,
    fixed: [u8; MAX_FIXED_PAYLOAD],
    fixed_len: usize,
    payload_len: u32,
    /// Payload octets per full segment.
    chunk: u32,
    /// Payload octets planned so far.
    planned: u32,
    /// The last segment is planned.
    done: bool,
}

impl MessageTx {
    /// The message's opcode.
    pub const fn opcode(&self) -> Opcode {
        self.opcode
    }

    /// The MSN assigned to an untagged message (`None` when tagged).
    pub const fn msn(&self) -> Option<u32> {
        self.msn
    }

    /// Length of the caller-supplied payload.
    pub const fn payload_len(&self) -> u32 {
        self.payload_len
    }

    /// Payload octets already planned.
    pub const fn planned_len(&self) -> u32 {
        self.planned
    }

    /// FPDUs not yet planned.
    pub fn remaining_fpdus(&self) -> usize {
        // Not `Segmenter::remaining`: its division has a panic path the
        // kernel's objtool does not recognise as noreturn.
        if self.done {
            return 0;
        }
        let left = self.payload_len.saturating_sub(self.planned);
        if left == 0 {
            return 1;
        }
        let q = left.checked_div(self.chunk).unwrap_or(0);
        let r = left.checked_rem(self.chunk).unwrap_or(0);
        usize::try_from(q.saturating_add(u32::from(r != 0))).unwrap_or(usize::MAX)
    }

    /// Whether every FPDU is planned.
    pub const fn is_done(&self) -> bool {
        self.done
    }

    fn commit(&mut self, seg: &Segment, rest: Segmenter) {
        self.segments = rest;
        self.planned = seg.offset.saturating_add(seg.len);
        self.done = seg.header.last;
    }

    /// The fixed-format payload carried after the header (empty for ULP
    /// data messages).
    pub fn fixed_payload(&self) -> &[u8] {
        self.fixed.get(..self.fixed_len).unwrap_or(&[])
    }
}

/// The transmit side of one connection direction: negotiated parameters,
/// marker stream position and the MSN of every untagged queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmitter {
    crc: bool,
    markers: Option<MarkerState>,
    pos: u32,
    mulpdu: u16,
    extensions: Extensions,
    msn: [u32; QUEUE_COUNT],
}

impl Transmitter {
    /// A transmitter for a new direction: every queue's next MSN is 1.
    pub fn new(config: TxConfig) -> Self {
        let mut t = Transmitter {
            crc: config.crc,
            markers: if config.markers {
                Some(MarkerState::at(config.stream_start))
            } else {
                None
            },
            pos: config.stream_start,
            mulpdu: 0,
            extensions: config.extensions,
            msn: [INITIAL_MSN; QUEUE_COUNT],
        };
        t.set_mulpdu(config.mulpdu);
        t
    }

    /// Changes MULPDU (e.g. after a path MTU change); messages already
    /// started keep the MULPDU they were started with. Clamped to
    /// [`MAX_MARKED_MULPDU`] with markers.
    pub fn set_mulpdu(&mut self, mulpdu: u16) {
        self.mulpdu = if self.markers.is_some() {
            mulpdu.min(MAX_MARKED_MULPDU)
        } else {
            mulpdu
        };
    }

    /// The MULPDU in use (after clamping).
    pub const fn mulpdu(&self) -> u16 {
        self.mulpdu
    }

    /// Whether CRCs are computed.
    pub const fn crc_enabled(&self) -> bool {
        self.crc
    }

    /// Whether markers are inserted.
    pub const fn markers_enabled(&self) -> bool {
        self.markers.is_some()
    }

    /// The RFC 7306 extensions enabled.
    pub const fn extensions(&self) -> Extensions {
        self.extensions
    }

    /// Stream position (modulo 2^32, from [`TxConfig::stream_start`]) of the
    /// next octet to be planned.
    pub const fn stream_pos(&self) -> u32 {
        self.pos
    }

    /// The marker state (markers on only).
    pub const fn marker_state(&self) -> Option<MarkerState> {
        self.markers
    }

    /// The MSN the next message on untagged queue `qn` gets.
    pub fn next_msn(&self, qn: u32) -> Option<u32> {
        self.msn.get(usize::try_from(qn).ok()?).copied()
    }

    fn queue_index(op: Opcode) -> Option<usize> {
        op.queue_number().and_then(|qn| usize::try_from(qn).ok())
    }

    /// Validates `msg` and builds its cursor without consuming its MSN.
    fn prepare(&self, msg: &Message) -> Result<MessageTx, TxError> {
        let op = msg.opcode();
        if !self.extensions.allows(op) {
            return Err(TxError::ExtensionDisabled(op));
        }
        let msn = match Self::queue_index(op) {
            Some(i) => Some(*self.msn.get(i).ok_or(TxError::Internal)?),
            None => None,
        };
        let target = msg.target(msn.unwrap_or(0));
        let mut fixed = [0u8; MAX_FIXED_PAYLOAD];
        let fixed_len = msg.emit_fixed(&mut fixed)?;
        let header_len = if op.is_tagged() {
            super::ddp::TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        };
        let needed = match op.payload() {
            PayloadKind::Ulp => header_len.saturating_add(1),
            PayloadKind::Fixed(_) | PayloadKind::Terminate => header_len.saturating_add(fixed_len),
        };
        if usize::from(self.mulpdu) < needed {
            return Err(TxError::MulpduTooSmall {
                mulpdu: self.mulpdu,
                needed,
            });
        }
        let payload_len = msg.payload_len();
        let segments = Segmenter::new(op.value(), target, payload_len, u32::from(self.mulpdu))
            .map_err(|e| match e {
                SegmentError::MulpduTooSmall { .. } => TxError::MulpduTooSmall {
                    mulpdu: self.mulpdu,
                    needed,
                },
                SegmentError::ToWrap => TxError::ToWrap,
                SegmentError::OpcodeRange(_) => TxError::Internal,
            })?;
        Ok(MessageTx {
            opcode: op,
            msn,
            chunk: segments.max_payload(),
            segments,
            fixed,
            fixed_len,
            payload_len,
            planned: 0,
            done: false,
        })
    }

    /// Consumes the MSN of `op`'s untagged queue (none for a tagged op).
    fn next_msn_of(&mut self, op: Opcode) {
        if let Some(slot) = Self::queue_index(op).and_then(|i| self.msn.get_mut(i)) {
            *slot = slot.wrapping_add(1);
        }
    }

    /// Starts a message: checks it (extension enabled, MULPDU large enough,
    /// Terminate consistent, no TO wrap) and assigns the next MSN of its
    /// queue. From here on the message must be sent: plan it to the end
    /// with [`plan`](Self::plan) before starting the next one (messages are
    /// not interleaved on the wire).
    pub fn start(&mut self, msg: &Message) -> Result<MessageTx, TxError> {
        let m = self.prepare(msg)?;
        self.next_msn_of(m.opcode);
        Ok(m)
    }

    fn commit_pos(&mut self, markers: Option<MarkerState>, bytes: usize) {
        if self.markers.is_some() {
            self.markers = markers;
        }
        // Stream positions are modulo 2^32.
        self.pos = self.pos.wrapping_add(bytes as u32);
    }

    /// Appends whole FPDUs of `msg` to `batch` until the message is done,
    /// the next FPDU would take the batch's pending octets beyond `budget`,
    /// or the batch is full. An FPDU is always planned into a batch with
    /// nothing pending, whatever the budget, so every call makes progress.
    /// A batch whose octets were all sent is cleared first.
    ///
    /// Payload pieces carry `tag`, the caller's name for this message's
    /// payload (e.g. its work request slot). With CRC on, `payload` is
    /// asked for the payload octets of each FPDU, in wire order; `crc` is
    /// the engine (ignored with CRC off).
    ///
    /// Errors: [`TxError::BatchTooSmall`] when not even one FPDU fits the
    /// empty batch, a [`PayloadSource`] error. FPDUs planned by this call
    /// before an error stay in the batch (the connection is then beyond
    /// repair anyway); the failing FPDU leaves no trace.
    pub fn plan<const P: usize, const S: usize>(
        &mut self,
        batch: &mut Batch<P, S>,
        msg: &mut MessageTx,
        tag: u32,
        payload: &mut dyn PayloadSource,
        crc: &mut dyn CrcEngine,
        budget: usize,
    ) -> Result<Planned, TxError> {
        if batch.is_done() {
            batch.clear();
        }
        let mut planned = Planned {
            fpdus: 0,
            bytes: 0,
            status: PlanStatus::MessageDone,
        };
        loop {
            let mut rest = msg.segments.clone();
            let Some(seg) = rest.next() else {
                planned.status = PlanStatus::MessageDone;
                return Ok(planned);
            };
            let pending = batch.pending_len();
            if pending > 0 {
                let wire = self.segment_wire_len(&seg, msg.fixed_len)?;
                if pending.saturating_add(wire) > budget {
                    planned.status = PlanStatus::Budget;
                    return Ok(planned);
                }
            }
            let snap = batch.snapshot();
            let mut sink = BatchSink {
                batch: &mut *batch,
                tag,
            };
            let mut f = Framer {
                sink: &mut sink,
                markers: self.markers,
                crc: if self.crc { Some(&mut *crc) } else { None },
                source: &mut *payload,
                covering: false,
                written: 0,
            };
            let result = f.fpdu(&seg, msg.fixed_payload());
            let markers = f.markers;
            match result {
                Ok(n) => {
                    self.commit_pos(markers, n);
                    msg.commit(&seg, rest);
                    batch.total = batch.total.saturating_add(n);
                    batch.fpdus = batch.fpdus.saturating_add(1);
                    planned.fpdus = planned.fpdus.saturating_add(1);
                    planned.bytes = planned.bytes.saturating_add(n);
                }
                Err(LayoutError::Full) => {
                    batch.restore(snap);
                    if batch.pending_len() == 0 {
                        return Err(TxError::BatchTooSmall);
                    }
                    planned.status = PlanStatus::BatchFull;
                    return Ok(planned);
                }
                Err(LayoutError::Tx(e)) => {
                    batch.restore(snap);
                    return Err(e);
                }
            }
        }
    }

    /// Wire length of the FPDU carrying `seg` if it started now.
    fn segment_wire_len(&self, seg: &Segment, fixed_len: usize) -> Result<usize, TxError> {
        let ulen = seg
            .header
            .header_len()
            .checked_add(fixed_len)
            .and_then(|n| n.checked_add(seg.len as usize))
            .and_then(|n| u16::try_from(n).ok())
            .ok_or(TxError::Internal)?;
        Ok(mpa::fpdu_wire_len(ulen, self.markers.as_ref()))
    }

    /// Wire length of `msg` if it were emitted now (markers depend on the
    /// current stream position). Sums FPDU by FPDU.
    pub fn message_wire_len(&self, msg: &Message) -> Result<usize, TxError> {
        let m = self.prepare(msg)?;
        let mut markers = self.markers;
        let mut total = 0usize;
        for seg in m.segments.clone() {
            let ulen = seg
                .header
                .header_len()
                .checked_add(m.fixed_len)
                .and_then(|n| n.checked_add(seg.len as usize))
                .and_then(|n| u16::try_from(n).ok())
                .ok_or(TxError::Internal)?;
            let wire = mpa::fpdu_wire_len(ulen, markers.as_ref());
            if let Some(ms) = markers.as_mut() {
                *ms = MarkerState::at(ms.stream_pos().wrapping_add(wire as u32));
            }
            total = total.checked_add(wire).ok_or(TxError::Internal)?;
        }
        Ok(total)
    }

    /// [`emit_message`](Self::emit_message) for a message of ULP payload
    /// that fits one FPDU, without markers (every small Send and Write):
    /// validated as [`prepare`](Self::prepare) does, written in place
    /// without a message cursor or the framer's per-piece steps. `None`
    /// for any other message, and for a payload whose length is not the
    /// message's: the general path handles (or refuses) those.
    fn emit_single(
        &mut self,
        msg: &Message,
        payload: &[u8],
        crc: &mut dyn CrcEngine,
        out: &mut [u8],
    ) -> Option<Result<usize, TxError>> {
        let op = msg.opcode();
        if self.markers.is_some()
            || op.payload() != PayloadKind::Ulp
            || usize::try_from(msg.payload_len()).ok() != Some(payload.len())
        {
            return None;
        }
        if !self.extensions.allows(op) {
            // Refused: the general path's error.
            return None;
        }
        let msn = match Self::queue_index(op) {
            Some(i) => *self.msn.get(i)?,
            None => 0,
        };
        let target = msg.target(msn);
        if let BufferFields::Tagged(t) = target {
            // A TO that would wrap: the general path's error.
            t.to.checked_add(u64::from(msg.payload_len()))?;
        }
        let header = DdpHeader {
            last: true,
            opcode: op.value(),
            buffer: target,
        };
        if usize::from(self.mulpdu) < header.header_len().saturating_add(payload.len().max(1)) {
            // More than one segment (or a MULPDU too small): the general
            // path.
            return None;
        }
        let r = Self::write_single(self.crc, &header, payload, crc, out);
        if let Ok(n) = r {
            self.next_msn_of(op);
            self.commit_pos(None, n);
        }
        Some(r)
    }

    /// Writes one FPDU without markers carrying `header` and all of
    /// `payload` into the start of `out`; returns its wire length.
    fn write_single(
        crc_on: bool,
        header: &DdpHeader,
        payload: &[u8],
        crc: &mut dyn CrcEngine,
        out: &mut [u8],
    ) -> Result<usize, TxError> {
        let head_len = ULPDU_LENGTH_LEN + header.header_len();
        let ulen = u16::try_from(head_len - ULPDU_LENGTH_LEN + payload.len())
            .map_err(|_| TxError::Internal)?;
        let wire = mpa::fpdu_len(ulen);
        let Some(out) = out.get_mut(..wire) else {
            return Err(TxError::BufferTooSmall { needed: wire });
        };
        let (covered, trailer) = out
            .split_at_mut_checked(wire - CRC_LEN)
            .ok_or(TxError::Internal)?;
        let (head, rest) = covered
            .split_at_mut_checked(head_len)
            .ok_or(TxError::Internal)?;
        let (data, pad) = rest
            .split_at_mut_checked(payload.len())
            .ok_or(TxError::Internal)?;
        mpa::write_ulpdu_length(head, ulen).map_err(|_| TxError::Internal)?;
        let hdr = head.get_mut(ULPDU_LENGTH_LEN..).ok_or(TxError::Internal)?;
        header.emit(hdr).map_err(|_| TxError::Internal)?;
        data.copy_from_slice(payload);
        pad.fill(0);
        let sum = if crc_on {
            crc.reset();
            crc.update(covered);
            Some(crc.finish())
        } else {
            None
        };
        trailer.copy_from_slice(&mpa::crc_trailer(sum));
        Ok(wire)
    }

    /// Emits the whole message `msg` with `payload` (exactly its
    /// [`payload_len`](Message::payload_len) octets) into the start of
    /// `out` and returns the wire length. Assigns the MSN and advances the
    /// stream only on success; on error `out` may hold garbage.
    pub fn emit_message(
        &mut self,
        msg: &Message,
        payload: &[u8],
        crc: &mut dyn CrcEngine,
        out: &mut [u8],
    ) -> Result<usize, TxError> {
        if let Some(r) = self.emit_single(msg, payload, crc, out) {
            return r;
        }
        let mut m = self.prepare(msg)?;
        let expected = msg.payload_len();
        if usize::try_from(expected).ok() != Some(payload.len()) {
            return Err(TxError::PayloadLength {
                expected,
                actual: payload.len(),
            });
        }
        let mut sink = BufSink {
            out,
            off: 0,
            payload,
        };
        let mut source = Contiguous(payload);
        let mut markers = self.markers;
        let fixed_len = m.fixed_len;
        let fixed = m.fixed;
        let fixed = fixed.get(..fixed_len).unwrap_or(&[]);
        for seg in m.segments.by_ref() {
            let mut f = Framer {
                sink: &mut sink,
                markers,
                crc: if self.crc { Some(&mut *crc) } else { None },
                source: &mut source,
                covering: false,
                written: 0,
            };
            match f.fpdu(&seg, fixed) {
                Ok(_) => markers = f.markers,
                Err(LayoutError::Full) => {
                    return Err(TxError::BufferTooSmall {
                        needed: self.message_wire_len(msg)?,
                    })
                }
                Err(LayoutError::Tx(e)) => return Err(e),
            }
        }
        let n = sink.off;
        self.next_msn_of(m.opcode);
        self.commit_pos(markers, n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::super::crc32c::{crc32c, SoftCrc32c};
    use super::super::ddp::{DdpHeader, TAGGED_HEADER_LEN};
    use super::super::mpa::{parse_fpdu, parse_fpdu_with_markers, MARKER_LEN};
    use super::super::rdmap::{AtomicOp, QN_TERMINATE};
    use super::super::terminate::{MpaCode, TermCode, UntaggedCode};
    use super::*;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    fn config(crc: bool, markers: bool, stream_start: u32, mulpdu: u16) -> TxConfig {
        TxConfig {
            crc,
            markers,
            stream_start,
            mulpdu,
            extensions: Extensions::ALL,
        }
    }

    /// Frames a ULPDU by hand (no markers): ULPDU_Length, ULPDU, zero PAD,
    /// CRC over everything before it (or zeros).
    fn frame(ulpdu: &[u8], crc: bool) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(ulpdu.len() as u16).to_be_bytes());
        v.extend_from_slice(ulpdu);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        let c = if crc { crc32c(&v) } else { 0 };
        v.extend_from_slice(&c.to_le_bytes());
        v
    }

    /// Resolves a batch's pending chunks against the messages' payloads.
    fn pending_bytes<const P: usize, const S: usize>(
        batch: &Batch<P, S>,
        payloads: &[&[u8]],
    ) -> Vec<u8> {
        let mut v = Vec::new();
        for c in batch.chunks() {
            match c {
                Chunk::Bytes(b) => v.extend_from_slice(b),
                Chunk::Payload { tag, offset, len } => {
                    let p = payloads[tag as usize];
                    v.extend_from_slice(&p[offset as usize..(offset + len) as usize]);
                }
            }
        }
        v
    }

    /// Sends up to `n` pending octets of `batch` into `out`.
    fn send_some<const P: usize, const S: usize>(
        batch: &mut Batch<P, S>,
        n: usize,
        payloads: &[&[u8]],
        out: &mut Vec<u8>,
    ) -> usize {
        let n = n.min(batch.pending_len());
        let bytes = pending_bytes(batch, payloads);
        assert_eq!(bytes.len(), batch.pending_len());
        out.extend_from_slice(&bytes[..n]);
        batch.advance(n).unwrap();
        n
    }

    /// Plans one whole message into a fresh big batch and returns its
    /// pieces resolved (the batch is left in place for inspection).
    fn plan_one(tx: &mut Transmitter, msg: &Message, payload: &[u8]) -> (Vec<u8>, Vec<Piece>) {
        let mut batch: Batch<512, 4096> = Batch::new();
        let mut m = tx.start(msg).unwrap();
        let r = tx
            .plan(
                &mut batch,
                &mut m,
                0,
                &mut Contiguous(payload),
                &mut SoftCrc32c::new(),
                usize::MAX,
            )
            .unwrap();
        assert_eq!(r.status, PlanStatus::MessageDone);
        assert!(m.is_done());
        assert_eq!(r.bytes, batch.len());
        (pending_bytes(&batch, &[payload]), batch.pieces().to_vec())
    }

    fn untagged_hdr(op: u8, rsvd: [u8; 4], qn: u8, msn: u8) -> Vec<u8> {
        let mut v = vec![0x41, 0x40 | op];
        v.extend_from_slice(&rsvd);
        v.extend_from_slice(&[0, 0, 0, qn, 0, 0, 0, msn, 0, 0, 0, 0]);
        v
    }

    fn read_request() -> ReadRequest {
        ReadRequest {
            sink_stag: 0x0102_0304,
            sink_to: 0x1122_3344_5566_7788,
            read_size: 0x1000,
            source_stag: 0x0a0b_0c0d,
            source_to: 0x99,
        }
    }

    fn atomic_request() -> AtomicRequest {
        AtomicRequest {
            op: AtomicOp::CmpSwap,
            request_id: 0x1111_1111,
            remote_stag: 0x2222_2222,
            remote_to: 0x3333_3333_3333_3338,
            add_or_swap_data: 0x4444_4444_4444_4444,
            add_or_swap_mask: 0x5555_5555_5555_5555,
            compare_data: 0x6666_6666_6666_6666,
            compare_mask: 0x7777_7777_7777_7777,
        }
    }

    /// (message, payload, ULPDU written out from the RFC layouts) for one
    /// FPDU of every opcode, first message on its queue.
    fn vectors() -> Vec<(Message, Vec<u8>, Vec<u8>)> {
        let mut v = Vec::new();
        // Send "abc": untagged, L, op 3, QN 0, MSN 1, MO 0.
        let mut u = untagged_hdr(3, [0; 4], 0, 1);
        u.extend_from_slice(b"abc");
        v.push((Message::Send { len: 3 }, b"abc".to_vec(), u));
        // Send with Invalidate: the STag in RsvdULP.
        let mut u = untagged_hdr(4, [0x12, 0x34, 0x56, 0x78], 0, 1);
        u.extend_from_slice(&[0xaa, 0xbb]);
        v.push((
            Message::SendInvalidate {
                len: 2,
                stag: 0x1234_5678,
            },
            vec![0xaa, 0xbb],
            u,
        ));
        // Send with SE, empty.
        v.push((
            Message::SendSe { len: 0 },
            vec![],
            untagged_hdr(5, [0; 4], 0, 1),
        ));
        // Send with SE and Invalidate.
        let mut u = untagged_hdr(6, [0xde, 0xad, 0xbe, 0xef], 0, 1);
        u.push(0x5a);
        v.push((
            Message::SendSeInvalidate {
                len: 1,
                stag: 0xdead_beef,
            },
            vec![0x5a],
            u,
        ));
        // RDMA Write: tagged, L, op 0, STag, TO.
        let mut u = vec![
            0xc1, 0x40, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 0, 0, 0, 0x10, 0x00,
        ];
        u.extend_from_slice(&[1, 2, 3, 4]);
        v.push((
            Message::RdmaWrite {
                len: 4,
                stag: 0xaabb_ccdd,
                to: 0x1000,
            },
            vec![1, 2, 3, 4],
            u,
        ));
        // RDMA Read Request: QN 1, the 28-octet header as payload.
        let mut u = untagged_hdr(1, [0; 4], 1, 1);
        u.extend_from_slice(&[
            1, 2, 3, 4, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0, 0, 0x10, 0, 0x0a, 0x0b,
            0x0c, 0x0d, 0, 0, 0, 0, 0, 0, 0, 0x99,
        ]);
        v.push((Message::ReadRequest(read_request()), vec![], u));
        // RDMA Read Response: tagged, op 2.
        let mut u = vec![
            0xc1, 0x42, 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf0,
        ];
        u.extend_from_slice(&[9, 8, 7, 6, 5]);
        v.push((
            Message::ReadResponse {
                len: 5,
                stag: 0x100,
                to: 0xffff_ffff_ffff_fff0,
            },
            vec![9, 8, 7, 6, 5],
            u,
        ));
        // Terminate: QN 2, layer 2 (LLP) type 0 (MPA) code 2 (CRC error).
        let mut u = untagged_hdr(7, [0; 4], 2, 1);
        u.extend_from_slice(&[0x20, 0x02, 0, 0]);
        v.push((
            Message::Terminate(TerminateRepr::new(TermCode::Mpa(MpaCode::CrcError))),
            vec![],
            u,
        ));
        // Immediate Data and Immediate Data with SE: QN 0.
        for (op, se) in [(8u8, false), (9, true)] {
            let mut u = untagged_hdr(op, [0; 4], 0, 1);
            u.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
            v.push((
                Message::ImmediateData {
                    data: ImmediateData {
                        data: [1, 2, 3, 4, 5, 6, 7, 8],
                    },
                    solicited: se,
                },
                vec![],
                u,
            ));
        }
        // Atomic Request: QN 1, 52 octets.
        let mut u = untagged_hdr(0xa, [0; 4], 1, 1);
        u.extend_from_slice(&[0, 0, 0, 2]);
        u.extend_from_slice(&[0x11; 4]);
        u.extend_from_slice(&[0x22; 4]);
        u.extend_from_slice(&[0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x38]);
        for b in [0x44, 0x55, 0x66, 0x77] {
            u.extend_from_slice(&[b; 8]);
        }
        v.push((Message::AtomicRequest(atomic_request()), vec![], u));
        // Atomic Response: QN 3, 12 octets.
        let mut u = untagged_hdr(0xb, [0; 4], 3, 1);
        u.extend_from_slice(&[0x11, 0x11, 0x11, 0x11, 1, 2, 3, 4, 5, 6, 7, 8]);
        v.push((
            Message::AtomicResponse(AtomicResponse {
                request_id: 0x1111_1111,
                original_value: 0x0102_0304_0506_0708,
            }),
            vec![],
            u,
        ));
        v
    }

    #[test]
    fn every_opcode_one_fpdu_vectors() {
        let vs = vectors();
        assert_eq!(vs.len(), 12);
        let mut seen = Vec::new();
        for (msg, payload, ulpdu) in &vs {
            seen.push(msg.opcode());
            for crc in [false, true] {
                let want = frame(ulpdu, crc);
                // Contiguous emit.
                let mut tx = Transmitter::new(config(crc, false, 0, 1000));
                let mut out = [0u8; 200];
                let n = tx
                    .emit_message(msg, payload, &mut SoftCrc32c::new(), &mut out)
                    .unwrap();
                assert_eq!(&out[..n], &want[..], "{:?} crc {crc}", msg.opcode());
                assert_eq!(tx.stream_pos(), n as u32);
                // Planned pieces.
                let mut tx = Transmitter::new(config(crc, false, 0, 1000));
                let (bytes, pieces) = plan_one(&mut tx, msg, payload);
                assert_eq!(bytes, want, "{:?} crc {crc}", msg.opcode());
                let hdr = 2 + ulpdu.len() - payload.len();
                if payload.is_empty() {
                    assert_eq!(pieces.len(), 1);
                } else {
                    assert_eq!(
                        pieces,
                        vec![
                            Piece::Bytes {
                                start: 0,
                                len: hdr as u32
                            },
                            Piece::Payload {
                                tag: 0,
                                offset: 0,
                                len: payload.len() as u32
                            },
                            Piece::Bytes {
                                start: hdr as u32,
                                len: (want.len() - hdr - payload.len()) as u32
                            },
                        ]
                    );
                }
            }
        }
        seen.sort_by_key(|o| o.value());
        assert_eq!(seen, Opcode::ALL.to_vec());
    }

    #[test]
    fn pinned_crc_values() {
        // CRC32c values computed independently (bitwise, outside this
        // crate) over the hand-framed octets.
        let vs = vectors();
        let send = frame(&vs[0].2, true);
        assert_eq!(send.len(), 28);
        assert_eq!(&send[24..], &[0x44, 0x70, 0x65, 0xaa]);
        let rr = frame(&vs[5].2, true);
        assert_eq!(rr.len(), 52);
        assert_eq!(&rr[48..], &[0x80, 0xff, 0xa9, 0xc1]);
        let mut tx = Transmitter::new(config(true, false, 0, 1000));
        let mut out = [0u8; 64];
        let n = tx
            .emit_message(&vs[0].0, &vs[0].1, &mut SoftCrc32c::new(), &mut out)
            .unwrap();
        assert_eq!(&out[..n], &send[..]);
    }

    #[test]
    fn marker_at_fpdu_start_vector() {
        // Stream offset 0: the marker (FPDUPTR 0) precedes ULPDU_Length and
        // is covered by the CRC.
        let vs = vectors();
        let (msg, payload, ulpdu) = &vs[0];
        for crc in [false, true] {
            let mut want = vec![0, 0, 0, 0];
            want.extend_from_slice(&frame(ulpdu, false)[..24]);
            let c = if crc { crc32c(&want) } else { 0 };
            want.extend_from_slice(&c.to_le_bytes());
            if crc {
                assert_eq!(&want[28..], &[0xc3, 0x5b, 0x57, 0xd9]);
            }
            let mut tx = Transmitter::new(config(crc, true, 0, 1000));
            let (bytes, pieces) = plan_one(&mut tx, msg, payload);
            assert_eq!(bytes, want);
            assert_eq!(pieces[0], Piece::Bytes { start: 0, len: 24 });
            assert_eq!(tx.stream_pos(), 32);
            // The same at a later multiple of 512, via the contiguous path.
            let mut tx = Transmitter::new(config(crc, true, 1024, 1000));
            let mut out = [0u8; 64];
            let n = tx
                .emit_message(msg, payload, &mut SoftCrc32c::new(), &mut out)
                .unwrap();
            assert_eq!(&out[..n], &want[..]);
        }
    }

    #[test]
    fn fpdu_straddling_a_marker_vector() {
        // RDMA Write of 20 octets starting at stream offset 480: 32 framed
        // octets (ULPDU_Length, header, 16 payload octets), the marker at
        // 512 with FPDUPTR 32, the other 4 payload octets, the CRC.
        let payload: Vec<u8> = (1..=20).collect();
        let msg = Message::RdmaWrite {
            len: 20,
            stag: 0xaabb_ccdd,
            to: 0x1000,
        };
        let mut want = vec![
            0x00, 0x22, 0xc1, 0x40, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 0, 0, 0, 0x10, 0x00,
        ];
        want.extend_from_slice(&payload[..16]);
        want.extend_from_slice(&[0, 0, 0, 32]);
        want.extend_from_slice(&payload[16..]);
        assert_eq!(want.len(), 40);
        for crc in [false, true] {
            let mut w = want.clone();
            w.extend_from_slice(&if crc {
                [0x80, 0x5c, 0x3a, 0x4f]
            } else {
                [0; 4]
            });
            let mut tx = Transmitter::new(config(crc, true, 480, 1000));
            let (bytes, pieces) = plan_one(&mut tx, &msg, &payload);
            assert_eq!(bytes, w, "crc {crc}");
            assert_eq!(
                pieces,
                vec![
                    Piece::Bytes { start: 0, len: 16 },
                    Piece::Payload {
                        tag: 0,
                        offset: 0,
                        len: 16
                    },
                    Piece::Bytes { start: 16, len: 4 },
                    Piece::Payload {
                        tag: 0,
                        offset: 16,
                        len: 4
                    },
                    Piece::Bytes { start: 20, len: 4 },
                ]
            );
            assert_eq!(tx.stream_pos(), 524);
            // mpa.rs parses it back.
            let mut rx = MarkerState::at(480);
            let mut buf = [0u8; 64];
            let mut engine = SoftCrc32c::new();
            let e: Option<&mut dyn CrcEngine> = if crc { Some(&mut engine) } else { None };
            let got = parse_fpdu_with_markers(&bytes, &mut rx, e, &mut buf).unwrap();
            assert_eq!(got.ulpdu_len, 34);
            assert_eq!(&buf[TAGGED_HEADER_LEN..34], &payload[..]);
        }
    }

    #[test]
    fn marker_inside_crc_field_is_not_covered() {
        // Send of 2 octets at offset 486: 24 framed octets before the CRC
        // field end at 510, so the marker at 512 (FPDUPTR 26) splits the CRC
        // field after two octets. The CRC covers the 24 octets only (mpa.rs's
        // rule). Only a stream that does not start 4-aligned can do this.
        let msg = Message::Send { len: 2 };
        let payload = [0x11, 0x22];
        let mut tx = Transmitter::new(config(true, true, 486, 1000));
        let (bytes, _) = plan_one(&mut tx, &msg, &payload);
        assert_eq!(bytes.len(), 32);
        let c = crc32c(&bytes[..24]).to_le_bytes();
        assert_eq!(&bytes[24..26], &c[..2]);
        assert_eq!(&bytes[26..30], &[0, 0, 0, 26]);
        assert_eq!(&bytes[30..], &c[2..]);
        let mut rx = MarkerState::at(486);
        let mut buf = [0u8; 32];
        let mut engine = SoftCrc32c::new();
        parse_fpdu_with_markers(&bytes, &mut rx, Some(&mut engine), &mut buf).unwrap();
        // A marker right before the CRC field (payload ends at 512) is
        // covered: Send of 4 octets at 488 has 24 framed octets + CRC.
        let mut tx = Transmitter::new(config(true, true, 488, 1000));
        let (bytes, _) = plan_one(&mut tx, &Message::Send { len: 4 }, &[1, 2, 3, 4]);
        assert_eq!(&bytes[24..28], &[0, 0, 0, 24]);
        assert_eq!(&bytes[28..], &crc32c(&bytes[..28]).to_le_bytes());
    }

    #[test]
    fn fpdu_ending_on_marker_boundary_leaves_marker_to_next() {
        // First FPDU ends exactly at 512; the marker belongs to the next one.
        let mut tx = Transmitter::new(config(false, true, 484, 1000));
        let mut out = [0u8; 128];
        let n = tx
            .emit_message(
                &Message::Send { len: 4 },
                &[7; 4],
                &mut SoftCrc32c::new(),
                &mut out,
            )
            .unwrap();
        assert_eq!(n, 28);
        assert_eq!(tx.stream_pos(), 512);
        let n = tx
            .emit_message(
                &Message::Send { len: 0 },
                &[],
                &mut SoftCrc32c::new(),
                &mut out,
            )
            .unwrap();
        assert_eq!(&out[..6], &[0, 0, 0, 0, 0, 18]);
        assert_eq!(n, 4 + 24);
        assert_eq!(tx.next_msn(0), Some(3));
    }

    #[test]
    fn segmentation_at_mulpdu_boundaries() {
        let mulpdu = 100u16;
        for (tagged, hdr) in [(false, 18usize), (true, 14)] {
            let chunk = usize::from(mulpdu) - hdr;
            for len in [
                0,
                1,
                chunk - 1,
                chunk,
                chunk + 1,
                3 * chunk - 1,
                3 * chunk,
                3 * chunk + 1,
            ] {
                let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let msg = if tagged {
                    Message::RdmaWrite {
                        len: len as u32,
                        stag: 5,
                        to: 1 << 40,
                    }
                } else {
                    Message::Send { len: len as u32 }
                };
                let mut tx = Transmitter::new(config(false, false, 0, mulpdu));
                let (bytes, _) = plan_one(&mut tx, &msg, &payload);
                let mut at = 0;
                let mut got = Vec::new();
                let mut count = 0;
                while at < bytes.len() {
                    let f = parse_fpdu(&bytes[at..], None).unwrap();
                    assert!(f.ulpdu.len() <= usize::from(mulpdu));
                    let h = DdpHeader::parse(f.ulpdu).unwrap();
                    let off = got.len();
                    match h.buffer {
                        BufferFields::Tagged(t) => assert_eq!(t.to, (1 << 40) + off as u64),
                        BufferFields::Untagged(u) => assert_eq!(u.mo as usize, off),
                    }
                    got.extend_from_slice(&f.ulpdu[hdr..]);
                    at += f.wire_len;
                    count += 1;
                    assert_eq!(h.last, got.len() == len, "len {len}");
                    if !h.last {
                        assert_eq!(f.ulpdu.len(), usize::from(mulpdu), "full segments");
                    }
                }
                assert_eq!(got, payload);
                assert_eq!(count, len.div_ceil(chunk).max(1), "len {len}");
            }
        }
    }

    /// A mixed list of messages with their payloads.
    fn sample_messages() -> Vec<(Message, Vec<u8>)> {
        let pat = |n: usize, k: u8| (0..n).map(|i| (i as u8).wrapping_mul(k) ^ k).collect();
        vec![
            (Message::Send { len: 1500 }, pat(1500, 3)),
            (Message::ReadRequest(read_request()), vec![]),
            (
                Message::RdmaWrite {
                    len: 3000,
                    stag: 9,
                    to: 4096,
                },
                pat(3000, 5),
            ),
            (
                Message::ImmediateData {
                    data: ImmediateData { data: [9; 8] },
                    solicited: true,
                },
                vec![],
            ),
            (
                Message::SendSeInvalidate {
                    len: 777,
                    stag: 0x77,
                },
                pat(777, 7),
            ),
            (Message::AtomicRequest(atomic_request()), vec![]),
            (
                Message::ReadResponse {
                    len: 1025,
                    stag: 1,
                    to: 0,
                },
                pat(1025, 11),
            ),
            (Message::Send { len: 0 }, vec![]),
            (
                Message::Terminate(TerminateRepr::for_segment(
                    TermCode::DdpUntagged(UntaggedCode::InvalidMo),
                    &[0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0],
                    18,
                )),
                vec![],
            ),
        ]
    }

    /// The whole stream via emit_message, message by message.
    fn emitted(cfg: TxConfig, msgs: &[(Message, Vec<u8>)]) -> Vec<u8> {
        let mut tx = Transmitter::new(cfg);
        let mut out = vec![0u8; 64 * 1024];
        let mut stream = Vec::new();
        for (m, p) in msgs {
            let len = tx.message_wire_len(m).unwrap();
            let n = tx
                .emit_message(m, p, &mut SoftCrc32c::new(), &mut out)
                .unwrap();
            assert_eq!(n, len);
            stream.extend_from_slice(&out[..n]);
        }
        stream
    }

    /// The whole stream via plan into batches of `budget` octets, each
    /// drained in sends of `step` octets.
    fn planned<const P: usize, const S: usize>(
        cfg: TxConfig,
        msgs: &[(Message, Vec<u8>)],
        budget: usize,
        step: usize,
    ) -> (Vec<u8>, usize) {
        let mut tx = Transmitter::new(cfg);
        let payloads: Vec<&[u8]> = msgs.iter().map(|(_, p)| &p[..]).collect();
        let mut batch: Batch<P, S> = Batch::new();
        let mut stream = Vec::new();
        let mut batches = 0;
        let mut crc = SoftCrc32c::new();
        for (i, (m, p)) in msgs.iter().enumerate() {
            let mut mt = tx.start(m).unwrap();
            loop {
                let r = tx
                    .plan(
                        &mut batch,
                        &mut mt,
                        i as u32,
                        &mut Contiguous(p),
                        &mut crc,
                        budget,
                    )
                    .unwrap();
                if r.status == PlanStatus::MessageDone {
                    break;
                }
                batches += 1;
                while !batch.is_done() {
                    send_some(&mut batch, step, &payloads, &mut stream);
                }
            }
        }
        if !batch.is_done() {
            batches += 1;
        }
        while !batch.is_done() {
            send_some(&mut batch, step, &payloads, &mut stream);
        }
        (stream, batches)
    }

    #[test]
    fn plan_equals_contiguous_emit_and_coalescing() {
        let msgs = sample_messages();
        for (crc, markers, start) in [
            (false, false, 0),
            (true, false, 0),
            (false, true, 0),
            (true, true, 300),
            (true, true, u32::MAX - 700),
        ] {
            let cfg = config(crc, markers, start, 1000);
            let want = emitted(cfg, &msgs);
            // One big batch.
            let (all, n) = planned::<1024, 8192>(cfg, &msgs, usize::MAX, usize::MAX);
            assert_eq!(all, want);
            assert_eq!(n, 1);
            // One FPDU per batch (budget 0 plans exactly one).
            let (single, n) = planned::<1024, 8192>(cfg, &msgs, 0, usize::MAX);
            assert_eq!(single, want);
            assert!(n > 10);
            // Socket-sized budgets, small sends.
            let (b, _) = planned::<1024, 8192>(cfg, &msgs, 2900, 700);
            assert_eq!(b, want);
            // A batch whose piece array / scratch limit it to few FPDUs.
            let (s, n) = planned::<12, 200>(cfg, &msgs, usize::MAX, 333);
            assert_eq!(s, want);
            assert!(n >= 2);
        }
    }

    #[test]
    fn budget_bounds_the_batch() {
        let msgs = sample_messages();
        let mut tx = Transmitter::new(config(true, false, 0, 1000));
        let mut batch: Batch<64, 1024> = Batch::new();
        let mut m = tx.start(&msgs[2].0).unwrap(); // 3000-octet Write
        let src = &mut Contiguous(&msgs[2].1);
        let crc = &mut SoftCrc32c::new();
        // 1000-octet ULPDUs: 1008-octet FPDUs.
        let r = tx.plan(&mut batch, &mut m, 0, src, crc, 2500).unwrap();
        assert_eq!((r.fpdus, r.bytes, r.status), (2, 2016, PlanStatus::Budget));
        // The budget is on pending octets: after sending 1500, the third
        // FPDU and the short fourth (42 payload octets) fit.
        batch.advance(1500).unwrap();
        let r = tx.plan(&mut batch, &mut m, 0, src, crc, 2500).unwrap();
        assert_eq!((r.fpdus, r.status), (2, PlanStatus::MessageDone));
        assert_eq!(batch.pending_len(), 516 + 1008 + 64);
        assert_eq!(batch.fpdu_count(), 4);
        assert!(m.is_done());
        let r = tx.plan(&mut batch, &mut m, 0, src, crc, 0).unwrap();
        assert_eq!((r.fpdus, r.status), (0, PlanStatus::MessageDone));
        // A budget below one FPDU still plans one into an empty batch.
        batch.advance(batch.pending_len()).unwrap();
        let mut m = tx.start(&msgs[2].0).unwrap();
        let r = tx.plan(&mut batch, &mut m, 0, src, crc, 1).unwrap();
        assert_eq!((r.fpdus, r.status), (1, PlanStatus::Budget));
        assert_eq!(batch.len(), r.bytes, "a done batch is cleared first");
        assert_eq!(batch.fpdu_count(), 1);
        let r = tx.plan(&mut batch, &mut m, 0, src, crc, 1).unwrap();
        assert_eq!((r.fpdus, r.status), (0, PlanStatus::Budget));
        assert_eq!(m.remaining_fpdus(), 3);
    }

    #[test]
    fn partial_sends_resumed_at_every_offset() {
        let msgs = sample_messages();
        for (crc, markers) in [(false, false), (true, true)] {
            let cfg = config(crc, markers, 200, 600);
            let want = emitted(cfg, &msgs[..3]);
            let payloads: Vec<&[u8]> = msgs.iter().map(|(_, p)| &p[..]).collect();
            let mut tx = Transmitter::new(cfg);
            let mut batch: Batch<256, 2048> = Batch::new();
            for (i, (m, p)) in msgs[..3].iter().enumerate() {
                let mut mt = tx.start(m).unwrap();
                let r = tx
                    .plan(
                        &mut batch,
                        &mut mt,
                        i as u32,
                        &mut Contiguous(p),
                        &mut SoftCrc32c::new(),
                        usize::MAX,
                    )
                    .unwrap();
                assert_eq!(r.status, PlanStatus::MessageDone);
            }
            assert_eq!(batch.len(), want.len());
            for k in 0..=want.len() {
                let mut b = batch.clone();
                b.advance(k).unwrap();
                assert_eq!(b.sent_len(), k);
                assert_eq!(pending_bytes(&b, &payloads), &want[k..], "offset {k}");
                // And then in two more steps.
                let rest = b.pending_len();
                b.advance(rest / 3).unwrap();
                assert_eq!(pending_bytes(&b, &payloads), &want[k + rest / 3..]);
                if rest / 3 > 0 {
                    assert_eq!(
                        b.advance(rest),
                        Err(TxError::AdvanceBeyondPending {
                            requested: rest,
                            pending: rest - rest / 3
                        })
                    );
                }
                b.advance(rest - rest / 3).unwrap();
                assert!(b.is_done());
                assert_eq!(b.pending().count(), 0);
            }
            // Octet by octet.
            let mut b = batch.clone();
            let mut out = Vec::new();
            while !b.is_done() {
                send_some(&mut b, 1, &payloads, &mut out);
            }
            assert_eq!(out, want);
            assert_eq!(b.advance(1).map_err(|_| ()), Err(()));
            assert_eq!(b.advance(0), Ok(()));
        }
    }

    #[test]
    fn capacity_limits_error_or_shorten() {
        let payload = vec![0x5au8; 3000];
        let msg = Message::Send { len: 3000 };
        let crc = &mut SoftCrc32c::new();
        // Too few pieces for even one FPDU with payload: BatchTooSmall, no
        // state change.
        let mut tx = Transmitter::new(config(true, true, 0, 1000));
        let before = tx.clone();
        let mut m = tx.start(&msg).unwrap();
        let mut tiny: Batch<2, 256> = Batch::new();
        let src = &mut Contiguous(&payload);
        assert_eq!(
            tx.plan(&mut tiny, &mut m, 0, src, crc, usize::MAX),
            Err(TxError::BatchTooSmall)
        );
        assert!(tiny.is_empty() && tiny.pieces().is_empty() && tiny.scratch().is_empty());
        assert_eq!(tx.stream_pos(), before.stream_pos());
        assert_eq!(m.remaining_fpdus(), 4);
        // Too little scratch.
        let mut tiny: Batch<64, 20> = Batch::new();
        assert_eq!(
            tx.plan(&mut tiny, &mut m, 0, src, crc, usize::MAX),
            Err(TxError::BatchTooSmall)
        );
        // Room for one FPDU: a shorter batch.
        let mut one: Batch<6, 120> = Batch::new();
        let r = tx.plan(&mut one, &mut m, 0, src, crc, usize::MAX).unwrap();
        assert_eq!((r.fpdus, r.status), (1, PlanStatus::BatchFull));
        assert_eq!(one.fpdu_count(), 1);
        let pieces = one.pieces().to_vec();
        // Full again while pending; progress once sent.
        let r = tx.plan(&mut one, &mut m, 0, src, crc, usize::MAX).unwrap();
        assert_eq!((r.fpdus, r.status), (0, PlanStatus::BatchFull));
        assert_eq!(one.pieces(), &pieces[..], "failed FPDU left no trace");
        one.advance(one.len()).unwrap();
        let r = tx.plan(&mut one, &mut m, 0, src, crc, usize::MAX).unwrap();
        assert_eq!(r.fpdus, 1);
        // Zero-capacity batches never panic.
        let mut zero: Batch<0, 0> = Batch::new();
        assert_eq!(
            tx.plan(&mut zero, &mut m, 0, src, crc, usize::MAX),
            Err(TxError::BatchTooSmall)
        );
        assert_eq!(zero.advance(1).map_err(|_| ()), Err(()));
        // emit_message into a short buffer: the wire length, no change.
        let mut tx = Transmitter::new(config(true, true, 0, 1000));
        let needed = tx.message_wire_len(&msg).unwrap();
        let mut out = vec![0u8; needed];
        for short in [0, 1, needed / 2, needed - 1] {
            assert_eq!(
                tx.emit_message(&msg, &payload, crc, &mut out[..short]),
                Err(TxError::BufferTooSmall { needed })
            );
        }
        assert_eq!(tx.next_msn(0), Some(1));
        assert_eq!(tx.stream_pos(), 0);
        assert_eq!(tx.emit_message(&msg, &payload, crc, &mut out), Ok(needed));
        assert_eq!(tx.next_msn(0), Some(2));
    }

    #[test]
    fn start_validation() {
        let mut tx = Transmitter::new(TxConfig {
            extensions: Extensions::NONE,
            ..config(false, false, 0, 1000)
        });
        let imm = Message::ImmediateData {
            data: ImmediateData::default(),
            solicited: false,
        };
        assert_eq!(
            tx.start(&imm).map(|_| ()),
            Err(TxError::ExtensionDisabled(Opcode::ImmediateData))
        );
        assert_eq!(
            tx.start(&Message::AtomicResponse(AtomicResponse::default()))
                .map(|_| ()),
            Err(TxError::ExtensionDisabled(Opcode::AtomicResponse))
        );
        // MULPDU too small for the fixed payload or for one payload octet.
        let mut tx = Transmitter::new(config(false, false, 0, 60));
        assert_eq!(
            tx.start(&Message::AtomicRequest(atomic_request()))
                .map(|_| ()),
            Err(TxError::MulpduTooSmall {
                mulpdu: 60,
                needed: 70
            })
        );
        assert!(tx.start(&Message::ReadRequest(read_request())).is_ok());
        tx.set_mulpdu(18);
        assert_eq!(
            tx.start(&Message::Send { len: 0 }).map(|_| ()),
            Err(TxError::MulpduTooSmall {
                mulpdu: 18,
                needed: 19
            })
        );
        assert!(tx
            .start(&Message::RdmaWrite {
                len: 9,
                stag: 0,
                to: 0
            })
            .is_ok());
        tx.set_mulpdu(0);
        assert!(tx
            .start(&Message::RdmaWrite {
                len: 9,
                stag: 0,
                to: 0
            })
            .is_err());
        // TO wrap.
        tx.set_mulpdu(1000);
        assert_eq!(
            tx.start(&Message::RdmaWrite {
                len: 2,
                stag: 0,
                to: u64::MAX
            })
            .map(|_| ()),
            Err(TxError::ToWrap)
        );
        // Inconsistent Terminate.
        let mut t = TerminateRepr::new(TermCode::Mpa(MpaCode::CrcError));
        t.hdrct.m = true;
        assert_eq!(
            tx.start(&Message::Terminate(t)).map(|_| ()),
            Err(TxError::InvalidTerminate)
        );
        // Payload length and availability.
        let mut out = [0u8; 256];
        let crc = &mut SoftCrc32c::new();
        assert_eq!(
            tx.emit_message(&Message::Send { len: 3 }, b"ab", crc, &mut out),
            Err(TxError::PayloadLength {
                expected: 3,
                actual: 2
            })
        );
        let mut tx = Transmitter::new(config(true, false, 0, 1000));
        let mut m = tx.start(&Message::Send { len: 3 }).unwrap();
        let mut batch: Batch<8, 128> = Batch::new();
        assert_eq!(
            tx.plan(&mut batch, &mut m, 0, &mut Contiguous(b"ab"), crc, 99),
            Err(TxError::PayloadUnavailable { offset: 0, len: 3 })
        );
        assert!(batch.is_empty() && batch.pieces().is_empty());
        assert_eq!(tx.stream_pos(), 0);
        assert_eq!(
            tx.plan(&mut batch, &mut m, 0, &mut NoPayload, crc, 99),
            Err(TxError::PayloadUnavailable { offset: 0, len: 3 })
        );
        // Without CRC the source is never consulted.
        let mut tx = Transmitter::new(config(false, false, 0, 1000));
        let mut m = tx.start(&Message::Send { len: 3 }).unwrap();
        assert!(tx
            .plan(&mut batch, &mut m, 0, &mut NoPayload, crc, 99)
            .is_ok());
    }

    #[test]
    fn msn_per_queue() {
        let mut tx = Transmitter::new(config(false, false, 0, 1000));
        let crc = &mut SoftCrc32c::new();
        let mut out = [0u8; 256];
        let mut emit = |tx: &mut Transmitter, m: Message| {
            let n = tx.emit_message(&m, &[], crc, &mut out).unwrap();
            DdpHeader::parse(&out[2..n]).unwrap()
        };
        let send = |h: DdpHeader| h.untagged_fields().unwrap();
        assert_eq!(send(emit(&mut tx, Message::Send { len: 0 })).msn, 1);
        assert_eq!(send(emit(&mut tx, Message::SendSe { len: 0 })).msn, 2);
        let imm = Message::ImmediateData {
            data: ImmediateData::default(),
            solicited: false,
        };
        assert_eq!(send(emit(&mut tx, imm)).msn, 3);
        assert_eq!(
            send(emit(&mut tx, Message::ReadRequest(read_request()))).msn,
            1
        );
        assert_eq!(
            send(emit(&mut tx, Message::AtomicRequest(atomic_request()))).msn,
            2
        );
        let ar = Message::AtomicResponse(AtomicResponse::default());
        assert_eq!(send(emit(&mut tx, ar)).msn, 1);
        let t = Message::Terminate(TerminateRepr::new(TermCode::Mpa(MpaCode::CrcError)));
        let h = send(emit(&mut tx, t));
        assert_eq!((h.qn, h.msn), (QN_TERMINATE, 1));
        // Tagged messages use no MSN.
        let w = emit(
            &mut tx,
            Message::RdmaWrite {
                len: 0,
                stag: 1,
                to: 2,
            },
        );
        assert!(w.is_tagged());
        assert_eq!(tx.next_msn(0), Some(4));
        assert_eq!(tx.next_msn(1), Some(3));
        assert_eq!(tx.next_msn(2), Some(2));
        assert_eq!(tx.next_msn(3), Some(2));
        assert_eq!(tx.next_msn(4), None);
        // start() consumes the MSN; MessageTx reports it.
        let m = tx.start(&Message::Send { len: 5 }).unwrap();
        assert_eq!(m.msn(), Some(4));
        assert_eq!(m.opcode(), Opcode::Send);
        assert_eq!(m.payload_len(), 5);
        let m = tx
            .start(&Message::RdmaWrite {
                len: 5,
                stag: 0,
                to: 0,
            })
            .unwrap();
        assert_eq!(m.msn(), None);
        assert_eq!(tx.next_msn(0), Some(5));
    }

    #[test]
    fn message_helpers() {
        assert_eq!(Message::send(1, false, None).opcode(), Opcode::Send);
        assert_eq!(Message::send(1, true, None).opcode(), Opcode::SendSe);
        assert_eq!(
            Message::send(1, false, Some(2)).opcode(),
            Opcode::SendInvalidate
        );
        assert_eq!(
            Message::send(1, true, Some(2)).opcode(),
            Opcode::SendSeInvalidate
        );
        let rr = read_request();
        assert_eq!(
            Message::read_response(&rr),
            Message::ReadResponse {
                len: 0x1000,
                stag: 0x0102_0304,
                to: 0x1122_3344_5566_7788
            }
        );
        let d = ImmediateData { data: [3; 8] };
        let [w, i] = Message::write_with_immediate(10, 1, 2, d, true);
        assert_eq!(
            (w.opcode(), i.opcode()),
            (Opcode::RdmaWrite, Opcode::ImmediateDataSe)
        );
        assert_eq!((w.payload_len(), i.payload_len()), (10, 0));
        let [s, i] = Message::send_with_immediate(10, d, false);
        assert_eq!(
            (s.opcode(), i.opcode()),
            (Opcode::Send, Opcode::ImmediateData)
        );
        let fixed = {
            let mut tx = Transmitter::new(config(false, false, 0, 100));
            tx.start(&i).unwrap().fixed_payload().to_vec()
        };
        assert_eq!(fixed, vec![3; 8]);
        let n = Negotiated {
            revision: super::super::mpa::Revision::V2,
            crc: true,
            markers_rx: false,
            markers_tx: true,
            enhanced: true,
            ird: 1,
            ord: 1,
            p2p: false,
            rtr: None,
            peer_reserved: 0,
        };
        let c = TxConfig::from_negotiated(&n, 1400, Extensions::NONE);
        assert_eq!(
            c,
            TxConfig {
                ..config(true, true, 0, 1400)
            }
            .with_ext(Extensions::NONE)
        );
        let tx = Transmitter::new(c);
        assert!(tx.crc_enabled() && tx.markers_enabled());
        assert_eq!(tx.extensions(), Extensions::NONE);
        assert_eq!(tx.marker_state(), Some(MarkerState::new()));
    }

    impl TxConfig {
        fn with_ext(mut self, e: Extensions) -> Self {
            self.extensions = e;
            self
        }
    }

    #[test]
    fn scattered_source_matches_contiguous() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let parts: Vec<&[u8]> = vec![
            &data[..1],
            &data[1..1],
            &data[1..300],
            &data[300..999],
            &data[999..],
        ];
        for (off, len) in [
            (0u32, 1000u32),
            (0, 0),
            (5, 500),
            (299, 2),
            (999, 1),
            (1000, 0),
        ] {
            let mut a = SoftCrc32c::new();
            let mut b = SoftCrc32c::new();
            Contiguous(&data).update_crc(off, len, &mut a).unwrap();
            Scattered(&parts).update_crc(off, len, &mut b).unwrap();
            assert_eq!(a.finish(), b.finish());
        }
        let mut e = SoftCrc32c::new();
        assert!(Scattered(&parts).update_crc(999, 2, &mut e).is_err());
        assert!(Scattered(&parts).update_crc(u32::MAX, 1, &mut e).is_err());
        assert!(Contiguous(&data)
            .update_crc(u32::MAX, u32::MAX, &mut e)
            .is_err());
        assert!(NoPayload.update_crc(0, 0, &mut e).is_ok());
        // Planning with a scattered source gives the same CRCs.
        let msg = Message::Send { len: 1000 };
        let cfg = config(true, true, 100, 400);
        let want = emitted(cfg, &[(msg, data.clone())]);
        let mut tx = Transmitter::new(cfg);
        let mut m = tx.start(&msg).unwrap();
        let mut batch: Batch<64, 512> = Batch::new();
        let r = tx
            .plan(
                &mut batch,
                &mut m,
                0,
                &mut Scattered(&parts),
                &mut SoftCrc32c::new(),
                usize::MAX,
            )
            .unwrap();
        assert_eq!(r.status, PlanStatus::MessageDone);
        assert_eq!(pending_bytes(&batch, &[&data]), want);
    }

    #[test]
    fn marked_mulpdu_is_clamped_and_fits_every_position() {
        let mut tx = Transmitter::new(config(false, true, 0, u16::MAX));
        assert_eq!(tx.mulpdu(), MAX_MARKED_MULPDU);
        let tx_plain = Transmitter::new(config(false, false, 0, u16::MAX));
        assert_eq!(tx_plain.mulpdu(), u16::MAX);
        // mpa::mulpdu for a large (GSO) segment exceeds the clamp, and an
        // FPDU that long with markers has an FPDUPTR beyond 16 bits.
        assert_eq!(mpa::mulpdu(70_000, true), 65534);
        let big = vec![0u8; 65534];
        let mut out = vec![0u8; 70_000];
        let mut ms = MarkerState::new();
        assert!(mpa::emit_fpdu(&big, Some(&mut ms), None, &mut out).is_err());
        // The clamped size works wherever the FPDU starts.
        let len = u32::from(MAX_MARKED_MULPDU) - 18;
        let msg = Message::Send { len };
        let mut batch: Batch<300, 1200> = Batch::new();
        for start in 0..512u32 {
            tx = Transmitter::new(config(false, true, start, u16::MAX));
            let mut m = tx.start(&msg).unwrap();
            let r = tx
                .plan(
                    &mut batch,
                    &mut m,
                    0,
                    &mut NoPayload,
                    &mut SoftCrc32c::new(),
                    0,
                )
                .unwrap();
            assert_eq!(
                (r.fpdus, r.status),
                (1, PlanStatus::MessageDone),
                "start {start}"
            );
            batch.clear();
        }
        // And parses back with a largest-possible-FPDUPTR marker.
        let payload = vec![0xa5u8; len as usize];
        let mut tx = Transmitter::new(config(true, true, 8, u16::MAX));
        let mut out = vec![0u8; 70_000];
        let n = tx
            .emit_message(&msg, &payload, &mut SoftCrc32c::new(), &mut out)
            .unwrap();
        let mut rx = MarkerState::at(8);
        let mut buf = vec![0u8; 65535];
        let got =
            parse_fpdu_with_markers(&out[..n], &mut rx, Some(&mut SoftCrc32c::new()), &mut buf)
                .unwrap();
        assert_eq!(got.wire_len, n);
        assert_eq!(&buf[18..got.ulpdu_len], &payload[..]);
    }

    #[test]
    fn gso_sized_fpdus_without_markers() {
        // MULPDU 65535 (no markers): the largest ULPDU, with a 3-octet pad.
        let len = 65535 - 14;
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let msg = Message::RdmaWrite {
            len: len as u32 * 2,
            stag: 1,
            to: 0,
        };
        let mut both = payload.clone();
        both.extend_from_slice(&payload);
        let mut tx = Transmitter::new(config(true, false, 0, u16::MAX));
        let (bytes, pieces) = plan_one(&mut tx, &msg, &both);
        assert_eq!(bytes.len(), 2 * (2 + 65535 + 3 + 4));
        assert_eq!(pieces.len(), 5, "trailer and next header merge");
        let f = parse_fpdu(&bytes, Some(&mut SoftCrc32c::new())).unwrap();
        assert_eq!(f.ulpdu.len(), 65535);
        assert!(!DdpHeader::parse(f.ulpdu).unwrap().last);
    }

    // --- property test: random messages and settings parse back ---

    /// The segments a message must produce, derived from the RFC rules
    /// without `ddp::Segmenter`: (header, DDP payload).
    fn model(msg: &Message, payload: &[u8], msn: u32, mulpdu: u16) -> Vec<(DdpHeader, Vec<u8>)> {
        let op = msg.opcode();
        let qn = op.queue_number().unwrap_or(0);
        let mut fixed = [0u8; 64];
        let fixed_len = match msg {
            Message::ReadRequest(r) => r.emit(&mut fixed).unwrap(),
            Message::Terminate(t) => t.emit(&mut fixed).unwrap(),
            Message::ImmediateData { data, .. } => data.emit(&mut fixed).unwrap(),
            Message::AtomicRequest(a) => a.emit(&mut fixed).unwrap(),
            Message::AtomicResponse(a) => a.emit(&mut fixed).unwrap(),
            _ => 0,
        };
        if fixed_len > 0 {
            let h = DdpHeader::untagged(op.value(), true, 0, qn, msn, 0);
            return vec![(h, fixed[..fixed_len].to_vec())];
        }
        let hdr = if op.is_tagged() { 14 } else { 18 };
        let chunk = usize::from(mulpdu) - hdr;
        let mut out = Vec::new();
        let mut off = 0;
        loop {
            let n = chunk.min(payload.len() - off);
            let last = off + n == payload.len();
            let h = match *msg {
                Message::RdmaWrite { stag, to, .. } | Message::ReadResponse { stag, to, .. } => {
                    DdpHeader::tagged(op.value(), last, stag, to + off as u64)
                }
                Message::SendInvalidate { stag, .. } | Message::SendSeInvalidate { stag, .. } => {
                    DdpHeader::untagged(op.value(), last, stag, qn, msn, off as u32)
                }
                _ => DdpHeader::untagged(op.value(), last, 0, qn, msn, off as u32),
            };
            out.push((h, payload[off..off + n].to_vec()));
            off += n;
            if last {
                return out;
            }
        }
    }

    fn arb_message() -> impl Strategy<Value = (Message, Vec<u8>)> {
        (
            0u8..12,
            0usize..2500,
            any::<u32>(),
            any::<u64>(),
            any::<u8>(),
        )
            .prop_map(|(k, len, stag, to, seed)| {
                let payload: Vec<u8> = (0..len)
                    .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                    .collect();
                let l = len as u32;
                let to = to >> 1; // no TO wrap
                let msg = match k {
                    0 => Message::Send { len: l },
                    1 => Message::SendInvalidate { len: l, stag },
                    2 => Message::SendSe { len: l },
                    3 => Message::SendSeInvalidate { len: l, stag },
                    4 => Message::RdmaWrite { len: l, stag, to },
                    5 => Message::ReadResponse { len: l, stag, to },
                    6 => Message::ReadRequest(ReadRequest {
                        sink_stag: stag,
                        sink_to: to,
                        read_size: l,
                        source_stag: !stag,
                        source_to: !to,
                    }),
                    7 => Message::Terminate(if seed % 2 == 0 {
                        TerminateRepr::new(TermCode::Mpa(MpaCode::CrcError))
                    } else {
                        // The longest Terminate: DDP and Read Request headers.
                        let mut seg =
                            vec![0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
                        seg.extend_from_slice(&[seed; 28]);
                        TerminateRepr::for_segment(
                            TermCode::DdpUntagged(UntaggedCode::MsnRange),
                            &seg,
                            28,
                        )
                    }),
                    8 => Message::ImmediateData {
                        data: ImmediateData { data: [seed; 8] },
                        solicited: stag % 2 == 0,
                    },
                    9 => Message::AtomicRequest(AtomicRequest {
                        request_id: stag,
                        remote_to: to & !7,
                        ..atomic_request()
                    }),
                    10 => Message::AtomicResponse(AtomicResponse {
                        request_id: stag,
                        original_value: to,
                    }),
                    _ => Message::send(
                        l,
                        seed % 2 == 0,
                        if stag % 2 == 0 { Some(stag) } else { None },
                    ),
                };
                let payload = if msg.payload_len() == 0 {
                    Vec::new()
                } else {
                    payload
                };
                (msg, payload)
            })
    }

    /// Drives `msgs` through plan with the given batch type; returns the
    /// stream and the messages actually started (with their MSNs).
    #[allow(clippy::too_many_arguments)]
    fn drive<const P: usize, const S: usize>(
        cfg: TxConfig,
        msgs: &[(Message, Vec<u8>)],
        budget: usize,
        splits: &[usize],
        partial: bool,
    ) -> (Vec<u8>, Vec<(usize, Option<u32>)>) {
        let mut tx = Transmitter::new(cfg);
        let payloads: Vec<&[u8]> = msgs.iter().map(|(_, p)| &p[..]).collect();
        let mut batch: Batch<P, S> = Batch::new();
        let mut stream = Vec::new();
        let mut started = Vec::new();
        let mut crc = SoftCrc32c::new();
        let mut split = splits.iter().cycle();
        for (i, (m, p)) in msgs.iter().enumerate() {
            let before = tx.clone();
            let mut mt = match tx.start(m) {
                Ok(mt) => mt,
                Err(TxError::MulpduTooSmall { .. }) => {
                    assert_eq!(tx, before, "a refused message consumes nothing");
                    continue;
                }
                Err(e) => panic!("{e:?}"),
            };
            started.push((i, mt.msn()));
            loop {
                let r = tx
                    .plan(
                        &mut batch,
                        &mut mt,
                        i as u32,
                        &mut Contiguous(p),
                        &mut crc,
                        budget,
                    )
                    .unwrap();
                assert!(batch.pending_len() <= budget.max(r.bytes) || r.fpdus <= 1);
                if r.status == PlanStatus::MessageDone {
                    break;
                }
                // Send part of the batch (TCP full) or all of it.
                loop {
                    let n = *split.next().unwrap();
                    send_some(&mut batch, n, &payloads, &mut stream);
                    if partial || batch.is_done() {
                        break;
                    }
                }
            }
        }
        while !batch.is_done() {
            let n = *split.next().unwrap();
            send_some(&mut batch, n, &payloads, &mut stream);
        }
        (stream, started)
    }

    fn check_stream(
        cfg: TxConfig,
        msgs: &[(Message, Vec<u8>)],
        started: &[(usize, Option<u32>)],
        stream: &[u8],
    ) {
        let mut rx = MarkerState::at(cfg.stream_start);
        let mut at = 0;
        let mut buf = vec![0u8; 65536];
        let mut engine = SoftCrc32c::new();
        let mulpdu = Transmitter::new(cfg).mulpdu();
        for &(i, msn) in started {
            let (msg, payload) = &msgs[i];
            for (want_hdr, want_payload) in model(msg, payload, msn.unwrap_or(0), mulpdu) {
                let e: Option<&mut dyn CrcEngine> = if cfg.crc { Some(&mut engine) } else { None };
                let (ulpdu, crc_field): (&[u8], u32) = if cfg.markers {
                    let f = parse_fpdu_with_markers(&stream[at..], &mut rx, e, &mut buf).unwrap();
                    at += f.wire_len;
                    (&buf[..f.ulpdu_len], f.crc)
                } else {
                    let f = parse_fpdu(&stream[at..], e).unwrap();
                    at += f.wire_len;
                    (f.ulpdu, f.crc)
                };
                if !cfg.crc {
                    assert_eq!(crc_field, 0);
                }
                assert!(ulpdu.len() <= usize::from(mulpdu));
                let h = DdpHeader::parse(ulpdu).unwrap();
                assert_eq!(h, want_hdr);
                assert_eq!(&ulpdu[h.header_len()..], &want_payload[..]);
            }
        }
        assert_eq!(at, stream.len());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_messages_parse_back(
            msgs in proptest::collection::vec(arb_message(), 1..6),
            mulpdu in prop_oneof![3 => 19u16..120, 2 => 120u16..1600, 1 => Just(u16::MAX)],
            crc in any::<bool>(),
            markers in any::<bool>(),
            stream_start in prop_oneof![
                Just(0u32),
                any::<u32>().prop_map(|x| x & !3),
                any::<u32>(),
                (0u32..256).prop_map(|x| (x * 4).wrapping_sub(512)),
            ],
            budget in prop_oneof![Just(0usize), 1usize..6000, Just(usize::MAX)],
            splits in proptest::collection::vec(1usize..3000, 1..8),
            partial in any::<bool>(),
            small in any::<bool>(),
        ) {
            let cfg = config(crc, markers, stream_start, mulpdu);
            let (stream, started) = if small && mulpdu < 1600 {
                drive::<12, 200>(cfg, &msgs, budget, &splits, partial)
            } else {
                drive::<512, 4096>(cfg, &msgs, budget, &splits, partial)
            };
            check_stream(cfg, &msgs, &started, &stream);
            // The same as emitting message by message.
            let mut tx = Transmitter::new(cfg);
            let mut out = vec![0u8; 300_000];
            let mut want = Vec::new();
            for (m, p) in &msgs {
                match tx.emit_message(m, p, &mut SoftCrc32c::new(), &mut out) {
                    Ok(n) => want.extend_from_slice(&out[..n]),
                    Err(TxError::MulpduTooSmall { .. }) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
            prop_assert_eq!(stream, want);
        }

        #[test]
        fn advance_and_pending_never_panic(
            ops in proptest::collection::vec(0usize..5000, 1..20),
            len in 0u32..5000,
            markers in any::<bool>(),
        ) {
            let mut tx = Transmitter::new(config(true, markers, 0, 700));
            let payload = vec![1u8; len as usize];
            let mut m = tx.start(&Message::Send { len }).unwrap();
            let mut batch: Batch<16, 160> = Batch::new();
            let crc = &mut SoftCrc32c::new();
            for n in ops {
                let _ = tx.plan(&mut batch, &mut m, 0, &mut Contiguous(&payload), crc, n);
                let pending = batch.pending_len();
                let total: usize = batch.pending().map(|p| p.len()).sum();
                prop_assert_eq!(total, pending);
                let r = batch.advance(n);
                prop_assert_eq!(r.is_ok(), n <= pending);
            }
        }
    }

    #[test]
    fn piece_helpers() {
        let p = Piece::Payload {
            tag: 1,
            offset: 10,
            len: 5,
        };
        assert_eq!(
            p.skip(2),
            Piece::Payload {
                tag: 1,
                offset: 12,
                len: 3
            }
        );
        assert!(p.skip(9).is_empty());
        let b = Piece::Bytes { start: 4, len: 4 };
        assert_eq!(b.skip(usize::MAX), Piece::Bytes { start: 8, len: 0 });
        let batch: Batch<4, 8> = Batch::default();
        assert_eq!(batch.resolve(&b), Chunk::Bytes(&[]));
        assert!(Chunk::Bytes(&[]).is_empty());
        assert_eq!(
            Chunk::Payload {
                tag: 0,
                offset: 0,
                len: 3
            }
            .len(),
            3
        );
        assert!(batch.is_done() && batch.is_empty());
        assert_eq!(MAX_FIXED_PAYLOAD, 52);
        assert_eq!(FPDU_SCRATCH_LEN, 79);
        let _ = MARKER_LEN;
    }
}
