// SPDX-License-Identifier: GPL-2.0

//! The incremental receive parser: one connection's inbound FPDU byte stream
//! in, placement instructions and validated segment/message events out.
//!
//! [`Receiver`] runs after the MPA handshake, configured with the negotiated
//! parameters ([`RxConfig`]: CRC, markers and the marker stream position,
//! enabled RFC 7306 extensions, largest accepted ULPDU, number of untagged
//! queues). It accepts the stream in pieces of any size (one octet at a
//! time, many FPDUs at once, markers anywhere), copies nothing but headers,
//! and hands out payload as sub-slices of the caller's input.
//!
//! # Loop
//!
//! [`Receiver::poll`] takes the not yet consumed part of the current input
//! piece (it advances the slice) and returns at most one event; `Ok(None)`
//! means the piece is used up and the receiver waits for more. This is the
//! whole loop over an skb's fragments ([`Receiver::feed`] is the same call
//! returning the consumed count instead):
//!
//! ```
//! use iwarp_core::crc32c::SoftCrc32c;
//! use iwarp_core::rdmap::Opcode;
//! use iwarp_core::rx::{Receiver, RxConfig, RxError, RxEvent, Target};
//!
//! # fn main() -> Result<(), RxError> {
//! // A Send of "abc" to QN 0, MSN 1 (ULPDU_Length 21, one octet of pad,
//! // CRC field zero since CRC is off), cut into two pieces.
//! let wire = [
//!     0x00, 0x15, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
//!     b'a', b'b', b'c', 0, 0, 0, 0, 0,
//! ];
//! let mut rx = Receiver::new(RxConfig::new(false), SoftCrc32c::new());
//! // Posted receive buffers: asked once per untagged message, at its first
//! // segment (QN, MSN, opcode -> length of the buffer at the queue head).
//! let mut rq = |_qn: u32, _msn: u32, _op: Opcode| Some(4096u32);
//! let mut buf = [0u8; 4096];
//! let mut done = None;
//! for piece in [&wire[..21], &wire[21..]] {
//!     let mut rest: &[u8] = piece;
//!     while let Some(ev) = rx.poll(&mut rest, &mut rq)? {
//!         match ev {
//!             // Look up and check the target; on failure:
//!             // `return Err(rx.reject(code))` and send its Terminate.
//!             RxEvent::Header(h) => assert_eq!(h.opcode, Opcode::Send),
//!             // Place: a bounds-checked copy, never past the posted buffer.
//!             RxEvent::Data(p) => {
//!                 if let Target::Untagged { mo, .. } = p.target {
//!                     buf[mo as usize..][..p.data.len()].copy_from_slice(p.data);
//!                 }
//!             }
//!             // CRC verified: only now complete work requests.
//!             RxEvent::Done(d) => done = d.message_len,
//!         }
//!     }
//! }
//! assert_eq!((done, &buf[..3]), (Some(3), &b"abc"[..]));
//! # Ok(())
//! # }
//! ```
//!
//! # Events and their order
//!
//! For every DDP segment, in stream order:
//!
//! 1. [`RxEvent::Header`] once its DDP/RDMAP header, and for the
//!    fixed-format opcodes (Read Request, Atomic Request/Response, Immediate
//!    Data, Terminate) the whole fixed payload, has arrived and passed every
//!    check the receiver can make on its own (see [Checks](#checks)). The
//!    caller now looks up and validates the target (STag table, access
//!    rights, bounds with `super::ddp::check_bounds`, the posted buffer it
//!    was asked about) and, if it refuses, calls [`Receiver::reject`] with
//!    the error code; that returns the fatal [`RxError`] holding the
//!    Terminate for this segment.
//! 2. Zero or more [`RxEvent::Data`] (ULP-data opcodes only): a borrowed
//!    sub-slice of the input and where its first octet goes, tagged
//!    (STag, TO) or untagged (QN, MSN, MO). Markers, pad and CRC are never
//!    part of them; a payload split by a marker or by the end of an input
//!    piece yields several placements that continue each other.
//! 3. [`RxEvent::Done`] after the CRC field has arrived and, with CRC on,
//!    matched. It repeats the header and, on the last segment of a message
//!    (L set), gives the message length.
//!
//! **Nothing received is trustworthy before `Done`.** Data may be placed as
//! it arrives (RFC 5041 allows placement before validation, and the target
//! was checked at `Header`), but work completions, Read Responses, atomic
//! operations, invalidations and Terminate processing must wait for the
//! `Done` event of the segment. On a CRC error `Done` never comes: the
//! stream fails.
//!
//! The fixed-format payload of a Read Request, Atomic Request or Response,
//! Immediate Data or Terminate is not in the events: it is the receiver's
//! [`Receiver::fixed_payload`] from the segment's `Header` to its `Done`
//! (and on, until the next header starts). The events stay small for the
//! common path, where a segment carries ULP data and no fixed payload.
//!
//! # One call per segment
//!
//! [`Receiver::poll_segment`] is `poll` with a shortcut: a ULP-data segment
//! whose FPDU lies whole in the input, in a stream without markers, comes as
//! one [`Polled::Segment`] ([`WholeSegment`]: its payload and its `Done`),
//! the CRC already checked; everything else comes as the events above. The
//! caller handles a whole segment as its `Header`, `Data` and `Done` in that
//! order. It saves the calls and the result moves of three events on the
//! common path (one FPDU per TCP segment). A whole segment whose CRC fails
//! never reaches the caller: the stream fails with the CRC error even where
//! the caller would have refused the segment at its header.
//!
//! # Posted buffers
//!
//! At the first segment of every untagged message (other than a Terminate,
//! for which the receiver has room itself) the receiver asks the caller's
//! [`PostedBuffers`] for the buffer at the head of the queue. `None` fails the
//! stream with "Invalid MSN - no buffer available"; `Some(len)` is checked
//! against every segment of the message (MO + length must stay within `len`,
//! else "DDP Message too long"). For the fixed-format opcodes only the
//! presence of a buffer (an inbound Read/Atomic slot, an outstanding Atomic
//! Request, a receive WQE for Immediate Data) matters, not its length.
//! Closures `FnMut(qn, msn, opcode) -> Option<u32>` implement the trait.
//!
//! # Checks
//!
//! Made by the receiver, each failing the stream with the error and
//! Terminate code in parentheses (layer/type/code): ULPDU_Length below 14,
//! above [`RxConfig::max_ulpdu_len`] or below the header its T flag announces
//! (MPA 2/0/0x03); marker FPDUPTR (2/0/0x03); CRC (2/0/0x02); DDP version
//! (1/1/0x04 tagged, 1/2/0x06 untagged); RDMAP version (0/2/0x05); reserved
//! or disabled opcode, T flag wrong for the opcode, an opcode that differs
//! from the message in progress (0/2/0x06); wrong or unknown QN (1/2/0x01);
//! MSN (1/2/0x03); no posted buffer (1/2/0x02); MO not continuing the
//! message (1/2/0x04); message longer than the posted buffer (1/2/0x05);
//! fixed-format payload of the wrong length, a single-segment opcode without
//! L, a reserved Atomic operation (0/2/0xFF); STag changed within a tagged
//! message (1/1/0x00); TO not continuing it (1/1/0x01); TO wrap (1/1/0x03);
//! any octet after a Terminate message (0/2/0x06). The Terminate carries the
//! offending segment's headers as `super::terminate` prescribes, with the
//! segment's DDP payload length (ULPDU_Length minus the DDP header) in its
//! DDP Segment Length field.
//!
//! After a fatal error (including [`Receiver::reject`]) the receiver refuses
//! all input and returns the same error again.

use super::crc32c::CrcEngine;
use super::ddp::{
    usize_from, BufferFields, ControlField, DdpError, DdpHeader, TaggedError, TaggedFields,
    TaggedStream, UntaggedError, UntaggedFields, UntaggedQueues, CONTROL_LEN, TAGGED_HEADER_LEN,
    UNTAGGED_HEADER_LEN,
};
use super::mpa::{self, MarkerState, MpaError, Negotiated, CRC_LEN, MARKER_LEN, ULPDU_LENGTH_LEN};
use super::rdmap::{
    self, AtomicRequest, AtomicResponse, Extensions, ImmediateData, Opcode, PayloadKind,
    RdmapError, ReadRequest, ATOMIC_REQUEST_LEN, QUEUE_COUNT,
};
use super::terminate::{
    self, MpaCode, RemoteOperationCode, TermCode, TerminateError, TerminateRepr,
};
use core::fmt;

/// Copies the first `N` octets of `src` to the start of `dst`; `None`
/// (nothing copied) if either is shorter.
fn copy_prefix<const N: usize>(dst: &mut [u8], src: &[u8]) -> Option<()> {
    let from = src.first_chunk::<N>()?;
    let to = dst.first_chunk_mut::<N>()?;
    *to = *from;
    Some(())
}

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// Largest fixed-format RDMAP payload the receiver buffers: the Atomic
/// Request header and the largest Terminate payload (52 octets each).
pub const MAX_FIXED_LEN: usize = max(ATOMIC_REQUEST_LEN, terminate::MAX_LEN);
/// Size of the receiver's header buffer: an untagged DDP header plus the
/// largest fixed-format payload.
pub const HEADER_BUF_LEN: usize = UNTAGGED_HEADER_LEN + MAX_FIXED_LEN;
/// Smallest acceptable ULPDU_Length: a tagged DDP header.
pub const MIN_ULPDU_LEN: u16 = TAGGED_HEADER_LEN as u16;

/// The code of errors that cannot happen (a broken internal invariant):
/// RDMAP Local Catastrophic, as upstream siw uses for its own failures.
const INTERNAL_CODE: TermCode = TermCode::RdmapLocalCatastrophic(0xff);
/// "Unexpected OpCode", for opcode changes within a message and data after
/// a Terminate.
const UNEXPECTED_OPCODE: TermCode =
    TermCode::RdmapRemoteOperation(RemoteOperationCode::UnexpectedOpcode);

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// The negotiated receive parameters of one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxConfig {
    /// CRCs are in use: every FPDU's CRC field is checked.
    pub crc: bool,
    /// Markers in the received stream: `Some(pos)` with the marker stream
    /// offset (see `super::mpa::MarkerState`) of the first octet that will
    /// be fed, 0 when feeding starts with the first FPDU of the direction;
    /// `None` without markers.
    pub markers: Option<u32>,
    /// The RFC 7306 opcodes accepted.
    pub extensions: Extensions,
    /// Largest ULPDU_Length accepted (the local receive limit).
    pub max_ulpdu_len: u16,
    /// Number of untagged queues: QNs from this value up are invalid.
    /// Values above `super::rdmap::QUEUE_COUNT` count as that.
    pub queues: u32,
}

impl RxConfig {
    /// CRC as given; no markers, no extensions, no ULPDU limit below the
    /// 16-bit field's, all four untagged queues (the QN an opcode may use is
    /// checked separately).
    pub const fn new(crc: bool) -> Self {
        RxConfig {
            crc,
            markers: None,
            extensions: Extensions::NONE,
            max_ulpdu_len: u16::MAX,
            queues: QUEUE_COUNT as u32,
        }
    }

    /// The receive parameters of a completed handshake: its CRC setting and,
    /// if the peer inserts markers, markers starting at stream offset 0 (the
    /// first FPDU octet to be fed).
    pub const fn from_negotiated(n: &Negotiated, extensions: Extensions) -> Self {
        let mut c = Self::new(n.crc);
        c.extensions = extensions;
        if n.markers_rx {
            c.markers = Some(0);
        }
        c
    }
}

impl Default for RxConfig {
    fn default() -> Self {
        Self::new(false)
    }
}

// ---------------------------------------------------------------------------
// Posted buffers
// ---------------------------------------------------------------------------

/// The caller's answer to "which buffer does this untagged message go to".
pub trait PostedBuffers {
    /// Length of the buffer posted at the head of untagged queue `qn` for
    /// the message `msn` (opcode `opcode`), or `None` if none is posted.
    ///
    /// Asked once per message, at its first segment, after the receiver
    /// checked the MSN and before it checks the MO and the length. It is a
    /// query: the caller claims the buffer when the segment's
    /// [`RxEvent::Header`] arrives with `first` set.
    fn posted_len(&mut self, qn: u32, msn: u32, opcode: Opcode) -> Option<u32>;
}

impl<F> PostedBuffers for F
where
    F: FnMut(u32, u32, Opcode) -> Option<u32>,
{
    fn posted_len(&mut self, qn: u32, msn: u32, opcode: Opcode) -> Option<u32> {
        self(qn, msn, opcode)
    }
}

/// [`PostedBuffers`] with a buffer of `u32::MAX` octets always posted
/// (tools and tests that do not model receive queues).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unlimited;

impl PostedBuffers for Unlimited {
    fn posted_len(&mut self, _qn: u32, _msn: u32, _opcode: Opcode) -> Option<u32> {
        Some(u32::MAX)
    }
}

// ---------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------

/// Where payload goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Tagged buffer model: the buffer named by `stag`, at Tagged Offset
    /// `to`.
    Tagged {
        /// Steering Tag.
        stag: u32,
        /// Tagged Offset.
        to: u64,
    },
    /// Untagged buffer model: the buffer of message `msn` on queue `qn`, at
    /// Message Offset `mo`.
    Untagged {
        /// Queue Number.
        qn: u32,
        /// Message Sequence Number.
        msn: u32,
        /// Message Offset.
        mo: u32,
    },
}

impl Target {
    /// The position `n` octets further on.
    fn advanced(self, n: u32) -> Self {
        match self {
            Target::Tagged { stag, to } => Target::Tagged {
                stag,
                to: to.wrapping_add(u64::from(n)),
            },
            Target::Untagged { qn, msn, mo } => Target::Untagged {
                qn,
                msn,
                mo: mo.wrapping_add(n),
            },
        }
    }
}

/// The fixed-format RDMAP payload of a segment, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixedPayload {
    /// RDMA Read Request header.
    ReadRequest(ReadRequest),
    /// RFC 7306 Atomic Request header.
    AtomicRequest(AtomicRequest),
    /// RFC 7306 Atomic Response header.
    AtomicResponse(AtomicResponse),
    /// RFC 7306 Immediate Data (either opcode).
    ImmediateData(ImmediateData),
    /// Terminate payload: the peer's report, or why it does not parse (the
    /// stream is over either way).
    Terminate(Result<TerminateRepr, TerminateError>),
}

/// A received segment's validated DDP/RDMAP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The RDMAP opcode.
    pub opcode: Opcode,
    /// L: the segment ends its DDP message.
    pub last: bool,
    /// The segment starts its DDP message (untagged: MO 0; tagged: no
    /// tagged message was in progress). The caller claims the posted buffer
    /// or validates the STag here.
    pub first: bool,
    /// Where the segment's first payload octet goes.
    pub target: Target,
    /// DDP payload length: ULP data octets, or the fixed payload's length.
    /// The opcodes with a fixed-format payload carry no ULP data and have
    /// no [`RxEvent::Data`]; their payload is
    /// [`Receiver::fixed_payload`].
    pub payload_len: u32,
    /// The Invalidate STag of a Send with Invalidate (with or without SE).
    pub invalidate_stag: Option<u32>,
}

/// Payload to place: `data` goes to `target` (its first octet) onwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement<'a> {
    /// Where `data[0]` goes.
    pub target: Target,
    /// The octets, borrowed from the input.
    pub data: &'a [u8],
}

/// A segment received completely, its CRC verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentDone {
    /// The segment's header, as in its [`RxEvent::Header`].
    pub header: SegmentHeader,
    /// On the last segment of a message (L set): the message's length
    /// (untagged: MO + payload length of this segment; tagged: the sum of
    /// its segments' payloads). `None` otherwise.
    pub message_len: Option<u64>,
}

/// What [`Receiver::feed`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxEvent<'a> {
    /// A segment's headers are complete and valid; validate the target.
    Header(SegmentHeader),
    /// Payload of the current segment to place.
    Data(Placement<'a>),
    /// The current segment is complete and verified; completions may be
    /// signalled.
    Done(SegmentDone),
}

/// A segment that arrived whole in one input (see
/// [`Receiver::poll_segment`]): what its [`RxEvent::Header`], its
/// [`RxEvent::Data`] (one, unless the payload is empty) and its
/// [`RxEvent::Done`] would have reported, its CRC already verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WholeSegment<'a> {
    /// The payload, all of it, borrowed from the input; it goes to
    /// `done.header.target`. Empty for a zero-length segment.
    pub data: &'a [u8],
    /// The segment's header and, on its message's last segment, the
    /// message length.
    pub done: SegmentDone,
}

impl<'a> WholeSegment<'a> {
    /// The events the segment stands for, in their order: its `Header`,
    /// its `Data` unless the payload is empty, its `Done`.
    pub fn events(&self) -> impl Iterator<Item = RxEvent<'a>> {
        let h = self.done.header;
        let data = (!self.data.is_empty()).then_some(RxEvent::Data(Placement {
            target: h.target,
            data: self.data,
        }));
        [
            Some(RxEvent::Header(h)),
            data,
            Some(RxEvent::Done(self.done)),
        ]
        .into_iter()
        .flatten()
    }
}

/// What [`Receiver::poll_segment`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Polled<'a> {
    /// A whole segment, checked.
    Segment(WholeSegment<'a>),
    /// The next event of a segment taken step by step.
    Event(RxEvent<'a>),
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// What went wrong (the Terminate code is in [`RxError::terminate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxErrorKind {
    /// ULPDU_Length below [`MIN_ULPDU_LEN`] or above the configured limit.
    UlpduLength(u16),
    /// MPA: CRC mismatch ([`MpaError::BadCrc`]) or bad marker
    /// ([`MpaError::MarkerMismatch`]).
    Mpa(MpaError),
    /// DDP header: too short for its T flag, or a bad version.
    Ddp(DdpError),
    /// RDMAP: opcode, T flag, queue, L flag or fixed payload.
    Rdmap(RdmapError),
    /// Untagged bookkeeping: QN, MSN, MO, buffer.
    Untagged(UntaggedError),
    /// Tagged bookkeeping: STag or TO continuity, TO wrap.
    Tagged(TaggedError),
    /// A segment continuing a message carries another opcode than the
    /// message's first segment.
    OpcodeChanged {
        /// The message's opcode.
        expected: Opcode,
        /// The segment's opcode.
        got: Opcode,
    },
    /// Octets after a Terminate message. RFC 5040 ends the stream with the
    /// Terminate, so the Terminate of this error is informational: do not
    /// send it ([`RxError::should_send_terminate`]).
    DataAfterTerminate,
    /// The caller refused the segment ([`Receiver::reject`]).
    Rejected,
    /// A broken internal invariant (never expected; reported as RDMAP Local
    /// Catastrophic Error).
    Internal,
}

/// A fatal receive error and the Terminate to send for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxError {
    /// The cause.
    pub kind: RxErrorKind,
    /// The Terminate payload reporting it, with the offending segment's
    /// headers attached per `super::terminate::TermCode::header_policy`;
    /// emit with `TerminateRepr::emit_message`.
    pub terminate: TerminateRepr,
}

impl RxError {
    /// The Terminate error code.
    pub const fn code(&self) -> TermCode {
        self.terminate.code
    }

    /// Whether to send [`terminate`](Self::terminate) before closing: false
    /// only after the peer's own Terminate.
    pub const fn should_send_terminate(&self) -> bool {
        !matches!(self.kind, RxErrorKind::DataAfterTerminate)
    }
}

impl fmt::Display for RxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (layer, etype, code) = self.code().wire();
        write!(
            f,
            "iWARP receive error {:?} (terminate {layer}/{etype}/{code:#04x})",
            self.kind
        )
    }
}

/// The Terminate code of an MPA error.
fn mpa_code(e: MpaError) -> TermCode {
    match e.term_code().and_then(MpaCode::from_u8) {
        Some(c) => TermCode::Mpa(c),
        None => INTERNAL_CODE,
    }
}

// ---------------------------------------------------------------------------
// The receiver
// ---------------------------------------------------------------------------

/// Where in the FPDU the next framed octet belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// ULPDU_Length (an FPDU starts when none of it has arrived).
    Length,
    /// The DDP header: the control field first, then the rest.
    Header,
    /// The fixed-format RDMAP payload.
    Fixed,
    /// ULP data.
    Payload,
    /// PAD.
    Pad,
    /// The CRC field.
    Trailer,
    /// A Terminate was received: no more input.
    Terminated,
    /// A fatal error occurred.
    Failed,
}

/// What a step of the state machine produced.
enum Flow<'a> {
    /// Go on with the rest of the input.
    More,
    /// The input is used up.
    Wait,
    /// Return this event.
    Event(RxEvent<'a>),
}

/// Incremental receive parser of one connection; see the module
/// documentation. Generic over the CRC engine (the kernel plugs in its
/// hardware-accelerated CRC32c).
#[derive(Clone, Debug)]
pub struct Receiver<C> {
    config: RxConfig,
    crc: C,
    markers: Option<MarkerState>,
    phase: Phase,
    /// ULPDU_Length octets of the current FPDU.
    len_buf: [u8; ULPDU_LENGTH_LEN],
    len_got: usize,
    /// ULPDU_Length of the current (or, in `Length`, the previous) FPDU.
    ulen: u16,
    marker_buf: [u8; MARKER_LEN],
    marker_got: usize,
    /// The current FPDU's leading marker (one due before its
    /// ULPDU_Length) was received.
    lead_marker: bool,
    trailer: [u8; CRC_LEN],
    trailer_got: usize,
    pad_left: usize,
    /// The DDP header and fixed payload of the current segment.
    seg: [u8; HEADER_BUF_LEN],
    seg_got: usize,
    seg_need: usize,
    /// DDP header length of the current segment (14 or 18).
    hdr_len: usize,
    /// The current segment (from its header on), or the last one received
    /// until the next header starts.
    current: Option<SegmentHeader>,
    /// The fixed-format payload of `current`, for the opcodes that have one.
    fixed: Option<FixedPayload>,
    /// Message length to report at `Done`.
    message_len: Option<u64>,
    payload_left: u32,
    placed: u32,
    queues: UntaggedQueues<QUEUE_COUNT>,
    /// Opcode of the message in progress on each untagged queue.
    queue_ops: [Option<Opcode>; QUEUE_COUNT],
    tagged: TaggedStream,
    tagged_op: Option<Opcode>,
    tagged_len: u64,
    /// The tagged message in progress reached TO 2^64: any further payload
    /// octet wraps.
    tagged_at_top: bool,
    error: Option<RxError>,
}

impl<C: CrcEngine> Receiver<C> {
    /// A receiver at the start of the FPDU stream described by `config`,
    /// computing CRCs with `crc` (used only if `config.crc`).
    pub fn new(config: RxConfig, crc: C) -> Self {
        let mut config = config;
        config.queues = config.queues.min(QUEUE_COUNT as u32);
        let mut rx = Receiver {
            config,
            crc,
            markers: config.markers.map(MarkerState::at),
            phase: Phase::Length,
            len_buf: [0; ULPDU_LENGTH_LEN],
            len_got: 0,
            ulen: 0,
            marker_buf: [0; MARKER_LEN],
            marker_got: 0,
            lead_marker: false,
            trailer: [0; CRC_LEN],
            trailer_got: 0,
            pad_left: 0,
            seg: [0; HEADER_BUF_LEN],
            seg_got: 0,
            seg_need: CONTROL_LEN,
            hdr_len: 0,
            current: None,
            fixed: None,
            message_len: None,
            payload_left: 0,
            placed: 0,
            queues: UntaggedQueues::new(),
            queue_ops: [None; QUEUE_COUNT],
            tagged: TaggedStream::new(),
            tagged_op: None,
            tagged_len: 0,
            tagged_at_top: false,
            error: None,
        };
        rx.start_fpdu();
        rx
    }

    /// The configuration (with `queues` clamped).
    pub const fn config(&self) -> &RxConfig {
        &self.config
    }

    /// The fatal error, once one occurred.
    pub const fn error(&self) -> Option<&RxError> {
        self.error.as_ref()
    }

    /// Whether a Terminate message was received (further input is an
    /// error).
    pub fn is_terminated(&self) -> bool {
        self.phase == Phase::Terminated
    }

    /// Whether the receiver sits between two FPDUs with nothing of the next
    /// one received (a clean place for the stream to end).
    pub fn at_fpdu_boundary(&self) -> bool {
        (self.phase == Phase::Length
            && self.len_got == 0
            && self.marker_got == 0
            && !self.lead_marker)
            || self.phase == Phase::Terminated
    }

    /// Whether the stream received so far ends with a whole DDP message:
    /// between FPDUs, and the last segment (if any) had L set. A TCP
    /// receiver takes this for the end of the peer's write, where the peer
    /// may wait for an acknowledgement; inside a message more follows.
    pub fn at_message_end(&self) -> bool {
        self.at_fpdu_boundary() && self.current.as_ref().is_none_or(|h| h.last)
    }

    /// Marker stream offset of the next octet, with markers.
    pub fn stream_pos(&self) -> Option<u32> {
        // A marker in progress has not advanced the marker state yet.
        self.markers
            .map(|m| m.stream_pos().wrapping_add(self.marker_got as u32))
    }

    /// The segment being received (from its `Header` event on), or the last
    /// one completed until the next one's header starts to arrive.
    pub const fn current(&self) -> Option<&SegmentHeader> {
        self.current.as_ref()
    }

    /// The fixed-format payload of the [`current`](Self::current) segment
    /// (Read Request, Atomic Request or Response, Immediate Data,
    /// Terminate): there from the segment's `Header` event on, through its
    /// `Done`, until the next header starts to arrive. `None` for the
    /// opcodes that carry ULP data.
    pub const fn fixed_payload(&self) -> Option<&FixedPayload> {
        self.fixed.as_ref()
    }

    /// The MSN untagged queue `qn` expects (of the message in progress or
    /// the next one).
    pub fn expected_msn(&self, qn: u32) -> Option<u32> {
        self.queues.queue(qn).ok().map(|q| q.expected_msn())
    }

    /// Parses `input` (the next octets of the stream) up to the next event.
    ///
    /// Returns the number of octets consumed and: `Ok(Some(event))` (call
    /// again with the rest of `input`); `Ok(None)` when all of `input` was
    /// consumed without completing an event (wait for more); or the fatal
    /// `Err`, after which every call returns it again with 0 consumed.
    /// `bufs` is asked for posted buffers (see [`PostedBuffers`]).
    pub fn feed<'a, B>(
        &mut self,
        input: &'a [u8],
        bufs: &mut B,
    ) -> (usize, Result<Option<RxEvent<'a>>, RxError>)
    where
        B: PostedBuffers + ?Sized,
    {
        if let Some(e) = self.error {
            return (0, Err(e));
        }
        let mut off = 0usize;
        loop {
            let rest = input.get(off..).unwrap_or(&[]);
            match self.step(rest, bufs) {
                Ok((n, flow)) => {
                    off = off.saturating_add(n);
                    match flow {
                        Flow::More => {}
                        Flow::Wait => return (off, Ok(None)),
                        Flow::Event(ev) => return (off, Ok(Some(ev))),
                    }
                }
                Err(e) => return (off, Err(e)),
            }
        }
    }

    /// [`feed`](Self::feed) that advances `input` past the consumed octets
    /// (it is empty when `Ok(None)` is returned).
    pub fn poll<'a, B>(
        &mut self,
        input: &mut &'a [u8],
        bufs: &mut B,
    ) -> Result<Option<RxEvent<'a>>, RxError>
    where
        B: PostedBuffers + ?Sized,
    {
        let whole: &'a [u8] = input;
        let (n, r) = self.feed(whole, bufs);
        *input = whole.get(n..).unwrap_or(&[]);
        r
    }

    /// [`poll`](Self::poll), but a segment whose FPDU lies whole in `input`
    /// comes as one [`Polled::Segment`] instead of its `Header`, `Data` and
    /// `Done` events: one call per segment on the common path, and the CRC
    /// checked before the caller sees the payload. Segments with a
    /// fixed-format payload, FPDUs split across inputs, and streams with
    /// markers come as events, as from `poll`. The checks, their order and
    /// the errors are `poll`'s, but for one: the CRC of a whole segment is
    /// checked before the caller sees its header, so a segment the caller
    /// would refuse at its header and whose CRC fails ends with the CRC
    /// error (an FPDU that does not verify is not acted on).
    /// [`reject`](Self::reject) after a `Segment` refuses that segment, as
    /// after its `Done`. A `Segment` leaves the receiver between FPDUs,
    /// where an empty input gives `Ok(None)`: a caller at the end of its
    /// input need not poll again.
    pub fn poll_segment<'a, B>(
        &mut self,
        input: &mut &'a [u8],
        bufs: &mut B,
    ) -> Result<Option<Polled<'a>>, RxError>
    where
        B: PostedBuffers + ?Sized,
    {
        let whole: &'a [u8] = input;
        if self.error.is_none()
            && self.phase == Phase::Length
            && self.len_got == 0
            && self.markers.is_none()
        {
            if let Some(r) = self.whole_header(whole, bufs) {
                let flow = r?;
                let n = self.whole_header_len();
                let after = whole.get(n..).unwrap_or(&[]);
                *input = after;
                match flow {
                    Flow::Event(RxEvent::Header(h)) => {
                        if let Some((used, seg)) = self.whole_rest(h, after)? {
                            *input = after.get(used..).unwrap_or(&[]);
                            return Ok(Some(Polled::Segment(seg)));
                        }
                        return Ok(Some(Polled::Event(RxEvent::Header(h))));
                    }
                    Flow::Event(ev) => return Ok(Some(Polled::Event(ev))),
                    // A fixed-format payload follows: step by step.
                    Flow::More => {}
                    Flow::Wait => return Ok(None),
                }
            }
        }
        self.poll(input, bufs).map(|ev| ev.map(Polled::Event))
    }

    /// After a ULP-data segment's header (its `Header` event `h` just
    /// made), the payload, pad and CRC field from `rest` if all of them are
    /// there: the octets used and the segment. `None`, with nothing
    /// changed, if they are not.
    fn whole_rest<'a>(
        &mut self,
        h: SegmentHeader,
        rest: &'a [u8],
    ) -> Result<Option<(usize, WholeSegment<'a>)>, RxError> {
        let len = usize_from(self.payload_left);
        let pad = mpa::pad_len(usize::from(self.ulen));
        let crc_at = len.saturating_add(pad);
        let used = crc_at.saturating_add(CRC_LEN);
        let (Some(data), Some(padding), Some(trailer)) = (
            rest.get(..len),
            rest.get(len..crc_at),
            rest.get(crc_at..used)
                .and_then(|t| <[u8; CRC_LEN]>::try_from(t).ok()),
        ) else {
            return Ok(None);
        };
        if self.config.crc {
            self.crc.update(data);
            self.crc.update(padding);
        }
        self.trailer = trailer;
        self.trailer_got = CRC_LEN;
        let done = self.segment_done(h)?;
        self.pad_left = 0;
        self.placed = self.placed.wrapping_add(self.payload_left);
        self.payload_left = 0;
        Ok(Some((used, WholeSegment { data, done })))
    }

    /// Refuses the current segment with `code` (e.g. an invalid STag, an
    /// access or bounds violation, no inbound Read slot): the stream fails
    /// and the returned error carries the Terminate for the segment, with
    /// its headers as `code` asks. Call it after the segment's `Header`
    /// event; after its `Done` it still reports that segment (until the next
    /// header starts to arrive), as for a failed invalidation. If the stream
    /// already failed, returns that first error.
    pub fn reject(&mut self, code: TermCode) -> RxError {
        if let Some(e) = self.error {
            return e;
        }
        let attach = self.current.is_some();
        self.fail(RxErrorKind::Rejected, code, attach)
    }

    // -- state machine ------------------------------------------------------

    /// Records the fatal error. `attach`: the header buffer holds the
    /// offending segment's headers (as far as received).
    fn fail(&mut self, kind: RxErrorKind, code: TermCode, attach: bool) -> RxError {
        let seg: &[u8] = if attach {
            self.seg.get(..self.seg_got).unwrap_or(&[])
        } else {
            &[]
        };
        let ddp_len = usize::from(self.ulen).saturating_sub(self.hdr_len);
        let ddp_len = u16::try_from(ddp_len).unwrap_or(u16::MAX);
        let e = RxError {
            kind,
            terminate: TerminateRepr::for_segment(code, seg, ddp_len),
        };
        self.phase = Phase::Failed;
        self.error = Some(e);
        e
    }

    /// A fatal error about the segment whose header is being received.
    fn fail_segment(&mut self, kind: RxErrorKind, code: TermCode) -> RxError {
        self.fail(kind, code, true)
    }

    fn internal(&mut self) -> RxError {
        self.fail(RxErrorKind::Internal, INTERNAL_CODE, false)
    }

    /// Starts the next FPDU.
    fn start_fpdu(&mut self) {
        self.phase = Phase::Length;
        self.len_got = 0;
        self.lead_marker = false;
        if self.config.crc {
            self.crc.reset();
        }
        if let Some(m) = self.markers.as_mut() {
            m.begin_fpdu();
        }
    }

    /// Accounts for framed octets just consumed: marker position and, if
    /// `covered`, the CRC.
    #[inline]
    fn framed(&mut self, bytes: &[u8], covered: bool) -> Result<(), RxError> {
        if let Some(m) = self.markers.as_mut() {
            if m.advance(bytes.len()).is_err() {
                return Err(self.internal());
            }
        }
        if covered && self.config.crc {
            self.crc.update(bytes);
        }
        Ok(())
    }

    /// One step: consumes octets from `rest` within a single field (or
    /// marker), never across a marker.
    fn step<'a, B>(&mut self, rest: &'a [u8], bufs: &mut B) -> Result<(usize, Flow<'a>), RxError>
    where
        B: PostedBuffers + ?Sized,
    {
        match self.phase {
            Phase::Failed => return Err(self.error.unwrap_or_else(|| self.internal())),
            Phase::Terminated => {
                if rest.is_empty() {
                    return Ok((0, Flow::Wait));
                }
                return Err(self.fail(RxErrorKind::DataAfterTerminate, UNEXPECTED_OPCODE, false));
            }
            _ => {}
        }
        let mut avail = rest.len();
        if let Some(m) = self.markers {
            if self.marker_got > 0 || m.marker_due() {
                return self.marker_bytes(rest);
            }
            // Not due, so at least one octet may pass.
            avail = avail.min(usize_from(m.bytes_before_marker()));
        }
        if avail == 0 {
            return Ok((0, Flow::Wait));
        }
        match self.phase {
            Phase::Length if self.markers.is_none() && self.len_got == 0 => {
                match self.whole_header(rest, bufs) {
                    Some(r) => r.map(|flow| (self.whole_header_len(), flow)),
                    None => self.length_bytes(rest, avail),
                }
            }
            Phase::Length => self.length_bytes(rest, avail),
            Phase::Header | Phase::Fixed => self.header_bytes(rest, avail, bufs),
            Phase::Payload => self.payload_bytes(rest, avail),
            Phase::Pad => self.pad_bytes(rest, avail),
            Phase::Trailer => self.trailer_bytes(rest, avail),
            Phase::Terminated | Phase::Failed => Err(self.internal()),
        }
    }

    fn marker_bytes<'a>(&mut self, rest: &'a [u8]) -> Result<(usize, Flow<'a>), RxError> {
        let want = MARKER_LEN.saturating_sub(self.marker_got);
        let n = rest.len().min(want);
        if n == 0 {
            return Ok((0, Flow::Wait));
        }
        let (Some(src), Some(dst)) = (
            rest.get(..n),
            self.marker_buf
                .get_mut(self.marker_got..self.marker_got.saturating_add(n)),
        ) else {
            return Err(self.internal());
        };
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
        self.marker_got = self.marker_got.saturating_add(n);
        if self.marker_got < MARKER_LEN {
            return Ok((n, Flow::More));
        }
        self.marker_got = 0;
        let checked = match self.markers.as_mut() {
            Some(m) => m.strip_marker(&self.marker_buf),
            None => Err(MpaError::InvalidState),
        };
        if let Err(e) = checked {
            return Err(self.fail(RxErrorKind::Mpa(e), mpa_code(e), false));
        }
        if self.phase == Phase::Length && self.len_got == 0 {
            self.lead_marker = true;
        }
        // Markers before the CRC field are covered by it, one inside the CRC
        // field is not.
        let covered = !(self.phase == Phase::Trailer && self.trailer_got > 0);
        if covered && self.config.crc {
            self.crc.update(&self.marker_buf);
        }
        Ok((n, Flow::More))
    }

    /// The common case, taken in one step: an FPDU starts, without markers,
    /// and `rest` holds its ULPDU_Length and whole DDP header. Does what
    /// [`length_bytes`](Self::length_bytes) and the two
    /// [`header_bytes`](Self::header_bytes) steps would, in their order.
    /// `None` (nothing consumed, nothing changed) where the step-by-step
    /// path must run: too few octets, or a length or control field that
    /// fails, whose error that path reports.
    #[inline(always)]
    fn whole_header<'a, B>(
        &mut self,
        rest: &'a [u8],
        bufs: &mut B,
    ) -> Option<Result<Flow<'a>, RxError>>
    where
        B: PostedBuffers + ?Sized,
    {
        let (len, after) = rest.split_first_chunk::<ULPDU_LENGTH_LEN>()?;
        let ulen = u16::from_be_bytes(*len);
        if ulen < MIN_ULPDU_LEN || ulen > self.config.max_ulpdu_len {
            return None;
        }
        let ctrl = ControlField::parse(after).ok()?;
        let hlen = ctrl.header_len();
        if usize::from(ulen) < hlen || ctrl.check_versions().is_err() {
            return None;
        }
        // A copy of a length the compiler cannot know is a call to memcpy,
        // once per segment: one fixed-length copy per header length instead.
        if hlen == TAGGED_HEADER_LEN {
            copy_prefix::<TAGGED_HEADER_LEN>(&mut self.seg, after)?;
        } else {
            copy_prefix::<UNTAGGED_HEADER_LEN>(&mut self.seg, after)?;
        }
        let n = ULPDU_LENGTH_LEN.saturating_add(hlen);
        if self.config.crc {
            self.crc.update(rest.get(..n).unwrap_or(&[]));
        }
        self.len_buf = *len;
        self.len_got = ULPDU_LENGTH_LEN;
        self.ulen = ulen;
        self.hdr_len = hlen;
        self.seg_got = hlen;
        self.seg_need = hlen;
        self.current = None;
        self.fixed = None;
        self.phase = Phase::Header;
        // The octets used are `whole_header_len`: returned with the flow,
        // this 100-octet result was moved twice more per segment.
        Some(self.header_done(bufs))
    }

    /// The octets [`Receiver::whole_header`] used: the length field and
    /// the header (`hdr_len`, which only the next FPDU's header replaces).
    fn whole_header_len(&self) -> usize {
        ULPDU_LENGTH_LEN.saturating_add(self.hdr_len)
    }

    fn length_bytes<'a>(
        &mut self,
        rest: &'a [u8],
        avail: usize,
    ) -> Result<(usize, Flow<'a>), RxError> {
        let n = avail.min(ULPDU_LENGTH_LEN.saturating_sub(self.len_got));
        let (Some(src), Some(dst)) = (
            rest.get(..n),
            self.len_buf
                .get_mut(self.len_got..self.len_got.saturating_add(n)),
        ) else {
            return Err(self.internal());
        };
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
        self.framed(src, true)?;
        self.len_got = self.len_got.saturating_add(n);
        if self.len_got < ULPDU_LENGTH_LEN {
            return Ok((n, Flow::More));
        }
        let ulen = u16::from_be_bytes(self.len_buf);
        self.ulen = ulen;
        self.hdr_len = 0;
        if ulen < MIN_ULPDU_LEN || ulen > self.config.max_ulpdu_len {
            return Err(self.fail(
                RxErrorKind::UlpduLength(ulen),
                TermCode::Mpa(MpaCode::MarkerMismatch),
                false,
            ));
        }
        self.phase = Phase::Header;
        self.seg_got = 0;
        self.seg_need = CONTROL_LEN;
        self.current = None;
        self.fixed = None;
        Ok((n, Flow::More))
    }

    fn header_bytes<'a, B>(
        &mut self,
        rest: &'a [u8],
        avail: usize,
        bufs: &mut B,
    ) -> Result<(usize, Flow<'a>), RxError>
    where
        B: PostedBuffers + ?Sized,
    {
        let n = avail.min(self.seg_need.saturating_sub(self.seg_got));
        let (Some(src), Some(dst)) = (
            rest.get(..n),
            self.seg
                .get_mut(self.seg_got..self.seg_got.saturating_add(n)),
        ) else {
            return Err(self.internal());
        };
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
        self.framed(src, true)?;
        self.seg_got = self.seg_got.saturating_add(n);
        if self.seg_got < self.seg_need {
            return Ok((n, Flow::More));
        }
        let flow = match self.phase {
            Phase::Header if self.seg_need == CONTROL_LEN => {
                self.control_done()?;
                Flow::More
            }
            Phase::Header => self.header_done(bufs)?,
            Phase::Fixed => self.fixed_done()?,
            _ => return Err(self.internal()),
        };
        Ok((n, flow))
    }

    /// The control field is in: check what it says before the rest of the
    /// header arrives (same checks and order as `DdpHeader::parse`).
    fn control_done(&mut self) -> Result<(), RxError> {
        let ctrl = match ControlField::parse(&self.seg) {
            Ok(c) => c,
            Err(_) => return Err(self.internal()),
        };
        let hlen = ctrl.header_len();
        let available = usize::from(self.ulen);
        if available < hlen {
            let e = DdpError::Truncated {
                needed: hlen,
                available,
            };
            return Err(self.fail_segment(RxErrorKind::Ddp(e), e.into()));
        }
        if let Err(e) = ctrl.check_versions() {
            return Err(self.fail_segment(RxErrorKind::Ddp(e), e.into()));
        }
        self.hdr_len = hlen;
        self.seg_need = hlen;
        Ok(())
    }

    /// The DDP header is in: validate it and do the DDP bookkeeping.
    fn header_done<'a, B>(&mut self, bufs: &mut B) -> Result<Flow<'a>, RxError>
    where
        B: PostedBuffers + ?Sized,
    {
        let parsed = DdpHeader::parse(self.seg.get(..self.hdr_len).unwrap_or(&[]));
        let hdr = match parsed {
            Ok(h) => h,
            Err(e) => return Err(self.fail_segment(RxErrorKind::Ddp(e), e.into())),
        };
        let op = match rdmap::validate(&hdr, self.config.extensions) {
            Ok(op) => op,
            Err(e) => return Err(self.fail_segment(RxErrorKind::Rdmap(e), e.into())),
        };
        let payload = usize::from(self.ulen).saturating_sub(self.hdr_len);
        if !op.carries_ulp_data() {
            let mut check = rdmap::check_payload_len(op, payload);
            if check.is_ok() && payload > MAX_FIXED_LEN {
                // A Terminate longer than any Terminate can be.
                check = Err(RdmapError::PayloadLength {
                    opcode: op,
                    expected: terminate::MAX_LEN,
                    actual: payload,
                });
            }
            if let Err(e) = check {
                return Err(self.fail_segment(RxErrorKind::Rdmap(e), e.into()));
            }
        }
        // ulen <= u16::MAX, so this cannot saturate.
        let len = u32::try_from(payload).unwrap_or(u32::MAX);
        let (target, first) = match hdr.buffer {
            BufferFields::Tagged(t) => self.accept_tagged(op, &t, len, hdr.last)?,
            BufferFields::Untagged(u) => self.accept_untagged(op, &u, len, hdr.last, bufs)?,
        };
        let header = SegmentHeader {
            opcode: op,
            last: hdr.last,
            first,
            target,
            payload_len: len,
            invalidate_stag: rdmap::invalidate_stag(&hdr),
        };
        self.current = Some(header);
        self.placed = 0;
        if op.carries_ulp_data() {
            self.payload_left = len;
            self.enter_payload();
            Ok(Flow::Event(RxEvent::Header(header)))
        } else {
            self.phase = Phase::Fixed;
            self.seg_need = self.hdr_len.saturating_add(payload);
            Ok(Flow::More)
        }
    }

    /// Tagged bookkeeping; returns the target and whether the segment starts
    /// a message.
    fn accept_tagged(
        &mut self,
        op: Opcode,
        t: &TaggedFields,
        len: u32,
        last: bool,
    ) -> Result<(Target, bool), RxError> {
        let first = self.tagged.expected().is_none();
        if !first {
            if let Some(expected) = self.tagged_op {
                if expected != op {
                    let kind = RxErrorKind::OpcodeChanged { expected, got: op };
                    return Err(self.fail_segment(kind, UNEXPECTED_OPCODE));
                }
            }
        }
        if let Err(e) = self.tagged.accept(t, len, last) {
            return Err(self.fail_segment(RxErrorKind::Tagged(e), e.into()));
        }
        if !first && self.tagged_at_top && len > 0 {
            // The message already reached TO 2^64 - 1; TaggedStream accepts
            // TO 0 as its continuation, but that is a wrap.
            let e = TaggedError::ToWrap;
            return Err(self.fail_segment(RxErrorKind::Tagged(e), e.into()));
        }
        let total = if first {
            u64::from(len)
        } else {
            self.tagged_len.saturating_add(u64::from(len))
        };
        self.tagged_len = total;
        let reaches_top = len > 0 && t.to.checked_add(u64::from(len)).is_none();
        if last {
            self.tagged_op = None;
            self.tagged_at_top = false;
            self.message_len = Some(total);
        } else {
            self.tagged_op = Some(op);
            self.tagged_at_top = (self.tagged_at_top && !first) || reaches_top;
            self.message_len = None;
        }
        Ok((
            Target::Tagged {
                stag: t.stag,
                to: t.to,
            },
            first,
        ))
    }

    /// Untagged bookkeeping; returns the target and whether the segment
    /// starts a message.
    fn accept_untagged<B>(
        &mut self,
        op: Opcode,
        u: &UntaggedFields,
        len: u32,
        last: bool,
        bufs: &mut B,
    ) -> Result<(Target, bool), RxError>
    where
        B: PostedBuffers + ?Sized,
    {
        if u.qn >= self.config.queues {
            let e = UntaggedError::InvalidQn(u.qn);
            return Err(self.fail_segment(RxErrorKind::Untagged(e), e.into()));
        }
        let (in_progress, expected_msn) = match self.queues.queue(u.qn) {
            Ok(q) => (q.in_progress().is_some(), q.expected_msn()),
            Err(e) => return Err(self.fail_segment(RxErrorKind::Untagged(e), e.into())),
        };
        let slot = usize_from(u.qn);
        let msn_ok = u.msn == expected_msn;
        if in_progress && msn_ok {
            if let Some(Some(expected)) = self.queue_ops.get(slot).copied() {
                if expected != op {
                    let kind = RxErrorKind::OpcodeChanged { expected, got: op };
                    return Err(self.fail_segment(kind, UNEXPECTED_OPCODE));
                }
            }
        }
        let buffer = if !in_progress && msn_ok {
            match op.payload() {
                // The receiver has room for the Terminate itself.
                PayloadKind::Terminate => Some(u32::MAX),
                // Only the presence of a slot matters; the payload is
                // delivered in the event, not placed.
                PayloadKind::Fixed(_) => bufs.posted_len(u.qn, u.msn, op).map(|_| u32::MAX),
                PayloadKind::Ulp => bufs.posted_len(u.qn, u.msn, op),
            }
        } else {
            None
        };
        let accepted = self
            .queues
            .queue_mut(u.qn)
            .and_then(|q| q.accept(u.msn, u.mo, len, last, buffer));
        let placement = match accepted {
            Ok(p) => p,
            Err(e) => return Err(self.fail_segment(RxErrorKind::Untagged(e), e.into())),
        };
        if let Some(o) = self.queue_ops.get_mut(slot) {
            *o = if last { None } else { Some(op) };
        }
        self.message_len = placement.completed.map(u64::from);
        Ok((
            Target::Untagged {
                qn: u.qn,
                msn: u.msn,
                mo: u.mo,
            },
            !in_progress,
        ))
    }

    /// The fixed-format payload is in: parse it and announce the segment.
    fn fixed_done<'a>(&mut self) -> Result<Flow<'a>, RxError> {
        let Some(header) = self.current else {
            return Err(self.internal());
        };
        let body = self.seg.get(self.hdr_len..self.seg_need).unwrap_or(&[]);
        let fixed = match header.opcode {
            Opcode::RdmaReadRequest => ReadRequest::parse(body).map(FixedPayload::ReadRequest),
            Opcode::AtomicRequest => AtomicRequest::parse(body).map(FixedPayload::AtomicRequest),
            Opcode::AtomicResponse => AtomicResponse::parse(body).map(FixedPayload::AtomicResponse),
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                ImmediateData::parse(body).map(FixedPayload::ImmediateData)
            }
            Opcode::Terminate => Ok(FixedPayload::Terminate(TerminateRepr::parse(body))),
            _ => return Err(self.internal()),
        };
        let fixed = match fixed {
            Ok(f) => f,
            Err(e) => return Err(self.fail_segment(RxErrorKind::Rdmap(e), e.into())),
        };
        self.fixed = Some(fixed);
        self.payload_left = 0;
        self.enter_pad();
        Ok(Flow::Event(RxEvent::Header(header)))
    }

    fn enter_payload(&mut self) {
        if self.payload_left == 0 {
            self.enter_pad();
        } else {
            self.phase = Phase::Payload;
        }
    }

    fn enter_pad(&mut self) {
        self.pad_left = mpa::pad_len(usize::from(self.ulen));
        if self.pad_left == 0 {
            self.phase = Phase::Trailer;
            self.trailer_got = 0;
        } else {
            self.phase = Phase::Pad;
        }
    }

    /// The hot path: hands out the payload as a slice of the input.
    #[inline]
    fn payload_bytes<'a>(
        &mut self,
        rest: &'a [u8],
        avail: usize,
    ) -> Result<(usize, Flow<'a>), RxError> {
        let n = avail.min(usize_from(self.payload_left));
        let target = self.current.as_ref().map(|h| h.target);
        let (Some(data), Some(target), Ok(n32)) = (rest.get(..n), target, u32::try_from(n)) else {
            return Err(self.internal());
        };
        if n == 0 {
            self.enter_pad();
            return Ok((0, Flow::More));
        }
        self.framed(data, true)?;
        let target = target.advanced(self.placed);
        self.placed = self.placed.wrapping_add(n32);
        self.payload_left = self.payload_left.saturating_sub(n32);
        if self.payload_left == 0 {
            self.enter_pad();
        }
        Ok((n, Flow::Event(RxEvent::Data(Placement { target, data }))))
    }

    fn pad_bytes<'a>(
        &mut self,
        rest: &'a [u8],
        avail: usize,
    ) -> Result<(usize, Flow<'a>), RxError> {
        let n = avail.min(self.pad_left);
        let Some(src) = rest.get(..n) else {
            return Err(self.internal());
        };
        self.framed(src, true)?;
        self.pad_left = self.pad_left.saturating_sub(n);
        if self.pad_left == 0 {
            self.phase = Phase::Trailer;
            self.trailer_got = 0;
        }
        Ok((n, Flow::More))
    }

    fn trailer_bytes<'a>(
        &mut self,
        rest: &'a [u8],
        avail: usize,
    ) -> Result<(usize, Flow<'a>), RxError> {
        let n = avail.min(CRC_LEN.saturating_sub(self.trailer_got));
        let (Some(src), Some(dst)) = (
            rest.get(..n),
            self.trailer
                .get_mut(self.trailer_got..self.trailer_got.saturating_add(n)),
        ) else {
            return Err(self.internal());
        };
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
        self.framed(src, false)?;
        self.trailer_got = self.trailer_got.saturating_add(n);
        if self.trailer_got < CRC_LEN {
            return Ok((n, Flow::More));
        }
        let Some(header) = self.current else {
            return Err(self.internal());
        };
        let done = self.segment_done(header)?;
        Ok((n, Flow::Event(RxEvent::Done(done))))
    }

    /// The CRC field of the current segment (`header`) is in
    /// (`trailer`): checks it, with CRC on, and ends the segment (the
    /// stream, after a Terminate).
    #[inline(always)]
    fn segment_done(&mut self, header: SegmentHeader) -> Result<SegmentDone, RxError> {
        if self.config.crc {
            if let Err(e) = mpa::check_crc_trailer(self.crc.finish(), &self.trailer) {
                return Err(self.fail(RxErrorKind::Mpa(e), mpa_code(e), false));
            }
        }
        let done = SegmentDone {
            header,
            message_len: self.message_len,
        };
        if header.opcode == Opcode::Terminate {
            self.phase = Phase::Terminated;
        } else {
            self.start_fpdu();
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::super::crc32c::{crc32c, SoftCrc32c};
    use super::super::ddp::{Segmenter, UNTAGGED_HEADER_LEN};
    use super::super::mpa::{emit_fpdu, MarkerState};
    use super::super::rdmap::AtomicOp;
    use super::super::terminate::{
        HeaderControl, HeaderCopy, RemoteProtectionCode, TaggedCode, UntaggedCode,
    };
    use super::*;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    // --- harness -----------------------------------------------------------

    /// An event with its payload copied; adjacent placements that continue
    /// each other are merged so that different input splits compare equal.
    #[derive(Clone, Debug, PartialEq)]
    enum Ev {
        /// With the receiver's fixed payload at the event.
        Header(SegmentHeader, Option<FixedPayload>),
        Data(Target, Vec<u8>),
        Done(SegmentDone, Option<FixedPayload>),
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Outcome {
        events: Vec<Ev>,
        error: Option<RxError>,
        boundary: bool,
    }

    /// Checks the Header -> Data* -> Done order of every segment.
    #[derive(Default)]
    struct Order {
        open: Option<SegmentHeader>,
        placed: u64,
    }

    impl Order {
        /// `fixed`: the receiver's fixed payload at the event.
        fn check(&mut self, ev: &RxEvent<'_>, fixed: Option<&FixedPayload>) {
            let has_fixed = fixed.is_some();
            match ev {
                RxEvent::Header(h) => {
                    assert!(self.open.is_none(), "header inside a segment");
                    assert_eq!(has_fixed, !h.opcode.carries_ulp_data());
                    self.open = Some(*h);
                    self.placed = 0;
                }
                RxEvent::Data(p) => {
                    let h = self.open.expect("data outside a segment");
                    assert!(!has_fixed);
                    assert!(!p.data.is_empty());
                    assert_eq!(p.target, h.target.advanced(self.placed as u32));
                    self.placed += p.data.len() as u64;
                    assert!(self.placed <= u64::from(h.payload_len));
                }
                RxEvent::Done(d) => {
                    let h = self.open.take().expect("done outside a segment");
                    assert_eq!(d.header, h);
                    assert_eq!(d.message_len.is_some(), h.last);
                    assert_eq!(has_fixed, !h.opcode.carries_ulp_data());
                    if !has_fixed {
                        assert_eq!(self.placed, u64::from(h.payload_len));
                    }
                }
            }
        }
    }

    fn push(events: &mut Vec<Ev>, ev: RxEvent<'_>, fixed: Option<&FixedPayload>) {
        match ev {
            RxEvent::Data(p) => {
                if let Some(Ev::Data(t, bytes)) = events.last_mut() {
                    if t.advanced(bytes.len() as u32) == p.target {
                        bytes.extend_from_slice(p.data);
                        return;
                    }
                }
                events.push(Ev::Data(p.target, p.data.to_vec()));
            }
            RxEvent::Header(h) => events.push(Ev::Header(h, fixed.copied())),
            RxEvent::Done(d) => events.push(Ev::Done(d, fixed.copied())),
        }
    }

    /// Feeds `pieces` to a new receiver through `poll`, or (`whole`)
    /// through `poll_segment`, where a whole segment counts as its events;
    /// also returns how many segments came whole.
    fn run_by<B: PostedBuffers>(
        cfg: RxConfig,
        pieces: &[&[u8]],
        bufs: &mut B,
        whole: bool,
    ) -> (Outcome, usize) {
        let mut rx = Receiver::new(cfg, SoftCrc32c::new());
        let mut events = Vec::new();
        let mut order = Order::default();
        let mut wholes = 0;
        for piece in pieces {
            let mut rest: &[u8] = piece;
            loop {
                let before = rest.len();
                let polled = if whole {
                    rx.poll_segment(&mut rest, bufs)
                } else {
                    rx.poll(&mut rest, bufs).map(|ev| ev.map(Polled::Event))
                };
                match polled {
                    Ok(Some(p)) => {
                        assert!(rest.len() < before, "an event consumes input");
                        let evs: Vec<RxEvent<'_>> = match p {
                            Polled::Segment(w) => {
                                assert!(whole);
                                wholes += 1;
                                assert!(w.done.header.opcode.carries_ulp_data());
                                assert_eq!(rx.fixed_payload(), None);
                                assert_eq!(w.data.len(), w.done.header.payload_len as usize);
                                assert!(rx.at_fpdu_boundary());
                                // Between FPDUs an empty input has nothing
                                // to report (the driver relies on it).
                                let mut empty: &[u8] = &[];
                                assert_eq!(rx.poll_segment(&mut empty, bufs), Ok(None));
                                w.events().collect()
                            }
                            Polled::Event(ev) => vec![ev],
                        };
                        for ev in evs {
                            order.check(&ev, rx.fixed_payload());
                            push(&mut events, ev, rx.fixed_payload());
                        }
                    }
                    Ok(None) => {
                        assert!(rest.is_empty(), "Ok(None) consumes everything");
                        break;
                    }
                    Err(e) => {
                        assert_eq!(rx.error(), Some(&e));
                        assert_eq!(rx.feed(b"more", bufs), (0, Err(e)), "input refused");
                        assert_eq!(rx.feed(&[], bufs), (0, Err(e)));
                        let mut more: &[u8] = b"more";
                        assert_eq!(rx.poll_segment(&mut more, bufs), Err(e));
                        assert_eq!(more, b"more");
                        assert_eq!(rx.reject(UNEXPECTED_OPCODE), e, "first error wins");
                        assert!(e.terminate.is_consistent());
                        assert_eq!(e.code(), e.terminate.code);
                        let o = Outcome {
                            events,
                            error: Some(e),
                            boundary: false,
                        };
                        return (o, wholes);
                    }
                }
            }
        }
        let boundary = rx.at_fpdu_boundary();
        (
            Outcome {
                events,
                error: None,
                boundary,
            },
            wholes,
        )
    }

    fn run_with<B: PostedBuffers>(cfg: RxConfig, pieces: &[&[u8]], bufs: &mut B) -> Outcome {
        run_by(cfg, pieces, bufs, false).0
    }

    fn run(cfg: RxConfig, stream: &[u8]) -> Outcome {
        run_with(cfg, &[stream], &mut Unlimited)
    }

    /// An outcome as both ways of polling must agree on it: after an
    /// error, the failed segment's events (`poll` hands out a payload
    /// before its CRC is checked, `poll_segment` a whole segment only
    /// after) are left out.
    fn settled(mut o: Outcome) -> Outcome {
        if o.error.is_some() {
            let keep = o
                .events
                .iter()
                .rposition(|e| matches!(e, Ev::Done(..)))
                .map_or(0, |i| i + 1);
            o.events.truncate(keep);
        }
        o
    }

    /// `poll_segment` and `poll` agree on `pieces`; returns the number of
    /// whole segments.
    fn same_both_ways<B: PostedBuffers + Clone>(
        cfg: RxConfig,
        pieces: &[&[u8]],
        bufs: &B,
    ) -> usize {
        let by_event = run_with(cfg, pieces, &mut bufs.clone());
        let (by_segment, wholes) = run_by(cfg, pieces, &mut bufs.clone(), true);
        assert_eq!(settled(by_segment), settled(by_event), "{cfg:?}");
        wholes
    }

    fn cfg(crc: bool) -> RxConfig {
        RxConfig {
            extensions: Extensions::ALL,
            ..RxConfig::new(crc)
        }
    }

    fn marked_cfg(crc: bool, start: u32) -> RxConfig {
        RxConfig {
            markers: Some(start),
            ..cfg(crc)
        }
    }

    /// Frames a ULPDU (test-side, independent of `mpa::emit_fpdu`):
    /// ULPDU_Length, ULPDU, zero pad, CRC field (zero without CRC).
    fn frame(ulpdu: &[u8], crc: bool) -> Vec<u8> {
        let mut f = Vec::from((ulpdu.len() as u16).to_be_bytes());
        f.extend_from_slice(ulpdu);
        while f.len() % 4 != 0 {
            f.push(0);
        }
        let c = if crc { crc32c(&f) } else { 0 };
        f.extend_from_slice(&c.to_le_bytes());
        f
    }

    fn ulpdu_of(fpdu: &[u8]) -> &[u8] {
        let len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
        &fpdu[2..2 + len]
    }

    /// Builds a marked stream from ULPDUs starting at marker stream offset
    /// `start` (test-side, written from RFC 5044 section 5, independent of
    /// `mpa::MarkerState`).
    fn mark_stream(ulpdus: &[&[u8]], start: u32, crc: bool) -> Vec<u8> {
        fn marker(out: &mut Vec<u8>, pos: &mut u32, header: u32) {
            let ptr = if pos.wrapping_add(4) == header {
                0
            } else {
                pos.wrapping_sub(header)
            };
            out.extend_from_slice(&[0, 0, (ptr >> 8) as u8, ptr as u8]);
            *pos = pos.wrapping_add(4);
        }
        let mut out = Vec::new();
        let mut pos = start;
        for u in ulpdus {
            let framed = frame(u, false);
            let framed = &framed[..framed.len() - 4];
            let fstart = out.len();
            let header = if pos.is_multiple_of(512) {
                pos.wrapping_add(4)
            } else {
                pos
            };
            for &b in framed {
                if pos.is_multiple_of(512) {
                    marker(&mut out, &mut pos, header);
                }
                out.push(b);
                pos = pos.wrapping_add(1);
            }
            if pos.is_multiple_of(512) {
                marker(&mut out, &mut pos, header); // covered by the CRC
            }
            let c = if crc { crc32c(&out[fstart..]) } else { 0 };
            for (i, b) in c.to_le_bytes().into_iter().enumerate() {
                if i > 0 && pos.is_multiple_of(512) {
                    marker(&mut out, &mut pos, header); // not covered
                }
                out.push(b);
                pos = pos.wrapping_add(1);
            }
        }
        out
    }

    fn tg(stag: u32, to: u64) -> Target {
        Target::Tagged { stag, to }
    }

    fn ut(qn: u32, msn: u32, mo: u32) -> Target {
        Target::Untagged { qn, msn, mo }
    }

    fn hd(
        opcode: Opcode,
        last: bool,
        first: bool,
        target: Target,
        payload_len: u32,
        invalidate_stag: Option<u32>,
        fixed: Option<FixedPayload>,
    ) -> (SegmentHeader, Option<FixedPayload>) {
        let h = SegmentHeader {
            opcode,
            last,
            first,
            target,
            payload_len,
            invalidate_stag,
        };
        (h, fixed)
    }

    /// The events of one segment (its header and fixed payload, as from
    /// `hd`).
    fn seg_events(
        (h, fixed): (SegmentHeader, Option<FixedPayload>),
        data: &[u8],
        message_len: Option<u64>,
    ) -> Vec<Ev> {
        let mut v = vec![Ev::Header(h, fixed)];
        if !data.is_empty() {
            v.push(Ev::Data(h.target, data.to_vec()));
        }
        let done = SegmentDone {
            header: h,
            message_len,
        };
        v.push(Ev::Done(done, fixed));
        v
    }

    // --- byte-exact vectors, one per opcode (CRC field zero) ---------------

    /// RDMA Write, tagged, L: STag 0x11223344, TO 2^32, "hello", 3 pad.
    const WRITE: [u8; 28] = [
        0x00, 0x13, // ULPDU_Length 19
        0xc1, 0x40, // T L DV=1 | RV=1 op 0
        0x11, 0x22, 0x33, 0x44, // STag
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // TO
        b'h', b'e', b'l', b'l', b'o', 0, 0, 0, // payload, pad
        0, 0, 0, 0, // CRC
    ];

    /// RDMA Read Request, QN 1, MSN 1.
    const READ_REQUEST: [u8; 52] = [
        0x00, 0x2e, // 46
        0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, // QN 1 MSN 1 MO 0
        0xaa, 0xbb, 0xcc, 0xdd, // sink STag
        0, 0, 0, 0, 0, 0, 0x10, 0x00, // sink TO
        0x00, 0x00, 0x02, 0x00, // size
        0x01, 0x02, 0x03, 0x04, // source STag
        0, 0, 0, 0, 0, 0, 0x20, 0x00, // source TO
        0, 0, 0, 0,
    ];

    /// RDMA Read Response, tagged, L: STag 0xaabbccdd, TO 0x1000, "resp".
    const READ_RESPONSE: [u8; 24] = [
        0x00, 0x12, 0xc1, 0x42, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 0, 0, 0, 0x10, 0x00, b'r', b'e',
        b's', b'p', 0, 0, 0, 0,
    ];

    /// Send, QN 0, MSN 1, "abc", 1 pad.
    const SEND: [u8; 28] = [
        0x00, 0x15, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, b'a', b'b', b'c',
        0, 0, 0, 0, 0,
    ];

    /// Send with Invalidate 0xdeadbeef, MSN 2, [1, 2], 2 pad.
    const SEND_INV: [u8; 28] = [
        0x00, 0x14, 0x41, 0x44, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 1, 2,
        0, 0, 0, 0, 0, 0,
    ];

    /// Send with SE, MSN 3, empty.
    const SEND_SE: [u8; 24] = [
        0x00, 0x12, 0x41, 0x45, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    /// Send with SE and Invalidate 0x0badcafe, MSN 4, [0x7f], 3 pad.
    const SEND_SE_INV: [u8; 28] = [
        0x00, 0x13, 0x41, 0x46, 0x0b, 0xad, 0xca, 0xfe, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0x7f,
        0, 0, 0, 0, 0, 0, 0,
    ];

    /// Immediate Data, MSN 5.
    const IMMEDIATE: [u8; 32] = [
        0x00, 0x1a, 0x41, 0x48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6,
        7, 8, 0, 0, 0, 0,
    ];

    /// Immediate Data with SE, MSN 6.
    const IMMEDIATE_SE: [u8; 32] = [
        0x00, 0x1a, 0x41, 0x49, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0xf1, 0xf2, 0xf3,
        0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0, 0, 0, 0,
    ];

    /// Atomic Request (CmpSwap), QN 1, MSN 2.
    const ATOMIC_REQUEST: [u8; 76] = [
        0x00, 0x46, // 70
        0x41, 0x4a, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, // QN 1 MSN 2
        0x00, 0x00, 0x00, 0x02, // AOpCode CmpSwap
        0x00, 0x00, 0x00, 0x2a, // Request Identifier
        0xca, 0xfe, 0x00, 0x01, // Remote STag
        0, 0, 0, 0, 0, 0, 0x10, 0x08, // Remote TO
        1, 2, 3, 4, 5, 6, 7, 8, // Swap Data
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // Swap Mask
        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // Compare Data
        0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, // Compare Mask
        0, 0, 0, 0,
    ];

    /// Atomic Response, QN 3, MSN 1.
    const ATOMIC_RESPONSE: [u8; 36] = [
        0x00, 0x1e, 0x41, 0x4b, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x2a,
        0x80, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
    ];

    /// First segment of a two-segment RDMA Write (no L): STag 0x55, TO 0x10.
    const WRITE_A: [u8; 24] = [
        0x00, 0x11, 0x81, 0x40, 0, 0, 0, 0x55, 0, 0, 0, 0, 0, 0, 0, 0x10, 9, 8, 7, 0, 0, 0, 0, 0,
    ];

    /// Its last segment at TO 0x13.
    const WRITE_B: [u8; 24] = [
        0x00, 0x10, 0xc1, 0x40, 0, 0, 0, 0x55, 0, 0, 0, 0, 0, 0, 0, 0x13, 6, 5, 0, 0, 0, 0, 0, 0,
    ];

    /// First segment of a two-segment Send, MSN 7, "abcd".
    const SEND_A: [u8; 28] = [
        0x00, 0x16, 0x01, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, b'a', b'b', b'c',
        b'd', 0, 0, 0, 0,
    ];

    /// Its last segment at MO 4, "ef".
    const SEND_B: [u8; 28] = [
        0x00, 0x14, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 4, b'e', b'f', 0, 0,
        0, 0, 0, 0,
    ];

    /// The DDP header of a Send the peer found out of MSN range.
    const BAD_SEND_HDR: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0];

    /// Terminate, QN 2, MSN 1: DDP untagged MSN range, M D, length 4.
    const TERMINATE: [u8; 48] = [
        0x00, 0x2a, 0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, // header
        0x12, 0x03, 0xc0, 0x00, 0x00, 0x04, // control, segment length
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, // copied header
        0, 0, 0, 0,
    ];

    /// Every vector, in an order that is a valid stream.
    fn all_vectors() -> Vec<&'static [u8]> {
        vec![
            &WRITE,
            &READ_REQUEST,
            &READ_RESPONSE,
            &SEND,
            &SEND_INV,
            &SEND_SE,
            &SEND_SE_INV,
            &IMMEDIATE,
            &IMMEDIATE_SE,
            &ATOMIC_REQUEST,
            &ATOMIC_RESPONSE,
            &WRITE_A,
            &SEND_A,
            &WRITE_B,
            &SEND_B,
            &TERMINATE,
        ]
    }

    fn atomic_request() -> AtomicRequest {
        AtomicRequest {
            op: AtomicOp::CmpSwap,
            request_id: 42,
            remote_stag: 0xcafe_0001,
            remote_to: 0x1008,
            add_or_swap_data: 0x0102_0304_0506_0708,
            add_or_swap_mask: u64::MAX,
            compare_data: 0x1112_1314_1516_1718,
            compare_mask: 0xffff_ffff_0000_0000,
        }
    }

    fn received_terminate() -> TerminateRepr {
        TerminateRepr {
            code: TermCode::DdpUntagged(UntaggedCode::MsnRange),
            hdrct: HeaderControl {
                m: true,
                d: true,
                r: false,
            },
            ddp_segment_length: 4,
            ddp_header: HeaderCopy::from_segment(&BAD_SEND_HDR),
            read_request: None,
        }
    }

    /// The events of `all_vectors()`, written out by hand.
    fn expected_events() -> Vec<Ev> {
        use Opcode::*;
        let rr = ReadRequest {
            sink_stag: 0xaabb_ccdd,
            sink_to: 0x1000,
            read_size: 0x200,
            source_stag: 0x0102_0304,
            source_to: 0x2000,
        };
        let imm = |data| Some(FixedPayload::ImmediateData(rdmap::ImmediateData { data }));
        let mut v = Vec::new();
        let w = hd(
            RdmaWrite,
            true,
            true,
            tg(0x1122_3344, 1 << 32),
            5,
            None,
            None,
        );
        v.extend(seg_events(w, b"hello", Some(5)));
        let h = hd(
            RdmaReadRequest,
            true,
            true,
            ut(1, 1, 0),
            28,
            None,
            Some(FixedPayload::ReadRequest(rr)),
        );
        v.extend(seg_events(h, &[], Some(28)));
        let h = hd(
            RdmaReadResponse,
            true,
            true,
            tg(0xaabb_ccdd, 0x1000),
            4,
            None,
            None,
        );
        v.extend(seg_events(h, b"resp", Some(4)));
        let h = hd(Send, true, true, ut(0, 1, 0), 3, None, None);
        v.extend(seg_events(h, b"abc", Some(3)));
        let h = hd(
            SendInvalidate,
            true,
            true,
            ut(0, 2, 0),
            2,
            Some(0xdead_beef),
            None,
        );
        v.extend(seg_events(h, &[1, 2], Some(2)));
        let h = hd(SendSe, true, true, ut(0, 3, 0), 0, None, None);
        v.extend(seg_events(h, &[], Some(0)));
        let h = hd(
            SendSeInvalidate,
            true,
            true,
            ut(0, 4, 0),
            1,
            Some(0x0bad_cafe),
            None,
        );
        v.extend(seg_events(h, &[0x7f], Some(1)));
        let h = hd(
            ImmediateData,
            true,
            true,
            ut(0, 5, 0),
            8,
            None,
            imm([1, 2, 3, 4, 5, 6, 7, 8]),
        );
        v.extend(seg_events(h, &[], Some(8)));
        let data = [0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8];
        let h = hd(ImmediateDataSe, true, true, ut(0, 6, 0), 8, None, imm(data));
        v.extend(seg_events(h, &[], Some(8)));
        let f = Some(FixedPayload::AtomicRequest(atomic_request()));
        let h = hd(AtomicRequest, true, true, ut(1, 2, 0), 52, None, f);
        v.extend(seg_events(h, &[], Some(52)));
        let f = Some(FixedPayload::AtomicResponse(super::AtomicResponse {
            request_id: 42,
            original_value: 0x8000_0000_0000_0001,
        }));
        let h = hd(AtomicResponse, true, true, ut(3, 1, 0), 12, None, f);
        v.extend(seg_events(h, &[], Some(12)));
        let h = hd(RdmaWrite, false, true, tg(0x55, 0x10), 3, None, None);
        v.extend(seg_events(h, &[9, 8, 7], None));
        let h = hd(Send, false, true, ut(0, 7, 0), 4, None, None);
        v.extend(seg_events(h, b"abcd", None));
        let h = hd(RdmaWrite, true, false, tg(0x55, 0x13), 2, None, None);
        v.extend(seg_events(h, &[6, 5], Some(5)));
        let h = hd(Send, true, false, ut(0, 7, 4), 2, None, None);
        v.extend(seg_events(h, b"ef", Some(6)));
        let f = Some(FixedPayload::Terminate(Ok(received_terminate())));
        let h = hd(Terminate, true, true, ut(2, 1, 0), 24, None, f);
        v.extend(seg_events(h, &[], Some(24)));
        v
    }

    fn expected_outcome() -> Outcome {
        Outcome {
            events: expected_events(),
            error: None,
            boundary: true,
        }
    }

    /// The stream of all vectors for a configuration: plain, with CRCs, or
    /// with markers from `start`.
    fn stream(crc: bool, markers: Option<u32>) -> Vec<u8> {
        let vs = all_vectors();
        match markers {
            Some(start) => {
                let ulpdus: Vec<&[u8]> = vs.iter().map(|v| ulpdu_of(v)).collect();
                mark_stream(&ulpdus, start, crc)
            }
            None => vs.iter().flat_map(|v| frame(ulpdu_of(v), crc)).collect(),
        }
    }

    /// Marker start offsets exercising every position of a marker relative
    /// to the fields (unaligned ones included), and the 2^32 wrap.
    const MARKER_STARTS: [u32; 9] = [0, 4, 100, 300, 508, 510, 511, 1, u32::MAX - 99];

    fn configs() -> Vec<RxConfig> {
        let mut v = vec![cfg(false), cfg(true)];
        for start in MARKER_STARTS {
            v.push(marked_cfg(false, start));
            v.push(marked_cfg(true, start));
        }
        v
    }

    fn stream_for(c: &RxConfig) -> Vec<u8> {
        stream(c.crc, c.markers)
    }

    // --- vectors -----------------------------------------------------------

    #[test]
    fn vectors_are_well_framed() {
        for v in all_vectors() {
            assert_eq!(frame(ulpdu_of(v), false), v, "{v:02x?}");
            assert_eq!(v.len() % 4, 0);
        }
    }

    #[test]
    fn every_opcode_plain_crc_and_markers() {
        for c in configs() {
            let s = stream_for(&c);
            assert_eq!(run(c, &s), expected_outcome(), "{c:?}");
        }
    }

    #[test]
    fn each_vector_alone() {
        // Every vector on a fresh receiver (the ones depending on earlier
        // messages are preceded by them).
        let vs = all_vectors();
        let expected = expected_events();
        let mut at = 0;
        for (i, v) in vs.iter().enumerate() {
            let prefix: Vec<u8> = vs[..i].concat();
            let out = run(cfg(false), &[prefix.as_slice(), v].concat());
            let before = run(cfg(false), &prefix).events.len();
            let n = out.events.len() - before;
            assert_eq!(&out.events[before..], &expected[at..at + n], "vector {i}");
            at += n;
        }
        assert_eq!(at, expected.len());
    }

    #[test]
    fn crc_vectors_byte_exact() {
        // CRCs computed independently of this crate.
        let mut send = SEND;
        send[24..].copy_from_slice(&[0x44, 0x70, 0x65, 0xaa]);
        assert_eq!(frame(ulpdu_of(&SEND), true), send);
        let mut write = WRITE;
        write[24..].copy_from_slice(&[0xb3, 0x32, 0x2c, 0x35]);
        assert_eq!(frame(ulpdu_of(&WRITE), true), write);
        let out = run(cfg(true), &[write.as_slice(), &send].concat());
        assert_eq!(out.error, None);
        assert_eq!(&out.events[..3], &expected_events()[..3]);
        assert_eq!(out.events[4], Ev::Data(ut(0, 1, 0), b"abc".to_vec()));
        // Without CRC the field is not checked.
        let out = run(cfg(false), &send);
        assert_eq!(out.error, None);
        assert_eq!(out.events.len(), 3);
    }

    #[test]
    fn marker_vector_byte_exact() {
        // Send of 1..=10 starting at stream offset 504 with CRC: the marker
        // at 512 (FPDUPTR 8) splits the DDP header (computed independently).
        let wire: [u8; 40] = [
            0x00, 0x1c, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, // 504..512
            0x00, 0x00, 0x00, 0x08, // marker
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
            0x00, // QN MSN MO
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, // payload, pad
            0xb5, 0x8c, 0xd2, 0x5d, // CRC
        ];
        let ulpdu = [
            0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
            10,
        ];
        assert_eq!(mark_stream(&[&ulpdu], 504, true), wire);
        let mut ms = MarkerState::at(504);
        let mut out = [0u8; 40];
        let mut crc = SoftCrc32c::new();
        assert_eq!(
            emit_fpdu(&ulpdu, Some(&mut ms), Some(&mut crc), &mut out),
            Ok(40)
        );
        assert_eq!(out, wire, "mpa.rs agrees");
        let mut rx = Receiver::new(marked_cfg(true, 504), SoftCrc32c::new());
        let mut rest: &[u8] = &wire;
        let mut n = 0;
        while let Some(ev) = rx.poll(&mut rest, &mut Unlimited).unwrap() {
            if let RxEvent::Data(p) = ev {
                assert_eq!(p.data, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
            }
            n += 1;
        }
        assert_eq!(n, 3);
        assert_eq!(rx.stream_pos(), Some(544));
        // A payload split by a marker: two placements.
        let ulpdu = [&ulpdu[..18], &[0x5a; 40]].concat();
        let wire = mark_stream(&[&ulpdu], 480, false);
        assert_eq!(&wire[32..36], &[0, 0, 0, 32]);
        let mut rx = Receiver::new(marked_cfg(false, 480), SoftCrc32c::new());
        let mut rest: &[u8] = &wire;
        let mut data = Vec::new();
        while let Some(ev) = rx.poll(&mut rest, &mut Unlimited).unwrap() {
            if let RxEvent::Data(p) = ev {
                data.push((p.target, p.data.len()));
            }
        }
        assert_eq!(data, vec![(ut(0, 1, 0), 12), (ut(0, 1, 12), 28)]);
    }

    #[test]
    fn every_split_and_byte_at_a_time() {
        for c in configs() {
            let s = stream_for(&c);
            let whole = run(c, &s);
            assert_eq!(whole, expected_outcome(), "{c:?}");
            for i in 0..=s.len() {
                let (a, b) = s.split_at(i);
                assert_eq!(
                    run_with(c, &[a, b], &mut Unlimited),
                    whole,
                    "{c:?} split {i}"
                );
            }
            let bytes: Vec<&[u8]> = s.chunks(1).collect();
            assert_eq!(run_with(c, &bytes, &mut Unlimited), whole, "{c:?} bytewise");
            let threes: Vec<&[u8]> = s.chunks(3).collect();
            assert_eq!(run_with(c, &threes, &mut Unlimited), whole, "{c:?} by 3");
        }
    }

    /// `poll_segment` gives what `poll` gives, whole segments where they
    /// lie whole in the input, events elsewhere.
    #[test]
    fn whole_segments_match_events() {
        for c in configs() {
            let s = stream_for(&c);
            let wholes = same_both_ways(c, &[&s], &Unlimited);
            // Every ULP-data segment of the vectors comes whole without
            // markers, none with them.
            let data_segments = expected_events()
                .iter()
                .filter(|e| matches!(e, Ev::Header(_, None)))
                .count();
            assert!(data_segments > 0);
            let want = if c.markers.is_none() {
                data_segments
            } else {
                0
            };
            assert_eq!(wholes, want, "{c:?}");
            for i in 0..=s.len() {
                let (a, b) = s.split_at(i);
                same_both_ways(c, &[a, b], &Unlimited);
            }
            let bytes: Vec<&[u8]> = s.chunks(1).collect();
            assert_eq!(same_both_ways(c, &bytes, &Unlimited), 0, "{c:?} bytewise");
        }
    }

    /// A CRC error in a whole segment: the error, and no payload handed
    /// out before it.
    #[test]
    fn whole_segment_crc_error_places_nothing() {
        let mut f = frame(ulpdu_of(&WRITE), true);
        let last = f.len() - 1;
        f[last] ^= 1;
        let mut rx = Receiver::new(cfg(true), SoftCrc32c::new());
        let mut rest: &[u8] = &f;
        let e = rx.poll_segment(&mut rest, &mut Unlimited).unwrap_err();
        assert!(
            matches!(e.kind, RxErrorKind::Mpa(MpaError::BadCrc { .. })),
            "{e:?}"
        );
        assert_eq!(e, run(cfg(true), &f).error.unwrap());
        // poll hands out the header (and the payload) before the CRC
        // field: a caller refusing the segment there would end the stream
        // with its own code instead.
        let mut rx = Receiver::new(cfg(true), SoftCrc32c::new());
        let mut rest: &[u8] = &f;
        assert!(matches!(
            rx.poll(&mut rest, &mut Unlimited),
            Ok(Some(RxEvent::Header(_)))
        ));
        let code = TermCode::DdpTagged(TaggedCode::InvalidStag);
        assert_eq!(rx.reject(code).kind, RxErrorKind::Rejected);
        // Intact, it comes whole, its payload the Write's.
        let f = frame(ulpdu_of(&WRITE), true);
        let mut rx = Receiver::new(cfg(true), SoftCrc32c::new());
        let mut rest: &[u8] = &f;
        let Ok(Some(Polled::Segment(w))) = rx.poll_segment(&mut rest, &mut Unlimited) else {
            panic!("not whole");
        };
        assert!(rest.is_empty());
        assert_eq!(w.data, &ulpdu_of(&WRITE)[14..]);
        assert_eq!(w.done.header.opcode, Opcode::RdmaWrite);
    }

    /// `reject` after a whole segment reports that segment, as after its
    /// `Done` event.
    #[test]
    fn reject_after_whole_segment() {
        let code = TermCode::DdpTagged(TaggedCode::InvalidStag);
        let (by_event, _) = reject_at(&WRITE, |ev| matches!(ev, RxEvent::Done(_)), code);
        let mut rx = Receiver::new(cfg(false), SoftCrc32c::new());
        let mut rest: &[u8] = &WRITE;
        assert!(matches!(
            rx.poll_segment(&mut rest, &mut Unlimited),
            Ok(Some(Polled::Segment(_)))
        ));
        assert_eq!(rx.reject(code), by_event);
        with_ddp_header(&by_event, &WRITE[2..16], 5);
    }

    /// Found by the `rx_stream` fuzz target: `stream_pos()` left out the
    /// octets of a marker received in part, and `at_fpdu_boundary()` held
    /// once the next FPDU's leading marker had arrived.
    #[test]
    fn marker_in_progress_counts() {
        let mut rx = Receiver::new(marked_cfg(false, 0), SoftCrc32c::new());
        assert!(rx.at_fpdu_boundary());
        assert_eq!(rx.feed(&[0, 0], &mut Unlimited), (2, Ok(None)));
        assert_eq!(rx.stream_pos(), Some(2));
        assert!(!rx.at_fpdu_boundary());
        assert_eq!(rx.feed(&[0, 0], &mut Unlimited), (2, Ok(None)));
        assert_eq!(rx.stream_pos(), Some(4));
        assert!(!rx.at_fpdu_boundary(), "leading marker received");
        // An empty Send (24 octets) ending right at a marker position: that
        // marker leads the next FPDU.
        let send = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        let wire = mark_stream(&[&send], 488, false);
        assert_eq!(wire.len(), 24);
        let mut rx = Receiver::new(marked_cfg(false, 488), SoftCrc32c::new());
        let mut rest: &[u8] = &wire;
        let mut n = 0;
        while rx.poll(&mut rest, &mut Unlimited).unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 2, "Header and Done");
        assert!(rx.at_fpdu_boundary());
        assert_eq!(rx.stream_pos(), Some(512));
        assert_eq!(rx.feed(&[0, 0, 0], &mut Unlimited), (3, Ok(None)));
        assert_eq!(rx.stream_pos(), Some(515));
        assert_eq!(rx.feed(&[0], &mut Unlimited), (1, Ok(None)));
        assert_eq!(rx.stream_pos(), Some(516));
        assert!(!rx.at_fpdu_boundary(), "the next FPDU's marker arrived");
    }

    /// `at_message_end`: at the start, after a message's last segment, and
    /// not inside a message (between its segments or inside an FPDU).
    #[test]
    fn message_end_is_reported() {
        let mut rx = Receiver::new(cfg(false), SoftCrc32c::new());
        assert!(rx.at_message_end(), "nothing received");
        let mut drain = |rx: &mut Receiver<SoftCrc32c>, mut input: &[u8]| {
            while rx
                .poll_segment(&mut input, &mut Unlimited)
                .unwrap()
                .is_some()
            {}
            assert!(input.is_empty());
        };
        drain(&mut rx, &WRITE_A);
        assert!(rx.at_fpdu_boundary());
        assert!(!rx.at_message_end(), "first of two segments");
        drain(&mut rx, &WRITE_B[..5]);
        assert!(!rx.at_message_end(), "inside the last FPDU");
        drain(&mut rx, &WRITE_B[5..]);
        assert!(rx.at_message_end(), "after the last segment");
        drain(&mut rx, &READ_REQUEST[..1]);
        assert!(!rx.at_message_end(), "the next FPDU began");
        drain(&mut rx, &READ_REQUEST[1..]);
        assert!(rx.at_message_end(), "a one-segment message");
    }

    #[test]
    fn partial_input_is_consumed() {
        let mut rx = Receiver::new(cfg(false), SoftCrc32c::new());
        assert_eq!(rx.feed(&WRITE[..10], &mut Unlimited), (10, Ok(None)));
        assert!(!rx.at_fpdu_boundary());
        assert_eq!(rx.current(), None);
        let (n, r) = rx.feed(&WRITE[10..], &mut Unlimited);
        assert_eq!(n, 6, "stops after the header");
        assert!(matches!(r, Ok(Some(RxEvent::Header(_)))));
        let (n, r) = rx.feed(&WRITE[16..], &mut Unlimited);
        assert_eq!(n, 5);
        assert!(matches!(r, Ok(Some(RxEvent::Data(p))) if p.data == b"hello"));
        assert_eq!(rx.feed(&WRITE[21..27], &mut Unlimited), (6, Ok(None)));
        let (n, r) = rx.feed(&WRITE[27..], &mut Unlimited);
        assert_eq!(n, 1);
        assert!(matches!(r, Ok(Some(RxEvent::Done(_)))));
        assert!(rx.at_fpdu_boundary());
        assert_eq!(rx.feed(&[], &mut Unlimited), (0, Ok(None)));
        assert_eq!(rx.current().unwrap().opcode, Opcode::RdmaWrite);
        assert_eq!(rx.expected_msn(0), Some(1));
        assert_eq!(rx.expected_msn(4), None);
        assert!(!rx.is_terminated());
        assert_eq!(rx.error(), None);
    }

    #[test]
    fn config_helpers() {
        let n = Negotiated {
            revision: mpa::Revision::V2,
            crc: true,
            markers_rx: true,
            markers_tx: false,
            enhanced: true,
            ird: 1,
            ord: 1,
            p2p: false,
            rtr: None,
            peer_reserved: 0,
        };
        let c = RxConfig::from_negotiated(&n, Extensions::ALL);
        assert_eq!(c.markers, Some(0));
        assert!(c.crc);
        assert_eq!(c.extensions, Extensions::ALL);
        assert_eq!(RxConfig::default(), RxConfig::new(false));
        let rx = Receiver::new(
            RxConfig {
                queues: 99,
                ..RxConfig::default()
            },
            SoftCrc32c::new(),
        );
        assert_eq!(rx.config().queues, QUEUE_COUNT as u32);
        assert_eq!(MAX_FIXED_LEN, 52);
        assert_eq!(HEADER_BUF_LEN, 70);
        // Small enough to return by value on every call.
        assert!(core::mem::size_of::<RxError>() <= 128);
        assert!(core::mem::size_of::<Result<Option<RxEvent<'_>>, RxError>>() <= 192);
    }

    // --- fatal errors ------------------------------------------------------

    /// Runs `stream` and returns its error, checking the wire code.
    fn error_of(c: RxConfig, stream: &[u8], wire: (u8, u8, u8)) -> RxError {
        error_with(c, stream, &mut Unlimited, wire)
    }

    fn error_with<B: PostedBuffers>(
        c: RxConfig,
        stream: &[u8],
        bufs: &mut B,
        wire: (u8, u8, u8),
    ) -> RxError {
        let out = run_with(c, &[stream], bufs);
        let e = out.error.expect("an error");
        assert_eq!(e.code().wire(), wire, "{e:?}");
        assert!(e.should_send_terminate() || e.kind == RxErrorKind::DataAfterTerminate);
        e
    }

    fn headerless(e: &RxError) {
        assert_eq!(e.terminate, TerminateRepr::new(e.code()), "{e:?}");
    }

    /// The Terminate carries the DDP header `hdr` (M D) with `len`.
    fn with_ddp_header(e: &RxError, hdr: &[u8], len: u16) {
        let t = e.terminate;
        assert_eq!(
            t.hdrct,
            HeaderControl {
                m: true,
                d: true,
                r: false
            },
            "{e:?}"
        );
        assert_eq!(t.ddp_header.unwrap().as_bytes(), hdr);
        assert_eq!(t.ddp_segment_length, len);
        assert_eq!(t.read_request, None);
    }

    #[test]
    fn bad_ulpdu_lengths() {
        for len in [0u16, 1, 13] {
            let mut s = vec![(len >> 8) as u8, len as u8];
            // Detected as soon as the length field is in.
            let e = error_of(cfg(false), &s, (2, 0, 3));
            assert_eq!(e.kind, RxErrorKind::UlpduLength(len));
            headerless(&e);
            s.extend_from_slice(&[0; 20]);
            assert_eq!(error_of(cfg(true), &s, (2, 0, 3)), e);
        }
        let limited = RxConfig {
            max_ulpdu_len: 100,
            ..cfg(false)
        };
        let e = error_of(limited, &[0, 101], (2, 0, 3));
        assert_eq!(e.kind, RxErrorKind::UlpduLength(101));
        let ok = frame(&[&SEND[2..20], &[0u8; 82]].concat(), false);
        assert_eq!(run(limited, &ok).error, None);
        // An untagged header in a 17-octet ULPDU.
        let mut s = SEND;
        s[1] = 17;
        let e = error_of(cfg(false), &s[..4], (2, 0, 3));
        assert_eq!(
            e.kind,
            RxErrorKind::Ddp(DdpError::Truncated {
                needed: 18,
                available: 17
            })
        );
        headerless(&e);
        // 14 octets are enough for a tagged header (zero-length Write).
        let w = frame(&WRITE[2..16], false);
        assert_eq!(run(cfg(false), &w).events.len(), 2);
    }

    #[test]
    fn crc_errors() {
        let good = frame(ulpdu_of(&SEND), true);
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            let out = run(cfg(true), &bad);
            assert!(
                !out.events.iter().any(|e| matches!(e, Ev::Done(..))),
                "octet {i}"
            );
            let Some(e) = out.error else {
                // A longer ULPDU_Length: still waiting for the rest.
                assert!(i < 2 && !out.boundary);
                continue;
            };
            if i < 24 {
                // Length, header (as a DDP error or a CRC error), payload, pad.
                if i >= 20 {
                    assert!(matches!(e.kind, RxErrorKind::Mpa(MpaError::BadCrc { .. })));
                    assert_eq!(e.code().wire(), (2, 0, 2));
                    headerless(&e);
                    // The segment was announced and placed, never completed.
                    assert!(matches!(
                        out.events.last(),
                        Some(Ev::Data(..)) | Some(Ev::Header(..))
                    ));
                }
            } else {
                assert_eq!(
                    e.kind,
                    RxErrorKind::Mpa(MpaError::BadCrc {
                        computed: 0xaa65_7044,
                        received: u32::from_le_bytes(bad[24..28].try_into().unwrap()),
                    })
                );
                headerless(&e);
            }
        }
        // Pad octets are covered even though their value is ignored.
        let mut bad = good.clone();
        bad[23] = 1;
        let e = error_of(cfg(true), &bad, (2, 0, 2));
        assert!(matches!(e.kind, RxErrorKind::Mpa(MpaError::BadCrc { .. })));
        let mut unchecked = frame(ulpdu_of(&SEND), false);
        unchecked[23] = 1;
        assert_eq!(run(cfg(false), &unchecked).error, None);
        // A marker covered by the CRC: its reserved half is not checked but
        // is covered.
        let s = mark_stream(&[ulpdu_of(&SEND)], 0, true);
        let mut bad = s.clone();
        bad[0] = 0xff;
        assert!(matches!(
            error_of(marked_cfg(true, 0), &bad, (2, 0, 2)).kind,
            RxErrorKind::Mpa(MpaError::BadCrc { .. })
        ));
        let s = mark_stream(&[ulpdu_of(&SEND)], 0, false);
        let mut res = s.clone();
        res[0] = 0xff;
        assert_eq!(run(marked_cfg(false, 0), &res).error, None);
    }

    #[test]
    fn marker_errors() {
        for start in MARKER_STARTS {
            for crc in [false, true] {
                let s = stream(crc, Some(start));
                let c = marked_cfg(crc, start);
                // Every marker position: damage its FPDUPTR.
                let mut pos = start;
                let mut hits = 0;
                for i in 0..s.len() {
                    if pos.is_multiple_of(512) && i + 4 <= s.len() {
                        let mut bad = s.clone();
                        bad[i + 2] ^= 0x01;
                        let e = error_of(c, &bad, (2, 0, 3));
                        assert!(
                            matches!(e.kind, RxErrorKind::Mpa(MpaError::MarkerMismatch { .. })),
                            "{e:?}"
                        );
                        headerless(&e);
                        // The two low bits are ignored.
                        let mut low = s.clone();
                        low[i + 3] ^= 0x03;
                        let out = run(c, &low);
                        if crc {
                            assert!(matches!(
                                out.error.unwrap().kind,
                                RxErrorKind::Mpa(MpaError::BadCrc { .. })
                            ));
                        } else {
                            assert_eq!(out, expected_outcome());
                        }
                        hits += 1;
                    }
                    pos = pos.wrapping_add(1);
                }
                assert!(hits >= 1, "start {start}");
            }
        }
    }

    #[test]
    fn version_errors() {
        let mut w = WRITE;
        w[2] = 0xc2; // DV = 2
        let e = error_of(cfg(false), &w[..4], (1, 1, 0x04));
        assert_eq!(
            e.kind,
            RxErrorKind::Ddp(DdpError::DdpVersion {
                tagged: true,
                version: 2
            })
        );
        headerless(&e);
        let mut s = SEND;
        s[2] = 0x40; // DV = 0
        let e = error_of(cfg(false), &s, (1, 2, 0x06));
        headerless(&e);
        let mut s = SEND;
        s[3] = 0x83; // RV = 2
        let e = error_of(cfg(false), &s, (0, 2, 0x05));
        assert_eq!(
            e.kind,
            RxErrorKind::Ddp(DdpError::RdmapVersion { version: 2 })
        );
        headerless(&e);
        // Reserved bits are ignored.
        let mut s = SEND;
        s[2] |= 0x3c;
        s[3] |= 0x30;
        assert_eq!(run(cfg(false), &s).error, None);
    }

    #[test]
    fn opcode_errors() {
        let mut s = SEND;
        s[3] = 0x4c;
        let e = error_of(cfg(false), &s, (0, 2, 0x06));
        assert_eq!(e.kind, RxErrorKind::Rdmap(RdmapError::UnknownOpcode(0xc)));
        headerless(&e);
        for (v, op) in [
            (&IMMEDIATE[..], Opcode::ImmediateData),
            (&ATOMIC_RESPONSE[..], Opcode::AtomicResponse),
        ] {
            let e = error_of(RxConfig::new(false), v, (0, 2, 0x06));
            assert_eq!(
                e.kind,
                RxErrorKind::Rdmap(RdmapError::ExtensionDisabled(op))
            );
            headerless(&e);
        }
        // T set on a Send (the 14-octet tagged header fits the ULPDU).
        let mut s = SEND;
        s[2] = 0xc1;
        let e = error_of(cfg(false), &s, (0, 2, 0x06));
        assert_eq!(
            e.kind,
            RxErrorKind::Rdmap(RdmapError::TaggedMismatch {
                opcode: Opcode::Send,
                tagged: true
            })
        );
        // T clear on a Write whose ULPDU is long enough for 18 octets.
        let mut w = WRITE;
        w[2] = 0x41;
        let e = error_of(cfg(false), &w, (0, 2, 0x06));
        assert!(matches!(
            e.kind,
            RxErrorKind::Rdmap(RdmapError::TaggedMismatch { .. })
        ));
    }

    #[test]
    fn queue_errors() {
        // Send on QN 1: Invalid QN, DDP header attached.
        let mut s = SEND;
        s[11] = 1;
        let e = error_of(cfg(false), &s, (1, 2, 0x01));
        assert_eq!(
            e.kind,
            RxErrorKind::Rdmap(RdmapError::WrongQueue {
                opcode: Opcode::Send,
                qn: 1
            })
        );
        with_ddp_header(&e, &s[2..20], 3);
        // QN beyond the configured queues.
        let three = RxConfig {
            queues: 3,
            ..cfg(false)
        };
        let e = error_of(three, &ATOMIC_RESPONSE, (1, 2, 0x01));
        assert_eq!(e.kind, RxErrorKind::Untagged(UntaggedError::InvalidQn(3)));
        with_ddp_header(&e, &ATOMIC_RESPONSE[2..20], 12);
    }

    #[test]
    fn msn_range_terminate_vector() {
        // A Send with MSN 7 and 4 octets where MSN 1 is expected: the
        // Terminate upstream siw would send (terminate.rs vector).
        let seg = [&BAD_SEND_HDR[..], &[0xde, 0xad, 0xbe, 0xef]].concat();
        let e = error_of(cfg(true), &frame(&seg, true), (1, 2, 0x03));
        assert_eq!(
            e.kind,
            RxErrorKind::Untagged(UntaggedError::MsnRange {
                expected: 1,
                got: 7
            })
        );
        let mut out = [0u8; 64];
        assert_eq!(e.terminate.emit_message(1, &mut out), Ok(42));
        assert_eq!(
            &out[..42],
            &[
                0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, // DDP
                0x12, 0x03, 0xc0, 0x00, 0x00, 0x04, // control, length
                0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0,
            ]
        );
        // Detected with the header, before payload and CRC arrive.
        let f = frame(&seg, true);
        assert_eq!(error_of(cfg(true), &f[..20], (1, 2, 0x03)), e);
        // An old MSN is out of range too.
        let s = [&SEND[..], &SEND[..]].concat();
        let e = error_of(cfg(false), &s, (1, 2, 0x03));
        assert_eq!(
            e.kind,
            RxErrorKind::Untagged(UntaggedError::MsnRange {
                expected: 2,
                got: 1
            })
        );
    }

    #[test]
    fn posted_buffer_errors() {
        let mut none = |_: u32, _: u32, _: Opcode| None;
        let e = error_with(cfg(false), &SEND, &mut none, (1, 2, 0x02));
        assert_eq!(
            e.kind,
            RxErrorKind::Untagged(UntaggedError::MsnNoBuffer { msn: 1 })
        );
        with_ddp_header(&e, &SEND[2..20], 3);
        let e = error_with(cfg(false), &READ_REQUEST, &mut none, (1, 2, 0x02));
        with_ddp_header(&e, &READ_REQUEST[2..20], 28);
        // A Terminate needs no posted buffer.
        assert_eq!(run_with(cfg(false), &[&TERMINATE], &mut none).error, None);
        // Too short a buffer, at once or in a later segment.
        let mut two = |_: u32, _: u32, _: Opcode| Some(2);
        let e = error_with(cfg(false), &SEND, &mut two, (1, 2, 0x05));
        assert_eq!(
            e.kind,
            RxErrorKind::Untagged(UntaggedError::MessageTooLong {
                buffer_len: 2,
                needed: 3
            })
        );
        let mut five = |_: u32, _: u32, _: Opcode| Some(5);
        let s = [with_msn(&SEND_A, 1), with_msn(&SEND_B, 1)].concat();
        let e = error_with(cfg(false), &s, &mut five, (1, 2, 0x05));
        with_ddp_header(&e, &s[30..48], 2);
        let mut six = |_: u32, _: u32, _: Opcode| Some(6);
        assert_eq!(run_with(cfg(false), &[&s], &mut six).error, None);
        // Fixed-format messages only need a slot, whatever its length.
        let mut zero = |_: u32, _: u32, _: Opcode| Some(0);
        assert_eq!(
            run_with(cfg(false), &[&with_msn(&IMMEDIATE, 1)], &mut zero).error,
            None
        );
        // Asked once per message, with the right arguments.
        let mut asked = Vec::new();
        let mut log = |qn: u32, msn: u32, op: Opcode| {
            asked.push((qn, msn, op));
            Some(100)
        };
        assert_eq!(
            run_with(cfg(false), &[&stream(false, None)], &mut log),
            expected_outcome()
        );
        use Opcode::*;
        assert_eq!(
            asked,
            vec![
                (1, 1, RdmaReadRequest),
                (0, 1, Send),
                (0, 2, SendInvalidate),
                (0, 3, SendSe),
                (0, 4, SendSeInvalidate),
                (0, 5, ImmediateData),
                (0, 6, ImmediateDataSe),
                (1, 2, AtomicRequest),
                (3, 1, AtomicResponse),
                (0, 7, Send),
            ]
        );
    }

    #[test]
    fn mo_errors() {
        // First segment not at MO 0.
        let mut s = SEND;
        s[19] = 4;
        let e = error_of(cfg(false), &s, (1, 2, 0x04));
        assert_eq!(
            e.kind,
            RxErrorKind::Untagged(UntaggedError::InvalidMo {
                expected: 0,
                got: 4
            })
        );
        with_ddp_header(&e, &s[2..20], 3);
        // A gap in the middle.
        let mut b = with_msn(&SEND_B, 1);
        b[19] = 5;
        let e = error_of(
            cfg(false),
            &[&with_msn(&SEND_A, 1)[..], &b].concat(),
            (1, 2, 0x04),
        );
        assert_eq!(
            e.kind,
            RxErrorKind::Untagged(UntaggedError::InvalidMo {
                expected: 4,
                got: 5
            })
        );
    }

    #[test]
    fn fixed_payload_errors() {
        // Read Request one octet short.
        let short = frame(&READ_REQUEST[2..47], false);
        let e = error_of(cfg(false), &short, (0, 2, 0xff));
        assert_eq!(
            e.kind,
            RxErrorKind::Rdmap(RdmapError::PayloadLength {
                opcode: Opcode::RdmaReadRequest,
                expected: 28,
                actual: 27
            })
        );
        with_ddp_header(&e, &READ_REQUEST[2..20], 27);
        // Detected at the header.
        assert_eq!(error_of(cfg(false), &short[..20], (0, 2, 0xff)), e);
        // Immediate Data with 9 octets, Atomic Response with 11.
        let long = frame(&[&IMMEDIATE[2..28], &[0]].concat(), false);
        error_of(cfg(false), &long, (0, 2, 0xff));
        let short = frame(&ATOMIC_RESPONSE[2..31], false);
        error_of(cfg(false), &short, (0, 2, 0xff));
        // Terminates of 3 and 53 octets.
        let t3 = frame(&TERMINATE[2..23], false);
        let e = error_of(cfg(false), &t3, (0, 2, 0xff));
        assert!(matches!(
            e.kind,
            RxErrorKind::Rdmap(RdmapError::PayloadLength { .. })
        ));
        let t53 = frame(&[&TERMINATE[2..44], &[0u8; 29]].concat(), false);
        let e = error_of(cfg(false), &t53, (0, 2, 0xff));
        assert_eq!(
            e.kind,
            RxErrorKind::Rdmap(RdmapError::PayloadLength {
                opcode: Opcode::Terminate,
                expected: 52,
                actual: 53
            })
        );
        // A 52-octet Terminate is fine.
        let t52 = frame(&[&TERMINATE[2..44], &[0u8; 28]].concat(), false);
        assert_eq!(run(cfg(false), &t52).error, None);
        // Single-segment opcode without L.
        let mut rr = READ_REQUEST;
        rr[2] = 0x01;
        let e = error_of(cfg(false), &rr, (0, 2, 0xff));
        assert_eq!(
            e.kind,
            RxErrorKind::Rdmap(RdmapError::NotLast(Opcode::RdmaReadRequest))
        );
        // Reserved Atomic operation code: found with the whole payload.
        let mut a = ATOMIC_REQUEST;
        a[15] = 1;
        a[23] = 0x03;
        let e = error_of(cfg(false), &a, (0, 2, 0xff));
        assert_eq!(e.kind, RxErrorKind::Rdmap(RdmapError::UnknownAtomicOp(3)));
        with_ddp_header(&e, &a[2..20], 52);
        // An unparsable Terminate is still delivered (the stream ends).
        let mut t = TERMINATE;
        t[20] = 0x33; // layer 3
        let out = run(cfg(false), &t);
        assert_eq!(out.error, None);
        match out.events[0] {
            Ev::Header(_, f) => assert!(matches!(
                f,
                Some(FixedPayload::Terminate(Err(
                    TerminateError::UndefinedCode { .. }
                )))
            )),
            _ => panic!(),
        }
    }

    /// A copy of an untagged FPDU with MSN `msn` (below 256).
    fn with_msn(v: &[u8], msn: u8) -> Vec<u8> {
        let mut v = v.to_vec();
        v[15] = msn;
        v
    }

    /// A tagged segment (opcode, L, STag, TO, payload).
    fn tagged_fpdu(op: u8, last: bool, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
        let mut u = vec![if last { 0xc1 } else { 0x81 }, 0x40 | op];
        u.extend_from_slice(&stag.to_be_bytes());
        u.extend_from_slice(&to.to_be_bytes());
        u.extend_from_slice(payload);
        frame(&u, false)
    }

    #[test]
    fn tagged_errors() {
        // TO wrap within a segment.
        let w = tagged_fpdu(0, true, 1, u64::MAX - 1, b"abc");
        let e = error_of(cfg(false), &w, (1, 1, 0x03));
        assert_eq!(e.kind, RxErrorKind::Tagged(TaggedError::ToWrap));
        with_ddp_header(&e, &w[2..16], 3);
        // Up to the very top is fine, as is a zero-length segment there.
        let w = tagged_fpdu(0, true, 1, u64::MAX - 2, b"abc");
        assert_eq!(run(cfg(false), &w).error, None);
        let w = tagged_fpdu(0, true, 1, u64::MAX, b"");
        assert_eq!(run(cfg(false), &w).error, None);
        // TO wrap across segments: the first ends at the top, the next
        // continues at TO 0.
        let s = [
            tagged_fpdu(0, false, 1, u64::MAX, b"a"),
            tagged_fpdu(0, true, 1, 0, b"b"),
        ]
        .concat();
        let e = error_of(cfg(false), &s, (1, 1, 0x03));
        assert_eq!(e.kind, RxErrorKind::Tagged(TaggedError::ToWrap));
        let s = [
            tagged_fpdu(0, false, 1, u64::MAX, b"a"),
            tagged_fpdu(0, false, 1, 0, b""),
            tagged_fpdu(0, true, 1, 0, b"b"),
        ]
        .concat();
        error_of(cfg(false), &s, (1, 1, 0x03));
        let s = [
            tagged_fpdu(0, false, 1, u64::MAX, b"a"),
            tagged_fpdu(0, true, 1, 1, b"b"),
        ]
        .concat();
        error_of(cfg(false), &s, (1, 1, 0x01));
        // STag changed, TO gap.
        let s = [&WRITE_A[..], &tagged_fpdu(0, true, 0x56, 0x13, &[6, 5])].concat();
        let e = error_of(cfg(false), &s, (1, 1, 0x00));
        assert_eq!(e.kind, RxErrorKind::Tagged(TaggedError::InvalidStag(0x56)));
        let s = [&WRITE_A[..], &tagged_fpdu(0, true, 0x55, 0x14, &[6, 5])].concat();
        let e = error_of(cfg(false), &s, (1, 1, 0x01));
        assert_eq!(e.kind, RxErrorKind::Tagged(TaggedError::BaseBounds));
        assert_eq!(e.terminate.ddp_header.unwrap().len(), 14);
    }

    #[test]
    fn opcode_changed_within_message() {
        // A Read Response continuing a Write.
        let s = [&WRITE_A[..], &tagged_fpdu(2, true, 0x55, 0x13, &[6, 5])].concat();
        let e = error_of(cfg(false), &s, (0, 2, 0x06));
        assert_eq!(
            e.kind,
            RxErrorKind::OpcodeChanged {
                expected: Opcode::RdmaWrite,
                got: Opcode::RdmaReadResponse
            }
        );
        headerless(&e);
        // A Send with SE continuing a Send.
        let a = with_msn(&SEND_A, 1);
        let mut b = with_msn(&SEND_B, 1);
        b[3] = 0x45;
        let e = error_of(cfg(false), &[&a[..], &b].concat(), (0, 2, 0x06));
        assert_eq!(
            e.kind,
            RxErrorKind::OpcodeChanged {
                expected: Opcode::Send,
                got: Opcode::SendSe
            }
        );
        // An Immediate Data sneaking into a Send's MSN and MO.
        let mut imm = with_msn(&IMMEDIATE, 1);
        imm[19] = 4;
        let e = error_of(cfg(false), &[&a[..], &imm].concat(), (0, 2, 0x06));
        assert!(matches!(e.kind, RxErrorKind::OpcodeChanged { .. }));
        // Tagged and untagged messages may interleave, and a Read Request
        // may arrive while a Send is in progress.
        let b = with_msn(&SEND_B, 1);
        let s = [&a[..], &READ_REQUEST, &WRITE_A, &b, &WRITE_B].concat();
        let out = run(cfg(false), &s);
        assert_eq!(out.error, None);
        assert_eq!(
            out.events
                .iter()
                .filter(|e| matches!(e, Ev::Done(..)))
                .count(),
            5
        );
    }

    #[test]
    fn data_after_terminate() {
        let out = run(cfg(false), &TERMINATE);
        assert_eq!(out.error, None);
        assert!(out.boundary);
        let mut rx = Receiver::new(cfg(false), SoftCrc32c::new());
        let mut rest: &[u8] = &TERMINATE;
        while rx.poll(&mut rest, &mut Unlimited).unwrap().is_some() {}
        assert!(rx.is_terminated());
        assert_eq!(rx.feed(&[], &mut Unlimited), (0, Ok(None)));
        let (_, r) = rx.feed(&[0], &mut Unlimited);
        let e = r.unwrap_err();
        assert_eq!(e.kind, RxErrorKind::DataAfterTerminate);
        assert_eq!(e.code().wire(), (0, 2, 0x06));
        assert!(!e.should_send_terminate());
        headerless(&e);
        let e = error_of(cfg(false), &[&TERMINATE[..], &SEND].concat(), (0, 2, 0x06));
        assert_eq!(e.kind, RxErrorKind::DataAfterTerminate);
        // With markers: even a marker after the Terminate is refused.
        let s = mark_stream(&[ulpdu_of(&TERMINATE)], 512 - 48, false);
        assert_eq!(s.len(), 48);
        let e = error_of(
            marked_cfg(false, 512 - 48),
            &[&s[..], &[0, 0, 0, 0]].concat(),
            (0, 2, 6),
        );
        assert_eq!(e.kind, RxErrorKind::DataAfterTerminate);
    }

    /// Feeds `stream` until the first event matching `stop`, then rejects.
    fn reject_at(
        stream: &[u8],
        stop: impl Fn(&RxEvent<'_>) -> bool,
        code: TermCode,
    ) -> (RxError, Receiver<SoftCrc32c>) {
        let mut rx = Receiver::new(cfg(false), SoftCrc32c::new());
        let mut rest = stream;
        while let Some(ev) = rx.poll(&mut rest, &mut Unlimited).unwrap() {
            if stop(&ev) {
                let e = rx.reject(code);
                return (e, rx);
            }
        }
        panic!("no such event");
    }

    #[test]
    fn caller_rejects() {
        // Access rights on a Read Request: DDP and Read Request headers.
        let code = TermCode::RdmapRemoteProtection(RemoteProtectionCode::AccessRights);
        let (e, mut rx) = reject_at(&READ_REQUEST, |ev| matches!(ev, RxEvent::Header(_)), code);
        assert_eq!(e.kind, RxErrorKind::Rejected);
        let mut out = [0u8; 52];
        assert_eq!(e.terminate.emit(&mut out), Ok(52));
        let mut want = vec![0x01, 0x02, 0xe0, 0x00, 0x00, 0x1c];
        want.extend_from_slice(&READ_REQUEST[2..48]);
        assert_eq!(&out[..], &want[..]);
        assert_eq!(rx.feed(&[0], &mut Unlimited), (0, Err(e)));
        assert_eq!(rx.reject(INTERNAL_CODE), e);
        // Invalid STag on a Write, found at its header or mid-payload.
        let code = TermCode::DdpTagged(TaggedCode::InvalidStag);
        for stop in [
            &(|ev: &RxEvent<'_>| matches!(ev, RxEvent::Header(_))) as &dyn Fn(&RxEvent<'_>) -> bool,
            &|ev: &RxEvent<'_>| matches!(ev, RxEvent::Data(_)),
        ] {
            let (e, _) = reject_at(&WRITE, stop, code);
            with_ddp_header(&e, &WRITE[2..16], 5);
        }
        // A failed invalidation after the Send with Invalidate completed:
        // M D R with the 18-octet header, as upstream siw reports it.
        let code = TermCode::RdmapRemoteProtection(RemoteProtectionCode::CannotInvalidate);
        let s = [&SEND[..], &SEND_INV].concat();
        let (e, _) = reject_at(
            &s,
            |ev| matches!(ev, RxEvent::Done(d) if d.header.invalidate_stag.is_some()),
            code,
        );
        assert_eq!(
            e.terminate.hdrct,
            HeaderControl {
                m: true,
                d: true,
                r: true
            }
        );
        assert_eq!(e.terminate.ddp_header.unwrap().as_bytes(), &SEND_INV[2..20]);
        assert_eq!(e.terminate.ddp_segment_length, 2);
        // Before any segment: nothing to attach.
        let mut rx = Receiver::new(cfg(false), SoftCrc32c::new());
        let e = rx.reject(code);
        headerless(&e);
        assert!(e.should_send_terminate());
        // Display mentions the triple.
        let text = std::format!("{e}");
        assert!(text.contains("0/1/0x09"), "{text}");
    }

    // --- property tests ----------------------------------------------------

    #[derive(Clone, Debug)]
    struct Msg {
        tagged: bool,
        /// Index into the opcodes of its kind.
        op: usize,
        len: u32,
        mulpdu: u32,
    }

    fn any_msg() -> impl Strategy<Value = Msg> {
        (any::<bool>(), 0usize..4, 0u32..3000, 19u32..1600).prop_map(|(tagged, op, len, mulpdu)| {
            Msg {
                tagged,
                op,
                len,
                mulpdu,
            }
        })
    }

    fn msg_byte(i: usize, j: usize) -> u8 {
        (i.wrapping_mul(131) ^ j.wrapping_mul(7) ^ (j >> 8)) as u8
    }

    /// Builds the FPDU stream of `msgs` with `Segmenter` and `emit_fpdu`,
    /// interleaving tagged and untagged messages as `choices` says.
    fn build(msgs: &[Msg], crc: bool, markers: Option<u32>, choices: &[bool]) -> Vec<u8> {
        let mut tagged_segs = Vec::new();
        let mut untagged_segs = Vec::new();
        let mut msn = 1u32;
        for (i, m) in msgs.iter().enumerate() {
            let (op, target) = if m.tagged {
                let op = [0u8, 2][m.op % 2];
                let to = (i as u64) << 40 | 0xfff0;
                (
                    op,
                    BufferFields::Tagged(TaggedFields {
                        stag: 0x1000 + i as u32,
                        to,
                    }),
                )
            } else {
                let op = [3u8, 4, 5, 6][m.op];
                let t = BufferFields::Untagged(UntaggedFields {
                    rsvd_ulp: if op == 4 || op == 6 { 0xabcd } else { 0 },
                    qn: 0,
                    msn,
                    mo: 0,
                });
                msn += 1;
                (op, t)
            };
            for seg in Segmenter::new(op, target, m.len, m.mulpdu).unwrap() {
                let mut u = vec![0u8; UNTAGGED_HEADER_LEN];
                let n = seg.header.emit(&mut u).unwrap();
                u.truncate(n);
                u.extend((seg.offset..seg.offset + seg.len).map(|j| msg_byte(i, j as usize)));
                if m.tagged {
                    tagged_segs.push(u);
                } else {
                    untagged_segs.push(u);
                }
            }
        }
        let mut order = Vec::new();
        let (mut t, mut u) = (0, 0);
        let mut k = 0;
        while t < tagged_segs.len() || u < untagged_segs.len() {
            let pick_tagged = u == untagged_segs.len()
                || (t < tagged_segs.len() && choices.get(k % choices.len().max(1)) == Some(&true));
            k += 1;
            if pick_tagged {
                order.push(&tagged_segs[t]);
                t += 1;
            } else {
                order.push(&untagged_segs[u]);
                u += 1;
            }
        }
        let mut ms = markers.map(MarkerState::at);
        let mut wire = Vec::new();
        let mut crc_engine = SoftCrc32c::new();
        for u in order {
            let mut out = vec![0u8; u.len() + 64];
            let engine: Option<&mut dyn CrcEngine> = if crc { Some(&mut crc_engine) } else { None };
            let n = emit_fpdu(u, ms.as_mut(), engine, &mut out).unwrap();
            wire.extend_from_slice(&out[..n]);
        }
        wire
    }

    fn pieces<'a>(s: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
        let mut v = Vec::new();
        let mut at = 0;
        let mut k = 0;
        while at < s.len() {
            let n = sizes
                .get(k % sizes.len().max(1))
                .copied()
                .unwrap_or(s.len())
                .max(1);
            let end = (at + n).min(s.len());
            v.push(&s[at..end]);
            at = end;
            k += 1;
        }
        v
    }

    proptest! {
        #[test]
        fn prop_messages_reconstruct(
            msgs in proptest::collection::vec(any_msg(), 0..10),
            crc in any::<bool>(),
            markers in proptest::option::of(prop_oneof![0u32..1200, any::<u32>()]),
            choices in proptest::collection::vec(any::<bool>(), 1..8),
            sizes in proptest::collection::vec(1usize..700, 1..8),
        ) {
            let wire = build(&msgs, crc, markers, &choices);
            let c = RxConfig { crc, markers, ..RxConfig::new(false) };
            // Untagged MSN -> message index; posted buffers of exactly the
            // message length.
            let untagged: Vec<usize> = (0..msgs.len()).filter(|&i| !msgs[i].tagged).collect();
            let mut bufs = |qn: u32, msn: u32, _op: Opcode| {
                assert_eq!(qn, 0);
                untagged.get(msn as usize - 1).map(|&i| msgs[i].len)
            };
            let mut got: Vec<Vec<Option<u8>>> =
                msgs.iter().map(|m| vec![None; m.len as usize]).collect();
            let mut completed = vec![None; msgs.len()];
            let mut rx = Receiver::new(c, SoftCrc32c::new());
            let mut order = Order::default();
            for piece in pieces(&wire, &sizes) {
                let mut rest = piece;
                while let Some(ev) = rx.poll(&mut rest, &mut bufs).unwrap() {
                    order.check(&ev, rx.fixed_payload());
                    let index = |t: Target| match t {
                        Target::Tagged { stag, to } => {
                            let i = (stag - 0x1000) as usize;
                            (i, (to - ((i as u64) << 40 | 0xfff0)) as usize)
                        }
                        Target::Untagged { qn: 0, msn, mo } => {
                            (untagged[msn as usize - 1], mo as usize)
                        }
                        Target::Untagged { .. } => panic!("wrong queue"),
                    };
                    match ev {
                        RxEvent::Data(p) => {
                            let (i, off) = index(p.target);
                            for (k, &b) in p.data.iter().enumerate() {
                                let slot = &mut got[i][off + k];
                                prop_assert!(slot.is_none(), "placed twice");
                                *slot = Some(b);
                            }
                        }
                        RxEvent::Header(h) => {
                            let _ = index(h.target);
                            let inv = [4, 6].contains(&h.opcode.value());
                            prop_assert_eq!(h.invalidate_stag, inv.then_some(0xabcd));
                        }
                        RxEvent::Done(d) => {
                            if let Some(len) = d.message_len {
                                let (i, _) = index(d.header.target);
                                prop_assert!(completed[i].is_none());
                                completed[i] = Some(len);
                            }
                        }
                    }
                }
            }
            prop_assert!(rx.at_fpdu_boundary());
            // The same through poll_segment, split and whole.
            same_both_ways(c, &pieces(&wire, &sizes), &bufs);
            same_both_ways(c, &[&wire], &bufs);
            for (i, m) in msgs.iter().enumerate() {
                prop_assert_eq!(completed[i], Some(u64::from(m.len)), "message {}", i);
                for (j, b) in got[i].iter().enumerate() {
                    prop_assert_eq!(*b, Some(msg_byte(i, j)), "message {} octet {}", i, j);
                }
            }
        }

        #[test]
        fn prop_garbage_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..1500),
            crc in any::<bool>(),
            markers in proptest::option::of(any::<u32>()),
            ext in any::<bool>(),
            queues in 0u32..6,
            max in any::<u16>(),
            sizes in proptest::collection::vec(1usize..64, 1..6),
        ) {
            let c = RxConfig {
                crc,
                markers,
                extensions: if ext { Extensions::ALL } else { Extensions::NONE },
                max_ulpdu_len: max,
                queues,
            };
            let mut bufs = |_: u32, msn: u32, _: Opcode| (!msn.is_multiple_of(3)).then_some(msn.wrapping_mul(97));
            let out = run_with(c, &pieces(&bytes, &sizes), &mut bufs);
            let (by_segment, _) = run_by(c, &pieces(&bytes, &sizes), &mut bufs, true);
            prop_assert_eq!(settled(by_segment), settled(out.clone()));
            // Either everything was consumed, or a defined error with a
            // consistent Terminate.
            if let Some(e) = out.error {
                prop_assert!(e.terminate.is_consistent());
                let mut buf = [0u8; 80];
                prop_assert!(e.terminate.emit_message(1, &mut buf).is_ok());
            }
        }

        #[test]
        fn prop_mutated_streams(
            flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 1..4),
            crc in any::<bool>(),
            markers in proptest::option::of(prop_oneof![Just(0u32), Just(508), any::<u32>()]),
            sizes in proptest::collection::vec(1usize..40, 1..6),
        ) {
            let mut s = stream(crc, markers);
            for (at, x) in &flips {
                let i = at % s.len();
                s[i] ^= x;
            }
            let c = RxConfig { markers, ..cfg(crc) };
            let split = run_with(c, &pieces(&s, &sizes), &mut Unlimited);
            // Same result whatever the split, and through poll_segment.
            prop_assert_eq!(&split, &run(c, &s));
            same_both_ways(c, &pieces(&s, &sizes), &Unlimited);
            same_both_ways(c, &[&s], &Unlimited);
            if crc {
                // With CRC nothing corrupted completes: the verified
                // segments are the original ones, in order.
                let done = |evs: &[Ev]| -> Vec<Ev> {
                    evs.iter().filter(|e| matches!(e, Ev::Done(..))).cloned().collect()
                };
                let got = done(&split.events);
                let want = done(&expected_events());
                prop_assert!(got.len() <= want.len());
                prop_assert_eq!(&got[..], &want[..got.len()]);
            }
        }
    }
}
