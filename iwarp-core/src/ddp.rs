// SPDX-License-Identifier: GPL-2.0

//! Direct Data Placement (DDP, RFC 5041) wire format, segmentation and
//! receiver bookkeeping.
//!
//! A DDP segment starts right after MPA's 2-byte ULPDU_Length. Its first two
//! bytes are the 16-bit control field shared by DDP and RDMAP (RDMAP owns the
//! second byte, which DDP calls `RsvdULP[0:7]`):
//!
//! ```text
//!  0                   1
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |T|L| Rsvd  | DV| RV|Rsv|  Op   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! `T` selects the buffer model. A tagged header (T = 1, 14 bytes) continues
//! with the 32-bit STag and the 64-bit Tagged Offset (TO); an untagged header
//! (T = 0, 18 bytes) continues with `RsvdULP[8:39]` (32 bits, which RDMAP uses
//! for the Invalidate STag), the Queue Number (QN), the Message Sequence
//! Number (MSN) and the Message Offset (MO). All multi-byte fields are big
//! endian. DV and RV must both be 1 (RFC 5041 section 4.1, RFC 5040 section
//! 4.2). The reserved bits (`Rsvd`, `Rsv`) are written as zero and are not
//! checked on receive, as the RFCs ask for reserved fields; [`ControlField`]
//! still exposes them for diagnostics.
//!
//! The module has three parts:
//! - the header repr: [`ControlField`], [`DdpHeader`] with [`DdpHeader::parse`]
//!   and [`DdpHeader::emit`];
//! - sender-side segmentation: [`Segmenter`] cuts a message into segments no
//!   larger than MULPDU (header included);
//! - receiver-side checks, each returning the error RFC 5041 section 7 names
//!   for the violation: [`UntaggedQueue`] / [`UntaggedQueues`] (QN, MSN, MO and
//!   posted-buffer bounds), [`TaggedStream`], [`last_to`] and [`check_bounds`]
//!   (Tagged Offset continuity, wrap and bounds). `super::terminate` maps
//!   every error of this module to its Terminate code.

use core::ops::Range;

/// Length of the DDP/RDMAP control field (DDP control byte + RDMAP control
/// byte).
pub const CONTROL_LEN: usize = 2;
/// Length of a tagged DDP header: control, STag, TO.
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length of an untagged DDP header: control, `RsvdULP[8:39]`, QN, MSN, MO.
pub const UNTAGGED_HEADER_LEN: usize = 18;

/// The DDP version (DV) of RFC 5041.
pub const DDP_VERSION: u8 = 1;
/// The RDMAP version (RV) of RFC 5040.
pub const RDMAP_VERSION: u8 = 1;
/// The MSN of the first message on every untagged queue (RFC 5041 section
/// 4.3); MSNs then increase by one modulo 2^32.
pub const INITIAL_MSN: u32 = 1;

/// Control field bit: T, Tagged flag.
pub const CTRL_TAGGED: u16 = 0x8000;
/// Control field bit: L, Last flag (last segment of a DDP message).
pub const CTRL_LAST: u16 = 0x4000;
/// Control field mask: DDP `Rsvd` (4 bits).
pub const CTRL_DDP_RSVD_MASK: u16 = 0x3c00;
/// Control field mask: DV, DDP version (2 bits).
pub const CTRL_DV_MASK: u16 = 0x0300;
/// Shift of DV within the control field.
pub const CTRL_DV_SHIFT: u32 = 8;
/// Control field mask: RV, RDMAP version (2 bits).
pub const CTRL_RV_MASK: u16 = 0x00c0;
/// Shift of RV within the control field.
pub const CTRL_RV_SHIFT: u32 = 6;
/// Control field mask: RDMAP `Rsv` (2 bits).
pub const CTRL_RDMAP_RSVD_MASK: u16 = 0x0030;
/// Control field mask: RDMAP OpCode (4 bits).
pub const CTRL_OPCODE_MASK: u16 = 0x000f;

/// Byte ranges of the header fields, from the start of the control field.
mod field {
    use core::ops::Range;

    pub(super) const CONTROL: Range<usize> = 0..2;
    pub(super) const STAG: Range<usize> = 2..6;
    pub(super) const TO: Range<usize> = 6..14;
    pub(super) const RSVD_ULP: Range<usize> = 2..6;
    pub(super) const QN: Range<usize> = 6..10;
    pub(super) const MSN: Range<usize> = 10..14;
    pub(super) const MO: Range<usize> = 14..18;
}

// ---------------------------------------------------------------------------
// Byte helpers shared with the sibling modules (rdmap, terminate).
// ---------------------------------------------------------------------------

/// Big-endian `u16` at `at`, or `None` if `b` is too short.
pub(super) fn get_u16(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    <[u8; 2]>::try_from(s).ok().map(u16::from_be_bytes)
}

/// Big-endian `u32` at `at`, or `None` if `b` is too short.
pub(super) fn get_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    <[u8; 4]>::try_from(s).ok().map(u32::from_be_bytes)
}

/// Big-endian `u64` at `at`, or `None` if `b` is too short.
pub(super) fn get_u64(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    <[u8; 8]>::try_from(s).ok().map(u64::from_be_bytes)
}

/// Copies `src` into `buf` at `at`; fails (without writing) if it does not
/// fit.
pub(super) fn put(buf: &mut [u8], at: usize, src: &[u8]) -> Result<(), EmitError> {
    let available = buf.len();
    let end = at.checked_add(src.len()).ok_or(EmitError::BufferTooShort {
        needed: usize::MAX,
        available,
    })?;
    let dst = buf.get_mut(at..end).ok_or(EmitError::BufferTooShort {
        needed: end,
        available,
    })?;
    copy_octets(dst, src);
    Ok(())
}

/// Copies `src` into `dst`, which its caller has sized to match (the
/// shorter length wins otherwise). A zip rather than `copy_from_slice`:
/// the compiler cannot always prove the lengths equal, and
/// `copy_from_slice` would leave a length-mismatch panic in the kernel
/// binary; this compiles to the same `memcpy` without one.
pub(super) fn copy_octets(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = *s;
    }
}

/// Fails with [`EmitError::BufferTooShort`] unless `buf` holds `needed` bytes.
pub(super) fn check_room(buf: &[u8], needed: usize) -> Result<(), EmitError> {
    if buf.len() < needed {
        Err(EmitError::BufferTooShort {
            needed,
            available: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Converts a `u32` length or offset to `usize`, saturating on targets where
/// `usize` is narrower (never the case for the kernel's 64-bit targets).
pub(super) fn usize_from(v: u32) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a DDP header could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DdpError {
    /// The segment is shorter than the header its T flag announces (or than
    /// the 2-byte control field).
    Truncated {
        /// Bytes the header needs.
        needed: usize,
        /// Bytes that were available.
        available: usize,
    },
    /// DV is not [`DDP_VERSION`]. `tagged` is the segment's T flag, which
    /// selects the Terminate code (tagged or untagged "Invalid DDP version").
    DdpVersion {
        /// The T flag of the offending segment.
        tagged: bool,
        /// The DV value received.
        version: u8,
    },
    /// RV is not [`RDMAP_VERSION`].
    RdmapVersion {
        /// The RV value received.
        version: u8,
    },
}

/// Why a header or payload could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmitError {
    /// The output buffer is too small.
    BufferTooShort {
        /// Bytes the emitted item needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// A field value does not fit its wire field (e.g. an opcode above 15).
    FieldRange,
    /// The repr is internally inconsistent (e.g. a Terminate whose header
    /// control bits disagree with the headers it carries).
    Inconsistent,
}

/// Why a [`Segmenter`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentError {
    /// MULPDU leaves no room for payload after the header.
    MulpduTooSmall {
        /// The MULPDU given.
        mulpdu: u32,
        /// The header length of the message's buffer model.
        header_len: usize,
    },
    /// The RDMAP opcode does not fit in 4 bits.
    OpcodeRange(u8),
    /// A tagged message would run past Tagged Offset 2^64 - 1.
    ToWrap,
}

/// An untagged-buffer violation (RFC 5041 section 7.2, error type 0x2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UntaggedError {
    /// The QN names no queue of this stream (code 0x01).
    InvalidQn(u32),
    /// The MSN is the expected one but no buffer is posted for it (code 0x02).
    MsnNoBuffer {
        /// The MSN of the segment.
        msn: u32,
    },
    /// The MSN is not the one the queue expects (code 0x03).
    MsnRange {
        /// The MSN the queue expects next.
        expected: u32,
        /// The MSN received.
        got: u32,
    },
    /// The MO does not continue the message (code 0x04).
    InvalidMo {
        /// The MO the queue expects (bytes of the message received so far).
        expected: u32,
        /// The MO received.
        got: u32,
    },
    /// The message does not fit in the posted buffer (code 0x05).
    MessageTooLong {
        /// Length of the posted buffer.
        buffer_len: u32,
        /// MO + segment payload length, the bytes the message needs so far.
        needed: u64,
    },
}

/// A tagged-buffer violation (RFC 5041 section 7.2, error type 0x1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaggedError {
    /// The STag is invalid, or changed within a message (code 0x00).
    InvalidStag(u32),
    /// The segment falls outside the buffer the STag names, or its TO does not
    /// continue the message (code 0x01).
    BaseBounds,
    /// The STag is not associated with this DDP stream (code 0x02).
    StagNotAssociated(u32),
    /// TO + payload length wraps past 2^64 - 1 (code 0x03).
    ToWrap,
}

// ---------------------------------------------------------------------------
// Control field
// ---------------------------------------------------------------------------

/// The raw 16-bit DDP/RDMAP control field, with accessors for every sub-field
/// (including the reserved ones, for diagnostics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ControlField(pub u16);

impl ControlField {
    /// A control field with DV = RV = 1, reserved bits zero, and the given
    /// flags and opcode (only the low 4 bits of `opcode` are used).
    pub const fn new(tagged: bool, last: bool, opcode: u8) -> Self {
        let mut v = ((DDP_VERSION as u16) << CTRL_DV_SHIFT)
            | ((RDMAP_VERSION as u16) << CTRL_RV_SHIFT)
            | (opcode as u16 & CTRL_OPCODE_MASK);
        if tagged {
            v |= CTRL_TAGGED;
        }
        if last {
            v |= CTRL_LAST;
        }
        ControlField(v)
    }

    /// Reads the control field from the first two bytes of `bytes`.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, DdpError> {
        get_u16(bytes, field::CONTROL.start)
            .map(ControlField)
            .ok_or(DdpError::Truncated {
                needed: CONTROL_LEN,
                available: bytes.len(),
            })
    }

    /// T: the segment targets a tagged buffer.
    pub const fn tagged(self) -> bool {
        self.0 & CTRL_TAGGED != 0
    }

    /// L: the segment is the last of its DDP message.
    pub const fn last(self) -> bool {
        self.0 & CTRL_LAST != 0
    }

    /// The 4 DDP reserved bits.
    pub const fn ddp_reserved(self) -> u8 {
        ((self.0 & CTRL_DDP_RSVD_MASK) >> 10) as u8
    }

    /// DV, the DDP version.
    pub const fn ddp_version(self) -> u8 {
        ((self.0 & CTRL_DV_MASK) >> CTRL_DV_SHIFT) as u8
    }

    /// RV, the RDMAP version.
    pub const fn rdmap_version(self) -> u8 {
        ((self.0 & CTRL_RV_MASK) >> CTRL_RV_SHIFT) as u8
    }

    /// The 2 RDMAP reserved bits.
    pub const fn rdmap_reserved(self) -> u8 {
        ((self.0 & CTRL_RDMAP_RSVD_MASK) >> 4) as u8
    }

    /// The RDMAP opcode (4 bits).
    pub const fn opcode(self) -> u8 {
        (self.0 & CTRL_OPCODE_MASK) as u8
    }

    /// Length of the header this control field announces (14 or 18).
    pub const fn header_len(self) -> usize {
        if self.tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// The version checks of [`DdpHeader::parse`]: DV first (its Terminate
    /// code depends on T), then RV.
    pub const fn check_versions(self) -> Result<(), DdpError> {
        if self.ddp_version() != DDP_VERSION {
            return Err(DdpError::DdpVersion {
                tagged: self.tagged(),
                version: self.ddp_version(),
            });
        }
        if self.rdmap_version() != RDMAP_VERSION {
            return Err(DdpError::RdmapVersion {
                version: self.rdmap_version(),
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Header repr
// ---------------------------------------------------------------------------

/// The fields of a tagged header after the control field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaggedFields {
    /// Steering Tag of the data sink buffer.
    pub stag: u32,
    /// Tagged Offset of the segment's first payload byte.
    pub to: u64,
}

/// The fields of an untagged header after the control field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UntaggedFields {
    /// `RsvdULP[8:39]`: opaque to DDP; RDMAP carries the Invalidate STag here
    /// for Send with Invalidate and writes zero otherwise.
    pub rsvd_ulp: u32,
    /// Queue Number.
    pub qn: u32,
    /// Message Sequence Number.
    pub msn: u32,
    /// Message Offset of the segment's first payload byte.
    pub mo: u32,
}

/// The buffer-model part of a DDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferFields {
    /// Tagged buffer model (T = 1).
    Tagged(TaggedFields),
    /// Untagged buffer model (T = 0).
    Untagged(UntaggedFields),
}

/// A DDP segment header together with the RDMAP control byte.
///
/// [`DdpHeader::parse`] checks the lengths and the two versions and ignores
/// the reserved bits; the opcode is kept raw (RDMAP validates it, see
/// `super::rdmap::validate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DdpHeader {
    /// L: last segment of its DDP message.
    pub last: bool,
    /// The 4-bit RDMAP opcode (0..=15).
    pub opcode: u8,
    /// Buffer model and its fields.
    pub buffer: BufferFields,
}

impl DdpHeader {
    /// A tagged header.
    pub const fn tagged(opcode: u8, last: bool, stag: u32, to: u64) -> Self {
        DdpHeader {
            last,
            opcode,
            buffer: BufferFields::Tagged(TaggedFields { stag, to }),
        }
    }

    /// An untagged header.
    pub const fn untagged(
        opcode: u8,
        last: bool,
        rsvd_ulp: u32,
        qn: u32,
        msn: u32,
        mo: u32,
    ) -> Self {
        DdpHeader {
            last,
            opcode,
            buffer: BufferFields::Untagged(UntaggedFields {
                rsvd_ulp,
                qn,
                msn,
                mo,
            }),
        }
    }

    /// Parses the header at the start of `bytes` (the byte after MPA's
    /// ULPDU_Length). Bytes past the header (the payload) are ignored.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, DdpError> {
        let ctrl = ControlField::parse(bytes)?;
        let needed = ctrl.header_len();
        if bytes.len() < needed {
            return Err(DdpError::Truncated {
                needed,
                available: bytes.len(),
            });
        }
        ctrl.check_versions()?;
        let truncated = DdpError::Truncated {
            needed,
            available: bytes.len(),
        };
        let buffer = if ctrl.tagged() {
            BufferFields::Tagged(TaggedFields {
                stag: get_u32(bytes, field::STAG.start).ok_or(truncated)?,
                to: get_u64(bytes, field::TO.start).ok_or(truncated)?,
            })
        } else {
            BufferFields::Untagged(UntaggedFields {
                rsvd_ulp: get_u32(bytes, field::RSVD_ULP.start).ok_or(truncated)?,
                qn: get_u32(bytes, field::QN.start).ok_or(truncated)?,
                msn: get_u32(bytes, field::MSN.start).ok_or(truncated)?,
                mo: get_u32(bytes, field::MO.start).ok_or(truncated)?,
            })
        };
        Ok(DdpHeader {
            last: ctrl.last(),
            opcode: ctrl.opcode(),
            buffer,
        })
    }

    /// T flag of this header.
    pub const fn is_tagged(&self) -> bool {
        matches!(self.buffer, BufferFields::Tagged(_))
    }

    /// The header's length on the wire (14 or 18).
    pub const fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// The control field this header emits.
    pub const fn control(&self) -> ControlField {
        ControlField::new(self.is_tagged(), self.last, self.opcode)
    }

    /// The tagged fields, if this is a tagged header.
    pub const fn tagged_fields(&self) -> Option<TaggedFields> {
        match self.buffer {
            BufferFields::Tagged(t) => Some(t),
            BufferFields::Untagged(_) => None,
        }
    }

    /// The untagged fields, if this is an untagged header.
    pub const fn untagged_fields(&self) -> Option<UntaggedFields> {
        match self.buffer {
            BufferFields::Tagged(_) => None,
            BufferFields::Untagged(u) => Some(u),
        }
    }

    /// Writes the header at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        if self.opcode > 0x0f {
            return Err(EmitError::FieldRange);
        }
        let len = self.header_len();
        check_room(buf, len)?;
        put(buf, field::CONTROL.start, &self.control().0.to_be_bytes())?;
        match self.buffer {
            BufferFields::Tagged(t) => {
                put(buf, field::STAG.start, &t.stag.to_be_bytes())?;
                put(buf, field::TO.start, &t.to.to_be_bytes())?;
            }
            BufferFields::Untagged(u) => {
                put(buf, field::RSVD_ULP.start, &u.rsvd_ulp.to_be_bytes())?;
                put(buf, field::QN.start, &u.qn.to_be_bytes())?;
                put(buf, field::MSN.start, &u.msn.to_be_bytes())?;
                put(buf, field::MO.start, &u.mo.to_be_bytes())?;
            }
        }
        Ok(len)
    }
}

// ---------------------------------------------------------------------------
// Segmentation (data source)
// ---------------------------------------------------------------------------

/// One segment produced by a [`Segmenter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The segment's header (L set on the last one; TO or MO advanced).
    pub header: DdpHeader,
    /// Offset of the segment's payload within the message.
    pub offset: u32,
    /// Length of the segment's payload.
    pub len: u32,
}

impl Segment {
    /// The payload's byte range within the message buffer.
    pub fn payload_range(&self) -> Range<usize> {
        let start = usize_from(self.offset);
        start..start.saturating_add(usize_from(self.len))
    }

    /// Length of the whole segment (header + payload), i.e. the MPA
    /// ULPDU_Length it needs.
    pub fn segment_len(&self) -> usize {
        self.header
            .header_len()
            .saturating_add(usize_from(self.len))
    }
}

/// Cuts one DDP message into segments of at most MULPDU bytes each, header
/// included (RFC 5041 section 5.2).
///
/// Every segment carries the same STag (tagged) or QN, MSN and `RsvdULP`
/// (untagged); TO is the base TO plus the payload offset, MO is the payload
/// offset. Only the final segment has L set. A zero-length message yields
/// exactly one (empty, last) segment.
#[derive(Clone, Debug)]
pub struct Segmenter {
    template: DdpHeader,
    total: u32,
    chunk: u32,
    next: u32,
    done: bool,
}

impl Segmenter {
    /// A segmenter for a message of `message_len` bytes with RDMAP `opcode`,
    /// sent to `target` (for a tagged message `to` is the message's base TO;
    /// for an untagged one `mo` is ignored and starts at 0), under `mulpdu`.
    pub fn new(
        opcode: u8,
        target: BufferFields,
        message_len: u32,
        mulpdu: u32,
    ) -> Result<Self, SegmentError> {
        if opcode > 0x0f {
            return Err(SegmentError::OpcodeRange(opcode));
        }
        let template = DdpHeader {
            last: false,
            opcode,
            buffer: target,
        };
        let header_len = template.header_len();
        let hdr = u32::try_from(header_len).unwrap_or(u32::MAX);
        let chunk = match mulpdu.checked_sub(hdr) {
            Some(c) if c > 0 => c,
            _ => return Err(SegmentError::MulpduTooSmall { mulpdu, header_len }),
        };
        if let BufferFields::Tagged(t) = target {
            last_to(t.to, message_len).map_err(|_| SegmentError::ToWrap)?;
        }
        Ok(Segmenter {
            template,
            total: message_len,
            chunk,
            next: 0,
            done: false,
        })
    }

    /// Payload bytes per full segment (MULPDU minus the header).
    pub const fn max_payload(&self) -> u32 {
        self.chunk
    }

    /// Number of segments not yet yielded.
    pub fn remaining(&self) -> usize {
        if self.done {
            return 0;
        }
        let left = self.total.saturating_sub(self.next);
        if left == 0 {
            return 1;
        }
        // chunk >= 1 by construction, so this cannot divide by zero.
        usize_from(left.div_ceil(self.chunk))
    }
}

impl Iterator for Segmenter {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        if self.done {
            return None;
        }
        let offset = self.next;
        let left = self.total.saturating_sub(offset);
        let len = left.min(self.chunk);
        let last = len == left;
        let mut header = self.template;
        header.last = last;
        header.buffer = match self.template.buffer {
            BufferFields::Tagged(t) => BufferFields::Tagged(TaggedFields {
                stag: t.stag,
                // Cannot wrap: `new` checked base TO + message length.
                to: t.to.wrapping_add(u64::from(offset)),
            }),
            BufferFields::Untagged(u) => BufferFields::Untagged(UntaggedFields { mo: offset, ..u }),
        };
        self.next = offset.saturating_add(len);
        self.done = last;
        Some(Segment {
            header,
            offset,
            len,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Segmenter {}

impl core::iter::FusedIterator for Segmenter {}

// ---------------------------------------------------------------------------
// Untagged receive bookkeeping (data sink)
// ---------------------------------------------------------------------------

/// Where an accepted untagged segment goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The segment's MSN (which posted buffer it fills).
    pub msn: u32,
    /// Offset within the posted buffer (= MO).
    pub offset: u32,
    /// Payload length.
    pub len: u32,
    /// On the last segment of a message: the message's total length, to be
    /// reported to the ULP. `None` while more segments are expected.
    pub completed: Option<u32>,
}

/// The message currently being received on an untagged queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Partial {
    received: u32,
    buffer_len: u32,
}

/// Receive state of one untagged queue: the MSN expected next and the
/// progress of a partially received message.
///
/// The LLP (MPA over TCP) delivers in order, so a message's segments must
/// arrive with consecutive MOs and messages in MSN order; anything else is a
/// protocol violation. On error the state is left unchanged (the stream is
/// to be terminated anyway).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UntaggedQueue {
    next_msn: u32,
    partial: Option<Partial>,
}

impl Default for UntaggedQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl UntaggedQueue {
    /// A queue expecting MSN [`INITIAL_MSN`] next.
    pub const fn new() -> Self {
        UntaggedQueue {
            next_msn: INITIAL_MSN,
            partial: None,
        }
    }

    /// The MSN of the message in progress, or of the next message.
    pub const fn expected_msn(&self) -> u32 {
        self.next_msn
    }

    /// Bytes received so far of the message in progress (`None` between
    /// messages).
    pub fn in_progress(&self) -> Option<u32> {
        self.partial.map(|p| p.received)
    }

    /// Checks one segment with MSN `msn`, MO `mo` and `len` payload bytes
    /// (`last` = its L flag) and records it.
    ///
    /// `buffer_len` is the length of the buffer posted at the head of this
    /// queue (`None` if none is posted). It is consulted only by the first
    /// segment of a message, which claims that buffer; later segments are
    /// checked against the length claimed then.
    ///
    /// Checks in order, each with its RFC 5041 error: MSN is the expected one
    /// ([`UntaggedError::MsnRange`]); a buffer is posted
    /// ([`UntaggedError::MsnNoBuffer`]); MO continues the message
    /// ([`UntaggedError::InvalidMo`]); MO + len fits the buffer
    /// ([`UntaggedError::MessageTooLong`]). Zero-length segments go through
    /// the same checks, since an empty message still consumes a buffer.
    pub fn accept(
        &mut self,
        msn: u32,
        mo: u32,
        len: u32,
        last: bool,
        buffer_len: Option<u32>,
    ) -> Result<Placement, UntaggedError> {
        if msn != self.next_msn {
            return Err(UntaggedError::MsnRange {
                expected: self.next_msn,
                got: msn,
            });
        }
        let (received, buf) = match self.partial {
            Some(p) => (p.received, p.buffer_len),
            None => match buffer_len {
                Some(b) => (0, b),
                None => return Err(UntaggedError::MsnNoBuffer { msn }),
            },
        };
        if mo != received {
            return Err(UntaggedError::InvalidMo {
                expected: received,
                got: mo,
            });
        }
        let needed = u64::from(mo).saturating_add(u64::from(len));
        if needed > u64::from(buf) {
            return Err(UntaggedError::MessageTooLong {
                buffer_len: buf,
                needed,
            });
        }
        // needed <= buf <= u32::MAX, so this cannot fail.
        let total = u32::try_from(needed).unwrap_or(u32::MAX);
        let completed = if last {
            self.next_msn = self.next_msn.wrapping_add(1);
            self.partial = None;
            Some(total)
        } else {
            self.partial = Some(Partial {
                received: total,
                buffer_len: buf,
            });
            None
        };
        Ok(Placement {
            msn,
            offset: mo,
            len,
            completed,
        })
    }
}

/// The untagged queues of one DDP stream, numbered `0..N`.
///
/// RDMAP over RFC 5040 uses QNs 0 to 2; RFC 7306 adds QN 3 (see
/// `super::rdmap`). Which opcode may use which QN is RDMAP's business; this
/// type only rejects QNs with no queue.
///
/// For the queues RDMAP serves itself (Read Request, Terminate, Atomic
/// Response) the "posted buffer" is whatever slot the caller reserved for the
/// message, e.g. a free inbound Read Request slot. Upstream siw reports an
/// exhausted Read Request queue (IRD exceeded) as RDMAP Remote Operation
/// "Catastrophic error, localized to RDMAP Stream" rather than as a DDP
/// "no buffer" error; the caller decides which to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UntaggedQueues<const N: usize> {
    queues: [UntaggedQueue; N],
}

impl<const N: usize> Default for UntaggedQueues<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> UntaggedQueues<N> {
    /// `N` fresh queues.
    pub const fn new() -> Self {
        UntaggedQueues {
            queues: [UntaggedQueue::new(); N],
        }
    }

    /// The queue numbered `qn`, or [`UntaggedError::InvalidQn`].
    pub fn queue(&self, qn: u32) -> Result<&UntaggedQueue, UntaggedError> {
        usize::try_from(qn)
            .ok()
            .and_then(|i| self.queues.get(i))
            .ok_or(UntaggedError::InvalidQn(qn))
    }

    /// The queue numbered `qn`, mutably, or [`UntaggedError::InvalidQn`].
    pub fn queue_mut(&mut self, qn: u32) -> Result<&mut UntaggedQueue, UntaggedError> {
        usize::try_from(qn)
            .ok()
            .and_then(|i| self.queues.get_mut(i))
            .ok_or(UntaggedError::InvalidQn(qn))
    }

    /// [`UntaggedQueue::accept`] on the queue `fields.qn` names, with MSN and
    /// MO from `fields`.
    pub fn accept(
        &mut self,
        fields: &UntaggedFields,
        len: u32,
        last: bool,
        buffer_len: Option<u32>,
    ) -> Result<Placement, UntaggedError> {
        self.queue_mut(fields.qn)?
            .accept(fields.msn, fields.mo, len, last, buffer_len)
    }
}

// ---------------------------------------------------------------------------
// Tagged receive checks (data sink)
// ---------------------------------------------------------------------------

/// Tagged Offset of the last payload byte of a segment at `to` with `len`
/// bytes: `None` for an empty segment, [`TaggedError::ToWrap`] if the bytes
/// would run past 2^64 - 1.
pub fn last_to(to: u64, len: u32) -> Result<Option<u64>, TaggedError> {
    match len.checked_sub(1) {
        None => Ok(None),
        Some(extra) => to
            .checked_add(u64::from(extra))
            .map(Some)
            .ok_or(TaggedError::ToWrap),
    }
}

/// Checks a segment at `to` with `len` bytes against a tagged buffer of
/// `region_len` bytes starting at TO `base`: [`TaggedError::ToWrap`] first,
/// then [`TaggedError::BaseBounds`]. Zero-length segments always pass (RFC
/// 5041 section 5.2: STag and TO of zero-length tagged messages are not
/// checked).
pub fn check_bounds(to: u64, len: u32, base: u64, region_len: u64) -> Result<(), TaggedError> {
    if len == 0 {
        return Ok(());
    }
    last_to(to, len)?;
    let offset = to.checked_sub(base).ok_or(TaggedError::BaseBounds)?;
    let room = region_len
        .checked_sub(u64::from(len))
        .ok_or(TaggedError::BaseBounds)?;
    if offset > room {
        return Err(TaggedError::BaseBounds);
    }
    Ok(())
}

/// Continuity of the tagged message in progress on a DDP stream: every
/// segment after the first must carry the same STag and continue its TO.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaggedStream {
    expect: Option<TaggedFields>,
}

impl TaggedStream {
    /// No tagged message in progress.
    pub const fn new() -> Self {
        TaggedStream { expect: None }
    }

    /// The STag and TO the next segment must carry, if a tagged message is in
    /// progress.
    pub const fn expected(&self) -> Option<TaggedFields> {
        self.expect
    }

    /// Checks one tagged segment (`last` = its L flag) and records it.
    ///
    /// A segment continuing a message must repeat its STag
    /// ([`TaggedError::InvalidStag`]) and start where the previous one ended
    /// ([`TaggedError::BaseBounds`]); any segment must not wrap the TO space
    /// ([`TaggedError::ToWrap`]). The STag's validity and bounds are for the
    /// caller (see [`check_bounds`]).
    pub fn accept(
        &mut self,
        fields: &TaggedFields,
        len: u32,
        last: bool,
    ) -> Result<(), TaggedError> {
        if let Some(e) = self.expect {
            if fields.stag != e.stag {
                return Err(TaggedError::InvalidStag(fields.stag));
            }
            if fields.to != e.to {
                return Err(TaggedError::BaseBounds);
            }
        }
        let end = match last_to(fields.to, len)? {
            None => fields.to,
            // Segment ends at last + 1; a message may end exactly at 2^64,
            // after which nothing may follow (wrapping to 0 would then fail
            // the TO continuity check unless the peer really wraps).
            Some(last_byte) => last_byte.wrapping_add(1),
        };
        self.expect = if last {
            None
        } else {
            Some(TaggedFields {
                stag: fields.stag,
                to: end,
            })
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use proptest::prelude::*;

    // --- byte-exact vectors, written from the RFC 5041 / 5040 bit layouts ---

    /// RDMA Write (opcode 0), tagged, last: T=1 L=1 DV=01 | RV=01 op=0000.
    const WRITE_LAST: [u8; 14] = [
        0xc1, 0x40, // 1100_0001, 0100_0000
        0x12, 0x34, 0x56, 0x78, // STag
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // TO
    ];

    /// Send (opcode 3), untagged, not last, QN 0, MSN 1, MO 0x1000.
    const SEND_MIDDLE: [u8; 18] = [
        0x01, 0x43, // 0000_0001, 0100_0011
        0x00, 0x00, 0x00, 0x00, // RsvdULP[8:39]
        0x00, 0x00, 0x00, 0x00, // QN 0
        0x00, 0x00, 0x00, 0x01, // MSN 1
        0x00, 0x00, 0x10, 0x00, // MO
    ];

    #[test]
    fn parse_tagged_vector() {
        let h = DdpHeader::parse(&WRITE_LAST).unwrap();
        assert_eq!(
            h,
            DdpHeader::tagged(0, true, 0x1234_5678, 0x0102_0304_0506_0708)
        );
        assert_eq!(h.header_len(), TAGGED_HEADER_LEN);
        let mut buf = [0u8; 14];
        assert_eq!(h.emit(&mut buf), Ok(14));
        assert_eq!(buf, WRITE_LAST);
    }

    #[test]
    fn parse_untagged_vector() {
        let h = DdpHeader::parse(&SEND_MIDDLE).unwrap();
        assert_eq!(h, DdpHeader::untagged(3, false, 0, 0, 1, 0x1000));
        let mut buf = [0xffu8; 18];
        assert_eq!(h.emit(&mut buf), Ok(18));
        assert_eq!(buf, SEND_MIDDLE);
    }

    #[test]
    fn control_field_accessors() {
        // T=1 L=0 Rsvd=1010 DV=01 | RV=01 Rsv=11 op=1011
        let c = ControlField(0b1010_1001_0111_1011);
        assert!(c.tagged());
        assert!(!c.last());
        assert_eq!(c.ddp_reserved(), 0b1010);
        assert_eq!(c.ddp_version(), 1);
        assert_eq!(c.rdmap_version(), 1);
        assert_eq!(c.rdmap_reserved(), 0b11);
        assert_eq!(c.opcode(), 0xb);
        assert_eq!(ControlField::new(true, true, 0x2).0, 0xc142);
        assert_eq!(ControlField::new(false, true, 0x7).0, 0x4147);
        assert_eq!(ControlField::new(false, false, 0xff).0, 0x014f);
    }

    #[test]
    fn reserved_bits_are_ignored() {
        let mut v = SEND_MIDDLE;
        v[0] |= 0x3c; // DDP Rsvd
        v[1] |= 0x30; // RDMAP Rsv
        let h = DdpHeader::parse(&v).unwrap();
        assert_eq!(h, DdpHeader::parse(&SEND_MIDDLE).unwrap());
        let mut out = [0u8; 18];
        h.emit(&mut out).unwrap();
        assert_eq!(out, SEND_MIDDLE, "reserved bits are emitted as zero");
    }

    #[test]
    fn payload_is_ignored() {
        let mut v = [0u8; 40];
        v[..14].copy_from_slice(&WRITE_LAST);
        assert_eq!(DdpHeader::parse(&v), DdpHeader::parse(&WRITE_LAST));
    }

    #[test]
    fn truncated() {
        assert_eq!(
            DdpHeader::parse(&[]),
            Err(DdpError::Truncated {
                needed: 2,
                available: 0
            })
        );
        assert_eq!(
            DdpHeader::parse(&[0xc1]),
            Err(DdpError::Truncated {
                needed: 2,
                available: 1
            })
        );
        assert_eq!(
            DdpHeader::parse(&WRITE_LAST[..13]),
            Err(DdpError::Truncated {
                needed: 14,
                available: 13
            })
        );
        assert_eq!(
            DdpHeader::parse(&SEND_MIDDLE[..17]),
            Err(DdpError::Truncated {
                needed: 18,
                available: 17
            })
        );
        // An untagged header cut at 14 bytes is truncated even though a tagged
        // one would fit.
        assert_eq!(
            DdpHeader::parse(&SEND_MIDDLE[..14]),
            Err(DdpError::Truncated {
                needed: 18,
                available: 14
            })
        );
    }

    #[test]
    fn bad_versions() {
        for dv in [0u8, 2, 3] {
            let mut v = WRITE_LAST;
            v[0] = (v[0] & !0x03) | dv;
            assert_eq!(
                DdpHeader::parse(&v),
                Err(DdpError::DdpVersion {
                    tagged: true,
                    version: dv
                })
            );
            let mut v = SEND_MIDDLE;
            v[0] = (v[0] & !0x03) | dv;
            assert_eq!(
                DdpHeader::parse(&v),
                Err(DdpError::DdpVersion {
                    tagged: false,
                    version: dv
                })
            );
        }
        for rv in [0u8, 2, 3] {
            let mut v = SEND_MIDDLE;
            v[1] = (v[1] & !0xc0) | (rv << 6);
            assert_eq!(
                DdpHeader::parse(&v),
                Err(DdpError::RdmapVersion { version: rv })
            );
        }
        // DV is checked before RV.
        let mut v = WRITE_LAST;
        v[0] &= !0x03;
        v[1] &= !0xc0;
        assert_eq!(
            DdpHeader::parse(&v),
            Err(DdpError::DdpVersion {
                tagged: true,
                version: 0
            })
        );
        // Length is checked before versions.
        assert!(matches!(
            DdpHeader::parse(&v[..5]),
            Err(DdpError::Truncated { .. })
        ));
    }

    #[test]
    fn emit_errors() {
        let h = DdpHeader::parse(&SEND_MIDDLE).unwrap();
        let mut small = [0u8; 17];
        assert_eq!(
            h.emit(&mut small),
            Err(EmitError::BufferTooShort {
                needed: 18,
                available: 17
            })
        );
        assert_eq!(small, [0u8; 17], "nothing written on error");
        let bad = DdpHeader::tagged(16, true, 0, 0);
        assert_eq!(bad.emit(&mut [0u8; 14]), Err(EmitError::FieldRange));
    }

    #[test]
    fn accessors() {
        let t = DdpHeader::tagged(2, false, 7, 9);
        assert!(t.is_tagged());
        assert_eq!(t.tagged_fields(), Some(TaggedFields { stag: 7, to: 9 }));
        assert_eq!(t.untagged_fields(), None);
        let u = DdpHeader::untagged(3, true, 1, 2, 3, 4);
        assert!(!u.is_tagged());
        assert_eq!(u.tagged_fields(), None);
        assert_eq!(
            u.untagged_fields(),
            Some(UntaggedFields {
                rsvd_ulp: 1,
                qn: 2,
                msn: 3,
                mo: 4
            })
        );
        assert_eq!(u.control().0, 0x4143);
    }

    // --- segmentation ---

    fn collect(s: Segmenter) -> std::vec::Vec<Segment> {
        s.collect()
    }

    const MULPDU: u32 = 1000;

    fn untagged_target() -> BufferFields {
        BufferFields::Untagged(UntaggedFields {
            rsvd_ulp: 0xdead_beef,
            qn: 0,
            msn: 5,
            mo: 0x5555, // ignored
        })
    }

    fn tagged_target(to: u64) -> BufferFields {
        BufferFields::Tagged(TaggedFields { stag: 0x77, to })
    }

    /// Checks the invariants every segmentation must satisfy and returns the
    /// payload lengths.
    fn check_segments(segs: &[Segment], total: u32, mulpdu: u32) -> std::vec::Vec<u32> {
        assert!(!segs.is_empty());
        let mut off = 0u32;
        for (i, s) in segs.iter().enumerate() {
            assert_eq!(s.offset, off);
            assert_eq!(s.header.last, i + 1 == segs.len());
            assert!(s.segment_len() <= mulpdu as usize);
            assert_eq!(s.payload_range(), off as usize..(off + s.len) as usize);
            match s.header.buffer {
                BufferFields::Untagged(u) => {
                    assert_eq!(u.mo, off);
                    assert_eq!(u.msn, 5);
                    assert_eq!(u.rsvd_ulp, 0xdead_beef);
                }
                BufferFields::Tagged(t) => {
                    assert_eq!(t.stag, 0x77);
                }
            }
            if i + 1 < segs.len() {
                assert_eq!(
                    s.segment_len(),
                    mulpdu as usize,
                    "all but the last are full"
                );
            }
            off += s.len;
        }
        assert_eq!(off, total);
        segs.iter().map(|s| s.len).collect()
    }

    #[test]
    fn segment_lengths_untagged() {
        let p = MULPDU - 18;
        let cases: &[(u32, &[u32])] = &[
            (0, &[0]),
            (1, &[1]),
            (p - 1, &[p - 1]),
            (p, &[p]),
            (p + 1, &[p, 1]),
            (MULPDU - 1, &[p, MULPDU - 1 - p]),
            (MULPDU, &[p, MULPDU - p]),
            (MULPDU + 1, &[p, MULPDU + 1 - p]),
            (3 * p, &[p, p, p]),
        ];
        for &(len, want) in cases {
            let s = Segmenter::new(3, untagged_target(), len, MULPDU).unwrap();
            assert_eq!(s.len(), want.len(), "len {len}");
            let segs = collect(s);
            assert_eq!(check_segments(&segs, len, MULPDU), want, "len {len}");
        }
    }

    #[test]
    fn segment_lengths_tagged() {
        let p = MULPDU - 14;
        let cases: &[(u32, &[u32])] = &[
            (0, &[0]),
            (1, &[1]),
            (MULPDU - 1, &[p, MULPDU - 1 - p]),
            (MULPDU, &[p, MULPDU - p]),
            (MULPDU + 1, &[p, MULPDU + 1 - p]),
        ];
        for &(len, want) in cases {
            let segs = collect(Segmenter::new(0, tagged_target(0x1_0000), len, MULPDU).unwrap());
            assert_eq!(check_segments(&segs, len, MULPDU), want, "len {len}");
            for s in &segs {
                assert_eq!(
                    s.header.tagged_fields().unwrap().to,
                    0x1_0000 + u64::from(s.offset)
                );
            }
        }
    }

    #[test]
    fn segment_large_message() {
        // RFC 5041's example: a 2048-byte message, MULPDU 1500, base TO 16384.
        let segs = collect(Segmenter::new(0, tagged_target(16384), 2048, 1500).unwrap());
        assert_eq!(segs.len(), 2);
        assert_eq!((segs[0].len, segs[1].len), (1486, 562));
        assert_eq!(segs[1].header.tagged_fields().unwrap().to, 17870);
        let segs = collect(Segmenter::new(3, untagged_target(), 2048, 1500).unwrap());
        assert_eq!((segs[0].len, segs[1].len), (1482, 566));
        assert_eq!(segs[1].header.untagged_fields().unwrap().mo, 1482);

        // Large: u32::MAX bytes at a small MULPDU, checked by count and tail.
        let mut s = Segmenter::new(3, untagged_target(), u32::MAX, 1 << 16).unwrap();
        let per = (1u32 << 16) - 18;
        let n = u32::MAX / per + u32::from(u32::MAX % per != 0);
        assert_eq!(s.len(), n as usize);
        let last = s.by_ref().last().unwrap();
        assert!(last.header.last);
        assert_eq!(last.offset + last.len, u32::MAX);
        assert_eq!(s.len(), 0);
        assert_eq!(s.next(), None);
    }

    #[test]
    fn segmenter_errors() {
        assert_eq!(
            Segmenter::new(3, untagged_target(), 10, 18).err(),
            Some(SegmentError::MulpduTooSmall {
                mulpdu: 18,
                header_len: 18
            })
        );
        assert_eq!(
            Segmenter::new(0, tagged_target(0), 10, 5).err(),
            Some(SegmentError::MulpduTooSmall {
                mulpdu: 5,
                header_len: 14
            })
        );
        assert!(Segmenter::new(0, tagged_target(0), 10, 15).is_ok());
        assert_eq!(
            Segmenter::new(16, tagged_target(0), 10, 100).err(),
            Some(SegmentError::OpcodeRange(16))
        );
        assert_eq!(
            Segmenter::new(0, tagged_target(u64::MAX), 2, 100).err(),
            Some(SegmentError::ToWrap)
        );
        // Ending exactly at the top of the TO space is fine.
        let segs = collect(Segmenter::new(0, tagged_target(u64::MAX - 1), 2, 100).unwrap());
        assert_eq!(segs.len(), 1);
        assert!(Segmenter::new(0, tagged_target(u64::MAX), 0, 100).is_ok());
    }

    #[test]
    fn segmenter_emits() {
        let mut s = Segmenter::new(5, untagged_target(), 1, 19).unwrap();
        let seg = s.next().unwrap();
        let mut buf = [0u8; 18];
        seg.header.emit(&mut buf).unwrap();
        assert_eq!(
            buf,
            [0x41, 0x45, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0]
        );
        assert_eq!(s.next(), None);
    }

    // --- untagged bookkeeping ---

    #[test]
    fn untagged_happy_path_and_msn_wrap() {
        let mut q = UntaggedQueue::new();
        assert_eq!(q.expected_msn(), 1);
        let p = q.accept(1, 0, 100, false, Some(250)).unwrap();
        assert_eq!(
            p,
            Placement {
                msn: 1,
                offset: 0,
                len: 100,
                completed: None
            }
        );
        assert_eq!(q.in_progress(), Some(100));
        // The buffer length is captured by the first segment.
        let p = q.accept(1, 100, 150, true, None).unwrap();
        assert_eq!(p.completed, Some(250));
        assert_eq!(q.expected_msn(), 2);
        assert_eq!(q.in_progress(), None);
        // Zero-length message consumes a buffer and completes.
        let p = q.accept(2, 0, 0, true, Some(0)).unwrap();
        assert_eq!(p.completed, Some(0));
        // MSN wraps from 0xffffffff to 0.
        let mut q = UntaggedQueue {
            next_msn: u32::MAX,
            partial: None,
        };
        q.accept(u32::MAX, 0, 1, true, Some(1)).unwrap();
        assert_eq!(q.expected_msn(), 0);
        q.accept(0, 0, 1, true, Some(1)).unwrap();
        assert_eq!(q.expected_msn(), 1);
    }

    #[test]
    fn untagged_errors() {
        let mut q = UntaggedQueue::new();
        assert_eq!(
            q.accept(2, 0, 1, true, Some(10)),
            Err(UntaggedError::MsnRange {
                expected: 1,
                got: 2
            })
        );
        assert_eq!(
            q.accept(0, 0, 1, true, Some(10)),
            Err(UntaggedError::MsnRange {
                expected: 1,
                got: 0
            })
        );
        assert_eq!(
            q.accept(1, 0, 1, true, None),
            Err(UntaggedError::MsnNoBuffer { msn: 1 })
        );
        assert_eq!(
            q.accept(1, 0, 0, true, None),
            Err(UntaggedError::MsnNoBuffer { msn: 1 })
        );
        assert_eq!(
            q.accept(1, 4, 1, true, Some(10)),
            Err(UntaggedError::InvalidMo {
                expected: 0,
                got: 4
            })
        );
        assert_eq!(
            q.accept(1, 0, 11, true, Some(10)),
            Err(UntaggedError::MessageTooLong {
                buffer_len: 10,
                needed: 11
            })
        );
        assert_eq!(q, UntaggedQueue::new(), "errors leave the state alone");

        q.accept(1, 0, 6, false, Some(10)).unwrap();
        assert_eq!(
            q.accept(1, 5, 1, false, Some(100)),
            Err(UntaggedError::InvalidMo {
                expected: 6,
                got: 5
            })
        );
        assert_eq!(
            q.accept(1, 7, 1, false, None),
            Err(UntaggedError::InvalidMo {
                expected: 6,
                got: 7
            })
        );
        assert_eq!(
            q.accept(1, 6, 5, true, Some(100)),
            Err(UntaggedError::MessageTooLong {
                buffer_len: 10,
                needed: 11
            }),
            "the later buffer_len is ignored"
        );
        assert_eq!(
            q.accept(2, 6, 4, true, None),
            Err(UntaggedError::MsnRange {
                expected: 1,
                got: 2
            })
        );
        assert_eq!(q.accept(1, 6, 4, true, None).unwrap().completed, Some(10));

        // MO + len near u32::MAX does not overflow.
        let mut q = UntaggedQueue::new();
        q.accept(1, 0, u32::MAX, false, Some(u32::MAX)).unwrap();
        assert_eq!(
            q.accept(1, u32::MAX, u32::MAX, true, None),
            Err(UntaggedError::MessageTooLong {
                buffer_len: u32::MAX,
                needed: 2 * u64::from(u32::MAX)
            })
        );
        assert_eq!(
            q.accept(1, u32::MAX, 0, true, None).unwrap().completed,
            Some(u32::MAX)
        );
    }

    #[test]
    fn untagged_queues() {
        let mut qs = UntaggedQueues::<4>::new();
        let f = |qn, msn, mo| UntaggedFields {
            rsvd_ulp: 0,
            qn,
            msn,
            mo,
        };
        assert_eq!(
            qs.accept(&f(4, 1, 0), 1, true, Some(1)),
            Err(UntaggedError::InvalidQn(4))
        );
        assert_eq!(
            qs.accept(&f(u32::MAX, 1, 0), 1, true, Some(1)),
            Err(UntaggedError::InvalidQn(u32::MAX))
        );
        assert_eq!(qs.queue(9).err(), Some(UntaggedError::InvalidQn(9)));
        qs.accept(&f(1, 1, 0), 28, true, Some(28)).unwrap();
        assert_eq!(qs.queue(1).unwrap().expected_msn(), 2);
        assert_eq!(
            qs.queue(0).unwrap().expected_msn(),
            1,
            "queues are independent"
        );
        assert_eq!(qs.queue_mut(3).unwrap().expected_msn(), 1);
        let empty = UntaggedQueues::<0>::default();
        assert_eq!(empty.queue(0).err(), Some(UntaggedError::InvalidQn(0)));
    }

    // --- tagged checks ---

    #[test]
    fn to_arithmetic() {
        assert_eq!(last_to(5, 0), Ok(None));
        assert_eq!(last_to(5, 1), Ok(Some(5)));
        assert_eq!(last_to(u64::MAX, 1), Ok(Some(u64::MAX)));
        assert_eq!(last_to(u64::MAX, 2), Err(TaggedError::ToWrap));
        assert_eq!(last_to(u64::MAX - 9, 10), Ok(Some(u64::MAX)));
        assert_eq!(last_to(u64::MAX - 9, 11), Err(TaggedError::ToWrap));
        assert_eq!(last_to(u64::MAX, 0), Ok(None));
    }

    #[test]
    fn bounds() {
        assert_eq!(check_bounds(100, 10, 100, 10), Ok(()));
        assert_eq!(check_bounds(105, 5, 100, 10), Ok(()));
        assert_eq!(check_bounds(106, 5, 100, 10), Err(TaggedError::BaseBounds));
        assert_eq!(check_bounds(99, 1, 100, 10), Err(TaggedError::BaseBounds));
        assert_eq!(check_bounds(100, 11, 100, 10), Err(TaggedError::BaseBounds));
        assert_eq!(
            check_bounds(0, 0, 100, 10),
            Ok(()),
            "zero length is never checked"
        );
        assert_eq!(
            check_bounds(u64::MAX, 2, 0, u64::MAX),
            Err(TaggedError::ToWrap)
        );
        assert_eq!(check_bounds(u64::MAX, 1, u64::MAX, 1), Ok(()));
        assert_eq!(check_bounds(0, u32::MAX, 0, u64::MAX), Ok(()));
    }

    #[test]
    fn tagged_stream() {
        let mut s = TaggedStream::new();
        let f = |stag, to| TaggedFields { stag, to };
        s.accept(&f(1, 1000), 100, false).unwrap();
        assert_eq!(s.expected(), Some(f(1, 1100)));
        assert_eq!(
            s.accept(&f(2, 1100), 1, true),
            Err(TaggedError::InvalidStag(2))
        );
        assert_eq!(s.accept(&f(1, 1101), 1, true), Err(TaggedError::BaseBounds));
        s.accept(&f(1, 1100), 0, false).unwrap();
        s.accept(&f(1, 1100), 5, true).unwrap();
        assert_eq!(s.expected(), None);
        // New message: any STag / TO.
        s.accept(&f(9, 0), 1, true).unwrap();
        assert_eq!(s.accept(&f(9, u64::MAX), 2, true), Err(TaggedError::ToWrap));
        // A message may end exactly at the top of the TO space.
        s.accept(&f(9, u64::MAX - 1), 2, true).unwrap();
    }

    // --- property tests ---

    fn any_header() -> impl Strategy<Value = DdpHeader> {
        let tagged = (any::<u32>(), any::<u64>())
            .prop_map(|(stag, to)| BufferFields::Tagged(TaggedFields { stag, to }));
        let untagged = (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(rsvd_ulp, qn, msn, mo)| {
                BufferFields::Untagged(UntaggedFields {
                    rsvd_ulp,
                    qn,
                    msn,
                    mo,
                })
            },
        );
        (any::<bool>(), 0u8..16, prop_oneof![tagged, untagged]).prop_map(
            |(last, opcode, buffer)| DdpHeader {
                last,
                opcode,
                buffer,
            },
        )
    }

    proptest! {
        #[test]
        fn prop_parse_emit_identity(h in any_header()) {
            let mut buf = [0u8; UNTAGGED_HEADER_LEN + 4];
            let n = h.emit(&mut buf).unwrap();
            prop_assert_eq!(n, h.header_len());
            prop_assert_eq!(DdpHeader::parse(&buf[..n]), Ok(h));
        }

        #[test]
        fn prop_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(h) = DdpHeader::parse(&bytes) {
                let mut out = [0u8; UNTAGGED_HEADER_LEN];
                let n = h.emit(&mut out).unwrap();
                // Equal up to the ignored reserved bits.
                prop_assert_eq!(out[0], bytes[0] & !0x3c);
                prop_assert_eq!(out[1], bytes[1] & !0x30);
                prop_assert_eq!(&out[2..n], &bytes[2..n]);
            }
        }

        #[test]
        fn prop_segmenter(len in 0u32..100_000, mulpdu in 15u32..5000, tagged in any::<bool>()) {
            let target = if tagged { tagged_target(1 << 40) } else { untagged_target() };
            match Segmenter::new(3, target, len, mulpdu) {
                Ok(s) => {
                    let n = s.len();
                    let segs = collect(s);
                    prop_assert_eq!(segs.len(), n);
                    check_segments(&segs, len, mulpdu);
                }
                Err(e) => {
                    prop_assert!(!tagged && mulpdu <= 18);
                    prop_assert_eq!(e, SegmentError::MulpduTooSmall { mulpdu, header_len: 18 });
                }
            }
        }

        #[test]
        fn prop_segments_feed_receiver(len in 0u32..20_000, mulpdu in 19u32..3000) {
            // What the segmenter sends, the receiver bookkeeping accepts.
            let mut q = UntaggedQueues::<4>::new();
            let target = BufferFields::Untagged(UntaggedFields { rsvd_ulp: 0, qn: 0, msn: 1, mo: 0 });
            let mut done = None;
            for seg in Segmenter::new(3, target, len, mulpdu).unwrap() {
                let f = seg.header.untagged_fields().unwrap();
                prop_assert!(done.is_none());
                done = q.accept(&f, seg.len, seg.header.last, Some(len)).unwrap().completed;
            }
            prop_assert_eq!(done, Some(len));
        }
    }
}
