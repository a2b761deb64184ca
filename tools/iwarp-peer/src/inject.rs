// SPDX-License-Identifier: GPL-2.0
//! Hostile peer: one malformed or forbidden frame, then a report of what
//! came back.
//!
//! Frames are built by the core: either a legal message the peer must
//! refuse (an RDMA Write to an STag it never advertised, ...), or a correct
//! DDP segment from `ddp::DdpHeader::emit` whose control field is then
//! altered and which `mpa::emit_fpdu` frames with valid markers and CRC, or
//! a correctly framed FPDU whose CRC octet is then flipped.
//!
//! Injection point: as client (MPA initiator), right after the connection
//! is established; as server, after the client's first `rping`
//! buffer-info Send, so that the advertised buffer can be attacked.

use std::fmt;
use std::time::Duration;

use iwarp_core::ddp::{
    ControlField, DdpHeader, CTRL_DV_MASK, CTRL_DV_SHIFT, CTRL_OPCODE_MASK, CTRL_RV_MASK,
    CTRL_RV_SHIFT,
};
use iwarp_core::rdmap::{Opcode, ReadRequest, QN_SEND};
use iwarp_core::terminate::{
    MpaCode, RemoteOperationCode, RemoteProtectionCode, TaggedCode, TermCode, TerminateRepr,
    UntaggedCode,
};
use iwarp_core::tx::Message;

use crate::error::{term_code_str, Error, Result};
use crate::qp::{Access, Qp};
use crate::rping::{self, BufferInfo, RpingOptions};

/// An STag this tool never hands out (its STags are `index << 8 | 0x5a`).
pub const UNADVERTISED_STAG: u32 = 0xbad5_7a00;

/// Payload of crafted Sends: 16 octets, what an `rping` receive holds.
pub const PROBE: &[u8; 16] = b"iwarp-peer probe";

/// Delay between the octets of a trickled frame.
pub const TRICKLE_DELAY: Duration = Duration::from_millis(5);

/// Reserved RDMAP opcode used by `unknown-opcode`.
const RESERVED_OPCODE: u16 = 0xc;

/// What to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectKind {
    /// A Send whose CRC field is wrong (needs CRC negotiated).
    BadCrc,
    /// A Send with DDP version 2.
    BadDdpVersion,
    /// A Send with RDMAP version 2.
    BadRdmapVersion,
    /// A Send with the reserved opcode 0xC.
    UnknownOpcode,
    /// An RDMA Write to an STag the peer never advertised.
    InvalidStag,
    /// An RDMA Write crossing the end of the advertised buffer.
    WriteOutOfBounds,
    /// An RDMA Read Request crossing the end of the advertised buffer.
    ReadOutOfBounds,
    /// A Send longer than the posted receive buffer.
    SendTooLong,
    /// A Send whose MSN skips one.
    MsnGap,
    /// The first half of a valid FPDU, then TCP FIN.
    TruncatedFpdu,
    /// The next valid frame one octet at a time; the run then continues.
    Trickle,
}

impl InjectKind {
    /// Every kind.
    pub const ALL: &'static [InjectKind] = &[
        InjectKind::BadCrc,
        InjectKind::BadDdpVersion,
        InjectKind::BadRdmapVersion,
        InjectKind::UnknownOpcode,
        InjectKind::InvalidStag,
        InjectKind::WriteOutOfBounds,
        InjectKind::ReadOutOfBounds,
        InjectKind::SendTooLong,
        InjectKind::MsnGap,
        InjectKind::TruncatedFpdu,
        InjectKind::Trickle,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            InjectKind::BadCrc => "bad-crc",
            InjectKind::BadDdpVersion => "bad-ddp-version",
            InjectKind::BadRdmapVersion => "bad-rdmap-version",
            InjectKind::UnknownOpcode => "unknown-opcode",
            InjectKind::InvalidStag => "invalid-stag",
            InjectKind::WriteOutOfBounds => "write-out-of-bounds",
            InjectKind::ReadOutOfBounds => "read-out-of-bounds",
            InjectKind::SendTooLong => "send-too-long",
            InjectKind::MsnGap => "msn-gap",
            InjectKind::TruncatedFpdu => "truncated-fpdu",
            InjectKind::Trickle => "trickle",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.name() == s)
    }

    /// What an RFC-conforming peer (this tool) answers.
    pub fn expected(self) -> Expect {
        use InjectKind::*;
        let code = match self {
            BadCrc => TermCode::Mpa(MpaCode::CrcError),
            BadDdpVersion => TermCode::DdpUntagged(UntaggedCode::InvalidVersion),
            BadRdmapVersion => TermCode::RdmapRemoteOperation(RemoteOperationCode::InvalidVersion),
            UnknownOpcode => TermCode::RdmapRemoteOperation(RemoteOperationCode::UnexpectedOpcode),
            InvalidStag => TermCode::DdpTagged(TaggedCode::InvalidStag),
            WriteOutOfBounds => TermCode::DdpTagged(TaggedCode::BaseBounds),
            ReadOutOfBounds => TermCode::RdmapRemoteProtection(RemoteProtectionCode::BaseBounds),
            SendTooLong => TermCode::DdpUntagged(UntaggedCode::MessageTooLong),
            MsnGap => TermCode::DdpUntagged(UntaggedCode::MsnRange),
            TruncatedFpdu => TermCode::Mpa(MpaCode::ConnectionLost),
            Trickle => return Expect::Completes,
        };
        Expect::Term(code)
    }

    /// Whether the kind attacks the buffer the peer advertised.
    pub fn needs_advertisement(self) -> bool {
        matches!(
            self,
            InjectKind::WriteOutOfBounds | InjectKind::ReadOutOfBounds
        )
    }
}

impl fmt::Display for InjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The reaction an injection is expected to provoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A TERMINATE with this code.
    Term(TermCode),
    /// A TCP close or reset without TERMINATE.
    Close,
    /// No error: the run completes.
    Completes,
}

/// Names accepted by `--expect-term`, besides `LAYER:TYPE:CODE`.
pub const TERM_NAMES: &[(&str, TermCode)] = &[
    (
        "mpa-connection-lost",
        TermCode::Mpa(MpaCode::ConnectionLost),
    ),
    ("mpa-crc", TermCode::Mpa(MpaCode::CrcError)),
    ("mpa-marker", TermCode::Mpa(MpaCode::MarkerMismatch)),
    (
        "ddp-tagged-invalid-stag",
        TermCode::DdpTagged(TaggedCode::InvalidStag),
    ),
    (
        "ddp-tagged-bounds",
        TermCode::DdpTagged(TaggedCode::BaseBounds),
    ),
    (
        "ddp-tagged-version",
        TermCode::DdpTagged(TaggedCode::InvalidVersion),
    ),
    (
        "ddp-untagged-invalid-qn",
        TermCode::DdpUntagged(UntaggedCode::InvalidQn),
    ),
    (
        "ddp-untagged-no-buffer",
        TermCode::DdpUntagged(UntaggedCode::MsnNoBuffer),
    ),
    (
        "ddp-untagged-msn-range",
        TermCode::DdpUntagged(UntaggedCode::MsnRange),
    ),
    (
        "ddp-untagged-too-long",
        TermCode::DdpUntagged(UntaggedCode::MessageTooLong),
    ),
    (
        "ddp-untagged-version",
        TermCode::DdpUntagged(UntaggedCode::InvalidVersion),
    ),
    (
        "rdmap-invalid-stag",
        TermCode::RdmapRemoteProtection(RemoteProtectionCode::InvalidStag),
    ),
    (
        "rdmap-bounds",
        TermCode::RdmapRemoteProtection(RemoteProtectionCode::BaseBounds),
    ),
    (
        "rdmap-access",
        TermCode::RdmapRemoteProtection(RemoteProtectionCode::AccessRights),
    ),
    (
        "rdmap-version",
        TermCode::RdmapRemoteOperation(RemoteOperationCode::InvalidVersion),
    ),
    (
        "rdmap-unexpected-opcode",
        TermCode::RdmapRemoteOperation(RemoteOperationCode::UnexpectedOpcode),
    ),
];

fn parse_num(s: &str) -> Option<u8> {
    match s.strip_prefix("0x") {
        Some(h) => u8::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

impl Expect {
    /// Parses `LAYER:TYPE:CODE` (decimal or 0x hex), a name from
    /// [`TERM_NAMES`], `close`, or `none` (the run must complete).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "close" => return Ok(Expect::Close),
            "none" => return Ok(Expect::Completes),
            _ => {}
        }
        if let Some(&(_, code)) = TERM_NAMES.iter().find(|(n, _)| *n == s) {
            return Ok(Expect::Term(code));
        }
        let parts: Vec<Option<u8>> = s.split(':').map(parse_num).collect();
        match parts[..] {
            [Some(l), Some(t), Some(c)] => TermCode::from_wire(l, t, c)
                .map(Expect::Term)
                .ok_or_else(|| Error::Usage(format!("{s}: not a defined TERMINATE code"))),
            _ => Err(Error::Usage(format!(
                "--expect-term {s}: want LAYER:TYPE:CODE, close, none, or a name"
            ))),
        }
    }
}

/// What came back after an injection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The peer sent this TERMINATE.
    Terminate(TerminateRepr),
    /// The peer sent a TERMINATE that does not parse.
    BadTerminate,
    /// The peer closed the connection without TERMINATE.
    Closed,
    /// The peer reset the connection.
    Reset,
    /// Nothing within the timeout.
    Timeout,
    /// The run completed normally.
    Completed,
    /// Something else went wrong (the message).
    Failed(String),
}

impl Outcome {
    /// Whether the outcome is what `expect` asks for.
    pub fn matches(&self, expect: Expect) -> bool {
        match (self, expect) {
            (Outcome::Terminate(t), Expect::Term(code)) => t.code == code,
            (Outcome::Closed | Outcome::Reset, Expect::Close) => true,
            (Outcome::Completed, Expect::Completes) => true,
            _ => false,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Terminate(t) => {
                let h = t.hdrct;
                write!(
                    f,
                    "peer sent TERMINATE {} [M={} D={} R={}, DDP segment length {}]",
                    term_code_str(t.code),
                    u8::from(h.m),
                    u8::from(h.d),
                    u8::from(h.r),
                    t.ddp_segment_length
                )
            }
            Outcome::BadTerminate => f.write_str("peer sent a malformed TERMINATE"),
            Outcome::Closed => f.write_str("peer closed the connection without TERMINATE"),
            Outcome::Reset => f.write_str("peer reset the connection"),
            Outcome::Timeout => f.write_str("no reaction from the peer within the timeout"),
            Outcome::Completed => f.write_str("run completed without error"),
            Outcome::Failed(m) => write!(f, "run failed: {m}"),
        }
    }
}

fn outcome_of(e: Error) -> Outcome {
    match e {
        Error::PeerTerminate(t) => Outcome::Terminate(t),
        Error::BadTerminate => Outcome::BadTerminate,
        Error::PeerClosed | Error::Truncated => Outcome::Closed,
        Error::PeerReset => Outcome::Reset,
        Error::Timeout(_) => Outcome::Timeout,
        e => Outcome::Failed(e.to_string()),
    }
}

/// A correct untagged Send segment (DDP header and payload) for `msn`.
pub fn send_segment(msn: u32, payload: &[u8]) -> Result<Vec<u8>> {
    let hdr = DdpHeader::untagged(Opcode::Send.value(), true, 0, QN_SEND, msn, 0);
    let mut seg = vec![0u8; hdr.header_len() + payload.len()];
    let n = hdr
        .emit(&mut seg)
        .map_err(|e| Error::Protocol(format!("cannot build DDP header: {e:?}")))?;
    seg[n..].copy_from_slice(payload);
    Ok(seg)
}

/// Replaces the bits `mask` of the segment's control field by `value`.
pub fn set_control(seg: &mut [u8], mask: u16, value: u16) -> Result<()> {
    let ctrl = ControlField::parse(seg).map_err(|e| Error::Protocol(format!("{e:?}")))?;
    let new = (ctrl.0 & !mask) | (value & mask);
    seg[..2].copy_from_slice(&new.to_be_bytes());
    Ok(())
}

fn next_send_msn(qp: &mut Qp) -> u32 {
    qp.wire().transmitter().next_msn(QN_SEND).unwrap_or(1)
}

/// A Send segment with a control field altered, framed by the core.
fn send_crafted(qp: &mut Qp, mask: u16, value: u16) -> Result<()> {
    let mut seg = send_segment(next_send_msn(qp), PROBE)?;
    set_control(&mut seg, mask, value)?;
    let frame = qp.wire().frame(&seg)?;
    qp.wire().write_raw(&frame)
}

fn target(kind: InjectKind, adv: Option<BufferInfo>) -> Result<BufferInfo> {
    adv.ok_or_else(|| {
        Error::Usage(format!(
            "--inject {kind} attacks an advertised buffer: run as server against an rping client"
        ))
    })
}

/// A range of 16 octets that starts 8 octets before the end of `b`.
fn straddling_end(b: &BufferInfo) -> u64 {
    b.addr.wrapping_add(u64::from(b.size)).wrapping_sub(8)
}

/// Puts the hostile frame of `kind` on the wire. `adv` is the buffer the
/// peer advertised, if any; `len` the length of `send-too-long`.
pub fn fire(qp: &mut Qp, kind: InjectKind, adv: Option<BufferInfo>, len: u32) -> Result<()> {
    qp.ready()?;
    match kind {
        InjectKind::BadCrc => {
            if !qp.wire().transmitter().crc_enabled() {
                return Err(Error::Usage(
                    "--inject bad-crc needs CRC: use --crc on".into(),
                ));
            }
            let mut frame = qp.wire().emit(&Message::Send { len: 16 }, PROBE)?;
            // The last octet is always part of the CRC field.
            if let Some(b) = frame.last_mut() {
                *b ^= 0xff;
            }
            qp.wire().write_raw(&frame)
        }
        InjectKind::BadDdpVersion => send_crafted(qp, CTRL_DV_MASK, 2 << CTRL_DV_SHIFT),
        InjectKind::BadRdmapVersion => send_crafted(qp, CTRL_RV_MASK, 2 << CTRL_RV_SHIFT),
        InjectKind::UnknownOpcode => send_crafted(qp, CTRL_OPCODE_MASK, RESERVED_OPCODE),
        InjectKind::MsnGap => {
            let seg = send_segment(next_send_msn(qp).wrapping_add(1), PROBE)?;
            let frame = qp.wire().frame(&seg)?;
            qp.wire().write_raw(&frame)
        }
        InjectKind::InvalidStag => {
            let msg = Message::RdmaWrite {
                len: 16,
                stag: UNADVERTISED_STAG,
                to: adv.map_or(0, |a| a.addr),
            };
            qp.wire().send(&msg, PROBE)
        }
        InjectKind::WriteOutOfBounds => {
            let b = target(kind, adv)?;
            let msg = Message::RdmaWrite {
                len: 16,
                stag: b.stag,
                to: straddling_end(&b),
            };
            qp.wire().send(&msg, PROBE)
        }
        InjectKind::ReadOutOfBounds => {
            let b = target(kind, adv)?;
            let sink = qp.register(16, Access::LOCAL);
            let sink_to = qp.mr(sink)?.base();
            let rr = ReadRequest {
                sink_stag: sink,
                sink_to,
                read_size: 16,
                source_stag: b.stag,
                source_to: straddling_end(&b),
            };
            qp.wire().send(&Message::ReadRequest(rr), &[])
        }
        InjectKind::SendTooLong => {
            let data = vec![0x5a; len as usize];
            qp.wire().send(&Message::Send { len }, &data)
        }
        InjectKind::TruncatedFpdu => {
            let frame = qp.wire().emit(&Message::Send { len: 16 }, PROBE)?;
            qp.wire().write_raw(&frame[..frame.len() / 2])?;
            qp.wire().shutdown_write();
            Ok(())
        }
        InjectKind::Trickle => {
            qp.wire().trickle_next(TRICKLE_DELAY);
            Ok(())
        }
    }
}

/// Waits for the peer's reaction: completions are ignored until the
/// connection ends.
pub fn observe(qp: &mut Qp) -> Outcome {
    loop {
        if let Err(e) = qp.poll() {
            return outcome_of(e);
        }
    }
}

/// Runs an injection session in the given role, with the `rping`
/// protocol as the carrier.
pub fn run(qp: &mut Qp, kind: InjectKind, server: bool, o: &RpingOptions, len: u32) -> Outcome {
    let r = if kind == InjectKind::Trickle {
        trickle(qp, server, o)
    } else {
        attack(qp, kind, server, o, len)
    };
    r.unwrap_or_else(outcome_of)
}

fn trickle(qp: &mut Qp, server: bool, o: &RpingOptions) -> Result<Outcome> {
    fire(qp, InjectKind::Trickle, None, 0)?;
    if server {
        rping::server(qp, o)?;
    } else {
        rping::client(qp, o)?;
    }
    Ok(Outcome::Completed)
}

fn attack(
    qp: &mut Qp,
    kind: InjectKind,
    server: bool,
    o: &RpingOptions,
    len: u32,
) -> Result<Outcome> {
    let adv = if server {
        rping::server_setup(qp, o);
        let adv = rping::await_advertisement(qp)?;
        Some(adv.ok_or(Error::PeerClosed)?)
    } else {
        None
    };
    match fire(qp, kind, adv, len) {
        Ok(()) => {}
        // The peer refused the message while it was still being sent
        // (send-too-long: its first segment already overflows the
        // receive) and reset the stream: the TERMINATE it sent before is
        // still in our receive queue, so read it rather than fail.
        Err(Error::PeerReset) => {}
        Err(e) => return Err(e),
    }
    Ok(observe(qp))
}
