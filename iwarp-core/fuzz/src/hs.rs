// SPDX-License-Identifier: GPL-2.0
//! `mpa_handshake`: the MPA startup state machine ([`Handshake`]) in both
//! roles, fed in input-chosen pieces, with the responder's accept and reject
//! paths, and a pair mode in which two machines talk to each other.
//!
//! Input layout:
//!
//! ```text
//! mode      1 octet, modulo 3: 0 initiator, 1 responder, 2 pair
//! side A    16 octets (Side): the configuration of the machine under test
//!           (mode 2: of the initiator)
//! side B    16 octets, mode 2 only: the responder's configuration
//! schedule  n (1 octet, modulo 16), then n piece sizes, cycled (0 = an
//!           empty piece; n = 0 feeds the stream as one piece)
//! stream    the rest. Mode 0: the peer's Reply (and whatever follows it),
//!           fed to an initiator. Mode 1: the peer's Request, fed to a
//!           responder. Mode 2: octets that arrive right behind the Reply
//!           (FPDUs), which the initiator must leave unconsumed.
//! ```
//!
//! Invariants checked (a violation panics):
//! - `feed` never consumes more than it was given; while the frame is
//!   incomplete it consumes everything and reports nothing; the piece that
//!   completes the frame is consumed exactly up to the frame's end (the
//!   total equals what `MpaFrameRepr::parse` says of the whole stream);
//! - the state machine agrees with `MpaFrameRepr::parse` on the same octets:
//!   same frame-format error, same private data and IRD/ORD block;
//! - every policy error is justified by the frame and the configuration
//!   (e.g. `MarkersUnsupported` only if M is set and `markers_tx` is off);
//! - no event after an error: once failed, `feed` returns `InvalidState`
//!   and the error stays; after `Established`/`Rejected` nothing is consumed;
//! - `Handshake::initiator`, `accept` and `reject` fail exactly when the
//!   private data is too long or the buffer too small (or the P2P RTR set is
//!   empty), and a failed `accept`/`reject` leaves the state unchanged;
//! - negotiated values stay within the configured bounds (revision, CRC
//!   policy, markers, IRD <= max(ird, ird_max), ORD <= configured and <= the
//!   peer's IRD, RTR type offered by both sides, Read RTR needs ORD/IRD >= 1);
//! - the frames the machines write parse back to what was negotiated;
//! - pair mode: two machines never disagree (CRC, markers per direction,
//!   revision, enhanced mode, RTR) and each side's ORD fits the other's IRD;
//!   a reject reaches the initiator with its private data.

use super::{Input, Schedule};
use iwarp_core::mpa::*;

/// Private data lengths are taken modulo `PD_MAX + 1`: past 512 (508 with
/// the IRD/ORD block) to reach the length errors.
pub const PD_MAX: usize = 600;
const OUT_LEN: usize = MAX_FRAME_LEN + 16;

/// [`Side::flags`]: revision 2 (else 1).
pub const F_V2: u8 = 0x01;
/// [`Side::flags`]: CRC policy Off (bits 1-2 = 0).
pub const F_CRC_OFF: u8 = 0x00;
/// [`Side::flags`]: CRC policy PreferOff (bits 1-2 = 1 or 3).
pub const F_CRC_PREFER_OFF: u8 = 0x02;
/// [`Side::flags`]: CRC policy On (bits 1-2 = 2).
pub const F_CRC_ON: u8 = 0x04;
/// [`Side::flags`]: strict.
pub const F_STRICT: u8 = 0x08;
/// [`Side::flags`]: markers_rx.
pub const F_MARKERS_RX: u8 = 0x10;
/// [`Side::flags`]: markers_tx.
pub const F_MARKERS_TX: u8 = 0x20;
/// [`Side::flags`]: RFC 6581 enhanced configuration present.
pub const F_ENHANCED: u8 = 0x40;
/// [`Side::flags`]: peer-to-peer.
pub const F_P2P: u8 = 0x80;

/// [`Side::rtr_action`]: RTR Send.
pub const R_SEND: u8 = 0x01;
/// [`Side::rtr_action`]: RTR Write.
pub const R_WRITE: u8 = 0x02;
/// [`Side::rtr_action`]: RTR Read.
pub const R_READ: u8 = 0x04;
/// [`Side::rtr_action`] bits 3-4: the responder accepts (also 3 << 3).
pub const A_ACCEPT: u8 = 0 << 3;
/// [`Side::rtr_action`] bits 3-4: the responder rejects.
pub const A_REJECT: u8 = 1 << 3;
/// [`Side::rtr_action`] bits 3-4: the responder is fed the octets after the
/// Request first (a violation unless there are none), then rejects if it
/// failed and accepts otherwise.
pub const A_FEED_MORE: u8 = 2 << 3;
/// [`Side::rtr_action`]: try `initiator`/`accept`/`reject` with an output
/// buffer of [`Side::short`] octets first.
pub const A_SHORT_FIRST: u8 = 0x20;

/// One side's configuration and choices: 16 octets of input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Side {
    /// `F_*` bits.
    pub flags: u8,
    /// RTR set (`R_*`), action (`A_*`).
    pub rtr_action: u8,
    /// [`EnhancedConfig::ird`].
    pub ird: u16,
    /// [`EnhancedConfig::ord`].
    pub ord: u16,
    /// [`EnhancedConfig::ird_max`].
    pub ird_max: u16,
    /// Private data length (modulo `PD_MAX + 1`): the Request's, or the
    /// Reply's (accept or reject).
    pub pd_len: u16,
    /// Responder: `ird` argument of `accept`.
    pub acc_ird: u16,
    /// Responder: `ord` argument of `accept`.
    pub acc_ord: u16,
    /// First octet of the private data (then counting up).
    pub fill: u8,
    /// Length of the short output buffer tried first with `A_SHORT_FIRST`.
    pub short: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Accept,
    Reject,
    FeedMore,
}

impl Side {
    /// Decodes 16 octets.
    pub fn decode(inp: &mut Input<'_>) -> Self {
        Side {
            flags: inp.u8(),
            rtr_action: inp.u8(),
            ird: inp.u16(),
            ord: inp.u16(),
            ird_max: inp.u16(),
            pd_len: inp.u16(),
            acc_ird: inp.u16(),
            acc_ord: inp.u16(),
            fill: inp.u8(),
            short: inp.u8(),
        }
    }

    /// The 16 octets [`decode`](Self::decode) reads.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.flags);
        out.push(self.rtr_action);
        for v in [
            self.ird,
            self.ord,
            self.ird_max,
            self.pd_len,
            self.acc_ird,
            self.acc_ord,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.push(self.fill);
        out.push(self.short);
    }

    fn revision(&self) -> Revision {
        if self.flags & F_V2 != 0 {
            Revision::V2
        } else {
            Revision::V1
        }
    }

    fn crc(&self) -> CrcPolicy {
        match (self.flags >> 1) & 3 {
            0 => CrcPolicy::Off,
            2 => CrcPolicy::On,
            _ => CrcPolicy::PreferOff,
        }
    }

    fn strict(&self) -> bool {
        self.flags & F_STRICT != 0
    }

    fn rtr(&self) -> RtrSet {
        rtr_set(self.rtr_action)
    }

    fn action(&self) -> Action {
        match (self.rtr_action >> 3) & 3 {
            1 => Action::Reject,
            2 => Action::FeedMore,
            _ => Action::Accept,
        }
    }

    fn short_first(&self) -> bool {
        self.rtr_action & A_SHORT_FIRST != 0
    }

    fn enhanced(&self) -> Option<EnhancedConfig> {
        (self.flags & F_ENHANCED != 0).then_some(EnhancedConfig {
            ird: self.ird,
            ord: self.ord,
            ird_max: self.ird_max,
            p2p: self.flags & F_P2P != 0,
            rtr: self.rtr(),
        })
    }

    /// The configuration this side describes, with private data `pd`.
    pub fn config<'p>(&self, pd: &'p [u8]) -> MpaConfig<'p> {
        MpaConfig {
            revision: self.revision(),
            crc: self.crc(),
            strict: self.strict(),
            markers_rx: self.flags & F_MARKERS_RX != 0,
            markers_tx: self.flags & F_MARKERS_TX != 0,
            enhanced: self.enhanced(),
            private_data: pd,
            reserved: 0,
        }
    }

    /// This side's private data, written into `buf`.
    pub fn pd<'b>(&self, buf: &'b mut [u8; PD_MAX]) -> &'b [u8] {
        let n = usize::from(self.pd_len) % (PD_MAX + 1);
        for (i, b) in buf.iter_mut().take(n).enumerate() {
            *b = self.fill.wrapping_add(i as u8);
        }
        &buf[..n]
    }
}

fn rtr_set(bits: u8) -> RtrSet {
    let mut s = RtrSet::EMPTY;
    if bits & R_SEND != 0 {
        s = s.with(Rtr::Send);
    }
    if bits & R_WRITE != 0 {
        s = s.with(Rtr::Write);
    }
    if bits & R_READ != 0 {
        s = s.with(Rtr::Read);
    }
    s
}

/// A whole `mpa_handshake` input, for the seed generator.
#[derive(Clone, Debug)]
pub struct HsInput {
    /// 0 initiator, 1 responder, 2 pair.
    pub mode: u8,
    /// The machine under test (mode 2: the initiator).
    pub a: Side,
    /// Mode 2: the responder.
    pub b: Side,
    /// Piece sizes.
    pub schedule: Vec<u8>,
    /// The stream (see the module documentation).
    pub stream: Vec<u8>,
}

impl HsInput {
    /// The fuzz input.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.mode];
        self.a.encode(&mut out);
        if self.mode % 3 == 2 {
            self.b.encode(&mut out);
        }
        Schedule::encode(&self.schedule, &mut out);
        out.extend_from_slice(&self.stream);
        out
    }
}

/// The `mpa_handshake` target. Returns a short description of how far the
/// input got (used by the seed generator).
pub fn run(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    match inp.u8() % 3 {
        0 => {
            let a = Side::decode(&mut inp);
            let mut sched = Schedule::decode(&mut inp);
            run_initiator(&a, &mut sched, inp.rest())
        }
        1 => {
            let a = Side::decode(&mut inp);
            let mut sched = Schedule::decode(&mut inp);
            run_responder(&a, &mut sched, inp.rest())
        }
        _ => {
            let a = Side::decode(&mut inp);
            let b = Side::decode(&mut inp);
            let mut sched = Schedule::decode(&mut inp);
            run_pair(&a, &b, &mut sched, inp.rest())
        }
    }
}

// ---------------------------------------------------------------------------
// Driving a machine
// ---------------------------------------------------------------------------

/// An owned copy of what `feed` reported.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Got {
    /// The stream ended before the frame was complete.
    Waiting,
    Request {
        revision: Revision,
        crc: bool,
        markers: bool,
        reserved: u8,
        enhanced: Option<EnhancedData>,
        pd: Vec<u8>,
    },
    Established(Negotiated),
    Rejected(Vec<u8>),
    Failed(MpaError),
}

fn awaiting(role: Role) -> HandshakeState {
    match role {
        Role::Initiator => HandshakeState::AwaitingReply,
        Role::Responder => HandshakeState::AwaitingRequest,
    }
}

/// Feeds `stream` in scheduled pieces until an event or error, checking the
/// per-call invariants. Returns what happened and the octets consumed.
fn drive(hs: &mut Handshake, stream: &[u8], sched: &mut Schedule<'_>) -> (Got, usize) {
    let role = hs.role();
    assert_eq!(hs.state(), awaiting(role));
    let mut off = 0usize;
    let mut consumed = 0usize;
    // Bounds the number of empty pieces; then the rest goes in one piece.
    let mut budget = stream.len() + 2 * Schedule::MAX + 2;
    loop {
        let left = stream.len() - off;
        let n = if budget == 0 {
            left
        } else {
            budget -= 1;
            sched.next_size().min(left)
        };
        let piece = &stream[off..off + n];
        let got = match hs.feed(piece) {
            Ok(f) => {
                assert!(f.consumed <= piece.len(), "consumed more than given");
                consumed += f.consumed;
                match f.event {
                    None => {
                        assert_eq!(
                            f.consumed,
                            piece.len(),
                            "an incomplete frame must consume the whole piece"
                        );
                        None
                    }
                    Some(Event::RequestReceived(p)) => Some(Got::Request {
                        revision: p.revision,
                        crc: p.crc,
                        markers: p.markers,
                        reserved: p.reserved,
                        enhanced: p.enhanced,
                        pd: p.private_data.to_vec(),
                    }),
                    Some(Event::Established(n)) => Some(Got::Established(n)),
                    Some(Event::Rejected { private_data }) => {
                        Some(Got::Rejected(private_data.to_vec()))
                    }
                }
            }
            Err(e) => {
                assert_eq!(hs.state(), HandshakeState::Failed);
                assert_eq!(hs.error(), Some(e));
                assert!(hs.negotiated().is_none());
                Some(Got::Failed(e))
            }
        };
        match &got {
            None => assert_eq!(hs.state(), awaiting(role)),
            Some(Got::Request { .. }) => {
                assert_eq!(role, Role::Responder, "RequestReceived at an initiator");
                assert_eq!(hs.state(), HandshakeState::AwaitingDecision);
                assert!(hs.can_reject());
                assert!(hs.negotiated().is_none());
            }
            Some(Got::Established(n)) => {
                assert_eq!(role, Role::Initiator, "feed established a responder");
                assert_eq!(hs.state(), HandshakeState::Established);
                assert_eq!(hs.negotiated(), Some(*n));
            }
            Some(Got::Rejected(_)) => {
                assert_eq!(role, Role::Initiator, "feed rejected at a responder");
                assert_eq!(hs.state(), HandshakeState::Rejected);
                assert!(hs.negotiated().is_none());
            }
            Some(Got::Failed(_) | Got::Waiting) => {}
        }
        if let Some(g) = got {
            if role == Role::Initiator {
                assert!(!hs.can_reject());
            }
            return (g, consumed);
        }
        off += n;
        if off == stream.len() {
            assert_eq!(consumed, stream.len());
            assert!(hs.error().is_none());
            return (Got::Waiting, consumed);
        }
    }
}

/// What must hold for any further input once a machine reported `got`.
fn check_after(hs: &mut Handshake, got: &Got, more: &[u8]) {
    match got {
        Got::Failed(e) => {
            let state = hs.state();
            assert_eq!(
                hs.feed(more),
                Err(MpaError::InvalidState),
                "event after an error"
            );
            assert_eq!(hs.feed(&[]), Err(MpaError::InvalidState));
            assert_eq!(hs.state(), state);
            assert_eq!(hs.error(), Some(*e), "the error must stay");
        }
        Got::Established(_) | Got::Rejected(_) => {
            let state = hs.state();
            let f = hs.feed(more).expect("feed after the handshake");
            assert_eq!((f.consumed, f.event), (0, None));
            assert_eq!(hs.state(), state);
        }
        Got::Waiting | Got::Request { .. } => {}
    }
}

fn is_format_error(e: &MpaError) -> bool {
    matches!(
        e,
        MpaError::BadKey
            | MpaError::BadRevision(_)
            | MpaError::PrivateDataTooLong(_)
            | MpaError::EnhancedDataMissing
    )
}

/// Checks `got` against a direct parse of the same octets and, for a policy
/// error, that the frame and configuration justify it.
fn check_against_parse(
    hs: &Handshake,
    got: &Got,
    consumed: usize,
    stream: &[u8],
    cfg: &MpaConfig<'_>,
    sent: Option<&MpaFrameRepr<'_>>,
) {
    let role = hs.role();
    let direct = MpaFrameRepr::parse(stream);
    match got {
        Got::Waiting => {
            assert!(
                matches!(direct, Err(MpaError::Incomplete { .. })),
                "machine waits but parse says {direct:?}"
            );
            assert_eq!(consumed, stream.len());
            assert!(hs.peer_private_data().is_empty());
            assert!(hs.peer_enhanced().is_none());
        }
        Got::Failed(e) if is_format_error(e) => {
            assert_eq!(direct.err(), Some(*e), "machine and parse disagree");
            assert!(!hs.can_reject());
        }
        Got::Failed(e) => {
            let (repr, _) = direct.unwrap_or_else(|d| panic!("policy error {e:?}, parse {d:?}"));
            assert_eq!(hs.can_reject(), role == Role::Responder);
            assert_eq!(hs.peer_private_data(), repr.private_data);
            assert_eq!(hs.peer_enhanced(), repr.enhanced);
            justify(role, e, &repr, cfg, sent);
        }
        Got::Request { .. } | Got::Established(_) | Got::Rejected(_) => {
            let (repr, total) = direct.unwrap_or_else(|d| panic!("event {got:?}, parse {d:?}"));
            assert_eq!(consumed, total, "frame end");
            assert_eq!(hs.peer_private_data(), repr.private_data);
            assert_eq!(hs.peer_enhanced(), repr.enhanced);
            match got {
                Got::Request {
                    revision,
                    crc,
                    markers,
                    reserved,
                    enhanced,
                    pd,
                } => {
                    assert_eq!(repr.kind, FrameKind::Request);
                    assert_eq!(
                        (*revision, *crc, *markers, *reserved, *enhanced),
                        (
                            repr.revision,
                            repr.flags.crc,
                            repr.flags.markers,
                            repr.flags.reserved,
                            repr.enhanced
                        )
                    );
                    assert_eq!(pd.as_slice(), repr.private_data);
                }
                Got::Rejected(pd) => {
                    assert_eq!(repr.kind, FrameKind::Reply);
                    assert!(repr.flags.reject);
                    assert_eq!(pd.as_slice(), repr.private_data);
                }
                Got::Established(_) => {
                    assert_eq!(repr.kind, FrameKind::Reply);
                    assert!(!repr.flags.reject);
                }
                _ => unreachable!(),
            }
        }
    }
}

/// A policy error must be explained by the frame and the configuration.
fn justify(
    role: Role,
    e: &MpaError,
    repr: &MpaFrameRepr<'_>,
    cfg: &MpaConfig<'_>,
    sent: Option<&MpaFrameRepr<'_>>,
) {
    let peer_crc = repr.flags.crc;
    let ok = match (role, e) {
        (Role::Initiator, MpaError::WrongFrameKind) => repr.kind == FrameKind::Request,
        (Role::Responder, MpaError::WrongFrameKind) => repr.kind == FrameKind::Reply,
        (Role::Initiator, MpaError::RevisionMismatch) => {
            let sent_rev = sent.map_or(cfg.revision, |s| s.revision);
            repr.revision > sent_rev || (cfg.strict && repr.revision != sent_rev)
        }
        (Role::Responder, MpaError::RevisionMismatch) => {
            cfg.strict && repr.revision != cfg.revision
        }
        (_, MpaError::MarkersUnsupported) => repr.flags.markers && !cfg.markers_tx,
        (_, MpaError::CrcPolicyMismatch) => match cfg.crc {
            CrcPolicy::Off => peer_crc,
            CrcPolicy::PreferOff => cfg.strict && peer_crc,
            CrcPolicy::On => !peer_crc && (cfg.strict || role == Role::Initiator),
        },
        (Role::Initiator, MpaError::EnhancedMismatch) => {
            let sent_enh = sent.is_some_and(|s| s.enhanced.is_some());
            (!sent_enh && repr.enhanced.is_some())
                || (cfg.strict && sent_enh && repr.enhanced.is_none())
        }
        (Role::Responder, MpaError::EnhancedMismatch) => {
            let local = repr.revision.min(cfg.revision) == Revision::V2 && cfg.enhanced.is_some();
            cfg.strict && (repr.enhanced.is_some() != local)
        }
        (Role::Initiator, MpaError::NoMatchingRtr) => {
            let s = sent.and_then(|s| s.enhanced);
            match (s, repr.enhanced) {
                (Some(s), Some(r)) => s.p2p && r.rtr.intersection(s.rtr).is_empty(),
                (Some(s), None) => s.p2p,
                _ => false,
            }
        }
        (Role::Responder, MpaError::NoMatchingRtr) => {
            // Either a P2P Request shares no RTR type with an enhanced
            // configuration in use, or P2P is required and cannot be used.
            let local_p2p = cfg.enhanced.is_some_and(|e| e.p2p);
            let local = if repr.revision.min(cfg.revision) == Revision::V2 {
                cfg.enhanced
            } else {
                None
            };
            let offered = matches!((repr.enhanced, local), (Some(r), Some(_)) if r.p2p);
            let chosen = match (repr.enhanced, local) {
                (Some(r), Some(l)) if r.p2p => r.rtr.intersection(l.rtr).preferred(),
                _ => None,
            };
            chosen.is_none() && (offered || local_p2p)
        }
        (Role::Initiator, MpaError::InsufficientIrd) => {
            let s = sent.and_then(|s| s.enhanced);
            match (s, repr.enhanced) {
                (Some(s), Some(r)) => {
                    let cap = cfg
                        .enhanced
                        .map_or(0, |e| e.ird_max)
                        .max(s.ird)
                        .min(IRD_ORD_MAX);
                    let read_rtr =
                        s.p2p && r.rtr.intersection(s.rtr).preferred() == Some(Rtr::Read);
                    r.ord > cap || (read_rtr && s.ord.min(r.ird) == 0)
                }
                _ => false,
            }
        }
        _ => false,
    };
    assert!(
        ok,
        "{role:?} error {e:?} not justified by {repr:?} under {cfg:?}"
    );
}

// ---------------------------------------------------------------------------
// Initiator
// ---------------------------------------------------------------------------

/// Creates the initiator for `side`, checking `Handshake::initiator`'s
/// result and the Request it wrote. `None` if the configuration is refused.
fn make_initiator(side: &Side, req: &mut [u8; OUT_LEN]) -> Option<(Handshake, usize)> {
    let mut pd_buf = [0u8; PD_MAX];
    let pd = side.pd(&mut pd_buf);
    let cfg = side.config(pd);
    let enh = cfg.revision == Revision::V2 && cfg.enhanced.is_some();
    let pd_total = pd.len() + if enh { ENHANCED_DATA_LEN } else { 0 };
    let expect_err = if enh && cfg.enhanced.is_some_and(|e| e.p2p && e.rtr.is_empty()) {
        Some(MpaError::InvalidParameter)
    } else if pd_total > MAX_PRIVATE_DATA {
        Some(MpaError::PrivateDataTooLong(pd_total))
    } else {
        None
    };
    if side.short_first() {
        let short = usize::from(side.short);
        let r = Handshake::initiator(&cfg, &mut req[..short]);
        match (expect_err, r) {
            (Some(e), r) => assert_eq!(r.err(), Some(e)),
            (None, Err(e)) => {
                assert!(short < FRAME_HEADER_LEN + pd_total);
                assert_eq!(
                    e,
                    MpaError::BufferTooSmall {
                        needed: FRAME_HEADER_LEN + pd_total
                    }
                );
            }
            (None, Ok((_, n))) => assert!(n <= short),
        }
    }
    let (hs, n) = match Handshake::initiator(&cfg, req) {
        Ok(x) => x,
        Err(e) => {
            assert_eq!(Some(e), expect_err);
            return None;
        }
    };
    assert_eq!(expect_err, None);
    assert_eq!(n, FRAME_HEADER_LEN + pd_total);
    assert_eq!(hs.role(), Role::Initiator);
    assert_eq!(hs.state(), HandshakeState::AwaitingReply);
    assert!(!hs.can_reject() && hs.negotiated().is_none() && hs.error().is_none());
    // The Request as written.
    let (r, total) = MpaFrameRepr::parse(&req[..n]).expect("own Request parses");
    assert_eq!(total, n);
    assert_eq!(r.kind, FrameKind::Request);
    assert_eq!(r.revision, cfg.revision);
    assert_eq!(
        r.flags,
        MpaFlags {
            markers: cfg.markers_rx,
            crc: cfg.crc == CrcPolicy::On,
            reject: false,
            reserved: 0,
        }
    );
    assert_eq!(r.private_data, pd);
    assert_eq!(r.enhanced.is_some(), enh);
    if let (Some(b), Some(e)) = (r.enhanced, cfg.enhanced) {
        let mut ord = e.ord.min(IRD_ORD_MAX);
        if e.p2p && e.rtr.contains(Rtr::Read) && ord == 0 {
            ord = 1;
        }
        assert_eq!(
            b,
            EnhancedData {
                ird: e.ird.min(IRD_ORD_MAX),
                ord,
                p2p: e.p2p,
                rtr: if e.p2p { e.rtr } else { RtrSet::EMPTY },
            }
        );
    }
    Some((hs, n))
}

/// Bounds on what an initiator negotiated from `reply`.
fn check_initiator_negotiated(
    n: &Negotiated,
    cfg: &MpaConfig<'_>,
    sent: &MpaFrameRepr<'_>,
    reply: &MpaFrameRepr<'_>,
) {
    assert_eq!(n.revision, reply.revision);
    assert!(n.revision <= sent.revision && sent.revision == cfg.revision);
    if cfg.strict {
        assert_eq!(n.revision, cfg.revision);
    }
    assert_eq!(n.markers_rx, cfg.markers_rx);
    assert_eq!(n.markers_tx, reply.flags.markers);
    assert!(!n.markers_tx || cfg.markers_tx);
    match cfg.crc {
        CrcPolicy::Off => assert!(!n.crc),
        CrcPolicy::On => assert!(n.crc),
        CrcPolicy::PreferOff => {
            assert_eq!(n.crc, reply.flags.crc);
            assert!(!(cfg.strict && n.crc));
        }
    }
    assert_eq!(n.p2p, n.rtr.is_some());
    assert_eq!(
        n.enhanced,
        sent.enhanced.is_some() && reply.enhanced.is_some()
    );
    match (sent.enhanced, reply.enhanced) {
        (Some(s), Some(r)) => {
            let e = cfg.enhanced.expect("enhanced Request without config");
            let cap = e.ird_max.max(s.ird).min(IRD_ORD_MAX);
            assert!(
                n.ird >= s.ird && n.ird <= cap,
                "IRD {} outside {}..={cap}",
                n.ird,
                s.ird
            );
            assert!(
                n.ird >= r.ord,
                "peer ORD {} exceeds our IRD {}",
                r.ord,
                n.ird
            );
            assert_eq!(n.ord, s.ord.min(r.ird));
            assert!(n.ord <= IRD_ORD_MAX);
            match n.rtr {
                Some(x) => {
                    assert!(s.p2p && s.rtr.contains(x) && r.rtr.contains(x));
                    assert_eq!(Some(x), r.rtr.intersection(s.rtr).preferred());
                    if x == Rtr::Read {
                        assert!(n.ord >= 1);
                    }
                }
                None => assert!(!s.p2p),
            }
        }
        (Some(s), None) => {
            assert!(!cfg.strict && !s.p2p);
            assert_eq!((n.ird, n.ord, n.rtr), (s.ird, s.ord, None));
        }
        (None, _) => {
            assert!(reply.enhanced.is_none());
            let (i, o) = cfg.enhanced.map_or((0, 0), |e| (e.ird, e.ord));
            assert_eq!((n.ird, n.ord, n.rtr), (i, o, None));
        }
    }
}

fn run_initiator(side: &Side, sched: &mut Schedule<'_>, stream: &[u8]) -> &'static str {
    let mut req = [0u8; OUT_LEN];
    let Some((mut hs, n)) = make_initiator(side, &mut req) else {
        return "initiator: config refused";
    };
    let mut pd_buf = [0u8; PD_MAX];
    let cfg = side.config(side.pd(&mut pd_buf));
    let (sent, _) = MpaFrameRepr::parse(&req[..n]).expect("own Request");
    let (got, consumed) = drive(&mut hs, stream, sched);
    check_against_parse(&hs, &got, consumed, stream, &cfg, Some(&sent));
    if let Got::Established(neg) = &got {
        let (reply, _) = MpaFrameRepr::parse(stream).expect("checked");
        check_initiator_negotiated(neg, &cfg, &sent, &reply);
    }
    check_after(&mut hs, &got, &stream[consumed.min(stream.len())..]);
    match got {
        Got::Waiting => "initiator: waiting",
        Got::Established(_) => "initiator: established",
        Got::Rejected(_) => "initiator: rejected",
        Got::Failed(e) if is_format_error(&e) => "initiator: bad frame",
        Got::Failed(_) => "initiator: policy error",
        Got::Request { .. } => unreachable!(),
    }
}

// ---------------------------------------------------------------------------
// Responder
// ---------------------------------------------------------------------------

/// The Request as the responder reported it.
struct PeerReq {
    revision: Revision,
    crc: bool,
    markers: bool,
    enhanced: Option<EnhancedData>,
}

/// Calls `accept` (after a short-buffer try if asked), checks the result
/// and the Reply; returns the Reply length and the negotiated values.
fn accept(
    hs: &mut Handshake,
    side: &Side,
    req: &PeerReq,
    out: &mut [u8; OUT_LEN],
) -> (usize, Negotiated, usize) {
    let mut pd_buf = [0u8; PD_MAX];
    let mut pd = side.pd(&mut pd_buf);
    let cfg = side.config(&[]);
    let (acc_ird, acc_ord) = (side.acc_ird, side.acc_ord);
    let revision = req.revision.min(cfg.revision);
    let enh = req.enhanced.is_some() && revision == Revision::V2 && cfg.enhanced.is_some();
    let blk = if enh { ENHANCED_DATA_LEN } else { 0 };
    if side.short_first() {
        let short = usize::from(side.short);
        if let Err(e) = hs.accept(pd, acc_ird, acc_ord, &mut out[..short]) {
            let total = pd.len() + blk;
            if total > MAX_PRIVATE_DATA {
                assert_eq!(e, MpaError::PrivateDataTooLong(total));
            } else {
                assert!(short < FRAME_HEADER_LEN + total);
                assert_eq!(
                    e,
                    MpaError::BufferTooSmall {
                        needed: FRAME_HEADER_LEN + total
                    }
                );
            }
            assert_eq!(hs.state(), HandshakeState::AwaitingDecision);
            assert!(hs.negotiated().is_none() && hs.can_reject());
        } else {
            return finish_accept(hs, side, req, out, pd.len(), enh);
        }
    }
    if pd.len() + blk > MAX_PRIVATE_DATA {
        assert_eq!(
            hs.accept(pd, acc_ird, acc_ord, out).err(),
            Some(MpaError::PrivateDataTooLong(pd.len() + blk))
        );
        assert_eq!(hs.state(), HandshakeState::AwaitingDecision);
        pd = &[];
    }
    hs.accept(pd, acc_ird, acc_ord, out)
        .expect("accept with room and short private data");
    finish_accept(hs, side, req, out, pd.len(), enh)
}

fn finish_accept(
    hs: &mut Handshake,
    side: &Side,
    req: &PeerReq,
    out: &[u8; OUT_LEN],
    pd_len: usize,
    enh: bool,
) -> (usize, Negotiated, usize) {
    let n = hs.negotiated().expect("negotiated after accept");
    assert_eq!(hs.state(), HandshakeState::Established);
    assert!(!hs.can_reject());
    let cfg = side.config(&[]);
    let (acc_ird, acc_ord) = (side.acc_ird, side.acc_ord);
    // The Reply.
    let (r, len) = MpaFrameRepr::parse(out).expect("own Reply parses");
    assert_eq!(
        len,
        FRAME_HEADER_LEN + pd_len + if enh { ENHANCED_DATA_LEN } else { 0 }
    );
    assert_eq!(r.kind, FrameKind::Reply);
    assert_eq!(
        r.flags,
        MpaFlags {
            markers: cfg.markers_rx,
            crc: n.crc,
            reject: false,
            reserved: 0,
        }
    );
    assert_eq!(r.revision, n.revision);
    assert_eq!(r.private_data.len(), pd_len);
    assert_eq!(r.enhanced.is_some(), n.enhanced);
    if let Some(b) = r.enhanced {
        assert_eq!((b.ird, b.ord, b.p2p), (n.ird, n.ord, n.p2p));
        assert_eq!(b.rtr, n.rtr.map_or(RtrSet::EMPTY, RtrSet::only));
    }
    // Bounds.
    assert_eq!(n.revision, req.revision.min(cfg.revision));
    if cfg.strict {
        assert_eq!(req.revision, cfg.revision);
    }
    assert_eq!(n.markers_rx, cfg.markers_rx);
    assert_eq!(n.markers_tx, req.markers);
    assert!(!n.markers_tx || cfg.markers_tx);
    if req.crc {
        assert!(n.crc, "a Request with C must be answered with C");
    }
    match cfg.crc {
        CrcPolicy::Off => assert!(!n.crc),
        CrcPolicy::On => assert!(n.crc),
        CrcPolicy::PreferOff => assert_eq!(n.crc, req.crc),
    }
    assert_eq!(n.enhanced, enh);
    assert_eq!(n.p2p, n.rtr.is_some());
    let local = cfg.enhanced;
    match n.rtr {
        Some(x) => {
            let q = req.enhanced.expect("RTR without a block");
            let l = local.expect("RTR without config");
            assert!(q.p2p && q.rtr.contains(x) && l.rtr.contains(x));
            assert_eq!(Some(x), q.rtr.intersection(l.rtr).preferred());
        }
        None => {
            assert!(!local.is_some_and(|l| l.p2p), "P2P required but not used");
            assert!(!(enh && req.enhanced.is_some_and(|q| q.p2p)));
        }
    }
    if enh {
        let q = req.enhanced.expect("checked");
        let ird_max = local.map_or(0, |l| l.ird_max);
        let cap = ird_max.max(acc_ird).min(IRD_ORD_MAX);
        assert!(
            n.ord <= acc_ord && n.ord <= q.ird,
            "ORD {} above {acc_ord} or peer IRD {}",
            n.ord,
            q.ird
        );
        assert!(n.ird >= acc_ird.min(IRD_ORD_MAX));
        assert!(n.ird <= cap.max(1) && n.ird <= IRD_ORD_MAX);
        if n.rtr == Some(Rtr::Read) {
            assert!(n.ird >= 1);
        }
        if n.ird > cap {
            assert_eq!((n.ird, n.rtr), (1, Some(Rtr::Read)));
        }
    } else {
        assert_eq!((n.ird, n.ord), (acc_ird, acc_ord));
    }
    // After the decision.
    let mut again = [0u8; OUT_LEN];
    assert_eq!(
        hs.accept(&[], 0, 0, &mut again).err(),
        Some(MpaError::InvalidState)
    );
    assert_eq!(
        hs.reject(&[], &mut again).err(),
        Some(MpaError::InvalidState)
    );
    let f = hs.feed(&[0]).expect("feed when established");
    assert_eq!((f.consumed, f.event), (0, None));
    assert_eq!(hs.negotiated(), Some(n));
    (len, n, pd_len)
}

/// Calls `reject` (after a short-buffer try if asked); checks the Reply.
/// Returns its length and the private data length used.
fn reject(
    hs: &mut Handshake,
    side: &Side,
    req_rev: Revision,
    out: &mut [u8; OUT_LEN],
) -> (usize, usize) {
    assert!(hs.can_reject());
    let state = hs.state();
    let mut pd_buf = [0u8; PD_MAX];
    let mut pd = side.pd(&mut pd_buf);
    if side.short_first() {
        let short = usize::from(side.short);
        match hs.reject(pd, &mut out[..short]) {
            Ok(_) => return finish_reject(hs, side, req_rev, out, pd.len()),
            Err(e) => assert!(
                matches!(
                    e,
                    MpaError::BufferTooSmall { .. } | MpaError::PrivateDataTooLong(_)
                ),
                "reject: {e:?}"
            ),
        }
        assert_eq!(hs.state(), state);
        assert!(hs.can_reject());
    }
    let n = match hs.reject(pd, out) {
        Ok(n) => n,
        Err(e) => {
            assert!(
                matches!(e, MpaError::PrivateDataTooLong(_)),
                "reject: {e:?}"
            );
            assert!(pd.len() + ENHANCED_DATA_LEN > MAX_PRIVATE_DATA);
            assert_eq!(hs.state(), state);
            pd = &[];
            hs.reject(pd, out).expect("reject with empty private data")
        }
    };
    let r = finish_reject(hs, side, req_rev, out, pd.len());
    assert_eq!(r.0, n);
    r
}

fn finish_reject(
    hs: &mut Handshake,
    side: &Side,
    req_rev: Revision,
    out: &[u8; OUT_LEN],
    pd_len: usize,
) -> (usize, usize) {
    assert_eq!(hs.state(), HandshakeState::Rejected);
    assert!(!hs.can_reject());
    let cfg = side.config(&[]);
    let (r, len) = MpaFrameRepr::parse(out).expect("own reject Reply parses");
    assert_eq!(r.kind, FrameKind::Reply);
    assert!(r.flags.reject && !r.flags.crc && !r.flags.markers);
    assert_eq!(r.revision, req_rev.min(cfg.revision));
    assert_eq!(r.private_data.len(), pd_len);
    let mut pd_buf = [0u8; PD_MAX];
    let pd = side.pd(&mut pd_buf);
    assert_eq!(r.private_data, &pd[..pd_len]);
    let mut again = [0u8; OUT_LEN];
    assert_eq!(
        hs.reject(&[], &mut again).err(),
        Some(MpaError::InvalidState)
    );
    assert_eq!(
        hs.accept(&[], 0, 0, &mut again).err(),
        Some(MpaError::InvalidState)
    );
    let f = hs.feed(&[0]).expect("feed when rejected");
    assert_eq!((f.consumed, f.event), (0, None));
    (len, pd_len)
}

/// What the responder did with the Request.
enum Decision {
    Accepted(usize, Negotiated),
    Rejected(usize, usize),
    /// It failed and could not reject (or the stream did not hold a Request).
    None(&'static str),
}

/// Responder flow shared by modes 1 and 2: drive, check, decide.
fn respond(
    side: &Side,
    sched: &mut Schedule<'_>,
    stream: &[u8],
    after: &[u8],
    out: &mut [u8; OUT_LEN],
) -> (Decision, Got) {
    let cfg = side.config(&[]);
    let mut hs = Handshake::responder(&cfg);
    assert_eq!(hs.role(), Role::Responder);
    assert!(!hs.can_reject());
    let (got, consumed) = drive(&mut hs, stream, sched);
    check_against_parse(&hs, &got, consumed, stream, &cfg, None);
    let leftover = &stream[consumed.min(stream.len())..];
    let req_rev = MpaFrameRepr::parse(stream).map_or(Revision::V1, |(r, _)| r.revision);
    let decision = match &got {
        Got::Waiting => Decision::None("responder: waiting"),
        Got::Failed(e) => {
            if hs.can_reject() {
                let mut hs2 = hs.clone();
                check_after(&mut hs2, &got, leftover);
                let (len, pdl) = reject(&mut hs, side, req_rev, out);
                Decision::Rejected(len, pdl)
            } else {
                check_after(&mut hs, &got, leftover);
                Decision::None(if is_format_error(e) {
                    "responder: bad frame"
                } else {
                    "responder: policy error, no reject"
                })
            }
        }
        Got::Request {
            revision,
            crc,
            markers,
            enhanced,
            ..
        } => {
            let req = PeerReq {
                revision: *revision,
                crc: *crc,
                markers: *markers,
                enhanced: *enhanced,
            };
            let mut action = side.action();
            if action == Action::FeedMore {
                let more: Vec<u8> = leftover.iter().chain(after).copied().collect();
                match hs.feed(&more) {
                    Ok(f) => {
                        assert!(more.is_empty());
                        assert_eq!((f.consumed, f.event), (0, None));
                        assert_eq!(hs.state(), HandshakeState::AwaitingDecision);
                        action = Action::Accept;
                    }
                    Err(e) => {
                        assert!(!more.is_empty());
                        assert_eq!(e, MpaError::UnexpectedData);
                        assert_eq!(hs.state(), HandshakeState::Failed);
                        assert!(hs.can_reject(), "UnexpectedData must allow a reject");
                        let mut hs2 = hs.clone();
                        check_after(&mut hs2, &Got::Failed(e), &more);
                        action = Action::Reject;
                    }
                }
            }
            match action {
                Action::Accept => {
                    let (len, n, _) = accept(&mut hs, side, &req, out);
                    Decision::Accepted(len, n)
                }
                _ => {
                    let (len, pdl) = reject(&mut hs, side, req.revision, out);
                    Decision::Rejected(len, pdl)
                }
            }
        }
        Got::Established(_) | Got::Rejected(_) => unreachable!("checked in drive"),
    };
    (decision, got)
}

fn run_responder(side: &Side, sched: &mut Schedule<'_>, stream: &[u8]) -> &'static str {
    let mut out = [0u8; OUT_LEN];
    match respond(side, sched, stream, &[], &mut out).0 {
        Decision::Accepted(..) => "responder: accepted",
        Decision::Rejected(..) => "responder: rejected",
        Decision::None(s) => s,
    }
}

// ---------------------------------------------------------------------------
// Pair
// ---------------------------------------------------------------------------

fn run_pair(a: &Side, b: &Side, sched: &mut Schedule<'_>, trailing: &[u8]) -> &'static str {
    let mut req = [0u8; OUT_LEN];
    let Some((mut init, n)) = make_initiator(a, &mut req) else {
        return "pair: initiator config refused";
    };
    let mut pd_buf = [0u8; PD_MAX];
    let acfg = a.config(a.pd(&mut pd_buf));
    let (sent, _) = MpaFrameRepr::parse(&req[..n]).expect("own Request");

    let mut rep = [0u8; OUT_LEN];
    let (decision, got_b) = respond(b, sched, &req[..n], trailing, &mut rep);
    match &got_b {
        Got::Request { .. } => {}
        Got::Failed(e) => assert!(
            !is_format_error(e),
            "responder refused a well-formed Request: {e:?}"
        ),
        other => panic!("responder on a complete Request: {other:?}"),
    }
    let (len, b_neg, b_pd) = match decision {
        Decision::Accepted(len, n) => (len, Some(n), None),
        Decision::Rejected(len, pdl) => (len, None, Some(pdl)),
        Decision::None(_) => return "pair: responder failed",
    };

    // The Reply, then FPDU octets in the same pieces.
    let mut stream = rep[..len].to_vec();
    stream.extend_from_slice(trailing);
    let (got, consumed) = drive(&mut init, &stream, sched);
    check_against_parse(&init, &got, consumed, &stream, &acfg, Some(&sent));
    if !matches!(got, Got::Failed(_)) {
        assert_eq!(consumed, len, "the initiator must stop at the Reply's end");
    }
    check_after(&mut init, &got, &stream[consumed.min(stream.len())..]);
    match (got, b_neg, b_pd) {
        (Got::Established(na), Some(nb), _) => {
            let (reply, _) = MpaFrameRepr::parse(&stream).expect("checked");
            check_initiator_negotiated(&na, &acfg, &sent, &reply);
            assert_eq!(na.revision, nb.revision);
            assert_eq!(na.crc, nb.crc, "CRC disagreement");
            assert_eq!(na.markers_tx, nb.markers_rx, "markers initiator->responder");
            assert_eq!(na.markers_rx, nb.markers_tx, "markers responder->initiator");
            assert_eq!(na.enhanced, nb.enhanced);
            assert_eq!((na.p2p, na.rtr), (nb.p2p, nb.rtr), "RTR disagreement");
            if na.enhanced {
                assert!(
                    na.ord <= nb.ird,
                    "initiator ORD {} > responder IRD {}",
                    na.ord,
                    nb.ird
                );
                assert!(
                    nb.ord <= na.ird,
                    "responder ORD {} > initiator IRD {}",
                    nb.ord,
                    na.ird
                );
            }
            if na.rtr == Some(Rtr::Read) {
                assert!(na.ord >= 1 && nb.ird >= 1);
            }
            "pair: established"
        }
        (Got::Failed(e), Some(_), _) => {
            assert!(
                !is_format_error(&e),
                "initiator refused our own Reply: {e:?}"
            );
            assert!(e != MpaError::WrongFrameKind);
            "pair: initiator refused"
        }
        (Got::Rejected(pd), None, Some(pdl)) => {
            let mut buf = [0u8; PD_MAX];
            let bpd = b.pd(&mut buf);
            assert_eq!(pd.as_slice(), &bpd[..pdl], "reject private data");
            "pair: rejected"
        }
        (got, bn, _) => panic!("initiator {got:?} after responder decision {bn:?}"),
    }
}
