// SPDX-License-Identifier: GPL-2.0

//! Terminate messages (RFC 5040 section 4.8) and the error codes they carry
//! (RFC 5040 section 7, RFC 5041 section 7, RFC 5044 section 8, RFC 6581).
//!
//! # Wire format
//!
//! A Terminate is an untagged RDMAP message (opcode 0x7, QN 2, MO 0, L = 1;
//! see [`terminate_header`]). Its DDP payload:
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Layer | EType |  Error Code   |M|D|R|        Reserved         |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  DDP Segment Length (if D)    |  Terminated DDP Header (if D) |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+  14 bytes (T = 1) or 18 (T = 0)
//! |  ...  Terminated RDMA Header (if R and the DDP header is an   |
//! |       RDMA Read Request): the 28-byte Read Request header     |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! M: the DDP Segment Length is valid. D: the DDP header of the offending
//! segment is included (preceded by the DDP Segment Length field). R: its
//! RDMAP header is included; for an RDMA Read Request that is the 28-byte Read
//! Request header after the DDP header, for other messages the RDMAP header
//! is part of the DDP header already (upstream siw sets R with just the DDP
//! header for a failed Send with Invalidate). M or R without D is rejected.
//! The reserved bits are sent as zero and ignored on receive, with one
//! exception, upstream siw's layout below.
//!
//! # Upstream siw's layout
//!
//! Upstream siw declares the control field as C bit-fields in the order
//! of the wire, which on a little-endian host puts them in the opposite
//! order: Layer goes to the low nibble of the first octet and EType to the
//! high one, and M, D and R to bits 0, 1 and 2 of the third octet (word
//! bits [`SIW_LE_M`], [`SIW_LE_D`], [`SIW_LE_R`]), inside the reserved
//! field. The rest of its Terminate (the DDP Segment Length and the
//! headers after it) follows the RFC. A control word whose only header
//! control bits are those three, with no RFC one and the other reserved
//! bits clear, is read in that layout (the nibbles swapped), if the
//! swapped triple is defined: no conforming sender sets reserved bits.
//! Without the bits there is no telling the two layouts apart, and the
//! word is read as the RFC's; siw sends no bits for local catastrophic,
//! version and opcode errors only, and those read alike (RDMAP Local
//! Catastrophic and DDP Tagged, whose two nibbles are equal), as an LLP
//! error (siw's RDMAP version and opcode errors, 0/2/5 and 0/2/6, read as
//! MPA's 2/0/5 and 2/0/6) or as undefined (siw's DDP Untagged version
//! error): a remote operation error to a requester, as meant. What the
//! swap corrects is the class that
//! matters to a requester: siw's RDMAP Remote Protection errors (0/1/x,
//! with M, D and R) would read as DDP Local Catastrophic (1/0/x, and for
//! x > 0 undefined), and the failed Read would complete with a remote
//! operation error instead of a remote access error.
//!
//! # Codes
//!
//! [`TermCode`] holds every defined (layer, type, code) triple; undefined
//! ones do not parse. Layer 0 RDMAP: type 0 Local Catastrophic (any code; the
//! code is kept), type 1 Remote Protection ([`RemoteProtectionCode`]), type 2
//! Remote Operation ([`RemoteOperationCode`]). Layer 1 DDP: type 0 Local
//! Catastrophic (code 0), type 1 Tagged Buffer ([`TaggedCode`]), type 2
//! Untagged Buffer ([`UntaggedCode`]). Layer 2 LLP: type 0 MPA
//! ([`MpaCode`]; codes 5 to 7 from RFC 6581).
//!
//! # Which error maps to which code
//!
//! The `From` impls on [`TermCode`] implement this table:
//!
//! | Error (module)                          | Layer/Type/Code | Meaning                              |
//! |-----------------------------------------|-----------------|--------------------------------------|
//! | `ddp::DdpError::Truncated`              | 2/0/0x03        | MPA ULPDU Length mismatch (as siw)   |
//! | `ddp::DdpError::DdpVersion` (T = 1)     | 1/1/0x04        | Tagged: Invalid DDP version          |
//! | `ddp::DdpError::DdpVersion` (T = 0)     | 1/2/0x06        | Untagged: Invalid DDP version        |
//! | `ddp::DdpError::RdmapVersion`           | 0/2/0x05        | Invalid RDMAP version                |
//! | `ddp::UntaggedError::InvalidQn`         | 1/2/0x01        | Invalid QN                           |
//! | `ddp::UntaggedError::MsnNoBuffer`       | 1/2/0x02        | Invalid MSN - no buffer available    |
//! | `ddp::UntaggedError::MsnRange`          | 1/2/0x03        | Invalid MSN - MSN range is not valid |
//! | `ddp::UntaggedError::InvalidMo`         | 1/2/0x04        | Invalid MO                           |
//! | `ddp::UntaggedError::MessageTooLong`    | 1/2/0x05        | DDP Message too long for buffer      |
//! | `ddp::TaggedError::InvalidStag`         | 1/1/0x00        | Invalid STag                         |
//! | `ddp::TaggedError::BaseBounds`          | 1/1/0x01        | Base or bounds violation             |
//! | `ddp::TaggedError::StagNotAssociated`   | 1/1/0x02        | STag not associated with DDP Stream  |
//! | `ddp::TaggedError::ToWrap`              | 1/1/0x03        | TO wrap                              |
//! | `rdmap::RdmapError::UnknownOpcode`      | 0/2/0x06        | Unexpected OpCode                    |
//! | `rdmap::RdmapError::ExtensionDisabled`  | 0/2/0x06        | Unexpected OpCode                    |
//! | `rdmap::RdmapError::TaggedMismatch`     | 0/2/0x06        | Unexpected OpCode                    |
//! | `rdmap::RdmapError::WrongQueue`         | 1/2/0x01        | Invalid QN                           |
//! | `rdmap::RdmapError::NotLast`            | 0/2/0xFF        | Remote Operation: Unspecified        |
//! | `rdmap::RdmapError::PayloadLength`      | 0/2/0xFF        | Remote Operation: Unspecified        |
//! | `rdmap::RdmapError::Truncated`          | 0/2/0xFF        | Remote Operation: Unspecified        |
//! | `rdmap::RdmapError::UnknownAtomicOp`    | 0/2/0xFF        | Remote Operation: Unspecified        |
//!
//! Upstream siw differs in one case: when a Send does not fit the posted
//! buffer it reports 1/2/0x02 ("no buffer") where RFC 5041 names 1/2/0x05.
//!
//! Which headers a Terminate carries for a given code is
//! [`TermCode::header_policy`], which follows what upstream siw sends (and
//! what it can parse: siw only looks past the control field when M is set).

use super::ddp::{
    check_room, get_u16, get_u32, put, ControlField, DdpError, DdpHeader, EmitError, TaggedError,
    UntaggedError, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN,
};
use super::rdmap::{Opcode, RdmapError, ReadRequest, QN_TERMINATE, READ_REQUEST_LEN};

/// Length of the Terminate Control field (layer, type, code, header control
/// bits, reserved).
pub const CONTROL_LEN: usize = 4;
/// Length of the DDP Segment Length field.
pub const SEGMENT_LENGTH_LEN: usize = 2;
/// Largest Terminate payload: control, segment length, untagged DDP header,
/// Read Request header.
pub const MAX_LEN: usize =
    CONTROL_LEN + SEGMENT_LENGTH_LEN + UNTAGGED_HEADER_LEN + READ_REQUEST_LEN;

/// Terminate Control bit M: DDP Segment Length valid.
pub const HDRCT_M: u32 = 0x0000_8000;
/// Terminate Control bit D: DDP header included.
pub const HDRCT_D: u32 = 0x0000_4000;
/// Terminate Control bit R: RDMAP header included.
pub const HDRCT_R: u32 = 0x0000_2000;
/// Terminate Control reserved bits.
pub const HDRCT_RESERVED_MASK: u32 = 0x0000_1fff;
/// Where upstream siw on a little-endian host puts M (see "Upstream siw's
/// layout" above): in the reserved bits.
pub const SIW_LE_M: u32 = 0x0000_0100;
/// Where upstream siw on a little-endian host puts D.
pub const SIW_LE_D: u32 = 0x0000_0200;
/// Where upstream siw on a little-endian host puts R.
pub const SIW_LE_R: u32 = 0x0000_0400;

/// Defines a `u8` wire enum with `ALL`, `from_u8` and `value`.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )* }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value, )*
        }

        impl $name {
            /// Every defined value, in wire order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The variant with wire value `v`, or `None` if `v` is undefined.
            pub const fn from_u8(v: u8) -> Option<Self> {
                $( if v == $value { return Some($name::$variant); } )*
                None
            }

            /// The wire value.
            pub const fn value(self) -> u8 {
                self as u8
            }
        }
    };
}

wire_enum! {
    /// The layer that detected the error (Terminate Control, 4 bits).
    Layer {
        /// RDMAP (RFC 5040).
        Rdmap = 0x0,
        /// DDP (RFC 5041).
        Ddp = 0x1,
        /// The LLP, here MPA (RFC 5044).
        Llp = 0x2,
    }
}

wire_enum! {
    /// RDMAP error types (layer 0).
    RdmapErrorType {
        /// Local Catastrophic Error.
        LocalCatastrophic = 0x0,
        /// Remote Protection Error.
        RemoteProtection = 0x1,
        /// Remote Operation Error.
        RemoteOperation = 0x2,
    }
}

wire_enum! {
    /// DDP error types (layer 1).
    DdpErrorType {
        /// Local Catastrophic Error.
        LocalCatastrophic = 0x0,
        /// Tagged Buffer Error.
        TaggedBuffer = 0x1,
        /// Untagged Buffer Error.
        UntaggedBuffer = 0x2,
    }
}

wire_enum! {
    /// LLP error types (layer 2).
    LlpErrorType {
        /// MPA error.
        Mpa = 0x0,
    }
}

wire_enum! {
    /// RDMAP Remote Protection Error codes (layer 0, type 1).
    RemoteProtectionCode {
        /// Invalid STag.
        InvalidStag = 0x00,
        /// Base or bounds violation.
        BaseBounds = 0x01,
        /// Access rights violation.
        AccessRights = 0x02,
        /// STag not associated with RDMAP Stream.
        StagNotAssociated = 0x03,
        /// TO wrap.
        ToWrap = 0x04,
        /// STag cannot be invalidated.
        CannotInvalidate = 0x09,
        /// Unspecified error.
        Unspecified = 0xff,
    }
}

wire_enum! {
    /// RDMAP Remote Operation Error codes (layer 0, type 2).
    RemoteOperationCode {
        /// Invalid RDMAP version.
        InvalidVersion = 0x05,
        /// Unexpected OpCode.
        UnexpectedOpcode = 0x06,
        /// Catastrophic error, localized to RDMAP Stream.
        CatastrophicStream = 0x07,
        /// Catastrophic error, global.
        CatastrophicGlobal = 0x08,
        /// STag cannot be invalidated.
        CannotInvalidate = 0x09,
        /// Unspecified error.
        Unspecified = 0xff,
    }
}

wire_enum! {
    /// DDP Tagged Buffer Error codes (layer 1, type 1).
    TaggedCode {
        /// Invalid STag.
        InvalidStag = 0x00,
        /// Base or bounds violation.
        BaseBounds = 0x01,
        /// STag not associated with DDP Stream.
        StagNotAssociated = 0x02,
        /// TO wrap.
        ToWrap = 0x03,
        /// Invalid DDP version.
        InvalidVersion = 0x04,
    }
}

wire_enum! {
    /// DDP Untagged Buffer Error codes (layer 1, type 2).
    UntaggedCode {
        /// Invalid QN.
        InvalidQn = 0x01,
        /// Invalid MSN - no buffer available.
        MsnNoBuffer = 0x02,
        /// Invalid MSN - MSN range is not valid.
        MsnRange = 0x03,
        /// Invalid MO.
        InvalidMo = 0x04,
        /// DDP Message too long for available buffer.
        MessageTooLong = 0x05,
        /// Invalid DDP version.
        InvalidVersion = 0x06,
    }
}

wire_enum! {
    /// MPA error codes (layer 2, type 0): RFC 5044 codes 1 to 4, RFC 6581
    /// (enhanced connection establishment) codes 5 to 7.
    MpaCode {
        /// TCP connection closed, terminated or lost.
        ConnectionLost = 0x01,
        /// MPA CRC error.
        CrcError = 0x02,
        /// MPA Marker and ULPDU Length field mismatch.
        MarkerMismatch = 0x03,
        /// Invalid MPA Request Frame or MPA Response Frame.
        InvalidRequestResponse = 0x04,
        /// Local catastrophic error (RFC 6581).
        LocalCatastrophic = 0x05,
        /// Insufficient IRD resources (RFC 6581).
        InsufficientIrd = 0x06,
        /// No matching RTR option (RFC 6581).
        NoMatchingRtr = 0x07,
    }
}

/// A defined (layer, error type, error code) triple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TermCode {
    /// RDMAP Local Catastrophic Error; the code is not specified by RFC 5040
    /// (any value is valid and kept; upstream siw sends 0xFF).
    RdmapLocalCatastrophic(u8),
    /// RDMAP Remote Protection Error.
    RdmapRemoteProtection(RemoteProtectionCode),
    /// RDMAP Remote Operation Error.
    RdmapRemoteOperation(RemoteOperationCode),
    /// DDP Local Catastrophic Error (code 0x00).
    DdpLocalCatastrophic,
    /// DDP Tagged Buffer Error.
    DdpTagged(TaggedCode),
    /// DDP Untagged Buffer Error.
    DdpUntagged(UntaggedCode),
    /// MPA error.
    Mpa(MpaCode),
}

/// Which headers of the offending segment a Terminate carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderPolicy {
    /// None (the segment's layout is unknown, or the error is not about a
    /// segment).
    Nothing,
    /// The DDP header with its segment length (M and D set).
    Ddp,
    /// The DDP header and the RDMAP header (M, D and R set).
    DdpAndRdmap,
}

impl TermCode {
    /// The error's layer.
    pub const fn layer(self) -> Layer {
        match self {
            TermCode::RdmapLocalCatastrophic(_)
            | TermCode::RdmapRemoteProtection(_)
            | TermCode::RdmapRemoteOperation(_) => Layer::Rdmap,
            TermCode::DdpLocalCatastrophic | TermCode::DdpTagged(_) | TermCode::DdpUntagged(_) => {
                Layer::Ddp
            }
            TermCode::Mpa(_) => Layer::Llp,
        }
    }

    /// The 4-bit error type.
    pub const fn error_type(self) -> u8 {
        match self {
            TermCode::RdmapLocalCatastrophic(_) => RdmapErrorType::LocalCatastrophic.value(),
            TermCode::RdmapRemoteProtection(_) => RdmapErrorType::RemoteProtection.value(),
            TermCode::RdmapRemoteOperation(_) => RdmapErrorType::RemoteOperation.value(),
            TermCode::DdpLocalCatastrophic => DdpErrorType::LocalCatastrophic.value(),
            TermCode::DdpTagged(_) => DdpErrorType::TaggedBuffer.value(),
            TermCode::DdpUntagged(_) => DdpErrorType::UntaggedBuffer.value(),
            TermCode::Mpa(_) => LlpErrorType::Mpa.value(),
        }
    }

    /// The 8-bit error code.
    pub const fn error_code(self) -> u8 {
        match self {
            TermCode::RdmapLocalCatastrophic(c) => c,
            TermCode::RdmapRemoteProtection(c) => c.value(),
            TermCode::RdmapRemoteOperation(c) => c.value(),
            TermCode::DdpLocalCatastrophic => 0x00,
            TermCode::DdpTagged(c) => c.value(),
            TermCode::DdpUntagged(c) => c.value(),
            TermCode::Mpa(c) => c.value(),
        }
    }

    /// The three wire values: (layer, error type, error code).
    pub const fn wire(self) -> (u8, u8, u8) {
        (self.layer().value(), self.error_type(), self.error_code())
    }

    /// The code for a wire triple, or `None` if the triple is undefined.
    pub const fn from_wire(layer: u8, etype: u8, code: u8) -> Option<Self> {
        let Some(layer) = Layer::from_u8(layer) else {
            return None;
        };
        match layer {
            Layer::Rdmap => match RdmapErrorType::from_u8(etype) {
                Some(RdmapErrorType::LocalCatastrophic) => {
                    Some(TermCode::RdmapLocalCatastrophic(code))
                }
                Some(RdmapErrorType::RemoteProtection) => match RemoteProtectionCode::from_u8(code)
                {
                    Some(c) => Some(TermCode::RdmapRemoteProtection(c)),
                    None => None,
                },
                Some(RdmapErrorType::RemoteOperation) => match RemoteOperationCode::from_u8(code) {
                    Some(c) => Some(TermCode::RdmapRemoteOperation(c)),
                    None => None,
                },
                None => None,
            },
            Layer::Ddp => match DdpErrorType::from_u8(etype) {
                Some(DdpErrorType::LocalCatastrophic) if code == 0 => {
                    Some(TermCode::DdpLocalCatastrophic)
                }
                Some(DdpErrorType::LocalCatastrophic) => None,
                Some(DdpErrorType::TaggedBuffer) => match TaggedCode::from_u8(code) {
                    Some(c) => Some(TermCode::DdpTagged(c)),
                    None => None,
                },
                Some(DdpErrorType::UntaggedBuffer) => match UntaggedCode::from_u8(code) {
                    Some(c) => Some(TermCode::DdpUntagged(c)),
                    None => None,
                },
                None => None,
            },
            Layer::Llp => match (LlpErrorType::from_u8(etype), MpaCode::from_u8(code)) {
                (Some(LlpErrorType::Mpa), Some(c)) => Some(TermCode::Mpa(c)),
                _ => None,
            },
        }
    }

    /// Which headers of the offending segment to report with this code,
    /// as upstream siw does: nothing for local catastrophic RDMAP errors, MPA
    /// errors, and version or opcode errors (the segment's layout is
    /// unknown); DDP and RDMAP headers for Remote Protection errors; the DDP
    /// header for everything else.
    pub const fn header_policy(self) -> HeaderPolicy {
        match self {
            TermCode::RdmapLocalCatastrophic(_) | TermCode::Mpa(_) => HeaderPolicy::Nothing,
            TermCode::RdmapRemoteOperation(RemoteOperationCode::InvalidVersion)
            | TermCode::RdmapRemoteOperation(RemoteOperationCode::UnexpectedOpcode)
            | TermCode::DdpTagged(TaggedCode::InvalidVersion)
            | TermCode::DdpUntagged(UntaggedCode::InvalidVersion) => HeaderPolicy::Nothing,
            TermCode::RdmapRemoteProtection(_) => HeaderPolicy::DdpAndRdmap,
            TermCode::RdmapRemoteOperation(_)
            | TermCode::DdpLocalCatastrophic
            | TermCode::DdpTagged(_)
            | TermCode::DdpUntagged(_) => HeaderPolicy::Ddp,
        }
    }
}

impl From<DdpError> for TermCode {
    fn from(e: DdpError) -> Self {
        match e {
            DdpError::Truncated { .. } => TermCode::Mpa(MpaCode::MarkerMismatch),
            DdpError::DdpVersion { tagged: true, .. } => {
                TermCode::DdpTagged(TaggedCode::InvalidVersion)
            }
            DdpError::DdpVersion { tagged: false, .. } => {
                TermCode::DdpUntagged(UntaggedCode::InvalidVersion)
            }
            DdpError::RdmapVersion { .. } => {
                TermCode::RdmapRemoteOperation(RemoteOperationCode::InvalidVersion)
            }
        }
    }
}

impl From<UntaggedError> for TermCode {
    fn from(e: UntaggedError) -> Self {
        TermCode::DdpUntagged(match e {
            UntaggedError::InvalidQn(_) => UntaggedCode::InvalidQn,
            UntaggedError::MsnNoBuffer { .. } => UntaggedCode::MsnNoBuffer,
            UntaggedError::MsnRange { .. } => UntaggedCode::MsnRange,
            UntaggedError::InvalidMo { .. } => UntaggedCode::InvalidMo,
            UntaggedError::MessageTooLong { .. } => UntaggedCode::MessageTooLong,
        })
    }
}

impl From<TaggedError> for TermCode {
    fn from(e: TaggedError) -> Self {
        TermCode::DdpTagged(match e {
            TaggedError::InvalidStag(_) => TaggedCode::InvalidStag,
            TaggedError::BaseBounds => TaggedCode::BaseBounds,
            TaggedError::StagNotAssociated(_) => TaggedCode::StagNotAssociated,
            TaggedError::ToWrap => TaggedCode::ToWrap,
        })
    }
}

impl From<RdmapError> for TermCode {
    fn from(e: RdmapError) -> Self {
        match e {
            RdmapError::UnknownOpcode(_)
            | RdmapError::ExtensionDisabled(_)
            | RdmapError::TaggedMismatch { .. } => {
                TermCode::RdmapRemoteOperation(RemoteOperationCode::UnexpectedOpcode)
            }
            RdmapError::WrongQueue { .. } => TermCode::DdpUntagged(UntaggedCode::InvalidQn),
            RdmapError::NotLast(_)
            | RdmapError::PayloadLength { .. }
            | RdmapError::Truncated { .. }
            | RdmapError::UnknownAtomicOp(_) => {
                TermCode::RdmapRemoteOperation(RemoteOperationCode::Unspecified)
            }
        }
    }
}

/// Why a Terminate payload could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TerminateError {
    /// The payload is shorter than its header control bits announce.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The (layer, type, code) triple is not defined.
    UndefinedCode {
        /// Layer received.
        layer: u8,
        /// Error type received.
        etype: u8,
        /// Error code received.
        code: u8,
    },
    /// M or R set without D.
    InconsistentHeaderControl(HeaderControl),
}

/// The M, D and R bits of the Terminate Control field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeaderControl {
    /// M: the DDP Segment Length field is valid.
    pub m: bool,
    /// D: the Terminated DDP Header (and the DDP Segment Length) is included.
    pub d: bool,
    /// R: the Terminated RDMA Header is included.
    pub r: bool,
}

/// The 4-byte Terminate Control field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TerminateControl {
    /// Layer, error type and error code.
    pub code: TermCode,
    /// Header control bits.
    pub hdrct: HeaderControl,
}

impl TerminateControl {
    /// Parses the control field at the start of `bytes`. Use this alone to
    /// learn the error of a Terminate whose remainder does not parse.
    pub fn parse(bytes: &[u8]) -> Result<Self, TerminateError> {
        let word = get_u32(bytes, 0).ok_or(TerminateError::Truncated {
            needed: CONTROL_LEN,
            available: bytes.len(),
        })?;
        let hi = (word >> 28) as u8;
        let lo = ((word >> 24) & 0xf) as u8;
        let code = ((word >> 16) & 0xff) as u8;
        if let Some(c) = Self::siw_le(word, hi, lo, code) {
            return Ok(c);
        }
        let (layer, etype) = (hi, lo);
        let code = TermCode::from_wire(layer, etype, code)
            .ok_or(TerminateError::UndefinedCode { layer, etype, code })?;
        Ok(TerminateControl {
            code,
            hdrct: HeaderControl {
                m: word & HDRCT_M != 0,
                d: word & HDRCT_D != 0,
                r: word & HDRCT_R != 0,
            },
        })
    }

    /// `word` read in upstream siw's little-endian layout, if it bears
    /// that layout's header control bits and nothing else outside the
    /// code, and the swapped triple is defined.
    fn siw_le(word: u32, hi: u8, lo: u8, code: u8) -> Option<Self> {
        let siw_bits = SIW_LE_M | SIW_LE_D | SIW_LE_R;
        if word & siw_bits == 0 || word & 0xffff & !siw_bits != 0 {
            return None;
        }
        Some(TerminateControl {
            code: TermCode::from_wire(lo, hi, code)?,
            hdrct: HeaderControl {
                m: word & SIW_LE_M != 0,
                d: word & SIW_LE_D != 0,
                r: word & SIW_LE_R != 0,
            },
        })
    }

    /// The 32-bit wire word (reserved bits zero).
    pub const fn word(&self) -> u32 {
        let (layer, etype, code) = self.code.wire();
        let mut w = ((layer as u32) << 28) | ((etype as u32) << 24) | ((code as u32) << 16);
        if self.hdrct.m {
            w |= HDRCT_M;
        }
        if self.hdrct.d {
            w |= HDRCT_D;
        }
        if self.hdrct.r {
            w |= HDRCT_R;
        }
        w
    }

    /// Writes the control field at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        check_room(buf, CONTROL_LEN)?;
        put(buf, 0, &self.word().to_be_bytes())?;
        Ok(CONTROL_LEN)
    }
}

/// A verbatim copy of the DDP header (14 or 18 bytes, per its T flag) of the
/// segment a Terminate reports. Kept raw so that headers which do not parse
/// (bad versions, reserved opcodes) are reported exactly as received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeaderCopy {
    /// The copied bytes; past a tagged header's 14 bytes, zero.
    bytes: [u8; UNTAGGED_HEADER_LEN],
}

impl HeaderCopy {
    /// Copies the header at the start of `segment` (the bytes after MPA's
    /// ULPDU_Length); `None` if `segment` is shorter than the header its T
    /// flag announces.
    pub fn from_segment(segment: &[u8]) -> Option<Self> {
        let first = *segment.first()?;
        let len = ControlField(u16::from(first) << 8).header_len();
        let src = segment.get(..len)?;
        let mut bytes = [0u8; UNTAGGED_HEADER_LEN];
        for (d, s) in bytes.iter_mut().zip(src) {
            *d = *s;
        }
        Some(HeaderCopy { bytes })
    }

    /// The copy of an emitted `header`.
    pub fn from_header(header: &DdpHeader) -> Result<Self, EmitError> {
        let mut bytes = [0u8; UNTAGGED_HEADER_LEN];
        header.emit(&mut bytes)?;
        Ok(HeaderCopy { bytes })
    }

    /// The copied bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len()).unwrap_or(&self.bytes)
    }

    /// The copied header's length (14 or 18, from its T flag).
    pub const fn len(&self) -> usize {
        self.control().header_len()
    }

    /// Always false: a copy holds at least a tagged header.
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// The copied header's control field.
    pub const fn control(&self) -> ControlField {
        ControlField(u16::from_be_bytes([self.bytes[0], self.bytes[1]]))
    }

    /// Parses the copied header.
    pub fn header(&self) -> Result<DdpHeader, DdpError> {
        DdpHeader::parse(self.as_bytes())
    }

    /// Whether the copied header is an untagged RDMA Read Request, whose
    /// Read Request header follows it when R is set.
    pub const fn is_read_request(&self) -> bool {
        let c = self.control();
        !c.tagged() && c.opcode() == Opcode::RdmaReadRequest.value()
    }
}

/// The DDP payload of a Terminate message.
///
/// Invariants (checked by [`TerminateRepr::emit`], guaranteed by
/// [`TerminateRepr::parse`]): `hdrct.d` iff `ddp_header` is present; M and R
/// only with D; `read_request` present iff R is set and the copied header is
/// a Read Request; `ddp_segment_length` zero without D.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TerminateRepr {
    /// Layer, error type and error code.
    pub code: TermCode,
    /// Header control bits as on the wire.
    pub hdrct: HeaderControl,
    /// The DDP Segment Length field (present with D, meaningful with M):
    /// the length of the offending segment. The value is the caller's
    /// choice; note that upstream siw puts the segment's payload length here
    /// (its ULPDU length minus the DDP/RDMAP header).
    pub ddp_segment_length: u16,
    /// The offending segment's DDP header (D).
    pub ddp_header: Option<HeaderCopy>,
    /// The offending RDMA Read Request's header (R).
    pub read_request: Option<ReadRequest>,
}

impl TerminateRepr {
    /// A Terminate with no headers attached.
    pub const fn new(code: TermCode) -> Self {
        TerminateRepr {
            code,
            hdrct: HeaderControl {
                m: false,
                d: false,
                r: false,
            },
            ddp_segment_length: 0,
            ddp_header: None,
            read_request: None,
        }
    }

    /// A Terminate reporting `code` for the received `segment` (its bytes
    /// from the DDP control field on, header and payload), attaching what
    /// [`TermCode::header_policy`] says. Attaches less when `segment` is too
    /// short to copy from. `ddp_segment_length` goes into the DDP Segment
    /// Length field (M is set whenever a header is attached).
    pub fn for_segment(code: TermCode, segment: &[u8], ddp_segment_length: u16) -> Self {
        let mut t = TerminateRepr::new(code);
        let policy = code.header_policy();
        if matches!(policy, HeaderPolicy::Nothing) {
            return t;
        }
        let Some(copy) = HeaderCopy::from_segment(segment) else {
            return t;
        };
        t.hdrct.m = true;
        t.hdrct.d = true;
        t.ddp_segment_length = ddp_segment_length;
        t.ddp_header = Some(copy);
        if matches!(policy, HeaderPolicy::DdpAndRdmap) {
            if copy.is_read_request() {
                if let Some(rr) = segment
                    .get(copy.len()..)
                    .and_then(|p| ReadRequest::parse(p).ok())
                {
                    t.hdrct.r = true;
                    t.read_request = Some(rr);
                }
            } else {
                t.hdrct.r = true;
            }
        }
        t
    }

    /// Parses a Terminate payload (the bytes after the Terminate's own DDP
    /// header). Trailing bytes are ignored.
    pub fn parse(bytes: &[u8]) -> Result<Self, TerminateError> {
        let ctrl = TerminateControl::parse(bytes)?;
        let h = ctrl.hdrct;
        if !h.d && (h.m || h.r) {
            return Err(TerminateError::InconsistentHeaderControl(h));
        }
        let mut t = TerminateRepr {
            code: ctrl.code,
            hdrct: h,
            ddp_segment_length: 0,
            ddp_header: None,
            read_request: None,
        };
        if !h.d {
            return Ok(t);
        }
        let truncated = |needed: usize| TerminateError::Truncated {
            needed,
            available: bytes.len(),
        };
        let hdr_at = CONTROL_LEN + SEGMENT_LENGTH_LEN;
        t.ddp_segment_length = get_u16(bytes, CONTROL_LEN).ok_or(truncated(hdr_at + 1))?;
        let rest = bytes.get(hdr_at..).unwrap_or(&[]);
        let copy = match HeaderCopy::from_segment(rest) {
            Some(c) => c,
            None => {
                let want = match rest.first() {
                    Some(b) if b & 0x80 != 0 => TAGGED_HEADER_LEN,
                    Some(_) => UNTAGGED_HEADER_LEN,
                    None => 1,
                };
                return Err(truncated(hdr_at.saturating_add(want)));
            }
        };
        t.ddp_header = Some(copy);
        if h.r && copy.is_read_request() {
            let rr_at = hdr_at.saturating_add(copy.len());
            let rr = bytes
                .get(rr_at..)
                .and_then(|p| ReadRequest::parse(p).ok())
                .ok_or(truncated(rr_at.saturating_add(READ_REQUEST_LEN)))?;
            t.read_request = Some(rr);
        }
        Ok(t)
    }

    /// Whether the invariants listed on the type hold.
    pub fn is_consistent(&self) -> bool {
        let h = self.hdrct;
        let rr_expected = h.r && self.ddp_header.is_some_and(|c| c.is_read_request());
        h.d == self.ddp_header.is_some()
            && (h.d || (!h.m && !h.r && self.ddp_segment_length == 0))
            && rr_expected == self.read_request.is_some()
    }

    /// Length of the payload on the wire.
    pub fn buffer_len(&self) -> usize {
        let mut n = CONTROL_LEN;
        if let Some(c) = self.ddp_header {
            n = n.saturating_add(SEGMENT_LENGTH_LEN).saturating_add(c.len());
        }
        if self.read_request.is_some() {
            n = n.saturating_add(READ_REQUEST_LEN);
        }
        n
    }

    /// Writes the payload at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        if !self.is_consistent() {
            return Err(EmitError::Inconsistent);
        }
        let len = self.buffer_len();
        check_room(buf, len)?;
        let ctrl = TerminateControl {
            code: self.code,
            hdrct: self.hdrct,
        };
        let mut at = ctrl.emit(buf)?;
        if let Some(c) = self.ddp_header {
            put(buf, at, &self.ddp_segment_length.to_be_bytes())?;
            at = at.saturating_add(SEGMENT_LENGTH_LEN);
            put(buf, at, c.as_bytes())?;
            at = at.saturating_add(c.len());
        }
        if let Some(rr) = self.read_request {
            let tail = buf.get_mut(at..).ok_or(EmitError::BufferTooShort {
                needed: len,
                available: at,
            })?;
            at = at.saturating_add(rr.emit(tail)?);
        }
        Ok(at)
    }

    /// Length of the whole Terminate message: its DDP header and payload (the
    /// MPA ULPDU_Length).
    pub fn message_len(&self) -> usize {
        UNTAGGED_HEADER_LEN.saturating_add(self.buffer_len())
    }

    /// Writes the whole Terminate message (DDP header from
    /// [`terminate_header`] with `msn`, then the payload) at the start of
    /// `buf`; returns its length.
    pub fn emit_message(&self, msn: u32, buf: &mut [u8]) -> Result<usize, EmitError> {
        if !self.is_consistent() {
            return Err(EmitError::Inconsistent);
        }
        check_room(buf, self.message_len())?;
        let n = terminate_header(msn).emit(buf)?;
        let tail = buf.get_mut(n..).ok_or(EmitError::BufferTooShort {
            needed: self.message_len(),
            available: n,
        })?;
        Ok(n.saturating_add(self.emit(tail)?))
    }
}

/// The DDP header of a Terminate message: untagged, L set, opcode 0x7, QN 2,
/// the given MSN (the Terminate queue's, 1 for the first and normally only
/// Terminate; upstream siw always sends 1 and checks it on receive), MO 0.
pub const fn terminate_header(msn: u32) -> DdpHeader {
    DdpHeader::untagged(Opcode::Terminate.value(), true, 0, QN_TERMINATE, msn, 0)
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::super::ddp::{self, DdpError, TaggedError, UntaggedError};
    use super::super::rdmap::{self, Extensions, RdmapError};
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    /// Every defined code with its Terminate Control bytes (M = D = R = 0),
    /// written from the tables of RFC 5040 section 7, RFC 5041 section 7,
    /// RFC 5044 section 8 and RFC 6581.
    fn code_vectors() -> Vec<(TermCode, [u8; 4])> {
        use MpaCode as M;
        use RemoteOperationCode as O;
        use RemoteProtectionCode as P;
        use TaggedCode as T;
        use UntaggedCode as U;
        std::vec![
            (TermCode::RdmapLocalCatastrophic(0x00), [0x00, 0x00, 0, 0]),
            (TermCode::RdmapLocalCatastrophic(0xff), [0x00, 0xff, 0, 0]),
            (
                TermCode::RdmapRemoteProtection(P::InvalidStag),
                [0x01, 0x00, 0, 0]
            ),
            (
                TermCode::RdmapRemoteProtection(P::BaseBounds),
                [0x01, 0x01, 0, 0]
            ),
            (
                TermCode::RdmapRemoteProtection(P::AccessRights),
                [0x01, 0x02, 0, 0]
            ),
            (
                TermCode::RdmapRemoteProtection(P::StagNotAssociated),
                [0x01, 0x03, 0, 0]
            ),
            (
                TermCode::RdmapRemoteProtection(P::ToWrap),
                [0x01, 0x04, 0, 0]
            ),
            (
                TermCode::RdmapRemoteProtection(P::CannotInvalidate),
                [0x01, 0x09, 0, 0]
            ),
            (
                TermCode::RdmapRemoteProtection(P::Unspecified),
                [0x01, 0xff, 0, 0]
            ),
            (
                TermCode::RdmapRemoteOperation(O::InvalidVersion),
                [0x02, 0x05, 0, 0]
            ),
            (
                TermCode::RdmapRemoteOperation(O::UnexpectedOpcode),
                [0x02, 0x06, 0, 0]
            ),
            (
                TermCode::RdmapRemoteOperation(O::CatastrophicStream),
                [0x02, 0x07, 0, 0]
            ),
            (
                TermCode::RdmapRemoteOperation(O::CatastrophicGlobal),
                [0x02, 0x08, 0, 0]
            ),
            (
                TermCode::RdmapRemoteOperation(O::CannotInvalidate),
                [0x02, 0x09, 0, 0]
            ),
            (
                TermCode::RdmapRemoteOperation(O::Unspecified),
                [0x02, 0xff, 0, 0]
            ),
            (TermCode::DdpLocalCatastrophic, [0x10, 0x00, 0, 0]),
            (TermCode::DdpTagged(T::InvalidStag), [0x11, 0x00, 0, 0]),
            (TermCode::DdpTagged(T::BaseBounds), [0x11, 0x01, 0, 0]),
            (
                TermCode::DdpTagged(T::StagNotAssociated),
                [0x11, 0x02, 0, 0]
            ),
            (TermCode::DdpTagged(T::ToWrap), [0x11, 0x03, 0, 0]),
            (TermCode::DdpTagged(T::InvalidVersion), [0x11, 0x04, 0, 0]),
            (TermCode::DdpUntagged(U::InvalidQn), [0x12, 0x01, 0, 0]),
            (TermCode::DdpUntagged(U::MsnNoBuffer), [0x12, 0x02, 0, 0]),
            (TermCode::DdpUntagged(U::MsnRange), [0x12, 0x03, 0, 0]),
            (TermCode::DdpUntagged(U::InvalidMo), [0x12, 0x04, 0, 0]),
            (TermCode::DdpUntagged(U::MessageTooLong), [0x12, 0x05, 0, 0]),
            (TermCode::DdpUntagged(U::InvalidVersion), [0x12, 0x06, 0, 0]),
            (TermCode::Mpa(M::ConnectionLost), [0x20, 0x01, 0, 0]),
            (TermCode::Mpa(M::CrcError), [0x20, 0x02, 0, 0]),
            (TermCode::Mpa(M::MarkerMismatch), [0x20, 0x03, 0, 0]),
            (TermCode::Mpa(M::InvalidRequestResponse), [0x20, 0x04, 0, 0]),
            (TermCode::Mpa(M::LocalCatastrophic), [0x20, 0x05, 0, 0]),
            (TermCode::Mpa(M::InsufficientIrd), [0x20, 0x06, 0, 0]),
            (TermCode::Mpa(M::NoMatchingRtr), [0x20, 0x07, 0, 0]),
        ]
    }

    #[test]
    fn every_code_vector() {
        let vectors = code_vectors();
        // 2 catastrophic samples + 7 + 6 + 1 + 5 + 6 + 7 defined codes.
        assert_eq!(vectors.len(), 34);
        for (code, bytes) in vectors {
            let c = TerminateControl::parse(&bytes).unwrap();
            assert_eq!(c.code, code);
            assert_eq!(c.hdrct, HeaderControl::default());
            let mut out = [0xaau8; 4];
            assert_eq!(c.emit(&mut out), Ok(4));
            assert_eq!(out, bytes, "{code:?}");
            let (l, e, k) = code.wire();
            assert_eq!((l << 4 | e, k), (bytes[0], bytes[1]));
            assert_eq!(TermCode::from_wire(l, e, k), Some(code));
            let t = TerminateRepr::parse(&bytes).unwrap();
            assert_eq!(t, TerminateRepr::new(code));
        }
    }

    #[test]
    fn undefined_triples_rejected() {
        let mut defined = 0;
        for layer in 0..16u8 {
            for etype in 0..16u8 {
                for code in 0..=255u8 {
                    match TermCode::from_wire(layer, etype, code) {
                        Some(c) => {
                            defined += 1;
                            assert_eq!(c.wire(), (layer, etype, code));
                        }
                        None => {
                            let bytes = [layer << 4 | etype, code, 0, 0];
                            assert_eq!(
                                TerminateControl::parse(&bytes),
                                Err(TerminateError::UndefinedCode { layer, etype, code })
                            );
                        }
                    }
                }
            }
        }
        // 256 RDMAP Local Catastrophic codes + 32 other defined triples.
        assert_eq!(defined, 256 + 7 + 6 + 1 + 5 + 6 + 7);
        // Reserved DDP error type 3 ("reserved for the LLP") is undefined.
        assert_eq!(TermCode::from_wire(1, 3, 0), None);
        assert_eq!(TermCode::from_wire(1, 0, 1), None);
        assert_eq!(TermCode::from_wire(2, 0, 0), None);
        assert_eq!(TermCode::from_wire(2, 0, 8), None);
        assert_eq!(TermCode::from_wire(2, 1, 1), None);
        assert_eq!(TermCode::from_wire(3, 0, 0), None);
    }

    #[test]
    fn enums_roundtrip() {
        fn check<E: Copy + PartialEq + core::fmt::Debug>(
            all: &[E],
            from: fn(u8) -> Option<E>,
            value: fn(E) -> u8,
        ) {
            for &e in all {
                assert_eq!(from(value(e)), Some(e));
            }
            let defined = (0..=255u8).filter(|v| from(*v).is_some()).count();
            assert_eq!(defined, all.len());
        }
        check(Layer::ALL, Layer::from_u8, Layer::value);
        check(
            RdmapErrorType::ALL,
            RdmapErrorType::from_u8,
            RdmapErrorType::value,
        );
        check(
            DdpErrorType::ALL,
            DdpErrorType::from_u8,
            DdpErrorType::value,
        );
        check(
            LlpErrorType::ALL,
            LlpErrorType::from_u8,
            LlpErrorType::value,
        );
        check(
            RemoteProtectionCode::ALL,
            RemoteProtectionCode::from_u8,
            RemoteProtectionCode::value,
        );
        check(
            RemoteOperationCode::ALL,
            RemoteOperationCode::from_u8,
            RemoteOperationCode::value,
        );
        check(TaggedCode::ALL, TaggedCode::from_u8, TaggedCode::value);
        check(
            UntaggedCode::ALL,
            UntaggedCode::from_u8,
            UntaggedCode::value,
        );
        check(MpaCode::ALL, MpaCode::from_u8, MpaCode::value);
        assert_eq!(Layer::Llp.value(), 2);
        assert_eq!(TermCode::Mpa(MpaCode::CrcError).layer(), Layer::Llp);
        assert_eq!(TermCode::DdpLocalCatastrophic.layer(), Layer::Ddp);
        assert_eq!(TermCode::RdmapLocalCatastrophic(3).layer(), Layer::Rdmap);
    }

    #[test]
    fn header_control_bits() {
        // M = 0x80, D = 0x40, R = 0x20 of the third byte; reserved ignored.
        let c = TerminateControl::parse(&[0x12, 0x03, 0xc0, 0x00]).unwrap();
        assert_eq!(
            c.hdrct,
            HeaderControl {
                m: true,
                d: true,
                r: false
            }
        );
        let c = TerminateControl::parse(&[0x01, 0x00, 0xe0, 0x00]).unwrap();
        assert_eq!(
            c.hdrct,
            HeaderControl {
                m: true,
                d: true,
                r: true
            }
        );
        let c = TerminateControl::parse(&[0x01, 0x00, 0x40, 0x00]).unwrap();
        assert_eq!(
            c.hdrct,
            HeaderControl {
                m: false,
                d: true,
                r: false
            }
        );
        let c = TerminateControl::parse(&[0x20, 0x02, 0x1f, 0xff]).unwrap();
        assert_eq!(c.hdrct, HeaderControl::default());
        assert_eq!(c.word(), 0x2002_0000);
        assert_eq!(
            TerminateControl::parse(&[0x20, 0x02, 0x00]),
            Err(TerminateError::Truncated {
                needed: 4,
                available: 3
            })
        );
        assert_eq!(
            TerminateControl {
                code: TermCode::Mpa(MpaCode::CrcError),
                hdrct: HeaderControl::default()
            }
            .emit(&mut [0u8; 3]),
            Err(EmitError::BufferTooShort {
                needed: 4,
                available: 3
            })
        );
    }

    /// The Send whose MSN was out of range, as received (DDP header + 4
    /// payload bytes).
    const BAD_SEND: [u8; 22] = [
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, // Send, QN 0, MSN 7, MO 0
        0xde, 0xad, 0xbe, 0xef,
    ];

    #[test]
    fn untagged_ddp_error_message_vector() {
        // Whole Terminate message, laid out as upstream siw sends it.
        let wire: [u8; 42] = [
            // DDP header: untagged, L, RDMAP v1 opcode 7, QN 2, MSN 1, MO 0
            0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0,
            // Terminate Control: DDP(1) Untagged(2), MSN range (3), M D
            0x12, 0x03, 0xc0, 0x00, //
            // DDP Segment Length
            0x00, 0x04, //
            // Terminated DDP Header
            0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0,
        ];
        let h = DdpHeader::parse(&wire).unwrap();
        assert_eq!(h, terminate_header(1));
        assert_eq!(rdmap::validate(&h, Extensions::NONE), Ok(Opcode::Terminate));
        let t = TerminateRepr::parse(&wire[18..]).unwrap();
        assert_eq!(t.code, TermCode::DdpUntagged(UntaggedCode::MsnRange));
        assert_eq!(
            t.hdrct,
            HeaderControl {
                m: true,
                d: true,
                r: false
            }
        );
        assert_eq!(t.ddp_segment_length, 4);
        assert_eq!(t.ddp_header.unwrap().as_bytes(), &BAD_SEND[..18]);
        assert_eq!(
            t.ddp_header
                .unwrap()
                .header()
                .unwrap()
                .untagged_fields()
                .unwrap()
                .msn,
            7
        );
        assert_eq!(t.read_request, None);

        let built = TerminateRepr::for_segment(
            UntaggedError::MsnRange {
                expected: 1,
                got: 7,
            }
            .into(),
            &BAD_SEND,
            4,
        );
        assert_eq!(built, t);
        let mut out = [0u8; 64];
        assert_eq!(built.emit_message(1, &mut out), Ok(42));
        assert_eq!(out[..42], wire);
        assert_eq!(built.message_len(), 42);
    }

    #[test]
    fn tagged_ddp_error_vector() {
        let write = [
            0xc1, 0x40, 0, 0, 0x10, 0x01, 0, 0, 0, 0, 0, 0, 0x20, 0x00, 1, 2, 3,
        ];
        let wire: [u8; 20] = [
            0x11, 0x01, 0xc0, 0x00, // DDP Tagged, base/bounds, M D
            0x00, 0x03, // segment length
            0xc1, 0x40, 0, 0, 0x10, 0x01, 0, 0, 0, 0, 0, 0, 0x20, 0x00,
        ];
        let t = TerminateRepr::parse(&wire).unwrap();
        assert_eq!(t.code, TermCode::DdpTagged(TaggedCode::BaseBounds));
        assert_eq!(t.ddp_header.unwrap().len(), 14);
        assert!(!t.ddp_header.unwrap().is_empty());
        assert!(t.ddp_header.unwrap().control().tagged());
        assert_eq!(
            TerminateRepr::for_segment(TaggedError::BaseBounds.into(), &write, 3),
            t
        );
        let mut out = [0u8; 20];
        assert_eq!(t.emit(&mut out), Ok(20));
        assert_eq!(out, wire);
    }

    /// An RDMA Read Request (DDP header + Read Request header).
    const RREQ: [u8; 46] = [
        0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0, // QN 1, MSN 3
        0x00, 0x00, 0x00, 0x11, 0, 0, 0, 0, 0, 0, 0x40, 0x00, // sink STag, TO
        0x00, 0x00, 0x20, 0x00, // size
        0x00, 0x00, 0x00, 0x22, 0, 0, 0, 0, 0, 0, 0x80, 0x00, // source STag, TO
    ];

    #[test]
    fn read_request_protection_error_vector() {
        let mut wire = [0u8; 52];
        wire[..6].copy_from_slice(&[0x01, 0x02, 0xe0, 0x00, 0x00, 0x1c]); // access rights, M D R, len 28
        wire[6..].copy_from_slice(&RREQ);
        assert_eq!(MAX_LEN, 52);
        let t = TerminateRepr::parse(&wire).unwrap();
        assert_eq!(
            t.code,
            TermCode::RdmapRemoteProtection(RemoteProtectionCode::AccessRights)
        );
        assert_eq!(
            t.hdrct,
            HeaderControl {
                m: true,
                d: true,
                r: true
            }
        );
        assert!(t.ddp_header.unwrap().is_read_request());
        let rr = t.read_request.unwrap();
        assert_eq!(
            (rr.sink_stag, rr.read_size, rr.source_stag, rr.source_to),
            (0x11, 0x2000, 0x22, 0x8000)
        );
        assert_eq!(
            TerminateRepr::for_segment(
                TermCode::RdmapRemoteProtection(RemoteProtectionCode::AccessRights),
                &RREQ,
                28
            ),
            t
        );
        let mut out = [0u8; 52];
        assert_eq!(t.emit(&mut out), Ok(52));
        assert_eq!(out, wire);
        assert_eq!(t.buffer_len(), 52);
        // Truncated Read Request header.
        assert_eq!(
            TerminateRepr::parse(&wire[..51]),
            Err(TerminateError::Truncated {
                needed: 52,
                available: 51
            })
        );
        // Without R the Read Request header is not expected.
        let mut no_r = wire;
        no_r[2] = 0xc0;
        let t = TerminateRepr::parse(&no_r[..24]).unwrap();
        assert_eq!(t.read_request, None);
        // A truncated Read Request segment loses R when building.
        let t = TerminateRepr::for_segment(
            TermCode::RdmapRemoteProtection(RemoteProtectionCode::ToWrap),
            &RREQ[..40],
            22,
        );
        assert_eq!(
            t.hdrct,
            HeaderControl {
                m: true,
                d: true,
                r: false
            }
        );
        assert!(t.is_consistent());
    }

    #[test]
    fn siw_send_invalidate_protection_error() {
        // siw reports a failed invalidation with M D R and only the Send's
        // 18-byte DDP header (the RDMAP header lives inside it).
        let send_inv = [
            0x41, 0x44, 0x00, 0x00, 0xab, 0xcd, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0,
        ];
        let mut wire = [0u8; 24];
        wire[..6].copy_from_slice(&[0x01, 0x09, 0xe0, 0x00, 0x00, 0x00]);
        wire[6..].copy_from_slice(&send_inv);
        let t = TerminateRepr::parse(&wire).unwrap();
        assert_eq!(
            t.code,
            TermCode::RdmapRemoteProtection(RemoteProtectionCode::CannotInvalidate)
        );
        assert!(t.hdrct.r);
        assert_eq!(t.read_request, None);
        let hdr = t.ddp_header.unwrap().header().unwrap();
        assert_eq!(rdmap::invalidate_stag(&hdr), Some(0xabcd));
        let built = TerminateRepr::for_segment(t.code, &send_inv, 0);
        assert_eq!(built, t);
        let mut out = [0u8; 24];
        assert_eq!(built.emit(&mut out), Ok(24));
        assert_eq!(out, wire);
    }

    #[test]
    fn headerless_terminates() {
        // LLP CRC error: control only.
        let t = TerminateRepr::parse(&[0x20, 0x02, 0x00, 0x00]).unwrap();
        assert_eq!(t, TerminateRepr::new(TermCode::Mpa(MpaCode::CrcError)));
        assert_eq!(TerminateRepr::for_segment(t.code, &BAD_SEND, 4), t);
        // siw's catastrophic RDMAP error.
        let t = TerminateRepr::parse(&[0x00, 0xff, 0x00, 0x00]).unwrap();
        assert_eq!(t.code, TermCode::RdmapLocalCatastrophic(0xff));
        let mut out = [0u8; 22];
        assert_eq!(t.emit_message(1, &mut out), Ok(22));
        assert_eq!(
            out,
            [0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x00, 0xff, 0, 0]
        );
        // Version and opcode errors carry no header.
        for code in [
            TermCode::from(DdpError::DdpVersion {
                tagged: true,
                version: 0,
            }),
            TermCode::from(DdpError::DdpVersion {
                tagged: false,
                version: 2,
            }),
            TermCode::from(DdpError::RdmapVersion { version: 0 }),
            TermCode::from(RdmapError::UnknownOpcode(0xc)),
        ] {
            assert_eq!(code.header_policy(), HeaderPolicy::Nothing);
            assert_eq!(
                TerminateRepr::for_segment(code, &BAD_SEND, 4),
                TerminateRepr::new(code)
            );
        }
        // Too short a segment to copy from: nothing attached.
        let code = TermCode::DdpUntagged(UntaggedCode::InvalidMo);
        assert_eq!(
            TerminateRepr::for_segment(code, &BAD_SEND[..17], 4),
            TerminateRepr::new(code)
        );
        assert_eq!(
            TerminateRepr::for_segment(code, &[], 4),
            TerminateRepr::new(code)
        );
    }

    #[test]
    fn parse_errors() {
        // M or R without D.
        for b2 in [0x80u8, 0x20, 0xa0] {
            let r = TerminateRepr::parse(&[0x12, 0x01, b2, 0]);
            assert!(
                matches!(r, Err(TerminateError::InconsistentHeaderControl(_))),
                "{b2:#x}"
            );
        }
        // D without the segment length / header.
        let d = [0x12u8, 0x01, 0x40, 0x00];
        assert_eq!(
            TerminateRepr::parse(&d),
            Err(TerminateError::Truncated {
                needed: 7,
                available: 4
            })
        );
        let mut v = std::vec::Vec::from(d);
        v.extend_from_slice(&[0, 4]);
        assert_eq!(
            TerminateRepr::parse(&v),
            Err(TerminateError::Truncated {
                needed: 7,
                available: 6
            })
        );
        v.extend_from_slice(&BAD_SEND[..17]);
        assert_eq!(
            TerminateRepr::parse(&v),
            Err(TerminateError::Truncated {
                needed: 24,
                available: 23
            })
        );
        let mut v = std::vec::Vec::from(d);
        v.extend_from_slice(&[0, 4, 0xc1, 0x40, 0, 0]);
        assert_eq!(
            TerminateRepr::parse(&v),
            Err(TerminateError::Truncated {
                needed: 20,
                available: 10
            })
        );
        assert_eq!(
            TerminateRepr::parse(&[0x12]),
            Err(TerminateError::Truncated {
                needed: 4,
                available: 1
            })
        );
        assert_eq!(
            TerminateRepr::parse(&[0x13, 0x00, 0, 0]),
            Err(TerminateError::UndefinedCode {
                layer: 1,
                etype: 3,
                code: 0
            })
        );
        // A copied header with a bad version is kept verbatim.
        let mut bad = BAD_SEND;
        bad[0] = 0x40; // DV = 0
        let mut v = std::vec::Vec::from([0x12u8, 0x06, 0xc0, 0x00, 0x00, 0x04]);
        v.extend_from_slice(&bad[..18]);
        let t = TerminateRepr::parse(&v).unwrap();
        assert_eq!(t.ddp_header.unwrap().as_bytes(), &bad[..18]);
        assert_eq!(
            t.ddp_header.unwrap().header(),
            Err(DdpError::DdpVersion {
                tagged: false,
                version: 0
            })
        );
        let mut out = [0u8; 24];
        assert_eq!(t.emit(&mut out), Ok(24));
        assert_eq!(&out[..], &v[..]);
    }

    #[test]
    fn emit_errors() {
        let code = TermCode::DdpUntagged(UntaggedCode::InvalidMo);
        let good = TerminateRepr::for_segment(code, &BAD_SEND, 4);
        assert_eq!(
            good.emit(&mut [0u8; 23]),
            Err(EmitError::BufferTooShort {
                needed: 24,
                available: 23
            })
        );
        assert_eq!(
            good.emit_message(1, &mut [0u8; 41]),
            Err(EmitError::BufferTooShort {
                needed: 42,
                available: 41
            })
        );
        let mut bad = good;
        bad.hdrct.d = false;
        assert_eq!(bad.emit(&mut [0u8; 64]), Err(EmitError::Inconsistent));
        assert_eq!(
            bad.emit_message(1, &mut [0u8; 64]),
            Err(EmitError::Inconsistent)
        );
        let mut bad = TerminateRepr::new(code);
        bad.hdrct.m = true;
        assert!(!bad.is_consistent());
        let mut bad = TerminateRepr::new(code);
        bad.ddp_segment_length = 1;
        assert!(!bad.is_consistent());
        let mut bad = good;
        bad.read_request = Some(ReadRequest::default());
        assert!(
            !bad.is_consistent(),
            "a Send copy cannot carry a Read Request header"
        );
        let rr = TerminateRepr::for_segment(
            TermCode::RdmapRemoteProtection(RemoteProtectionCode::InvalidStag),
            &RREQ,
            28,
        );
        let mut bad = rr;
        bad.read_request = None;
        assert!(
            !bad.is_consistent(),
            "R on a Read Request copy needs its header"
        );
        assert!(HeaderCopy::from_header(&DdpHeader::tagged(16, true, 0, 0)).is_err());
    }

    #[test]
    fn header_copy() {
        assert_eq!(HeaderCopy::from_segment(&[]), None);
        assert_eq!(HeaderCopy::from_segment(&BAD_SEND[..17]), None);
        let c = HeaderCopy::from_segment(&BAD_SEND).unwrap();
        assert_eq!(c.len(), 18);
        assert_eq!(
            c,
            HeaderCopy::from_header(&DdpHeader::parse(&BAD_SEND).unwrap()).unwrap()
        );
        let w = [0xc1u8, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff];
        let c = HeaderCopy::from_segment(&w).unwrap();
        assert_eq!(c.as_bytes(), &w[..14]);
        assert!(!c.is_read_request());
        assert_eq!(
            c,
            HeaderCopy::from_header(&DdpHeader::tagged(0, true, 1, 0)).unwrap()
        );
    }

    #[test]
    fn mapping_table() {
        use MpaCode as M;
        use RemoteOperationCode as O;
        use TaggedCode as T;
        use UntaggedCode as U;
        let op = Opcode::Send;
        let cases: &[(TermCode, (u8, u8, u8))] = &[
            (
                DdpError::Truncated {
                    needed: 18,
                    available: 3,
                }
                .into(),
                (2, 0, 0x03),
            ),
            (
                DdpError::DdpVersion {
                    tagged: true,
                    version: 0,
                }
                .into(),
                (1, 1, 0x04),
            ),
            (
                DdpError::DdpVersion {
                    tagged: false,
                    version: 0,
                }
                .into(),
                (1, 2, 0x06),
            ),
            (DdpError::RdmapVersion { version: 0 }.into(), (0, 2, 0x05)),
            (UntaggedError::InvalidQn(9).into(), (1, 2, 0x01)),
            (UntaggedError::MsnNoBuffer { msn: 1 }.into(), (1, 2, 0x02)),
            (
                UntaggedError::MsnRange {
                    expected: 1,
                    got: 2,
                }
                .into(),
                (1, 2, 0x03),
            ),
            (
                UntaggedError::InvalidMo {
                    expected: 0,
                    got: 1,
                }
                .into(),
                (1, 2, 0x04),
            ),
            (
                UntaggedError::MessageTooLong {
                    buffer_len: 1,
                    needed: 2,
                }
                .into(),
                (1, 2, 0x05),
            ),
            (TaggedError::InvalidStag(1).into(), (1, 1, 0x00)),
            (TaggedError::BaseBounds.into(), (1, 1, 0x01)),
            (TaggedError::StagNotAssociated(1).into(), (1, 1, 0x02)),
            (TaggedError::ToWrap.into(), (1, 1, 0x03)),
            (RdmapError::UnknownOpcode(0xc).into(), (0, 2, 0x06)),
            (
                RdmapError::ExtensionDisabled(Opcode::AtomicRequest).into(),
                (0, 2, 0x06),
            ),
            (
                RdmapError::TaggedMismatch {
                    opcode: op,
                    tagged: true,
                }
                .into(),
                (0, 2, 0x06),
            ),
            (
                RdmapError::WrongQueue { opcode: op, qn: 1 }.into(),
                (1, 2, 0x01),
            ),
            (
                RdmapError::NotLast(Opcode::RdmaReadRequest).into(),
                (0, 2, 0xff),
            ),
            (
                RdmapError::PayloadLength {
                    opcode: op,
                    expected: 1,
                    actual: 2,
                }
                .into(),
                (0, 2, 0xff),
            ),
            (
                RdmapError::Truncated {
                    needed: 28,
                    available: 2,
                }
                .into(),
                (0, 2, 0xff),
            ),
            (RdmapError::UnknownAtomicOp(7).into(), (0, 2, 0xff)),
        ];
        for (code, wire) in cases {
            assert_eq!(code.wire(), *wire, "{code:?}");
        }
        assert_eq!(
            TermCode::from(DdpError::Truncated {
                needed: 2,
                available: 0
            }),
            TermCode::Mpa(M::MarkerMismatch)
        );
        assert_eq!(
            TermCode::from(RdmapError::UnknownOpcode(0xf)),
            TermCode::RdmapRemoteOperation(O::UnexpectedOpcode)
        );
        assert_eq!(
            TermCode::from(TaggedError::ToWrap),
            TermCode::DdpTagged(T::ToWrap)
        );
        assert_eq!(
            TermCode::from(UntaggedError::InvalidQn(4)),
            TermCode::DdpUntagged(U::InvalidQn)
        );
    }

    /// End to end: a receiver built from the pieces turns each bad segment
    /// into the Terminate upstream siw would send.
    #[test]
    fn receive_path_to_terminate() {
        fn receive(
            seg: &[u8],
            qs: &mut ddp::UntaggedQueues<{ rdmap::QUEUE_COUNT }>,
            buffer: Option<u32>,
        ) -> Result<(), TermCode> {
            let h = DdpHeader::parse(seg)?;
            let op = rdmap::validate(&h, Extensions::NONE)?;
            let payload = seg.get(h.header_len()..).unwrap_or(&[]);
            let len = u32::try_from(payload.len()).unwrap();
            if let Some(u) = h.untagged_fields() {
                if op.single_segment() {
                    rdmap::check_payload_len(op, payload.len())?;
                }
                qs.accept(&u, len, h.last, buffer)?;
            }
            Ok(())
        }
        let mut qs = ddp::UntaggedQueues::new();
        let mut send1 = BAD_SEND;
        send1[13] = 1;
        assert_eq!(receive(&send1, &mut qs, Some(4)), Ok(()));
        let e = receive(&BAD_SEND, &mut qs, Some(4)).unwrap_err();
        assert_eq!(e, TermCode::DdpUntagged(UntaggedCode::MsnRange));
        let mut atomic = BAD_SEND;
        atomic[1] = 0x4a;
        assert_eq!(
            receive(&atomic, &mut qs, None).unwrap_err(),
            TermCode::RdmapRemoteOperation(RemoteOperationCode::UnexpectedOpcode)
        );
        assert_eq!(
            receive(&RREQ[..30], &mut qs, None).unwrap_err().wire(),
            (0, 2, 0xff)
        );
        assert_eq!(
            receive(&BAD_SEND[..10], &mut qs, None).unwrap_err().wire(),
            (2, 0, 3)
        );
    }

    /// `buf`'s control word rewritten as upstream siw on a little-endian
    /// host lays it out (module docs, "Upstream siw's layout").
    fn to_siw_le(buf: &mut [u8]) {
        let w = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        buf[0] = buf[0].rotate_left(4);
        buf[2] = u8::from(w & HDRCT_M != 0)
            | u8::from(w & HDRCT_D != 0) << 1
            | u8::from(w & HDRCT_R != 0) << 2;
        buf[3] = 0;
    }

    #[test]
    fn siw_le_layout() {
        // What upstream siw sent on x86 for an RDMA Read 1 octet past
        // the end of the region (a VM run of tests/vm/access.c, case 7,
        // against siw, 2026-12-02): RDMAP Remote Protection, base or
        // bounds (0/1/1), M, D and R in its bit positions, then the RFC's
        // DDP Segment Length, DDP header and Read Request header.
        let rfc = TerminateRepr::for_segment(
            TermCode::RdmapRemoteProtection(RemoteProtectionCode::BaseBounds),
            &RREQ,
            28,
        );
        assert!(rfc.hdrct.m && rfc.hdrct.d && rfc.hdrct.r && rfc.read_request.is_some());
        let mut buf = [0u8; MAX_LEN];
        let n = rfc.emit(&mut buf).unwrap();
        to_siw_le(&mut buf);
        assert_eq!(buf[..4], [0x10, 0x01, 0x07, 0x00]);
        assert_eq!(TerminateRepr::parse(&buf[..n]), Ok(rfc));
        // Read the RFC's way, the same octets were an undefined DDP code.
        assert_eq!(
            TermCode::from_wire(1, 0, 1),
            None,
            "1/0/1 is what a reader of the RFC layout sees"
        );
        // Invalid STag (0/1/0) would read as DDP Local Catastrophic.
        let c = TerminateControl::parse(&[0x10, 0x00, 0x07, 0x00]).unwrap();
        assert_eq!(
            c.code,
            TermCode::RdmapRemoteProtection(RemoteProtectionCode::InvalidStag)
        );
        // DDP Tagged errors (M and D) read alike in both layouts but for
        // the bits.
        let c = TerminateControl::parse(&[0x11, 0x01, 0x03, 0x00]).unwrap();
        assert_eq!(c.code, TermCode::DdpTagged(TaggedCode::BaseBounds));
        assert_eq!(
            c.hdrct,
            HeaderControl {
                m: true,
                d: true,
                r: false
            }
        );
        // Without siw's bits the RFC layout holds: siw's Unexpected OpCode
        // (0/2/6) reads as the MPA code 6, both remote errors alike.
        let c = TerminateControl::parse(&[0x20, 0x06, 0x00, 0x00]).unwrap();
        assert_eq!(c.code.wire(), (2, 0, 6));
        // Any other reserved bit, or an RFC header control bit, and it is
        // not siw's: read as the RFC says, reserved bits ignored.
        let c = TerminateControl::parse(&[0x10, 0x00, 0x07, 0x01]).unwrap();
        assert_eq!(c.code, TermCode::DdpLocalCatastrophic);
        assert_eq!(c.hdrct, HeaderControl::default());
        let c = TerminateControl::parse(&[0x10, 0x00, 0x47, 0x00]).unwrap();
        assert_eq!(c.code, TermCode::DdpLocalCatastrophic);
        assert!(c.hdrct.d && !c.hdrct.m && !c.hdrct.r);
        // siw's bits with an undefined swapped triple: the RFC reading,
        // here undefined too.
        assert_eq!(
            TerminateControl::parse(&[0x30, 0x00, 0x01, 0x00]),
            Err(TerminateError::UndefinedCode {
                layer: 3,
                etype: 0,
                code: 0
            })
        );
        // siw's M or R without D is as inconsistent as the RFC's.
        assert_eq!(
            TerminateRepr::parse(&[0x10, 0x00, 0x01, 0x00]),
            Err(TerminateError::InconsistentHeaderControl(HeaderControl {
                m: true,
                d: false,
                r: false
            }))
        );
    }

    fn any_code() -> impl Strategy<Value = TermCode> {
        (0u8..3, 0u8..3, any::<u8>(), 0usize..8).prop_map(|(l, e, c, pick)| {
            TermCode::from_wire(l, e, c).unwrap_or_else(|| {
                let v = code_vectors();
                v[pick % v.len()].0
            })
        })
    }

    fn any_segment() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..60)
    }

    proptest! {
        #[test]
        fn prop_terminate_roundtrip(code in any_code(), seg in any_segment(), len in any::<u16>()) {
            let t = TerminateRepr::for_segment(code, &seg, len);
            prop_assert!(t.is_consistent());
            let mut buf = [0u8; MAX_LEN];
            let n = t.emit(&mut buf).unwrap();
            prop_assert_eq!(n, t.buffer_len());
            prop_assert_eq!(TerminateRepr::parse(&buf[..n]), Ok(t));
            let mut msg = [0u8; UNTAGGED_HEADER_LEN + MAX_LEN];
            let m = t.emit_message(1, &mut msg).unwrap();
            prop_assert_eq!(DdpHeader::parse(&msg[..m]), Ok(terminate_header(1)));
            prop_assert_eq!(TerminateRepr::parse(&msg[UNTAGGED_HEADER_LEN..m]), Ok(t));
        }

        /// Every Terminate upstream siw sends with a header attached
        /// reads as what it means.
        #[test]
        fn prop_siw_le_layout_reads_as_sent(code in any_code(), seg in any_segment(), len in any::<u16>()) {
            let t = TerminateRepr::for_segment(code, &seg, len);
            prop_assume!(t.hdrct.d);
            let mut buf = [0u8; MAX_LEN];
            let n = t.emit(&mut buf).unwrap();
            to_siw_le(&mut buf);
            prop_assert_eq!(TerminateRepr::parse(&buf[..n]), Ok(t));
        }

        #[test]
        fn prop_terminate_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(t) = TerminateRepr::parse(&bytes) {
                prop_assert!(t.is_consistent());
                let mut buf = [0u8; MAX_LEN];
                let n = t.emit(&mut buf).unwrap();
                prop_assert_eq!(TerminateRepr::parse(&buf[..n]), Ok(t));
            }
        }
    }
}
