// SPDX-License-Identifier: GPL-2.0
//! The case generator: case `K` of seed `N` is a pure function of
//! `(N, K)` (and of the family restriction, if any), so a failure found
//! in a long run reproduces with `--seed N --case K`.
//!
//! A case is one connection: a [`Family`] (what kind of hostility), the
//! random parameters of its [`Plan`], and whether the MPA Request asks
//! for CRCs. [`Case::expect`] says what a conforming peer must do.

use std::fmt;

use iwarp_core::mpa::{Rtr, RtrSet};

use iwarp_core::terminate::{
    MpaCode, RemoteOperationCode, RemoteProtectionCode, TaggedCode, TermCode, UntaggedCode,
};

use crate::inject::UNADVERTISED_STAG;

/// SplitMix64: small, fast, and the same on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(mix(seed))
    }

    /// The generator of case `case` of run `seed`: independent of every
    /// other case, so cases can run in any order and on any thread.
    pub fn for_case(seed: u64, case: u64) -> Self {
        Rng(mix(seed ^ mix(case.wrapping_add(0x6a09_e667_f3bc_c909))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`; 0 gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: bias below 2^-64 * n, irrelevant here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// One element of `s` (non-empty).
    pub fn pick<T: Copy>(&mut self, s: &[T]) -> T {
        s[self.below(s.len() as u64) as usize]
    }

    /// One of `fixed` or, as often as each of them, a value in `lo..=hi`.
    pub fn pick_or_range(&mut self, fixed: &[u64], lo: u64, hi: u64) -> u64 {
        let i = self.below(fixed.len() as u64 + 1) as usize;
        match fixed.get(i) {
            Some(&v) => v,
            None => self.range(lo, hi),
        }
    }

    /// `n` random octets.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A non-zero octet.
    pub fn nonzero_u8(&mut self) -> u8 {
        self.range(1, 255) as u8
    }
}

/// The kinds of hostility. Every family has a name (`--families`), a
/// weight (how often it is drawn) and a [`Plan`] generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// MPA Request with a corrupted key octet.
    MpaBadKey,
    /// MPA Request with an unsupported revision (3..255).
    MpaBadRevision,
    /// MPA Request whose PD_Length exceeds 512.
    MpaPdTooLong,
    /// MPA Request cut short, then a stall: the peer must give up.
    MpaTruncated,
    /// MPA Request with random flags, revision 1/2, IRD/ORD block and
    /// private data: any answer but a hang.
    MpaFields,
    /// Valid MPA Request followed at once by octets (before the Reply).
    MpaEarlyData,
    /// Valid MPA Request asking for peer-to-peer mode (RFC 6581); once
    /// accepted, a FIN instead of the RTR: the peer must close, whatever
    /// order its connection events take.
    MpaP2pClose,
    /// MPA Request asking for markers; if the peer wants markers from us,
    /// a wrong marker; if it sends us markers, they are checked.
    MpaMarkers,
    /// A Send whose CRC field is wrong (CRC asked for).
    BadCrc,
    /// Octets of a valid buffer-info Send flipped (with CRC and only
    /// payload/CRC octets: the exact CRC error is required).
    Flip,
    /// Untagged Send with DDP version 0, 2 or 3.
    BadDdpVersion,
    /// Send with RDMAP version 0, 2 or 3.
    BadRdmapVersion,
    /// A reserved RDMAP opcode on queue 0.
    UnknownOpcode,
    /// A Send on an untagged queue number above 2.
    InvalidQn,
    /// A Send whose MSN is not the next one.
    MsnGap,
    /// A Send whose first segment has MO > 0.
    BadMo,
    /// A Send longer than the peer's posted receive (16 octets for rping).
    SendTooLong,
    /// An RDMA Write to an STag never advertised.
    InvalidStag,
    /// An RDMA Write to a guessed STag (other regions, other PDs).
    ForeignStagWrite,
    /// An RDMA Read Request from a guessed STag: data must never come back.
    ForeignStagRead,
    /// More RDMA Read Requests at once than the peer's IRD.
    IrdOverflow,
    /// Part of a valid FPDU, a stall, then FIN.
    TruncatedFpdu,
    /// An FPDU whose ULPDU_Length exceeds the MULPDU (with or without the
    /// octets it announces).
    OversizedUlpdu,
    /// An FPDU whose ULPDU_Length is below any DDP header.
    TinyUlpdu,
    /// Random octets after the handshake.
    Garbage,
    /// A TERMINATE from us: the peer must close, not answer.
    PeerTerminate,
    /// A full rping exchange whose first frame arrives one octet at a time
    /// with a stall in the middle: it must complete.
    Trickle,
    /// The Read Response to the peer's Read placed out of bounds.
    ResponseBadTo,
    /// The Read Response to the peer's Read aimed at another STag.
    ResponseBadStag,
    /// The Read Response to the peer's Read shorter or longer than asked.
    ResponseBadLength,
    /// A Read Response that answers no Read Request.
    ResponseUnsolicited,
    /// An RDMA Write to the peer's (remotely writable) rping buffer, out
    /// of its bounds.
    WriteOutOfBounds,
    /// An RDMA Read Request from the peer's rping buffer, out of bounds.
    ReadOutOfBounds,
}

impl Family {
    /// Every family.
    pub const ALL: &'static [Family] = &[
        Family::MpaBadKey,
        Family::MpaBadRevision,
        Family::MpaPdTooLong,
        Family::MpaTruncated,
        Family::MpaFields,
        Family::MpaEarlyData,
        Family::MpaP2pClose,
        Family::MpaMarkers,
        Family::BadCrc,
        Family::Flip,
        Family::BadDdpVersion,
        Family::BadRdmapVersion,
        Family::UnknownOpcode,
        Family::InvalidQn,
        Family::MsnGap,
        Family::BadMo,
        Family::SendTooLong,
        Family::InvalidStag,
        Family::ForeignStagWrite,
        Family::ForeignStagRead,
        Family::IrdOverflow,
        Family::TruncatedFpdu,
        Family::OversizedUlpdu,
        Family::TinyUlpdu,
        Family::Garbage,
        Family::PeerTerminate,
        Family::Trickle,
        Family::ResponseBadTo,
        Family::ResponseBadStag,
        Family::ResponseBadLength,
        Family::ResponseUnsolicited,
        Family::WriteOutOfBounds,
        Family::ReadOutOfBounds,
    ];

    /// The name used by `--families` and in reports.
    pub fn name(self) -> &'static str {
        use Family::*;
        match self {
            MpaBadKey => "mpa-bad-key",
            MpaBadRevision => "mpa-bad-revision",
            MpaPdTooLong => "mpa-pd-too-long",
            MpaTruncated => "mpa-truncated",
            MpaFields => "mpa-fields",
            MpaEarlyData => "mpa-early-data",
            MpaP2pClose => "mpa-p2p-close",
            MpaMarkers => "mpa-markers",
            BadCrc => "bad-crc",
            Flip => "flip",
            BadDdpVersion => "bad-ddp-version",
            BadRdmapVersion => "bad-rdmap-version",
            UnknownOpcode => "unknown-opcode",
            InvalidQn => "invalid-qn",
            MsnGap => "msn-gap",
            BadMo => "bad-mo",
            SendTooLong => "send-too-long",
            InvalidStag => "invalid-stag",
            ForeignStagWrite => "foreign-stag-write",
            ForeignStagRead => "foreign-stag-read",
            IrdOverflow => "ird-overflow",
            TruncatedFpdu => "truncated-fpdu",
            OversizedUlpdu => "oversized-ulpdu",
            TinyUlpdu => "tiny-ulpdu",
            Garbage => "garbage",
            PeerTerminate => "peer-terminate",
            Trickle => "trickle",
            ResponseBadTo => "response-bad-to",
            ResponseBadStag => "response-bad-stag",
            ResponseBadLength => "response-bad-length",
            ResponseUnsolicited => "response-unsolicited",
            WriteOutOfBounds => "write-out-of-bounds",
            ReadOutOfBounds => "read-out-of-bounds",
        }
    }

    /// The family named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|f| f.name() == s)
    }

    /// Relative frequency. The stalling families are rare: each holds its
    /// connection for the peer's MPA timeout or a few seconds.
    pub fn weight(self) -> u64 {
        use Family::*;
        match self {
            MpaTruncated => 1,
            Trickle => 2,
            Flip => 8,
            Garbage | MpaFields => 4,
            _ => 3,
        }
    }

    /// Whether the case talks raw MPA (no FPDUs of ours follow).
    pub fn is_mpa(self) -> bool {
        matches!(
            self,
            Family::MpaBadKey
                | Family::MpaBadRevision
                | Family::MpaPdTooLong
                | Family::MpaTruncated
                | Family::MpaFields
                | Family::MpaEarlyData
                | Family::MpaP2pClose
        )
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The RTR types of [`Plan::MpaP2pClose`]: bit, type, name.
pub const RTR_BITS: [(u8, Rtr, &str); 3] = [
    (1, Rtr::Write, "write"),
    (2, Rtr::Read, "read"),
    (4, Rtr::Send, "send"),
];

/// The RTR types named by the bits `rtr` (see [`RTR_BITS`]).
pub fn rtr_set(rtr: u8) -> RtrSet {
    RTR_BITS
        .iter()
        .filter(|(b, ..)| rtr & b != 0)
        .fold(RtrSet::EMPTY, |s, &(_, t, _)| s.with(t))
}

/// How a hostile Write/Read misses the peer's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// Starts `n` octets before the buffer's first octet.
    Below(u64),
    /// Starts 64 KiB + `n` octets after the buffer's first octet (past
    /// any rping buffer: rping's sizes end at 64 KiB - 1).
    Above(u64),
    /// Starts `n` octets before 2^64: the range wraps.
    Wrap(u64),
}

/// The random parameters of one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Key octet `pos` XOR `xor`.
    MpaBadKey {
        /// Octet of the key (0..16).
        pos: u8,
        /// Non-zero XOR mask.
        xor: u8,
    },
    /// Rev field.
    MpaBadRevision {
        /// 3..=255.
        rev: u8,
    },
    /// PD_Length > 512; `sent` octets of private data follow.
    MpaPdTooLong {
        /// PD_Length.
        pd_len: u16,
        /// Octets actually sent after the header.
        sent: u16,
    },
    /// A valid Request with `pd` octets of private data, of which only
    /// the first `cut` octets are sent (draw, reduced modulo the length).
    MpaTruncated {
        /// ULP private data length.
        pd: u16,
        /// Octets sent (draw).
        cut: u32,
    },
    /// Random header fields.
    MpaFields {
        /// Flags octet (M C R S and reserved bits).
        flags: u8,
        /// Rev (1 or 2).
        rev: u8,
        /// The IRD/ORD block when S is set in rev 2.
        block: [u8; 4],
        /// ULP private data length.
        pd: u16,
    },
    /// Octets sent right after a valid Request.
    MpaEarlyData {
        /// The octets.
        data: Vec<u8>,
    },
    /// A valid Request asking for peer-to-peer mode with these RTR types
    /// (bits as in [`RTR_BITS`]; never none), then a FIN once accepted.
    MpaP2pClose {
        /// RTR types offered.
        rtr: u8,
    },
    /// Ask for markers.
    MpaMarkers,
    /// Flip bit `bit` of the CRC field.
    BadCrc {
        /// 0..32.
        bit: u8,
    },
    /// Octets of the buffer-info Send XORed: `(position draw, mask)`;
    /// `payload_only`: only ULP payload, PAD and CRC octets (the headers
    /// and ULPDU_Length stay intact).
    Flip {
        /// Positions (drawn, reduced at run time) and non-zero masks.
        flips: Vec<(u32, u8)>,
        /// Only payload, PAD and CRC octets.
        payload_only: bool,
    },
    /// DV field.
    BadDdpVersion {
        /// 0, 2 or 3.
        dv: u8,
    },
    /// RV field.
    BadRdmapVersion {
        /// 0, 2 or 3.
        rv: u8,
    },
    /// Reserved opcode.
    UnknownOpcode {
        /// 0xC..=0xF.
        op: u8,
    },
    /// Queue number.
    InvalidQn {
        /// >= 3.
        qn: u32,
    },
    /// MSN = expected + delta (wrapping, delta != 0).
    MsnGap {
        /// Non-zero offset.
        delta: u32,
    },
    /// Message Offset of a first segment.
    BadMo {
        /// > 0.
        mo: u32,
    },
    /// Send length.
    SendTooLong {
        /// > 16.
        len: u32,
    },
    /// Write to an STag never advertised.
    InvalidStag {
        /// The STag.
        stag: u32,
        /// Write length.
        len: u16,
    },
    /// Write to a guessed STag.
    ForeignStagWrite {
        /// The STag.
        stag: u32,
        /// Tagged Offset.
        to: u64,
        /// Write length.
        len: u16,
    },
    /// Read Request from a guessed STag.
    ForeignStagRead {
        /// The STag.
        stag: u32,
        /// Tagged Offset.
        to: u64,
        /// Read size.
        len: u16,
    },
    /// Peer's IRD + `extra` Read Requests in one write.
    IrdOverflow {
        /// 1..=8.
        extra: u8,
        /// Read the peer's rping buffer (after it advertised it through its
        /// own Read) instead of zero-length Reads.
        sized: bool,
    },
    /// `cut` octets (draw) of a valid Send FPDU, a stall, FIN.
    TruncatedFpdu {
        /// Octets sent (draw, reduced to 1..len).
        cut: u32,
        /// Stall before the FIN.
        stall_ms: u32,
    },
    /// ULPDU_Length `ulen` above the MULPDU.
    OversizedUlpdu {
        /// The length field.
        ulen: u16,
        /// Send all the octets it announces (else only the headers).
        full: bool,
    },
    /// ULPDU_Length below any header.
    TinyUlpdu {
        /// 0..=13.
        ulen: u8,
    },
    /// Random octets.
    Garbage {
        /// The octets.
        data: Vec<u8>,
    },
    /// A TERMINATE with this code.
    PeerTerminate {
        /// Any defined code.
        code: TermCode,
    },
    /// The buffer-info Send one octet per `delay_ms`, stalling
    /// `stall_ms` before octet `stall_at` (draw).
    Trickle {
        /// Delay between octets.
        delay_ms: u32,
        /// Octet before which to stall (draw).
        stall_at: u32,
        /// Stall.
        stall_ms: u32,
    },
    /// Read Response placed outside the peer's buffer.
    ResponseBadTo {
        /// Where.
        miss: Miss,
    },
    /// Read Response to the sink STag XOR `xor`.
    ResponseBadStag {
        /// Non-zero mask.
        xor: u32,
    },
    /// Read Response of the asked size + `delta` (never 0 in total).
    ResponseBadLength {
        /// Non-zero, -63..=64.
        delta: i32,
    },
    /// Read Response with nothing outstanding.
    ResponseUnsolicited {
        /// STag.
        stag: u32,
        /// Tagged Offset.
        to: u64,
        /// Length.
        len: u16,
    },
    /// Write to the peer's buffer out of bounds.
    WriteOutOfBounds {
        /// Where.
        miss: Miss,
        /// Length.
        len: u16,
    },
    /// Read Request from the peer's buffer out of bounds.
    ReadOutOfBounds {
        /// Where.
        miss: Miss,
        /// Length.
        len: u16,
    },
}

/// What a conforming peer does in reaction to a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Exactly this TERMINATE (the RFC's code, as `--expect-term rfc`).
    Term(TermCode),
    /// One of these TERMINATEs.
    AnyOf(&'static [TermCode]),
    /// This TERMINATE, or a close without one (RFC 5044 leaves a peer
    /// free to just drop a connection that lost framing).
    TermOrClose(TermCode),
    /// A TERMINATE of the DDP Tagged Buffer or RDMAP Remote Protection
    /// types (which code depends on what the guessed STag names).
    Protection,
    /// [`Expect::Protection`], or this TERMINATE.
    ProtectionOr(TermCode),
    /// Some TERMINATE (the RFCs name no single code).
    AnyTerm,
    /// MPA: a reject Reply, a close or a reset; never an accepting Reply.
    NoAccept,
    /// MPA, stalled Request: the peer gives up (reject, close, reset)
    /// within the stall bound.
    GivesUp,
    /// The peer closes the connection (after our TERMINATE).
    Close,
    /// Markers: a reject, the marker TERMINATE, or a completed exchange
    /// with correct markers from the peer.
    Markers,
    /// The rping exchange completes with verified data.
    Completes,
    /// Any reaction, or none, as long as nothing hangs, leaks or breaks
    /// the protocol.
    Reaction,
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = |c: TermCode| {
            let (l, t, c) = c.wire();
            format!("{l}/{t}/{c:#04x}")
        };
        match self {
            Expect::Term(c) => write!(f, "TERMINATE {}", code(*c)),
            Expect::AnyOf(cs) => {
                let v: Vec<String> = cs.iter().map(|c| code(*c)).collect();
                write!(f, "TERMINATE {}", v.join(" or "))
            }
            Expect::TermOrClose(c) => write!(f, "TERMINATE {} or close", code(*c)),
            Expect::Protection => f.write_str("TERMINATE 1/1/* or 0/1/*"),
            Expect::ProtectionOr(c) => write!(f, "TERMINATE 1/1/*, 0/1/* or {}", code(*c)),
            Expect::AnyTerm => f.write_str("any TERMINATE"),
            Expect::NoAccept => f.write_str("reject or close, never an accepting Reply"),
            Expect::GivesUp => f.write_str("reject or close within the stall bound"),
            Expect::Close => f.write_str("close"),
            Expect::Markers => f.write_str("reject, TERMINATE 2/0/0x03, or correct markers"),
            Expect::Completes => f.write_str("the exchange completes"),
            Expect::Reaction => f.write_str("any reaction but a hang"),
        }
    }
}

const CRC_ERROR: TermCode = TermCode::Mpa(MpaCode::CrcError);
const MARKER_ERROR: TermCode = TermCode::Mpa(MpaCode::MarkerMismatch);
const TAGGED_BOUNDS: TermCode = TermCode::DdpTagged(TaggedCode::BaseBounds);
const TAGGED_WRAP: &[TermCode] = &[
    TermCode::DdpTagged(TaggedCode::BaseBounds),
    TermCode::DdpTagged(TaggedCode::ToWrap),
];
const READ_WRAP: &[TermCode] = &[
    TermCode::RdmapRemoteProtection(RemoteProtectionCode::BaseBounds),
    TermCode::RdmapRemoteProtection(RemoteProtectionCode::ToWrap),
];

/// The marker TERMINATE (for the [`Expect::Markers`] check).
pub const MARKER_TERM: TermCode = MARKER_ERROR;

impl Plan {
    /// What a conforming peer must do.
    pub fn expect(&self) -> Expect {
        use Plan::*;
        match self {
            MpaBadKey { .. } | MpaBadRevision { .. } | MpaPdTooLong { .. } => Expect::NoAccept,
            MpaTruncated { .. } => Expect::GivesUp,
            MpaFields { .. } | MpaEarlyData { .. } | MpaP2pClose { .. } => Expect::Reaction,
            MpaMarkers => Expect::Markers,
            BadCrc { .. } => Expect::Term(CRC_ERROR),
            Flip {
                payload_only: true, ..
            } => Expect::Term(CRC_ERROR),
            Flip { .. } => Expect::Reaction,
            BadDdpVersion { .. } => {
                Expect::Term(TermCode::DdpUntagged(UntaggedCode::InvalidVersion))
            }
            BadRdmapVersion { .. } => Expect::Term(TermCode::RdmapRemoteOperation(
                RemoteOperationCode::InvalidVersion,
            )),
            UnknownOpcode { .. } => Expect::Term(TermCode::RdmapRemoteOperation(
                RemoteOperationCode::UnexpectedOpcode,
            )),
            InvalidQn { .. } => Expect::Term(TermCode::DdpUntagged(UntaggedCode::InvalidQn)),
            MsnGap { .. } => Expect::Term(TermCode::DdpUntagged(UntaggedCode::MsnRange)),
            BadMo { .. } => Expect::Term(TermCode::DdpUntagged(UntaggedCode::InvalidMo)),
            SendTooLong { .. } => Expect::Term(TermCode::DdpUntagged(UntaggedCode::MessageTooLong)),
            InvalidStag { .. } => Expect::Term(TermCode::DdpTagged(TaggedCode::InvalidStag)),
            ForeignStagWrite { .. } | ForeignStagRead { .. } => Expect::Protection,
            // The STag names no buffer, another one, or the right one at a
            // wrong offset (DDP/RDMAP protection); or, matched against the
            // outstanding Read first, a Response to no Read.
            ResponseBadStag { .. } => Expect::ProtectionOr(TermCode::RdmapRemoteOperation(
                RemoteOperationCode::UnexpectedOpcode,
            )),
            IrdOverflow { .. } => Expect::Term(TermCode::DdpUntagged(UntaggedCode::MsnNoBuffer)),
            TruncatedFpdu { .. } => Expect::TermOrClose(TermCode::Mpa(MpaCode::ConnectionLost)),
            OversizedUlpdu { .. } | TinyUlpdu { .. } | Garbage { .. } => Expect::Reaction,
            PeerTerminate { .. } => Expect::Close,
            Trickle { .. } => Expect::Completes,
            ResponseBadTo {
                miss: Miss::Wrap(_),
            }
            | WriteOutOfBounds {
                miss: Miss::Wrap(_),
                ..
            } => Expect::AnyOf(TAGGED_WRAP),
            ResponseBadTo { .. } | WriteOutOfBounds { .. } => Expect::Term(TAGGED_BOUNDS),
            ReadOutOfBounds {
                miss: Miss::Wrap(_),
                ..
            } => Expect::AnyOf(READ_WRAP),
            ReadOutOfBounds { .. } => Expect::Term(TermCode::RdmapRemoteProtection(
                RemoteProtectionCode::BaseBounds,
            )),
            ResponseBadLength { .. } | ResponseUnsolicited { .. } => Expect::AnyTerm,
        }
    }
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn miss_str(m: Miss) -> String {
    match m {
        Miss::Below(n) => format!("{n} octets below the base"),
        Miss::Above(n) => format!("64 KiB + {n} octets above the base"),
        Miss::Wrap(n) => format!("at 2^64 - {n} (wrapping)"),
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Plan::*;
        match self {
            MpaBadKey { pos, xor } => write!(f, "MPA Request, key octet {pos} ^ {xor:#04x}"),
            MpaBadRevision { rev } => write!(f, "MPA Request, Rev {rev}"),
            MpaPdTooLong { pd_len, sent } => {
                write!(f, "MPA Request, PD_Length {pd_len}, {sent} octets sent")
            }
            MpaTruncated { pd, cut } => write!(
                f,
                "MPA Request with {pd} octets of private data cut short (draw {cut}), then a stall"
            ),
            MpaFields {
                flags,
                rev,
                block,
                pd,
            } => write!(
                f,
                "MPA Request, flags {flags:#04x}, Rev {rev}, IRD/ORD block {}, {pd} octets of private data",
                hex(block)
            ),
            MpaEarlyData { data } => write!(
                f,
                "valid MPA Request, then {} octets before the Reply: {}",
                data.len(),
                hex(&data[..data.len().min(16)])
            ),
            MpaP2pClose { rtr } => {
                let names: Vec<&str> = RTR_BITS.iter().filter(|(b, ..)| rtr & b != 0).map(|&(.., n)| n).collect();
                write!(
                    f,
                    "MPA Request asking for peer-to-peer mode (RTR {}), then a FIN instead of the RTR",
                    names.join(" ")
                )
            }
            MpaMarkers => f.write_str("MPA Request asking for markers"),
            BadCrc { bit } => write!(f, "Send with CRC bit {bit} flipped"),
            Flip {
                flips,
                payload_only,
            } => {
                let v: Vec<String> = flips
                    .iter()
                    .map(|(p, x)| format!("{p}^{x:#04x}"))
                    .collect();
                write!(
                    f,
                    "buffer-info Send with octets flipped ({}) [draw^mask: {}]",
                    if *payload_only {
                        "payload/CRC only"
                    } else {
                        "anywhere"
                    },
                    v.join(" ")
                )
            }
            BadDdpVersion { dv } => write!(f, "Send with DDP version {dv}"),
            BadRdmapVersion { rv } => write!(f, "Send with RDMAP version {rv}"),
            UnknownOpcode { op } => write!(f, "opcode {op:#x} on QN 0"),
            InvalidQn { qn } => write!(f, "Send on QN {qn}"),
            MsnGap { delta } => write!(f, "Send with MSN = expected + {delta} (mod 2^32)"),
            BadMo { mo } => write!(f, "Send, first segment at MO {mo}"),
            SendTooLong { len } => write!(f, "Send of {len} octets"),
            InvalidStag { stag, len } => write!(f, "RDMA Write of {len} octets to STag {stag:#010x}"),
            ForeignStagWrite { stag, to, len } => write!(
                f,
                "RDMA Write of {len} octets to guessed STag {stag:#010x} TO {to:#x}"
            ),
            ForeignStagRead { stag, to, len } => write!(
                f,
                "RDMA Read Request of {len} octets from guessed STag {stag:#010x} TO {to:#x}"
            ),
            IrdOverflow { extra, sized } => write!(
                f,
                "IRD + {extra} {} RDMA Read Requests in one write",
                if *sized { "64-octet" } else { "zero-length" }
            ),
            TruncatedFpdu { cut, stall_ms } => write!(
                f,
                "Send FPDU cut short (draw {cut}), {stall_ms} ms stall, FIN"
            ),
            OversizedUlpdu { ulen, full } => write!(
                f,
                "FPDU with ULPDU_Length {ulen}{}",
                if *full {
                    ", all octets sent"
                } else {
                    ", headers only"
                }
            ),
            TinyUlpdu { ulen } => write!(f, "FPDU with ULPDU_Length {ulen}"),
            Garbage { data } => write!(
                f,
                "{} random octets: {}",
                data.len(),
                hex(&data[..data.len().min(16)])
            ),
            PeerTerminate { code } => {
                let (l, t, c) = code.wire();
                write!(f, "TERMINATE {l}/{t}/{c:#04x} from us")
            }
            Trickle {
                delay_ms,
                stall_at,
                stall_ms,
            } => write!(
                f,
                "rping exchange, first Send one octet per {delay_ms} ms with a {stall_ms} ms stall (draw {stall_at})"
            ),
            ResponseBadTo { miss } => write!(f, "Read Response {}", miss_str(*miss)),
            ResponseBadStag { xor } => write!(f, "Read Response to the sink STag ^ {xor:#x}"),
            ResponseBadLength { delta } => {
                write!(f, "Read Response of the asked size {delta:+} octets")
            }
            ResponseUnsolicited { stag, to, len } => write!(
                f,
                "unsolicited Read Response of {len} octets to STag {stag:#010x} TO {to:#x}"
            ),
            WriteOutOfBounds { miss, len } => write!(
                f,
                "RDMA Write of {len} octets to the peer's buffer, {}",
                miss_str(*miss)
            ),
            ReadOutOfBounds { miss, len } => write!(
                f,
                "RDMA Read Request of {len} octets from the peer's buffer, {}",
                miss_str(*miss)
            ),
        }
    }
}

/// One generated case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    /// Index in the run.
    pub index: u64,
    /// Family.
    pub family: Family,
    /// Ask for CRCs in the MPA Request.
    pub crc: bool,
    /// Parameters.
    pub plan: Plan,
}

impl Case {
    /// What a conforming peer must do.
    pub fn expect(&self) -> Expect {
        self.plan.expect()
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.plan, if self.crc { " [CRC]" } else { "" })
    }
}

fn miss(r: &mut Rng) -> Miss {
    match r.below(3) {
        0 => Miss::Below(r.pick_or_range(&[1, 8, 4096], 1, 1 << 20)),
        1 => Miss::Above(r.range(0, 1 << 20)),
        _ => Miss::Wrap(r.range(1, 32)),
    }
}

/// STags are `index << 8 | key` in siw and siw_rs: guesses are small
/// indexes with any key.
fn guessed_stag(r: &mut Rng) -> u32 {
    ((r.range(1, 256) as u32) << 8) | r.below(256) as u32
}

fn every_term_code(r: &mut Rng) -> TermCode {
    let mut all = Vec::new();
    for &c in RemoteProtectionCode::ALL {
        all.push(TermCode::RdmapRemoteProtection(c));
    }
    for &c in RemoteOperationCode::ALL {
        all.push(TermCode::RdmapRemoteOperation(c));
    }
    for &c in TaggedCode::ALL {
        all.push(TermCode::DdpTagged(c));
    }
    for &c in UntaggedCode::ALL {
        all.push(TermCode::DdpUntagged(c));
    }
    for &c in MpaCode::ALL {
        all.push(TermCode::Mpa(c));
    }
    all.push(TermCode::RdmapLocalCatastrophic(0xff));
    all.push(TermCode::DdpLocalCatastrophic);
    r.pick(&all)
}

fn plan(family: Family, r: &mut Rng) -> Plan {
    use Family as F;
    match family {
        F::MpaBadKey => Plan::MpaBadKey {
            pos: r.below(16) as u8,
            xor: r.nonzero_u8(),
        },
        F::MpaBadRevision => Plan::MpaBadRevision {
            rev: r.range(3, 255) as u8,
        },
        F::MpaPdTooLong => {
            let pd_len = r.pick_or_range(&[513, 514, 1024, 4096, 65535], 513, 65535) as u16;
            Plan::MpaPdTooLong {
                pd_len,
                sent: r.range(0, u64::from(pd_len).min(1024)) as u16,
            }
        }
        F::MpaTruncated => Plan::MpaTruncated {
            pd: r.pick(&[0, 0, 16, 200]) as u16,
            cut: r.next_u64() as u32,
        },
        F::MpaFields => Plan::MpaFields {
            flags: r.next_u64() as u8,
            rev: r.range(1, 2) as u8,
            block: {
                let b = r.bytes(4);
                [b[0], b[1], b[2], b[3]]
            },
            pd: r.pick(&[0, 0, 4, 64, 252, 508]) as u16,
        },
        F::MpaEarlyData => {
            let n = r.pick_or_range(&[1, 2, 20], 1, 512) as usize;
            Plan::MpaEarlyData { data: r.bytes(n) }
        }
        F::MpaP2pClose => Plan::MpaP2pClose {
            rtr: r.range(1, 7) as u8,
        },
        F::MpaMarkers => Plan::MpaMarkers,
        F::BadCrc => Plan::BadCrc {
            bit: r.below(32) as u8,
        },
        F::Flip => {
            let n = r.range(1, 3) as usize;
            Plan::Flip {
                flips: (0..n)
                    .map(|_| (r.next_u64() as u32, r.nonzero_u8()))
                    .collect(),
                payload_only: r.chance(1, 3),
            }
        }
        F::BadDdpVersion => Plan::BadDdpVersion {
            dv: r.pick(&[0, 2, 3]),
        },
        F::BadRdmapVersion => Plan::BadRdmapVersion {
            rv: r.pick(&[0, 2, 3]),
        },
        F::UnknownOpcode => Plan::UnknownOpcode {
            op: r.range(0xc, 0xf) as u8,
        },
        F::InvalidQn => Plan::InvalidQn {
            qn: r.pick_or_range(&[3, 4, 0xffff_ffff], 3, 0xffff_ffff) as u32,
        },
        F::MsnGap => Plan::MsnGap {
            delta: r.pick_or_range(&[1, 2, 0xffff_ffff], 1, 0xffff_ffff) as u32,
        },
        F::BadMo => Plan::BadMo {
            mo: r.pick_or_range(&[1, 8, 16], 1, 0xffff_ffff) as u32,
        },
        F::SendTooLong => Plan::SendTooLong {
            len: r.pick_or_range(&[17, 64, 1449, 65536], 17, 200_000) as u32,
        },
        F::InvalidStag => Plan::InvalidStag {
            stag: UNADVERTISED_STAG | r.below(256) as u32,
            len: r.range(1, 64) as u16,
        },
        F::ForeignStagWrite => Plan::ForeignStagWrite {
            stag: guessed_stag(r),
            to: if r.chance(1, 2) { 0 } else { r.next_u64() },
            len: r.range(1, 64) as u16,
        },
        F::ForeignStagRead => Plan::ForeignStagRead {
            stag: guessed_stag(r),
            to: if r.chance(1, 2) { 0 } else { r.next_u64() },
            len: r.range(1, 4096) as u16,
        },
        F::IrdOverflow => Plan::IrdOverflow {
            extra: r.range(1, 8) as u8,
            sized: r.chance(1, 2),
        },
        F::TruncatedFpdu => Plan::TruncatedFpdu {
            cut: r.next_u64() as u32,
            stall_ms: r.pick_or_range(&[0, 100, 1000], 0, 2000) as u32,
        },
        F::OversizedUlpdu => Plan::OversizedUlpdu {
            ulen: r.range(1449, 65535) as u16,
            full: r.chance(1, 2),
        },
        F::TinyUlpdu => Plan::TinyUlpdu {
            ulen: r.range(0, 13) as u8,
        },
        F::Garbage => {
            let n = r.pick_or_range(&[1, 2, 4, 64], 1, 2048) as usize;
            Plan::Garbage { data: r.bytes(n) }
        }
        F::PeerTerminate => Plan::PeerTerminate {
            code: every_term_code(r),
        },
        F::Trickle => Plan::Trickle {
            delay_ms: r.range(1, 20) as u32,
            stall_at: r.next_u64() as u32,
            stall_ms: r.pick_or_range(&[0, 500], 0, 3000) as u32,
        },
        F::ResponseBadTo => Plan::ResponseBadTo { miss: miss(r) },
        F::ResponseBadStag => Plan::ResponseBadStag {
            xor: r.pick_or_range(&[0xff, 0x100], 1, 0xffff_ffff) as u32,
        },
        F::ResponseBadLength => {
            let mut delta = r.range(0, 126) as i32 - 63;
            if delta == 0 {
                delta = 1;
            }
            Plan::ResponseBadLength { delta }
        }
        F::ResponseUnsolicited => Plan::ResponseUnsolicited {
            stag: guessed_stag(r),
            to: r.next_u64(),
            len: r.range(0, 64) as u16,
        },
        F::WriteOutOfBounds => Plan::WriteOutOfBounds {
            miss: miss(r),
            len: r.range(1, 64) as u16,
        },
        F::ReadOutOfBounds => Plan::ReadOutOfBounds {
            miss: miss(r),
            len: r.range(1, 64) as u16,
        },
    }
}

/// Case `index` of run `seed`, drawn from `families` (all if empty).
pub fn generate(seed: u64, index: u64, families: &[Family]) -> Case {
    let mut r = Rng::for_case(seed, index);
    let pool = if families.is_empty() {
        Family::ALL
    } else {
        families
    };
    let total: u64 = pool.iter().map(|f| f.weight()).sum();
    let mut x = r.below(total);
    let mut family = pool[0];
    for &f in pool {
        if x < f.weight() {
            family = f;
            break;
        }
        x -= f.weight();
    }
    let crc = match family {
        Family::BadCrc => true,
        Family::Flip => r.chance(1, 2),
        _ => r.chance(1, 4),
    };
    let mut plan = plan(family, &mut r);
    // A payload-only flip is checked for the exact CRC error: it needs CRC.
    if let Plan::Flip {
        payload_only: ref mut p,
        ..
    } = plan
    {
        *p = *p && crc;
    }
    Case {
        index,
        family,
        crc,
        plan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic() {
        for k in 0..500 {
            assert_eq!(generate(7, k, &[]), generate(7, k, &[]));
        }
        let a: Vec<Case> = (0..50).map(|k| generate(1, k, &[])).collect();
        let b: Vec<Case> = (0..50).map(|k| generate(2, k, &[])).collect();
        assert_ne!(a, b, "seeds must matter");
    }

    #[test]
    fn every_family_is_drawn() {
        let mut seen = std::collections::BTreeSet::new();
        for k in 0..3000 {
            seen.insert(generate(42, k, &[]).family);
        }
        let missing: Vec<_> = Family::ALL.iter().filter(|f| !seen.contains(f)).collect();
        assert!(missing.is_empty(), "never drawn: {missing:?}");
    }

    #[test]
    fn restriction_is_honoured() {
        let only = [Family::MsnGap, Family::Trickle];
        for k in 0..200 {
            assert!(only.contains(&generate(3, k, &only).family));
        }
        for &f in Family::ALL {
            let c = generate(9, 0, &[f]);
            assert_eq!(c.family, f);
            assert_eq!(Family::parse(f.name()), Some(f));
            // Every plan has a description and an expectation.
            assert!(!c.to_string().is_empty());
            let _ = c.expect().to_string();
        }
    }

    #[test]
    fn rtr_bits_name_their_types() {
        assert!(rtr_set(1).contains(Rtr::Write) && !rtr_set(1).contains(Rtr::Read));
        assert!(rtr_set(2).contains(Rtr::Read) && !rtr_set(2).contains(Rtr::Send));
        assert!(rtr_set(4).contains(Rtr::Send) && !rtr_set(4).contains(Rtr::Write));
        assert_eq!(rtr_set(7), RtrSet::ALL);
        assert!(rtr_set(0).is_empty());
        let c = Plan::MpaP2pClose { rtr: 5 }.to_string();
        assert!(c.contains("(RTR write send)"), "{c}");
    }

    #[test]
    fn parameters_are_hostile() {
        for k in 0..2000 {
            let c = generate(5, k, &[]);
            match c.plan {
                Plan::MpaBadKey { pos, xor } => assert!(pos < 16 && xor != 0),
                Plan::MpaBadRevision { rev } => assert!(rev >= 3),
                Plan::MpaP2pClose { rtr } => assert!((1..=7).contains(&rtr)),
                Plan::MpaPdTooLong { pd_len, sent } => assert!(pd_len > 512 && sent <= pd_len),
                Plan::BadDdpVersion { dv } => assert_ne!(dv, 1),
                Plan::BadRdmapVersion { rv } => assert_ne!(rv, 1),
                Plan::UnknownOpcode { op } => assert!((0xc..=0xf).contains(&op)),
                Plan::InvalidQn { qn } => assert!(qn >= 3),
                Plan::MsnGap { delta } => assert_ne!(delta, 0),
                Plan::BadMo { mo } => assert_ne!(mo, 0),
                Plan::SendTooLong { len } => assert!(len > 16),
                Plan::ResponseBadStag { xor } => assert_ne!(xor, 0),
                Plan::ResponseBadLength { delta } => assert!(delta != 0 && delta > -64),
                Plan::OversizedUlpdu { ulen, .. } => assert!(ulen > 1448),
                Plan::TinyUlpdu { ulen } => assert!(ulen < 14),
                Plan::Flip {
                    ref flips,
                    payload_only,
                } => {
                    assert!(!flips.is_empty() && flips.iter().all(|f| f.1 != 0));
                    assert!(!payload_only || c.crc);
                }
                Plan::BadCrc { bit } => assert!(bit < 32 && c.crc),
                _ => {}
            }
        }
    }

    #[test]
    fn rng_ranges() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let v = r.range(3, 9);
            assert!((3..=9).contains(&v));
            assert!(r.below(1) == 0);
        }
        assert_eq!(Rng::new(5).next_u64(), Rng::new(5).next_u64());
    }
}
