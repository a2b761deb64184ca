// SPDX-License-Identifier: GPL-2.0
//! `tx_roundtrip`: the transmit builder ([`Transmitter`], [`Batch`])
//! planning scripted messages into batches sent with short writes, compared
//! octet by octet with the reference transmitter, and the wire fed back to
//! the receiver.
//!
//! Input layout:
//!
//! ```text
//! flags    1 octet: T_CRC, T_MARKERS, T_ATOMICS, T_IMMEDIATE (extensions),
//!          T_SCATTERED (payload source: Scattered, or NoPayload without
//!          CRC; else Contiguous), T_SMALL_BATCH (plan into a Batch<6, 96>,
//!          falling back to a large one when not even one FPDU fits),
//!          T_FLIP (flip one octet of the wire before receiving it)
//! start    4 octets: TxConfig::stream_start (two low bits cleared)
//! mulpdu   2 octets: TxConfig::mulpdu (any value; clamped with markers)
//! budget   2 octets: the byte budget of every plan call (0 = unlimited)
//! flip     5 octets (T_FLIP): position (modulo the wire length), mask (0 =
//!          0x01)
//! cuts     n (1 octet, modulo 16), n sizes: the Scattered slice lengths,
//!          cycled (0 = an empty slice)
//! sends    n (1 octet, modulo 16), n sizes: how many octets each "sendmsg"
//!          takes, cycled (0 = none; n = 0: everything pending)
//! count    1 octet (modulo 17), then count x 16 octets MsgSpec (see
//!          `stream`; V_TERM_BAD makes a Terminate inconsistent)
//! ```
//!
//! The messages' payloads total at most `rx_stream::MAX_PAYLOAD` octets.
//! Each message is started, then planned (`plan` with the budget) and sent
//! (one short `advance` after every plan call, so plans append to partly
//! sent batches) until done; at the end the batch is drained.
//!
//! Invariants checked (a violation panics):
//! - `start` fails exactly when it must (extension disabled, inconsistent
//!   Terminate, MULPDU below header plus one octet or plus the fixed
//!   payload, TO wrap), with that error, leaving the transmitter unchanged;
//!   `emit_message` and `message_wire_len` agree with it;
//! - the sent octets are identical to the reference stream built from
//!   `Segmenter`, `DdpHeader::emit`, the fixed-payload emitters and
//!   `mpa::emit_fpdu` with the same marker state; `emit_message` on a copy
//!   of the transmitter gives the same octets and the same state after;
//!   the MSNs, `stream_pos()` and `marker_state()` follow the reference;
//! - every FPDU's ULPDU fits `mulpdu()`; `remaining_fpdus` counts down by
//!   the FPDUs planned, `is_done` holds exactly at the end; `Planned`
//!   reports the reference FPDUs' wire length; the budget holds for every
//!   FPDU planned onto pending octets, `Budget` means the next FPDU would
//!   exceed it, and an FPDU always goes into a batch with nothing pending;
//!   `BatchTooSmall` comes only for an empty batch and changes nothing;
//! - the batch: `pending()`/`chunks()` cover exactly `pending_len()`
//!   octets, `advance(n)` drops exactly the first `n` of them,
//!   over-advancing fails with `AdvanceBeyondPending` and changes nothing;
//! - the receiver (`stream::drive`, buffers posted for every untagged
//!   message) reports exactly the messages sent (opcodes, targets, payload
//!   octets, fixed payloads, MSNs, lengths), ends at an FPDU boundary, and
//!   its marker position equals the transmitter's; with CRC one flipped
//!   octet fails the stream by the end of its FPDU (`stream::check_flip`).

use super::rx_stream::MAX_PAYLOAD;
use super::stream::{
    check_expected, check_flip, check_framing, drive, expected_outcome, header_len, payload_bytes,
    whole, Framing, MsgSpec, Posted, RefStream,
};
use super::{Input, Schedule};
use iwarp_core::crc32c::{CrcEngine, SoftCrc32c};
use iwarp_core::ddp::SegmentError;
use iwarp_core::rdmap::{Extensions, PayloadKind, QUEUE_COUNT};
use iwarp_core::rx::RxConfig;
use iwarp_core::tx::{
    Batch, Chunk, Contiguous, Message, MessageTx, NoPayload, PayloadSource, PlanStatus, Planned,
    Scattered, Transmitter, TxConfig, TxError,
};

/// Flags: CRC.
pub const T_CRC: u8 = 0x01;
/// Flags: markers.
pub const T_MARKERS: u8 = 0x02;
/// Flags: RFC 7306 atomics enabled.
pub const T_ATOMICS: u8 = 0x04;
/// Flags: RFC 7306 Immediate Data enabled.
pub const T_IMMEDIATE: u8 = 0x08;
/// Flags: payload as a scatter list (or no source at all without CRC).
pub const T_SCATTERED: u8 = 0x10;
/// Flags: plan into a small batch.
pub const T_SMALL_BATCH: u8 = 0x20;
/// Flags: flip an octet of the wire.
pub const T_FLIP: u8 = 0x40;

/// Large batch: one FPDU of `MAX_MARKED_MULPDU` with all its markers fits
/// (3 + 2 * 129 pieces, 79 + 4 * 129 scratch octets), and many small ones.
type BigBatch = Batch<320, 2048>;
/// Small batch: one or two small FPDUs.
type SmallBatch = Batch<6, 96>;

/// The decoded input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxInput {
    /// `T_*`.
    pub flags: u8,
    /// `stream_start`.
    pub start: u32,
    /// `mulpdu`.
    pub mulpdu: u16,
    /// Plan budget (0 = unlimited).
    pub budget: u16,
    /// Flip: position, mask.
    pub flip: (u32, u8),
    /// Scattered slice lengths.
    pub cuts: Vec<u8>,
    /// Send sizes.
    pub sends: Vec<u8>,
    /// The messages.
    pub msgs: Vec<MsgSpec>,
}

impl TxInput {
    /// The octets [`run`] decodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![self.flags];
        v.extend_from_slice(&self.start.to_be_bytes());
        v.extend_from_slice(&self.mulpdu.to_be_bytes());
        v.extend_from_slice(&self.budget.to_be_bytes());
        if self.flags & T_FLIP != 0 {
            v.extend_from_slice(&self.flip.0.to_be_bytes());
            v.push(self.flip.1);
        }
        Schedule::encode(&self.cuts, &mut v);
        Schedule::encode(&self.sends, &mut v);
        assert!(self.msgs.len() <= 16);
        v.push(self.msgs.len() as u8);
        for m in &self.msgs {
            m.encode(&mut v);
        }
        v
    }
}

/// The batch operations the driver needs, for both batch sizes.
trait AnyBatch {
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        tx: &mut Transmitter,
        m: &mut MessageTx,
        tag: u32,
        src: &mut dyn PayloadSource,
        crc: &mut dyn CrcEngine,
        budget: usize,
    ) -> Result<Planned, TxError>;
    fn pending_len(&self) -> usize;
    fn is_done(&self) -> bool;
    fn advance(&mut self, n: usize) -> Result<(), TxError>;
    /// The first `limit` pending octets (all if fewer), payload resolved
    /// by tag.
    fn pending_bytes(&self, payloads: &[Vec<u8>], limit: usize) -> Vec<u8>;
    /// Checks the piece bookkeeping: lengths of all pieces, of the pending
    /// ones, sent and pending octets.
    fn check_pieces(&self);
}

impl<const P: usize, const S: usize> AnyBatch for Batch<P, S> {
    fn plan(
        &mut self,
        tx: &mut Transmitter,
        m: &mut MessageTx,
        tag: u32,
        src: &mut dyn PayloadSource,
        crc: &mut dyn CrcEngine,
        budget: usize,
    ) -> Result<Planned, TxError> {
        tx.plan(self, m, tag, src, crc, budget)
    }

    fn pending_len(&self) -> usize {
        Batch::pending_len(self)
    }

    fn is_done(&self) -> bool {
        Batch::is_done(self)
    }

    fn advance(&mut self, n: usize) -> Result<(), TxError> {
        Batch::advance(self, n)
    }

    fn check_pieces(&self) {
        let pending = Batch::pending_len(self);
        assert_eq!(self.len(), self.sent_len() + pending);
        assert_eq!(Batch::is_done(self), pending == 0);
        assert!(self.pieces().iter().all(|p| !p.is_empty()), "empty piece");
        let total: usize = self.pieces().iter().map(|p| p.len()).sum();
        assert_eq!(total, self.len(), "pieces vs len()");
        let listed: usize = self.pending().map(|p| p.len()).sum();
        assert_eq!(listed, pending, "pending() vs pending_len()");
        assert_eq!(self.pending().len(), self.chunks().len());
    }

    fn pending_bytes(&self, payloads: &[Vec<u8>], limit: usize) -> Vec<u8> {
        let pending = Batch::pending_len(self);
        let mut v = Vec::with_capacity(pending.min(limit));
        for (p, c) in self.pending().zip(self.chunks()) {
            if v.len() >= limit {
                break;
            }
            assert_eq!(self.resolve(&p), c);
            assert_eq!(p.len(), c.len());
            let want = c.len().min(limit - v.len());
            match c {
                Chunk::Bytes(b) => v.extend_from_slice(&b[..want]),
                Chunk::Payload { tag, offset, .. } => {
                    let pl = &payloads[tag as usize];
                    v.extend_from_slice(&pl[offset as usize..][..want]);
                }
            }
        }
        assert_eq!(v.len(), pending.min(limit));
        v
    }
}

/// The wire as sent so far, and the send sizes.
struct Sender<'s> {
    wire: Vec<u8>,
    sends: Schedule<'s>,
}

impl Sender<'_> {
    /// One "sendmsg" of the next send size (at least `min`). Checks the
    /// octets right after the sent ones (not all that are pending: that
    /// would make a long message quadratic).
    fn send(&mut self, b: &mut dyn AnyBatch, payloads: &[Vec<u8>], min: usize) {
        const LOOK: usize = 64;
        let pending = b.pending_len();
        let n = self.sends.next_size().max(min).min(pending);
        let before = b.pending_bytes(payloads, n + LOOK);
        let over = pending + 1 + (self.wire.len() & 7);
        assert_eq!(
            b.advance(over),
            Err(TxError::AdvanceBeyondPending {
                requested: over,
                pending
            })
        );
        assert_eq!(b.pending_len(), pending, "failed advance changed the batch");
        assert_eq!(
            b.pending_bytes(payloads, LOOK),
            before[..LOOK.min(before.len())]
        );
        b.advance(n).expect("advance within pending");
        self.wire.extend_from_slice(&before[..n]);
        assert_eq!(b.pending_len(), pending - n, "advance({n})");
        b.check_pieces();
        assert_eq!(b.pending_bytes(payloads, LOOK), before[n..], "advance({n})");
    }

    fn drain(&mut self, b: &mut dyn AnyBatch, payloads: &[Vec<u8>]) {
        while !b.is_done() {
            self.send(b, payloads, 1);
        }
    }
}

/// Decodes and checks one input; returns what it reached.
pub fn run(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let start = inp.u32() & !3;
    let mulpdu = inp.u16();
    let budget = match inp.u16() {
        0 => usize::MAX,
        b => usize::from(b),
    };
    let flip = if flags & T_FLIP != 0 {
        let pos = inp.u32();
        let mask = inp.u8();
        Some((pos, if mask == 0 { 1 } else { mask }))
    } else {
        None
    };
    let mut cuts = Schedule::decode(&mut inp);
    let sends = Schedule::decode(&mut inp);
    let count = usize::from(inp.u8()) % 17;
    let specs: Vec<MsgSpec> = (0..count).map(|_| MsgSpec::decode(&mut inp)).collect();

    let crc_on = flags & T_CRC != 0;
    let markers = flags & T_MARKERS != 0;
    let extensions = Extensions {
        atomics: flags & T_ATOMICS != 0,
        immediate_data: flags & T_IMMEDIATE != 0,
    };
    let config = TxConfig {
        crc: crc_on,
        markers,
        stream_start: start,
        mulpdu,
        extensions,
    };
    let mut tx = Transmitter::new(config);
    assert_eq!(tx.crc_enabled(), crc_on);
    assert_eq!(tx.markers_enabled(), markers);
    assert_eq!(tx.extensions(), extensions);
    assert_eq!(tx.stream_pos(), start);
    let mut r = RefStream::new(crc_on, markers.then_some(start));
    assert_eq!(tx.marker_state(), r.markers);
    let mut crc = SoftCrc32c::new();
    let mut big = BigBatch::new();
    let mut small = SmallBatch::new();
    let use_small = flags & T_SMALL_BATCH != 0;
    let mut sender = Sender {
        wire: Vec::new(),
        sends,
    };
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    let mut sent_msgs = 0usize;
    let mut left = MAX_PAYLOAD;
    for (i, s) in specs.iter().enumerate() {
        let len = s.wanted_len(true).min(left);
        let msg = s.message(len, true);
        payloads.push(payload_bytes(len, s.var));
        let payload = &payloads[i];
        let before = tx.clone();
        let predicted = predict(&tx, &msg, &mut r, payload);
        let mut out = vec![0u8; tx.message_wire_len(&msg).unwrap_or(0)];
        let mut emitter = tx.clone();
        let emitted = emitter.emit_message(&msg, payload, &mut crc, &mut out);
        let started = tx.start(&msg);
        let mut m = match (started, predicted) {
            (Err(e), Err(p)) => {
                assert_eq!(e, p, "start error of {msg:?}");
                assert_eq!(emitted, Err(e), "emit_message error of {msg:?}");
                assert_eq!(tx.message_wire_len(&msg), Err(e));
                assert_eq!(tx, before, "a failed start changed the transmitter");
                continue;
            }
            (Ok(m), Ok(k)) => {
                assert_eq!(k, r.msgs.len() - 1);
                m
            }
            (got, want) => panic!("start of {msg:?}: {got:?}, expected {want:?}"),
        };
        left -= len;
        sent_msgs += 1;
        let k = r.msgs.len() - 1;
        let rm = &r.msgs[k];
        let ref_segs: Vec<usize> = (r.segs.len() - rm.segs.len()..r.segs.len()).collect();
        assert_eq!(m.opcode(), msg.opcode());
        assert_eq!(m.msn(), rm.msn);
        assert_eq!(m.payload_len(), len);
        assert_eq!(m.fixed_payload(), &rm.fixed[..]);
        assert_eq!(m.remaining_fpdus(), ref_segs.len());
        assert!(!m.is_done());
        let range = r.segs[ref_segs[0]].wire.start..r.segs[*ref_segs.last().unwrap()].wire.end;
        assert_eq!(emitted, Ok(range.len()), "emit_message length");
        assert_eq!(&out[..], &r.wire[range.clone()], "emit_message octets");
        assert_eq!(before.message_wire_len(&msg), Ok(range.len()));
        for &j in &ref_segs {
            assert!(r.segs[j].ulen <= tx.mulpdu(), "FPDU beyond MULPDU");
        }
        // Plan and send the message.
        let slices: Vec<&[u8]> = scatter(payload, &mut cuts);
        let mut contiguous = Contiguous(payload);
        let mut scattered = Scattered(&slices);
        let mut none = NoPayload;
        let src: &mut dyn PayloadSource = match (flags & T_SCATTERED != 0, crc_on) {
            (false, _) => &mut contiguous,
            (true, true) => &mut scattered,
            (true, false) => &mut none,
        };
        let mut next_seg = 0usize;
        while !m.is_done() {
            let b: &mut dyn AnyBatch = if use_small { &mut small } else { &mut big };
            let pending0 = b.pending_len();
            let rem0 = m.remaining_fpdus();
            let planned0 = m.planned_len();
            let res = b.plan(&mut tx, &mut m, i as u32, src, &mut crc, budget);
            let p = match res {
                Err(TxError::BatchTooSmall) => {
                    assert!(use_small, "BatchTooSmall for the large batch");
                    assert_eq!(pending0, 0, "BatchTooSmall with octets pending");
                    assert_eq!((m.remaining_fpdus(), m.planned_len()), (rem0, planned0));
                    assert_eq!(small.pending_len(), 0);
                    // Send this part through the large batch.
                    let p = big
                        .plan(&mut tx, &mut m, i as u32, src, &mut crc, budget)
                        .expect("plan into the large batch");
                    check_planned(&r, &ref_segs, &mut next_seg, 0, budget, &p, &m);
                    sender.drain(&mut big, &payloads);
                    continue;
                }
                Err(e) => panic!("plan of {msg:?}: {e:?}"),
                Ok(p) => p,
            };
            check_planned(&r, &ref_segs, &mut next_seg, pending0, budget, &p, &m);
            assert_eq!(m.remaining_fpdus(), rem0 - p.fpdus);
            assert_eq!(b.pending_len(), pending0 + p.bytes);
            let min = usize::from(p.fpdus == 0);
            sender.send(b, &payloads, min);
        }
        assert_eq!(next_seg, ref_segs.len());
        assert_eq!(m.remaining_fpdus(), 0);
        assert_eq!(m.planned_len(), len);
        // The transmitter's state follows the reference.
        assert_eq!(tx, emitter, "state after plan vs after emit_message");
        assert_eq!(tx.stream_pos(), start.wrapping_add(r.wire.len() as u32));
        assert_eq!(tx.marker_state(), r.markers);
        for qn in 0..QUEUE_COUNT {
            assert_eq!(tx.next_msn(qn as u32), Some(r.next_msn(qn)));
        }
    }
    let b: &mut dyn AnyBatch = if use_small { &mut small } else { &mut big };
    sender.drain(b, &payloads);
    sender.drain(&mut big, &payloads);
    let wire = sender.wire;
    assert_eq!(wire.len(), r.wire.len(), "wire length vs reference");
    assert!(wire == r.wire, "wire differs from the reference stream");

    // Back through the receiver.
    let cfg = RxConfig {
        crc: crc_on,
        markers: markers.then_some(start),
        extensions,
        max_ulpdu_len: u16::MAX,
        queues: QUEUE_COUNT as u32,
    };
    let framing = Framing::parse(&wire, cfg.markers);
    check_framing(&r, &framing);
    for f in &framing.fpdus {
        assert!(
            f.ulen.is_some_and(|u| u <= tx.mulpdu()),
            "FPDU beyond MULPDU"
        );
    }
    let posted = Posted::exact(&r);
    let x = expected_outcome(&r, r.segs.len(), &cfg, &posted, None);
    let o = drive(&cfg, &wire, &framing, &mut whole(), posted.clone(), None);
    check_expected(&o, &x);
    if o.error.is_none() {
        assert_eq!(
            o.stream_pos,
            tx.marker_state().map(|m| m.stream_pos()),
            "receiver and transmitter marker positions"
        );
    }
    if let Some((pos, mask)) = flip.filter(|_| !wire.is_empty()) {
        let pos = pos as usize % wire.len();
        let mut flipped = wire.clone();
        flipped[pos] ^= mask;
        let f2 = Framing::parse(&flipped, cfg.markers);
        let o2 = drive(&cfg, &flipped, &f2, &mut whole(), posted, None);
        return if check_flip(&r, &framing, &x, &o2, pos, mask) {
            "flip detected"
        } else {
            "flip undetected"
        };
    }
    match (sent_msgs, o.error) {
        (0, _) => "nothing sent",
        (_, None) => "round trip",
        (_, Some(_)) => "round trip, receiver stopped",
    }
}

/// The error `start` must report for `msg`, else adds it to the reference
/// stream and returns its index there.
fn predict(
    tx: &Transmitter,
    msg: &Message,
    r: &mut RefStream,
    payload: &[u8],
) -> Result<usize, TxError> {
    let op = msg.opcode();
    if !tx.extensions().allows(op) {
        return Err(TxError::ExtensionDisabled(op));
    }
    if let Message::Terminate(t) = msg {
        if !t.is_consistent() {
            return Err(TxError::InvalidTerminate);
        }
    }
    let fixed = super::stream::fixed_bytes(msg).len();
    let needed = match op.payload() {
        PayloadKind::Ulp => header_len(op) + 1,
        _ => header_len(op) + fixed,
    };
    if usize::from(tx.mulpdu()) < needed {
        return Err(TxError::MulpduTooSmall {
            mulpdu: tx.mulpdu(),
            needed,
        });
    }
    match r.push(*msg, payload.to_vec(), u32::from(tx.mulpdu())) {
        Ok(_) => Ok(r.msgs.len() - 1),
        Err(SegmentError::ToWrap) => Err(TxError::ToWrap),
        Err(e) => panic!("reference segmenter: {e:?} for {msg:?}"),
    }
}

/// The payload cut into slices of the cut sizes (cycled; 0 = an empty
/// slice; after 8 empty slices the rest is one slice).
fn scatter<'p>(payload: &'p [u8], cuts: &mut Schedule<'_>) -> Vec<&'p [u8]> {
    let mut v = Vec::new();
    let mut rest = payload;
    let mut empties = 0;
    while !rest.is_empty() {
        let n = cuts.next_size().min(rest.len());
        if n == 0 {
            empties += 1;
            if empties > 8 {
                v.push(rest);
                break;
            }
        }
        let (a, b) = rest.split_at(n);
        v.push(a);
        rest = b;
    }
    v
}

/// Checks one `plan` result against the reference FPDUs of the message
/// (`ref_segs`, the next unplanned one at `next`): the wire length, the
/// budget rule, the status.
fn check_planned(
    r: &RefStream,
    ref_segs: &[usize],
    next: &mut usize,
    pending0: usize,
    budget: usize,
    p: &Planned,
    m: &MessageTx,
) {
    let mut pend = pending0;
    let mut bytes = 0usize;
    for _ in 0..p.fpdus {
        let w = r.segs[ref_segs[*next]].wire.len();
        if pend > 0 {
            assert!(
                pend + w <= budget,
                "FPDU of {w} onto {pend} pending beyond budget {budget}"
            );
        }
        pend += w;
        bytes += w;
        *next += 1;
    }
    assert_eq!(p.bytes, bytes, "Planned::bytes vs the reference FPDUs");
    assert_eq!(m.is_done(), *next == ref_segs.len());
    match p.status {
        PlanStatus::MessageDone => assert!(m.is_done()),
        PlanStatus::Budget => {
            assert!(!m.is_done());
            let w = r.segs[ref_segs[*next]].wire.len();
            assert!(pend > 0 && pend + w > budget, "Budget with room for {w}");
        }
        PlanStatus::BatchFull => {
            assert!(!m.is_done());
            assert!(pend > 0, "BatchFull on an empty batch");
        }
    }
    if pending0 == 0 {
        assert!(p.fpdus > 0, "no FPDU planned into an empty batch");
    }
}
