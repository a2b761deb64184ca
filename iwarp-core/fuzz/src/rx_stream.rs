// SPDX-License-Identifier: GPL-2.0
//! `rx_stream`: the incremental receive parser ([`Receiver`]) fed a hostile
//! octet stream or a valid stream of scripted messages (optionally with one
//! octet flipped), each in three different splits.
//!
//! Input layout:
//!
//! ```text
//! flags     1 octet: F_CRC, F_MARKERS, F_ATOMICS, F_IMMEDIATE (extensions),
//!           F_RAW (the stream is raw octets, not a script), F_FLIP,
//!           F_REJECT, F_INTERLEAVE
//! start     4 octets: marker stream offset of the first octet (its two low
//!           bits are cleared: FPDUs start 4-aligned)
//! max_ulpdu 2 octets: RxConfig::max_ulpdu_len (0 = 65535)
//! queues    1 octet: RxConfig::queues (modulo 8; above 4 counts as 4)
//! posted    1 octet: bit i (i < 4) a buffer is posted on QN i, bit 4
//!           (P_EXACT, scripts only): a buffer of the exact length for every
//!           untagged message instead; then 4 x 2 octets: the buffer
//!           lengths of QN 0-3
//! reject    3 octets (F_REJECT): reject at the n-th Header (from 0) with
//!           the Terminate code (layer/type octet, code octet)
//! flip      5 octets (F_FLIP, scripts): position (modulo the stream
//!           length, 4 octets) and xor mask (1 octet, 0 = 0x01)
//! schedule  n (1 octet, modulo 16), then n piece sizes, cycled (0 = an
//!           empty piece; n = 0 feeds the stream as one piece)
//! raw       F_RAW: the rest of the input is the stream
//! script    otherwise: MULPDU (2 octets, at least 19, at most
//!           MAX_MARKED_MULPDU with markers), count (1 octet, modulo 17),
//!           count x 16 octets MsgSpec (see `stream`), then the
//!           interleaving: each octet picks the lane (tagged, QN 0-3) whose
//!           next segment goes on the wire (F_INTERLEAVE); without octets
//!           left, or without F_INTERLEAVE, messages go whole, in order
//! ```
//!
//! The script's messages are built into a stream by the reference
//! transmitter (`Segmenter`, `DdpHeader::emit`, the fixed-payload emitters,
//! `mpa::emit_fpdu`: `stream::RefStream`); their payloads total at most
//! [`MAX_PAYLOAD`] octets. Messages within a lane keep their order (and
//! so their MSNs); tagged messages never interleave with each other.
//!
//! Invariants checked (a violation panics), for every stream and split (in
//! one piece, one octet at a time, the schedule; `stream::drive`):
//! - `feed` never consumes more than given; `Ok(None)` consumes everything;
//!   after an `Err` every call returns the same error with 0 consumed, and
//!   `reject` returns it too;
//! - the error's Terminate is the one `TerminateRepr::for_segment` builds for
//!   the offending segment with the code the error kind maps to, is
//!   consistent, and round-trips through `emit_message` and
//!   `TerminateRepr::parse`; every error is justified by an independent
//!   framing of the stream (`stream::Framing`: markers, FPDUPTRs, CRCs) and
//!   a model of the DDP queue state;
//! - the three splits give the same events (Data concatenated per target),
//!   the same error, the same posted-buffer queries;
//! - Data follows its Header, is contiguous, inside the payload, the posted
//!   buffer and the TO space, and holds the stream's octets; the payload per
//!   segment is ULPDU_Length minus the headers; Done comes after all Data,
//!   only for a complete FPDU with a good CRC and markers, with the message
//!   length at the last segment; MSNs advance as sent;
//! - a script: the framing finds exactly the reference FPDUs; the events
//!   are exactly those the messages call for (headers, payload octets,
//!   fixed payloads, message lengths, queries), and the error, if any, the
//!   one the configuration calls for (ULPDU limit, extensions, queues,
//!   posted buffers, a Terminate, the rejection); without error the
//!   receiver ends at an FPDU boundary with `stream_pos()` equal to the
//!   reference transmitter's `MarkerState`;
//! - a flipped octet: the FPDUs before it give the same events; with CRC
//!   the stream fails no later than the end of the flipped FPDU, which never
//!   gets `Done` (except for flips the CRC cannot see: in ULPDU_Length,
//!   which reframes the stream, or in an uncovered marker's reserved field);
//! - `reject(code)` after a Header fails the stream with that code.

use super::stream::{
    check_expected, check_flip, check_framing, drive_splits, expected_outcome, kind_name,
    payload_bytes, Framing, MsgSpec, Outcome, Posted, RefStream,
};
use super::{Input, Schedule};
use iwarp_core::ddp::Segment;
use iwarp_core::rdmap::{Extensions, QUEUE_COUNT};
use iwarp_core::rx::RxConfig;
use iwarp_core::terminate::{RemoteOperationCode, TermCode};
use iwarp_core::tx::MAX_MARKED_MULPDU;

/// Flags: CRC.
pub const F_CRC: u8 = 0x01;
/// Flags: markers.
pub const F_MARKERS: u8 = 0x02;
/// Flags: RFC 7306 atomics enabled.
pub const F_ATOMICS: u8 = 0x04;
/// Flags: RFC 7306 Immediate Data enabled.
pub const F_IMMEDIATE: u8 = 0x08;
/// Flags: the stream is raw octets.
pub const F_RAW: u8 = 0x10;
/// Flags: flip one octet of the script's stream.
pub const F_FLIP: u8 = 0x20;
/// Flags: reject a segment.
pub const F_REJECT: u8 = 0x40;
/// Flags: interleave the lanes as the input says.
pub const F_INTERLEAVE: u8 = 0x80;
/// Posted flags: exact per-message buffers (scripts).
pub const P_EXACT: u8 = 0x10;

/// Largest total payload of a script: keeps one-octet feeding (and the
/// model checks per octet) at a few hundred executions per second; 4 KiB
/// still spans eight marker intervals.
pub const MAX_PAYLOAD: u32 = 4 * 1024;
/// Largest number of messages in a script.
pub const MAX_MSGS: usize = 16;
/// Smallest MULPDU of a script: an untagged header and one octet.
pub const MIN_MULPDU: u16 = 19;

/// The decoded input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RxInput {
    /// `F_*`.
    pub flags: u8,
    /// Marker stream offset of the first octet.
    pub start: u32,
    /// `max_ulpdu_len` (0 = 65535).
    pub max_ulpdu: u16,
    /// `queues` (modulo 8).
    pub queues: u8,
    /// Posted buffers: bit i for QN i, [`P_EXACT`].
    pub posted: u8,
    /// Buffer lengths of QN 0-3.
    pub lens: [u16; QUEUE_COUNT],
    /// Reject at this Header, with this code (layer/type, code).
    pub reject: (u8, u8, u8),
    /// Flip: position, mask.
    pub flip: (u32, u8),
    /// Piece sizes.
    pub schedule: Vec<u8>,
    /// Script: MULPDU.
    pub mulpdu: u16,
    /// Script: messages.
    pub msgs: Vec<MsgSpec>,
    /// Raw: the stream; script: the interleaving octets.
    pub rest: Vec<u8>,
}

impl RxInput {
    /// The octets [`run`] decodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![self.flags];
        v.extend_from_slice(&self.start.to_be_bytes());
        v.extend_from_slice(&self.max_ulpdu.to_be_bytes());
        v.push(self.queues);
        v.push(self.posted);
        for l in self.lens {
            v.extend_from_slice(&l.to_be_bytes());
        }
        if self.flags & F_REJECT != 0 {
            v.extend_from_slice(&[self.reject.0, self.reject.1, self.reject.2]);
        }
        if self.flags & F_FLIP != 0 && self.flags & F_RAW == 0 {
            v.extend_from_slice(&self.flip.0.to_be_bytes());
            v.push(self.flip.1);
        }
        Schedule::encode(&self.schedule, &mut v);
        if self.flags & F_RAW == 0 {
            v.extend_from_slice(&self.mulpdu.to_be_bytes());
            assert!(self.msgs.len() <= MAX_MSGS);
            v.push(self.msgs.len() as u8);
            for m in &self.msgs {
                m.encode(&mut v);
            }
        }
        v.extend_from_slice(&self.rest);
        v
    }
}

/// The receive configuration of the input's flags and fields.
fn config(flags: u8, start: u32, max_ulpdu: u16, queues: u8) -> RxConfig {
    let mut cfg = RxConfig::new(flags & F_CRC != 0);
    if flags & F_MARKERS != 0 {
        cfg.markers = Some(start & !3);
    }
    cfg.extensions = Extensions {
        atomics: flags & F_ATOMICS != 0,
        immediate_data: flags & F_IMMEDIATE != 0,
    };
    cfg.max_ulpdu_len = if max_ulpdu == 0 { u16::MAX } else { max_ulpdu };
    cfg.queues = u32::from(queues % 8);
    cfg
}

/// Decodes and checks one input; returns what it reached.
pub fn run(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let start = inp.u32();
    let max_ulpdu = inp.u16();
    let queues = inp.u8();
    let cfg = config(flags, start, max_ulpdu, queues);
    let posted_bits = inp.u8();
    let mut per_queue = [None; QUEUE_COUNT];
    for (qn, slot) in per_queue.iter_mut().enumerate() {
        let len = inp.u16();
        if posted_bits & (1 << qn) != 0 {
            *slot = Some(u32::from(len));
        }
    }
    let reject = if flags & F_REJECT != 0 {
        let idx = inp.u8();
        let (lt, code) = (inp.u8(), inp.u8());
        let code = TermCode::from_wire(lt >> 4, lt & 0x0f, code).unwrap_or(
            TermCode::RdmapRemoteOperation(RemoteOperationCode::Unspecified),
        );
        Some((usize::from(idx), code))
    } else {
        None
    };
    let raw = flags & F_RAW != 0;
    let flip = if flags & F_FLIP != 0 && !raw {
        let pos = inp.u32();
        let mask = inp.u8();
        Some((pos, if mask == 0 { 1 } else { mask }))
    } else {
        None
    };
    let sched = Schedule::decode(&mut inp);
    if raw {
        let wire = inp.rest();
        let framing = Framing::parse(wire, cfg.markers);
        let posted = Posted::per_queue(per_queue);
        let o = drive_splits(&cfg, wire, &framing, &sched, &posted, reject);
        return outcome_name(&o);
    }

    // A script.
    let mut mulpdu = inp.u16().max(MIN_MULPDU);
    if cfg.markers.is_some() {
        mulpdu = mulpdu.min(MAX_MARKED_MULPDU);
    }
    let count = usize::from(inp.u8()) % (MAX_MSGS + 1);
    let specs: Vec<MsgSpec> = (0..count).map(|_| MsgSpec::decode(&mut inp)).collect();
    let order = inp.rest();
    let mut r = RefStream::new(cfg.crc, cfg.markers);
    // Lane 0: tagged; lane 1 + QN: untagged.
    let mut lanes: [Vec<(usize, Vec<Segment>)>; 1 + QUEUE_COUNT] = Default::default();
    let mut budget = MAX_PAYLOAD;
    for s in &specs {
        let len = s.wanted_len(true).min(budget);
        let m = s.message(len, false);
        let Ok((i, segs)) = r.add(m, payload_bytes(len, s.var), u32::from(mulpdu)) else {
            continue; // MULPDU too small or TO wrap: Segmenter refuses it.
        };
        budget -= len;
        let lane = m.opcode().queue_number().map_or(0, |qn| 1 + qn as usize);
        lanes[lane].push((i, segs));
    }
    emit_lanes(
        &mut r,
        &mut lanes,
        if flags & F_INTERLEAVE != 0 {
            order
        } else {
            &[]
        },
    );
    let posted = if posted_bits & P_EXACT != 0 {
        Posted::exact(&r)
    } else {
        Posted::per_queue(per_queue)
    };
    let wire = r.wire.clone();
    let framing = Framing::parse(&wire, cfg.markers);
    check_framing(&r, &framing);
    let x = expected_outcome(&r, r.segs.len(), &cfg, &posted, reject);
    let o = drive_splits(&cfg, &wire, &framing, &sched, &posted, reject);
    check_expected(&o, &x);
    if o.error.is_none() {
        assert_eq!(
            o.stream_pos,
            r.markers.map(|m| m.stream_pos()),
            "receiver and transmitter marker positions"
        );
    }
    let Some((pos, mask)) = flip.filter(|_| !wire.is_empty()) else {
        return outcome_name(&o);
    };
    let pos = pos as usize % wire.len();
    let mut flipped = wire;
    flipped[pos] ^= mask;
    let framing2 = Framing::parse(&flipped, cfg.markers);
    let o2 = drive_splits(&cfg, &flipped, &framing2, &sched, &posted, reject);
    if check_flip(&r, &framing, &x, &o2, pos, mask) {
        "flip detected"
    } else {
        "flip undetected"
    }
}

/// Puts the segments of the lanes on the wire: while `order` has octets,
/// each picks a non-empty lane (modulo their number) whose next segment
/// goes next; then the messages left go whole, lane by lane.
fn emit_lanes(
    r: &mut RefStream,
    lanes: &mut [Vec<(usize, Vec<Segment>)>; 1 + QUEUE_COUNT],
    order: &[u8],
) {
    // Per lane: (message position in the lane, segment position).
    let mut at = [(0usize, 0usize); 1 + QUEUE_COUNT];
    let next = |r: &mut RefStream, lane: usize, at: &mut [(usize, usize)]| {
        let (mi, si) = at[lane];
        let (i, segs) = &lanes[lane][mi];
        r.emit(*i, &segs[si]);
        at[lane] = if si + 1 == segs.len() {
            (mi + 1, 0)
        } else {
            (mi, si + 1)
        };
    };
    for &o in order {
        let open: Vec<usize> = (0..lanes.len())
            .filter(|&l| at[l].0 < lanes[l].len())
            .collect();
        if open.is_empty() {
            return;
        }
        next(r, open[usize::from(o) % open.len()], &mut at);
    }
    // Unfinished messages first (the lane's current one), in lane order.
    for lane in 0..lanes.len() {
        while at[lane].0 < lanes[lane].len() && at[lane].1 > 0 {
            next(r, lane, &mut at);
        }
    }
    // The rest whole, in script order.
    let mut rest: Vec<(usize, usize)> = (0..lanes.len())
        .flat_map(|l| (at[l].0..lanes[l].len()).map(move |mi| (l, mi)))
        .collect();
    rest.sort_by_key(|&(l, mi)| lanes[l][mi].0);
    for (l, mi) in rest {
        let (i, segs) = &lanes[l][mi];
        for s in segs {
            r.emit(*i, s);
        }
    }
}

/// What a run reached: "ok", "Terminate" (the stream ended with one) or
/// the error kind.
fn outcome_name(o: &Outcome) -> &'static str {
    match o.error {
        None if o.terminated => "Terminate",
        None => "ok",
        Some(e) => kind_name(&e.kind),
    }
}
