// SPDX-License-Identifier: GPL-2.0
//! What `rx_stream` and `tx_roundtrip` share: message scripts, the
//! reference transmitter, a reference framing parser, and a checked driver
//! of [`Receiver`].
//!
//! - [`MsgSpec`]: 16 input octets describing one RDMAP message of any
//!   opcode (lengths, STag/TO, invalidate STag, fixed payloads, Terminates
//!   with or without the offending headers).
//! - [`RefStream`]: the FPDU stream of a list of messages built only from
//!   `Segmenter`, `DdpHeader::emit`, the fixed-payload emitters and
//!   `mpa::emit_fpdu` (not from `tx`), with the wire range and the headers
//!   of every FPDU; segments of messages on different queues may be
//!   interleaved.
//! - [`Framing`]: an independent parser of a (possibly hostile) FPDU stream:
//!   markers are the four octets at every stream offset that is a multiple
//!   of 512, FPDUPTRs and CRCs are recomputed from the RFC 5044 rules.
//! - [`drive`]: feeds a stream to a [`Receiver`] in given pieces and checks
//!   every call and event against the reference framing and a model of the
//!   DDP queue state (see the function for the list).
//! - [`expected_outcome`]: the events (and the error, if the receive
//!   configuration forbids something in the stream) a [`RefStream`] must
//!   produce; [`check_flip`]: what a flipped octet may change.

use iwarp_core::crc32c::{crc32c, CrcEngine, SoftCrc32c};
use iwarp_core::ddp::{
    last_to, BufferFields, ControlField, DdpError, DdpHeader, Segment, SegmentError, Segmenter,
    TaggedError, TaggedFields, UntaggedError, UntaggedFields, INITIAL_MSN, TAGGED_HEADER_LEN,
    UNTAGGED_HEADER_LEN,
};
use iwarp_core::mpa::{self, MarkerState, MpaError, MARKER_INTERVAL, MARKER_LEN};
use iwarp_core::rdmap::{
    self, AtomicOp, AtomicRequest, AtomicResponse, ImmediateData, Opcode, PayloadKind, RdmapError,
    ReadRequest, QUEUE_COUNT,
};
use iwarp_core::rx::{
    FixedPayload, Polled, PostedBuffers, Receiver, RxConfig, RxError, RxErrorKind, RxEvent,
    SegmentDone, SegmentHeader, Target, MAX_FIXED_LEN, MIN_ULPDU_LEN,
};
use iwarp_core::terminate::{
    self, HeaderCopy, HeaderPolicy, MpaCode, RemoteOperationCode, TermCode, TerminateRepr,
};
use iwarp_core::tx::Message;
use std::ops::Range;

use super::{Input, Schedule};

// ---------------------------------------------------------------------------
// Message scripts
// ---------------------------------------------------------------------------

/// Octets of one [`MsgSpec`].
pub const MSG_SPEC_LEN: usize = 16;

/// [`MsgSpec::var`], ULP-data messages: the payload length is `len * 3`
/// (where the target allows big messages).
pub const V_BIG: u8 = 0x40;
/// [`MsgSpec::var`], Terminate: bits 0-1 select the attached header (0
/// none, 1 a tagged RDMA Write header, 2 an untagged Send header, 3 a Read
/// Request header with its Read Request); bit 2 sets M, bit 3 sets R.
pub const V_TERM_ATTACH: u8 = 0x03;
/// [`MsgSpec::var`], Terminate: M.
pub const V_TERM_M: u8 = 0x04;
/// [`MsgSpec::var`], Terminate: R.
pub const V_TERM_R: u8 = 0x08;
/// [`MsgSpec::var`], Terminate: toggle D, making the repr inconsistent
/// (`tx_roundtrip` only; `rx_stream` ignores it).
pub const V_TERM_BAD: u8 = 0x10;

/// One message of a script (16 octets: `op`, `var`, `len` (2), `a` (4),
/// `b` (8), big endian).
///
/// `op` modulo 12 is the opcode ([`Opcode::ALL`]). Per opcode: RDMA Write
/// and Read Response: STag `a`, TO `b`; Sends: the invalidate STag `a`;
/// Read Request: sink STag `a`, sink TO `b`, size `len`, source STag and TO
/// derived from `a`, `b` and `var`; Terminate: code from the first two
/// octets of `a` (layer/type, code), headers per `var`, DDP Segment Length
/// `len`; Immediate Data: the octets of `b`; Atomic Request: operation `var
/// % 3`, fields from `a`, `b`; Atomic Response: `a`, `b`. The payload of
/// ULP-data messages is [`payload_bytes`]`(len, var)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgSpec {
    /// Opcode (modulo 12).
    pub op: u8,
    /// Variant bits (`V_*`) and payload pattern seed.
    pub var: u8,
    /// Payload length (ULP data) or size field.
    pub len: u16,
    /// STag, or the first fixed-payload word.
    pub a: u32,
    /// Tagged Offset, or the second fixed-payload word.
    pub b: u64,
}

impl MsgSpec {
    /// Decodes 16 octets.
    pub fn decode(inp: &mut Input<'_>) -> Self {
        MsgSpec {
            op: inp.u8(),
            var: inp.u8(),
            len: inp.u16(),
            a: inp.u32(),
            b: inp.u64(),
        }
    }

    /// The 16 octets [`decode`](Self::decode) reads.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.op);
        out.push(self.var);
        out.extend_from_slice(&self.len.to_be_bytes());
        out.extend_from_slice(&self.a.to_be_bytes());
        out.extend_from_slice(&self.b.to_be_bytes());
    }

    /// A spec for `opcode` with the other fields given.
    pub fn new(opcode: Opcode, var: u8, len: u16, a: u32, b: u64) -> Self {
        MsgSpec {
            op: opcode.value(),
            var,
            len,
            a,
            b,
        }
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode::ALL[usize::from(self.op % 12)]
    }

    /// The payload length the spec asks for (`big`: honour [`V_BIG`]).
    pub fn wanted_len(&self, big: bool) -> u32 {
        if !self.opcode().carries_ulp_data() {
            return 0;
        }
        let l = u32::from(self.len);
        if big && self.var & V_BIG != 0 {
            l * 3
        } else {
            l
        }
    }

    /// The message, with a ULP payload of `len` octets. `bad_terminate`:
    /// honour [`V_TERM_BAD`].
    pub fn message(&self, len: u32, bad_terminate: bool) -> Message {
        let (a, b, var) = (self.a, self.b, self.var);
        match self.opcode() {
            Opcode::RdmaWrite => Message::RdmaWrite {
                len,
                stag: a,
                to: b,
            },
            Opcode::RdmaReadRequest => Message::ReadRequest(read_request(a, b, self.len, var)),
            Opcode::RdmaReadResponse => Message::ReadResponse {
                len,
                stag: a,
                to: b,
            },
            Opcode::Send => Message::Send { len },
            Opcode::SendInvalidate => Message::SendInvalidate { len, stag: a },
            Opcode::SendSe => Message::SendSe { len },
            Opcode::SendSeInvalidate => Message::SendSeInvalidate { len, stag: a },
            Opcode::Terminate => {
                Message::Terminate(terminate_repr(a, b, var, self.len, bad_terminate))
            }
            Opcode::ImmediateData => Message::ImmediateData {
                data: ImmediateData {
                    data: b.to_be_bytes(),
                },
                solicited: false,
            },
            Opcode::ImmediateDataSe => Message::ImmediateData {
                data: ImmediateData {
                    data: b.to_be_bytes(),
                },
                solicited: true,
            },
            Opcode::AtomicRequest => Message::AtomicRequest(AtomicRequest {
                op: [AtomicOp::FetchAdd, AtomicOp::Swap, AtomicOp::CmpSwap][usize::from(var % 3)],
                request_id: a,
                remote_stag: a.rotate_left(16),
                remote_to: b,
                add_or_swap_data: b.rotate_left(8),
                add_or_swap_mask: !b,
                compare_data: b.swap_bytes(),
                compare_mask: u64::from(a) << 32 | u64::from(var),
            }),
            Opcode::AtomicResponse => Message::AtomicResponse(AtomicResponse {
                request_id: a,
                original_value: b,
            }),
        }
    }
}

fn read_request(a: u32, b: u64, len: u16, var: u8) -> ReadRequest {
    ReadRequest {
        sink_stag: a,
        sink_to: b,
        read_size: u32::from(len) | u32::from(var) << 16,
        source_stag: a.rotate_left(8) ^ u32::from(var),
        source_to: b.swap_bytes(),
    }
}

fn emit_header(h: &DdpHeader) -> Vec<u8> {
    let mut buf = [0u8; UNTAGGED_HEADER_LEN];
    let n = h.emit(&mut buf).expect("emit of a header");
    buf[..n].to_vec()
}

fn terminate_repr(a: u32, b: u64, var: u8, len: u16, bad: bool) -> TerminateRepr {
    let [x, y, _, _] = a.to_be_bytes();
    let code = TermCode::from_wire(x >> 4, x & 0x0f, y).unwrap_or(TermCode::RdmapRemoteOperation(
        RemoteOperationCode::Unspecified,
    ));
    let mut t = TerminateRepr::new(code);
    let seg = match var & V_TERM_ATTACH {
        0 => None,
        1 => Some(emit_header(&DdpHeader::tagged(0, var & 0x20 != 0, a, b))),
        2 => Some(emit_header(&DdpHeader::untagged(
            Opcode::SendInvalidate.value(),
            var & 0x20 != 0,
            a,
            0,
            b as u32,
            (b >> 32) as u32,
        ))),
        _ => {
            let mut s = emit_header(&DdpHeader::untagged(1, true, 0, 1, b as u32, 0));
            let mut rr = [0u8; rdmap::READ_REQUEST_LEN];
            read_request(a, b, len, var)
                .emit(&mut rr)
                .expect("emit of a Read Request");
            s.extend_from_slice(&rr);
            Some(s)
        }
    };
    if let Some(seg) = seg {
        let copy = HeaderCopy::from_segment(&seg).expect("copy of an emitted header");
        t.hdrct.d = true;
        t.hdrct.m = var & V_TERM_M != 0;
        t.hdrct.r = var & V_TERM_R != 0;
        t.ddp_segment_length = len;
        t.ddp_header = Some(copy);
        if t.hdrct.r && copy.is_read_request() {
            t.read_request = ReadRequest::parse(&seg[copy.len()..]).ok();
        }
    }
    assert!(t.is_consistent(), "script Terminate {t:?}");
    if bad && var & V_TERM_BAD != 0 {
        t.hdrct.d = !t.hdrct.d;
    }
    t
}

/// The payload of a ULP-data message: `len` octets from `seed`, with
/// octets at different offsets differing (a misplaced range shows).
pub fn payload_bytes(len: u32, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(167).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// The fixed-format payload of a message, from the crate's emitters
/// (empty for ULP-data messages). The message must be valid.
pub fn fixed_bytes(m: &Message) -> Vec<u8> {
    let mut buf = [0u8; MAX_FIXED_LEN];
    let n = match m {
        Message::ReadRequest(rr) => rr.emit(&mut buf),
        Message::Terminate(t) => t.emit(&mut buf),
        Message::ImmediateData { data, .. } => data.emit(&mut buf),
        Message::AtomicRequest(a) => a.emit(&mut buf),
        Message::AtomicResponse(a) => a.emit(&mut buf),
        _ => Ok(0),
    }
    .expect("emit of a fixed payload");
    buf[..n].to_vec()
}

/// The fixed payload the receiver reports for `m`.
pub fn fixed_event(m: &Message) -> Option<FixedPayload> {
    match *m {
        Message::ReadRequest(rr) => Some(FixedPayload::ReadRequest(rr)),
        Message::Terminate(t) => Some(FixedPayload::Terminate(Ok(t))),
        Message::ImmediateData { data, .. } => Some(FixedPayload::ImmediateData(data)),
        Message::AtomicRequest(a) => Some(FixedPayload::AtomicRequest(a)),
        Message::AtomicResponse(a) => Some(FixedPayload::AtomicResponse(a)),
        _ => None,
    }
}

/// Parses a fixed-format payload as the receiver does.
pub fn parse_fixed(op: Opcode, body: &[u8]) -> Result<FixedPayload, RdmapError> {
    match op {
        Opcode::RdmaReadRequest => ReadRequest::parse(body).map(FixedPayload::ReadRequest),
        Opcode::AtomicRequest => AtomicRequest::parse(body).map(FixedPayload::AtomicRequest),
        Opcode::AtomicResponse => AtomicResponse::parse(body).map(FixedPayload::AtomicResponse),
        Opcode::ImmediateData | Opcode::ImmediateDataSe => {
            ImmediateData::parse(body).map(FixedPayload::ImmediateData)
        }
        Opcode::Terminate => Ok(FixedPayload::Terminate(TerminateRepr::parse(body))),
        _ => panic!("no fixed payload for {op:?}"),
    }
}

/// DDP header length of an opcode's messages.
pub fn header_len(op: Opcode) -> usize {
    if op.is_tagged() {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

// ---------------------------------------------------------------------------
// Reference transmitter
// ---------------------------------------------------------------------------

/// A message of a [`RefStream`].
#[derive(Clone, Debug)]
pub struct RefMsg {
    /// The message.
    pub message: Message,
    /// Its ULP payload.
    pub payload: Vec<u8>,
    /// Its fixed payload.
    pub fixed: Vec<u8>,
    /// The MSN (untagged).
    pub msn: Option<u32>,
    /// Indices of its segments in [`RefStream::segs`], in order (filled as
    /// they are emitted).
    pub segs: Vec<usize>,
}

impl RefMsg {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        self.message.opcode()
    }

    /// The message length the receiver reports at its last segment.
    pub fn total_len(&self) -> u64 {
        (self.payload.len() + self.fixed.len()) as u64
    }
}

/// One FPDU of a [`RefStream`].
#[derive(Clone, Debug)]
pub struct RefSeg {
    /// Index of its message.
    pub msg: usize,
    /// The DDP header.
    pub header: DdpHeader,
    /// Payload range within the message.
    pub offset: u32,
    /// Payload length.
    pub len: u32,
    /// ULPDU_Length.
    pub ulen: u16,
    /// The DDP header and fixed payload octets.
    pub head: Vec<u8>,
    /// Where the FPDU is in [`RefStream::wire`] (a leading marker
    /// included).
    pub wire: Range<usize>,
}

/// A stream built by the reference transmitter.
#[derive(Clone, Debug)]
pub struct RefStream {
    /// CRCs computed.
    pub crc: bool,
    /// Marker state (markers on).
    pub markers: Option<MarkerState>,
    /// The messages.
    pub msgs: Vec<RefMsg>,
    /// The FPDUs in wire order.
    pub segs: Vec<RefSeg>,
    /// The octets.
    pub wire: Vec<u8>,
    msn: [u32; QUEUE_COUNT],
    engine: SoftCrc32c,
}

impl RefStream {
    /// An empty stream: CRC as given, markers from stream offset `markers`.
    pub fn new(crc: bool, markers: Option<u32>) -> Self {
        RefStream {
            crc,
            markers: markers.map(MarkerState::at),
            msgs: Vec::new(),
            segs: Vec::new(),
            wire: Vec::new(),
            msn: [INITIAL_MSN; QUEUE_COUNT],
            engine: SoftCrc32c::new(),
        }
    }

    /// The MSN the next message on queue `qn` gets.
    pub fn next_msn(&self, qn: usize) -> u32 {
        self.msn[qn]
    }

    /// Adds a message (assigning its MSN) and returns its index and its
    /// segments, to be emitted with [`emit`](Self::emit). The Terminate must
    /// be consistent. A message `Segmenter` refuses (MULPDU too small, TO
    /// wrap) is not added and takes no MSN.
    pub fn add(
        &mut self,
        message: Message,
        payload: Vec<u8>,
        mulpdu: u32,
    ) -> Result<(usize, Vec<Segment>), SegmentError> {
        let op = message.opcode();
        assert_eq!(payload.len() as u64, u64::from(message.payload_len()));
        let msn = op.queue_number().map(|qn| self.msn[qn as usize]);
        let target = match message {
            Message::RdmaWrite { stag, to, .. } | Message::ReadResponse { stag, to, .. } => {
                BufferFields::Tagged(TaggedFields { stag, to })
            }
            _ => BufferFields::Untagged(UntaggedFields {
                rsvd_ulp: match message {
                    Message::SendInvalidate { stag, .. }
                    | Message::SendSeInvalidate { stag, .. } => stag,
                    _ => 0,
                },
                qn: op.queue_number().expect("untagged"),
                msn: msn.expect("untagged"),
                mo: 0,
            }),
        };
        let segs: Vec<Segment> =
            Segmenter::new(op.value(), target, message.payload_len(), mulpdu)?.collect();
        let fixed = fixed_bytes(&message);
        if let Some(qn) = op.queue_number() {
            let slot = &mut self.msn[qn as usize];
            *slot = slot.wrapping_add(1);
        }
        self.msgs.push(RefMsg {
            message,
            payload,
            fixed,
            msn,
            segs: Vec::new(),
        });
        Ok((self.msgs.len() - 1, segs))
    }

    /// Emits one segment of message `msg` as an FPDU.
    pub fn emit(&mut self, msg: usize, seg: &Segment) {
        let m = &self.msgs[msg];
        let mut head = emit_header(&seg.header);
        head.extend_from_slice(&m.fixed);
        let mut ulpdu = head.clone();
        ulpdu.extend_from_slice(&m.payload[seg.payload_range()]);
        let ulen = u16::try_from(ulpdu.len()).expect("ULPDU fits 16 bits");
        let start = self.wire.len();
        let len = mpa::fpdu_wire_len(ulen, self.markers.as_ref());
        self.wire.resize(start + len, 0);
        let engine: Option<&mut dyn CrcEngine> = if self.crc {
            Some(&mut self.engine)
        } else {
            None
        };
        let n = mpa::emit_fpdu(
            &ulpdu,
            self.markers.as_mut(),
            engine,
            &mut self.wire[start..],
        )
        .expect("emit_fpdu");
        assert_eq!(n, len);
        self.msgs[msg].segs.push(self.segs.len());
        self.segs.push(RefSeg {
            msg,
            header: seg.header,
            offset: seg.offset,
            len: seg.len,
            ulen,
            head,
            wire: start..start + n,
        });
    }

    /// [`add`](Self::add) and emit every segment at once; returns the
    /// message's wire range.
    pub fn push(
        &mut self,
        message: Message,
        payload: Vec<u8>,
        mulpdu: u32,
    ) -> Result<Range<usize>, SegmentError> {
        let start = self.wire.len();
        let (i, segs) = self.add(message, payload, mulpdu)?;
        for s in &segs {
            self.emit(i, s);
        }
        Ok(start..self.wire.len())
    }

    /// Index of the FPDU holding wire octet `pos`.
    pub fn seg_at(&self, pos: usize) -> Option<usize> {
        self.segs.iter().position(|s| s.wire.contains(&pos))
    }

    /// The header the receiver reports for segment `k`.
    pub fn expected_header(&self, k: usize) -> SegmentHeader {
        let s = &self.segs[k];
        let m = &self.msgs[s.msg];
        SegmentHeader {
            opcode: m.opcode(),
            last: s.header.last,
            first: s.offset == 0,
            target: target_of(&s.header),
            payload_len: u32::from(s.ulen) - s.header.header_len() as u32,
            invalidate_stag: rdmap::invalidate_stag(&s.header),
        }
    }

    /// The fixed payload the receiver holds for segment `k`
    /// ([`Receiver::fixed_payload`]).
    pub fn expected_fixed(&self, k: usize) -> Option<FixedPayload> {
        fixed_event(&self.msgs[self.segs[k].msg].message)
    }
}

/// The receiver's target for a header.
pub fn target_of(h: &DdpHeader) -> Target {
    match h.buffer {
        BufferFields::Tagged(t) => Target::Tagged {
            stag: t.stag,
            to: t.to,
        },
        BufferFields::Untagged(u) => Target::Untagged {
            qn: u.qn,
            msn: u.msn,
            mo: u.mo,
        },
    }
}

fn advanced(t: Target, n: u64) -> Target {
    match t {
        Target::Tagged { stag, to } => Target::Tagged {
            stag,
            to: to.wrapping_add(n),
        },
        Target::Untagged { qn, msn, mo } => Target::Untagged {
            qn,
            msn,
            mo: mo.wrapping_add(n as u32),
        },
    }
}

// ---------------------------------------------------------------------------
// Reference framing
// ---------------------------------------------------------------------------

/// What a wire octet is, per the reference framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// ULPDU_Length.
    Length,
    /// ULPDU, PAD.
    Body,
    /// The CRC field.
    Crc,
    /// Octet `octet` (0-3) of a marker; `covered` by the FPDU's CRC.
    Marker {
        /// Position in the marker.
        octet: usize,
        /// Whether the CRC covers it.
        covered: bool,
    },
}

/// One FPDU as found by [`Framing::parse`].
#[derive(Clone, Debug, Default)]
pub struct RefFpdu {
    /// Wire offset of its first octet (a leading marker's).
    pub start: usize,
    /// Wire offset after its last octet present.
    pub end: usize,
    /// All of it is present.
    pub complete: bool,
    /// ULPDU_Length, once both octets are present.
    pub ulen: Option<u16>,
    /// The ULPDU octets present.
    pub ulpdu: Vec<u8>,
    /// Complete FPDUs: (CRC over the covered octets, CRC field value).
    pub crc: Option<(u32, u32)>,
    /// The first marker whose FPDUPTR is wrong: (expected, received).
    pub bad_marker: Option<(u32, u16)>,
    /// Wire offsets of the ULPDU_Length octets.
    pub len_at: Vec<usize>,
    /// Wire offset of every marker octet and whether the CRC covers it.
    pub markers: Vec<(usize, bool)>,
    /// Wire offset of the first CRC field octet.
    pub crc_at: Option<usize>,
}

impl RefFpdu {
    /// DDP header length announced by the T flag (once present).
    pub fn header_len(&self) -> Option<usize> {
        self.ulpdu
            .first()
            .map(|&b| ControlField(u16::from(b) << 8).header_len())
    }

    /// The role of wire octet `pos` (which must lie in this FPDU).
    pub fn role(&self, pos: usize) -> Role {
        assert!((self.start..self.end).contains(&pos));
        if let Some(k) = self.markers.iter().position(|&(p, _)| p == pos) {
            let (first, covered) = self.markers[k - k % MARKER_LEN];
            assert_eq!(first + k % MARKER_LEN, pos);
            return Role::Marker {
                octet: k % MARKER_LEN,
                covered,
            };
        }
        if self.len_at.contains(&pos) {
            Role::Length
        } else if self.crc_at.is_some_and(|c| pos >= c) {
            Role::Crc
        } else {
            Role::Body
        }
    }
}

/// The FPDUs of a stream per RFC 5044, from scratch.
#[derive(Clone, Debug, Default)]
pub struct Framing {
    /// In wire order; the last may be incomplete.
    pub fpdus: Vec<RefFpdu>,
}

impl Framing {
    /// Splits `wire` into FPDUs. `markers`: the stream offset of `wire[0]`
    /// with markers.
    pub fn parse(wire: &[u8], markers: Option<u32>) -> Self {
        let mut fpdus = Vec::new();
        let mut off = 0usize;
        while off < wire.len() {
            let f = Self::one(wire, &mut off, markers);
            fpdus.push(f);
        }
        Framing { fpdus }
    }

    fn one(wire: &[u8], off: &mut usize, markers: Option<u32>) -> RefFpdu {
        let mut f = RefFpdu {
            start: *off,
            ..RefFpdu::default()
        };
        let mut covered = Vec::new();
        let mut len_buf = Vec::new();
        let mut framed = 0usize; // framed octets seen
        let mut total: Option<usize> = None; // framed length once known
        let mut header_pos: Option<u32> = None;
        let mut trailer = Vec::new();
        while *off < wire.len() {
            let pos = markers.map(|s| s.wrapping_add(*off as u32));
            if let Some(p) = pos {
                if p % MARKER_INTERVAL == 0 {
                    let leading = framed == 0;
                    let h = *header_pos.get_or_insert(p.wrapping_add(MARKER_LEN as u32));
                    let expected = if p.wrapping_add(MARKER_LEN as u32) == h {
                        0
                    } else {
                        p.wrapping_sub(h)
                    };
                    assert!(!leading || expected == 0);
                    let pre_trailer = match total {
                        Some(t) => framed <= t - mpa::CRC_LEN,
                        None => true,
                    };
                    let end = (*off + MARKER_LEN).min(wire.len());
                    let m = &wire[*off..end];
                    for i in *off..end {
                        f.markers.push((i, pre_trailer));
                    }
                    if pre_trailer {
                        covered.extend_from_slice(m);
                    }
                    if m.len() == MARKER_LEN {
                        let received = u16::from_be_bytes([m[2], m[3]]);
                        if u32::from(received) & !3 != expected & !3 && f.bad_marker.is_none() {
                            f.bad_marker = Some((expected, received));
                        }
                    }
                    *off = end;
                    continue;
                }
            }
            let b = wire[*off];
            if framed == 0 {
                if let Some(p) = pos {
                    header_pos.get_or_insert(p);
                }
            }
            match total {
                Some(t) if framed >= t - mpa::CRC_LEN => {
                    if framed == t - mpa::CRC_LEN {
                        f.crc_at = Some(*off);
                    }
                    trailer.push(b);
                }
                _ => covered.push(b),
            }
            if framed < mpa::ULPDU_LENGTH_LEN {
                f.len_at.push(*off);
                len_buf.push(b);
            } else if let Some(u) = f.ulen {
                if framed < mpa::ULPDU_LENGTH_LEN + usize::from(u) {
                    f.ulpdu.push(b);
                }
            }
            framed += 1;
            *off += 1;
            if framed == mpa::ULPDU_LENGTH_LEN {
                let u = u16::from_be_bytes([len_buf[0], len_buf[1]]);
                f.ulen = Some(u);
                total = Some(mpa::fpdu_len(u));
            }
            if total == Some(framed) {
                f.complete = true;
                let received = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
                f.crc = Some((crc32c(&covered), received));
                break;
            }
        }
        f.end = *off;
        f
    }

    /// Index of the FPDU holding wire octet `pos`.
    pub fn fpdu_at(&self, pos: usize) -> Option<usize> {
        self.fpdus
            .iter()
            .position(|f| (f.start..f.end).contains(&pos))
    }
}

// ---------------------------------------------------------------------------
// Posted buffers
// ---------------------------------------------------------------------------

/// A posted-buffer query and its answer.
pub type Query = (u32, u32, Opcode, Option<u32>);

/// The caller's posted buffers: fixed answers per queue, or the exact
/// length of each message (by QN and MSN). Every query is logged.
#[derive(Clone, Debug)]
pub struct Posted {
    /// Per QN: the length of the buffer at the head (`None`: nothing
    /// posted).
    pub per_queue: [Option<u32>; QUEUE_COUNT],
    /// If set: answers by (QN, MSN) instead, with the opcode the message
    /// must have.
    pub per_message: Option<Vec<(u32, u32, Opcode, u32)>>,
    /// The queries so far.
    pub log: Vec<Query>,
}

impl Posted {
    /// Fixed answers per queue.
    pub fn per_queue(per_queue: [Option<u32>; QUEUE_COUNT]) -> Self {
        Posted {
            per_queue,
            per_message: None,
            log: Vec::new(),
        }
    }

    /// A buffer of the exact length for every untagged message of `r`.
    pub fn exact(r: &RefStream) -> Self {
        let per_message = r
            .msgs
            .iter()
            .filter_map(|m| {
                let qn = m.opcode().queue_number()?;
                Some((qn, m.msn?, m.opcode(), m.payload.len() as u32))
            })
            .collect();
        Posted {
            per_queue: [None; QUEUE_COUNT],
            per_message: Some(per_message),
            log: Vec::new(),
        }
    }

    /// The answer for a query, without logging it. With per-message
    /// answers the opcode is not compared (the recorded one is what the
    /// script sent).
    pub fn answer(&self, qn: u32, msn: u32, _opcode: Opcode) -> Option<u32> {
        match &self.per_message {
            Some(list) => list
                .iter()
                // By QN and MSN only: a flipped octet may change the
                // opcode the receiver asks with.
                .find(|&&(q, m, _, _)| (q, m) == (qn, msn))
                .map(|&(_, _, _, len)| len),
            None => self.per_queue.get(qn as usize).copied().flatten(),
        }
    }
}

impl PostedBuffers for Posted {
    fn posted_len(&mut self, qn: u32, msn: u32, opcode: Opcode) -> Option<u32> {
        let a = self.answer(qn, msn, opcode);
        assert!(
            !self.log.iter().any(|&(q, m, _, _)| (q, m) == (qn, msn)),
            "asked twice for QN {qn} MSN {msn}"
        );
        self.log.push((qn, msn, opcode, a));
        a
    }
}

// ---------------------------------------------------------------------------
// Events and outcomes
// ---------------------------------------------------------------------------

/// An event with its payload copied; Data continuing the previous Data is
/// merged into it, so that different splits of a stream compare equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ev {
    /// [`RxEvent::Header`], with the receiver's fixed payload then.
    Header(SegmentHeader, Option<FixedPayload>),
    /// [`RxEvent::Data`], merged.
    Data(Target, Vec<u8>),
    /// [`RxEvent::Done`], with the receiver's fixed payload then.
    Done(SegmentDone, Option<FixedPayload>),
}

fn push_event(events: &mut Vec<Ev>, ev: &RxEvent<'_>, fixed: Option<&FixedPayload>) {
    match *ev {
        RxEvent::Data(p) => {
            if let Some(Ev::Data(t, bytes)) = events.last_mut() {
                if advanced(*t, bytes.len() as u64) == p.target {
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

/// What a receiver run produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The events.
    pub events: Vec<Ev>,
    /// The fatal error.
    pub error: Option<RxError>,
    /// `Done` events.
    pub dones: usize,
    /// `at_fpdu_boundary()` at the end.
    pub boundary: bool,
    /// `stream_pos()` at the end (without error).
    pub stream_pos: Option<u32>,
    /// The posted-buffer queries.
    pub queries: Vec<Query>,
    /// A Terminate was received.
    pub terminated: bool,
}

/// The Terminate code the receiver must use for an error kind (`None` for
/// a kind it must never report).
pub fn code_of(kind: &RxErrorKind, rejected: Option<TermCode>) -> Option<TermCode> {
    let unexpected = TermCode::RdmapRemoteOperation(RemoteOperationCode::UnexpectedOpcode);
    Some(match *kind {
        RxErrorKind::UlpduLength(_) => TermCode::Mpa(MpaCode::MarkerMismatch),
        RxErrorKind::Mpa(e) => match e {
            MpaError::BadCrc { .. } | MpaError::MarkerMismatch { .. } => {
                TermCode::Mpa(MpaCode::from_u8(e.term_code()?)?)
            }
            _ => return None,
        },
        RxErrorKind::Ddp(e) => e.into(),
        RxErrorKind::Rdmap(e) => e.into(),
        RxErrorKind::Untagged(e) => e.into(),
        RxErrorKind::Tagged(e) => e.into(),
        RxErrorKind::OpcodeChanged { .. } | RxErrorKind::DataAfterTerminate => unexpected,
        RxErrorKind::Rejected => rejected?,
        RxErrorKind::Internal => return None,
    })
}

/// Checks an error's Terminate: code per kind, consistency, the headers
/// its code's policy attaches (those of `segment`, the offending ULPDU as
/// far as received, with DDP Segment Length `ulen` minus the header), and
/// the round trip through `emit_message` and `TerminateRepr::parse`.
pub fn check_error(e: &RxError, rejected: Option<TermCode>, segment: &[u8], ulen: Option<u16>) {
    let code = code_of(&e.kind, rejected)
        .unwrap_or_else(|| panic!("receiver reported {e:?} (rejected: {rejected:?})"));
    assert_eq!(e.code(), code, "{e:?}");
    assert!(e.terminate.is_consistent(), "{e:?}");
    assert_eq!(
        e.should_send_terminate(),
        e.kind != RxErrorKind::DataAfterTerminate
    );
    let hlen = segment
        .first()
        .map_or(0, |&b| ControlField(u16::from(b) << 8).header_len());
    let dsl = usize::from(ulen.unwrap_or(0)).saturating_sub(hlen);
    let want = TerminateRepr::for_segment(code, segment, dsl as u16);
    assert_eq!(e.terminate, want, "{e:?}: Terminate for the segment");
    if code.header_policy() != HeaderPolicy::Nothing {
        assert!(
            e.terminate.ddp_header.is_some(),
            "{e:?}: the offending header is not attached"
        );
    }
    let mut buf = [0u8; UNTAGGED_HEADER_LEN + terminate::MAX_LEN];
    let n = e
        .terminate
        .emit_message(1, &mut buf)
        .expect("emit_message of the error's Terminate");
    assert_eq!(n, e.terminate.message_len());
    assert_eq!(
        DdpHeader::parse(&buf[..n]),
        Ok(terminate::terminate_header(1))
    );
    assert_eq!(
        TerminateRepr::parse(&buf[UNTAGGED_HEADER_LEN..n]),
        Ok(e.terminate),
        "Terminate round trip"
    );
    let _ = format!("{e}");
}

// ---------------------------------------------------------------------------
// The checked driver
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Partial {
    received: u32,
    buffer: u32,
    op: Opcode,
}

#[derive(Clone, Copy, Debug)]
struct QModel {
    next_msn: u32,
    partial: Option<Partial>,
}

#[derive(Clone, Copy, Debug)]
struct TModel {
    stag: u32,
    next_to: u64,
    op: Opcode,
    at_top: bool,
    total: u64,
}

/// The DDP queue state the receiver must keep, and the open segment.
struct Model<'f> {
    cfg: RxConfig,
    queues: u32,
    framing: &'f Framing,
    q: [QModel; QUEUE_COUNT],
    t: Option<TModel>,
    terminated: bool,
    /// FPDU index of the current segment (= `Done` events so far).
    k: usize,
    /// Query log length when the current FPDU started.
    log_at_fpdu: usize,
    /// The open segment: header, octets placed, buffer bound, message
    /// length to report.
    open: Option<(SegmentHeader, u64, u64, Option<u64>)>,
}

impl<'f> Model<'f> {
    fn new(cfg: &RxConfig, framing: &'f Framing) -> Self {
        Model {
            cfg: *cfg,
            queues: cfg.queues.min(QUEUE_COUNT as u32),
            framing,
            q: [QModel {
                next_msn: INITIAL_MSN,
                partial: None,
            }; QUEUE_COUNT],
            t: None,
            terminated: false,
            k: 0,
            log_at_fpdu: 0,
            open: None,
        }
    }

    fn fpdu(&self) -> &'f RefFpdu {
        self.framing
            .fpdus
            .get(self.k)
            .unwrap_or_else(|| panic!("receiver reports FPDU {} beyond the stream", self.k))
    }

    /// The stateless verdict on the current FPDU's segment: its parsed
    /// header and opcode, or the DDP/RDMAP error the receiver must report
    /// before looking at any state. (Without the fixed-payload parse.)
    fn stateless(&self) -> Result<(DdpHeader, Opcode, usize), RxErrorKind> {
        let f = self.fpdu();
        let ulen = usize::from(f.ulen.expect("ULPDU_Length"));
        let c = ControlField(u16::from_be_bytes([f.ulpdu[0], f.ulpdu[1]]));
        let hlen = c.header_len();
        if ulen < hlen {
            return Err(RxErrorKind::Ddp(DdpError::Truncated {
                needed: hlen,
                available: ulen,
            }));
        }
        c.check_versions().map_err(RxErrorKind::Ddp)?;
        let hdr = DdpHeader::parse(&f.ulpdu).map_err(RxErrorKind::Ddp)?;
        let op = rdmap::validate(&hdr, self.cfg.extensions).map_err(RxErrorKind::Rdmap)?;
        let payload = ulen - hlen;
        if !op.carries_ulp_data() {
            rdmap::check_payload_len(op, payload).map_err(RxErrorKind::Rdmap)?;
            if payload > MAX_FIXED_LEN {
                return Err(RxErrorKind::Rdmap(RdmapError::PayloadLength {
                    opcode: op,
                    expected: terminate::MAX_LEN,
                    actual: payload,
                }));
            }
        }
        Ok((hdr, op, payload))
    }

    fn header(&mut self, h: &SegmentHeader, fixed: Option<&FixedPayload>, log: &[Query]) {
        assert!(self.open.is_none(), "Header inside a segment: {h:?}");
        assert!(!self.terminated, "Header after a Terminate");
        let f = self.fpdu();
        let ulen = f.ulen.expect("ULPDU_Length");
        assert!(ulen >= MIN_ULPDU_LEN && ulen <= self.cfg.max_ulpdu_len);
        let (hdr, op, payload) = self
            .stateless()
            .unwrap_or_else(|e| panic!("Header {h:?} for a segment with error {e:?}"));
        assert_eq!(h.opcode, op);
        assert_eq!(h.last, hdr.last);
        assert_eq!(h.target, target_of(&hdr));
        assert_eq!(
            h.payload_len as usize, payload,
            "payload = ULPDU_Length - header"
        );
        assert_eq!(h.invalidate_stag, rdmap::invalidate_stag(&hdr));
        if op.carries_ulp_data() {
            assert_eq!(fixed, None);
        } else {
            let hl = hdr.header_len();
            let body = &f.ulpdu[hl..hl + payload];
            let want = parse_fixed(op, body).expect("fixed payload");
            assert_eq!(fixed, Some(&want));
        }
        let new_queries = &log[self.log_at_fpdu..];
        let len = h.payload_len;
        let (bound, msg_len) = match hdr.buffer {
            BufferFields::Untagged(u) => {
                assert!(u.qn < self.queues, "QN {} accepted", u.qn);
                let q = &mut self.q[u.qn as usize];
                assert_eq!(u.msn, q.next_msn, "MSN");
                let buffer = match q.partial {
                    Some(p) => {
                        assert!(!h.first);
                        assert_eq!(u.mo, p.received, "MO continues the message");
                        assert_eq!(p.op, op, "opcode within a message");
                        assert!(new_queries.is_empty(), "query within a message");
                        p.buffer
                    }
                    None => {
                        assert!(h.first);
                        assert_eq!(u.mo, 0, "first segment at MO 0");
                        if op == Opcode::Terminate {
                            assert!(new_queries.is_empty(), "query for a Terminate");
                            u32::MAX
                        } else {
                            assert_eq!(new_queries.len(), 1, "one query per message");
                            let (qn, msn, qop, a) = new_queries[0];
                            assert_eq!((qn, msn, qop), (u.qn, u.msn, op));
                            let b = a.expect("accepted without a buffer");
                            if op.carries_ulp_data() {
                                b
                            } else {
                                u32::MAX
                            }
                        }
                    }
                };
                let needed = u64::from(u.mo) + u64::from(len);
                assert!(needed <= u64::from(buffer), "message beyond its buffer");
                if h.last {
                    q.next_msn = q.next_msn.wrapping_add(1);
                    q.partial = None;
                } else {
                    q.partial = Some(Partial {
                        received: needed as u32,
                        buffer,
                        op,
                    });
                }
                (
                    u64::from(buffer) - u64::from(u.mo),
                    h.last.then_some(needed),
                )
            }
            BufferFields::Tagged(t) => {
                assert!(new_queries.is_empty(), "query for a tagged segment");
                let prev = self.t;
                match prev {
                    Some(p) => {
                        assert!(!h.first);
                        assert_eq!(
                            (t.stag, t.to, op),
                            (p.stag, p.next_to, p.op),
                            "continuation"
                        );
                        assert!(!(p.at_top && len > 0), "TO wrapped");
                    }
                    None => assert!(h.first),
                }
                assert!(last_to(t.to, len).is_ok(), "TO wrapped");
                let total = prev.map_or(0, |p| p.total) + u64::from(len);
                let reaches_top = len > 0 && t.to.checked_add(u64::from(len)).is_none();
                self.t = if h.last {
                    None
                } else {
                    Some(TModel {
                        stag: t.stag,
                        next_to: t.to.wrapping_add(u64::from(len)),
                        op,
                        at_top: prev.is_some_and(|p| p.at_top) || reaches_top,
                        total,
                    })
                };
                ((1u64 << 63) - 1, h.last.then_some(total))
            }
        };
        self.open = Some((*h, 0, bound, msg_len));
    }

    fn data(&mut self, target: Target, data: &[u8]) {
        let f = self.fpdu();
        let (h, placed, bound, _) = self.open.as_mut().expect("Data outside a segment");
        assert!(
            h.opcode.carries_ulp_data(),
            "Data of a fixed-format segment"
        );
        assert!(!data.is_empty(), "empty Data");
        assert_eq!(target, advanced(h.target, *placed), "Data not contiguous");
        let end = *placed + data.len() as u64;
        assert!(end <= u64::from(h.payload_len), "Data past the payload");
        assert!(end <= *bound, "Data past the posted buffer");
        if let Target::Tagged { to, .. } = h.target {
            assert!(
                u128::from(to) + u128::from(end) <= 1u128 << 64,
                "Data past TO 2^64"
            );
        }
        let hl = header_len(h.opcode);
        let from = hl + *placed as usize;
        assert_eq!(data, &f.ulpdu[from..from + data.len()], "Data octets");
        *placed = end;
    }

    fn done(&mut self, d: &SegmentDone, fixed: Option<&FixedPayload>) {
        let f = self.fpdu();
        let (h, placed, _, msg_len) = self.open.take().expect("Done outside a segment");
        assert_eq!(d.header, h);
        assert_eq!(
            fixed.is_none(),
            h.opcode.carries_ulp_data(),
            "fixed payload at Done"
        );
        if h.opcode.carries_ulp_data() {
            assert_eq!(placed, u64::from(h.payload_len), "Done before all Data");
        }
        assert_eq!(d.message_len, msg_len, "message length");
        assert!(f.complete, "Done of an incomplete FPDU");
        if self.cfg.crc {
            let (c, r) = f.crc.expect("CRC");
            assert_eq!(c, r, "Done despite a CRC mismatch");
        }
        assert_eq!(f.bad_marker, None, "Done despite a bad marker");
        if h.opcode == Opcode::Terminate {
            self.terminated = true;
        }
        self.k += 1;
    }

    /// Whether the receiver had reason for `e` at the current FPDU.
    fn justify(&self, e: &RxError, rejected: Option<TermCode>, log: &[Query]) {
        let f = self.fpdu();
        let new_queries = &log[self.log_at_fpdu..];
        // Only the framing (CRC, markers) and the caller can fail a segment
        // whose Header was reported.
        if !matches!(
            e.kind,
            RxErrorKind::Rejected | RxErrorKind::DataAfterTerminate | RxErrorKind::Mpa(_)
        ) {
            assert!(self.open.is_none(), "{e:?} after the Header");
        }
        match e.kind {
            RxErrorKind::UlpduLength(u) => {
                assert_eq!(f.ulen, Some(u));
                assert!(u < MIN_ULPDU_LEN || u > self.cfg.max_ulpdu_len, "{e:?}");
            }
            RxErrorKind::Mpa(MpaError::BadCrc { computed, received }) => {
                assert!(self.cfg.crc && computed != received, "{e:?}");
                assert_eq!(f.crc, Some((computed, received)), "{e:?}");
            }
            RxErrorKind::Mpa(MpaError::MarkerMismatch { expected, received }) => {
                assert!(self.cfg.markers.is_some());
                assert_eq!(f.bad_marker, Some((expected, received)), "{e:?}");
            }
            RxErrorKind::Mpa(_) | RxErrorKind::Internal => panic!("receiver reported {e:?}"),
            RxErrorKind::Ddp(_) => assert_eq!(self.stateless().err(), Some(e.kind)),
            RxErrorKind::Rdmap(re) => match self.stateless() {
                Err(k) => assert_eq!(k, e.kind),
                Ok((hdr, op, payload)) => {
                    let hl = hdr.header_len();
                    let body = &f.ulpdu[hl..hl + payload];
                    assert!(!op.carries_ulp_data(), "{e:?}");
                    assert_eq!(parse_fixed(op, body).err(), Some(re));
                }
            },
            RxErrorKind::Untagged(ue) => {
                let (hdr, op, payload) = self
                    .stateless()
                    .unwrap_or_else(|k| panic!("{e:?} where {k:?} was due"));
                let u = hdr
                    .untagged_fields()
                    .expect("untagged error of a tagged segment");
                self.justify_untagged(ue, &u, op, payload as u32, new_queries);
            }
            RxErrorKind::Tagged(te) => {
                let (hdr, op, payload) = self
                    .stateless()
                    .unwrap_or_else(|k| panic!("{e:?} where {k:?} was due"));
                let t = hdr
                    .tagged_fields()
                    .expect("tagged error of an untagged segment");
                assert!(new_queries.is_empty());
                let len = payload as u32;
                let wraps = last_to(t.to, len).is_err();
                match (te, self.t) {
                    (TaggedError::InvalidStag(s), Some(p)) => {
                        assert!(s == t.stag && s != p.stag && p.op == op, "{e:?}")
                    }
                    (TaggedError::BaseBounds, Some(p)) => {
                        assert!(t.stag == p.stag && t.to != p.next_to && p.op == op, "{e:?}")
                    }
                    (TaggedError::ToWrap, p) => assert!(
                        wraps || p.is_some_and(|p| p.at_top && len > 0 && p.next_to == t.to),
                        "{e:?}"
                    ),
                    _ => panic!("{e:?} with tagged state {:?}", self.t),
                }
            }
            RxErrorKind::OpcodeChanged { expected, got } => {
                let (hdr, op, _) = self
                    .stateless()
                    .unwrap_or_else(|k| panic!("{e:?} where {k:?} was due"));
                assert_eq!(got, op);
                assert_ne!(expected, got);
                assert!(new_queries.is_empty());
                match hdr.buffer {
                    BufferFields::Untagged(u) => {
                        assert!(u.qn < self.queues, "{e:?}");
                        let q = self.q[u.qn as usize];
                        assert!(u.msn == q.next_msn, "{e:?}");
                        assert_eq!(q.partial.map(|p| p.op), Some(expected), "{e:?}");
                    }
                    BufferFields::Tagged(_) => {
                        assert_eq!(self.t.map(|p| p.op), Some(expected), "{e:?}")
                    }
                }
            }
            RxErrorKind::DataAfterTerminate => assert!(self.terminated, "{e:?}"),
            RxErrorKind::Rejected => assert!(rejected.is_some() && self.open.is_some()),
        }
    }

    fn justify_untagged(
        &self,
        ue: UntaggedError,
        u: &UntaggedFields,
        op: Opcode,
        len: u32,
        new_queries: &[Query],
    ) {
        if let UntaggedError::InvalidQn(qn) = ue {
            assert!(qn == u.qn && qn >= self.queues, "{ue:?}");
            assert!(new_queries.is_empty());
            return;
        }
        assert!(u.qn < self.queues, "{ue:?} for QN {}", u.qn);
        let q = self.q[u.qn as usize];
        if let UntaggedError::MsnRange { expected, got } = ue {
            assert!(
                got == u.msn && expected == q.next_msn && got != expected,
                "{ue:?}"
            );
            assert!(new_queries.is_empty());
            return;
        }
        assert_eq!(u.msn, q.next_msn, "{ue:?}");
        if let Some(p) = q.partial {
            assert_eq!(p.op, op, "{ue:?}");
        }
        // The buffer: the message's, or the answer to the query just made.
        let buffer = match q.partial {
            Some(p) => {
                assert!(new_queries.is_empty());
                Some(p.buffer)
            }
            None if op == Opcode::Terminate => {
                assert!(new_queries.is_empty());
                Some(u32::MAX)
            }
            None => {
                assert_eq!(new_queries.len(), 1, "{ue:?}: one query");
                let (qn, msn, qop, a) = new_queries[0];
                assert_eq!((qn, msn, qop), (u.qn, u.msn, op));
                a.map(|b| if op.carries_ulp_data() { b } else { u32::MAX })
            }
        };
        let received = q.partial.map_or(0, |p| p.received);
        match ue {
            UntaggedError::MsnNoBuffer { msn } => {
                assert!(msn == u.msn && buffer.is_none(), "{ue:?}")
            }
            UntaggedError::InvalidMo { expected, got } => {
                assert!(buffer.is_some(), "{ue:?}");
                assert!(
                    expected == received && got == u.mo && got != expected,
                    "{ue:?}"
                );
            }
            UntaggedError::MessageTooLong { buffer_len, needed } => {
                assert_eq!(u.mo, received, "{ue:?}");
                assert_eq!(Some(buffer_len), buffer, "{ue:?}");
                assert_eq!(needed, u64::from(u.mo) + u64::from(len), "{ue:?}");
                assert!(needed > u64::from(buffer_len), "{ue:?}");
            }
            _ => unreachable!(),
        }
    }

    fn after_done_getters<C: CrcEngine>(&self, rx: &Receiver<C>) {
        for qn in 0..QUEUE_COUNT as u32 {
            assert_eq!(rx.expected_msn(qn), Some(self.q[qn as usize].next_msn));
        }
        assert_eq!(rx.expected_msn(QUEUE_COUNT as u32), None);
        assert_eq!(rx.is_terminated(), self.terminated);
    }
}

/// Piece sizes for [`drive`]: each call gives the next size (0 = an empty
/// piece); `usize::MAX` = the rest.
pub type Cuts<'c> = &'c mut dyn FnMut() -> usize;

/// The pieces `cuts` makes of `wire`, in order: at least one (an empty
/// wire gives one empty piece); at most 64 empty pieces, after which a 0
/// from `cuts` means the rest (a schedule of zeros must not spin forever).
struct Pieces<'w, 'c> {
    wire: &'w [u8],
    cuts: Cuts<'c>,
    /// Where the next piece starts.
    at: usize,
    empties: usize,
    first: bool,
}

impl<'w, 'c> Pieces<'w, 'c> {
    fn new(wire: &'w [u8], cuts: Cuts<'c>) -> Self {
        Pieces {
            wire,
            cuts,
            at: 0,
            empties: 64,
            first: true,
        }
    }
}

impl<'w> Iterator for Pieces<'w, '_> {
    type Item = &'w [u8];

    fn next(&mut self) -> Option<&'w [u8]> {
        if !self.first && self.at >= self.wire.len() {
            return None;
        }
        self.first = false;
        let mut n = (self.cuts)();
        if n == 0 {
            if self.empties == 0 {
                n = usize::MAX;
            } else {
                self.empties -= 1;
            }
        }
        let end = self.at.saturating_add(n).min(self.wire.len());
        let piece = &self.wire[self.at..end];
        self.at = end;
        Some(piece)
    }
}

/// Feeds `wire` to a new [`Receiver`] in the pieces `cuts` gives, with the
/// caller's buffers `posted`; at the `reject.0`-th `Header` event (counted
/// from 0) calls `reject(reject.1)`. Checks:
///
/// - `feed` consumes at most the piece; `Ok(None)` consumes it all; an
///   event consumes at least one octet; after an `Err` every call (any
///   input, and `reject`) returns the same error with 0 consumed;
/// - events come as `Header`, `Data`*, `Done` per segment; `Data` is
///   non-empty, contiguous from the header's target, within the payload,
///   the posted buffer and the TO space, and holds exactly the ULPDU
///   octets; the payload length is ULPDU_Length minus the header;
/// - every header agrees with the reference framing's ULPDU (parsed with
///   `DdpHeader::parse`, `rdmap::validate`, the fixed-payload parsers) and
///   with the DDP state model (MSN, MO, buffer, STag/TO continuity, opcode
///   within a message, one posted-buffer query per untagged message at its
///   first segment); `Done` only for a complete FPDU with a good CRC and
///   markers, with the message length at the last segment;
/// - every error is justified by the reference framing and the model, has
///   the code its kind maps to and the Terminate `for_segment` builds for
///   the offending ULPDU, which round-trips;
/// - without error: every complete FPDU produced `Done`,
///   `at_fpdu_boundary()` holds exactly when the stream ends between FPDUs
///   (or after a Terminate), and the marker position is the start plus the
///   octets consumed.
pub fn drive(
    cfg: &RxConfig,
    wire: &[u8],
    framing: &Framing,
    cuts: Cuts<'_>,
    posted: Posted,
    reject: Option<(usize, TermCode)>,
) -> Outcome {
    let mut posted = posted;
    let mut rx = Receiver::new(*cfg, SoftCrc32c::new());
    assert_eq!(rx.config().queues, cfg.queues.min(QUEUE_COUNT as u32));
    assert!(rx.at_fpdu_boundary());
    assert_eq!(rx.stream_pos(), cfg.markers);
    let mut model = Model::new(cfg, framing);
    let mut events = Vec::new();
    let mut headers = 0usize;
    let mut error: Option<RxError> = None;
    let mut rejected = None;
    let mut pieces = Pieces::new(wire, cuts);
    'pieces: for piece in pieces.by_ref() {
        let mut rest = piece;
        loop {
            let (used, r) = rx.feed(rest, &mut posted);
            assert!(used <= rest.len(), "consumed {used} of {}", rest.len());
            match r {
                Ok(None) => {
                    assert_eq!(used, rest.len(), "Ok(None) must consume everything");
                    break;
                }
                Ok(Some(ev)) => {
                    assert!(used > 0, "event without progress: {ev:?}");
                    rest = &rest[used..];
                    match ev {
                        RxEvent::Header(h) => {
                            model.header(&h, rx.fixed_payload(), &posted.log);
                            assert_eq!(rx.current(), Some(&h));
                            headers += 1;
                        }
                        RxEvent::Data(p) => model.data(p.target, p.data),
                        RxEvent::Done(d) => {
                            model.done(&d, rx.fixed_payload());
                            assert_eq!(rx.current(), Some(&d.header));
                            model.after_done_getters(&rx);
                            model.log_at_fpdu = posted.log.len();
                        }
                    }
                    push_event(&mut events, &ev, rx.fixed_payload());
                    if let (RxEvent::Header(_), Some((idx, code))) = (ev, reject) {
                        if headers == idx + 1 {
                            let e = rx.reject(code);
                            assert_eq!(e.kind, RxErrorKind::Rejected);
                            rejected = Some(code);
                            error = Some(e);
                            break 'pieces;
                        }
                    }
                }
                Err(e) => {
                    rest = &rest[used..];
                    let _ = rest;
                    error = Some(e);
                    break 'pieces;
                }
            }
        }
    }
    if let Some(e) = error {
        let f = framing.fpdus.get(model.k);
        model.justify(&e, rejected, &posted.log);
        let f = f.expect("error beyond the stream");
        check_error(&e, rejected, &f.ulpdu, f.ulen);
        // Sticky.
        for input in [
            &wire[pieces.at.min(wire.len())..],
            &[][..],
            &[0u8, 1, 2][..],
        ] {
            let (used, r) = rx.feed(input, &mut posted);
            assert_eq!((used, r), (0, Err(e)), "after the error");
        }
        let mut s: &[u8] = &[7, 7];
        assert_eq!(rx.poll(&mut s, &mut posted), Err(e));
        assert_eq!(s.len(), 2);
        assert_eq!(
            rx.reject(TermCode::RdmapLocalCatastrophic(1)),
            e,
            "reject after the error"
        );
        assert_eq!(rx.error(), Some(&e));
        assert!(!rx.at_fpdu_boundary(), "a failed stream is at no boundary");
    } else {
        assert_eq!(rx.error(), None);
        assert!(model.open.is_none() || !framing.fpdus.last().is_some_and(|f| f.complete));
        let complete = framing.fpdus.iter().filter(|f| f.complete).count();
        let clean = framing.fpdus.last().is_none_or(|f| f.complete);
        if model.terminated {
            assert_eq!(model.k, framing.fpdus.len(), "input after a Terminate");
            assert!(rx.at_fpdu_boundary());
        } else {
            assert_eq!(model.k, complete, "complete FPDUs without Done");
            assert_eq!(
                rx.at_fpdu_boundary(),
                clean,
                "at_fpdu_boundary() after {} of {} octets ({} FPDUs, last complete: {clean})",
                pieces.at,
                wire.len(),
                framing.fpdus.len()
            );
        }
        assert_eq!(
            rx.stream_pos(),
            cfg.markers.map(|s| s.wrapping_add(wire.len() as u32)),
            "marker position"
        );
    }
    Outcome {
        dones: model.k,
        boundary: rx.at_fpdu_boundary(),
        stream_pos: if error.is_none() {
            rx.stream_pos()
        } else {
            None
        },
        terminated: rx.is_terminated(),
        events,
        error,
        queries: posted.log,
    }
}

/// Cuts for one piece holding everything.
pub fn whole() -> impl FnMut() -> usize {
    || usize::MAX
}

/// Cuts of one octet.
pub fn octets() -> impl FnMut() -> usize {
    || 1
}

// ---------------------------------------------------------------------------
// Expected outcomes of reference streams
// ---------------------------------------------------------------------------

/// What a [`RefStream`] must produce.
#[derive(Clone, Debug, Default)]
pub struct Expected {
    /// The events.
    pub events: Vec<Ev>,
    /// Index into `events` where each FPDU's events start.
    pub seg_events: Vec<usize>,
    /// The error kind and its Terminate, if the configuration (or a
    /// Terminate, or the rejection) stops the stream.
    pub error: Option<(RxErrorKind, TerminateRepr)>,
    /// The FPDU at which the stream stops (`segs.len()` if it does not).
    pub stop: usize,
    /// The posted-buffer queries.
    pub queries: Vec<(u32, u32, Opcode)>,
}

/// The outcome of receiving the first `nsegs` FPDUs of `r` with `cfg`,
/// the buffers `posted` and the rejection `reject` (as in [`drive`]).
pub fn expected_outcome(
    r: &RefStream,
    nsegs: usize,
    cfg: &RxConfig,
    posted: &Posted,
    reject: Option<(usize, TermCode)>,
) -> Expected {
    let mut x = Expected {
        stop: nsegs,
        ..Expected::default()
    };
    let queues = cfg.queues.min(QUEUE_COUNT as u32);
    let mut buffer = [0u32; QUEUE_COUNT];
    let mut terminated = false;
    let mut headers = 0usize;
    for (k, s) in r.segs[..nsegs].iter().enumerate() {
        x.seg_events.push(x.events.len());
        let m = &r.msgs[s.msg];
        let op = m.opcode();
        let hlen = s.header.header_len();
        let dsl = (usize::from(s.ulen) - hlen) as u16;
        let fail = |kind: RxErrorKind, rejected: Option<TermCode>| {
            let code = code_of(&kind, rejected).expect("a reportable error");
            (kind, TerminateRepr::for_segment(code, &s.head, dsl))
        };
        let error = if terminated {
            Some(fail(RxErrorKind::DataAfterTerminate, None))
        } else if s.ulen < MIN_ULPDU_LEN || s.ulen > cfg.max_ulpdu_len {
            Some(fail(RxErrorKind::UlpduLength(s.ulen), None))
        } else if !cfg.extensions.allows(op) {
            Some(fail(
                RxErrorKind::Rdmap(RdmapError::ExtensionDisabled(op)),
                None,
            ))
        } else {
            match s.header.untagged_fields() {
                Some(u) if u.qn >= queues => Some(fail(
                    RxErrorKind::Untagged(UntaggedError::InvalidQn(u.qn)),
                    None,
                )),
                Some(u) => {
                    let q = u.qn as usize;
                    let mut e = None;
                    if u.mo == 0 && op != Opcode::Terminate {
                        let a = posted.answer(u.qn, u.msn, op);
                        x.queries.push((u.qn, u.msn, op));
                        match (a, op.payload()) {
                            (None, _) => {
                                e = Some(UntaggedError::MsnNoBuffer { msn: u.msn });
                            }
                            (Some(b), PayloadKind::Ulp) => buffer[q] = b,
                            (Some(_), _) => buffer[q] = u32::MAX,
                        }
                    } else if u.mo == 0 {
                        buffer[q] = u32::MAX;
                    }
                    let needed = u64::from(u.mo) + u64::from(s.len) + m.fixed.len() as u64;
                    if e.is_none() && needed > u64::from(buffer[q]) {
                        e = Some(UntaggedError::MessageTooLong {
                            buffer_len: buffer[q],
                            needed,
                        });
                    }
                    e.map(|e| fail(RxErrorKind::Untagged(e), None))
                }
                None => None,
            }
        };
        if let Some(e) = error {
            x.error = Some(e);
            x.stop = k;
            return x;
        }
        let h = r.expected_header(k);
        let fixed = r.expected_fixed(k);
        x.events.push(Ev::Header(h, fixed));
        headers += 1;
        if let Some((idx, code)) = reject {
            if headers == idx + 1 {
                x.error = Some(fail(RxErrorKind::Rejected, Some(code)));
                x.stop = k;
                return x;
            }
        }
        if s.len > 0 {
            let p = &m.payload[s.offset as usize..(s.offset + s.len) as usize];
            x.events.push(Ev::Data(h.target, p.to_vec()));
        }
        let done = SegmentDone {
            header: h,
            message_len: s.header.last.then(|| m.total_len()),
        };
        x.events.push(Ev::Done(done, fixed));
        terminated = op == Opcode::Terminate;
    }
    x
}

/// Checks a receiver outcome against the expected one.
pub fn check_expected(o: &Outcome, x: &Expected) {
    assert_eq!(o.events, x.events, "events");
    assert_eq!(
        o.error.map(|e| (e.kind, e.terminate)),
        x.error,
        "error (events were as expected)"
    );
    let q: Vec<_> = o.queries.iter().map(|&(a, b, c, _)| (a, b, c)).collect();
    assert_eq!(q, x.queries, "posted-buffer queries");
    if x.error.is_none() {
        assert_eq!(o.dones, x.stop);
        assert!(o.boundary, "not at an FPDU boundary after the last FPDU");
    }
}

/// Checks the outcome `o` of receiving `r`'s stream with the octet at
/// `pos` xor-ed with `mask` (non-zero), where the clean stream gives `x`:
/// the FPDUs before the flipped one give the same events; if the clean
/// stream stops before it, the outcome is the same; with CRC a flip is
/// detected by the end of its FPDU (that segment never gets `Done`),
/// except in a ULPDU_Length field (which reframes the stream) or in a
/// marker octet the CRC does not cover and the receiver ignores. Returns
/// whether the flip had to be detected.
pub fn check_flip(
    r: &RefStream,
    clean: &Framing,
    x: &Expected,
    o: &Outcome,
    pos: usize,
    mask: u8,
) -> bool {
    let j = r.seg_at(pos).expect("flip inside the stream");
    if x.stop < j {
        assert_eq!(o.events, x.events, "flip after the stop: events");
        assert_eq!(o.error.map(|e| (e.kind, e.terminate)), x.error);
        return false;
    }
    let prefix = x.seg_events.get(j).copied().unwrap_or(x.events.len());
    assert!(
        o.events.len() >= prefix && o.events[..prefix] == x.events[..prefix],
        "events before the flipped FPDU {j} changed"
    );
    assert!(o.dones >= j);
    let f = &clean.fpdus[clean.fpdu_at(pos).expect("flip in the framing")];
    assert_eq!(f.start, r.segs[j].wire.start);
    let detectable = r.crc
        && match f.role(pos) {
            Role::Length => false,
            Role::Marker {
                covered: false,
                octet,
            } => octet == 2 || (octet == 3 && mask & !3 != 0),
            _ => true,
        };
    if detectable {
        assert!(o.error.is_some(), "flip at {pos} (FPDU {j}) not detected");
        assert_eq!(o.dones, j, "flipped FPDU {j} got Done");
    }
    detectable
}

/// [`drive`]s `wire` three times: in one piece, one octet at a time, and in
/// the pieces of `sched` (each run with a fresh copy of `posted`), and
/// checks that the splits make no difference: the same events (Data merged
/// per target), the same error, queries, final position and boundary.
pub fn drive_splits(
    cfg: &RxConfig,
    wire: &[u8],
    framing: &Framing,
    sched: &Schedule<'_>,
    posted: &Posted,
    reject: Option<(usize, TermCode)>,
) -> Outcome {
    let o = drive(cfg, wire, framing, &mut whole(), posted.clone(), reject);
    let by_octet = drive(cfg, wire, framing, &mut octets(), posted.clone(), reject);
    assert_eq!(by_octet, o, "one octet at a time vs one piece");
    let mut sched = sched.clone();
    let mut cuts = || sched.next_size();
    let by_schedule = drive(cfg, wire, framing, &mut cuts, posted.clone(), reject);
    assert_eq!(by_schedule, o, "scheduled pieces vs one piece");
    // Through `poll_segment`, in one piece and in the schedule's.
    let settled = settled(&o);
    let same = |by_segment: Settled, what: &str| {
        if by_segment == settled {
            return;
        }
        // The one way the two may differ: poll_segment checks a whole
        // segment's CRC before the caller sees its header, so a segment
        // the caller refuses at its header (poll: Rejected) ends with the
        // CRC error instead if its CRC fails: what poll gives without the
        // refusal.
        let rejected = matches!(
            settled.1,
            Some(RxError {
                kind: RxErrorKind::Rejected,
                ..
            })
        );
        let bad_crc = matches!(
            by_segment.1,
            Some(RxError {
                kind: RxErrorKind::Mpa(MpaError::BadCrc { .. }),
                ..
            })
        );
        assert!(
            rejected && bad_crc,
            "poll_segment vs poll, {what}: {by_segment:?} vs {settled:?}"
        );
        let unrefused = drive(cfg, wire, framing, &mut whole(), posted.clone(), None);
        assert_eq!(
            by_segment,
            self::settled(&unrefused),
            "poll_segment vs poll unrefused, {what}"
        );
    };
    same(
        drive_segments(cfg, wire, &mut whole(), posted.clone(), reject),
        "one piece",
    );
    let mut sched = sched.clone();
    let mut cuts = || sched.next_size();
    same(
        drive_segments(cfg, wire, &mut cuts, posted.clone(), reject),
        "scheduled pieces",
    );
    o
}

/// What `poll` and `poll_segment` must agree on: the events (after an
/// error, up to the last segment completed before it: `poll` hands out a
/// payload before its CRC is checked, `poll_segment` a whole segment only
/// after), the error, the posted-buffer queries.
type Settled = (Vec<Ev>, Option<RxError>, Vec<Query>);

fn settled(o: &Outcome) -> Settled {
    settle(o.events.clone(), o.error, o.queries.clone())
}

fn settle(mut events: Vec<Ev>, error: Option<RxError>, queries: Vec<Query>) -> Settled {
    if error.is_some() {
        let keep = events
            .iter()
            .rposition(|e| matches!(e, Ev::Done(..)))
            .map_or(0, |i| i + 1);
        events.truncate(keep);
    }
    (events, error, queries)
}

/// [`drive`] through [`Receiver::poll_segment`]: a whole segment counts as
/// its events (its Header, its payload if any, its Done); a rejection at
/// the `reject.0`-th header of a whole segment refuses it after the fact,
/// as the caller of `poll_segment` does. Checks what `poll_segment`
/// promises beyond `poll`: whole segments only without markers, each
/// with its full payload, leaving the receiver at an FPDU boundary.
pub fn drive_segments(
    cfg: &RxConfig,
    wire: &[u8],
    cuts: Cuts<'_>,
    posted: Posted,
    reject: Option<(usize, TermCode)>,
) -> Settled {
    let mut posted = posted;
    let mut rx = Receiver::new(*cfg, SoftCrc32c::new());
    let mut events = Vec::new();
    let mut headers = 0usize;
    let mut error = None;
    'pieces: for piece in Pieces::new(wire, cuts) {
        let mut rest = piece;
        loop {
            let before = rest.len();
            match rx.poll_segment(&mut rest, &mut posted) {
                Ok(None) => {
                    assert!(rest.is_empty(), "Ok(None) must consume everything");
                    break;
                }
                Ok(Some(p)) => {
                    assert!(rest.len() < before, "progress");
                    let evs: Vec<RxEvent<'_>> = match p {
                        Polled::Segment(w) => {
                            assert!(cfg.markers.is_none(), "a whole segment with markers");
                            let h = w.done.header;
                            assert!(h.opcode.carries_ulp_data());
                            assert_eq!(rx.fixed_payload(), None);
                            assert_eq!(w.data.len(), h.payload_len as usize);
                            assert!(rx.at_fpdu_boundary());
                            w.events().collect()
                        }
                        Polled::Event(ev) => vec![ev],
                    };
                    if matches!(evs[0], RxEvent::Header(_)) {
                        headers += 1;
                        if let Some((_, code)) = reject.filter(|r| r.0 + 1 == headers) {
                            // The caller refuses the segment at its header.
                            push_event(&mut events, &evs[0], rx.fixed_payload());
                            let e = rx.reject(code);
                            assert_eq!(e.kind, RxErrorKind::Rejected);
                            error = Some(e);
                            break 'pieces;
                        }
                    }
                    for ev in &evs {
                        push_event(&mut events, ev, rx.fixed_payload());
                    }
                }
                Err(e) => {
                    assert_eq!(rx.error(), Some(&e));
                    error = Some(e);
                    break 'pieces;
                }
            }
        }
    }
    settle(events, error, posted.log)
}

/// Checks [`Framing`] against the reference transmitter on a clean stream:
/// one complete FPDU per segment, at its wire range, with its ULPDU, a
/// matching CRC (with CRC) and only correct markers.
pub fn check_framing(r: &RefStream, f: &Framing) {
    assert_eq!(f.fpdus.len(), r.segs.len(), "FPDUs found by the framing");
    for (s, fp) in r.segs.iter().zip(&f.fpdus) {
        assert_eq!(fp.start..fp.end, s.wire, "FPDU wire range");
        assert!(fp.complete);
        assert_eq!(fp.ulen, Some(s.ulen));
        let m = &r.msgs[s.msg];
        assert_eq!(&fp.ulpdu[..s.head.len()], &s.head[..]);
        assert_eq!(
            &fp.ulpdu[s.head.len()..],
            &m.payload[s.offset as usize..][..s.len as usize]
        );
        if r.crc {
            let (c, got) = fp.crc.expect("CRC of a complete FPDU");
            assert_eq!(c, got, "CRC");
        } else {
            assert_eq!(fp.crc.map(|c| c.1), Some(0), "CRC field without CRC");
        }
        assert_eq!(fp.bad_marker, None);
        if r.markers.is_none() {
            assert!(fp.markers.is_empty(), "markers in a stream without");
        }
        assert_eq!(fp.markers.len() % MARKER_LEN, 0, "a partial marker");
        assert_eq!(
            fp.end - fp.start,
            mpa::fpdu_len(s.ulen) + fp.markers.len(),
            "FPDU length with markers"
        );
    }
}

/// Short name of an error kind (what the targets report).
pub fn kind_name(k: &RxErrorKind) -> &'static str {
    match k {
        RxErrorKind::UlpduLength(_) => "ULPDU length",
        RxErrorKind::Mpa(MpaError::BadCrc { .. }) => "CRC",
        RxErrorKind::Mpa(_) => "marker",
        RxErrorKind::Ddp(_) => "DDP",
        RxErrorKind::Rdmap(_) => "RDMAP",
        RxErrorKind::Untagged(_) => "untagged",
        RxErrorKind::Tagged(_) => "tagged",
        RxErrorKind::OpcodeChanged { .. } => "opcode changed",
        RxErrorKind::DataAfterTerminate => "data after Terminate",
        RxErrorKind::Rejected => "rejected",
        RxErrorKind::Internal => "internal",
    }
}
