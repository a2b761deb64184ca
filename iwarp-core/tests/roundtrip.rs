// SPDX-License-Identifier: GPL-2.0

//! Transmitter to Receiver: random messages go through `tx` (batched,
//! partially sent, resumed) and the resulting stream, cut into random
//! pieces, through `rx`; the placements must rebuild every payload exactly
//! and every header and fixed-format payload must come out as sent.

use iwarp_core::crc32c::SoftCrc32c;
use iwarp_core::rdmap::{
    AtomicOp, AtomicRequest, AtomicResponse, Extensions, ImmediateData, Opcode, ReadRequest,
};
use iwarp_core::rx::{FixedPayload, Receiver, RxConfig, RxEvent, Target, Unlimited};
use iwarp_core::terminate::{MpaCode, TermCode, TerminateRepr, UntaggedCode};
use iwarp_core::tx::{
    Batch, Chunk, Contiguous, Message, PlanStatus, Transmitter, TxConfig, TxError,
};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
struct Setup {
    crc: bool,
    markers: bool,
    stream_start: u32,
    mulpdu: u16,
    budget: usize,
    partial: bool,
}

/// The wire stream, the messages started (index, MSN) and the MULPDU used.
type Transmitted = (Vec<u8>, Vec<(usize, Option<u32>)>, u16);

/// Runs `msgs` through a Transmitter with batch type `Batch<P, S>`; returns
/// the wire stream and, per message actually started, its index and MSN.
fn transmit<const P: usize, const S: usize>(
    s: &Setup,
    msgs: &[(Message, Vec<u8>)],
    tx_splits: &[usize],
) -> Transmitted {
    let mut tx = Transmitter::new(TxConfig {
        crc: s.crc,
        markers: s.markers,
        stream_start: s.stream_start,
        mulpdu: s.mulpdu,
        extensions: Extensions::ALL,
    });
    let payloads: Vec<&[u8]> = msgs.iter().map(|(_, p)| &p[..]).collect();
    let mut batch: Batch<P, S> = Batch::new();
    let mut crc = SoftCrc32c::new();
    let mut stream = Vec::new();
    let mut started = Vec::new();
    let mut splits = tx_splits.iter().cycle();
    let send = |batch: &mut Batch<P, S>, n: usize, stream: &mut Vec<u8>| {
        let n = n.min(batch.pending_len());
        let mut left = n;
        for c in batch.chunks() {
            if left == 0 {
                break;
            }
            let bytes: &[u8] = match c {
                Chunk::Bytes(b) => b,
                Chunk::Payload { tag, offset, len } => {
                    &payloads[tag as usize][offset as usize..(offset + len) as usize]
                }
            };
            let k = left.min(bytes.len());
            stream.extend_from_slice(&bytes[..k]);
            left -= k;
        }
        batch.advance(n).unwrap();
    };
    for (i, (m, p)) in msgs.iter().enumerate() {
        let mut mt = match tx.start(m) {
            Ok(mt) => mt,
            Err(TxError::MulpduTooSmall { .. }) => continue,
            Err(e) => panic!("start {m:?}: {e:?}"),
        };
        started.push((i, mt.msn()));
        loop {
            let r = tx
                .plan(
                    &mut batch,
                    &mut mt,
                    i as u32,
                    &mut Contiguous(p),
                    &mut crc,
                    s.budget,
                )
                .unwrap();
            if r.status == PlanStatus::MessageDone {
                break;
            }
            loop {
                send(&mut batch, *splits.next().unwrap(), &mut stream);
                if s.partial || batch.is_done() {
                    break;
                }
            }
        }
    }
    while !batch.is_done() {
        send(&mut batch, *splits.next().unwrap(), &mut stream);
    }
    (stream, started, tx.mulpdu())
}

/// Feeds `stream` to a Receiver in pieces of the given sizes and checks
/// that the started messages come out exactly.
fn receive_and_check(
    s: &Setup,
    msgs: &[(Message, Vec<u8>)],
    started: &[(usize, Option<u32>)],
    mulpdu: u16,
    stream: &[u8],
    rx_splits: &[usize],
) {
    let mut rx = Receiver::new(
        RxConfig {
            crc: s.crc,
            markers: s.markers.then_some(s.stream_start),
            extensions: Extensions::ALL,
            max_ulpdu_len: mulpdu,
            queues: 4,
        },
        SoftCrc32c::new(),
    );
    let mut next = 0usize; // index into `started`
    let mut cur: Vec<u8> = Vec::new();
    let mut base: Option<Target> = None;
    let mut segments = 0usize;
    // A message's header arrived and its last segment has not completed.
    let mut open = false;
    let mut at = 0usize;
    let mut splits = rx_splits.iter().cycle();
    while at < stream.len() {
        let n = (*splits.next().unwrap()).min(stream.len() - at);
        let mut piece = &stream[at..at + n];
        at += n;
        while let Some(ev) = rx.poll(&mut piece, &mut Unlimited).unwrap() {
            let &(i, msn) = started.get(next).expect("more messages than sent");
            let (msg, payload) = &msgs[i];
            match ev {
                RxEvent::Header(h) => {
                    open = true;
                    assert_eq!(h.opcode, msg.opcode(), "message {i}");
                    if h.first {
                        assert!(cur.is_empty());
                        base = Some(h.target);
                        let want = match *msg {
                            Message::RdmaWrite { stag, to, .. }
                            | Message::ReadResponse { stag, to, .. } => Target::Tagged { stag, to },
                            _ => Target::Untagged {
                                qn: msg.opcode().queue_number().unwrap(),
                                msn: msn.unwrap(),
                                mo: 0,
                            },
                        };
                        assert_eq!(h.target, want, "message {i}");
                    }
                    let inv = match *msg {
                        Message::SendInvalidate { stag, .. }
                        | Message::SendSeInvalidate { stag, .. } => Some(stag),
                        _ => None,
                    };
                    assert_eq!(h.invalidate_stag, inv);
                    let hdr = if msg.opcode().is_tagged() { 14 } else { 18 };
                    assert!(h.payload_len as usize + hdr <= mulpdu as usize);
                }
                RxEvent::Data(p) => {
                    let off = match (base.unwrap(), p.target) {
                        (Target::Tagged { stag, to }, Target::Tagged { stag: s2, to: t2 }) => {
                            assert_eq!(stag, s2);
                            (t2 - to) as usize
                        }
                        (
                            Target::Untagged { qn, msn, .. },
                            Target::Untagged {
                                qn: q2,
                                msn: m2,
                                mo,
                            },
                        ) => {
                            assert_eq!((qn, msn), (q2, m2));
                            mo as usize
                        }
                        other => panic!("target model changed: {other:?}"),
                    };
                    // In-order placement continues the message.
                    assert_eq!(off, cur.len(), "message {i}");
                    cur.extend_from_slice(p.data);
                }
                RxEvent::Done(d) => {
                    segments += 1;
                    let Some(len) = d.message_len else { continue };
                    open = false;
                    match (msg, rx.fixed_payload().copied()) {
                        (Message::ReadRequest(r), Some(FixedPayload::ReadRequest(g))) => {
                            assert_eq!(*r, g)
                        }
                        (Message::AtomicRequest(r), Some(FixedPayload::AtomicRequest(g))) => {
                            assert_eq!(*r, g)
                        }
                        (Message::AtomicResponse(r), Some(FixedPayload::AtomicResponse(g))) => {
                            assert_eq!(*r, g)
                        }
                        (
                            Message::ImmediateData { data, .. },
                            Some(FixedPayload::ImmediateData(g)),
                        ) => {
                            assert_eq!(*data, g)
                        }
                        (Message::Terminate(t), Some(FixedPayload::Terminate(g))) => {
                            assert_eq!(Ok(*t), g)
                        }
                        (_, None) => {
                            assert_eq!(len, payload.len() as u64, "message {i}");
                            assert_eq!(&cur, payload, "message {i}");
                        }
                        other => panic!("message {i}: {other:?}"),
                    }
                    cur.clear();
                    base = None;
                    next += 1;
                }
            }
        }
        assert!(piece.is_empty());
        // Every piece's end: the receiver says whether the stream ends
        // with a whole message (TCP's "end of the peer's write").
        assert_eq!(
            rx.at_message_end(),
            !open && rx.at_fpdu_boundary(),
            "after {at} octets"
        );
    }
    assert!(rx.at_message_end());
    assert_eq!(next, started.len(), "every message received");
    assert!(rx.at_fpdu_boundary());
    assert!(segments >= started.len());
}

fn message(k: u8, len: usize, stag: u32, to: u64, seed: u8) -> (Message, Vec<u8>) {
    let payload: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed ^ (i >> 8) as u8)
        .collect();
    let l = len as u32;
    let to = to >> 1;
    let msg = match k {
        0 => Message::Send { len: l },
        1 => Message::SendInvalidate { len: l, stag },
        2 => Message::SendSe { len: l },
        3 => Message::SendSeInvalidate { len: l, stag },
        4 => Message::RdmaWrite { len: l, stag, to },
        5 => Message::ReadResponse { len: l, stag, to },
        6 => Message::ReadRequest(ReadRequest {
            sink_stag: stag,
            sink_to: to,
            read_size: l,
            source_stag: !stag,
            source_to: to ^ 0xfff,
        }),
        7 => Message::ImmediateData {
            data: ImmediateData { data: [seed; 8] },
            solicited: seed.is_multiple_of(2),
        },
        8 => Message::AtomicRequest(AtomicRequest {
            op: [AtomicOp::FetchAdd, AtomicOp::Swap, AtomicOp::CmpSwap][seed as usize % 3],
            request_id: stag,
            remote_stag: !stag,
            remote_to: to & !7,
            add_or_swap_data: to,
            add_or_swap_mask: !to,
            compare_data: u64::from(stag),
            compare_mask: u64::MAX,
        }),
        9 => Message::AtomicResponse(AtomicResponse {
            request_id: stag,
            original_value: to,
        }),
        _ => Message::send(
            l,
            !seed.is_multiple_of(2),
            stag.is_multiple_of(2).then_some(stag),
        ),
    };
    let payload = if msg.payload_len() == 0 {
        Vec::new()
    } else {
        payload
    };
    (msg, payload)
}

fn terminate(seed: u8) -> Message {
    Message::Terminate(if seed.is_multiple_of(2) {
        TerminateRepr::new(TermCode::Mpa(MpaCode::CrcError))
    } else {
        let mut seg = vec![0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
        seg.extend_from_slice(&[seed; 28]);
        TerminateRepr::for_segment(TermCode::DdpUntagged(UntaggedCode::MsnRange), &seg, 28)
    })
}

fn run(
    s: &Setup,
    msgs: &[(Message, Vec<u8>)],
    small: bool,
    tx_splits: &[usize],
    rx_splits: &[usize],
) {
    let (stream, started, mulpdu) = if small && s.mulpdu < 1600 {
        transmit::<12, 200>(s, msgs, tx_splits)
    } else {
        transmit::<512, 4096>(s, msgs, tx_splits)
    };
    receive_and_check(s, msgs, &started, mulpdu, &stream, rx_splits);
}

#[test]
fn every_opcode_every_setting() {
    let mut msgs: Vec<(Message, Vec<u8>)> = (0..11u8)
        .map(|k| {
            message(
                k,
                700 + usize::from(k) * 111,
                0x1000 + u32::from(k),
                1 << 20,
                k,
            )
        })
        .collect();
    msgs.push((terminate(1), Vec::new()));
    for crc in [false, true] {
        for markers in [false, true] {
            for (mulpdu, budget) in [(100u16, 0usize), (1460, 4096), (u16::MAX, usize::MAX)] {
                for stream_start in [0u32, 500, u32::MAX - 1023] {
                    let s = Setup {
                        crc,
                        markers,
                        stream_start,
                        mulpdu,
                        budget,
                        partial: true,
                    };
                    run(&s, &msgs, false, &[1000, 1, 77], &[1, 2, 3, 500, 4096]);
                    run(&s, &msgs, true, &[usize::MAX], &[usize::MAX]);
                }
            }
        }
    }
}

fn arb_messages() -> impl Strategy<Value = Vec<(Message, Vec<u8>)>> {
    (
        proptest::collection::vec(
            (
                0u8..11,
                0usize..3000,
                any::<u32>(),
                any::<u64>(),
                any::<u8>(),
            ),
            1..7,
        ),
        proptest::option::of(any::<u8>()),
    )
        .prop_map(|(ms, term)| {
            let mut v: Vec<(Message, Vec<u8>)> = ms
                .into_iter()
                .map(|(k, len, stag, to, seed)| message(k, len, stag, to, seed))
                .collect();
            if let Some(seed) = term {
                // A Terminate ends the stream.
                v.push((terminate(seed), Vec::new()));
            }
            v
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_messages_round_trip(
        msgs in arb_messages(),
        crc in any::<bool>(),
        markers in any::<bool>(),
        stream_start in prop_oneof![Just(0u32), any::<u32>().prop_map(|x| x & !3), any::<u32>()],
        mulpdu in prop_oneof![3 => 19u16..160, 2 => 160u16..2000, 1 => Just(u16::MAX)],
        budget in prop_oneof![Just(0usize), 1usize..9000, Just(usize::MAX)],
        partial in any::<bool>(),
        small in any::<bool>(),
        tx_splits in proptest::collection::vec(1usize..4000, 1..8),
        rx_splits in proptest::collection::vec(prop_oneof![1usize..8, 1usize..3000], 1..12),
    ) {
        let s = Setup { crc, markers, stream_start, mulpdu, budget, partial };
        run(&s, &msgs, small, &tx_splits, &rx_splits);
    }
}

#[test]
fn opcodes_used() {
    // The generator covers every opcode.
    let mut ops: Vec<Opcode> = (0..11u8)
        .map(|k| message(k, 1, 2, 3, 4).0.opcode())
        .collect();
    ops.push(terminate(0).opcode());
    ops.push(message(7, 0, 0, 0, 1).0.opcode());
    ops.push(message(10, 1, 0, 0, 0).0.opcode());
    ops.push(message(10, 1, 1, 0, 1).0.opcode());
    ops.sort_by_key(|o| o.value());
    ops.dedup();
    assert_eq!(ops, Opcode::ALL.to_vec());
}
