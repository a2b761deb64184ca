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
//!   today, the baseline for the `rx`/`tx` groups to come.
//!
//! Adding the `rx` and `tx` modules' benchmarks: write `fn rx(c)` with
//! group `rx` ("parse+place": feed the wire of [`write_message_wire`] to the
//! incremental receive parser in TCP-sized pieces, placing payload into a
//! destination buffer; same sizes and MULPDUs as `message`, CRC on/off) and
//! `fn tx(c)` with group `tx` ("frame build": the transmit builder producing
//! the same wire from a message), each with `Throughput::Bytes(message
//! length)`, and add them to `criterion_group!`. Comparing them with
//! `message/build` and `message/parse` shows what the state machines cost
//! over the bare pieces.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use iwarp_core::crc32c::{crc32c, CrcEngine, SoftCrc32c};
use iwarp_core::ddp::{BufferFields, DdpHeader, Segmenter, TaggedFields, TAGGED_HEADER_LEN};
use iwarp_core::mpa::{
    self, EnhancedData, FrameKind, MarkerState, MpaFlags, MpaFrameRepr, Revision, RtrSet,
};
use iwarp_core::rdmap::{self, Extensions, Opcode};
use std::hint::black_box;
use std::time::Duration;

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
        stag: 0x1234_5600,
        to: 0x10_0000,
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

/// The wire of one tagged RDMA Write of `msg` (STag 0x1234_5600, TO 0x10_0000)
/// at `mulpdu`, without markers: header + payload segments, each framed as
/// an FPDU (CRC if `crc_on`). Returns the number of octets written into
/// `wire`, which must be large enough ([`write_message_wire_len`]); `ulpdu`
/// is scratch space of MULPDU octets. Also the input of the future
/// `rx` benchmarks.
fn write_message_wire(
    msg: &[u8],
    mulpdu: u32,
    crc_on: bool,
    eng: &mut SoftCrc32c,
    wire: &mut [u8],
    ulpdu: &mut [u8],
) -> usize {
    let target = BufferFields::Tagged(TaggedFields {
        stag: 0x1234_5600,
        to: 0x10_0000,
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
        iwarp_core::ddp::check_bounds(t.to, body.len() as u32, 0x10_0000, sink.len() as u64)
            .expect("bounds");
        let off = (t.to - 0x10_0000) as usize;
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

// Future groups: `rx` ("parse+place") and `tx` ("frame build"); see the
// module documentation.

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = crc, mpa_frames, ddp_segmentation, fpdu, message
}
criterion_main!(benches);
