// SPDX-License-Identifier: GPL-2.0

//! Receive cost per segment, for counting instructions.
//!
//! Wall-clock figures of the receive path are noisy on the emulated test
//! machines; an instruction count is not. This program receives the same
//! RDMA Write ITERATIONS times, one FPDU per 1448-octet TCP segment (the
//! MULPDU siw_rs and upstream siw use on a 1500-octet MTU path, no CRC, no
//! markers), through [`Receiver::poll`] (`rx`: a call per event), through
//! [`Receiver::poll_segment`] as `siw_rs/conn.rs` drives it (`segment`: a
//! call per segment), or assembled by hand from the core's parts with no incremental
//! state (`hand`: `parse_fpdu`, `DdpHeader::parse`, `rdmap::validate`,
//! `TaggedStream::accept`, `check_bounds`); `send` receives Sends of the
//! same size, untagged, a call per segment (the mixed pair's Send row).
//! All copy each payload into a sink and check it byte for byte at the
//! end. Count with callgrind at two
//! iteration counts and divide the difference by the extra segments:
//!
//! ```text
//! cargo build --release -p iwarp-core --example rx_instructions
//! for n in 200 400; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/rx_instructions rx 65536 $n; done
//! ```
//!
//! It prints the segment count per message; (I refs at 400 - at 200) /
//! (200 x segments) is the cost of one segment, the copy included.

use iwarp_core::crc32c::SoftCrc32c;
use iwarp_core::ddp::{
    check_bounds, BufferFields, DdpHeader, Segmenter, TaggedFields, TaggedStream, UntaggedFields,
};
use iwarp_core::mpa;
use iwarp_core::rdmap::{self, Extensions, Opcode};
use iwarp_core::rx::{Polled, Receiver, RxConfig, RxEvent, Target, WholeSegment};
use std::hint::black_box;
use std::ops::Range;
use std::process::ExitCode;

const STAG: u32 = 0x4a5b_6c01;
const TO_BASE: u64 = 0x7f00_0000;
const EMSS: u32 = 1448;

/// RDMAP opcodes of the two messages the program receives.
const OP_WRITE: u8 = 0;
const OP_SEND: u8 = 3;
/// Where the MSN of an untagged segment lies in its FPDU: after the
/// ULPDU_Length, the two control octets, RsvdULP and QN.
const MSN_AT: usize = 12;

/// The wire of one tagged RDMA Write of `msg`, and each FPDU's range in it.
fn write_wire(msg: &[u8]) -> (Vec<u8>, Vec<Range<usize>>) {
    let target = BufferFields::Tagged(TaggedFields {
        stag: STAG,
        to: TO_BASE,
    });
    wire_of(msg, OP_WRITE, target)
}

/// The wire of one Send of `msg` on queue 0 with MSN 1 (each FPDU's MSN is
/// rewritten for the next message: `MSN_AT`), and each FPDU's range in it.
fn send_wire(msg: &[u8]) -> (Vec<u8>, Vec<Range<usize>>) {
    let target = BufferFields::Untagged(UntaggedFields {
        rsvd_ulp: 0,
        qn: 0,
        msn: 1,
        mo: 0,
    });
    wire_of(msg, OP_SEND, target)
}

fn wire_of(msg: &[u8], opcode: u8, target: BufferFields) -> (Vec<u8>, Vec<Range<usize>>) {
    let mulpdu = u32::from(mpa::mulpdu(EMSS, false));
    let (mut wire, mut fpdus) = (Vec::new(), Vec::new());
    let mut ulpdu = vec![0u8; mulpdu as usize + 64];
    let mut frame = vec![0u8; mulpdu as usize + 64];
    for s in Segmenter::new(opcode, target, msg.len() as u32, mulpdu).expect("segmenter") {
        let h = s.header.emit(&mut ulpdu).expect("header");
        let body = &msg[s.payload_range()];
        ulpdu[h..h + body.len()].copy_from_slice(body);
        let n = mpa::emit_fpdu(&ulpdu[..h + body.len()], None, None, &mut frame).expect("fpdu");
        fpdus.push(wire.len()..wire.len() + n);
        wire.extend_from_slice(&frame[..n]);
    }
    (wire, fpdus)
}

/// Through the incremental receiver, one segment per call sequence.
fn through_receiver(
    rx: &mut Receiver<SoftCrc32c>,
    wire: &[u8],
    fpdus: &[Range<usize>],
    sink: &mut [u8],
) -> u64 {
    let room = sink.len() as u32;
    let mut posted = |_qn: u32, _msn: u32, _op: Opcode| Some(room);
    let mut done = 0;
    for r in fpdus {
        let mut rest = black_box(&wire[r.clone()]);
        while let Some(ev) = rx.poll(&mut rest, &mut posted).expect("receive") {
            match ev {
                RxEvent::Header(h) => {
                    if let Target::Tagged { to, .. } = h.target {
                        check_bounds(to, h.payload_len, TO_BASE, sink.len() as u64)
                            .expect("bounds");
                    }
                }
                RxEvent::Data(p) => {
                    let Target::Tagged { to, .. } = p.target else {
                        panic!("untagged data")
                    };
                    let at = (to - TO_BASE) as usize;
                    sink[at..at + p.data.len()].copy_from_slice(p.data);
                }
                RxEvent::Done(d) => done = d.message_len.unwrap_or(done),
            }
        }
    }
    done
}

/// Through the incremental receiver, a whole segment per call, as
/// `Conn::rx_piece` drives it; `place` copies each segment's payload into
/// the sink. With `msn` (Sends), each FPDU's MSN is written first (a few
/// instructions per segment, also counted).
fn through_segments(
    rx: &mut Receiver<SoftCrc32c>,
    wire: &mut [u8],
    fpdus: &[Range<usize>],
    sink: &mut [u8],
    msn: Option<u32>,
    place: impl Fn(&WholeSegment<'_>, &mut [u8]),
) -> u64 {
    let room = sink.len() as u32;
    let mut posted = |_qn: u32, _msn: u32, _op: Opcode| Some(room);
    let mut done = 0;
    for r in fpdus {
        if let Some(msn) = msn {
            wire[r.start + MSN_AT..r.start + MSN_AT + 4].copy_from_slice(&msn.to_be_bytes());
        }
        let mut rest = black_box(&wire[r.clone()]);
        while let Some(p) = rx.poll_segment(&mut rest, &mut posted).expect("receive") {
            let Polled::Segment(w) = p else {
                panic!("a whole FPDU came in pieces")
            };
            place(&w, sink);
            done = w.done.message_len.unwrap_or(done);
            // A whole segment at the input's end leaves nothing to poll
            // for.
            if rest.is_empty() {
                break;
            }
        }
    }
    done
}

/// A Write segment's payload to its place in the sink, bounds checked.
fn place_tagged(w: &WholeSegment<'_>, sink: &mut [u8]) {
    let Target::Tagged { to, .. } = w.done.header.target else {
        panic!("untagged data")
    };
    check_bounds(to, w.done.header.payload_len, TO_BASE, sink.len() as u64).expect("bounds");
    let at = (to - TO_BASE) as usize;
    sink[at..at + w.data.len()].copy_from_slice(w.data);
}

/// A Send segment's payload to its message offset in the sink.
fn place_untagged(w: &WholeSegment<'_>, sink: &mut [u8]) {
    let Target::Untagged { mo, .. } = w.done.header.target else {
        panic!("tagged data")
    };
    let at = mo as usize;
    let Some(dst) = sink.get_mut(at..at + w.data.len()) else {
        panic!("past the receive buffer")
    };
    dst.copy_from_slice(w.data);
}

/// The same checks and copy, each FPDU parsed whole.
fn by_hand(stream: &mut TaggedStream, wire: &[u8], fpdus: &[Range<usize>], sink: &mut [u8]) -> u64 {
    let mut placed = 0u64;
    for r in fpdus {
        let f = mpa::parse_fpdu(black_box(&wire[r.clone()]), None).expect("fpdu");
        let h = DdpHeader::parse(f.ulpdu).expect("ddp");
        rdmap::validate(&h, Extensions::NONE).expect("rdmap");
        let t = h.tagged_fields().expect("tagged");
        let body = &f.ulpdu[h.header_len()..];
        stream
            .accept(&t, body.len() as u32, h.last)
            .expect("continuity");
        check_bounds(t.to, body.len() as u32, TO_BASE, sink.len() as u64).expect("bounds");
        let at = (t.to - TO_BASE) as usize;
        sink[at..at + body.len()].copy_from_slice(body);
        placed += body.len() as u64;
    }
    placed
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let usage = || {
        eprintln!("usage: rx_instructions rx|segment|send|hand [MESSAGE_OCTETS [ITERATIONS]]");
        ExitCode::from(2)
    };
    let Some(mode) = args
        .get(1)
        .map(String::as_str)
        .filter(|m| matches!(*m, "rx" | "segment" | "send" | "hand"))
    else {
        return usage();
    };
    let parse = |i: usize, default: usize| args.get(i).map_or(Some(default), |s| s.parse().ok());
    let (Some(len), Some(iters)) = (parse(2, 65536), parse(3, 200)) else {
        return usage();
    };
    if len == 0 || len > 1 << 24 {
        return usage();
    }
    let msg: Vec<u8> = (0..len)
        .map(|i| (i as u32).wrapping_mul(0x9e37_79b1).to_be_bytes()[1])
        .collect();
    let (mut wire, fpdus) = if mode == "send" {
        send_wire(&msg)
    } else {
        write_wire(&msg)
    };
    let mut sink = vec![0u8; len];
    let mut rx = Receiver::new(RxConfig::new(false), SoftCrc32c::new());
    for i in 0..iters {
        if i + 1 == iters {
            // The last message alone fills the sink checked below (one
            // clear per run: it cancels out between two iteration counts).
            sink.fill(0);
        }
        let got = match mode {
            "rx" => through_receiver(&mut rx, &wire, &fpdus, &mut sink),
            "segment" => {
                through_segments(&mut rx, &mut wire, &fpdus, &mut sink, None, place_tagged)
            }
            "send" => {
                let msn = Some(i as u32 + 1);
                through_segments(&mut rx, &mut wire, &fpdus, &mut sink, msn, place_untagged)
            }
            _ => by_hand(&mut TaggedStream::new(), &wire, &fpdus, &mut sink),
        };
        if got != len as u64 {
            eprintln!("rx_instructions: {got} octets placed, not {len}");
            return ExitCode::FAILURE;
        }
    }
    if iters > 0 && sink != msg {
        eprintln!("rx_instructions: the sink differs from the message");
        return ExitCode::FAILURE;
    }
    println!(
        "{mode}: {} segments of at most {EMSS} octets per message, {iters} messages",
        fpdus.len()
    );
    ExitCode::SUCCESS
}
