// SPDX-License-Identifier: GPL-2.0

//! Throughput of the protocol core's hot paths.
//!
//! ```text
//! cargo bench -p iwarp-core --bench core                 # everything
//! cargo bench -p iwarp-core --bench core -- fpdu/        # one group (a regex)
//! cargo bench -p iwarp-core --bench core -- --quick      # a fast rough pass
//! ```
//!
//! Every benchmark reports bytes/s over the octets it handles (criterion
//! `Throughput::Bytes`): payload octets for CRC and segmentation, frame or
//! wire octets for MPA frames and FPDUs, message octets for the composed
//! message paths. Timing is shortened (1 s warm-up, 2 s measurement) so the
//! whole file runs in a few minutes on the 2-core machines; pass
//! `--measurement-time`/`--warm-up-time` for steadier numbers.
//!
//! Groups (one function each, listed in `criterion_group!` at the bottom):
//!
//! - `crc32c`: one-shot CRC32c of 64 B, 4 KiB, 64 KiB;
//! - `mpa_frame`: Request/Reply frame parse and emit (siw-style enhanced
//!   Request, 512 octets of private data);
//! - `ddp_segment`: `Segmenter` + `DdpHeader::emit` for 64 B / 4 KiB /
//!   64 KiB messages at MULPDU 1448 and ~64 KiB (loopback EMSS);
//! - `fpdu`: `emit_fpdu` / `parse_fpdu` (and the marker variants) for one
//!   FPDU of 64 B, 1448 B, ~64 KiB, CRC on and off;
//! - `message`: a whole tagged RDMA Write composed from the pieces above,
//!   i.e. the transmit and receive paths as a caller would assemble them
//!   by hand, the baseline for `rx` and `tx`;
//! - `rx` ("parse+place"): the incremental receive parser
//!   (`iwarp_core::rx::Receiver`) fed the wire of one RDMA Write or one Send
//!   (into a posted buffer) of 64 B / 4 KiB / 64 KiB, CRC on and off, in
//!   TCP receive pieces (the whole wire at once, 1448-octet segments, and
//!   1000-octet pieces that split FPDUs and headers), the target checked at
//!   each `Header` and every `Data` event's payload copied into a
//!   destination buffer: one copy of the payload is included;
//! - `tx` ("frame build"): the transmit builder (`iwarp_core::tx`) sending
//!   the same messages as `siw_rs/conn.rs` does: `Transmitter::start`,
//!   `plan` into a `Batch<64, 2048>`, the pending chunks handed to a sender
//!   8 at a time, `advance`, until the message is done. The sender takes
//!   the chunks as slices and copies nothing, so this is framing, planning
//!   and (CRC on) the CRC pass over the payload, not a socket copy.
//!
//! `rx` and `tx` use MULPDU `mpa::mulpdu(1448, false)` = 1442, so every full
//! FPDU is exactly one 1448-octet segment of a 1500-octet-MTU path (the
//! `message` group's "mulpdu1448" passes 1448 as MULPDU itself, 6 octets
//! more per FPDU). Both report `Throughput::Bytes(message length)`, so they
//! compare directly with `message/parse` and `message/build`: the
//! difference is what the state machines cost over the bare pieces. Their
//! setup checks, outside the timed loops, that the builder's wire equals
//! the `message` group's independent one (Write), that the chunks sent
//! equal it and parse back, and that every piece size places exactly the
//! message; a broken path fails the run instead of being timed.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use iwarp_core::crc32c::{crc32c, CrcEngine, SoftCrc32c};
use iwarp_core::ddp::{BufferFields, DdpHeader, Segmenter, TaggedFields, TAGGED_HEADER_LEN};
use iwarp_core::mpa::{
    self, EnhancedData, FrameKind, MarkerState, MpaFlags, MpaFrameRepr, Revision, RtrSet,
};
use iwarp_core::rdmap::{self, Extensions, Opcode};
use iwarp_core::rx::{Receiver, RxConfig, RxEvent, Target};
use iwarp_core::tx::{Batch, Chunk, Contiguous, Message, PlanStatus, Transmitter, TxConfig};
use std::hint::black_box;
use std::time::Duration;

/// Data sink STag and Tagged Offset of the first payload octet of every
/// RDMA Write the benchmarks build.
const STAG: u32 = 0x1234_5600;
const TO_BASE: u64 = 0x10_0000;

/// Message and buffer sizes.
const SIZES: [(usize, &str); 3] = [(64, "64B"), (4096, "4KiB"), (65536, "64KiB")];

/// MULPDU of a 1500-octet-MTU path as the brief fixes it, and of loopback
/// (MTU 65536: EMSS 65483, no markers).
fn mulpdus() -> [(u32, &'static str); 2] {
    [
        (1448, "mulpdu1448"),
        (u32::from(mpa::mulpdu(65483, false)), "mulpdu64k"),
    ]
}

/// Deterministic non-trivial payload.
fn payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0])
        .collect()
}

fn engine(on: bool, e: &mut SoftCrc32c) -> Option<&mut dyn CrcEngine> {
    if on {
        Some(e)
    } else {
        None
    }
}

// ---------------------------------------------------------------------------
// crc32c
// ---------------------------------------------------------------------------

fn crc(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c");
    for (len, name) in SIZES {
        let data = payload(len);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(name, |b| b.iter(|| crc32c(black_box(&data))));
    }
    g.finish();
}

// ---------------------------------------------------------------------------
// mpa_frame
// ---------------------------------------------------------------------------

fn mpa_frames(c: &mut Criterion) {
    let big_pd = payload(512);
    let frames = [
        (
            "siw-request",
            MpaFrameRepr {
                kind: FrameKind::Request,
                flags: MpaFlags::default(),
                revision: Revision::V2,
                enhanced: Some(EnhancedData {
                    ird: 4,
                    ord: 8,
                    p2p: true,
                    rtr: RtrSet::WRITE_READ,
                }),
                private_data: &[1, 2, 3],
            },
        ),
        (
            "pd512",
            MpaFrameRepr {
                kind: FrameKind::Reply,
                flags: MpaFlags {
                    crc: true,
                    ..MpaFlags::default()
                },
                revision: Revision::V1,
                enhanced: None,
                private_data: &big_pd,
            },
        ),
    ];
    let mut g = c.benchmark_group("mpa_frame");
    for (name, repr) in frames {
        let mut wire = [0u8; mpa::MAX_FRAME_LEN];
        let n = repr.emit(&mut wire).expect("frame");
        g.throughput(Throughput::Bytes(n as u64));
        g.bench_function(BenchmarkId::new("parse", name), |b| {
            b.iter(|| MpaFrameRepr::parse(black_box(&wire[..n])).map(|(r, n)| (r.pd_len(), n)))
        });
        let mut out = [0u8; mpa::MAX_FRAME_LEN];
        g.bench_function(BenchmarkId::new("emit", name), |b| {
            b.iter(|| black_box(&repr).emit(&mut out))
        });
    }
    g.finish();
}

// ---------------------------------------------------------------------------
// ddp_segment
// ---------------------------------------------------------------------------

fn ddp_segmentation(c: &mut Criterion) {
    let mut g = c.benchmark_group("ddp_segment");
    let target = BufferFields::Tagged(TaggedFields {
        stag: STAG,
        to: TO_BASE,
    });
    for (mulpdu, mname) in mulpdus() {
        for (len, name) in SIZES {
            g.throughput(Throughput::Bytes(len as u64));
            // Headers of all segments, back to back (what a sender writes
            // in front of each payload piece).
            let segments = Segmenter::new(0, target, len as u32, mulpdu)
                .expect("segmenter")
                .len();
            let mut out = vec![0u8; segments * TAGGED_HEADER_LEN];
            g.bench_function(BenchmarkId::new(mname, name), |b| {
                b.iter(|| {
                    let seg = Segmenter::new(0, black_box(target), black_box(len as u32), mulpdu)
                        .expect("segmenter");
                    let mut at = 0;
                    for s in seg {
                        at += s.header.emit(&mut out[at..]).expect("header");
                    }
                    at
                })
            });
        }
    }
    g.finish();
}

// ---------------------------------------------------------------------------
// fpdu
// ---------------------------------------------------------------------------

/// ULPDU sizes for single FPDUs: small, a 1500-MTU MULPDU, the largest
/// loopback MULPDU.
fn fpdu_sizes() -> [(usize, &'static str); 3] {
    [
        (64, "64B"),
        (1448, "1448B"),
        (usize::from(mpa::mulpdu(65483, false)), "64KiB"),
    ]
}

fn fpdu(c: &mut Criterion) {
    let mut g = c.benchmark_group("fpdu");
    let mut eng = SoftCrc32c::new();
    for (len, name) in fpdu_sizes() {
        let ulpdu = payload(len);
        for crc_on in [false, true] {
            let mode = if crc_on { "crc" } else { "nocrc" };
            let wl = mpa::fpdu_len(len as u16);
            g.throughput(Throughput::Bytes(wl as u64));
            let mut wire = vec![0u8; wl];
            mpa::emit_fpdu(&ulpdu, None, engine(crc_on, &mut eng), &mut wire).expect("fpdu");
            let mut out = vec![0u8; wl];
            g.bench_function(BenchmarkId::new(format!("emit/{mode}"), name), |b| {
                b.iter(|| {
                    mpa::emit_fpdu(black_box(&ulpdu), None, engine(crc_on, &mut eng), &mut out)
                })
            });
            g.bench_function(BenchmarkId::new(format!("parse/{mode}"), name), |b| {
                b.iter(|| {
                    mpa::parse_fpdu(black_box(&wire), engine(crc_on, &mut eng)).map(|f| f.wire_len)
                })
            });

            // Markers (never used by siw, but negotiable): from stream
            // position 0, so the FPDU starts with a marker.
            let start = MarkerState::new();
            let mwl = start.fpdu_wire_len(len as u16);
            g.throughput(Throughput::Bytes(mwl as u64));
            let mut mwire = vec![0u8; mwl];
            let mut st = start;
            mpa::emit_fpdu(&ulpdu, Some(&mut st), engine(crc_on, &mut eng), &mut mwire)
                .expect("marked fpdu");
            let mut mout = vec![0u8; mwl];
            g.bench_function(
                BenchmarkId::new(format!("emit_markers/{mode}"), name),
                |b| {
                    b.iter(|| {
                        let mut st = start;
                        mpa::emit_fpdu(
                            black_box(&ulpdu),
                            Some(&mut st),
                            engine(crc_on, &mut eng),
                            &mut mout,
                        )
                    })
                },
            );
            let mut ubuf = vec![0u8; len];
            g.bench_function(
                BenchmarkId::new(format!("parse_markers/{mode}"), name),
                |b| {
                    b.iter(|| {
                        let mut st = start;
                        mpa::parse_fpdu_with_markers(
                            black_box(&mwire),
                            &mut st,
                            engine(crc_on, &mut eng),
                            &mut ubuf,
                        )
                        .map(|m| m.wire_len)
                    })
                },
            );
        }
    }
    g.finish();
}

// ---------------------------------------------------------------------------
// message: transmit and receive composed from the pieces
// ---------------------------------------------------------------------------

/// The wire of one tagged RDMA Write of `msg` (STag [`STAG`], TO [`TO_BASE`])
/// at `mulpdu`, without markers: header + payload segments, each framed as
/// an FPDU (CRC if `crc_on`). Returns the number of octets written into
/// `wire`, which must be large enough ([`write_message_wire_len`]); `ulpdu`
/// is scratch space of MULPDU octets. The `rx`/`tx` setup checks the
/// transmit builder's Write wire against it.
fn write_message_wire(
    msg: &[u8],
    mulpdu: u32,
    crc_on: bool,
    eng: &mut SoftCrc32c,
    wire: &mut [u8],
    ulpdu: &mut [u8],
) -> usize {
    let target = BufferFields::Tagged(TaggedFields {
        stag: STAG,
        to: TO_BASE,
    });
    let mut at = 0;
    for s in Segmenter::new(0, target, msg.len() as u32, mulpdu).expect("segmenter") {
        let h = s.header.emit(ulpdu).expect("header");
        let body = &msg[s.payload_range()];
        ulpdu[h..h + body.len()].copy_from_slice(body);
        at += mpa::emit_fpdu(
            &ulpdu[..h + body.len()],
            None,
            engine(crc_on, eng),
            &mut wire[at..],
        )
        .expect("fpdu");
    }
    at
}

/// Wire length of [`write_message_wire`].
fn write_message_wire_len(len: usize, mulpdu: u32) -> usize {
    let target = BufferFields::Tagged(TaggedFields { stag: 0, to: 0 });
    Segmenter::new(0, target, len as u32, mulpdu)
        .expect("segmenter")
        .map(|s| mpa::fpdu_len(s.segment_len() as u16))
        .sum()
}

/// Receive side of [`write_message_wire`]: FPDU framing and CRC, DDP
/// header, RDMAP validation, tagged continuity and bounds, payload copy into
/// `sink`. Returns the octets placed.
fn place_message_wire(wire: &[u8], crc_on: bool, eng: &mut SoftCrc32c, sink: &mut [u8]) -> usize {
    let mut stream = iwarp_core::ddp::TaggedStream::new();
    let mut at = 0;
    let mut placed = 0;
    while at < wire.len() {
        let f = mpa::parse_fpdu(&wire[at..], engine(crc_on, eng)).expect("fpdu");
        let h = DdpHeader::parse(f.ulpdu).expect("ddp");
        let op = rdmap::validate(&h, Extensions::NONE).expect("rdmap");
        debug_assert_eq!(op, Opcode::RdmaWrite);
        let t = h.tagged_fields().expect("tagged");
        let body = &f.ulpdu[h.header_len()..];
        stream
            .accept(&t, body.len() as u32, h.last)
            .expect("continuity");
        iwarp_core::ddp::check_bounds(t.to, body.len() as u32, TO_BASE, sink.len() as u64)
            .expect("bounds");
        let off = (t.to - TO_BASE) as usize;
        sink[off..off + body.len()].copy_from_slice(body);
        placed += body.len();
        at += f.wire_len;
    }
    placed
}

fn message(c: &mut Criterion) {
    let mut g = c.benchmark_group("message");
    let mut eng = SoftCrc32c::new();
    for (mulpdu, mname) in mulpdus() {
        for (len, name) in SIZES {
            let msg = payload(len);
            let wlen = write_message_wire_len(len, mulpdu);
            let mut ulpdu = vec![0u8; mulpdu as usize];
            let mut wire = vec![0u8; wlen];
            let mut sink = vec![0u8; len];
            g.throughput(Throughput::Bytes(len as u64));
            for crc_on in [false, true] {
                let mode = if crc_on { "crc" } else { "nocrc" };
                let n = write_message_wire(&msg, mulpdu, crc_on, &mut eng, &mut wire, &mut ulpdu);
                assert_eq!(n, wlen);
                assert_eq!(place_message_wire(&wire, crc_on, &mut eng, &mut sink), len);
                assert_eq!(sink, msg);
                g.bench_function(
                    BenchmarkId::new(format!("build/{mode}/{mname}"), name),
                    |b| {
                        b.iter(|| {
                            write_message_wire(
                                black_box(&msg),
                                mulpdu,
                                crc_on,
                                &mut eng,
                                &mut wire,
                                &mut ulpdu,
                            )
                        })
                    },
                );
                g.bench_function(
                    BenchmarkId::new(format!("parse/{mode}/{mname}"), name),
                    |b| {
                        b.iter(|| place_message_wire(black_box(&wire), crc_on, &mut eng, &mut sink))
                    },
                );
            }
        }
    }
    g.finish();
}

// ---------------------------------------------------------------------------
// rx and tx: the connection state machines
// ---------------------------------------------------------------------------

/// EMSS of a 1500-octet-MTU path: 1500 - 20 (IPv4) - 20 (TCP) - 12 (TCP
/// timestamps).
const EMSS_1500: usize = 1448;

/// Transmit batches as siw_rs sizes them (`siw_rs/conn.rs`): 64 pieces and
/// 2048 scratch octets per batch, at most 8 parts per `sendmsg`.
type TxBatch = Batch<64, 2048>;
const SEND_PARTS: usize = 8;

/// The messages measured: a tagged RDMA Write to [`STAG`]/[`TO_BASE`] and an
/// untagged Send into a posted buffer of the message's size.
#[derive(Clone, Copy)]
enum Op {
    Write,
    Send,
}

impl Op {
    const ALL: [Op; 2] = [Op::Write, Op::Send];

    fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Send => "send",
        }
    }

    fn message(self, len: usize) -> Message {
        let len = len as u32;
        match self {
            Op::Write => Message::RdmaWrite {
                len,
                stag: STAG,
                to: TO_BASE,
            },
            Op::Send => Message::Send { len },
        }
    }
}

/// The transmit parameters of a 1500-MTU connection: MULPDU such that every
/// full FPDU is exactly one EMSS (1442 + 2 + 4 = 1448 octets, no PAD), no
/// markers.
fn tx_config(crc_on: bool) -> TxConfig {
    TxConfig {
        crc: crc_on,
        markers: false,
        stream_start: 0,
        mulpdu: mpa::mulpdu(EMSS_1500 as u32, false),
        extensions: Extensions::NONE,
    }
}

/// One measured message: its payload and its wire (as the first message of
/// a connection: MSN 1), checked against the independent builder of the
/// `message` group for the Write.
struct Case {
    op: Op,
    crc_on: bool,
    size: &'static str,
    msg: Vec<u8>,
    wire: Vec<u8>,
}

impl Case {
    fn mode(&self) -> &'static str {
        if self.crc_on {
            "crc"
        } else {
            "nocrc"
        }
    }
}

/// Every (op, CRC, size) combination, wires built and cross-checked.
fn cases() -> Vec<Case> {
    let mut eng = SoftCrc32c::new();
    let mut out = Vec::new();
    for op in Op::ALL {
        for crc_on in [false, true] {
            for (len, size) in SIZES {
                let msg = payload(len);
                let mut tx = Transmitter::new(tx_config(crc_on));
                let m = op.message(len);
                let mut wire = vec![0u8; tx.message_wire_len(&m).expect("wire len")];
                let n = tx
                    .emit_message(&m, &msg, &mut eng, &mut wire)
                    .expect("emit_message");
                assert_eq!(n, wire.len());
                if let Op::Write = op {
                    let mulpdu = u32::from(tx.mulpdu());
                    let mut other = vec![0u8; write_message_wire_len(len, mulpdu)];
                    let mut ulpdu = vec![0u8; mulpdu as usize];
                    write_message_wire(&msg, mulpdu, crc_on, &mut eng, &mut other, &mut ulpdu);
                    assert_eq!(wire, other, "Transmitter vs write_message_wire");
                }
                out.push(Case {
                    op,
                    crc_on,
                    size,
                    msg,
                    wire,
                });
            }
        }
    }
    out
}

/// A receiver at the start of a connection's stream.
fn receiver(crc_on: bool) -> Receiver<SoftCrc32c> {
    Receiver::new(RxConfig::new(crc_on), SoftCrc32c::new())
}

/// Parse+place: feeds `wire` to `rx` in pieces of at most `piece` octets
/// (the whole wire if larger), checks each segment's target at its
/// `Header` as the kernel does (tagged: `check_bounds` against `sink` at
/// [`TO_BASE`]; untagged: the posted buffer is `sink`), and copies every
/// `Data` event's payload into `sink`. Returns the message length of the
/// last `Done` that ended a message.
fn receive(rx: &mut Receiver<SoftCrc32c>, wire: &[u8], piece: usize, sink: &mut [u8]) -> u64 {
    let posted = sink.len() as u32;
    let mut rq = |_qn: u32, _msn: u32, _op: Opcode| Some(posted);
    let mut done = 0;
    for input in wire.chunks(piece) {
        let mut rest = input;
        while let Some(ev) = rx.poll(&mut rest, &mut rq).expect("rx") {
            match ev {
                RxEvent::Header(h) => {
                    if let Target::Tagged { to, .. } = h.target {
                        iwarp_core::ddp::check_bounds(to, h.payload_len, TO_BASE, posted.into())
                            .expect("bounds");
                    }
                }
                RxEvent::Data(p) => {
                    let off = match p.target {
                        Target::Tagged { to, .. } => (to - TO_BASE) as usize,
                        Target::Untagged { mo, .. } => mo as usize,
                    };
                    sink[off..off + p.data.len()].copy_from_slice(p.data);
                }
                RxEvent::Done(d) => done = d.message_len.unwrap_or(done),
            }
        }
    }
    done
}

/// TCP receive piece sizes: everything at once (a large GRO skb), one
/// EMSS segment (siw-style FPDU alignment: every piece is one FPDU), and
/// 1000 octets (FPDUs and headers split across pieces).
const PIECES: [(usize, &str); 3] = [
    (usize::MAX, "whole"),
    (EMSS_1500, "seg1448"),
    (1000, "split1000"),
];

fn rx(c: &mut Criterion) {
    let mut g = c.benchmark_group("rx");
    for case in cases() {
        let len = case.msg.len();
        g.throughput(Throughput::Bytes(len as u64));
        let template = receiver(case.crc_on);
        let mut sink = vec![0u8; len];
        for (piece, pname) in PIECES {
            // The path measured places the message, and the stream ends
            // cleanly after it.
            sink.fill(0);
            let mut rx = template.clone();
            assert_eq!(receive(&mut rx, &case.wire, piece, &mut sink), len as u64);
            assert!(rx.at_fpdu_boundary());
            assert_eq!(sink, case.msg);
            g.bench_function(
                BenchmarkId::new(
                    format!("{}/{}/{pname}", case.op.name(), case.mode()),
                    case.size,
                ),
                |b| {
                    // A fresh receiver per message (a clone of a few hundred
                    // octets): each wire is the connection's first message.
                    b.iter(|| {
                        let mut rx = template.clone();
                        receive(&mut rx, black_box(&case.wire), piece, &mut sink)
                    })
                },
            );
        }
    }
    g.finish();
}

/// Frame build: sends one message the way siw_rs's `tx_run`/`flush_batch`
/// do: start it, plan FPDUs into `batch` (no byte budget; the batch's
/// capacity splits a long message into several batches), hand the pending
/// chunks to `send` [`SEND_PARTS`] at a time (framing octets from the
/// batch's scratch area, payload as sub-slices of `payload`: no copy), the
/// socket taking them all, advance, plan again until the message is done.
/// Returns the wire octets sent.
fn transmit(
    tx: &mut Transmitter,
    batch: &mut TxBatch,
    msg: &Message,
    payload: &[u8],
    crc: &mut SoftCrc32c,
    send: &mut impl FnMut(&[u8]),
) -> usize {
    let mut m = tx.start(msg).expect("start");
    let mut total = 0;
    loop {
        let r = tx
            .plan(batch, &mut m, 0, &mut Contiguous(payload), crc, usize::MAX)
            .expect("plan");
        while !batch.is_done() {
            let mut n = 0;
            for chunk in batch.chunks().take(SEND_PARTS) {
                let part = match chunk {
                    Chunk::Bytes(b) => b,
                    Chunk::Payload { offset, len, .. } => {
                        &payload[offset as usize..][..len as usize]
                    }
                };
                send(part);
                n += part.len();
            }
            batch.advance(n).expect("advance");
            total += n;
        }
        if r.status == PlanStatus::MessageDone {
            return total;
        }
    }
}

fn tx(c: &mut Criterion) {
    let mut g = c.benchmark_group("tx");
    let mut eng = SoftCrc32c::new();
    let mut batch = TxBatch::new();
    for case in cases() {
        let len = case.msg.len();
        g.throughput(Throughput::Bytes(len as u64));
        let m = case.op.message(len);
        // The chunks sent are the reference wire, and it parses back.
        let mut tx = Transmitter::new(tx_config(case.crc_on));
        let mut wire = Vec::new();
        let n = transmit(&mut tx, &mut batch, &m, &case.msg, &mut eng, &mut |p| {
            wire.extend_from_slice(p)
        });
        assert_eq!((n, &wire), (case.wire.len(), &case.wire));
        let mut sink = vec![0u8; len];
        let placed = receive(&mut receiver(case.crc_on), &wire, usize::MAX, &mut sink);
        assert_eq!((placed, &sink), (len as u64, &case.msg));
        // One transmitter for all iterations: a connection sending the
        // message again and again (MSNs and stream position advance).
        g.bench_function(
            BenchmarkId::new(format!("{}/{}", case.op.name(), case.mode()), case.size),
            |b| {
                b.iter(|| {
                    transmit(
                        &mut tx,
                        &mut batch,
                        &m,
                        black_box(&case.msg),
                        &mut eng,
                        &mut |p| {
                            black_box(p);
                        },
                    )
                })
            },
        );
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = crc, mpa_frames, ddp_segmentation, fpdu, message, rx, tx
}
criterion_main!(benches);
