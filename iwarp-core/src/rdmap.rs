// SPDX-License-Identifier: GPL-2.0

//! RDMA Protocol (RDMAP, RFC 5040) and its extensions (RFC 7306): opcodes,
//! the fixed-format payloads, and the receive-side header validation.
//!
//! RDMAP rides in the DDP header (see `super::ddp`): its control byte (RV,
//! reserved bits, opcode) is the second byte of the control field, and in
//! untagged messages `RsvdULP[8:39]` carries the Invalidate STag of the two
//! Send with Invalidate variants (zero otherwise). Opcodes and their DDP
//! mapping (RFC 5040 section 4.2, RFC 7306 section 4):
//!
//! | Op  | Message                      | T | QN | DDP payload                 | Inv. STag |
//! |-----|------------------------------|---|----|-----------------------------|-----------|
//! | 0x0 | RDMA Write                   | 1 | -  | ULP data                    | no        |
//! | 0x1 | RDMA Read Request            | 0 | 1  | Read Request header, 28 B   | no        |
//! | 0x2 | RDMA Read Response           | 1 | -  | ULP data                    | no        |
//! | 0x3 | Send                         | 0 | 0  | ULP data                    | no        |
//! | 0x4 | Send with Invalidate         | 0 | 0  | ULP data                    | yes       |
//! | 0x5 | Send with SE                 | 0 | 0  | ULP data                    | no        |
//! | 0x6 | Send with SE and Invalidate  | 0 | 0  | ULP data                    | yes       |
//! | 0x7 | Terminate                    | 0 | 2  | Terminate header, 4..=52 B  | no        |
//! | 0x8 | Immediate Data (7306)        | 0 | 0  | Immediate Data, 8 B         | no        |
//! | 0x9 | Immediate Data with SE (7306)| 0 | 0  | Immediate Data, 8 B         | no        |
//! | 0xA | Atomic Request (7306)        | 0 | 1  | Atomic Request header, 52 B | no        |
//! | 0xB | Atomic Response (7306)       | 0 | 3  | Atomic Response header, 12 B| no        |
//! | 0xC-0xF | reserved                 |   |    |                             |           |
//!
//! The RFC 7306 opcodes are only accepted when the connection enabled them
//! ([`Extensions`]); upstream siw implements neither and answers them with a
//! Terminate "Unexpected OpCode".
//!
//! [`validate`] checks a parsed header against this table and
//! [`check_payload_len`] checks the length of a fixed-format payload; their
//! [`RdmapError`]s map to Terminate codes in `super::terminate`.

use super::ddp::{check_room, get_u32, get_u64, put, DdpHeader, EmitError};

/// QN of Send, Send with Invalidate/SE and Immediate Data messages.
pub const QN_SEND: u32 = 0;
/// QN of RDMA Read Request (and RFC 7306 Atomic Request) messages.
pub const QN_READ_REQUEST: u32 = 1;
/// QN of Terminate messages.
pub const QN_TERMINATE: u32 = 2;
/// QN of RFC 7306 Atomic Response messages.
pub const QN_ATOMIC_RESPONSE: u32 = 3;
/// Number of untagged queues RDMAP uses with the RFC 7306 extensions
/// (`super::ddp::UntaggedQueues::<QUEUE_COUNT>`).
pub const QUEUE_COUNT: usize = 4;

/// Length of the RDMA Read Request header.
pub const READ_REQUEST_LEN: usize = 28;
/// Length of the RFC 7306 Atomic Request header.
pub const ATOMIC_REQUEST_LEN: usize = 52;
/// Length of the RFC 7306 Atomic Response header.
pub const ATOMIC_RESPONSE_LEN: usize = 12;
/// Length of the RFC 7306 Immediate Data payload.
pub const IMMEDIATE_DATA_LEN: usize = 8;
/// Length of the Terminate Control field, the smallest Terminate payload.
pub const TERMINATE_MIN_LEN: usize = 4;
/// Mask of the Atomic Operation Code in the first word of an Atomic Request
/// (the other 28 bits are reserved).
pub const ATOMIC_OPCODE_MASK: u32 = 0x0000_000f;

/// An RDMAP opcode (RFC 5040 and RFC 7306).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write.
    RdmaWrite = 0x0,
    /// RDMA Read Request.
    RdmaReadRequest = 0x1,
    /// RDMA Read Response.
    RdmaReadResponse = 0x2,
    /// Send.
    Send = 0x3,
    /// Send with Invalidate.
    SendInvalidate = 0x4,
    /// Send with Solicited Event.
    SendSe = 0x5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 0x6,
    /// Terminate.
    Terminate = 0x7,
    /// Immediate Data (RFC 7306).
    ImmediateData = 0x8,
    /// Immediate Data with Solicited Event (RFC 7306).
    ImmediateDataSe = 0x9,
    /// Atomic Request (RFC 7306).
    AtomicRequest = 0xa,
    /// Atomic Response (RFC 7306).
    AtomicResponse = 0xb,
}

/// What the DDP payload of a message holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadKind {
    /// ULP data of any length (zero included), possibly over many segments.
    Ulp,
    /// A fixed-format RDMAP header of exactly this many bytes, in a single
    /// segment.
    Fixed(usize),
    /// A Terminate header: 4 to 52 bytes, in a single segment.
    Terminate,
}

impl Opcode {
    /// Every opcode, in wire order.
    pub const ALL: [Opcode; 12] = [
        Opcode::RdmaWrite,
        Opcode::RdmaReadRequest,
        Opcode::RdmaReadResponse,
        Opcode::Send,
        Opcode::SendInvalidate,
        Opcode::SendSe,
        Opcode::SendSeInvalidate,
        Opcode::Terminate,
        Opcode::ImmediateData,
        Opcode::ImmediateDataSe,
        Opcode::AtomicRequest,
        Opcode::AtomicResponse,
    ];

    /// The opcode with wire value `v`, or `None` for the reserved values
    /// 0xC to 0xF (and anything above 4 bits).
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x0 => Opcode::RdmaWrite,
            0x1 => Opcode::RdmaReadRequest,
            0x2 => Opcode::RdmaReadResponse,
            0x3 => Opcode::Send,
            0x4 => Opcode::SendInvalidate,
            0x5 => Opcode::SendSe,
            0x6 => Opcode::SendSeInvalidate,
            0x7 => Opcode::Terminate,
            0x8 => Opcode::ImmediateData,
            0x9 => Opcode::ImmediateDataSe,
            0xa => Opcode::AtomicRequest,
            0xb => Opcode::AtomicResponse,
            _ => return None,
        })
    }

    /// The 4-bit wire value.
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// Whether the message uses the tagged buffer model (T = 1).
    pub const fn is_tagged(self) -> bool {
        matches!(self, Opcode::RdmaWrite | Opcode::RdmaReadResponse)
    }

    /// The untagged queue the message targets (`None` for tagged messages).
    pub const fn queue_number(self) -> Option<u32> {
        match self {
            Opcode::RdmaWrite | Opcode::RdmaReadResponse => None,
            Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSe
            | Opcode::SendSeInvalidate
            | Opcode::ImmediateData
            | Opcode::ImmediateDataSe => Some(QN_SEND),
            Opcode::RdmaReadRequest | Opcode::AtomicRequest => Some(QN_READ_REQUEST),
            Opcode::Terminate => Some(QN_TERMINATE),
            Opcode::AtomicResponse => Some(QN_ATOMIC_RESPONSE),
        }
    }

    /// What the message's DDP payload holds.
    pub const fn payload(self) -> PayloadKind {
        match self {
            Opcode::RdmaWrite
            | Opcode::RdmaReadResponse
            | Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSe
            | Opcode::SendSeInvalidate => PayloadKind::Ulp,
            Opcode::RdmaReadRequest => PayloadKind::Fixed(READ_REQUEST_LEN),
            Opcode::Terminate => PayloadKind::Terminate,
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                PayloadKind::Fixed(IMMEDIATE_DATA_LEN)
            }
            Opcode::AtomicRequest => PayloadKind::Fixed(ATOMIC_REQUEST_LEN),
            Opcode::AtomicResponse => PayloadKind::Fixed(ATOMIC_RESPONSE_LEN),
        }
    }

    /// Whether the message may carry ULP data (as opposed to an RDMAP-defined
    /// fixed format).
    pub const fn carries_ulp_data(self) -> bool {
        matches!(self.payload(), PayloadKind::Ulp)
    }

    /// Whether the message must fit in one DDP segment (L = 1).
    pub const fn single_segment(self) -> bool {
        !self.carries_ulp_data()
    }

    /// Whether `RsvdULP[8:39]` carries an Invalidate STag.
    pub const fn uses_invalidate_stag(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }

    /// Whether the message asks for a Solicited Event.
    pub const fn solicited_event(self) -> bool {
        matches!(
            self,
            Opcode::SendSe | Opcode::SendSeInvalidate | Opcode::ImmediateDataSe
        )
    }

    /// Whether the opcode comes from RFC 7306 rather than RFC 5040.
    pub const fn is_extension(self) -> bool {
        matches!(
            self,
            Opcode::ImmediateData
                | Opcode::ImmediateDataSe
                | Opcode::AtomicRequest
                | Opcode::AtomicResponse
        )
    }
}

/// Which RFC 7306 extensions a connection accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extensions {
    /// Atomic Request / Atomic Response.
    pub atomics: bool,
    /// Immediate Data / Immediate Data with SE.
    pub immediate_data: bool,
}

impl Extensions {
    /// Plain RFC 5040 (what upstream siw speaks).
    pub const NONE: Extensions = Extensions {
        atomics: false,
        immediate_data: false,
    };
    /// Every RFC 7306 extension.
    pub const ALL: Extensions = Extensions {
        atomics: true,
        immediate_data: true,
    };

    /// Whether `op` is allowed under these extensions.
    pub const fn allows(self, op: Opcode) -> bool {
        match op {
            Opcode::ImmediateData | Opcode::ImmediateDataSe => self.immediate_data,
            Opcode::AtomicRequest | Opcode::AtomicResponse => self.atomics,
            _ => true,
        }
    }
}

/// An RDMAP-level violation found in a received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmapError {
    /// Reserved opcode (0xC to 0xF).
    UnknownOpcode(u8),
    /// An RFC 7306 opcode the connection did not enable.
    ExtensionDisabled(Opcode),
    /// The T flag disagrees with the opcode.
    TaggedMismatch {
        /// The opcode received.
        opcode: Opcode,
        /// The T flag received.
        tagged: bool,
    },
    /// An untagged message on another queue than its opcode's.
    WrongQueue {
        /// The opcode received.
        opcode: Opcode,
        /// The QN received.
        qn: u32,
    },
    /// A single-segment message without L.
    NotLast(Opcode),
    /// A fixed-format payload of the wrong length (for Terminate, `expected`
    /// is the minimum).
    PayloadLength {
        /// The opcode received.
        opcode: Opcode,
        /// The length the format needs.
        expected: usize,
        /// The length received.
        actual: usize,
    },
    /// A fixed-format payload shorter than its format, found while parsing.
    Truncated {
        /// Bytes the format needs.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// An Atomic Request with a reserved Atomic Operation Code.
    UnknownAtomicOp(u8),
}

/// Validates a parsed header's RDMAP part against the opcode table and
/// returns the opcode.
///
/// Checks, in order: the opcode is defined ([`RdmapError::UnknownOpcode`])
/// and enabled ([`RdmapError::ExtensionDisabled`]); the T flag matches
/// ([`RdmapError::TaggedMismatch`]); an untagged message is on its opcode's
/// queue ([`RdmapError::WrongQueue`]); a single-segment message has L set
/// ([`RdmapError::NotLast`]). The versions were already checked by
/// `DdpHeader::parse`.
#[inline]
pub fn validate(hdr: &DdpHeader, ext: Extensions) -> Result<Opcode, RdmapError> {
    let op = Opcode::from_u8(hdr.opcode).ok_or(RdmapError::UnknownOpcode(hdr.opcode))?;
    if !ext.allows(op) {
        return Err(RdmapError::ExtensionDisabled(op));
    }
    if op.is_tagged() != hdr.is_tagged() {
        return Err(RdmapError::TaggedMismatch {
            opcode: op,
            tagged: hdr.is_tagged(),
        });
    }
    if let (Some(u), Some(qn)) = (hdr.untagged_fields(), op.queue_number()) {
        if u.qn != qn {
            return Err(RdmapError::WrongQueue {
                opcode: op,
                qn: u.qn,
            });
        }
    }
    if op.single_segment() && !hdr.last {
        return Err(RdmapError::NotLast(op));
    }
    Ok(op)
}

/// Checks the DDP payload length of a single-segment message of opcode `op`
/// (ULP-data messages accept any length).
pub fn check_payload_len(op: Opcode, len: usize) -> Result<(), RdmapError> {
    let ok = match op.payload() {
        PayloadKind::Ulp => true,
        PayloadKind::Fixed(n) => len == n,
        PayloadKind::Terminate => len >= TERMINATE_MIN_LEN,
    };
    if ok {
        Ok(())
    } else {
        let expected = match op.payload() {
            PayloadKind::Fixed(n) => n,
            _ => TERMINATE_MIN_LEN,
        };
        Err(RdmapError::PayloadLength {
            opcode: op,
            expected,
            actual: len,
        })
    }
}

/// The Invalidate STag of a Send with Invalidate (with or without SE), or
/// `None` for any other header.
pub fn invalidate_stag(hdr: &DdpHeader) -> Option<u32> {
    match (Opcode::from_u8(hdr.opcode), hdr.untagged_fields()) {
        (Some(op), Some(u)) if op.uses_invalidate_stag() => Some(u.rsvd_ulp),
        _ => None,
    }
}

fn truncated(needed: usize, bytes: &[u8]) -> RdmapError {
    RdmapError::Truncated {
        needed,
        available: bytes.len(),
    }
}

// ---------------------------------------------------------------------------
// RDMA Read Request
// ---------------------------------------------------------------------------

/// The RDMA Read Request header (RFC 5040 section 4.4), the DDP payload of
/// opcode 0x1:
///
/// ```text
///  0: Data Sink STag (32)        4: Data Sink Tagged Offset (64)
/// 12: RDMA Read Message Size (32)
/// 16: Data Source STag (32)     20: Data Source Tagged Offset (64)
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReadRequest {
    /// STag of the requester's buffer the Read Response writes into.
    pub sink_stag: u32,
    /// Tagged Offset within the sink buffer.
    pub sink_to: u64,
    /// Number of bytes to read.
    pub read_size: u32,
    /// STag of the responder's buffer to read from.
    pub source_stag: u32,
    /// Tagged Offset within the source buffer.
    pub source_to: u64,
}

impl ReadRequest {
    /// Parses the header at the start of `bytes` (trailing bytes ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self, RdmapError> {
        let t = || truncated(READ_REQUEST_LEN, bytes);
        if bytes.len() < READ_REQUEST_LEN {
            return Err(t());
        }
        Ok(ReadRequest {
            sink_stag: get_u32(bytes, 0).ok_or_else(t)?,
            sink_to: get_u64(bytes, 4).ok_or_else(t)?,
            read_size: get_u32(bytes, 12).ok_or_else(t)?,
            source_stag: get_u32(bytes, 16).ok_or_else(t)?,
            source_to: get_u64(bytes, 20).ok_or_else(t)?,
        })
    }

    /// Writes the header at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        check_room(buf, READ_REQUEST_LEN)?;
        put(buf, 0, &self.sink_stag.to_be_bytes())?;
        put(buf, 4, &self.sink_to.to_be_bytes())?;
        put(buf, 12, &self.read_size.to_be_bytes())?;
        put(buf, 16, &self.source_stag.to_be_bytes())?;
        put(buf, 20, &self.source_to.to_be_bytes())?;
        Ok(READ_REQUEST_LEN)
    }
}

// ---------------------------------------------------------------------------
// RFC 7306 Atomic operations
// ---------------------------------------------------------------------------

/// An RFC 7306 Atomic Operation Code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOp {
    /// FetchAdd: add Add Data (carries limited by Add Mask) to the target,
    /// return the original value.
    FetchAdd = 0x0,
    /// Swap: write Swap Data (bits selected by Swap Mask), return the
    /// original value.
    Swap = 0x1,
    /// CmpSwap: if the target (under Compare Mask) equals Compare Data, write
    /// Swap Data (under Swap Mask); return the original value.
    CmpSwap = 0x2,
}

impl AtomicOp {
    /// The operation with code `v`, or `None` for reserved codes.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0x0 => Some(AtomicOp::FetchAdd),
            0x1 => Some(AtomicOp::Swap),
            0x2 => Some(AtomicOp::CmpSwap),
            _ => None,
        }
    }

    /// The 4-bit wire value.
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// Whether Compare Data / Compare Mask are meaningful for the operation.
    pub const fn uses_compare(self) -> bool {
        matches!(self, AtomicOp::CmpSwap)
    }
}

/// The RFC 7306 Atomic Request header, the DDP payload of opcode 0xA:
///
/// ```text
///  0: Reserved (28) | Atomic Operation Code (4)
///  4: Request Identifier (32)    8: Remote STag (32)
/// 12: Remote Tagged Offset (64) 20: Add or Swap Data (64)
/// 28: Add or Swap Mask (64)     36: Compare Data (64)
/// 44: Compare Mask (64)
/// ```
///
/// All fields are always present; those the operation does not use are
/// sent as zero. The reserved bits are ignored on receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtomicRequest {
    /// The operation.
    pub op: AtomicOp,
    /// Chosen by the requester, echoed in the Atomic Response.
    pub request_id: u32,
    /// STag of the target buffer.
    pub remote_stag: u32,
    /// Tagged Offset of the 64-bit target (8-byte aligned).
    pub remote_to: u64,
    /// Add Data (FetchAdd) or Swap Data (Swap, CmpSwap).
    pub add_or_swap_data: u64,
    /// Add Mask or Swap Mask.
    pub add_or_swap_mask: u64,
    /// Compare Data (CmpSwap).
    pub compare_data: u64,
    /// Compare Mask (CmpSwap).
    pub compare_mask: u64,
}

impl AtomicRequest {
    /// Parses the header at the start of `bytes` (trailing bytes ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self, RdmapError> {
        let t = || truncated(ATOMIC_REQUEST_LEN, bytes);
        if bytes.len() < ATOMIC_REQUEST_LEN {
            return Err(t());
        }
        let word0 = get_u32(bytes, 0).ok_or_else(t)?;
        let code = (word0 & ATOMIC_OPCODE_MASK) as u8;
        let op = AtomicOp::from_u8(code).ok_or(RdmapError::UnknownAtomicOp(code))?;
        Ok(AtomicRequest {
            op,
            request_id: get_u32(bytes, 4).ok_or_else(t)?,
            remote_stag: get_u32(bytes, 8).ok_or_else(t)?,
            remote_to: get_u64(bytes, 12).ok_or_else(t)?,
            add_or_swap_data: get_u64(bytes, 20).ok_or_else(t)?,
            add_or_swap_mask: get_u64(bytes, 28).ok_or_else(t)?,
            compare_data: get_u64(bytes, 36).ok_or_else(t)?,
            compare_mask: get_u64(bytes, 44).ok_or_else(t)?,
        })
    }

    /// Writes the header at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        check_room(buf, ATOMIC_REQUEST_LEN)?;
        put(buf, 0, &u32::from(self.op.value()).to_be_bytes())?;
        put(buf, 4, &self.request_id.to_be_bytes())?;
        put(buf, 8, &self.remote_stag.to_be_bytes())?;
        put(buf, 12, &self.remote_to.to_be_bytes())?;
        put(buf, 20, &self.add_or_swap_data.to_be_bytes())?;
        put(buf, 28, &self.add_or_swap_mask.to_be_bytes())?;
        put(buf, 36, &self.compare_data.to_be_bytes())?;
        put(buf, 44, &self.compare_mask.to_be_bytes())?;
        Ok(ATOMIC_REQUEST_LEN)
    }

    /// Whether the target is 8-byte aligned, as RFC 7306 requires of the
    /// Remote Tagged Offset.
    pub const fn is_aligned(&self) -> bool {
        self.remote_to & 7 == 0
    }

    /// The verbs Fetch and Add: a plain 64-bit wrapping add (no field
    /// boundaries in the Add Mask).
    pub const fn fetch_add(request_id: u32, remote_stag: u32, remote_to: u64, add: u64) -> Self {
        AtomicRequest {
            op: AtomicOp::FetchAdd,
            request_id,
            remote_stag,
            remote_to,
            add_or_swap_data: add,
            add_or_swap_mask: 0,
            compare_data: 0,
            compare_mask: 0,
        }
    }

    /// The verbs Compare and Swap: all 64 bits compared and swapped.
    pub const fn cmp_swap(
        request_id: u32,
        remote_stag: u32,
        remote_to: u64,
        compare: u64,
        swap: u64,
    ) -> Self {
        AtomicRequest {
            op: AtomicOp::CmpSwap,
            request_id,
            remote_stag,
            remote_to,
            add_or_swap_data: swap,
            add_or_swap_mask: u64::MAX,
            compare_data: compare,
            compare_mask: u64::MAX,
        }
    }

    /// The target's new value when the operation runs on `current` (the
    /// responder writes it back atomically, returning `current` as the
    /// Original Remote Data Value):
    ///
    /// - FetchAdd: `current + Add Data`, where a set bit *i* of the Add
    ///   Mask ends a field: the carry out of bit *i* is dropped instead of
    ///   propagating into bit *i + 1*. A zero mask is a plain 64-bit add.
    /// - Swap: the bits selected by the Swap Mask come from Swap Data.
    /// - CmpSwap: if `current` and Compare Data agree on the bits of the
    ///   Compare Mask, as Swap; otherwise `current` is unchanged.
    pub const fn apply(&self, current: u64) -> u64 {
        let swapped =
            (current & !self.add_or_swap_mask) | (self.add_or_swap_data & self.add_or_swap_mask);
        match self.op {
            AtomicOp::FetchAdd => masked_add(current, self.add_or_swap_data, self.add_or_swap_mask),
            AtomicOp::Swap => swapped,
            AtomicOp::CmpSwap => {
                if (current ^ self.compare_data) & self.compare_mask == 0 {
                    swapped
                } else {
                    current
                }
            }
        }
    }
}

/// `a + b` with the carry out of every bit set in `boundaries` dropped.
const fn masked_add(a: u64, b: u64, boundaries: u64) -> u64 {
    if boundaries == 0 {
        return a.wrapping_add(b);
    }
    let mut out = 0u64;
    let mut carry = 0u64;
    let mut i = 0;
    while i < 64 {
        let x = (a >> i) & 1;
        let y = (b >> i) & 1;
        let s = x + y + carry;
        out |= (s & 1) << i;
        carry = if (boundaries >> i) & 1 == 1 {
            0
        } else {
            s >> 1
        };
        i += 1;
    }
    out
}

/// The RFC 7306 Atomic Response header, the DDP payload of opcode 0xB:
///
/// ```text
/// 0: Original Request Identifier (32)
/// 4: Original Remote Data Value (64)
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AtomicResponse {
    /// The Request Identifier of the Atomic Request answered.
    pub request_id: u32,
    /// The target's value before the operation.
    pub original_value: u64,
}

impl AtomicResponse {
    /// Parses the header at the start of `bytes` (trailing bytes ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self, RdmapError> {
        let t = || truncated(ATOMIC_RESPONSE_LEN, bytes);
        Ok(AtomicResponse {
            request_id: get_u32(bytes, 0).ok_or_else(t)?,
            original_value: get_u64(bytes, 4).ok_or_else(t)?,
        })
    }

    /// Writes the header at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        check_room(buf, ATOMIC_RESPONSE_LEN)?;
        put(buf, 0, &self.request_id.to_be_bytes())?;
        put(buf, 4, &self.original_value.to_be_bytes())?;
        Ok(ATOMIC_RESPONSE_LEN)
    }
}

/// The RFC 7306 Immediate Data payload of opcodes 0x8 and 0x9: eight opaque
/// bytes handed to the peer's ULP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ImmediateData {
    /// The data, in wire order.
    pub data: [u8; IMMEDIATE_DATA_LEN],
}

impl ImmediateData {
    /// Parses the payload at the start of `bytes` (trailing bytes ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self, RdmapError> {
        let s = bytes
            .get(..IMMEDIATE_DATA_LEN)
            .ok_or_else(|| truncated(IMMEDIATE_DATA_LEN, bytes))?;
        let data = <[u8; IMMEDIATE_DATA_LEN]>::try_from(s)
            .map_err(|_| truncated(IMMEDIATE_DATA_LEN, bytes))?;
        Ok(ImmediateData { data })
    }

    /// Writes the payload at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        check_room(buf, IMMEDIATE_DATA_LEN)?;
        put(buf, 0, &self.data)?;
        Ok(IMMEDIATE_DATA_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::super::ddp::{self, DdpHeader};
    use super::*;
    use proptest::prelude::*;

    // --- every opcode's header, byte-exact from the RFC bit layout ---
    //
    // Byte 0: T L Rsvd(4) DV(2)  -> tagged 1000_0001 / untagged 0000_0001, +0x40 for L
    // Byte 1: RV(2) Rsv(2) Op(4) -> 01_00_oooo = 0x40 | op

    /// (opcode, header bytes, expected repr) for every opcode with L = 1.
    fn opcode_vectors() -> [(Opcode, &'static [u8], DdpHeader); 12] {
        [
            (
                Opcode::RdmaWrite,
                &[
                    0xc1, 0x40, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 0, 0, 0, 0x10, 0x00,
                ],
                DdpHeader::tagged(0, true, 0xaabb_ccdd, 0x1000),
            ),
            (
                Opcode::RdmaReadRequest,
                &[0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0],
                DdpHeader::untagged(1, true, 0, 1, 7, 0),
            ),
            (
                Opcode::RdmaReadResponse,
                &[
                    0xc1, 0x42, 0x00, 0x00, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                    0xf0,
                ],
                DdpHeader::tagged(2, true, 0x100, 0xffff_ffff_ffff_fff0),
            ),
            (
                Opcode::Send,
                &[
                    0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0x20,
                ],
                DdpHeader::untagged(3, true, 0, 0, 1, 0x20),
            ),
            (
                Opcode::SendInvalidate,
                &[
                    0x41, 0x44, 0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0,
                ],
                DdpHeader::untagged(4, true, 0x1234_5678, 0, 2, 0),
            ),
            (
                Opcode::SendSe,
                &[0x41, 0x45, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0],
                DdpHeader::untagged(5, true, 0, 0, 3, 0),
            ),
            (
                Opcode::SendSeInvalidate,
                &[
                    0x41, 0x46, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0,
                ],
                DdpHeader::untagged(6, true, 0xdead_beef, 0, 4, 0),
            ),
            (
                Opcode::Terminate,
                &[0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0],
                DdpHeader::untagged(7, true, 0, 2, 1, 0),
            ),
            (
                Opcode::ImmediateData,
                &[0x41, 0x48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0],
                DdpHeader::untagged(8, true, 0, 0, 9, 0),
            ),
            (
                Opcode::ImmediateDataSe,
                &[0x41, 0x49, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0],
                DdpHeader::untagged(9, true, 0, 0, 10, 0),
            ),
            (
                Opcode::AtomicRequest,
                &[0x41, 0x4a, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 0],
                DdpHeader::untagged(0xa, true, 0, 1, 5, 0),
            ),
            (
                Opcode::AtomicResponse,
                &[0x41, 0x4b, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0],
                DdpHeader::untagged(0xb, true, 0, 3, 1, 0),
            ),
        ]
    }

    #[test]
    fn every_opcode_header_vector() {
        for (op, bytes, want) in opcode_vectors() {
            let h = DdpHeader::parse(bytes).unwrap();
            assert_eq!(h, want, "{op:?}");
            assert_eq!(validate(&h, Extensions::ALL), Ok(op));
            let mut out = [0u8; 18];
            let n = h.emit(&mut out).unwrap();
            assert_eq!(&out[..n], bytes, "{op:?}");
        }
    }

    #[test]
    fn opcode_table() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(op.value() as usize, i);
            assert_eq!(Opcode::from_u8(i as u8), Some(*op));
        }
        for v in 0xc..=0xff {
            assert_eq!(Opcode::from_u8(v), None);
        }
        use Opcode::*;
        let tagged: &[Opcode] = &[RdmaWrite, RdmaReadResponse];
        for op in Opcode::ALL {
            assert_eq!(op.is_tagged(), tagged.contains(&op));
            assert_eq!(op.queue_number().is_none(), op.is_tagged());
        }
        assert_eq!(RdmaReadRequest.queue_number(), Some(1));
        assert_eq!(AtomicRequest.queue_number(), Some(1));
        assert_eq!(Terminate.queue_number(), Some(2));
        assert_eq!(AtomicResponse.queue_number(), Some(3));
        for op in [
            Send,
            SendInvalidate,
            SendSe,
            SendSeInvalidate,
            ImmediateData,
            ImmediateDataSe,
        ] {
            assert_eq!(op.queue_number(), Some(0));
        }
        for op in Opcode::ALL {
            assert_eq!(
                op.uses_invalidate_stag(),
                matches!(op, SendInvalidate | SendSeInvalidate)
            );
            assert_eq!(
                op.solicited_event(),
                matches!(op, SendSe | SendSeInvalidate | ImmediateDataSe)
            );
            assert_eq!(op.is_extension(), op.value() >= 8);
            assert_eq!(
                op.carries_ulp_data(),
                matches!(
                    op,
                    RdmaWrite
                        | RdmaReadResponse
                        | Send
                        | SendInvalidate
                        | SendSe
                        | SendSeInvalidate
                )
            );
            assert_eq!(op.single_segment(), !op.carries_ulp_data());
        }
        assert_eq!(RdmaReadRequest.payload(), PayloadKind::Fixed(28));
        assert_eq!(AtomicRequest.payload(), PayloadKind::Fixed(52));
        assert_eq!(AtomicResponse.payload(), PayloadKind::Fixed(12));
        assert_eq!(ImmediateData.payload(), PayloadKind::Fixed(8));
        assert_eq!(ImmediateDataSe.payload(), PayloadKind::Fixed(8));
        assert_eq!(Terminate.payload(), PayloadKind::Terminate);
    }

    #[test]
    fn validation_errors() {
        // Reserved opcodes.
        for op in 0xc..=0xf {
            let h = DdpHeader::untagged(op, true, 0, 0, 1, 0);
            assert_eq!(
                validate(&h, Extensions::ALL),
                Err(RdmapError::UnknownOpcode(op))
            );
        }
        // RFC 7306 opcodes without the extension.
        for (op, ext) in [
            (
                Opcode::ImmediateData,
                Extensions {
                    atomics: true,
                    immediate_data: false,
                },
            ),
            (Opcode::ImmediateDataSe, Extensions::NONE),
            (
                Opcode::AtomicRequest,
                Extensions {
                    atomics: false,
                    immediate_data: true,
                },
            ),
            (Opcode::AtomicResponse, Extensions::NONE),
        ] {
            let h = DdpHeader::untagged(op.value(), true, 0, op.queue_number().unwrap(), 1, 0);
            assert_eq!(validate(&h, ext), Err(RdmapError::ExtensionDisabled(op)));
        }
        assert!(Extensions::default() == Extensions::NONE);
        // T flag mismatches, both ways.
        let h = DdpHeader::untagged(0, true, 0, 0, 1, 0);
        assert_eq!(
            validate(&h, Extensions::NONE),
            Err(RdmapError::TaggedMismatch {
                opcode: Opcode::RdmaWrite,
                tagged: false
            })
        );
        let h = DdpHeader::tagged(3, true, 0, 0);
        assert_eq!(
            validate(&h, Extensions::NONE),
            Err(RdmapError::TaggedMismatch {
                opcode: Opcode::Send,
                tagged: true
            })
        );
        // Wrong queue.
        let h = DdpHeader::untagged(3, true, 0, 1, 1, 0);
        assert_eq!(
            validate(&h, Extensions::NONE),
            Err(RdmapError::WrongQueue {
                opcode: Opcode::Send,
                qn: 1
            })
        );
        let h = DdpHeader::untagged(1, true, 0, 0, 1, 0);
        assert_eq!(
            validate(&h, Extensions::NONE),
            Err(RdmapError::WrongQueue {
                opcode: Opcode::RdmaReadRequest,
                qn: 0
            })
        );
        // Single-segment messages need L.
        for op in [
            Opcode::RdmaReadRequest,
            Opcode::Terminate,
            Opcode::AtomicRequest,
            Opcode::ImmediateData,
        ] {
            let h = DdpHeader::untagged(op.value(), false, 0, op.queue_number().unwrap(), 1, 0);
            assert_eq!(validate(&h, Extensions::ALL), Err(RdmapError::NotLast(op)));
        }
        // Multi-segment messages need not.
        let h = DdpHeader::untagged(3, false, 0, 0, 1, 0);
        assert_eq!(validate(&h, Extensions::NONE), Ok(Opcode::Send));
        let h = DdpHeader::tagged(0, false, 0, 0);
        assert_eq!(validate(&h, Extensions::NONE), Ok(Opcode::RdmaWrite));
    }

    #[test]
    fn payload_lengths() {
        assert_eq!(check_payload_len(Opcode::Send, 0), Ok(()));
        assert_eq!(check_payload_len(Opcode::RdmaWrite, 1 << 20), Ok(()));
        assert_eq!(check_payload_len(Opcode::RdmaReadRequest, 28), Ok(()));
        assert_eq!(
            check_payload_len(Opcode::RdmaReadRequest, 27),
            Err(RdmapError::PayloadLength {
                opcode: Opcode::RdmaReadRequest,
                expected: 28,
                actual: 27
            })
        );
        assert_eq!(
            check_payload_len(Opcode::AtomicRequest, 53),
            Err(RdmapError::PayloadLength {
                opcode: Opcode::AtomicRequest,
                expected: 52,
                actual: 53
            })
        );
        assert_eq!(check_payload_len(Opcode::AtomicResponse, 12), Ok(()));
        assert_eq!(check_payload_len(Opcode::ImmediateDataSe, 8), Ok(()));
        assert_eq!(check_payload_len(Opcode::Terminate, 4), Ok(()));
        assert_eq!(check_payload_len(Opcode::Terminate, 52), Ok(()));
        assert_eq!(
            check_payload_len(Opcode::Terminate, 3),
            Err(RdmapError::PayloadLength {
                opcode: Opcode::Terminate,
                expected: 4,
                actual: 3
            })
        );
    }

    #[test]
    fn invalidate_stag_field() {
        for (op, bytes, _) in opcode_vectors() {
            let h = DdpHeader::parse(bytes).unwrap();
            let want = match op {
                Opcode::SendInvalidate => Some(0x1234_5678),
                Opcode::SendSeInvalidate => Some(0xdead_beef),
                _ => None,
            };
            assert_eq!(invalidate_stag(&h), want, "{op:?}");
        }
        // A tagged header with an invalidate opcode (invalid anyway) has none.
        assert_eq!(invalidate_stag(&DdpHeader::tagged(4, true, 1, 2)), None);
        assert_eq!(
            invalidate_stag(&DdpHeader::untagged(0xf, true, 1, 0, 1, 0)),
            None
        );
    }

    // --- fixed formats, byte-exact ---

    const READ_REQUEST: [u8; 28] = [
        0x11, 0x22, 0x33, 0x44, // Data Sink STag
        0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x50, 0x00, // Data Sink TO
        0x00, 0x01, 0x00, 0x00, // RDMA Read Message Size (64 KiB)
        0x55, 0x66, 0x77, 0x88, // Data Source STag
        0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x88, // Data Source TO
    ];

    #[test]
    fn read_request_vector() {
        let rr = ReadRequest::parse(&READ_REQUEST).unwrap();
        assert_eq!(
            rr,
            ReadRequest {
                sink_stag: 0x1122_3344,
                sink_to: 0x0000_7f00_1234_5000,
                read_size: 0x1_0000,
                source_stag: 0x5566_7788,
                source_to: 0xffee_ddcc_bbaa_9988,
            }
        );
        let mut out = [0u8; 30];
        assert_eq!(rr.emit(&mut out), Ok(28));
        assert_eq!(out[..28], READ_REQUEST);
        assert_eq!(out[28..], [0, 0]);
        assert_eq!(
            ReadRequest::parse(&READ_REQUEST[..27]),
            Err(RdmapError::Truncated {
                needed: 28,
                available: 27
            })
        );
        assert_eq!(
            rr.emit(&mut [0u8; 27]),
            Err(EmitError::BufferTooShort {
                needed: 28,
                available: 27
            })
        );
    }

    /// A whole RDMA Read Request FPDU payload (DDP header + RDMAP header), as
    /// upstream siw lays out `struct iwarp_rdma_rreq` after `mpa_len`.
    #[test]
    fn read_request_message() {
        let mut msg = [0u8; 46];
        msg[..18].copy_from_slice(&[0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]);
        msg[18..].copy_from_slice(&READ_REQUEST);
        let h = DdpHeader::parse(&msg).unwrap();
        let op = validate(&h, Extensions::NONE).unwrap();
        assert_eq!(op, Opcode::RdmaReadRequest);
        let payload = &msg[h.header_len()..];
        check_payload_len(op, payload.len()).unwrap();
        assert_eq!(ReadRequest::parse(payload).unwrap().read_size, 0x1_0000);
    }

    const ATOMIC_CMPSWAP: [u8; 52] = [
        0x00, 0x00, 0x00, 0x02, // Reserved | AOpCode = 0010b (CmpSwap)
        0x00, 0x00, 0x00, 0x2a, // Request Identifier
        0xca, 0xfe, 0x00, 0x01, // Remote STag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x08, // Remote TO
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // Swap Data
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // Swap Mask
        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // Compare Data
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, // Compare Mask
    ];

    #[test]
    fn atomic_request_vectors() {
        let a = AtomicRequest::parse(&ATOMIC_CMPSWAP).unwrap();
        assert_eq!(
            a,
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
        );
        assert!(a.is_aligned());
        assert!(a.op.uses_compare());
        let mut out = [0u8; 52];
        assert_eq!(a.emit(&mut out), Ok(52));
        assert_eq!(out, ATOMIC_CMPSWAP);

        // FetchAdd: AOpCode 0000b, add 1 with full carry propagation (mask 0).
        let mut fa = [0u8; 52];
        fa[7] = 1; // Request Identifier 1
        fa[8..12].copy_from_slice(&[0, 0, 0, 9]);
        fa[27] = 1; // Add Data 1
        let a = AtomicRequest::parse(&fa).unwrap();
        assert_eq!(a.op, AtomicOp::FetchAdd);
        assert!(!a.op.uses_compare());
        assert_eq!((a.request_id, a.remote_stag, a.add_or_swap_data), (1, 9, 1));
        let mut out = [0u8; 52];
        a.emit(&mut out).unwrap();
        assert_eq!(out, fa);

        // Swap: AOpCode 0001b.
        let mut sw = fa;
        sw[3] = 0x01;
        assert_eq!(AtomicRequest::parse(&sw).unwrap().op, AtomicOp::Swap);

        // Reserved bits of the first word are ignored, emitted as zero.
        let mut r = ATOMIC_CMPSWAP;
        r[0] = 0xff;
        r[3] = 0xf2;
        let a = AtomicRequest::parse(&r).unwrap();
        assert_eq!(a.op, AtomicOp::CmpSwap);
        a.emit(&mut out).unwrap();
        assert_eq!(out, ATOMIC_CMPSWAP);

        // Misaligned target.
        let mut m = ATOMIC_CMPSWAP;
        m[19] = 0x0c;
        assert!(!AtomicRequest::parse(&m).unwrap().is_aligned());
    }

    #[test]
    fn atomic_request_errors() {
        for code in 3..=0xf {
            let mut b = ATOMIC_CMPSWAP;
            b[3] = code;
            assert_eq!(
                AtomicRequest::parse(&b),
                Err(RdmapError::UnknownAtomicOp(code))
            );
        }
        assert_eq!(
            AtomicRequest::parse(&ATOMIC_CMPSWAP[..51]),
            Err(RdmapError::Truncated {
                needed: 52,
                available: 51
            })
        );
        let a = AtomicRequest::parse(&ATOMIC_CMPSWAP).unwrap();
        assert_eq!(
            a.emit(&mut [0u8; 51]),
            Err(EmitError::BufferTooShort {
                needed: 52,
                available: 51
            })
        );
        assert_eq!(AtomicOp::from_u8(3), None);
        for op in [AtomicOp::FetchAdd, AtomicOp::Swap, AtomicOp::CmpSwap] {
            assert_eq!(AtomicOp::from_u8(op.value()), Some(op));
        }
    }

    #[test]
    fn atomic_response_vector() {
        let bytes = [
            0x00, 0x00, 0x00, 0x2a, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        ];
        let r = AtomicResponse::parse(&bytes).unwrap();
        assert_eq!(
            r,
            AtomicResponse {
                request_id: 42,
                original_value: 0x8000_0000_0000_0001
            }
        );
        let mut out = [0u8; 12];
        assert_eq!(r.emit(&mut out), Ok(12));
        assert_eq!(out, bytes);
        assert_eq!(
            AtomicResponse::parse(&bytes[..11]),
            Err(RdmapError::Truncated {
                needed: 12,
                available: 11
            })
        );
        assert!(r.emit(&mut [0u8; 11]).is_err());
    }

    #[test]
    fn immediate_data_vector() {
        let bytes = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let d = ImmediateData::parse(&bytes).unwrap();
        assert_eq!(d.data, [1, 2, 3, 4, 5, 6, 7, 8]);
        let mut out = [0u8; 8];
        assert_eq!(d.emit(&mut out), Ok(8));
        assert_eq!(out, bytes[..8]);
        assert_eq!(
            ImmediateData::parse(&bytes[..7]),
            Err(RdmapError::Truncated {
                needed: 8,
                available: 7
            })
        );
        assert!(d.emit(&mut [0u8; 7]).is_err());
    }

    #[test]
    fn rdmap_queues_fit_ddp_bookkeeping() {
        let mut qs = ddp::UntaggedQueues::<QUEUE_COUNT>::new();
        for op in Opcode::ALL {
            if let Some(qn) = op.queue_number() {
                assert!(qs.queue(qn).is_ok(), "{op:?}");
            }
        }
        assert!(qs.queue_mut(QUEUE_COUNT as u32).is_err());
    }

    fn any_atomic() -> impl Strategy<Value = AtomicRequest> {
        (
            prop_oneof![
                Just(AtomicOp::FetchAdd),
                Just(AtomicOp::Swap),
                Just(AtomicOp::CmpSwap)
            ],
            any::<u32>(),
            any::<u32>(),
            any::<[u64; 5]>(),
        )
            .prop_map(|(op, request_id, remote_stag, v)| AtomicRequest {
                op,
                request_id,
                remote_stag,
                remote_to: v[0],
                add_or_swap_data: v[1],
                add_or_swap_mask: v[2],
                compare_data: v[3],
                compare_mask: v[4],
            })
    }

    #[test]
    fn atomic_apply_vectors() {
        let fa = |cur, add, mask| {
            AtomicRequest {
                add_or_swap_mask: mask,
                ..AtomicRequest::fetch_add(1, 2, 8, add)
            }
            .apply(cur)
        };
        assert_eq!(fa(41, 1, 0), 42);
        assert_eq!(fa(u64::MAX, 2, 0), 1);
        // Two 32-bit fields: the low field wraps without touching the high.
        let b = 1u64 << 31;
        assert_eq!(fa(0x0000_0005_ffff_ffff, 1, b), 0x0000_0005_0000_0000);
        assert_eq!(
            fa(0x0000_0005_ffff_ffff, 0x0000_0001_0000_0001, b),
            0x0000_0006_0000_0000
        );
        // Eight 8-bit fields.
        assert_eq!(
            fa(
                0x01ff_02fe_0000_0080,
                0x0101_0102_0000_0080,
                0x8080_8080_8080_8080
            ),
            0x0200_0300_0000_0000
        );
        let cs = AtomicRequest::cmp_swap(1, 2, 8, 7, 99);
        assert_eq!(cs.apply(7), 99);
        assert_eq!(cs.apply(8), 8);
        // Masked compare (low byte only) and masked swap (high byte only).
        let m = AtomicRequest {
            compare_mask: 0xff,
            add_or_swap_mask: 0xff00_0000_0000_0000,
            ..AtomicRequest::cmp_swap(1, 2, 8, 0x1234_0007, 0xab00_0000_0000_0000)
        };
        assert_eq!(m.apply(0x5555_0007), 0xab00_0000_5555_0007);
        assert_eq!(m.apply(0x5555_0008), 0x5555_0008);
        let sw = AtomicRequest {
            op: AtomicOp::Swap,
            add_or_swap_mask: 0xffff,
            add_or_swap_data: 0x1_2345,
            ..AtomicRequest::default_for_tests()
        };
        assert_eq!(sw.apply(0xffff_0000_0000_0000), 0xffff_0000_0000_2345);
    }

    impl AtomicRequest {
        fn default_for_tests() -> Self {
            AtomicRequest::fetch_add(0, 0, 0, 0)
        }
    }

    proptest! {
        #[test]
        fn prop_masked_add_is_fieldwise(a in any::<u64>(), b in any::<u64>(), fields in 0u32..4) {
            // Fields of 8 << fields bits: each wraps on its own.
            let w = 8u32 << fields;
            let mut mask = 0u64;
            let mut i = w - 1;
            while i < 64 { mask |= 1 << i; i += w; }
            let r = AtomicRequest { add_or_swap_mask: mask, ..AtomicRequest::fetch_add(0, 0, 0, b) }.apply(a);
            let fm = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
            let mut k = 0;
            while k < 64 {
                let f = |v: u64| (v >> k) & fm;
                prop_assert_eq!(f(r), f(a).wrapping_add(f(b)) & fm);
                k += w;
            }
        }

        #[test]
        fn prop_full_masks_are_the_verbs_operations(cur in any::<u64>(), c in any::<u64>(), s in any::<u64>()) {
            prop_assert_eq!(AtomicRequest::fetch_add(0, 0, 0, s).apply(cur), cur.wrapping_add(s));
            let cs = AtomicRequest::cmp_swap(0, 0, 0, c, s).apply(cur);
            prop_assert_eq!(cs, if cur == c { s } else { cur });
            prop_assert_eq!(AtomicRequest::cmp_swap(0, 0, 0, cur, s).apply(cur), s);
        }

        #[test]
        fn prop_read_request_roundtrip(a in any::<(u32, u64, u32, u32, u64)>()) {
            let rr = ReadRequest { sink_stag: a.0, sink_to: a.1, read_size: a.2, source_stag: a.3, source_to: a.4 };
            let mut buf = [0u8; READ_REQUEST_LEN];
            rr.emit(&mut buf).unwrap();
            prop_assert_eq!(ReadRequest::parse(&buf), Ok(rr));
        }

        #[test]
        fn prop_atomic_roundtrip(a in any_atomic(), resp in any::<(u32, u64)>(), imm in any::<[u8; 8]>()) {
            let mut buf = [0u8; ATOMIC_REQUEST_LEN];
            a.emit(&mut buf).unwrap();
            prop_assert_eq!(AtomicRequest::parse(&buf), Ok(a));
            let r = AtomicResponse { request_id: resp.0, original_value: resp.1 };
            let mut buf = [0u8; ATOMIC_RESPONSE_LEN];
            r.emit(&mut buf).unwrap();
            prop_assert_eq!(AtomicResponse::parse(&buf), Ok(r));
            let d = ImmediateData { data: imm };
            let mut buf = [0u8; IMMEDIATE_DATA_LEN];
            d.emit(&mut buf).unwrap();
            prop_assert_eq!(ImmediateData::parse(&buf), Ok(d));
        }

        #[test]
        fn prop_parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = ReadRequest::parse(&bytes);
            let _ = AtomicRequest::parse(&bytes);
            let _ = AtomicResponse::parse(&bytes);
            let _ = ImmediateData::parse(&bytes);
            if let Ok(h) = DdpHeader::parse(&bytes) {
                if let Ok(op) = validate(&h, Extensions::ALL) {
                    prop_assert_eq!(op.value(), h.opcode);
                    prop_assert_eq!(op.is_tagged(), h.is_tagged());
                }
            }
        }
    }
}
