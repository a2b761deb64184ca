// SPDX-License-Identifier: GPL-2.0

//! MPA: Marker PDU Aligned framing for TCP (RFC 5044), with the enhanced
//! connection establishment of RFC 6581.
//!
//! This module covers everything MPA puts on the wire except the DDP/RDMAP
//! contents of an FPDU:
//!
//! - the MPA Request/Reply frames ([`MpaFrameRepr`]) and the RFC 6581
//!   IRD/ORD block ([`EnhancedData`]);
//! - the startup handshake as a sans-IO state machine ([`Handshake`]) for
//!   both roles, configured by [`MpaConfig`] and producing [`Negotiated`];
//! - FPDU framing helpers for the receive parser and the transmit builder:
//!   ULPDU_Length, pad, CRC trailer, wire lengths, MULPDU, and MPA markers
//!   ([`MarkerState`], [`emit_fpdu`], [`parse_fpdu`],
//!   [`parse_fpdu_with_markers`], [`check_fpdu_crc`]).
//!
//! # Wire facts this module relies on
//!
//! MPA Request/Reply frame (all multi-octet fields big endian):
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |   Key: 16 octets, "MPA ID Req Frame" or "MPA ID Rep Frame"    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |M|C|R|S| Res   |     Rev       |          PD_Length            |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |           Private Data (PD_Length octets, at most 512)        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! M: the sender wants markers in the FPDUs it *receives* (markers are per
//! direction). C: CRC requested; CRCs are used in both directions if either
//! frame has C set. R: reject (Reply only). S: RFC 6581 enhanced connection
//! establishment, meaningful with Rev 2 only; the first four octets of the
//! private data (counted in PD_Length) are then the IRD/ORD block:
//!
//! ```text
//! |A|B|           IRD             |C|D|           ORD             |
//! ```
//!
//! A: peer-to-peer (the ready-to-receive, RTR, message is used), B:
//! zero-length Send RTR, C: zero-length RDMA Write RTR, D: zero-length RDMA
//! Read RTR; IRD and ORD are 14 bits each. Res is sent as zero and not
//! checked on receipt (upstream siw uses bit 0x08 of that octet as a
//! private "GSO allowed" flag, so rejecting non-zero Res would break
//! interoperation).
//!
//! FPDU: `ULPDU_Length (2) | ULPDU | PAD (0..3) | CRC (4)`. ULPDU_Length
//! counts only the ULPDU octets (not itself, pad, CRC or markers). PAD makes
//! ULPDU_Length + ULPDU + PAD a multiple of four; it is zero on send. The CRC
//! field is always present; with CRC disabled it is sent as zero (as siw
//! does) and never checked. The CRC covers every FPDU octet before the CRC
//! field, including any markers inside the FPDU and a marker at its start.
//! CRC byte order: see [`super::crc32c`] (least significant octet first).
//!
//! Markers (when negotiated for a direction): a 4-octet marker
//! `Reserved (16, zero) | FPDUPTR (16)` sits at every stream offset that is a
//! multiple of 512, where offset 0 is the first octet of the first FPDU sent
//! in that direction (the Request/Reply frames are not counted; this is the
//! "(SeqNum - SeqStart) mod 512 = 0" rule, so the very first marker starts
//! the stream). FPDUPTR is the number of stream octets from the first octet
//! of the containing FPDU's ULPDU_Length field to the first octet of the
//! marker. A marker that falls exactly at an FPDU boundary is placed in
//! front of the next FPDU's ULPDU_Length and has FPDUPTR 0, so the first
//! marker of a stream always carries 0. The two low bits of FPDUPTR are
//! sent as zero and ignored on receipt, as is the reserved half. Markers are
//! counted in the CRC but not in ULPDU_Length.
//!
//! Upstream siw never uses markers (it rejects a peer that asks for them)
//! and by default neither requests nor refuses CRC (it uses CRC whenever the
//! peer asks). See the individual items for its negotiation behaviour.

use super::crc32c::CrcEngine;
use super::ddp::copy_octets;
use core::fmt;

/// Length of the key that starts every Request/Reply frame.
pub const KEY_LEN: usize = 16;
/// The key of an MPA Request frame, `"MPA ID Req Frame"`.
pub const REQUEST_KEY: [u8; KEY_LEN] = *b"MPA ID Req Frame";
/// The key of an MPA Reply frame, `"MPA ID Rep Frame"`.
pub const REPLY_KEY: [u8; KEY_LEN] = *b"MPA ID Rep Frame";
/// Length of a Request/Reply frame without private data.
pub const FRAME_HEADER_LEN: usize = 20;
/// Largest PD_Length allowed by RFC 5044 (this includes the RFC 6581
/// IRD/ORD block when present). Note that upstream siw refuses frames with
/// more than 256 octets of private data (`RDMA_MAX_PRIVATE_DATA`).
pub const MAX_PRIVATE_DATA: usize = 512;
/// Largest valid Request/Reply frame.
pub const MAX_FRAME_LEN: usize = FRAME_HEADER_LEN + MAX_PRIVATE_DATA;
/// Length of the RFC 6581 IRD/ORD block.
pub const ENHANCED_DATA_LEN: usize = 4;
/// Largest IRD or ORD value representable in the RFC 6581 block (14 bits).
pub const IRD_ORD_MAX: u16 = 0x3FFF;

/// Length of the ULPDU_Length field that starts every FPDU.
pub const ULPDU_LENGTH_LEN: usize = 2;
/// Length of the CRC field that ends every FPDU.
pub const CRC_LEN: usize = 4;
/// Length of an MPA marker.
pub const MARKER_LEN: usize = 4;
/// Distance in stream octets between the starts of two markers.
pub const MARKER_INTERVAL: u32 = 512;
/// Largest value of the ULPDU_Length field.
pub const MAX_ULPDU_LEN: usize = u16::MAX as usize;

const FLAG_M: u8 = 0x80;
const FLAG_C: u8 = 0x40;
const FLAG_R: u8 = 0x20;
const FLAG_S: u8 = 0x10;
const FLAG_RES_MASK: u8 = 0x0F;
/// The Res bit upstream siw uses to say "this side accepts FPDUs larger
/// than one TCP segment" (its `MPA_RR_FLAG_GSO_EXP`); siw_rs uses it with
/// the same meaning.
pub const RES_LARGE_FPDUS: u8 = 0x08;

const ENH_P2P: u16 = 0x8000; // A, in the IRD word
const ENH_SEND_RTR: u16 = 0x4000; // B, in the IRD word
const ENH_WRITE_RTR: u16 = 0x8000; // C, in the ORD word
const ENH_READ_RTR: u16 = 0x4000; // D, in the ORD word

/// Framed octets between two markers (the interval minus the marker).
const MARKER_PAYLOAD: usize = MARKER_INTERVAL as usize - MARKER_LEN;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Errors of the MPA layer.
///
/// [`MpaError::term_code`] maps the protocol errors to the MPA error code of
/// a TERMINATE message (layer LLP = 2, error type MPA = 0, RFC 5040 /
/// RFC 6581). A TERMINATE is an FPDU, so it can only be sent once the
/// sender is in full operation: the initiator after it received the Reply,
/// the responder after it sent its Reply. Before that the connection manager
/// rejects (responder, see [`Handshake::reject`]) or just closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MpaError {
    /// The input ends before the item is complete: at least `needed` more
    /// octets are required. Not an error of the peer.
    Incomplete {
        /// Minimum number of additional octets required.
        needed: usize,
    },
    /// The output buffer is too small; `needed` octets are required in
    /// total.
    BufferTooSmall {
        /// Required buffer length.
        needed: usize,
    },
    /// The frame key is neither the Request nor the Reply key (detected as
    /// soon as the received octets stop matching both keys).
    BadKey,
    /// A Request arrived where a Reply was expected, or vice versa.
    WrongFrameKind,
    /// The Rev field holds a revision other than 1 or 2.
    BadRevision(u8),
    /// PD_Length (or the private data to send) exceeds 512 octets.
    PrivateDataTooLong(usize),
    /// Rev 2 with the S flag, but fewer than 4 octets of private data.
    EnhancedDataMissing,
    /// The initiator sent data after its Request before receiving the Reply
    /// (RFC 5044 forbids sending FPDUs before the Reply; siw treats this as
    /// a protocol error).
    UnexpectedData,
    /// The peer's revision is not acceptable: a Reply with a higher revision
    /// than the Request, or (strict mode) any revision other than ours.
    RevisionMismatch,
    /// RFC 6581 enhanced mode was used by one side only where that is not
    /// acceptable (strict mode, or a Reply enhanced without being asked).
    EnhancedMismatch,
    /// The peer's CRC flag contradicts the local [`CrcPolicy`].
    CrcPolicyMismatch,
    /// The peer requires markers but [`MpaConfig::markers_tx`] is false.
    MarkersUnsupported,
    /// No acceptable RTR message type (RFC 6581 "No Matching RTR Option").
    NoMatchingRtr,
    /// The peer's ORD exceeds the IRD this side can provide, or a Read RTR
    /// cannot be issued (RFC 6581 "Insufficient IRD Resources").
    InsufficientIrd,
    /// The operation is not valid in the current state.
    InvalidState,
    /// A caller-supplied parameter is out of range.
    InvalidParameter,
    /// The ULPDU is longer than the 16-bit ULPDU_Length field allows.
    UlpduTooLong(usize),
    /// The received CRC does not match the computed one.
    BadCrc {
        /// CRC computed over the received octets.
        computed: u32,
        /// CRC carried in the trailer.
        received: u32,
    },
    /// A received marker's FPDUPTR does not point at the current FPDU
    /// (RFC 5044 "Marker and ULPDU Length field mismatch").
    MarkerMismatch {
        /// FPDUPTR value that was expected at this stream position.
        expected: u32,
        /// FPDUPTR value found in the marker.
        received: u16,
    },
}

impl MpaError {
    /// TERMINATE error code for layer LLP (2), error type MPA (0), or
    /// `None` for errors that are not the peer's (or have no code).
    ///
    /// 0x02 CRC error, 0x03 marker and ULPDU_Length mismatch, 0x04 invalid
    /// MPA Request or Reply frame, 0x06 insufficient IRD resources, 0x07 no
    /// matching RTR option. Upstream siw sends 0x02 on a CRC mismatch and
    /// then drops the connection; as initiator it sends 0x04 for a bad
    /// Reply key, 0x06 and 0x07 for failed RFC 6581 negotiation.
    pub const fn term_code(&self) -> Option<u8> {
        match self {
            MpaError::BadCrc { .. } => Some(0x02),
            MpaError::MarkerMismatch { .. } => Some(0x03),
            MpaError::BadKey
            | MpaError::WrongFrameKind
            | MpaError::BadRevision(_)
            | MpaError::PrivateDataTooLong(_)
            | MpaError::EnhancedDataMissing
            | MpaError::UnexpectedData
            | MpaError::RevisionMismatch
            | MpaError::EnhancedMismatch
            | MpaError::CrcPolicyMismatch
            | MpaError::MarkersUnsupported => Some(0x04),
            MpaError::InsufficientIrd => Some(0x06),
            MpaError::NoMatchingRtr => Some(0x07),
            MpaError::Incomplete { .. }
            | MpaError::BufferTooSmall { .. }
            | MpaError::InvalidState
            | MpaError::InvalidParameter
            | MpaError::UlpduTooLong(_) => None,
        }
    }
}

impl fmt::Display for MpaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MpaError::Incomplete { needed } => write!(f, "incomplete: {needed} more octets needed"),
            MpaError::BufferTooSmall { needed } => {
                write!(f, "buffer too small: {needed} octets needed")
            }
            MpaError::BadKey => f.write_str("bad MPA frame key"),
            MpaError::WrongFrameKind => f.write_str("unexpected MPA frame kind"),
            MpaError::BadRevision(r) => write!(f, "unsupported MPA revision {r}"),
            MpaError::PrivateDataTooLong(n) => write!(f, "private data too long ({n} octets)"),
            MpaError::EnhancedDataMissing => f.write_str("enhanced flag without IRD/ORD data"),
            MpaError::UnexpectedData => f.write_str("data received before the MPA Reply was sent"),
            MpaError::RevisionMismatch => f.write_str("MPA revision mismatch"),
            MpaError::EnhancedMismatch => f.write_str("enhanced connection establishment mismatch"),
            MpaError::CrcPolicyMismatch => f.write_str("CRC policy mismatch"),
            MpaError::MarkersUnsupported => f.write_str("peer requires markers"),
            MpaError::NoMatchingRtr => f.write_str("no matching RTR option"),
            MpaError::InsufficientIrd => f.write_str("insufficient IRD resources"),
            MpaError::InvalidState => f.write_str("invalid state for this operation"),
            MpaError::InvalidParameter => f.write_str("invalid parameter"),
            MpaError::UlpduTooLong(n) => write!(f, "ULPDU too long ({n} octets)"),
            MpaError::BadCrc { computed, received } => {
                write!(
                    f,
                    "CRC mismatch: computed {computed:#010x}, received {received:#010x}"
                )
            }
            MpaError::MarkerMismatch { expected, received } => {
                write!(f, "marker FPDUPTR {received} where {expected} was expected")
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Request/Reply frames
// ---------------------------------------------------------------------------

/// Whether a frame is an MPA Request or an MPA Reply (its key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// `"MPA ID Req Frame"`, sent by the initiator.
    Request,
    /// `"MPA ID Rep Frame"`, sent by the responder.
    Reply,
}

impl FrameKind {
    /// The 16-octet key of this kind of frame.
    pub const fn key(self) -> &'static [u8; KEY_LEN] {
        match self {
            FrameKind::Request => &REQUEST_KEY,
            FrameKind::Reply => &REPLY_KEY,
        }
    }
}

/// MPA revision (the Rev field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Revision {
    /// Revision 1, RFC 5044.
    V1 = 1,
    /// Revision 2, RFC 6581 (required for enhanced connection
    /// establishment). Upstream siw defaults to it.
    V2 = 2,
}

impl Revision {
    /// The revision carried by a Rev octet, if supported. (Upstream siw
    /// also accepts the pre-RFC value 0; this implementation does not.)
    pub const fn from_wire(rev: u8) -> Option<Self> {
        match rev {
            1 => Some(Revision::V1),
            2 => Some(Revision::V2),
            _ => None,
        }
    }

    /// The Rev octet of this revision.
    pub const fn to_wire(self) -> u8 {
        self as u8
    }
}

/// The flag bits of a Request/Reply frame other than S (which is
/// represented by [`MpaFrameRepr::enhanced`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpaFlags {
    /// M: the sender wants markers in the FPDUs it receives.
    pub markers: bool,
    /// C: the sender requests CRCs.
    pub crc: bool,
    /// R: the connection is rejected (meaningful in a Reply only).
    pub reject: bool,
    /// The four Res bits (low nibble of the flags octet): zero on send, not
    /// checked on receipt. Upstream siw sets 0x08 to offer GSO.
    pub reserved: u8,
}

/// Which zero-length message is used as the RFC 6581 ready-to-receive (RTR)
/// message, sent by the initiator as its first FPDU in peer-to-peer mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rtr {
    /// Zero-length Send (B bit).
    Send,
    /// Zero-length RDMA Write (C bit). Preferred by siw and by this
    /// implementation.
    Write,
    /// Zero-length RDMA Read Request (D bit); needs IRD >= 1 at the
    /// responder and ORD >= 1 at the initiator.
    Read,
}

impl Rtr {
    const fn bit(self) -> u8 {
        match self {
            Rtr::Send => 1,
            Rtr::Write => 2,
            Rtr::Read => 4,
        }
    }
}

/// A set of [`Rtr`] message types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RtrSet(u8);

impl RtrSet {
    /// No RTR type.
    pub const EMPTY: RtrSet = RtrSet(0);
    /// Zero-length Send only.
    pub const SEND: RtrSet = RtrSet(1);
    /// Zero-length RDMA Write only.
    pub const WRITE: RtrSet = RtrSet(2);
    /// Zero-length RDMA Read only.
    pub const READ: RtrSet = RtrSet(4);
    /// Write and Read: what upstream siw offers as initiator.
    pub const WRITE_READ: RtrSet = RtrSet(6);
    /// All three types.
    pub const ALL: RtrSet = RtrSet(7);

    /// The set holding only `rtr`.
    pub const fn only(rtr: Rtr) -> Self {
        RtrSet(rtr.bit())
    }

    /// Whether `rtr` is in the set.
    pub const fn contains(self, rtr: Rtr) -> bool {
        self.0 & rtr.bit() != 0
    }

    /// The set with `rtr` added.
    pub const fn with(self, rtr: Rtr) -> Self {
        RtrSet(self.0 | rtr.bit())
    }

    /// Types present in both sets.
    pub const fn intersection(self, other: RtrSet) -> Self {
        RtrSet(self.0 & other.0)
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The preferred member: Write, then Read, then Send (the order siw
    /// uses when it picks an RTR as responder).
    pub const fn preferred(self) -> Option<Rtr> {
        if self.contains(Rtr::Write) {
            Some(Rtr::Write)
        } else if self.contains(Rtr::Read) {
            Some(Rtr::Read)
        } else if self.contains(Rtr::Send) {
            Some(Rtr::Send)
        } else {
            None
        }
    }
}

/// The RFC 6581 IRD/ORD block at the start of the private data of a Rev 2
/// frame with the S flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnhancedData {
    /// Inbound RDMA Read queue depth of the sender (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth of the sender (14 bits).
    pub ord: u16,
    /// A: peer-to-peer mode, an RTR message will be used.
    pub p2p: bool,
    /// B/C/D: in a Request, the RTR types the initiator can send; in a
    /// Reply, the one type the responder chose.
    pub rtr: RtrSet,
}

impl EnhancedData {
    /// Parses the block from the first four octets of `data`.
    pub fn parse(data: &[u8]) -> Result<Self, MpaError> {
        let Some(&[a, b, c, d]) = data.get(..ENHANCED_DATA_LEN) else {
            return Err(MpaError::Incomplete {
                needed: ENHANCED_DATA_LEN.saturating_sub(data.len()),
            });
        };
        let ird_word = u16::from_be_bytes([a, b]);
        let ord_word = u16::from_be_bytes([c, d]);
        let mut rtr = RtrSet::EMPTY;
        if ird_word & ENH_SEND_RTR != 0 {
            rtr = rtr.with(Rtr::Send);
        }
        if ord_word & ENH_WRITE_RTR != 0 {
            rtr = rtr.with(Rtr::Write);
        }
        if ord_word & ENH_READ_RTR != 0 {
            rtr = rtr.with(Rtr::Read);
        }
        Ok(EnhancedData {
            ird: ird_word & IRD_ORD_MAX,
            ord: ord_word & IRD_ORD_MAX,
            p2p: ird_word & ENH_P2P != 0,
            rtr,
        })
    }

    /// Writes the block into the first four octets of `out`; IRD and ORD
    /// must not exceed [`IRD_ORD_MAX`].
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, MpaError> {
        if self.ird > IRD_ORD_MAX || self.ord > IRD_ORD_MAX {
            return Err(MpaError::InvalidParameter);
        }
        let Some(dst) = out.get_mut(..ENHANCED_DATA_LEN) else {
            return Err(MpaError::BufferTooSmall {
                needed: ENHANCED_DATA_LEN,
            });
        };
        let mut ird_word = self.ird;
        let mut ord_word = self.ord;
        if self.p2p {
            ird_word |= ENH_P2P;
        }
        if self.rtr.contains(Rtr::Send) {
            ird_word |= ENH_SEND_RTR;
        }
        if self.rtr.contains(Rtr::Write) {
            ord_word |= ENH_WRITE_RTR;
        }
        if self.rtr.contains(Rtr::Read) {
            ord_word |= ENH_READ_RTR;
        }
        let [a, b] = ird_word.to_be_bytes();
        let [c, d] = ord_word.to_be_bytes();
        dst.copy_from_slice(&[a, b, c, d]);
        Ok(ENHANCED_DATA_LEN)
    }
}

/// An MPA Request or Reply frame.
///
/// `private_data` is the ULP private data only: in enhanced mode the IRD/ORD
/// block is held in `enhanced`, and PD_Length on the wire is
/// `4 + private_data.len()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MpaFrameRepr<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M, C, R and the reserved bits.
    pub flags: MpaFlags,
    /// The Rev field.
    pub revision: Revision,
    /// The RFC 6581 block; `Some` exactly when the S flag is set in a Rev 2
    /// frame. (S in a Rev 1 frame is a reserved bit and ignored.)
    pub enhanced: Option<EnhancedData>,
    /// ULP private data.
    pub private_data: &'a [u8],
}

impl<'a> MpaFrameRepr<'a> {
    /// Parses a frame from the start of `data`, returning it and the number
    /// of octets it occupies (octets after it are not looked at).
    ///
    /// Returns [`MpaError::Incomplete`] while `data` is a valid but
    /// unfinished prefix; the key is checked octet by octet, so a wrong key
    /// is reported as soon as it diverges. Malformed frames give
    /// [`MpaError::BadKey`], [`MpaError::BadRevision`],
    /// [`MpaError::PrivateDataTooLong`] or
    /// [`MpaError::EnhancedDataMissing`]. Reserved bits are not checked.
    ///
    /// Interop leniency: a *reject* Reply with Rev 2 and the S flag but
    /// fewer than four octets of private data is accepted as not enhanced
    /// (siw sends such a frame when it refuses a Request before parsing its
    /// IRD/ORD block).
    pub fn parse(data: &'a [u8]) -> Result<(Self, usize), MpaError> {
        let key_avail = data.len().min(KEY_LEN);
        let key = data.get(..key_avail).unwrap_or(&[]);
        let is_request = REQUEST_KEY.get(..key_avail) == Some(key);
        let is_reply = REPLY_KEY.get(..key_avail) == Some(key);
        if !is_request && !is_reply {
            return Err(MpaError::BadKey);
        }
        let Some(&[flags, rev, pd_hi, pd_lo]) = data.get(KEY_LEN..FRAME_HEADER_LEN) else {
            return Err(MpaError::Incomplete {
                needed: FRAME_HEADER_LEN.saturating_sub(data.len()),
            });
        };
        let kind = if is_request {
            FrameKind::Request
        } else {
            FrameKind::Reply
        };
        let revision = Revision::from_wire(rev).ok_or(MpaError::BadRevision(rev))?;
        let pd_len = usize::from(u16::from_be_bytes([pd_hi, pd_lo]));
        if pd_len > MAX_PRIVATE_DATA {
            return Err(MpaError::PrivateDataTooLong(pd_len));
        }
        let total = FRAME_HEADER_LEN + pd_len;
        let Some(pd) = data.get(FRAME_HEADER_LEN..total) else {
            return Err(MpaError::Incomplete {
                needed: total.saturating_sub(data.len()),
            });
        };
        let flags_repr = MpaFlags {
            markers: flags & FLAG_M != 0,
            crc: flags & FLAG_C != 0,
            reject: flags & FLAG_R != 0,
            reserved: flags & FLAG_RES_MASK,
        };
        let mut enhanced = None;
        let mut private_data = pd;
        if revision == Revision::V2 && flags & FLAG_S != 0 {
            match (EnhancedData::parse(pd), pd.get(ENHANCED_DATA_LEN..)) {
                (Ok(e), Some(rest)) => {
                    enhanced = Some(e);
                    private_data = rest;
                }
                _ if flags_repr.reject => {}
                _ => return Err(MpaError::EnhancedDataMissing),
            }
        }
        Ok((
            MpaFrameRepr {
                kind,
                flags: flags_repr,
                revision,
                enhanced,
                private_data,
            },
            total,
        ))
    }

    /// PD_Length of this frame (ULP private data plus the IRD/ORD block).
    pub fn pd_len(&self) -> usize {
        let enh = if self.enhanced.is_some() {
            ENHANCED_DATA_LEN
        } else {
            0
        };
        self.private_data.len().saturating_add(enh)
    }

    /// Number of octets [`emit`](Self::emit) writes.
    pub fn buffer_len(&self) -> usize {
        FRAME_HEADER_LEN.saturating_add(self.pd_len())
    }

    /// Writes the frame to the start of `out`, returning its length.
    ///
    /// Fails with [`MpaError::PrivateDataTooLong`] if PD_Length would exceed
    /// 512, [`MpaError::InvalidParameter`] for an enhanced block in a Rev 1
    /// frame, out-of-range IRD/ORD or reserved bits outside the low nibble,
    /// and [`MpaError::BufferTooSmall`] if `out` is short.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, MpaError> {
        let pd_len = self.pd_len();
        if pd_len > MAX_PRIVATE_DATA {
            return Err(MpaError::PrivateDataTooLong(pd_len));
        }
        if self.flags.reserved & !FLAG_RES_MASK != 0 {
            return Err(MpaError::InvalidParameter);
        }
        if let Some(e) = self.enhanced {
            if self.revision != Revision::V2 || e.ird > IRD_ORD_MAX || e.ord > IRD_ORD_MAX {
                return Err(MpaError::InvalidParameter);
            }
        }
        let total = FRAME_HEADER_LEN + pd_len;
        let Some(out) = out.get_mut(..total) else {
            return Err(MpaError::BufferTooSmall { needed: total });
        };
        let (header, body) = out.split_at_mut(FRAME_HEADER_LEN);
        let mut flags = self.flags.reserved;
        if self.flags.markers {
            flags |= FLAG_M;
        }
        if self.flags.crc {
            flags |= FLAG_C;
        }
        if self.flags.reject {
            flags |= FLAG_R;
        }
        if self.enhanced.is_some() {
            flags |= FLAG_S;
        }
        let [pd_hi, pd_lo] = (pd_len as u16).to_be_bytes();
        let (key, fields) = header.split_at_mut(KEY_LEN);
        key.copy_from_slice(self.kind.key());
        fields.copy_from_slice(&[flags, self.revision.to_wire(), pd_hi, pd_lo]);
        let mut body = body;
        if let Some(e) = self.enhanced {
            let n = e.emit(body)?;
            body = body.get_mut(n..).unwrap_or(&mut []);
        }
        if body.len() != self.private_data.len() {
            return Err(MpaError::InvalidParameter); // unreachable by construction
        }
        copy_octets(body, self.private_data);
        Ok(total)
    }
}

// ---------------------------------------------------------------------------
// Handshake configuration and results
// ---------------------------------------------------------------------------

/// How this side treats the C (CRC) flag.
///
/// RFC 5044: CRCs are used in both directions if either frame has C set,
/// and a responder MUST set C in its Reply if the Request had it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrcPolicy {
    /// Never use CRC: a peer that sets C is refused with
    /// [`MpaError::CrcPolicyMismatch`] (siw with `mpa_crc_strict` and
    /// without `mpa_crc_required`).
    Off,
    /// Do not set C, but use CRC if the peer sets it (siw default).
    PreferOff,
    /// Set C and always use CRC (siw `mpa_crc_required`). As initiator a
    /// Reply without C is refused (as siw does); as responder a Request
    /// without C is answered with C set unless `strict`.
    On,
}

/// RFC 6581 enhanced connection establishment settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnhancedConfig {
    /// Inbound RDMA Read queue depth this side offers. For the responder
    /// this is replaced by the `ird` argument of [`Handshake::accept`].
    /// Values above [`IRD_ORD_MAX`] are clamped.
    pub ird: u16,
    /// Outbound RDMA Read queue depth this side wants. For the responder
    /// this is replaced by the `ord` argument of [`Handshake::accept`].
    pub ord: u16,
    /// How far this side may raise its IRD when the peer's ORD is larger
    /// (the "relaxed" negotiation siw and cxgb4 do, bounded by the device
    /// maximum). `ird_max <= ird` disables raising: the initiator then fails
    /// with [`MpaError::InsufficientIrd`] when the responder's ORD exceeds
    /// its IRD, as RFC 6581 prescribes.
    pub ird_max: u16,
    /// Initiator: request peer-to-peer mode (an RTR message). Responder:
    /// *require* it, i.e. refuse a Request without P2P with
    /// [`MpaError::NoMatchingRtr`]. A responder honours a peer-to-peer
    /// Request whether or not this is set, as siw, cxgb4 and irdma do.
    pub p2p: bool,
    /// Initiator: the RTR types it can send (siw offers Write and Read).
    /// Responder: the RTR types it accepts; the choice prefers Write, then
    /// Read, then Send (see [`choose_rtr`]).
    pub rtr: RtrSet,
}

impl EnhancedConfig {
    /// IRD/ORD settings without peer-to-peer mode; `ird_max = ird`, RTR
    /// types Write and Read for when `p2p` is switched on.
    pub const fn new(ird: u16, ord: u16) -> Self {
        EnhancedConfig {
            ird,
            ord,
            ird_max: ird,
            p2p: false,
            rtr: RtrSet::WRITE_READ,
        }
    }
}

/// Configuration of one side of the MPA handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MpaConfig<'a> {
    /// Highest revision to use. An initiator sends it; a responder replies
    /// with the lower of it and the Request's revision.
    pub revision: Revision,
    /// CRC policy.
    pub crc: CrcPolicy,
    /// Strict mode: the peer must match exactly, else the handshake fails
    /// (the responder may still [`reject`](Handshake::reject)). The peer's
    /// C flag must equal ours, its revision must equal `revision`, and
    /// enhanced mode must be used by both or neither.
    pub strict: bool,
    /// Ask the peer to put markers into the FPDUs this side receives (the M
    /// flag of our frame). Upstream siw refuses such a request.
    pub markers_rx: bool,
    /// Whether this side is able to insert markers into the FPDUs it sends
    /// when the peer asks; if false such a peer is refused with
    /// [`MpaError::MarkersUnsupported`] (siw behaviour).
    pub markers_tx: bool,
    /// RFC 6581 settings; used only with [`Revision::V2`]. `None` means
    /// plain RFC 5044 semantics (no IRD/ORD block).
    pub enhanced: Option<EnhancedConfig>,
    /// Private data of the Request (initiator only; the responder gives its
    /// private data to [`Handshake::accept`] or [`Handshake::reject`]).
    /// At most 512 octets, 508 in enhanced mode; siw accepts at most 256
    /// octets including the 4-octet IRD/ORD block.
    pub private_data: &'a [u8],
    /// Res bits (low nibble) to send in this side's frame, e.g.
    /// [`RES_LARGE_FPDUS`]; other bits are ignored. Zero by default.
    pub reserved: u8,
}

impl Default for MpaConfig<'_> {
    /// The defaults of upstream siw: revision 2 with enhanced mode (IRD and
    /// ORD 0; an initiator does not ask for peer-to-peer mode, a responder
    /// honours it with a Write or Read RTR), CRC used only if the peer asks,
    /// no markers in either direction, not strict, no private data.
    fn default() -> Self {
        MpaConfig {
            revision: Revision::V2,
            crc: CrcPolicy::PreferOff,
            strict: false,
            markers_rx: false,
            markers_tx: false,
            enhanced: Some(EnhancedConfig::new(0, 0)),
            private_data: &[],
            reserved: 0,
        }
    }
}

/// The outcome of a successful handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Revision of the Reply.
    pub revision: Revision,
    /// CRCs are computed and checked in both directions.
    pub crc: bool,
    /// The peer inserts markers into the FPDUs this side receives.
    pub markers_rx: bool,
    /// This side must insert markers into the FPDUs it sends.
    pub markers_tx: bool,
    /// RFC 6581 IRD/ORD negotiation took place.
    pub enhanced: bool,
    /// IRD of this side. Without enhanced mode this is the locally
    /// configured value, not negotiated on the wire.
    pub ird: u16,
    /// ORD of this side (never above the peer's IRD in enhanced mode).
    pub ord: u16,
    /// Peer-to-peer mode: `rtr` is set.
    pub p2p: bool,
    /// RTR message type in peer-to-peer mode: the initiator sends this
    /// zero-length message as its first FPDU, and the responder must not
    /// send FPDUs before it has received it.
    pub rtr: Option<Rtr>,
    /// The Res bits of the peer's frame (e.g. [`RES_LARGE_FPDUS`]).
    pub peer_reserved: u8,
}

/// Role in the MPA handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Active side: sends the Request.
    Initiator,
    /// Passive side: sends the Reply.
    Responder,
}

/// State of a [`Handshake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeState {
    /// Initiator: Request sent, waiting for the Reply.
    AwaitingReply,
    /// Responder: waiting for the Request.
    AwaitingRequest,
    /// Responder: Request received, waiting for
    /// [`accept`](Handshake::accept) or [`reject`](Handshake::reject).
    AwaitingDecision,
    /// Full operation: FPDUs follow. See [`Handshake::negotiated`].
    Established,
    /// The responder rejected the connection (sent or received a Reply with
    /// R set); close the connection.
    Rejected,
    /// The handshake failed; see [`Handshake::error`].
    Failed,
}

/// The parameters of a received Request, as reported by
/// [`Event::RequestReceived`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerRequest<'a> {
    /// Revision of the Request.
    pub revision: Revision,
    /// The initiator requested CRC.
    pub crc: bool,
    /// The initiator wants markers in the FPDUs it receives.
    pub markers: bool,
    /// Reserved flag bits (siw sets 0x08 to offer GSO).
    pub reserved: u8,
    /// The initiator's RFC 6581 block, if any.
    pub enhanced: Option<EnhancedData>,
    /// ULP private data (without the IRD/ORD block).
    pub private_data: &'a [u8],
}

/// Something the handshake reports to its user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// Responder: a valid Request arrived; call
    /// [`accept`](Handshake::accept) or [`reject`](Handshake::reject).
    RequestReceived(PeerRequest<'a>),
    /// Initiator: the Reply accepted the connection.
    Established(Negotiated),
    /// Initiator: the responder rejected the connection.
    Rejected {
        /// ULP private data of the reject Reply.
        private_data: &'a [u8],
    },
}

/// Result of [`Handshake::feed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feed<'a> {
    /// Number of input octets consumed. Octets after them belong to the
    /// next protocol phase (FPDUs): hand them to the FPDU parser.
    pub consumed: usize,
    /// Event produced by this input, if any.
    pub event: Option<Event<'a>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Policy {
    revision: Revision,
    crc: CrcPolicy,
    strict: bool,
    markers_rx: bool,
    markers_tx: bool,
    enhanced: Option<EnhancedConfig>,
    reserved: u8,
}

/// What the initiator put into its Request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SentRequest {
    revision: Revision,
    crc: bool,
    markers: bool,
    enhanced: Option<EnhancedData>,
}

/// The received frame, minus its private data (which stays in `rx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameInfo {
    kind: FrameKind,
    flags: MpaFlags,
    revision: Revision,
    enhanced: Option<EnhancedData>,
    pd_start: usize,
    pd_end: usize,
}

/// Responder: what has been decided about the Reply before `accept`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pending {
    revision: Revision,
    crc: bool,
    markers_tx: bool,
    /// The Request's IRD/ORD block, when enhanced mode is used.
    enhanced: Option<EnhancedData>,
    rtr: Option<Rtr>,
    /// The Request's Res bits.
    reserved: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Request,
    Established(Negotiated),
    Rejected,
}

/// Sans-IO MPA startup state machine for either role.
///
/// The initiator is created with [`Handshake::initiator`], which writes the
/// Request; the responder with [`Handshake::responder`]. Received octets are
/// passed to [`feed`](Self::feed) in pieces of any size (one octet at a
/// time works); it consumes exactly the octets of the peer's frame and
/// reports how many, so FPDU octets arriving in the same piece as the Reply
/// are left for the FPDU parser. The received frame, including up to 512
/// octets of private data, is kept in a fixed buffer inside the machine; no
/// allocation takes place.
///
/// A responder answers a [`Event::RequestReceived`] with
/// [`accept`](Self::accept) or [`reject`](Self::reject), which write the
/// Reply into a caller buffer. If a Request is well-formed but violates
/// the local policy, `feed` fails and [`can_reject`](Self::can_reject)
/// tells whether a reject Reply may still be sent (siw sends one).
#[derive(Clone, Debug)]
pub struct Handshake {
    role: Role,
    policy: Policy,
    state: HandshakeState,
    rx: [u8; MAX_FRAME_LEN],
    rx_len: usize,
    frame: Option<FrameInfo>,
    sent: Option<SentRequest>,
    pending: Option<Pending>,
    negotiated: Option<Negotiated>,
    error: Option<MpaError>,
    can_reject: bool,
}

fn request_block(e: &EnhancedConfig) -> Result<EnhancedData, MpaError> {
    if e.p2p && e.rtr.is_empty() {
        return Err(MpaError::InvalidParameter);
    }
    let ird = e.ird.min(IRD_ORD_MAX);
    let mut ord = e.ord.min(IRD_ORD_MAX);
    // A Read RTR consumes one outbound read credit (siw and cxgb3 bump the
    // initiator's ORD to 1 in peer-to-peer mode for the same reason).
    if e.p2p && e.rtr.contains(Rtr::Read) && ord == 0 {
        ord = 1;
    }
    Ok(EnhancedData {
        ird,
        ord,
        p2p: e.p2p,
        rtr: if e.p2p { e.rtr } else { RtrSet::EMPTY },
    })
}

/// RFC 6581 negotiation at the initiator: `sent` is our block, `reply` the
/// responder's, `ird_max` how far our IRD may grow. Returns (IRD, ORD, RTR).
pub fn negotiate_initiator(
    sent: &EnhancedData,
    reply: &EnhancedData,
    ird_max: u16,
) -> Result<(u16, u16, Option<Rtr>), MpaError> {
    let cap = ird_max.max(sent.ird).min(IRD_ORD_MAX);
    // The responder's ORD must fit into our IRD (raised if allowed).
    let ird = if reply.ord > sent.ird {
        if reply.ord <= cap {
            reply.ord
        } else {
            return Err(MpaError::InsufficientIrd);
        }
    } else {
        sent.ird
    };
    // Our ORD is limited by the responder's IRD.
    let ord = sent.ord.min(reply.ird);
    let rtr = if sent.p2p {
        // Like siw, look at the RTR bits only (not the reply's A bit).
        let Some(rtr) = reply.rtr.intersection(sent.rtr).preferred() else {
            return Err(MpaError::NoMatchingRtr);
        };
        if rtr == Rtr::Read && ord == 0 {
            return Err(MpaError::InsufficientIrd);
        }
        Some(rtr)
    } else {
        None
    };
    Ok((ird, ord, rtr))
}

/// RFC 6581 negotiation at the responder: `request` is the initiator's
/// block, `ird`/`ord`/`ird_max` this side's resources, `rtr` the RTR type
/// chosen (see [`choose_rtr`]). Returns the block to put into the Reply;
/// its IRD and ORD are this side's negotiated values.
///
/// The Reply's ORD is limited to the initiator's IRD; the Reply's IRD is
/// raised towards the initiator's ORD up to `max(ird, ird_max)` (if it stays
/// below, the initiator lowers its ORD); a Read RTR needs IRD >= 1.
pub fn negotiate_responder(
    request: &EnhancedData,
    ird: u16,
    ord: u16,
    ird_max: u16,
    rtr: Option<Rtr>,
) -> EnhancedData {
    let cap = ird_max.max(ird).min(IRD_ORD_MAX);
    let mut r_ird = ird.min(IRD_ORD_MAX);
    if r_ird < request.ord {
        r_ird = request.ord.min(cap).max(r_ird);
    }
    if rtr == Some(Rtr::Read) && r_ird == 0 {
        r_ird = 1;
    }
    EnhancedData {
        ird: r_ird,
        ord: ord.min(request.ird).min(IRD_ORD_MAX),
        p2p: rtr.is_some(),
        rtr: match rtr {
            Some(r) => RtrSet::only(r),
            None => RtrSet::EMPTY,
        },
    }
}

/// RTR choice at the responder. A peer-to-peer Request is honoured with
/// the preferred type both sides support (Write, then Read, then Send), or
/// fails with [`MpaError::NoMatchingRtr`] if there is none. A Request
/// without P2P gives `None`, unless `local.p2p` requires peer-to-peer mode
/// (then [`MpaError::NoMatchingRtr`]). (siw as responder always honours P2P
/// and answers an offer without a type it knows with Write; a Reply
/// naming a type that was not offered would make the initiator fail, so
/// this implementation refuses instead.)
pub fn choose_rtr(request: &EnhancedData, local: &EnhancedConfig) -> Result<Option<Rtr>, MpaError> {
    if !request.p2p {
        return if local.p2p {
            Err(MpaError::NoMatchingRtr)
        } else {
            Ok(None)
        };
    }
    match request.rtr.intersection(local.rtr).preferred() {
        Some(r) => Ok(Some(r)),
        None => Err(MpaError::NoMatchingRtr),
    }
}

fn crc_outcome(role: Role, policy: CrcPolicy, strict: bool, peer: bool) -> Result<bool, MpaError> {
    match policy {
        CrcPolicy::Off if peer => Err(MpaError::CrcPolicyMismatch),
        CrcPolicy::Off => Ok(false),
        CrcPolicy::PreferOff if strict && peer => Err(MpaError::CrcPolicyMismatch),
        CrcPolicy::PreferOff => Ok(peer),
        CrcPolicy::On if !peer && (strict || role == Role::Initiator) => {
            Err(MpaError::CrcPolicyMismatch)
        }
        CrcPolicy::On => Ok(true),
    }
}

impl Handshake {
    fn blank(role: Role, config: &MpaConfig<'_>, state: HandshakeState) -> Self {
        Handshake {
            role,
            policy: Policy {
                revision: config.revision,
                crc: config.crc,
                strict: config.strict,
                markers_rx: config.markers_rx,
                markers_tx: config.markers_tx,
                enhanced: config.enhanced,
                reserved: config.reserved,
            },
            state,
            rx: [0; MAX_FRAME_LEN],
            rx_len: 0,
            frame: None,
            sent: None,
            pending: None,
            negotiated: None,
            error: None,
            can_reject: false,
        }
    }

    /// Creates an initiator and writes its Request into `out`, returning
    /// the machine and the Request length (send those octets first).
    ///
    /// The Request carries M = `markers_rx`, C = (`crc` is `On`), the
    /// configured revision, the IRD/ORD block if the revision is 2 and
    /// `enhanced` is set (with P2P and the RTR types when `p2p`), and the
    /// configured private data. Fails with [`MpaError::BufferTooSmall`],
    /// [`MpaError::PrivateDataTooLong`], or [`MpaError::InvalidParameter`]
    /// for `p2p` with an empty RTR set.
    pub fn initiator(config: &MpaConfig<'_>, out: &mut [u8]) -> Result<(Self, usize), MpaError> {
        let enhanced = match (config.revision, &config.enhanced) {
            (Revision::V2, Some(e)) => Some(request_block(e)?),
            _ => None,
        };
        let repr = MpaFrameRepr {
            kind: FrameKind::Request,
            flags: MpaFlags {
                markers: config.markers_rx,
                crc: config.crc == CrcPolicy::On,
                reject: false,
                reserved: config.reserved & FLAG_RES_MASK,
            },
            revision: config.revision,
            enhanced,
            private_data: config.private_data,
        };
        let n = repr.emit(out)?;
        let mut hs = Self::blank(Role::Initiator, config, HandshakeState::AwaitingReply);
        hs.sent = Some(SentRequest {
            revision: repr.revision,
            crc: repr.flags.crc,
            markers: repr.flags.markers,
            enhanced,
        });
        Ok((hs, n))
    }

    /// Creates a responder waiting for the Request. `config.private_data`
    /// is not used.
    pub fn responder(config: &MpaConfig<'_>) -> Self {
        Self::blank(Role::Responder, config, HandshakeState::AwaitingRequest)
    }

    /// This machine's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Current state.
    pub fn state(&self) -> HandshakeState {
        self.state
    }

    /// Negotiated parameters once [`HandshakeState::Established`].
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.negotiated
    }

    /// The error that moved the machine to [`HandshakeState::Failed`].
    pub fn error(&self) -> Option<MpaError> {
        self.error
    }

    /// Whether [`reject`](Self::reject) may be called now: the responder is
    /// awaiting its decision, or failed on a well-formed Request.
    pub fn can_reject(&self) -> bool {
        self.role == Role::Responder
            && (self.state == HandshakeState::AwaitingDecision
                || (self.state == HandshakeState::Failed && self.can_reject))
    }

    /// ULP private data of the peer's frame (without the IRD/ORD block);
    /// empty until a complete frame has been received.
    pub fn peer_private_data(&self) -> &[u8] {
        match self.frame {
            Some(f) => self.rx.get(f.pd_start..f.pd_end).unwrap_or(&[]),
            None => &[],
        }
    }

    /// The peer's RFC 6581 block, once its frame has been received.
    pub fn peer_enhanced(&self) -> Option<EnhancedData> {
        self.frame.and_then(|f| f.enhanced)
    }

    fn fail(&mut self, e: MpaError, can_reject: bool) -> MpaError {
        self.state = HandshakeState::Failed;
        self.error = Some(e);
        self.can_reject = can_reject && self.role == Role::Responder;
        e
    }

    /// Feeds received octets.
    ///
    /// While the peer's frame is incomplete this consumes all of `input`
    /// and returns no event. The piece that completes the frame is consumed
    /// only up to the frame's end, and the event is returned. In
    /// [`HandshakeState::Established`] and [`HandshakeState::Rejected`]
    /// nothing is consumed. A responder in
    /// [`HandshakeState::AwaitingDecision`] fails with
    /// [`MpaError::UnexpectedData`] on any further input (the initiator must
    /// not send before the Reply); leftover octets in the piece that
    /// completed the Request are the same violation.
    ///
    /// On error the machine moves to [`HandshakeState::Failed`]; later
    /// calls return [`MpaError::InvalidState`].
    pub fn feed(&mut self, input: &[u8]) -> Result<Feed<'_>, MpaError> {
        match self.state {
            HandshakeState::AwaitingReply | HandshakeState::AwaitingRequest => {}
            HandshakeState::AwaitingDecision => {
                if input.is_empty() {
                    return Ok(Feed {
                        consumed: 0,
                        event: None,
                    });
                }
                return Err(self.fail(MpaError::UnexpectedData, true));
            }
            HandshakeState::Established | HandshakeState::Rejected => {
                return Ok(Feed {
                    consumed: 0,
                    event: None,
                })
            }
            HandshakeState::Failed => return Err(MpaError::InvalidState),
        }

        let mut consumed = 0usize;
        let info = loop {
            let parsed = MpaFrameRepr::parse(self.rx.get(..self.rx_len).unwrap_or(&[]));
            let needed = match parsed {
                Ok((repr, total)) => {
                    break FrameInfo {
                        kind: repr.kind,
                        flags: repr.flags,
                        revision: repr.revision,
                        enhanced: repr.enhanced,
                        pd_start: total.saturating_sub(repr.private_data.len()),
                        pd_end: total,
                    }
                }
                Err(MpaError::Incomplete { needed }) => needed,
                Err(e) => return Err(self.fail(e, false)),
            };
            let rest = input.get(consumed..).unwrap_or(&[]);
            let take = needed.min(rest.len());
            if take == 0 {
                return Ok(Feed {
                    consumed,
                    event: None,
                });
            }
            let end = self.rx_len.saturating_add(take);
            match (self.rx.get_mut(self.rx_len..end), rest.get(..take)) {
                (Some(dst), Some(src)) => copy_octets(dst, src),
                // Unreachable: `needed` never reaches past a valid frame.
                _ => return Err(self.fail(MpaError::InvalidState, false)),
            }
            self.rx_len = end;
            consumed = consumed.saturating_add(take);
        };
        self.frame = Some(info);

        let outcome = match self.role {
            Role::Initiator => self.on_reply(&info),
            Role::Responder => self.on_request(&info),
        };
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => return Err(self.fail(e, true)),
        };
        let pd = self.rx.get(info.pd_start..info.pd_end).unwrap_or(&[]);
        let event = match outcome {
            Outcome::Request => Event::RequestReceived(PeerRequest {
                revision: info.revision,
                crc: info.flags.crc,
                markers: info.flags.markers,
                reserved: info.flags.reserved,
                enhanced: info.enhanced,
                private_data: pd,
            }),
            Outcome::Established(n) => Event::Established(n),
            Outcome::Rejected => Event::Rejected { private_data: pd },
        };
        Ok(Feed {
            consumed,
            event: Some(event),
        })
    }

    fn on_reply(&mut self, f: &FrameInfo) -> Result<Outcome, MpaError> {
        let Some(sent) = self.sent else {
            return Err(MpaError::InvalidState);
        };
        if f.kind != FrameKind::Reply {
            return Err(MpaError::WrongFrameKind);
        }
        if f.flags.reject {
            self.state = HandshakeState::Rejected;
            return Ok(Outcome::Rejected);
        }
        let p = self.policy;
        if f.revision > sent.revision || (p.strict && f.revision != sent.revision) {
            return Err(MpaError::RevisionMismatch);
        }
        if f.flags.markers && !p.markers_tx {
            return Err(MpaError::MarkersUnsupported);
        }
        let crc = crc_outcome(Role::Initiator, p.crc, p.strict, f.flags.crc)? || sent.crc;
        let (enhanced, ird, ord, rtr) = match (sent.enhanced, f.enhanced) {
            (Some(s), Some(r)) => {
                let ird_max = p.enhanced.map_or(0, |e| e.ird_max);
                let (ird, ord, rtr) = negotiate_initiator(&s, &r, ird_max)?;
                (true, ird, ord, rtr)
            }
            (Some(s), None) => {
                // RFC 6581: a responder without enhanced support answers in
                // revision 1; carry on without it unless that is not
                // acceptable. (siw always treats this as an error.)
                if p.strict {
                    return Err(MpaError::EnhancedMismatch);
                }
                if s.p2p {
                    return Err(MpaError::NoMatchingRtr);
                }
                (false, s.ird, s.ord, None)
            }
            (None, Some(_)) => return Err(MpaError::EnhancedMismatch),
            (None, None) => {
                let (ird, ord) = p.enhanced.map_or((0, 0), |e| (e.ird, e.ord));
                (false, ird, ord, None)
            }
        };
        let n = Negotiated {
            revision: f.revision,
            crc,
            markers_rx: sent.markers,
            markers_tx: f.flags.markers,
            enhanced,
            ird,
            ord,
            p2p: rtr.is_some(),
            rtr,
            peer_reserved: f.flags.reserved,
        };
        self.negotiated = Some(n);
        self.state = HandshakeState::Established;
        Ok(Outcome::Established(n))
    }

    fn on_request(&mut self, f: &FrameInfo) -> Result<Outcome, MpaError> {
        if f.kind != FrameKind::Request {
            return Err(MpaError::WrongFrameKind);
        }
        let p = self.policy;
        if p.strict && f.revision != p.revision {
            return Err(MpaError::RevisionMismatch);
        }
        let revision = f.revision.min(p.revision);
        if f.flags.markers && !p.markers_tx {
            return Err(MpaError::MarkersUnsupported);
        }
        let crc = crc_outcome(Role::Responder, p.crc, p.strict, f.flags.crc)?;
        let local = if revision == Revision::V2 {
            p.enhanced
        } else {
            None
        };
        let (enhanced, rtr) = match (f.enhanced, local) {
            (Some(req), Some(loc)) => (Some(req), choose_rtr(&req, &loc)?),
            (Some(_), None) | (None, Some(_)) if p.strict => {
                return Err(MpaError::EnhancedMismatch)
            }
            _ => (None, None),
        };
        if rtr.is_none() && p.enhanced.is_some_and(|e| e.p2p) {
            // Peer-to-peer mode is required but cannot be used.
            return Err(MpaError::NoMatchingRtr);
        }
        self.pending = Some(Pending {
            revision,
            crc,
            markers_tx: f.flags.markers,
            enhanced,
            rtr,
            reserved: f.flags.reserved,
        });
        self.state = HandshakeState::AwaitingDecision;
        Ok(Outcome::Request)
    }

    /// Responder: accepts the connection and writes the Reply into `out`,
    /// returning its length and the negotiated parameters. The machine is
    /// then [`HandshakeState::Established`]; send the Reply, then start FPDU
    /// operation (in peer-to-peer mode wait for the RTR first).
    ///
    /// `ird` and `ord` are this side's resources (in enhanced mode the ORD
    /// is limited to the initiator's IRD and the IRD may be raised, see
    /// [`negotiate_responder`]). The Reply carries M = `markers_rx`, C as
    /// negotiated, the revision `min(request, ours)` and the IRD/ORD block
    /// if the Request had one and enhanced mode is configured.
    ///
    /// Fails without changing state on a too small buffer or too much
    /// private data (512 octets, 508 in enhanced mode), and with
    /// [`MpaError::InvalidState`] when no Request is awaiting a decision.
    pub fn accept(
        &mut self,
        private_data: &[u8],
        ird: u16,
        ord: u16,
        out: &mut [u8],
    ) -> Result<(usize, Negotiated), MpaError> {
        if self.role != Role::Responder || self.state != HandshakeState::AwaitingDecision {
            return Err(MpaError::InvalidState);
        }
        let Some(pend) = self.pending else {
            return Err(MpaError::InvalidState);
        };
        let p = self.policy;
        let (block, n_ird, n_ord) = match pend.enhanced {
            Some(req) => {
                let ird_max = p.enhanced.map_or(0, |e| e.ird_max);
                let b = negotiate_responder(&req, ird, ord, ird_max, pend.rtr);
                (Some(b), b.ird, b.ord)
            }
            None => (None, ird, ord),
        };
        let repr = MpaFrameRepr {
            kind: FrameKind::Reply,
            flags: MpaFlags {
                markers: p.markers_rx,
                crc: pend.crc,
                reject: false,
                reserved: p.reserved & FLAG_RES_MASK,
            },
            revision: pend.revision,
            enhanced: block,
            private_data,
        };
        let n = repr.emit(out)?;
        let neg = Negotiated {
            revision: pend.revision,
            crc: pend.crc,
            markers_rx: p.markers_rx,
            markers_tx: pend.markers_tx,
            enhanced: block.is_some(),
            ird: n_ird,
            ord: n_ord,
            p2p: pend.rtr.is_some(),
            rtr: pend.rtr,
            peer_reserved: pend.reserved,
        };
        self.negotiated = Some(neg);
        self.state = HandshakeState::Established;
        Ok((n, neg))
    }

    /// Responder: rejects the connection and writes a Reply with the R flag
    /// and `private_data` into `out`, returning its length; send it and
    /// close the connection. Allowed while awaiting the decision and after
    /// a policy failure on a well-formed Request (see
    /// [`can_reject`](Self::can_reject)); the machine then is
    /// [`HandshakeState::Rejected`].
    ///
    /// Like siw, the reject Reply keeps the IRD/ORD block when the Request
    /// was enhanced and this side supports it (a siw initiator strips four
    /// octets from the private data of an enhanced reject).
    pub fn reject(&mut self, private_data: &[u8], out: &mut [u8]) -> Result<usize, MpaError> {
        if !self.can_reject() {
            return Err(MpaError::InvalidState);
        }
        let Some(f) = self.frame else {
            return Err(MpaError::InvalidState);
        };
        let p = self.policy;
        let revision = f.revision.min(p.revision);
        let enhanced = match (f.enhanced, p.enhanced) {
            (Some(_), Some(loc)) if revision == Revision::V2 => Some(EnhancedData {
                ird: loc.ird.min(IRD_ORD_MAX),
                ord: loc.ord.min(IRD_ORD_MAX),
                p2p: false,
                rtr: RtrSet::EMPTY,
            }),
            _ => None,
        };
        let repr = MpaFrameRepr {
            kind: FrameKind::Reply,
            flags: MpaFlags {
                reject: true,
                ..MpaFlags::default()
            },
            revision,
            enhanced,
            private_data,
        };
        let n = repr.emit(out)?;
        self.state = HandshakeState::Rejected;
        self.can_reject = false;
        Ok(n)
    }
}

// ---------------------------------------------------------------------------
// FPDU framing
// ---------------------------------------------------------------------------

/// Number of PAD octets after a ULPDU of `ulpdu_len` octets: 0..=3, making
/// ULPDU_Length + ULPDU + PAD a multiple of four.
pub const fn pad_len(ulpdu_len: usize) -> usize {
    ulpdu_len.wrapping_add(ULPDU_LENGTH_LEN).wrapping_neg() & 3
}

/// Length of an FPDU without markers: ULPDU_Length, ULPDU, PAD and CRC.
/// Always a multiple of four.
pub const fn fpdu_len(ulpdu_len: u16) -> usize {
    let u = ulpdu_len as usize;
    ULPDU_LENGTH_LEN + u + pad_len(u) + CRC_LEN
}

/// Length on the wire of an FPDU carrying `ulpdu_len` octets: without
/// markers (`None`) that is [`fpdu_len`]; with markers it depends on the
/// stream position the FPDU starts at, given by `markers` (see
/// [`MarkerState::fpdu_wire_len`]).
pub fn fpdu_wire_len(ulpdu_len: u16, markers: Option<&MarkerState>) -> usize {
    match markers {
        Some(m) => m.fpdu_wire_len(ulpdu_len),
        None => fpdu_len(ulpdu_len),
    }
}

/// Maximum ULPDU (MULPDU) for an effective MSS `emss`, per RFC 5044:
/// `EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)` with markers,
/// `EMSS - (6 + EMSS mod 4)` without. An FPDU carrying MULPDU octets fits
/// one segment wherever it starts and needs no pad. Saturates at 0 for tiny
/// segments and is capped at 65534 (the largest 16-bit length that needs
/// no pad).
pub fn mulpdu(emss: u32, markers: bool) -> u16 {
    let e = u64::from(emss);
    let mut overhead = (ULPDU_LENGTH_LEN + CRC_LEN) as u64 + e % 4;
    if markers {
        overhead += MARKER_LEN as u64 * e.div_ceil(u64::from(MARKER_INTERVAL));
    }
    let m = e.saturating_sub(overhead).min(u64::from(u16::MAX - 1));
    u16::try_from(m).unwrap_or(0)
}

/// Reads the ULPDU_Length field from the first two octets of `data`.
pub fn read_ulpdu_length(data: &[u8]) -> Result<u16, MpaError> {
    match data.get(..ULPDU_LENGTH_LEN) {
        Some(&[hi, lo]) => Ok(u16::from_be_bytes([hi, lo])),
        _ => Err(MpaError::Incomplete {
            needed: ULPDU_LENGTH_LEN.saturating_sub(data.len()),
        }),
    }
}

/// Writes the ULPDU_Length field into the first two octets of `out`.
pub fn write_ulpdu_length(out: &mut [u8], ulpdu_len: u16) -> Result<usize, MpaError> {
    let Some(dst) = out.get_mut(..ULPDU_LENGTH_LEN) else {
        return Err(MpaError::BufferTooSmall {
            needed: ULPDU_LENGTH_LEN,
        });
    };
    dst.copy_from_slice(&ulpdu_len.to_be_bytes());
    Ok(ULPDU_LENGTH_LEN)
}

/// The four CRC field octets: the CRC value in wire order
/// ([`super::crc32c::to_wire`]), or zeros when CRC is not in use (`None`),
/// as siw sends them.
pub const fn crc_trailer(crc: Option<u32>) -> [u8; CRC_LEN] {
    match crc {
        Some(c) => c.to_le_bytes(),
        None => [0; CRC_LEN],
    }
}

/// Compares a computed CRC with the first four octets of a received CRC
/// field. Only call this when CRC is in use: without CRC the field MUST
/// NOT be checked.
pub fn check_crc_trailer(computed: u32, trailer: &[u8]) -> Result<(), MpaError> {
    let Some(&[a, b, c, d]) = trailer.get(..CRC_LEN) else {
        return Err(MpaError::Incomplete {
            needed: CRC_LEN.saturating_sub(trailer.len()),
        });
    };
    let received = u32::from_le_bytes([a, b, c, d]);
    if received == computed {
        Ok(())
    } else {
        Err(MpaError::BadCrc { computed, received })
    }
}

/// Computes an FPDU CRC over `pieces` in wire order: every octet of the
/// FPDU before the CRC field (leading marker, ULPDU_Length, ULPDU pieces,
/// embedded markers, PAD). Resets `engine` first.
pub fn compute_fpdu_crc(engine: &mut dyn CrcEngine, pieces: &[&[u8]]) -> u32 {
    engine.reset();
    for piece in pieces {
        engine.update(piece);
    }
    engine.finish()
}

/// CRC-checks a received FPDU given its pieces in wire order (e.g.
/// `&[header, payload, pad]`, markers included where they sit) and its CRC
/// field. Fails with [`MpaError::BadCrc`], which the receive path maps to a
/// TERMINATE with MPA error 0x02 before closing (siw behaviour).
pub fn check_fpdu_crc(
    engine: &mut dyn CrcEngine,
    pieces: &[&[u8]],
    trailer: &[u8],
) -> Result<(), MpaError> {
    check_crc_trailer(compute_fpdu_crc(engine, pieces), trailer)
}

/// Marker bookkeeping for one direction of an MPA stream with markers.
///
/// Positions are stream offsets counted from the first octet of the first
/// FPDU of the direction (modulo 2^32, which is a multiple of 512, so they
/// may be taken from TCP sequence numbers as `seq - seq_of_first_fpdu`).
/// A marker is due at every offset that is a multiple of
/// [`MARKER_INTERVAL`]. "Framed" octets are the FPDU octets without markers
/// (ULPDU_Length, ULPDU, PAD, CRC).
///
/// Transmit: at the start of each FPDU call [`begin_fpdu`](Self::begin_fpdu);
/// before each framed octet, if [`marker_due`](Self::marker_due), send
/// [`take_marker`](Self::take_marker); send at most
/// [`bytes_before_marker`](Self::bytes_before_marker) framed octets and
/// [`advance`](Self::advance) by their number. A marker that falls right
/// after the last octet of an FPDU is not sent with it: it belongs to the
/// next FPDU, in front of its ULPDU_Length, with FPDUPTR 0.
///
/// Receive: the same calls, with [`strip_marker`](Self::strip_marker) in
/// place of `take_marker`; it fails with [`MpaError::MarkerMismatch`] (MPA
/// error 0x03) when FPDUPTR does not point at the current FPDU.
/// [`emit_fpdu`] and [`parse_fpdu_with_markers`] do all of this for
/// contiguous buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkerState {
    pos: u32,
    header: u32,
}

impl Default for MarkerState {
    fn default() -> Self {
        Self::new()
    }
}

impl MarkerState {
    /// State at the start of the FPDU stream (a marker is due at once).
    pub const fn new() -> Self {
        Self::at(0)
    }

    /// State at stream offset `stream_pos`.
    pub const fn at(stream_pos: u32) -> Self {
        MarkerState {
            pos: stream_pos,
            header: stream_pos,
        }
    }

    /// Stream offset of the next octet.
    pub const fn stream_pos(&self) -> u32 {
        self.pos
    }

    /// Stream offset of the current FPDU's ULPDU_Length field (set by
    /// [`begin_fpdu`](Self::begin_fpdu)).
    pub const fn header_pos(&self) -> u32 {
        self.header
    }

    /// Whether the next four octets of the stream are a marker.
    pub const fn marker_due(&self) -> bool {
        self.pos & (MARKER_INTERVAL - 1) == 0
    }

    /// Framed octets that may pass before the next marker; 0 when a marker
    /// is due now.
    pub const fn bytes_before_marker(&self) -> u32 {
        self.pos.wrapping_neg() & (MARKER_INTERVAL - 1)
    }

    /// Marks the next framed octet as the start of an FPDU (its
    /// ULPDU_Length field). If a marker is due now it precedes the field
    /// and will carry FPDUPTR 0.
    pub fn begin_fpdu(&mut self) {
        self.header = if self.marker_due() {
            self.pos.wrapping_add(MARKER_LEN as u32)
        } else {
            self.pos
        };
    }

    /// FPDUPTR of a marker at the current position: the distance from the
    /// current FPDU's ULPDU_Length back to this position, or 0 if the marker
    /// immediately precedes the ULPDU_Length field.
    pub const fn fpduptr(&self) -> u32 {
        if self.pos.wrapping_add(MARKER_LEN as u32) == self.header {
            0
        } else {
            self.pos.wrapping_sub(self.header)
        }
    }

    /// Number of markers inside an FPDU of `framed_len` framed octets that
    /// starts at the current position (including a leading one).
    pub const fn markers_in(&self, framed_len: usize) -> usize {
        let first = self.bytes_before_marker() as usize;
        if framed_len <= first {
            0
        } else {
            1 + (framed_len - first - 1) / MARKER_PAYLOAD
        }
    }

    /// Wire length of `framed_len` framed octets starting at the current
    /// position, markers included.
    pub const fn wire_len_of(&self, framed_len: usize) -> usize {
        framed_len.saturating_add(MARKER_LEN * self.markers_in(framed_len))
    }

    /// Wire length of an FPDU carrying `ulpdu_len` octets that starts at the
    /// current position, markers included.
    pub const fn fpdu_wire_len(&self, ulpdu_len: u16) -> usize {
        self.wire_len_of(fpdu_len(ulpdu_len))
    }

    /// Transmit: produces the marker due at the current position (zero
    /// reserved field, FPDUPTR) and steps over it. Fails with
    /// [`MpaError::InvalidState`] if no marker is due and with
    /// [`MpaError::InvalidParameter`] if FPDUPTR would not fit 16 bits (an
    /// FPDU far longer than any MULPDU allows).
    pub fn take_marker(&mut self) -> Result<[u8; MARKER_LEN], MpaError> {
        if !self.marker_due() {
            return Err(MpaError::InvalidState);
        }
        let Ok(ptr) = u16::try_from(self.fpduptr()) else {
            return Err(MpaError::InvalidParameter);
        };
        self.pos = self.pos.wrapping_add(MARKER_LEN as u32);
        let [hi, lo] = ptr.to_be_bytes();
        Ok([0, 0, hi, lo])
    }

    /// Receive: validates the marker due at the current position (the first
    /// four octets of `marker`) and steps over it. The reserved field is
    /// ignored (it is still covered by the CRC), as are the two low bits of
    /// FPDUPTR, which must otherwise equal [`fpduptr`](Self::fpduptr), else
    /// [`MpaError::MarkerMismatch`]. Fails with [`MpaError::InvalidState`]
    /// if no marker is due.
    pub fn strip_marker(&mut self, marker: &[u8]) -> Result<(), MpaError> {
        if !self.marker_due() {
            return Err(MpaError::InvalidState);
        }
        let Some(&[_, _, hi, lo]) = marker.get(..MARKER_LEN) else {
            return Err(MpaError::Incomplete {
                needed: MARKER_LEN.saturating_sub(marker.len()),
            });
        };
        let received = u16::from_be_bytes([hi, lo]);
        let expected = self.fpduptr();
        // The two low bits are sent as zero and treated as zero on receipt.
        if u32::from(received) & !3 != expected & !3 {
            return Err(MpaError::MarkerMismatch { expected, received });
        }
        self.pos = self.pos.wrapping_add(MARKER_LEN as u32);
        Ok(())
    }

    /// Steps over `n` framed octets; `n` must not exceed
    /// [`bytes_before_marker`](Self::bytes_before_marker) (and must be 0
    /// while a marker is due), else [`MpaError::InvalidParameter`].
    pub fn advance(&mut self, n: usize) -> Result<(), MpaError> {
        if n > self.bytes_before_marker() as usize {
            return Err(MpaError::InvalidParameter);
        }
        // n < 512 here.
        self.pos = self.pos.wrapping_add(n as u32);
        Ok(())
    }
}

/// Writes framed octets to a buffer, inserting markers.
struct MarkedWriter<'o> {
    out: &'o mut [u8],
    off: usize,
    markers: Option<MarkerState>,
}

impl MarkedWriter<'_> {
    fn raw(&mut self, src: &[u8]) -> Result<(), MpaError> {
        let end = self.off.saturating_add(src.len());
        let Some(dst) = self.out.get_mut(self.off..end) else {
            return Err(MpaError::BufferTooSmall { needed: end });
        };
        copy_octets(dst, src);
        self.off = end;
        Ok(())
    }

    fn flush_marker(&mut self) -> Result<(), MpaError> {
        if let Some(m) = self.markers.as_mut() {
            if m.marker_due() {
                let marker = m.take_marker()?;
                self.raw(&marker)?;
            }
        }
        Ok(())
    }

    fn put(&mut self, mut src: &[u8]) -> Result<(), MpaError> {
        while !src.is_empty() {
            self.flush_marker()?;
            let n = match self.markers {
                Some(m) => src.len().min(m.bytes_before_marker() as usize),
                None => src.len(),
            };
            let (Some(head), Some(tail)) = (src.get(..n), src.get(n..)) else {
                return Err(MpaError::InvalidState);
            };
            self.raw(head)?;
            if let Some(m) = self.markers.as_mut() {
                m.advance(n)?;
            }
            src = tail;
        }
        Ok(())
    }
}

/// Transmit builder for a contiguous ULPDU: writes ULPDU_Length, `ulpdu`,
/// PAD, and the CRC field into `out`, inserting markers when `markers` is
/// given (and advancing it), and returns the FPDU's wire length.
///
/// With `crc` the CRC covers every FPDU octet before the CRC field, markers
/// included; without, the field is zero. Fails with
/// [`MpaError::UlpduTooLong`] or [`MpaError::BufferTooSmall`] (needed =
/// wire length) without touching `markers`.
pub fn emit_fpdu(
    ulpdu: &[u8],
    markers: Option<&mut MarkerState>,
    crc: Option<&mut dyn CrcEngine>,
    out: &mut [u8],
) -> Result<usize, MpaError> {
    let Ok(ulen) = u16::try_from(ulpdu.len()) else {
        return Err(MpaError::UlpduTooLong(ulpdu.len()));
    };
    let mut state = markers.as_deref().copied();
    let total = fpdu_wire_len(ulen, state.as_ref());
    let Some(out) = out.get_mut(..total) else {
        return Err(MpaError::BufferTooSmall { needed: total });
    };
    if let Some(m) = state.as_mut() {
        m.begin_fpdu();
    }
    let mut w = MarkedWriter {
        out,
        off: 0,
        markers: state,
    };
    w.put(&ulen.to_be_bytes())?;
    w.put(ulpdu)?;
    let pad = [0u8; 3];
    w.put(pad.get(..pad_len(ulpdu.len())).unwrap_or(&[]))?;
    // A marker due right before the CRC field is covered by the CRC.
    w.flush_marker()?;
    let covered = w.off;
    let trailer = match crc {
        Some(engine) => {
            let c = compute_fpdu_crc(engine, &[w.out.get(..covered).unwrap_or(&[])]);
            crc_trailer(Some(c))
        }
        None => crc_trailer(None),
    };
    w.put(&trailer)?;
    if w.off != total {
        return Err(MpaError::InvalidState); // unreachable: lengths agree
    }
    if let (Some(dst), Some(m)) = (markers, w.markers) {
        *dst = m;
    }
    Ok(total)
}

/// A parsed FPDU without markers, borrowing from the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fpdu<'a> {
    /// The ULPDU (DDP segment).
    pub ulpdu: &'a [u8],
    /// Octets the FPDU occupies on the wire.
    pub wire_len: usize,
    /// The value carried in the CRC field (meaningless without CRC).
    pub crc: u32,
}

/// Parses one FPDU of a stream without markers from the start of `wire`.
///
/// With `crc` the CRC is verified ([`MpaError::BadCrc`] on mismatch);
/// without, the field is ignored. Returns [`MpaError::Incomplete`] while
/// the FPDU is not complete. ULPDU_Length is not checked against MULPDU or
/// the DDP header size: that is the DDP layer's business.
pub fn parse_fpdu<'a>(
    wire: &'a [u8],
    crc: Option<&mut dyn CrcEngine>,
) -> Result<Fpdu<'a>, MpaError> {
    let ulen = read_ulpdu_length(wire)?;
    let total = fpdu_len(ulen);
    let Some(fpdu) = wire.get(..total) else {
        return Err(MpaError::Incomplete {
            needed: total.saturating_sub(wire.len()),
        });
    };
    let covered_len = total - CRC_LEN;
    let end = ULPDU_LENGTH_LEN + usize::from(ulen);
    let (Some(covered), Some(trailer), Some(ulpdu)) = (
        fpdu.get(..covered_len),
        fpdu.get(covered_len..),
        fpdu.get(ULPDU_LENGTH_LEN..end),
    ) else {
        return Err(MpaError::InvalidState); // unreachable: total covers all
    };
    if let Some(engine) = crc {
        check_fpdu_crc(engine, &[covered], trailer)?;
    }
    let received = match *trailer {
        [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
        _ => 0,
    };
    Ok(Fpdu {
        ulpdu,
        wire_len: total,
        crc: received,
    })
}

/// Result of [`parse_fpdu_with_markers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkedFpdu {
    /// Octets the FPDU occupies on the wire, markers included.
    pub wire_len: usize,
    /// Length of the ULPDU copied to the output buffer.
    pub ulpdu_len: usize,
    /// The value carried in the CRC field (meaningless without CRC).
    pub crc: u32,
}

/// Reads framed octets from a wire buffer, stripping markers.
struct MarkedReader<'w> {
    wire: &'w [u8],
    off: usize,
    markers: MarkerState,
}

impl MarkedReader<'_> {
    fn flush_marker(&mut self) -> Result<(), MpaError> {
        if self.markers.marker_due() {
            let end = self.off.saturating_add(MARKER_LEN);
            let Some(m) = self.wire.get(self.off..end) else {
                return Err(MpaError::Incomplete {
                    needed: end.saturating_sub(self.wire.len()),
                });
            };
            self.markers.strip_marker(m)?;
            self.off = end;
        }
        Ok(())
    }

    fn read(&mut self, dst: &mut [u8]) -> Result<(), MpaError> {
        let mut filled = 0usize;
        while filled < dst.len() {
            self.flush_marker()?;
            let want = dst.len() - filled;
            let n = want.min(self.markers.bytes_before_marker() as usize);
            let end = self.off.saturating_add(n);
            let Some(src) = self.wire.get(self.off..end) else {
                return Err(MpaError::Incomplete {
                    needed: end.saturating_sub(self.wire.len()),
                });
            };
            let Some(d) = dst.get_mut(filled..filled + n) else {
                return Err(MpaError::InvalidState);
            };
            copy_octets(d, src);
            self.markers.advance(n)?;
            self.off = end;
            filled += n;
        }
        Ok(())
    }
}

/// Parses one FPDU of a stream with markers from the start of `wire`,
/// which must begin at stream position `markers.stream_pos()`. Markers are
/// validated and stripped; the ULPDU is copied to the start of `ulpdu_out`.
/// On success `markers` is advanced past the FPDU; on any error it is left
/// unchanged.
///
/// With `crc` the CRC (over all FPDU octets before the CRC field, markers
/// included) is verified. Errors: [`MpaError::Incomplete`],
/// [`MpaError::MarkerMismatch`], [`MpaError::BadCrc`],
/// [`MpaError::BufferTooSmall`] if `ulpdu_out` is shorter than the ULPDU.
pub fn parse_fpdu_with_markers(
    wire: &[u8],
    markers: &mut MarkerState,
    crc: Option<&mut dyn CrcEngine>,
    ulpdu_out: &mut [u8],
) -> Result<MarkedFpdu, MpaError> {
    let start = *markers;
    let header_wire = start.wire_len_of(ULPDU_LENGTH_LEN);
    if wire.len() < header_wire {
        return Err(MpaError::Incomplete {
            needed: header_wire - wire.len(),
        });
    }
    let mut state = start;
    state.begin_fpdu();
    let mut r = MarkedReader {
        wire,
        off: 0,
        markers: state,
    };
    let mut hdr = [0u8; ULPDU_LENGTH_LEN];
    r.read(&mut hdr)?;
    let ulen = u16::from_be_bytes(hdr);
    let total = start.fpdu_wire_len(ulen);
    if wire.len() < total {
        return Err(MpaError::Incomplete {
            needed: total - wire.len(),
        });
    }
    let ulpdu_len = usize::from(ulen);
    let Some(dst) = ulpdu_out.get_mut(..ulpdu_len) else {
        return Err(MpaError::BufferTooSmall { needed: ulpdu_len });
    };
    r.read(dst)?;
    let mut pad = [0u8; 3];
    r.read(pad.get_mut(..pad_len(ulpdu_len)).unwrap_or(&mut []))?;
    r.flush_marker()?;
    let covered = r.off;
    let mut trailer = [0u8; CRC_LEN];
    r.read(&mut trailer)?;
    if r.off != total {
        return Err(MpaError::InvalidState); // unreachable: lengths agree
    }
    if let Some(engine) = crc {
        check_fpdu_crc(engine, &[wire.get(..covered).unwrap_or(&[])], &trailer)?;
    }
    *markers = r.markers;
    Ok(MarkedFpdu {
        wire_len: total,
        ulpdu_len,
        crc: u32::from_le_bytes(trailer),
    })
}

#[cfg(test)]
mod tests {
    use super::super::crc32c::SoftCrc32c;
    use super::*;

    // "MPA ID Req Frame" and "MPA ID Rep Frame", spelled out as octets.
    const REQ_KEY: [u8; 16] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65,
    ];
    const REP_KEY: [u8; 16] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65,
    ];

    /// Hand-assembles a frame from the RFC layout (independent of `emit`).
    fn frame(key: &[u8; 16], flags: u8, rev: u8, pd: &[u8], out: &mut [u8]) -> usize {
        out[..16].copy_from_slice(key);
        out[16] = flags;
        out[17] = rev;
        out[18] = (pd.len() >> 8) as u8;
        out[19] = pd.len() as u8;
        out[20..20 + pd.len()].copy_from_slice(pd);
        20 + pd.len()
    }

    fn xorshift(state: &mut u32) -> u32 {
        let mut x = *state;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *state = x;
        x
    }

    // ---- frames -----------------------------------------------------------

    #[test]
    fn keys_match_rfc() {
        assert_eq!(REQUEST_KEY, REQ_KEY);
        assert_eq!(REPLY_KEY, REP_KEY);
        assert_eq!(FrameKind::Request.key(), &REQ_KEY);
        assert_eq!(FrameKind::Reply.key(), &REP_KEY);
    }

    #[test]
    fn request_v1_minimal_vector() {
        let mut wire = [0u8; 20];
        wire[..16].copy_from_slice(&REQ_KEY);
        wire[16..].copy_from_slice(&[0x00, 0x01, 0x00, 0x00]);
        let (repr, n) = MpaFrameRepr::parse(&wire).unwrap();
        assert_eq!(n, 20);
        assert_eq!(
            repr,
            MpaFrameRepr {
                kind: FrameKind::Request,
                flags: MpaFlags::default(),
                revision: Revision::V1,
                enhanced: None,
                private_data: &[],
            }
        );
        let mut out = [0xeeu8; 32];
        assert_eq!(repr.emit(&mut out), Ok(20));
        assert_eq!(&out[..20], &wire[..]);
        assert_eq!(out[20], 0xee, "emit must not write past the frame");
    }

    #[test]
    fn request_v1_markers_crc_private_data_vector() {
        let mut wire = [0u8; 23];
        wire[..16].copy_from_slice(&REQ_KEY);
        wire[16..].copy_from_slice(&[0xc0, 0x01, 0x00, 0x03, 0x61, 0x62, 0x63]);
        let (repr, n) = MpaFrameRepr::parse(&wire).unwrap();
        assert_eq!(n, 23);
        assert_eq!(repr.kind, FrameKind::Request);
        assert!(repr.flags.markers && repr.flags.crc && !repr.flags.reject);
        assert_eq!(repr.private_data, b"abc");
        let mut out = [0u8; 23];
        assert_eq!(repr.emit(&mut out), Ok(23));
        assert_eq!(out, wire);
    }

    #[test]
    fn reply_v2_enhanced_vector() {
        // C and S set, Rev 2, PD_Length 6: IRD/ORD block then "hi".
        // IRD word 0x8005 = P2P | IRD 5, ORD word 0x8003 = Write RTR | ORD 3.
        let mut wire = [0u8; 26];
        wire[..16].copy_from_slice(&REP_KEY);
        wire[16..].copy_from_slice(&[0x50, 0x02, 0x00, 0x06, 0x80, 0x05, 0x80, 0x03, 0x68, 0x69]);
        let (repr, n) = MpaFrameRepr::parse(&wire).unwrap();
        assert_eq!(n, 26);
        assert_eq!(repr.kind, FrameKind::Reply);
        assert_eq!(repr.revision, Revision::V2);
        assert!(repr.flags.crc && !repr.flags.markers && !repr.flags.reject);
        assert_eq!(
            repr.enhanced,
            Some(EnhancedData {
                ird: 5,
                ord: 3,
                p2p: true,
                rtr: RtrSet::WRITE
            })
        );
        assert_eq!(repr.private_data, b"hi");
        assert_eq!(repr.pd_len(), 6);
        assert_eq!(repr.buffer_len(), 26);
        let mut out = [0u8; 26];
        assert_eq!(repr.emit(&mut out), Ok(26));
        assert_eq!(out, wire);
    }

    #[test]
    fn reject_reply_vector() {
        let mut wire = [0u8; 22];
        wire[..16].copy_from_slice(&REP_KEY);
        wire[16..].copy_from_slice(&[0x20, 0x01, 0x00, 0x02, b'n', b'o']);
        let (repr, _) = MpaFrameRepr::parse(&wire).unwrap();
        assert!(repr.flags.reject);
        assert_eq!(repr.private_data, b"no");
        let mut out = [0u8; 22];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, wire);
    }

    #[test]
    fn enhanced_block_vectors() {
        let e = EnhancedData::parse(&[0xc0, 0x10, 0x40, 0x20]).unwrap();
        assert_eq!(
            e,
            EnhancedData {
                ird: 0x10,
                ord: 0x20,
                p2p: true,
                rtr: RtrSet::SEND.with(Rtr::Read)
            }
        );
        let mut out = [0u8; 4];
        assert_eq!(e.emit(&mut out), Ok(4));
        assert_eq!(out, [0xc0, 0x10, 0x40, 0x20]);

        let max = EnhancedData::parse(&[0x3f, 0xff, 0x3f, 0xff]).unwrap();
        assert_eq!(
            (max.ird, max.ord, max.p2p, max.rtr),
            (0x3fff, 0x3fff, false, RtrSet::EMPTY)
        );
        let all = EnhancedData::parse(&[0xff, 0xff, 0xff, 0xff]).unwrap();
        assert_eq!(all.rtr, RtrSet::ALL);
        assert!(all.p2p);
        let none = EnhancedData::default();
        none.emit(&mut out).unwrap();
        assert_eq!(out, [0; 4]);

        assert_eq!(
            EnhancedData {
                ird: 0x4000,
                ..none
            }
            .emit(&mut out),
            Err(MpaError::InvalidParameter)
        );
        assert_eq!(
            EnhancedData {
                ord: 0x4000,
                ..none
            }
            .emit(&mut out),
            Err(MpaError::InvalidParameter)
        );
        assert_eq!(
            none.emit(&mut out[..3]),
            Err(MpaError::BufferTooSmall { needed: 4 })
        );
        assert_eq!(
            EnhancedData::parse(&[1, 2]),
            Err(MpaError::Incomplete { needed: 2 })
        );
    }

    #[test]
    fn reserved_bits_not_checked() {
        // siw's MPA_RR_FLAG_GSO_EXP is 0x08 in the flags octet.
        let mut wire = [0u8; 24];
        let n = frame(&REQ_KEY, 0x18, 2, &[0x00, 0x01, 0x00, 0x02], &mut wire);
        let (repr, m) = MpaFrameRepr::parse(&wire[..n]).unwrap();
        assert_eq!(m, 24);
        assert_eq!(repr.flags.reserved, 0x08);
        assert_eq!(repr.enhanced.map(|e| (e.ird, e.ord)), Some((1, 2)));
        let mut out = [0u8; 24];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, wire);
        let bad = MpaFrameRepr {
            flags: MpaFlags {
                reserved: 0x10,
                ..repr.flags
            },
            ..repr
        };
        assert_eq!(bad.emit(&mut out), Err(MpaError::InvalidParameter));
    }

    #[test]
    fn s_flag_in_rev1_is_ignored() {
        let mut wire = [0u8; 24];
        let n = frame(&REQ_KEY, 0x10, 1, &[1, 2, 3, 4], &mut wire);
        let (repr, _) = MpaFrameRepr::parse(&wire[..n]).unwrap();
        assert_eq!(repr.enhanced, None);
        assert_eq!(repr.private_data, &[1, 2, 3, 4]);
        assert_eq!(repr.flags.reserved, 0);
    }

    #[test]
    fn parse_incomplete_reports_exact_shortfall() {
        let mut wire = [0u8; 40];
        let n = frame(&REP_KEY, 0x40, 1, &[7u8; 13], &mut wire);
        assert_eq!(n, 33);
        for len in 0..n {
            let want = if len < 20 { 20 - len } else { n - len };
            assert_eq!(
                MpaFrameRepr::parse(&wire[..len]),
                Err(MpaError::Incomplete { needed: want }),
                "prefix {len}"
            );
        }
        // Trailing octets (e.g. FPDUs) are not part of the frame.
        let (repr, used) = MpaFrameRepr::parse(&wire).unwrap();
        assert_eq!(used, 33);
        assert_eq!(repr.private_data, &[7u8; 13]);
    }

    #[test]
    fn parse_bad_key_detected_early() {
        assert_eq!(MpaFrameRepr::parse(b"X"), Err(MpaError::BadKey));
        assert_eq!(
            MpaFrameRepr::parse(b"MPA ID Re"),
            Err(MpaError::Incomplete { needed: 11 })
        );
        assert_eq!(MpaFrameRepr::parse(b"MPA ID Rx"), Err(MpaError::BadKey));
        assert_eq!(
            MpaFrameRepr::parse(b"MPA ID Req Framf"),
            Err(MpaError::BadKey)
        );
        assert_eq!(
            MpaFrameRepr::parse(b"mpa id req frame\x00\x01\x00\x00"),
            Err(MpaError::BadKey)
        );
        assert_eq!(
            MpaFrameRepr::parse(&[]),
            Err(MpaError::Incomplete { needed: 20 })
        );
    }

    #[test]
    fn parse_bad_revision() {
        let mut wire = [0u8; 20];
        for rev in [0u8, 3, 0x7f, 0xff] {
            let n = frame(&REQ_KEY, 0, rev, &[], &mut wire);
            assert_eq!(
                MpaFrameRepr::parse(&wire[..n]),
                Err(MpaError::BadRevision(rev))
            );
        }
        assert_eq!(Revision::from_wire(0), None);
        assert_eq!(Revision::from_wire(2), Some(Revision::V2));
        assert_eq!(Revision::V1.to_wire(), 1);
    }

    #[test]
    fn parse_private_data_too_long_before_it_arrives() {
        let mut wire = [0u8; 20];
        wire[..16].copy_from_slice(&REQ_KEY);
        wire[16..].copy_from_slice(&[0x00, 0x01, 0x02, 0x01]); // PD_Length 513
        assert_eq!(
            MpaFrameRepr::parse(&wire),
            Err(MpaError::PrivateDataTooLong(513))
        );
        wire[18..].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(
            MpaFrameRepr::parse(&wire),
            Err(MpaError::PrivateDataTooLong(65535))
        );
        wire[18..].copy_from_slice(&[0x02, 0x00]); // exactly 512: fine, incomplete
        assert_eq!(
            MpaFrameRepr::parse(&wire),
            Err(MpaError::Incomplete { needed: 512 })
        );
    }

    #[test]
    fn parse_enhanced_data_missing() {
        let mut wire = [0u8; 24];
        let n = frame(&REQ_KEY, 0x10, 2, &[0x00, 0x01], &mut wire);
        assert_eq!(
            MpaFrameRepr::parse(&wire[..n]),
            Err(MpaError::EnhancedDataMissing)
        );
        // siw rejects an enhanced Request it cannot parse with a Reply
        // that keeps S but carries no block: accepted as a plain reject.
        let n = frame(&REP_KEY, 0x30, 2, &[], &mut wire);
        let (repr, _) = MpaFrameRepr::parse(&wire[..n]).unwrap();
        assert!(repr.flags.reject);
        assert_eq!(repr.enhanced, None);
    }

    #[test]
    fn emit_errors() {
        let pd = [0u8; 513];
        let mut out = [0u8; MAX_FRAME_LEN + 8];
        let mut repr = MpaFrameRepr {
            kind: FrameKind::Request,
            flags: MpaFlags::default(),
            revision: Revision::V2,
            enhanced: Some(EnhancedData::default()),
            private_data: &pd[..508],
        };
        assert_eq!(repr.emit(&mut out), Ok(MAX_FRAME_LEN));
        repr.private_data = &pd[..509];
        assert_eq!(repr.emit(&mut out), Err(MpaError::PrivateDataTooLong(513)));
        repr.enhanced = None;
        repr.private_data = &pd;
        assert_eq!(repr.emit(&mut out), Err(MpaError::PrivateDataTooLong(513)));
        repr.private_data = &pd[..10];
        assert_eq!(
            repr.emit(&mut out[..29]),
            Err(MpaError::BufferTooSmall { needed: 30 })
        );
        repr.revision = Revision::V1;
        repr.enhanced = Some(EnhancedData::default());
        assert_eq!(repr.emit(&mut out), Err(MpaError::InvalidParameter));
        repr.revision = Revision::V2;
        repr.enhanced = Some(EnhancedData {
            ird: 0x4000,
            ..EnhancedData::default()
        });
        assert_eq!(repr.emit(&mut out), Err(MpaError::InvalidParameter));
    }

    #[test]
    fn frame_round_trips() {
        let pd = [0x5au8; 512];
        let mut out = [0u8; MAX_FRAME_LEN];
        for kind in [FrameKind::Request, FrameKind::Reply] {
            for bits in 0..16u8 {
                for revision in [Revision::V1, Revision::V2] {
                    for enh in [
                        None,
                        Some(EnhancedData {
                            ird: 9,
                            ord: 0x3fff,
                            p2p: true,
                            rtr: RtrSet::ALL,
                        }),
                    ] {
                        if enh.is_some() && revision == Revision::V1 {
                            continue;
                        }
                        for len in [0usize, 1, 3, 4, 255, 256, 508] {
                            let repr = MpaFrameRepr {
                                kind,
                                flags: MpaFlags {
                                    markers: bits & 1 != 0,
                                    crc: bits & 2 != 0,
                                    reject: bits & 4 != 0,
                                    reserved: if bits & 8 != 0 { 0x0f } else { 0 },
                                },
                                revision,
                                enhanced: enh,
                                private_data: &pd[..len],
                            };
                            let n = repr.emit(&mut out).unwrap();
                            assert_eq!(n, repr.buffer_len());
                            assert_eq!(MpaFrameRepr::parse(&out[..n]), Ok((repr, n)));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn parse_never_panics_on_garbage() {
        let mut seed = 0x2545_f491;
        let mut buf = [0u8; 600];
        for round in 0..3000 {
            let len = (xorshift(&mut seed) % 600) as usize;
            for b in buf[..len].iter_mut() {
                *b = xorshift(&mut seed) as u8;
            }
            // Half of the rounds start from a valid header to get deeper.
            if round % 2 == 0 && len >= 20 {
                let key = if round % 4 == 0 { &REQ_KEY } else { &REP_KEY };
                buf[..16].copy_from_slice(key);
                buf[17] = (xorshift(&mut seed) % 3) as u8;
                buf[18] = (xorshift(&mut seed) % 3) as u8;
            }
            if let Ok((repr, n)) = MpaFrameRepr::parse(&buf[..len]) {
                assert!(n <= len);
                let mut out = [0u8; MAX_FRAME_LEN];
                let m = repr.emit(&mut out).unwrap();
                assert_eq!(MpaFrameRepr::parse(&out[..m]).unwrap().0, repr);
            }
            let mut hs = Handshake::responder(&MpaConfig::default());
            let _ = hs.feed(&buf[..len]);
            let mut req = [0u8; 64];
            let (mut hi, _) = Handshake::initiator(&MpaConfig::default(), &mut req).unwrap();
            for chunk in buf[..len].chunks(7) {
                if hi.feed(chunk).is_err() {
                    break;
                }
            }
            let _ = parse_fpdu(&buf[..len], Some(&mut SoftCrc32c::new()));
            let mut ms = MarkerState::at(xorshift(&mut seed) & !3);
            let mut sink = [0u8; 600];
            let _ = parse_fpdu_with_markers(
                &buf[..len],
                &mut ms,
                Some(&mut SoftCrc32c::new()),
                &mut sink,
            );
        }
    }

    // ---- handshake --------------------------------------------------------

    fn enh(ird: u16, ord: u16) -> EnhancedConfig {
        EnhancedConfig::new(ird, ord)
    }

    fn p2p(ird: u16, ord: u16, rtr: RtrSet) -> EnhancedConfig {
        EnhancedConfig {
            p2p: true,
            rtr,
            ..EnhancedConfig::new(ird, ord)
        }
    }

    /// Runs a complete exchange; returns what each side ended with.
    fn run(
        ic: &MpaConfig<'_>,
        rc: &MpaConfig<'_>,
        ird: u16,
        ord: u16,
    ) -> (Result<Negotiated, MpaError>, Result<Negotiated, MpaError>) {
        let mut req = [0u8; MAX_FRAME_LEN];
        let (mut init, n) = match Handshake::initiator(ic, &mut req) {
            Ok(x) => x,
            Err(e) => return (Err(e), Err(MpaError::InvalidState)),
        };
        assert_eq!(init.state(), HandshakeState::AwaitingReply);
        let mut resp = Handshake::responder(rc);
        match resp.feed(&req[..n]) {
            Ok(f) => {
                assert_eq!(f.consumed, n);
                assert!(matches!(f.event, Some(Event::RequestReceived(_))));
            }
            Err(e) => return (Err(MpaError::InvalidState), Err(e)),
        }
        let mut rep = [0u8; MAX_FRAME_LEN];
        let (m, rneg) = match resp.accept(b"ok", ird, ord, &mut rep) {
            Ok(x) => x,
            Err(e) => return (Err(MpaError::InvalidState), Err(e)),
        };
        assert_eq!(resp.negotiated(), Some(rneg));
        let f = match init.feed(&rep[..m]) {
            Ok(f) => f,
            Err(e) => {
                assert_eq!(init.state(), HandshakeState::Failed);
                assert_eq!(init.error(), Some(e));
                return (Err(e), Ok(rneg));
            }
        };
        assert_eq!(f.consumed, m);
        match f.event {
            Some(Event::Established(neg)) => {
                assert_eq!(init.negotiated(), Some(neg));
                assert_eq!(init.peer_private_data(), b"ok");
                (Ok(neg), Ok(rneg))
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn default_handshake_both_roles() {
        let cfg = MpaConfig::default();
        let (i, r) = run(&cfg, &cfg, 0, 0);
        let i = i.unwrap();
        let r = r.unwrap();
        for n in [i, r] {
            assert_eq!(n.revision, Revision::V2);
            assert!(n.enhanced && !n.crc && !n.markers_rx && !n.markers_tx && !n.p2p);
            assert_eq!(n.rtr, None);
        }
    }

    /// Res bits travel both ways and are reported to the other side only
    /// (siw's "accepts large FPDUs" bit).
    #[test]
    fn reserved_bits_reach_the_peer() {
        let large = MpaConfig {
            reserved: RES_LARGE_FPDUS,
            ..MpaConfig::default()
        };
        let plain = MpaConfig::default();
        for (ic, rc, want_i, want_r) in [
            (&large, &large, RES_LARGE_FPDUS, RES_LARGE_FPDUS),
            (&large, &plain, 0, RES_LARGE_FPDUS),
            (&plain, &large, RES_LARGE_FPDUS, 0),
            (&plain, &plain, 0, 0),
        ] {
            let (i, r) = run(ic, rc, 0, 0);
            assert_eq!(i.unwrap().peer_reserved, want_i);
            assert_eq!(r.unwrap().peer_reserved, want_r);
        }
        // Only the low nibble is Res; other bits of the setting are dropped.
        let odd = MpaConfig {
            reserved: 0xf3,
            ..MpaConfig::default()
        };
        let (i, r) = run(&odd, &odd, 0, 0);
        assert_eq!(
            (i.unwrap().peer_reserved, r.unwrap().peer_reserved),
            (0x03, 0x03)
        );
    }

    #[test]
    fn handshake_one_octet_at_a_time() {
        let ic = MpaConfig {
            enhanced: Some(p2p(4, 2, RtrSet::WRITE_READ)),
            private_data: b"hello responder",
            ..MpaConfig::default()
        };
        let rc = MpaConfig {
            enhanced: Some(p2p(0, 0, RtrSet::ALL)),
            ..MpaConfig::default()
        };
        let mut req = [0u8; MAX_FRAME_LEN];
        let (mut init, n) = Handshake::initiator(&ic, &mut req).unwrap();
        let mut resp = Handshake::responder(&rc);
        for i in 0..n {
            let f = resp.feed(&req[i..i + 1]).unwrap();
            assert_eq!(f.consumed, 1);
            if i + 1 < n {
                assert_eq!(f.event, None);
                assert_eq!(resp.state(), HandshakeState::AwaitingRequest);
            } else {
                match f.event {
                    Some(Event::RequestReceived(p)) => {
                        assert_eq!(p.private_data, b"hello responder");
                        assert_eq!(p.revision, Revision::V2);
                        assert_eq!(
                            p.enhanced,
                            Some(EnhancedData {
                                ird: 4,
                                ord: 2,
                                p2p: true,
                                rtr: RtrSet::WRITE_READ
                            })
                        );
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(resp.state(), HandshakeState::AwaitingDecision);
        assert_eq!(resp.peer_private_data(), b"hello responder");
        assert_eq!(resp.feed(&[]).unwrap().consumed, 0);
        let mut rep = [0u8; MAX_FRAME_LEN];
        let (m, rneg) = resp.accept(b"welcome", 2, 4, &mut rep).unwrap();
        assert_eq!(rneg.rtr, Some(Rtr::Write));
        assert_eq!((rneg.ird, rneg.ord), (2, 4));
        for i in 0..m {
            let f = init.feed(&rep[i..i + 1]).unwrap();
            assert_eq!(f.consumed, 1);
            if i + 1 < m {
                assert_eq!(f.event, None);
            } else {
                match f.event {
                    Some(Event::Established(n)) => {
                        assert_eq!(n.rtr, Some(Rtr::Write));
                        assert!(n.p2p && n.enhanced);
                        assert_eq!((n.ird, n.ord), (4, 2));
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(init.peer_private_data(), b"welcome");
        assert_eq!(init.state(), HandshakeState::Established);
        // Nothing more is consumed once established.
        assert_eq!(
            init.feed(&[1, 2, 3]).unwrap(),
            Feed {
                consumed: 0,
                event: None
            }
        );
        assert_eq!(
            resp.feed(&[1, 2, 3]).unwrap(),
            Feed {
                consumed: 0,
                event: None
            }
        );
    }

    #[test]
    fn reply_followed_by_fpdu_in_same_piece() {
        let cfg = MpaConfig {
            crc: CrcPolicy::On,
            ..MpaConfig::default()
        };
        let mut req = [0u8; 64];
        let (mut init, n) = Handshake::initiator(&cfg, &mut req).unwrap();
        let mut resp = Handshake::responder(&cfg);
        resp.feed(&req[..n]).unwrap();
        let mut wire = [0u8; 128];
        let (m, neg) = resp.accept(&[], 1, 1, &mut wire).unwrap();
        assert!(neg.crc);
        let mut crc = SoftCrc32c::new();
        let k = emit_fpdu(b"first ulpdu", None, Some(&mut crc), &mut wire[m..]).unwrap();
        // Split arbitrarily: the first piece ends inside the FPDU.
        let cut = m - 3;
        let f = init.feed(&wire[..cut]).unwrap();
        assert_eq!((f.consumed, f.event), (cut, None));
        let f = init.feed(&wire[cut..m + k]).unwrap();
        assert_eq!(f.consumed, 3);
        assert!(matches!(f.event, Some(Event::Established(n)) if n.crc));
        let rest = &wire[m..m + k];
        let fpdu = parse_fpdu(rest, Some(&mut crc)).unwrap();
        assert_eq!(fpdu.ulpdu, b"first ulpdu");
    }

    #[test]
    fn request_followed_by_data_is_a_violation() {
        let cfg = MpaConfig::default();
        let mut buf = [0u8; 64];
        let (_, n) = Handshake::initiator(&cfg, &mut buf).unwrap();
        buf[n..n + 4].copy_from_slice(&[0, 2, 0xaa, 0xbb]);
        let mut resp = Handshake::responder(&cfg);
        let f = resp.feed(&buf[..n + 4]).unwrap();
        assert_eq!(f.consumed, n);
        assert!(matches!(f.event, Some(Event::RequestReceived(_))));
        assert_eq!(resp.feed(&buf[n..n + 4]), Err(MpaError::UnexpectedData));
        assert_eq!(resp.state(), HandshakeState::Failed);
        assert!(resp.can_reject());
        assert_eq!(resp.feed(&buf[..1]), Err(MpaError::InvalidState));
        let mut out = [0u8; 64];
        assert!(resp.reject(&[], &mut out).is_ok());
        assert_eq!(resp.state(), HandshakeState::Rejected);
        assert_eq!(resp.error(), Some(MpaError::UnexpectedData));
    }

    #[test]
    fn siw_initiator_request_vector() {
        // What upstream siw sends with mpa_version=2, peer_to_peer=1,
        // ird 4, ord 8: S flag, Rev 2, block 0x8004 (P2P|4), 0xc008
        // (Write|Read RTR|8), then 3 octets of private data.
        let mut wire = [0u8; 64];
        let n = frame(
            &REQ_KEY,
            0x10,
            2,
            &[0x80, 0x04, 0xc0, 0x08, 1, 2, 3],
            &mut wire,
        );
        let rc = MpaConfig {
            enhanced: Some(EnhancedConfig {
                ird_max: 16,
                ..p2p(0, 0, RtrSet::WRITE_READ)
            }),
            ..MpaConfig::default()
        };
        let mut resp = Handshake::responder(&rc);
        match resp.feed(&wire[..n]).unwrap().event {
            Some(Event::RequestReceived(p)) => {
                assert_eq!(p.private_data, &[1, 2, 3]);
                assert!(!p.crc && !p.markers);
            }
            other => panic!("{other:?}"),
        }
        let mut out = [0u8; 64];
        let (m, neg) = resp.accept(b"ok", 16, 2, &mut out).unwrap();
        // Reply: S, Rev 2, PD_Length 6, IRD word 0x8010 (P2P|16),
        // ORD word 0x8002 (Write RTR | min(2, initiator IRD 4)), "ok".
        let mut want = [0u8; 26];
        let k = frame(
            &REP_KEY,
            0x10,
            2,
            &[0x80, 0x10, 0x80, 0x02, b'o', b'k'],
            &mut want,
        );
        assert_eq!(&out[..m], &want[..k]);
        assert_eq!((neg.ird, neg.ord, neg.rtr), (16, 2, Some(Rtr::Write)));
    }

    #[test]
    fn siw_responder_reply_vector() {
        let ic = MpaConfig {
            enhanced: Some(p2p(8, 4, RtrSet::WRITE_READ)),
            private_data: b"x",
            ..MpaConfig::default()
        };
        let mut req = [0u8; 64];
        let (mut init, n) = Handshake::initiator(&ic, &mut req).unwrap();
        let mut want = [0u8; 64];
        let k = frame(
            &REQ_KEY,
            0x10,
            2,
            &[0x80, 0x08, 0xc0, 0x04, b'x'],
            &mut want,
        );
        assert_eq!(&req[..n], &want[..k]);
        // siw as responder (accept with ird 4, ord 16): echoes P2P, picks
        // Write, ORD limited to our IRD 8.
        let mut rep = [0u8; 64];
        let m = frame(&REP_KEY, 0x10, 2, &[0x80, 0x04, 0x80, 0x08], &mut rep);
        match init.feed(&rep[..m]).unwrap().event {
            Some(Event::Established(neg)) => {
                assert_eq!((neg.ird, neg.ord, neg.rtr), (8, 4, Some(Rtr::Write)));
                assert!(neg.p2p && neg.enhanced && !neg.crc);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reject_with_private_data() {
        let cfg = MpaConfig::default();
        let mut req = [0u8; 64];
        let (mut init, n) = Handshake::initiator(&cfg, &mut req).unwrap();
        let mut resp = Handshake::responder(&cfg);
        resp.feed(&req[..n]).unwrap();
        assert!(resp.can_reject());
        let mut rep = [0u8; 64];
        let m = resp.reject(b"go away", &mut rep).unwrap();
        assert_eq!(resp.state(), HandshakeState::Rejected);
        // R and S set, Rev 2, block with IRD/ORD 0, then the private data.
        let mut want = [0u8; 64];
        let k = frame(
            &REP_KEY,
            0x30,
            2,
            &[0, 0, 0, 0, b'g', b'o', b' ', b'a', b'w', b'a', b'y'],
            &mut want,
        );
        assert_eq!(&rep[..m], &want[..k]);
        let f = init.feed(&rep[..m]).unwrap();
        assert_eq!(f.consumed, m);
        assert_eq!(
            f.event,
            Some(Event::Rejected {
                private_data: b"go away"
            })
        );
        assert_eq!(init.state(), HandshakeState::Rejected);
        assert_eq!(init.negotiated(), None);
        // No accept after reject, and nothing more consumed.
        assert_eq!(
            resp.accept(&[], 0, 0, &mut rep),
            Err(MpaError::InvalidState)
        );
        assert_eq!(resp.reject(&[], &mut rep), Err(MpaError::InvalidState));
        assert_eq!(init.feed(&rep[..m]).unwrap().consumed, 0);
    }

    #[test]
    fn plain_rev1_reject_vector() {
        let cfg = MpaConfig {
            revision: Revision::V1,
            enhanced: None,
            ..MpaConfig::default()
        };
        let mut req = [0u8; 64];
        let (mut init, n) = Handshake::initiator(&cfg, &mut req).unwrap();
        let mut want = [0u8; 20];
        frame(&REQ_KEY, 0x00, 1, &[], &mut want);
        assert_eq!(&req[..n], &want[..]);
        let mut resp = Handshake::responder(&MpaConfig::default());
        resp.feed(&req[..n]).unwrap();
        let mut rep = [0u8; 64];
        let m = resp.reject(b"no", &mut rep).unwrap();
        let mut want = [0u8; 22];
        frame(&REP_KEY, 0x20, 1, b"no", &mut want);
        assert_eq!(&rep[..m], &want[..]);
        assert_eq!(
            init.feed(&rep[..m]).unwrap().event,
            Some(Event::Rejected {
                private_data: b"no"
            })
        );
    }

    #[test]
    fn siw_style_reject_without_block() {
        let cfg = MpaConfig::default();
        let mut req = [0u8; 64];
        let (mut init, _) = Handshake::initiator(&cfg, &mut req).unwrap();
        let mut rep = [0u8; 20];
        frame(&REP_KEY, 0x30, 2, &[], &mut rep);
        assert_eq!(
            init.feed(&rep).unwrap().event,
            Some(Event::Rejected { private_data: &[] })
        );
    }

    #[derive(Debug, PartialEq)]
    enum CrcResult {
        Crc(bool),
        InitiatorFails,
        ResponderFails,
    }

    #[test]
    fn crc_policy_matrix() {
        use CrcPolicy::{Off, On, PreferOff};
        use CrcResult::{Crc, InitiatorFails, ResponderFails};
        let table = [
            // (initiator, responder, strict, outcome)
            (Off, Off, false, Crc(false)),
            (Off, PreferOff, false, Crc(false)),
            (Off, On, false, InitiatorFails),
            (PreferOff, Off, false, Crc(false)),
            (PreferOff, PreferOff, false, Crc(false)),
            (PreferOff, On, false, Crc(true)),
            (On, Off, false, ResponderFails),
            (On, PreferOff, false, Crc(true)),
            (On, On, false, Crc(true)),
            (Off, Off, true, Crc(false)),
            (Off, PreferOff, true, Crc(false)),
            (Off, On, true, ResponderFails),
            (PreferOff, Off, true, Crc(false)),
            (PreferOff, PreferOff, true, Crc(false)),
            (PreferOff, On, true, ResponderFails),
            (On, Off, true, ResponderFails),
            (On, PreferOff, true, ResponderFails),
            (On, On, true, Crc(true)),
        ];
        for (ip, rp, strict, want) in table {
            let ic = MpaConfig {
                crc: ip,
                strict,
                ..MpaConfig::default()
            };
            let rc = MpaConfig {
                crc: rp,
                strict,
                ..MpaConfig::default()
            };
            let got = match run(&ic, &rc, 0, 0) {
                (Ok(i), Ok(r)) => {
                    assert_eq!(i.crc, r.crc);
                    Crc(i.crc)
                }
                (Err(MpaError::CrcPolicyMismatch), Ok(_)) => InitiatorFails,
                (_, Err(MpaError::CrcPolicyMismatch)) => ResponderFails,
                other => panic!("{other:?}"),
            };
            assert_eq!(got, want, "{ip:?} {rp:?} strict {strict}");
        }
    }

    #[test]
    fn initiator_refuses_reply_dropping_crc() {
        let ic = MpaConfig {
            crc: CrcPolicy::On,
            ..MpaConfig::default()
        };
        let mut req = [0u8; 64];
        let (mut init, _) = Handshake::initiator(&ic, &mut req).unwrap();
        assert_eq!(req[16], 0x50, "C and S set");
        let mut rep = [0u8; 24];
        frame(&REP_KEY, 0x10, 2, &[0, 0, 0, 0], &mut rep);
        assert_eq!(init.feed(&rep), Err(MpaError::CrcPolicyMismatch));
        assert!(!init.can_reject());
    }

    #[test]
    fn markers_negotiation() {
        // Initiator wants markers in what it receives; responder can't send.
        let ic = MpaConfig {
            markers_rx: true,
            ..MpaConfig::default()
        };
        let mut req = [0u8; 64];
        let (mut init, n) = Handshake::initiator(&ic, &mut req).unwrap();
        assert_eq!(req[16], 0x90, "M and S set");
        let mut resp = Handshake::responder(&MpaConfig::default());
        assert_eq!(resp.feed(&req[..n]), Err(MpaError::MarkersUnsupported));
        assert!(resp.can_reject());
        let mut rep = [0u8; 64];
        let m = resp.reject(b"no markers", &mut rep).unwrap();
        assert_eq!(
            init.feed(&rep[..m]).unwrap().event,
            Some(Event::Rejected {
                private_data: b"no markers"
            })
        );

        // Responder able to send markers, and wanting them too.
        let rc = MpaConfig {
            markers_tx: true,
            markers_rx: true,
            ..MpaConfig::default()
        };
        let (i, r) = run(&ic, &rc, 0, 0);
        assert_eq!(
            i,
            Err(MpaError::MarkersUnsupported),
            "initiator cannot send markers"
        );
        let r = r.unwrap();
        assert!(r.markers_tx && r.markers_rx);
        let ic2 = MpaConfig {
            markers_tx: true,
            ..ic
        };
        let (i, r) = run(&ic2, &rc, 0, 0);
        let (i, r) = (i.unwrap(), r.unwrap());
        assert!(i.markers_rx && i.markers_tx && r.markers_rx && r.markers_tx);
        // Per direction: only the initiator's receive side.
        let rc2 = MpaConfig {
            markers_tx: true,
            ..MpaConfig::default()
        };
        let (i, r) = run(&ic, &rc2, 0, 0);
        let (i, r) = (i.unwrap(), r.unwrap());
        assert!(i.markers_rx && !i.markers_tx && !r.markers_rx && r.markers_tx);
    }

    #[test]
    fn revision_negotiation() {
        let v1 = MpaConfig {
            revision: Revision::V1,
            ..MpaConfig::default()
        };
        let v2 = MpaConfig::default();
        // Rev 2 enhanced initiator, Rev 1 responder: Rev 1 reply, fallback.
        let (i, r) = run(&v2, &v1, 3, 3);
        let (i, r) = (i.unwrap(), r.unwrap());
        assert_eq!((i.revision, r.revision), (Revision::V1, Revision::V1));
        assert!(!i.enhanced && !r.enhanced);
        // ... unless the initiator needs an RTR, or is strict.
        let v2p = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::WRITE)),
            ..v2
        };
        assert_eq!(run(&v2p, &v1, 0, 0).0, Err(MpaError::NoMatchingRtr));
        let v2s = MpaConfig { strict: true, ..v2 };
        assert_eq!(run(&v2s, &v1, 0, 0).0, Err(MpaError::RevisionMismatch));
        // Strict responder refuses another revision.
        let v1s = MpaConfig { strict: true, ..v1 };
        assert_eq!(run(&v2, &v1s, 0, 0).1, Err(MpaError::RevisionMismatch));
        // Rev 1 initiator against a Rev 2 responder: Rev 1.
        let (i, _) = run(&v1, &v2, 0, 0);
        assert_eq!(i.unwrap().revision, Revision::V1);
        // A Reply with a higher revision than the Request is refused.
        let mut req = [0u8; 64];
        let (mut init, _) = Handshake::initiator(&v1, &mut req).unwrap();
        let mut rep = [0u8; 20];
        frame(&REP_KEY, 0, 2, &[], &mut rep);
        assert_eq!(init.feed(&rep), Err(MpaError::RevisionMismatch));
        // Rev 2 without S on both sides: not enhanced.
        let plain2 = MpaConfig {
            enhanced: None,
            ..v2
        };
        let (i, r) = run(&plain2, &v2, 5, 6);
        let (i, r) = (i.unwrap(), r.unwrap());
        assert_eq!(i.revision, Revision::V2);
        assert!(!i.enhanced && !r.enhanced);
        assert_eq!((r.ird, r.ord), (5, 6));
        let strict_enh = MpaConfig { strict: true, ..v2 };
        assert_eq!(
            run(&plain2, &strict_enh, 0, 0).1,
            Err(MpaError::EnhancedMismatch)
        );
    }

    #[test]
    fn unsolicited_enhanced_reply_is_refused() {
        let plain2 = MpaConfig {
            enhanced: None,
            ..MpaConfig::default()
        };
        let mut req = [0u8; 64];
        let (mut init, _) = Handshake::initiator(&plain2, &mut req).unwrap();
        assert_eq!(req[16], 0x00);
        let mut rep = [0u8; 24];
        frame(&REP_KEY, 0x10, 2, &[0, 1, 0, 1], &mut rep);
        assert_eq!(init.feed(&rep), Err(MpaError::EnhancedMismatch));
    }

    #[test]
    fn rtr_selection() {
        // Initiator offers all three; responder prefers Write.
        let ic = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::ALL)),
            ..MpaConfig::default()
        };
        let rc = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::ALL)),
            ..MpaConfig::default()
        };
        let (i, r) = run(&ic, &rc, 1, 1);
        assert_eq!(
            (i.unwrap().rtr, r.unwrap().rtr),
            (Some(Rtr::Write), Some(Rtr::Write))
        );
        // Responder accepts only Read and Send: Read, and its IRD becomes 1.
        let rc = MpaConfig {
            enhanced: Some(p2p(0, 0, RtrSet::READ.with(Rtr::Send))),
            ..MpaConfig::default()
        };
        let (i, r) = run(&ic, &rc, 0, 0);
        let (i, r) = (i.unwrap(), r.unwrap());
        assert_eq!((i.rtr, r.rtr), (Some(Rtr::Read), Some(Rtr::Read)));
        assert_eq!(r.ird, 1);
        assert_eq!(i.ord, 1);
        // Only Send in common.
        let rc = MpaConfig {
            enhanced: Some(p2p(0, 0, RtrSet::SEND)),
            ..MpaConfig::default()
        };
        let (i, r) = run(&ic, &rc, 0, 0);
        assert_eq!(
            (i.unwrap().rtr, r.unwrap().rtr),
            (Some(Rtr::Send), Some(Rtr::Send))
        );
        // Nothing in common: responder fails and may reject.
        let ic = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::SEND)),
            ..MpaConfig::default()
        };
        let rc = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::WRITE_READ)),
            ..MpaConfig::default()
        };
        assert_eq!(run(&ic, &rc, 0, 0).1, Err(MpaError::NoMatchingRtr));
        // A responder accepting no RTR type at all cannot honour p2p.
        let rc = MpaConfig {
            enhanced: Some(EnhancedConfig {
                rtr: RtrSet::EMPTY,
                ..enh(1, 1)
            }),
            ..MpaConfig::default()
        };
        assert_eq!(run(&ic, &rc, 1, 1).1, Err(MpaError::NoMatchingRtr));
        // The default responder honours a siw-style p2p Request with Write.
        let siw_like = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::WRITE_READ)),
            ..MpaConfig::default()
        };
        let (i, r) = run(&siw_like, &MpaConfig::default(), 1, 1);
        assert_eq!(
            (i.unwrap().rtr, r.unwrap().rtr),
            (Some(Rtr::Write), Some(Rtr::Write))
        );
        // Initiator not asking for p2p: no RTR, unless the responder
        // requires p2p, which then fails.
        let (i, r) = run(&MpaConfig::default(), &MpaConfig::default(), 1, 1);
        assert_eq!((i.unwrap().rtr, r.unwrap().rtr), (None, None));
        let rc = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::ALL)),
            ..MpaConfig::default()
        };
        assert_eq!(
            run(&MpaConfig::default(), &rc, 1, 1).1,
            Err(MpaError::NoMatchingRtr)
        );
        let v1 = MpaConfig {
            revision: Revision::V1,
            ..MpaConfig::default()
        };
        assert_eq!(run(&v1, &rc, 1, 1).1, Err(MpaError::NoMatchingRtr));
    }

    #[test]
    fn rtr_not_offered_in_reply_is_refused() {
        let ic = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::WRITE)),
            ..MpaConfig::default()
        };
        let mut req = [0u8; 64];
        let (mut init, _) = Handshake::initiator(&ic, &mut req).unwrap();
        let mut rep = [0u8; 24];
        // Reply picks Read (0x4000 in the ORD word), which was not offered.
        frame(&REP_KEY, 0x10, 2, &[0x80, 0x01, 0x40, 0x01], &mut rep);
        let e = init.feed(&rep).unwrap_err();
        assert_eq!(e, MpaError::NoMatchingRtr);
        assert_eq!(e.term_code(), Some(0x07));
    }

    #[test]
    fn read_rtr_needs_ird_and_ord() {
        // Initiator with ORD 0 offering Read: the Request says ORD 1.
        let ic = MpaConfig {
            enhanced: Some(p2p(2, 0, RtrSet::READ)),
            ..MpaConfig::default()
        };
        let mut req = [0u8; 64];
        let (mut init, n) = Handshake::initiator(&ic, &mut req).unwrap();
        assert_eq!(&req[20..24], &[0x80, 0x02, 0x40, 0x01]);
        // A Reply choosing Read but with IRD 0 cannot be served.
        let mut rep = [0u8; 24];
        frame(&REP_KEY, 0x10, 2, &[0x80, 0x00, 0x40, 0x00], &mut rep);
        let mut init2 = init.clone();
        assert_eq!(init2.feed(&rep), Err(MpaError::InsufficientIrd));
        frame(&REP_KEY, 0x10, 2, &[0x80, 0x01, 0x40, 0x00], &mut rep);
        let neg = match init.feed(&rep).unwrap().event {
            Some(Event::Established(neg)) => neg,
            other => panic!("{other:?}"),
        };
        assert_eq!((neg.rtr, neg.ird, neg.ord), (Some(Rtr::Read), 2, 1));
        assert!(n > 20);
        // p2p with no RTR type is a configuration error.
        let bad = MpaConfig {
            enhanced: Some(p2p(1, 1, RtrSet::EMPTY)),
            ..MpaConfig::default()
        };
        assert_eq!(
            Handshake::initiator(&bad, &mut req).map(|(_, n)| n),
            Err(MpaError::InvalidParameter)
        );
    }

    #[test]
    fn ird_ord_negotiation() {
        // Responder ORD is limited to the initiator's IRD; initiator ORD to
        // the responder's IRD.
        let ic = MpaConfig {
            enhanced: Some(enh(3, 10)),
            ..MpaConfig::default()
        };
        let rc = MpaConfig::default();
        let (i, r) = run(&ic, &rc, 4, 9);
        let (i, r) = (i.unwrap(), r.unwrap());
        assert_eq!((r.ird, r.ord), (4, 3));
        assert_eq!((i.ird, i.ord), (3, 4));

        // Responder raises its IRD towards the initiator's ORD, bounded.
        let rc = MpaConfig {
            enhanced: Some(EnhancedConfig {
                ird_max: 8,
                ..enh(0, 0)
            }),
            ..MpaConfig::default()
        };
        let (i, r) = run(&ic, &rc, 2, 1);
        assert_eq!(r.unwrap().ird, 8);
        assert_eq!(i.unwrap().ord, 8);
        let ic6 = MpaConfig {
            enhanced: Some(enh(3, 6)),
            ..MpaConfig::default()
        };
        let (i, r) = run(&ic6, &rc, 2, 1);
        assert_eq!(r.unwrap().ird, 6);
        assert_eq!(i.unwrap().ord, 6);

        // Responder ORD above initiator IRD is refused unless the initiator
        // may raise its IRD. (Hand-built Reply: IRD 1, ORD 5.)
        let mut rep = [0u8; 24];
        frame(&REP_KEY, 0x10, 2, &[0x00, 0x01, 0x00, 0x05], &mut rep);
        let mut req = [0u8; 64];
        let ic = MpaConfig {
            enhanced: Some(enh(2, 2)),
            ..MpaConfig::default()
        };
        let (mut init, _) = Handshake::initiator(&ic, &mut req).unwrap();
        let e = init.feed(&rep).unwrap_err();
        assert_eq!(e, MpaError::InsufficientIrd);
        assert_eq!(e.term_code(), Some(0x06));
        let ic = MpaConfig {
            enhanced: Some(EnhancedConfig {
                ird_max: 5,
                ..enh(2, 2)
            }),
            ..MpaConfig::default()
        };
        let (mut init, _) = Handshake::initiator(&ic, &mut req).unwrap();
        match init.feed(&rep).unwrap().event {
            Some(Event::Established(n)) => assert_eq!((n.ird, n.ord), (5, 1)),
            other => panic!("{other:?}"),
        }

        // Values beyond 14 bits are clamped on the wire.
        let ic = MpaConfig {
            enhanced: Some(enh(0xffff, 0x4000)),
            ..MpaConfig::default()
        };
        let (_, n) = Handshake::initiator(&ic, &mut req).unwrap();
        assert_eq!(&req[20..n], &[0x3f, 0xff, 0x3f, 0xff]);
    }

    #[test]
    fn negotiation_functions_directly() {
        let req = EnhancedData {
            ird: 4,
            ord: 6,
            p2p: true,
            rtr: RtrSet::WRITE_READ,
        };
        let loc = p2p(0, 0, RtrSet::READ);
        assert_eq!(choose_rtr(&req, &loc), Ok(Some(Rtr::Read)));
        let rep = negotiate_responder(&req, 2, 9, 5, Some(Rtr::Read));
        assert_eq!(
            rep,
            EnhancedData {
                ird: 5,
                ord: 4,
                p2p: true,
                rtr: RtrSet::READ
            }
        );
        assert_eq!(
            negotiate_initiator(&req, &rep, 4),
            Ok((4, 5, Some(Rtr::Read)))
        );
        let non_p2p = EnhancedData { p2p: false, ..req };
        assert_eq!(choose_rtr(&non_p2p, &loc), Err(MpaError::NoMatchingRtr));
        assert_eq!(choose_rtr(&non_p2p, &enh(0, 0)), Ok(None));
        assert_eq!(choose_rtr(&req, &enh(0, 0)), Ok(Some(Rtr::Write)));
        assert_eq!(RtrSet::EMPTY.preferred(), None);
        assert_eq!(RtrSet::ALL.preferred(), Some(Rtr::Write));
        assert!(RtrSet::only(Rtr::Send).contains(Rtr::Send));
        assert!(RtrSet::WRITE.intersection(RtrSet::READ).is_empty());
    }

    #[test]
    fn wrong_frame_kind() {
        let cfg = MpaConfig::default();
        let mut req = [0u8; 64];
        let (mut init, n) = Handshake::initiator(&cfg, &mut req).unwrap();
        // A Request sent to the initiator.
        let e = init.feed(&req[..n]).unwrap_err();
        assert_eq!(e, MpaError::WrongFrameKind);
        assert_eq!(e.term_code(), Some(0x04));
        // A Reply sent to the responder.
        let mut rep = [0u8; 20];
        frame(&REP_KEY, 0, 1, &[], &mut rep);
        let mut resp = Handshake::responder(&cfg);
        assert_eq!(resp.feed(&rep), Err(MpaError::WrongFrameKind));
    }

    #[test]
    fn malformed_frames_fail_the_handshake() {
        let cfg = MpaConfig::default();
        let mut resp = Handshake::responder(&cfg);
        assert_eq!(resp.feed(b"MPA ID Re").unwrap().consumed, 9);
        assert_eq!(resp.feed(b"x"), Err(MpaError::BadKey));
        assert_eq!(resp.state(), HandshakeState::Failed);
        assert!(!resp.can_reject(), "no reject after a malformed frame");
        let mut out = [0u8; 64];
        assert_eq!(resp.reject(&[], &mut out), Err(MpaError::InvalidState));

        let mut wire = [0u8; 24];
        let n = frame(&REQ_KEY, 0, 3, &[], &mut wire);
        let mut resp = Handshake::responder(&cfg);
        assert_eq!(resp.feed(&wire[..n]), Err(MpaError::BadRevision(3)));
        // Enhanced without its block: well-formed enough to reject.
        let n = frame(&REQ_KEY, 0x10, 2, &[0, 0], &mut wire);
        let mut resp = Handshake::responder(&cfg);
        assert_eq!(resp.feed(&wire[..n]), Err(MpaError::EnhancedDataMissing));
        assert!(!resp.can_reject());
    }

    #[test]
    fn api_misuse_is_rejected() {
        let cfg = MpaConfig::default();
        let mut out = [0u8; 64];
        let mut resp = Handshake::responder(&cfg);
        assert_eq!(resp.role(), Role::Responder);
        assert_eq!(
            resp.accept(&[], 0, 0, &mut out),
            Err(MpaError::InvalidState)
        );
        assert_eq!(resp.reject(&[], &mut out), Err(MpaError::InvalidState));
        assert_eq!(resp.peer_private_data(), b"");
        let (mut init, n) = Handshake::initiator(&cfg, &mut out).unwrap();
        assert_eq!(init.role(), Role::Initiator);
        assert_eq!(
            init.accept(&[], 0, 0, &mut out),
            Err(MpaError::InvalidState)
        );
        assert_eq!(init.reject(&[], &mut out), Err(MpaError::InvalidState));
        // Accept failures leave the decision pending.
        let mut req = [0u8; 64];
        req[..n].copy_from_slice(&out[..n]);
        resp.feed(&req[..n]).unwrap();
        assert_eq!(resp.peer_enhanced(), Some(EnhancedData::default()));
        let pd = [0u8; 509];
        let mut big = [0u8; MAX_FRAME_LEN + 4];
        assert_eq!(
            resp.accept(&pd, 0, 0, &mut big),
            Err(MpaError::PrivateDataTooLong(513))
        );
        assert_eq!(
            resp.accept(&pd[..10], 0, 0, &mut out[..33]),
            Err(MpaError::BufferTooSmall { needed: 34 })
        );
        assert_eq!(resp.state(), HandshakeState::AwaitingDecision);
        assert!(resp.accept(&pd[..508], 0, 0, &mut big).is_ok());
        assert_eq!(
            resp.accept(&[], 0, 0, &mut big),
            Err(MpaError::InvalidState)
        );
        assert_eq!(resp.reject(&[], &mut big), Err(MpaError::InvalidState));
        // Initiator private data limits.
        let long = MpaConfig {
            private_data: &pd,
            ..cfg
        };
        assert_eq!(
            Handshake::initiator(&long, &mut big).map(|(_, n)| n),
            Err(MpaError::PrivateDataTooLong(513))
        );
        assert_eq!(
            Handshake::initiator(&cfg, &mut out[..23]).map(|(_, n)| n),
            Err(MpaError::BufferTooSmall { needed: 24 })
        );
        // Feeding a failed machine.
        let mut resp = Handshake::responder(&cfg);
        let _ = resp.feed(b"Z");
        assert_eq!(resp.feed(b"MPA"), Err(MpaError::InvalidState));
    }

    #[test]
    fn error_codes_and_display() {
        assert_eq!(
            MpaError::BadCrc {
                computed: 1,
                received: 2
            }
            .term_code(),
            Some(0x02)
        );
        assert_eq!(
            MpaError::MarkerMismatch {
                expected: 4,
                received: 8
            }
            .term_code(),
            Some(0x03)
        );
        assert_eq!(MpaError::BadKey.term_code(), Some(0x04));
        assert_eq!(MpaError::CrcPolicyMismatch.term_code(), Some(0x04));
        assert_eq!(MpaError::Incomplete { needed: 1 }.term_code(), None);
        assert_eq!(MpaError::InvalidState.term_code(), None);
        struct Sink(usize);
        impl fmt::Write for Sink {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                self.0 += s.len();
                Ok(())
            }
        }
        let mut s = Sink(0);
        fmt::write(
            &mut s,
            format_args!(
                "{}",
                MpaError::BadCrc {
                    computed: 1,
                    received: 2
                }
            ),
        )
        .unwrap();
        assert!(s.0 > 10);
    }

    // ---- FPDU framing -----------------------------------------------------

    #[test]
    fn pad_and_lengths() {
        let pads = [2usize, 1, 0, 3, 2, 1, 0, 3];
        for (u, &p) in pads.iter().enumerate() {
            assert_eq!(pad_len(u), p, "ulpdu {u}");
            assert_eq!(fpdu_len(u as u16), 2 + u + p + 4);
            assert_eq!(fpdu_len(u as u16) % 4, 0);
        }
        assert_eq!(pad_len(usize::MAX), 3);
        assert_eq!(fpdu_len(u16::MAX), 2 + 65535 + 3 + 4);
        assert_eq!(fpdu_wire_len(3, None), 12);
        assert_eq!(fpdu_wire_len(3, Some(&MarkerState::new())), 16);
        assert_eq!(fpdu_wire_len(3, Some(&MarkerState::at(4))), 12);
    }

    #[test]
    fn mulpdu_values() {
        assert_eq!(mulpdu(1460, false), 1454);
        assert_eq!(mulpdu(1460, true), 1442);
        assert_eq!(mulpdu(1461, false), 1454);
        assert_eq!(mulpdu(9000, false), 8994);
        assert_eq!(mulpdu(9000, true), 9000 - 6 - 4 * 18);
        assert_eq!(mulpdu(0, true), 0);
        assert_eq!(mulpdu(6, false), 0);
        assert_eq!(mulpdu(u32::MAX, false), 65534);
        // An FPDU of MULPDU octets fits the segment from any position and
        // needs no pad.
        for emss in (64..3000u32).step_by(7) {
            for markers in [false, true] {
                let m = mulpdu(emss, markers);
                assert_eq!(pad_len(usize::from(m)), 0, "emss {emss}");
                for pos in (0..1024u32).step_by(4) {
                    let wire = if markers {
                        MarkerState::at(pos).fpdu_wire_len(m)
                    } else {
                        fpdu_len(m)
                    };
                    assert!(
                        wire <= emss as usize,
                        "emss {emss} pos {pos} markers {markers}"
                    );
                }
            }
        }
    }

    #[test]
    fn ulpdu_length_field() {
        assert_eq!(read_ulpdu_length(&[0x12, 0x34, 0xff]), Ok(0x1234));
        assert_eq!(
            read_ulpdu_length(&[0x12]),
            Err(MpaError::Incomplete { needed: 1 })
        );
        let mut out = [0u8; 2];
        assert_eq!(write_ulpdu_length(&mut out, 0xabcd), Ok(2));
        assert_eq!(out, [0xab, 0xcd]);
        assert_eq!(
            write_ulpdu_length(&mut out[..1], 1),
            Err(MpaError::BufferTooSmall { needed: 2 })
        );
    }

    #[test]
    fn fpdu_without_markers_vectors() {
        let mut out = [0xeeu8; 16];
        // CRC off: trailer zero.
        assert_eq!(emit_fpdu(b"abc", None, None, &mut out), Ok(12));
        assert_eq!(
            &out[..12],
            &[0x00, 0x03, 0x61, 0x62, 0x63, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(out[12], 0xee);
        let f = parse_fpdu(&out, None).unwrap();
        assert_eq!((f.ulpdu, f.wire_len, f.crc), (&b"abc"[..], 12, 0));
        // CRC on: CRC32c of the first 8 octets, least significant first.
        let mut crc = SoftCrc32c::new();
        assert_eq!(emit_fpdu(b"abc", None, Some(&mut crc), &mut out), Ok(12));
        let want = [
            0x00, 0x03, 0x61, 0x62, 0x63, 0, 0, 0, 0x59, 0x23, 0x97, 0x12,
        ];
        assert_eq!(&out[..12], &want);
        let f = parse_fpdu(&want, Some(&mut crc)).unwrap();
        assert_eq!(f.ulpdu, b"abc");
        assert_eq!(f.crc, 0x1297_2359);
        // Pieces API, split any way.
        assert_eq!(
            check_fpdu_crc(
                &mut crc,
                &[&want[..2], &want[2..5], &want[5..8]],
                &want[8..]
            ),
            Ok(())
        );
        assert_eq!(compute_fpdu_crc(&mut crc, &[&want[..8]]), 0x1297_2359);
        assert_eq!(crc_trailer(Some(0x1297_2359)), [0x59, 0x23, 0x97, 0x12]);
        assert_eq!(crc_trailer(None), [0; 4]);
    }

    #[test]
    fn fpdu_crc_errors() {
        let mut crc = SoftCrc32c::new();
        let mut wire = [0u8; 12];
        emit_fpdu(b"abc", None, Some(&mut crc), &mut wire).unwrap();
        for bit in 0..96 {
            let mut bad = wire;
            bad[bit / 8] ^= 1 << (bit % 8);
            if bit < 16 {
                // The length changed: different FPDU boundaries.
                let _ = parse_fpdu(&bad, Some(&mut crc));
                continue;
            }
            let e = parse_fpdu(&bad, Some(&mut crc)).unwrap_err();
            assert!(matches!(e, MpaError::BadCrc { .. }), "bit {bit}");
            assert_eq!(e.term_code(), Some(0x02));
            // Without CRC the trailer is not checked.
            assert!(parse_fpdu(&bad, None).is_ok());
        }
        assert_eq!(
            check_crc_trailer(0, &[0, 0]),
            Err(MpaError::Incomplete { needed: 2 })
        );
        assert_eq!(
            check_crc_trailer(0x0102_0304, &[4, 3, 2, 0]),
            Err(MpaError::BadCrc {
                computed: 0x0102_0304,
                received: 0x0002_0304
            })
        );
    }

    #[test]
    fn parse_fpdu_incomplete() {
        let mut wire = [0u8; 12];
        emit_fpdu(b"abc", None, None, &mut wire).unwrap();
        assert_eq!(
            parse_fpdu(&wire[..0], None),
            Err(MpaError::Incomplete { needed: 2 })
        );
        assert_eq!(
            parse_fpdu(&wire[..1], None),
            Err(MpaError::Incomplete { needed: 1 })
        );
        for len in 2..12 {
            assert_eq!(
                parse_fpdu(&wire[..len], None),
                Err(MpaError::Incomplete { needed: 12 - len })
            );
        }
    }

    #[test]
    fn emit_fpdu_errors_leave_state() {
        static BIG: [u8; 65536] = [0; 65536];
        let mut out = [0u8; 32];
        let mut ms = MarkerState::at(100);
        assert_eq!(
            emit_fpdu(&BIG, Some(&mut ms), None, &mut out),
            Err(MpaError::UlpduTooLong(65536))
        );
        assert_eq!(
            emit_fpdu(&BIG[..20], Some(&mut ms), None, &mut out[..27]),
            Err(MpaError::BufferTooSmall { needed: 28 })
        );
        assert_eq!(ms, MarkerState::at(100));
    }

    #[test]
    fn marker_state_basics() {
        let mut ms = MarkerState::new();
        assert!(ms.marker_due());
        assert_eq!(ms.bytes_before_marker(), 0);
        assert_eq!(ms.advance(1), Err(MpaError::InvalidParameter));
        ms.begin_fpdu();
        assert_eq!(ms.header_pos(), 4);
        assert_eq!(ms.fpduptr(), 0);
        assert_eq!(ms.take_marker(), Ok([0, 0, 0, 0]));
        assert_eq!(ms.stream_pos(), 4);
        assert!(!ms.marker_due());
        assert_eq!(ms.bytes_before_marker(), 508);
        assert_eq!(ms.take_marker(), Err(MpaError::InvalidState));
        assert_eq!(ms.strip_marker(&[0; 4]), Err(MpaError::InvalidState));
        assert_eq!(ms.advance(509), Err(MpaError::InvalidParameter));
        assert_eq!(ms.advance(508), Ok(()));
        assert!(ms.marker_due());
        assert_eq!(ms.fpduptr(), 508);
        assert_eq!(ms.take_marker(), Ok([0, 0, 0x01, 0xfc]));
        assert_eq!(MarkerState::default(), MarkerState::new());
        // Wrap-around of the 32-bit stream offset keeps the 512 grid.
        let mut w = MarkerState::at(u32::MAX - 3);
        assert_eq!(w.bytes_before_marker(), 4);
        w.begin_fpdu();
        w.advance(4).unwrap();
        assert!(w.marker_due());
        assert_eq!(w.stream_pos(), 0);
        assert_eq!(w.take_marker(), Ok([0, 0, 0, 4]));
        // Counting markers.
        assert_eq!(MarkerState::new().markers_in(0), 0);
        assert_eq!(MarkerState::new().markers_in(1), 1);
        assert_eq!(MarkerState::new().markers_in(508), 1);
        assert_eq!(MarkerState::new().markers_in(509), 2);
        assert_eq!(MarkerState::at(4).markers_in(508), 0);
        assert_eq!(MarkerState::at(4).markers_in(509), 1);
        assert_eq!(MarkerState::at(4).wire_len_of(509), 513);
    }

    #[test]
    fn strip_marker_validation() {
        let mut ms = MarkerState::new();
        ms.begin_fpdu();
        assert_eq!(
            ms.strip_marker(&[0, 0]),
            Err(MpaError::Incomplete { needed: 2 })
        );
        let e = ms.strip_marker(&[0, 0, 0, 4]).unwrap_err();
        assert_eq!(
            e,
            MpaError::MarkerMismatch {
                expected: 0,
                received: 4
            }
        );
        assert_eq!(e.term_code(), Some(0x03));
        assert_eq!(ms.stream_pos(), 0, "state unchanged on mismatch");
        // The reserved half and the two low FPDUPTR bits are ignored.
        assert_eq!(ms.strip_marker(&[0xde, 0xad, 0, 3]), Ok(()));
        assert_eq!(ms.stream_pos(), 4);
        ms.advance(508).unwrap();
        assert_eq!(ms.strip_marker(&[0, 0, 0x01, 0xff]), Ok(()));
        assert_eq!(ms.stream_pos(), 516);
    }

    #[test]
    fn marker_at_fpdu_start_vector() {
        // Stream offset 0: the marker (FPDUPTR 0) precedes ULPDU_Length.
        let mut ms = MarkerState::new();
        let mut out = [0u8; 16];
        assert_eq!(emit_fpdu(b"abc", Some(&mut ms), None, &mut out), Ok(16));
        assert_eq!(
            out,
            [0, 0, 0, 0, 0x00, 0x03, 0x61, 0x62, 0x63, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(ms.stream_pos(), 16);
        // With CRC: the leading marker is covered.
        let mut ms = MarkerState::at(1024);
        let mut crc = SoftCrc32c::new();
        emit_fpdu(b"abc", Some(&mut ms), Some(&mut crc), &mut out).unwrap();
        assert_eq!(
            out,
            [0, 0, 0, 0, 0x00, 0x03, 0x61, 0x62, 0x63, 0, 0, 0, 0x8e, 0x24, 0xdf, 0xb5]
        );
        let mut rx = MarkerState::at(1024);
        let mut ulpdu = [0u8; 8];
        let got = parse_fpdu_with_markers(&out, &mut rx, Some(&mut crc), &mut ulpdu).unwrap();
        assert_eq!(
            got,
            MarkedFpdu {
                wire_len: 16,
                ulpdu_len: 3,
                crc: 0xb5df_248e
            }
        );
        assert_eq!(&ulpdu[..3], b"abc");
        assert_eq!(rx, ms);
    }

    #[test]
    fn fpdu_straddling_a_marker_vector() {
        // FPDU starting at offset 504: ULPDU_Length and 6 ULPDU octets,
        // marker at 512 with FPDUPTR 8, the other 4 octets, CRC.
        let ulpdu = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        let mut ms = MarkerState::at(504);
        assert_eq!(ms.fpdu_wire_len(10), 20);
        let mut out = [0u8; 20];
        let mut crc = SoftCrc32c::new();
        assert_eq!(
            emit_fpdu(&ulpdu, Some(&mut ms), Some(&mut crc), &mut out),
            Ok(20)
        );
        let want = [
            0x00, 0x0a, 1, 2, 3, 4, 5, 6, // ULPDU_Length, ULPDU[0..6]
            0x00, 0x00, 0x00, 0x08, // marker, FPDUPTR 8
            7, 8, 9, 10, // ULPDU[6..10], no pad
            0xd0, 0x90, 0x07, 0x55, // CRC over the 16 octets before it
        ];
        assert_eq!(out, want);
        assert_eq!(ms.stream_pos(), 524);
        let mut rx = MarkerState::at(504);
        let mut buf = [0u8; 16];
        let got = parse_fpdu_with_markers(&want, &mut rx, Some(&mut crc), &mut buf).unwrap();
        assert_eq!((got.wire_len, got.ulpdu_len), (20, 10));
        assert_eq!(&buf[..10], &ulpdu);
        // A wrong FPDUPTR is a marker/length mismatch; state is unchanged.
        let mut bad = want;
        bad[11] = 0x0c;
        let mut rx = MarkerState::at(504);
        assert_eq!(
            parse_fpdu_with_markers(&bad, &mut rx, None, &mut buf),
            Err(MpaError::MarkerMismatch {
                expected: 8,
                received: 12
            })
        );
        assert_eq!(rx, MarkerState::at(504));
        // The marker's reserved half is covered by the CRC but not checked.
        let mut res = want;
        res[8] = 0xff;
        assert!(parse_fpdu_with_markers(&res, &mut rx, None, &mut buf).is_ok());
        let mut rx = MarkerState::at(504);
        assert!(matches!(
            parse_fpdu_with_markers(&res, &mut rx, Some(&mut crc), &mut buf),
            Err(MpaError::BadCrc { .. })
        ));
    }

    #[test]
    fn marker_right_before_crc_vector() {
        // FPDU at 500: 12 framed octets end at 512, the marker (FPDUPTR 12)
        // sits between them and the CRC and is covered by it.
        let ulpdu = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        let mut ms = MarkerState::at(500);
        let mut out = [0u8; 20];
        let mut crc = SoftCrc32c::new();
        assert_eq!(
            emit_fpdu(&ulpdu, Some(&mut ms), Some(&mut crc), &mut out),
            Ok(20)
        );
        let want = [
            0x00, 0x0a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, // header, ULPDU
            0x00, 0x00, 0x00, 0x0c, // marker
            0xf1, 0xfe, 0x21, 0x97, // CRC
        ];
        assert_eq!(out, want);
        let mut rx = MarkerState::at(500);
        let mut buf = [0u8; 10];
        assert!(parse_fpdu_with_markers(&want, &mut rx, Some(&mut crc), &mut buf).is_ok());
        assert_eq!(rx.stream_pos(), 520);
    }

    #[test]
    fn fpdu_ending_on_marker_boundary() {
        // First FPDU at 496 ends exactly at 512: no marker inside it. The
        // marker at 512 belongs to the next FPDU and has FPDUPTR 0.
        let mut ms = MarkerState::at(496);
        let mut out = [0u8; 40];
        let a = emit_fpdu(&[0xaa; 10], Some(&mut ms), None, &mut out).unwrap();
        assert_eq!(a, 16);
        assert_eq!(ms.stream_pos(), 512);
        let b = emit_fpdu(&[0xbb; 2], Some(&mut ms), None, &mut out[a..]).unwrap();
        assert_eq!(b, 12);
        assert_eq!(
            &out[a..a + 12],
            &[0, 0, 0, 0, 0x00, 0x02, 0xbb, 0xbb, 0, 0, 0, 0]
        );
        let mut rx = MarkerState::at(496);
        let mut buf = [0u8; 16];
        assert_eq!(
            parse_fpdu_with_markers(&out, &mut rx, None, &mut buf)
                .unwrap()
                .wire_len,
            16
        );
        let second = parse_fpdu_with_markers(&out[a..a + b], &mut rx, None, &mut buf).unwrap();
        assert_eq!((second.wire_len, second.ulpdu_len), (12, 2));
        assert_eq!(&buf[..2], &[0xbb, 0xbb]);
    }

    #[test]
    fn fpdu_with_several_markers() {
        let mut ulpdu = [0u8; 1200];
        for (i, b) in ulpdu.iter_mut().enumerate() {
            *b = i as u8;
        }
        let mut ms = MarkerState::new();
        let mut out = [0u8; 1300];
        let n = emit_fpdu(&ulpdu, Some(&mut ms), None, &mut out).unwrap();
        assert_eq!(n, 1208 + 12);
        assert_eq!(&out[0..4], &[0, 0, 0, 0]);
        assert_eq!(&out[4..6], &[0x04, 0xb0]);
        assert_eq!(&out[512..516], &[0, 0, 0x01, 0xfc]); // 508
        assert_eq!(&out[1024..1028], &[0, 0, 0x03, 0xfc]); // 1020
        assert_eq!(&out[6..512], &ulpdu[..506]);
        assert_eq!(&out[516..1024], &ulpdu[506..1014]);
        let mut rx = MarkerState::new();
        let mut buf = [0u8; 1200];
        let got = parse_fpdu_with_markers(&out[..n], &mut rx, None, &mut buf).unwrap();
        assert_eq!(got.ulpdu_len, 1200);
        assert_eq!(buf, ulpdu);
        // Too small a destination.
        let mut rx = MarkerState::new();
        assert_eq!(
            parse_fpdu_with_markers(&out[..n], &mut rx, None, &mut buf[..100]),
            Err(MpaError::BufferTooSmall { needed: 1200 })
        );
        // Incomplete input reports what is missing.
        assert_eq!(
            parse_fpdu_with_markers(&out[..5], &mut rx, None, &mut buf),
            Err(MpaError::Incomplete { needed: 1 })
        );
        assert_eq!(
            parse_fpdu_with_markers(&out[..1000], &mut rx, None, &mut buf),
            Err(MpaError::Incomplete { needed: 220 })
        );
        assert_eq!(rx, MarkerState::new());
    }

    /// Emits a stream of FPDUs with markers and checks it independently of
    /// the marker code, then parses it back in random pieces.
    fn stream_round_trip(start: u32, seed: u32, crc_on: bool) {
        const N: usize = 30;
        let mut lens = [0usize; N];
        let mut starts = [0usize; N];
        let mut headers = [0usize; N];
        let mut wire = [0u8; 24 * 1024];
        let mut payload = [0u8; 700];
        let mut seed = seed;
        let mut tx = MarkerState::at(start);
        let mut crc = SoftCrc32c::new();
        let mut off = 0;
        for i in 0..N {
            lens[i] = (xorshift(&mut seed) % 700) as usize;
            for (j, b) in payload[..lens[i]].iter_mut().enumerate() {
                *b = (i * 31 + j) as u8;
            }
            starts[i] = off;
            headers[i] = if start.wrapping_add(off as u32).is_multiple_of(512) {
                off + 4
            } else {
                off
            };
            let engine: Option<&mut dyn CrcEngine> = if crc_on { Some(&mut crc) } else { None };
            off += emit_fpdu(&payload[..lens[i]], Some(&mut tx), engine, &mut wire[off..]).unwrap();
        }
        let total = off;
        assert_eq!(tx.stream_pos(), start.wrapping_add(total as u32));
        // Every multiple of 512 holds a marker pointing at its FPDU.
        let mut markers = 0;
        for m in 0..total {
            if !start.wrapping_add(m as u32).is_multiple_of(512) {
                continue;
            }
            markers += 1;
            let ptr = usize::from(u16::from_be_bytes([wire[m + 2], wire[m + 3]]));
            assert_eq!(&wire[m..m + 2], &[0, 0]);
            let i = (0..N).rev().find(|&i| starts[i] <= m).unwrap();
            if ptr == 0 {
                assert_eq!(headers[i], m + 4, "marker at {m} starts FPDU {i}");
            } else {
                assert_eq!(m - ptr, headers[i], "marker at {m} inside FPDU {i}");
            }
            let len = usize::from(u16::from_be_bytes([wire[headers[i]], wire[headers[i] + 1]]));
            assert_eq!(len, lens[i]);
        }
        assert!(markers >= total / 512);
        // Parse back, receiving in random pieces.
        let mut rx = MarkerState::at(start);
        let mut have = 0;
        let mut done = 0;
        let mut i = 0;
        let mut buf = [0u8; 700];
        while i < N {
            let engine: Option<&mut dyn CrcEngine> = if crc_on { Some(&mut crc) } else { None };
            match parse_fpdu_with_markers(&wire[done..have], &mut rx, engine, &mut buf) {
                Ok(f) => {
                    assert_eq!(f.ulpdu_len, lens[i]);
                    for (j, b) in buf[..f.ulpdu_len].iter().enumerate() {
                        assert_eq!(*b, (i * 31 + j) as u8);
                    }
                    done += f.wire_len;
                    i += 1;
                }
                Err(MpaError::Incomplete { needed }) => {
                    assert!(needed > 0);
                    assert!(have + needed <= total);
                    have = (have + 1 + (xorshift(&mut seed) % 900) as usize).min(total);
                }
                Err(e) => panic!("FPDU {i}: {e:?}"),
            }
        }
        assert_eq!(done, total);
        assert_eq!(rx, tx);
    }

    #[test]
    fn marker_streams() {
        stream_round_trip(0, 1, false);
        stream_round_trip(0, 2, true);
        stream_round_trip(12, 3, true);
        stream_round_trip(508, 4, false);
        stream_round_trip(0u32.wrapping_sub(3000), 5, true);
        stream_round_trip(0u32.wrapping_sub(4), 6, false);
    }

    #[test]
    fn granular_marker_api_matches_emit() {
        // Build FPDUs with take_marker/advance only and compare with
        // emit_fpdu; then receive one octet at a time with strip_marker.
        let sizes = [3usize, 600, 0, 505, 1, 1021, 77];
        let mut a = [0u8; 4096];
        let mut b = [0u8; 4096];
        let mut ms_a = MarkerState::at(256);
        let mut ms_b = MarkerState::at(256);
        let mut na = 0;
        let mut nb = 0;
        let data = [0x42u8; 1100];
        for &s in &sizes {
            na += emit_fpdu(&data[..s], Some(&mut ms_a), None, &mut a[na..]).unwrap();
            // Framed octets, no markers.
            let mut framed = [0u8; 1200];
            let flen = fpdu_len(s as u16);
            framed[..2].copy_from_slice(&(s as u16).to_be_bytes());
            framed[2..2 + s].copy_from_slice(&data[..s]);
            ms_b.begin_fpdu();
            let mut k = 0;
            while k < flen {
                if ms_b.marker_due() {
                    let m = ms_b.take_marker().unwrap();
                    b[nb..nb + 4].copy_from_slice(&m);
                    nb += 4;
                    continue;
                }
                let n = (ms_b.bytes_before_marker() as usize).min(flen - k);
                b[nb..nb + n].copy_from_slice(&framed[k..k + n]);
                ms_b.advance(n).unwrap();
                nb += n;
                k += n;
            }
        }
        assert_eq!(na, nb);
        assert_eq!(&a[..na], &b[..nb]);
        assert_eq!(ms_a, ms_b);

        // Octet-at-a-time receive.
        let mut rx = MarkerState::at(256);
        let mut pos = 0;
        for &s in &sizes {
            rx.begin_fpdu();
            let flen = fpdu_len(s as u16);
            let mut framed = [0u8; 1200];
            let mut k = 0;
            while k < flen {
                if rx.marker_due() {
                    rx.strip_marker(&a[pos..pos + 4]).unwrap();
                    pos += 4;
                    continue;
                }
                framed[k] = a[pos];
                rx.advance(1).unwrap();
                pos += 1;
                k += 1;
            }
            assert_eq!(read_ulpdu_length(&framed), Ok(s as u16));
        }
        assert_eq!(pos, na);
        assert_eq!(rx, ms_a);
    }
}
