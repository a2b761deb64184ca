// SPDX-License-Identifier: GPL-2.0
//! Writes the seed corpora of the fuzz targets:
//!
//! ```text
//! cargo run --manifest-path iwarp-core/fuzz/Cargo.toml --example gen_corpus -- OUT_DIR
//! ```
//!
//! creates `OUT_DIR/mpa_handshake/`, `OUT_DIR/wire_parsers/`,
//! `OUT_DIR/rx_stream/` and `OUT_DIR/tx_roundtrip/` with one file per seed,
//! named after what it holds. Every seed is valid protocol
//! data of the kind its name says (real MPA Request/Reply frames, siw-style
//! frames, FPDUs with and without CRC and markers, DDP/RDMAP segments,
//! Terminates), and is run through the target's checks here, which must
//! report the outcome the seed was written for. `scripts/fuzz --seed` calls
//! this and keeps the seeds that `libFuzzer -merge` finds useful.
//!
//! MPA frames are assembled octet by octet from the RFC layout, not with
//! the crate's emitters, so the seeds do not inherit an emitter bug.

use iwarp_core::crc32c::SoftCrc32c;
use iwarp_core::ddp::DdpHeader;
use iwarp_core::mpa::{self, MarkerState};
use iwarp_core::rdmap::Opcode;
use iwarp_core::rdmap::{self, AtomicOp};
use iwarp_core::terminate::{
    MpaCode, RemoteOperationCode, RemoteProtectionCode, TaggedCode, TermCode, TerminateRepr,
    UntaggedCode,
};
use iwarp_core_fuzz::hs::{
    HsInput, Side, A_FEED_MORE, A_REJECT, A_SHORT_FIRST, F_CRC_ON, F_CRC_PREFER_OFF, F_ENHANCED,
    F_MARKERS_RX, F_MARKERS_TX, F_P2P, F_STRICT, F_V2, R_READ, R_SEND, R_WRITE,
};
use iwarp_core_fuzz::rx_stream::{
    RxInput, F_ATOMICS, F_CRC, F_FLIP, F_IMMEDIATE, F_INTERLEAVE, F_MARKERS, F_RAW, F_REJECT,
    P_EXACT,
};
use iwarp_core_fuzz::stream::{MsgSpec, V_BIG, V_TERM_BAD, V_TERM_M, V_TERM_R};
use iwarp_core_fuzz::tx_roundtrip::{
    TxInput, T_ATOMICS, T_CRC, T_FLIP, T_IMMEDIATE, T_MARKERS, T_SCATTERED, T_SMALL_BATCH,
};
use iwarp_core_fuzz::wire::{
    SEL_CRC, SEL_DDP_SEGMENT, SEL_ENHANCED, SEL_FPDU, SEL_FPDU_MARKERS, SEL_FPDU_STREAM,
    SEL_MPA_FRAME, SEL_MULPDU, SEL_QUEUES, SEL_RDMAP_FIXED, SEL_SEGMENTER, SEL_TERMINATE,
};
use std::path::{Path, PathBuf};

const RW: u8 = R_WRITE | R_READ;
const REQ: &[u8; 16] = b"MPA ID Req Frame";
const REP: &[u8; 16] = b"MPA ID Rep Frame";

/// A Request/Reply frame from the RFC 5044 layout.
fn frame(key: &[u8; 16], flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
    let mut v = key.to_vec();
    v.extend_from_slice(&[flags, rev, (pd.len() >> 8) as u8, pd.len() as u8]);
    v.extend_from_slice(pd);
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

struct Out {
    dir: PathBuf,
    count: usize,
}

impl Out {
    fn new(root: &Path, target: &str) -> Self {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        Out { dir, count: 0 }
    }

    fn put(&mut self, name: &str, data: &[u8], run: fn(&[u8]) -> &'static str, expect: &str) {
        let got = run(data);
        assert_eq!(
            got, expect,
            "seed {name}: reached {got:?}, written for {expect:?}"
        );
        std::fs::write(self.dir.join(name), data).expect("write seed");
        self.count += 1;
    }
}

// ---------------------------------------------------------------------------
// mpa_handshake
// ---------------------------------------------------------------------------

/// What upstream siw runs with by default: revision 2, enhanced, CRC only
/// if the peer asks, no markers.
fn siw() -> Side {
    Side {
        flags: F_V2 | F_CRC_PREFER_OFF | F_ENHANCED,
        rtr_action: RW,
        ..Side::default()
    }
}

fn hs(mode: u8, a: Side, b: Side, schedule: &[u8], stream: &[u8]) -> Vec<u8> {
    HsInput {
        mode,
        a,
        b,
        schedule: schedule.to_vec(),
        stream: stream.to_vec(),
    }
    .encode()
}

fn init(a: Side, schedule: &[u8], stream: &[u8]) -> Vec<u8> {
    hs(0, a, Side::default(), schedule, stream)
}

fn resp(a: Side, schedule: &[u8], stream: &[u8]) -> Vec<u8> {
    hs(1, a, Side::default(), schedule, stream)
}

fn pair(a: Side, b: Side, schedule: &[u8], trailing: &[u8]) -> Vec<u8> {
    hs(2, a, b, schedule, trailing)
}

fn handshake_seeds(o: &mut Out) {
    let r = iwarp_core_fuzz::hs::run;
    let siw_p2p = Side {
        flags: siw().flags | F_P2P,
        ird: 8,
        ord: 4,
        ird_max: 16,
        ..siw()
    };
    // An FPDU (a zero-length RDMA Write RTR) arriving behind the Reply.
    let rtr_fpdu = [
        0x00, 0x0e, 0xc1, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    // --- initiator fed a Reply ---------------------------------------------
    let reply_enh = frame(REP, 0x10, 2, &[0, 0, 0, 0]);
    o.put(
        "init-siw-reply-enhanced",
        &init(siw(), &[], &reply_enh),
        r,
        "initiator: established",
    );
    let reply_p2p = frame(REP, 0x10, 2, &[0x80, 0x04, 0x80, 0x08]);
    o.put(
        "init-p2p-siw-reply-write-rtr",
        &init(
            Side {
                pd_len: 1,
                fill: b'x',
                ..siw_p2p
            },
            &[],
            &reply_p2p,
        ),
        r,
        "initiator: established",
    );
    let reply_pd = frame(REP, 0x50, 2, &[0x80, 0x05, 0x80, 0x03, b'h', b'i']);
    o.put(
        "init-p2p-reply-crc-pd-then-fpdu",
        &init(siw_p2p, &[7, 1, 255], &cat(&[&reply_pd, &rtr_fpdu])),
        r,
        "initiator: established",
    );
    o.put(
        "init-reply-one-octet-at-a-time",
        &init(siw(), &[1], &reply_enh),
        r,
        "initiator: established",
    );
    o.put(
        "init-reject-rev1",
        &init(siw(), &[], &frame(REP, 0x20, 1, b"no")),
        r,
        "initiator: rejected",
    );
    o.put(
        "init-reject-siw-style-s-without-block",
        &init(siw(), &[], &frame(REP, 0x30, 2, b"")),
        r,
        "initiator: rejected",
    );
    o.put(
        "init-reject-enhanced-with-pd",
        &init(
            siw(),
            &[3, 0, 9],
            &frame(REP, 0x30, 2, &[0, 0, 0, 0, b'b', b'y', b'e']),
        ),
        r,
        "initiator: rejected",
    );
    let rev1_mc = Side {
        flags: F_CRC_ON | F_MARKERS_RX | F_MARKERS_TX,
        ..Side::default()
    };
    o.put(
        "init-rev1-markers-crc",
        &init(rev1_mc, &[], &frame(REP, 0xc0, 1, b"abc")),
        r,
        "initiator: established",
    );
    o.put(
        "init-crc-required-reply-without-c",
        &init(
            Side {
                flags: siw().flags & !0x06 | F_CRC_ON,
                ..siw()
            },
            &[],
            &reply_enh,
        ),
        r,
        "initiator: policy error",
    );
    o.put(
        "init-reply-asks-markers",
        &init(siw(), &[], &frame(REP, 0x90, 2, &[0, 0, 0, 0])),
        r,
        "initiator: policy error",
    );
    o.put(
        "init-reply-rev1-to-enhanced",
        &init(siw(), &[], &frame(REP, 0x00, 1, b"")),
        r,
        "initiator: established",
    );
    o.put(
        "init-gets-request",
        &init(siw(), &[], &frame(REQ, 0x10, 2, &[0, 0, 0, 0])),
        r,
        "initiator: policy error",
    );
    o.put(
        "init-bad-key",
        &init(
            siw(),
            &[5],
            b"MPA ID Rxp Frame\x10\x02\x00\x04\x00\x00\x00\x00",
        ),
        r,
        "initiator: bad frame",
    );
    o.put(
        "init-reply-truncated",
        &init(siw(), &[4], &reply_pd[..23]),
        r,
        "initiator: waiting",
    );
    let read_only = Side {
        flags: siw().flags | F_P2P,
        rtr_action: R_READ,
        ..siw()
    };
    o.put(
        "init-p2p-read-rtr-ord-bumped",
        &init(
            read_only,
            &[],
            &frame(REP, 0x10, 2, &[0x80, 0x01, 0x40, 0x00]),
        ),
        r,
        "initiator: established",
    );
    o.put(
        "init-raise-ird-to-peer-ord",
        &init(
            Side {
                ird: 2,
                ord: 2,
                ird_max: 32,
                ..siw()
            },
            &[],
            &frame(REP, 0x10, 2, &[0x00, 0x04, 0x00, 0x10]),
        ),
        r,
        "initiator: established",
    );
    o.put(
        "init-insufficient-ird",
        &init(
            Side {
                ird: 2,
                ord: 2,
                ird_max: 2,
                ..siw()
            },
            &[],
            &frame(REP, 0x10, 2, &[0x00, 0x04, 0x00, 0x10]),
        ),
        r,
        "initiator: policy error",
    );
    o.put(
        "init-short-request-buffer",
        &init(
            Side {
                rtr_action: R_WRITE | A_SHORT_FIRST,
                short: 10,
                ..siw()
            },
            &[],
            &reply_enh,
        ),
        r,
        "initiator: established",
    );

    // --- responder fed a Request -------------------------------------------
    let siw_req = frame(REQ, 0x10, 2, &[0x80, 0x04, 0xc0, 0x08, 1, 2, 3]);
    let p2p_resp = Side {
        flags: siw().flags | F_P2P,
        ird_max: 16,
        acc_ird: 16,
        acc_ord: 2,
        pd_len: 2,
        fill: b'o',
        ..siw()
    };
    o.put(
        "resp-siw-p2p-request",
        &resp(p2p_resp, &[], &siw_req),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-siw-request-in-pieces",
        &resp(siw(), &[3, 0, 5, 17], &siw_req),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-default-request",
        &resp(
            Side {
                acc_ird: 4,
                acc_ord: 4,
                ..siw()
            },
            &[],
            &frame(REQ, 0x10, 2, &[0, 0, 0, 0]),
        ),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-rev1-markers-crc",
        &resp(rev1_mc, &[], &frame(REQ, 0xc0, 1, b"abc")),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-gso-flag-request",
        &resp(siw(), &[], &frame(REQ, 0x58, 2, &[0x00, 0x10, 0x00, 0x10])),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-reject",
        &resp(
            Side {
                rtr_action: A_REJECT | RW,
                pd_len: 5,
                fill: b'a',
                ..siw()
            },
            &[],
            &siw_req,
        ),
        r,
        "responder: rejected",
    );
    o.put(
        "resp-data-before-reply",
        &resp(
            Side {
                rtr_action: A_FEED_MORE | RW,
                ..siw()
            },
            &[],
            &cat(&[&siw_req, &rtr_fpdu]),
        ),
        r,
        "responder: rejected",
    );
    o.put(
        "resp-feed-nothing-more",
        &resp(
            Side {
                rtr_action: A_FEED_MORE | RW,
                ..siw()
            },
            &[],
            &siw_req,
        ),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-short-reply-buffer",
        &resp(
            Side {
                rtr_action: A_SHORT_FIRST | RW,
                short: 23,
                pd_len: 3,
                ..siw()
            },
            &[],
            &siw_req,
        ),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-private-data-too-long",
        &resp(
            Side {
                pd_len: 600,
                ..siw()
            },
            &[],
            &siw_req,
        ),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-strict-revision-mismatch",
        &resp(
            Side {
                flags: siw().flags | F_STRICT,
                ..siw()
            },
            &[],
            &frame(REQ, 0, 1, b""),
        ),
        r,
        "responder: rejected",
    );
    o.put(
        "resp-gets-reply",
        &resp(siw(), &[], &reply_enh),
        r,
        "responder: rejected",
    );
    o.put(
        "resp-max-private-data",
        &resp(siw(), &[255, 255, 255], &frame(REQ, 0, 1, &[0x42; 512])),
        r,
        "responder: accepted",
    );
    o.put(
        "resp-pd-length-too-long",
        &resp(siw(), &[], b"MPA ID Req Frame\x00\x01\x02\x01"),
        r,
        "responder: bad frame",
    );
    o.put(
        "resp-enhanced-block-missing",
        &resp(siw(), &[], &frame(REQ, 0x10, 2, &[0x80, 0x04])),
        r,
        "responder: bad frame",
    );

    // --- pair ----------------------------------------------------------------
    let acc = Side {
        acc_ird: 4,
        acc_ord: 8,
        ..siw()
    };
    o.put(
        "pair-siw-defaults",
        &pair(siw(), acc, &[], &[]),
        r,
        "pair: established",
    );
    o.put(
        "pair-p2p-then-rtr-fpdu",
        &pair(siw_p2p, Side { ird_max: 16, ..acc }, &[9, 2, 40], &rtr_fpdu),
        r,
        "pair: established",
    );
    o.put(
        "pair-crc-on-vs-prefer-off",
        &pair(
            Side {
                flags: siw().flags & !0x06 | F_CRC_ON,
                ..siw()
            },
            acc,
            &[],
            &[],
        ),
        r,
        "pair: established",
    );
    o.put(
        "pair-markers-both-ways",
        &pair(
            Side {
                flags: siw().flags | F_MARKERS_RX | F_MARKERS_TX,
                ..siw()
            },
            Side {
                flags: siw().flags | F_MARKERS_RX | F_MARKERS_TX,
                ..acc
            },
            &[],
            &[],
        ),
        r,
        "pair: established",
    );
    o.put(
        "pair-rev1-initiator",
        &pair(
            Side {
                flags: F_CRC_PREFER_OFF,
                ..siw()
            },
            acc,
            &[],
            &[],
        ),
        r,
        "pair: established",
    );
    o.put(
        "pair-rev1-responder-strict-initiator",
        &pair(
            Side {
                flags: siw().flags | F_STRICT,
                ..siw()
            },
            Side {
                flags: F_CRC_PREFER_OFF,
                ..acc
            },
            &[],
            &[],
        ),
        r,
        "pair: initiator refused",
    );
    o.put(
        "pair-read-rtr",
        &pair(
            read_only,
            Side {
                flags: siw().flags,
                rtr_action: R_READ,
                ..acc
            },
            &[1],
            &[],
        ),
        r,
        "pair: established",
    );
    o.put(
        "pair-reject-with-pd",
        &pair(
            siw(),
            Side {
                rtr_action: A_REJECT,
                pd_len: 7,
                fill: b'r',
                ..siw()
            },
            &[],
            &[],
        ),
        r,
        "pair: rejected",
    );
    o.put(
        "pair-no-matching-rtr",
        &pair(
            Side {
                flags: siw().flags | F_P2P,
                rtr_action: R_SEND,
                ..siw()
            },
            Side {
                rtr_action: R_WRITE,
                ..acc
            },
            &[],
            &[],
        ),
        r,
        "pair: rejected",
    );
    o.put(
        "pair-data-before-reply",
        &pair(
            siw(),
            Side {
                rtr_action: A_FEED_MORE | R_WRITE,
                ..acc
            },
            &[],
            &rtr_fpdu,
        ),
        r,
        "pair: rejected",
    );
    o.put(
        "pair-ird-ord-raise",
        &pair(
            Side {
                ird: 1,
                ord: 64,
                ird_max: 128,
                ..siw()
            },
            Side {
                acc_ird: 2,
                acc_ord: 100,
                ird_max: 200,
                ..acc
            },
            &[],
            &[],
        ),
        r,
        "pair: established",
    );
    o.put(
        "pair-markers-unsupported",
        &pair(
            siw(),
            Side {
                flags: siw().flags | F_MARKERS_RX,
                ..acc
            },
            &[],
            &[],
        ),
        r,
        "pair: initiator refused",
    );
}

// ---------------------------------------------------------------------------
// wire_parsers
// ---------------------------------------------------------------------------

fn sel(s: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![s];
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

fn hdr(h: DdpHeader) -> Vec<u8> {
    let mut b = [0u8; 18];
    let n = h.emit(&mut b).expect("header");
    b[..n].to_vec()
}

fn term(t: &TerminateRepr) -> Vec<u8> {
    let mut b = [0u8; 64];
    let n = t.emit(&mut b).expect("terminate");
    b[..n].to_vec()
}

fn fpdu(ulpdu: &[u8], markers: Option<u32>, crc: bool) -> Vec<u8> {
    let mut st = markers.map(MarkerState::at);
    let len = mpa::fpdu_wire_len(ulpdu.len() as u16, st.as_ref());
    let mut out = vec![0u8; len];
    let mut e = SoftCrc32c::new();
    let eng: Option<&mut dyn iwarp_core::crc32c::CrcEngine> = if crc { Some(&mut e) } else { None };
    mpa::emit_fpdu(ulpdu, st.as_mut(), eng, &mut out).expect("fpdu");
    out
}

fn be16(v: u16) -> [u8; 2] {
    v.to_be_bytes()
}

fn be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

fn wire_seeds(o: &mut Out) {
    let r = iwarp_core_fuzz::wire::run;

    // --- MPA frames and blocks ---------------------------------------------
    let f = |n: &str, data: Vec<u8>, want: &str, o: &mut Out| {
        o.put(n, &sel(SEL_MPA_FRAME, &[&data]), r, want)
    };
    f(
        "frame-request-v1-minimal",
        frame(REQ, 0, 1, b""),
        "frame",
        o,
    );
    f(
        "frame-request-v1-mc-abc",
        frame(REQ, 0xc0, 1, b"abc"),
        "frame",
        o,
    );
    f(
        "frame-reply-v2-enhanced-hi",
        frame(REP, 0x50, 2, &[0x80, 0x05, 0x80, 0x03, b'h', b'i']),
        "frame",
        o,
    );
    f(
        "frame-siw-request-p2p",
        frame(REQ, 0x10, 2, &[0x80, 0x04, 0xc0, 0x08, 1, 2, 3]),
        "frame",
        o,
    );
    f("frame-reject-no", frame(REP, 0x20, 1, b"no"), "frame", o);
    f(
        "frame-siw-reject-s-no-block",
        frame(REP, 0x30, 2, b"x"),
        "frame",
        o,
    );
    f(
        "frame-s-flag-in-rev1",
        frame(REQ, 0x10, 1, b"ab"),
        "frame",
        o,
    );
    f(
        "frame-gso-reserved-bit",
        frame(REQ, 0x58, 2, &[0, 0x10, 0, 0x10]),
        "frame",
        o,
    );
    f(
        "frame-max-private-data",
        frame(REQ, 0, 1, &[7; 512]),
        "frame",
        o,
    );
    f(
        "frame-incomplete",
        frame(REQ, 0x10, 2, &[0x80, 0x04, 0xc0, 0x08, 1, 2, 3])[..22].to_vec(),
        "incomplete frame",
        o,
    );
    f("frame-bad-revision", frame(REQ, 0, 3, b""), "bad frame", o);
    f(
        "frame-enhanced-missing",
        frame(REQ, 0x10, 2, &[1, 2]),
        "bad frame",
        o,
    );
    for (n, b) in [
        ("enh-p2p-send-read", [0xc0, 0x10, 0x40, 0x20]),
        ("enh-max", [0x3f, 0xff, 0x3f, 0xff]),
        ("enh-all-bits", [0xff; 4]),
        ("enh-zero", [0; 4]),
    ] {
        o.put(n, &sel(SEL_ENHANCED, &[&b]), r, "block");
    }

    // --- DDP segments ---------------------------------------------------------
    let payload16: Vec<u8> = (0..16).collect();
    let seg = |n: &str, ext: u8, h: DdpHeader, p: &[u8], want: &str, o: &mut Out| {
        o.put(n, &sel(SEL_DDP_SEGMENT, &[&[ext], &hdr(h), p]), r, want)
    };
    seg(
        "ddp-rdma-write",
        0,
        DdpHeader::tagged(0, true, 0x1234_5600, 0x1000),
        &payload16,
        "ULP segment",
        o,
    );
    seg(
        "ddp-read-response-middle",
        0,
        DdpHeader::tagged(2, false, 0xabcd, 1 << 40),
        &payload16,
        "ULP segment",
        o,
    );
    seg(
        "ddp-send",
        0,
        DdpHeader::untagged(3, true, 0, 0, 1, 0),
        &payload16,
        "ULP segment",
        o,
    );
    seg(
        "ddp-send-invalidate",
        0,
        DdpHeader::untagged(4, true, 0x5500_0001, 0, 7, 1448),
        &payload16,
        "ULP segment",
        o,
    );
    seg(
        "ddp-send-se-first",
        0,
        DdpHeader::untagged(5, false, 0, 0, 2, 0),
        &payload16,
        "ULP segment",
        o,
    );
    let rr = rdmap::ReadRequest {
        sink_stag: 0x100,
        sink_to: 0x2000,
        read_size: 65536,
        source_stag: 0x200,
        source_to: 0x3000,
    };
    let mut rrb = [0u8; 28];
    rr.emit(&mut rrb).expect("rr");
    seg(
        "ddp-read-request",
        0,
        DdpHeader::untagged(1, true, 0, 1, 1, 0),
        &rrb,
        "fixed-payload message",
        o,
    );
    seg(
        "ddp-read-request-short",
        0,
        DdpHeader::untagged(1, true, 0, 1, 1, 0),
        &rrb[..20],
        "payload length",
        o,
    );
    seg(
        "ddp-immediate-data",
        2,
        DdpHeader::untagged(8, true, 0, 0, 1, 0),
        b"imm-data",
        "fixed-payload message",
        o,
    );
    seg(
        "ddp-immediate-disabled",
        0,
        DdpHeader::untagged(9, true, 0, 0, 1, 0),
        b"imm-data",
        "RDMAP violation",
        o,
    );
    let ar = rdmap::AtomicRequest {
        op: AtomicOp::CmpSwap,
        request_id: 9,
        remote_stag: 0x77,
        remote_to: 0x8000,
        add_or_swap_data: 5,
        add_or_swap_mask: !0,
        compare_data: 4,
        compare_mask: !0,
    };
    let mut arb = [0u8; 52];
    ar.emit(&mut arb).expect("ar");
    seg(
        "ddp-atomic-request",
        1,
        DdpHeader::untagged(0xa, true, 0, 1, 1, 0),
        &arb,
        "fixed-payload message",
        o,
    );
    let aresp = rdmap::AtomicResponse {
        request_id: 9,
        original_value: 4,
    };
    let mut aresb = [0u8; 12];
    aresp.emit(&mut aresb).expect("aresp");
    seg(
        "ddp-atomic-response",
        3,
        DdpHeader::untagged(0xb, true, 0, 3, 1, 0),
        &aresb,
        "fixed-payload message",
        o,
    );
    let t_crc = TerminateRepr::new(TermCode::Mpa(MpaCode::CrcError));
    seg(
        "ddp-terminate-crc",
        0,
        DdpHeader::untagged(7, true, 0, 2, 1, 0),
        &term(&t_crc),
        "Terminate message",
        o,
    );
    seg(
        "ddp-wrong-queue",
        0,
        DdpHeader::untagged(3, true, 0, 2, 1, 0),
        &payload16,
        "RDMAP violation",
        o,
    );
    seg(
        "ddp-read-request-not-last",
        0,
        DdpHeader::untagged(1, false, 0, 1, 1, 0),
        &rrb,
        "RDMAP violation",
        o,
    );
    seg(
        "ddp-reserved-opcode",
        0,
        DdpHeader::tagged(0xc, true, 1, 0),
        b"",
        "RDMAP violation",
        o,
    );
    seg(
        "ddp-tagged-send",
        0,
        DdpHeader::tagged(3, true, 1, 0),
        b"",
        "RDMAP violation",
        o,
    );
    let mut badv = hdr(DdpHeader::tagged(0, true, 1, 0));
    badv[0] = (badv[0] & !0x03) | 0x02; // DV 2
    o.put(
        "ddp-bad-ddp-version",
        &sel(SEL_DDP_SEGMENT, &[&[0], &badv]),
        r,
        "bad DDP header",
    );
    let mut badr = hdr(DdpHeader::untagged(3, true, 0, 0, 1, 0));
    badr[1] = (badr[1] & !0xc0) | 0x80; // RV 2
    o.put(
        "ddp-bad-rdmap-version",
        &sel(SEL_DDP_SEGMENT, &[&[0], &badr]),
        r,
        "bad DDP header",
    );
    o.put(
        "ddp-truncated",
        &sel(
            SEL_DDP_SEGMENT,
            &[&[0], &hdr(DdpHeader::untagged(3, true, 0, 0, 1, 0))[..10]],
        ),
        r,
        "bad DDP header",
    );

    // --- fixed payloads ---------------------------------------------------------
    o.put(
        "fixed-read-request",
        &sel(SEL_RDMAP_FIXED, &[&[0], &rrb]),
        r,
        "read request",
    );
    o.put(
        "fixed-atomic-request",
        &sel(SEL_RDMAP_FIXED, &[&[1], &arb]),
        r,
        "atomic request",
    );
    let mut bad_op = arb;
    bad_op[3] = 0x0e;
    o.put(
        "fixed-atomic-unknown-op",
        &sel(SEL_RDMAP_FIXED, &[&[1], &bad_op]),
        r,
        "unknown atomic op",
    );
    o.put(
        "fixed-atomic-response",
        &sel(SEL_RDMAP_FIXED, &[&[2], &aresb]),
        r,
        "atomic response",
    );
    o.put(
        "fixed-immediate",
        &sel(SEL_RDMAP_FIXED, &[&[3], b"12345678"]),
        r,
        "immediate data",
    );

    // --- Terminates -------------------------------------------------------------------
    let send_seg = cat(&[&hdr(DdpHeader::untagged(3, true, 0, 0, 5, 0)), &payload16]);
    let rr_seg = cat(&[&hdr(DdpHeader::untagged(1, true, 0, 1, 1, 0)), &rrb]);
    let write_seg = cat(&[&hdr(DdpHeader::tagged(0, true, 0x99, 0x10)), &payload16]);
    for (n, t) in [
        ("term-mpa-crc", t_crc),
        (
            "term-untagged-msn-range",
            TerminateRepr::for_segment(
                TermCode::DdpUntagged(UntaggedCode::MsnRange),
                &send_seg,
                16,
            ),
        ),
        (
            "term-tagged-base-bounds",
            TerminateRepr::for_segment(TermCode::DdpTagged(TaggedCode::BaseBounds), &write_seg, 16),
        ),
        (
            "term-protection-read-request",
            TerminateRepr::for_segment(
                TermCode::RdmapRemoteProtection(RemoteProtectionCode::InvalidStag),
                &rr_seg,
                28,
            ),
        ),
        (
            "term-protection-send",
            TerminateRepr::for_segment(
                TermCode::RdmapRemoteProtection(RemoteProtectionCode::AccessRights),
                &send_seg,
                16,
            ),
        ),
        (
            "term-unspecified",
            TerminateRepr::for_segment(
                TermCode::RdmapRemoteOperation(RemoteOperationCode::Unspecified),
                &send_seg,
                16,
            ),
        ),
        (
            "term-local-catastrophic",
            TerminateRepr::new(TermCode::RdmapLocalCatastrophic(0xff)),
        ),
    ] {
        o.put(
            n,
            &sel(SEL_TERMINATE, &[&be32(1), &term(&t)]),
            r,
            "terminate",
        );
    }
    o.put(
        "term-undefined-code",
        &sel(SEL_TERMINATE, &[&be32(1), &[0x2f, 0x00, 0x00, 0x00]]),
        r,
        "undefined code",
    );
    o.put(
        "term-m-without-d",
        &sel(SEL_TERMINATE, &[&be32(1), &[0x20, 0x02, 0x80, 0x00]]),
        r,
        "inconsistent hdrct",
    );
    o.put(
        "term-truncated-header",
        &sel(
            SEL_TERMINATE,
            &[
                &be32(1),
                &term(&TerminateRepr::for_segment(
                    TermCode::DdpUntagged(UntaggedCode::InvalidMo),
                    &send_seg,
                    16,
                ))[..12],
            ],
        ),
        r,
        "truncated terminate",
    );

    // --- FPDUs --------------------------------------------------------------------
    let send_ulpdu = send_seg.clone();
    o.put(
        "fpdu-abc-no-crc",
        &sel(SEL_FPDU, &[&[0], &fpdu(b"abc", None, false)]),
        r,
        "FPDU",
    );
    o.put(
        "fpdu-abc-crc",
        &sel(SEL_FPDU, &[&[1], &fpdu(b"abc", None, true)]),
        r,
        "FPDU with CRC",
    );
    o.put(
        "fpdu-empty-crc",
        &sel(SEL_FPDU, &[&[1], &fpdu(b"", None, true)]),
        r,
        "FPDU with CRC",
    );
    o.put(
        "fpdu-send-crc",
        &sel(SEL_FPDU, &[&[1], &fpdu(&send_ulpdu, None, true)]),
        r,
        "FPDU with CRC",
    );
    let big: Vec<u8> = (0..1442u32).map(|i| (i * 7) as u8).collect();
    o.put(
        "fpdu-mulpdu-1448-crc",
        &sel(SEL_FPDU, &[&[1], &fpdu(&big, None, true)]),
        r,
        "FPDU with CRC",
    );
    let mut bad = fpdu(b"abcd", None, true);
    bad[3] ^= 0x40;
    o.put("fpdu-bad-crc", &sel(SEL_FPDU, &[&[1], &bad]), r, "bad CRC");
    o.put(
        "fpdu-incomplete",
        &sel(SEL_FPDU, &[&[1], &fpdu(&big, None, true)[..100]]),
        r,
        "incomplete FPDU",
    );
    for (n, pos, ulpdu, crc) in [
        ("mfpdu-start-of-stream", 0u32, &send_ulpdu[..], true),
        ("mfpdu-aligned-mid", 100, &b"abc"[..], false),
        ("mfpdu-straddles-marker", 500, &send_ulpdu[..], true),
        ("mfpdu-marker-before-crc", 480, &[0x11; 26][..], true),
        ("mfpdu-long-several-markers", 1020, &big[..], true),
        ("mfpdu-unaligned", 510, &b"xyz"[..], true),
        ("mfpdu-near-wrap", 0xffff_fe00, &big[..600], true),
    ] {
        let w = fpdu(ulpdu, Some(pos), crc);
        o.put(
            n,
            &sel(SEL_FPDU_MARKERS, &[&[crc as u8], &be32(pos), &be16(0), &w]),
            r,
            "marked FPDU",
        );
    }
    let mut mm = fpdu(&send_ulpdu, Some(500), false);
    mm[12 + 3] ^= 0x10; // FPDUPTR of the marker at stream offset 512
    o.put(
        "mfpdu-marker-mismatch",
        &sel(SEL_FPDU_MARKERS, &[&[0], &be32(500), &be16(0), &mm]),
        r,
        "marker mismatch",
    );
    o.put(
        "mfpdu-short-buffer",
        &sel(
            SEL_FPDU_MARKERS,
            &[&[2], &be32(0), &be16(3), &fpdu(&send_ulpdu, Some(0), false)],
        ),
        r,
        "short ULPDU buffer",
    );

    // --- CRC ----------------------------------------------------------------------
    o.put(
        "crc-check-string",
        &sel(SEL_CRC, &[&[0], b"123456789"]),
        r,
        "crc",
    );
    o.put(
        "crc-32-zeros-split",
        &sel(SEL_CRC, &[&[3], &be16(1), &be16(7), &be16(16), &[0; 32]]),
        r,
        "crc",
    );
    o.put(
        "crc-fpdu-split",
        &sel(
            SEL_CRC,
            &[&[2], &be16(2), &be16(18), &fpdu(&send_ulpdu, None, false)],
        ),
        r,
        "crc",
    );

    // --- FPDU streams -------------------------------------------------------------
    let stream = |flags: u8, start: u32, corrupt: u16, lens: &[u16]| {
        let mut v = vec![SEL_FPDU_STREAM, flags];
        v.extend_from_slice(&be32(start));
        v.extend_from_slice(&be16(corrupt));
        v.push(lens.len() as u8);
        for l in lens {
            v.extend_from_slice(&be16(*l));
        }
        v
    };
    o.put(
        "stream-plain",
        &stream(0, 0, 0, &[0, 1, 18, 1442, 3]),
        r,
        "stream",
    );
    o.put(
        "stream-markers",
        &stream(2, 0, 0, &[14, 508, 1442, 0, 2000]),
        r,
        "marked stream",
    );
    o.put(
        "stream-markers-crc-corrupt",
        &stream(3, 0, 0x0321, &[14, 508, 1442, 0, 2000]),
        r,
        "corrupted stream",
    );
    o.put(
        "stream-crc-corrupt",
        &stream(1, 0, 0x8007, &[28, 100]),
        r,
        "corrupted stream",
    );
    o.put(
        "stream-markers-from-offset",
        &stream(2, 4092, 0, &[500, 500, 8999]),
        r,
        "marked stream",
    );

    // --- segmentation ---------------------------------------------------------------
    let segm = |opcode: u8, tagged: bool, msn: u32, to: u64, len: u32, mulpdu: u32| {
        let mut v = vec![SEL_SEGMENTER, opcode, tagged as u8];
        v.extend_from_slice(&be32(0x1234));
        v.extend_from_slice(&be32(0)); // QN 0 (Send)
        v.extend_from_slice(&be32(msn));
        v.extend_from_slice(&to.to_be_bytes());
        v.extend_from_slice(&be32(len));
        v.extend_from_slice(&be32(mulpdu));
        v
    };
    for (len, name) in [(64, "64"), (4096, "4k"), (65536, "64k")] {
        for (mulpdu, m) in [(1448, "1448"), (65000, "65000")] {
            o.put(
                &format!("seg-write-{name}-mulpdu-{m}"),
                &segm(0, true, 0, 0x10_0000, len, mulpdu),
                r,
                "tagged segmentation",
            );
            o.put(
                &format!("seg-send-{name}-mulpdu-{m}"),
                &segm(3, false, 1, 0, len, mulpdu),
                r,
                "untagged segmentation",
            );
        }
    }
    o.put(
        "seg-empty-send",
        &segm(3, false, 1, 0, 0, 1448),
        r,
        "untagged segmentation",
    );
    o.put(
        "seg-send-msn-7",
        &segm(3, false, 7, 0, 100, 1448),
        r,
        "untagged segmentation, other MSN",
    );
    o.put(
        "seg-mulpdu-too-small",
        &segm(0, true, 0, 0, 100, 14),
        r,
        "MULPDU too small",
    );
    o.put(
        "seg-to-wrap",
        &segm(0, true, 0, u64::MAX - 10, 100, 1448),
        r,
        "TO wrap",
    );
    o.put(
        "seg-write-ends-at-2-64",
        &segm(0, true, 0, u64::MAX - 99, 100, 64),
        r,
        "tagged segmentation",
    );

    // --- queues -------------------------------------------------------------------------
    let op = |flags: u8, a: i8, b: i8, len: u16, buf: u16, c: u8| {
        let mut v = vec![flags, a as u8, b as u8];
        v.extend_from_slice(&be16(len));
        v.extend_from_slice(&be16(buf));
        v.push(c);
        v
    };
    let ops = [
        op(2, 0, 0, 1000, 3000, 0), // MSN 1, first of three
        op(0, 0, 0, 1000, 0, 0),    // continues
        op(1, 0, 0, 1000, 0, 0),    // last: 3000 octets
        op(3, 0, 0, 0, 0, 0),       // MSN 2, empty message
        op(1, 0, 0, 10, 0, 0),      // no buffer posted
        op(3, 1, 0, 10, 100, 0),    // wrong MSN
        op(2, 0, 4, 10, 100, 0),    // wrong MO
        op(3, 0, 0, 200, 100, 0),   // too long
        op(4, 0, 0, 512, 0x10, 5),  // tagged, first
        op(4, 0, 0, 512, 0, 5),     // continues
        op(4, 0x7f, 0, 512, 0, 9),  // STag changes
        op(4, 0, 8, 512, 0, 5),     // TO jumps
        op(5, 0, 0, 100, 0, 5),     // last
    ]
    .concat();
    o.put(
        "queues-messages",
        &sel(SEL_QUEUES, &[&ops]),
        r,
        "queue operations",
    );

    // --- MULPDU ---------------------------------------------------------------------------
    for (n, emss, start, markers) in [
        ("mulpdu-1460", 1460u32, 0u32, 0u8),
        ("mulpdu-1460-markers", 1460, 0, 1),
        ("mulpdu-1460-markers-mid", 1460, 508, 1),
        ("mulpdu-9000-markers", 9000, 100, 1),
        ("mulpdu-536-markers", 536, 4, 1),
        ("mulpdu-65535-markers", 65535, 2044, 1),
    ] {
        o.put(
            n,
            &sel(SEL_MULPDU, &[&be32(emss), &be32(start), &[markers]]),
            r,
            "mulpdu",
        );
    }
    o.put(
        "mulpdu-huge-markers",
        &sel(SEL_MULPDU, &[&be32(u32::MAX), &be32(0), &[1]]),
        r,
        "mulpdu, FPDUPTR overflow",
    );
}

// ---------------------------------------------------------------------------
// rx_stream and tx_roundtrip
// ---------------------------------------------------------------------------

fn spec(op: Opcode, var: u8, len: u16, a: u32, b: u64) -> MsgSpec {
    MsgSpec::new(op, var, len, a, b)
}

/// A Terminate spec: code (layer/type octet, code octet), attached headers
/// (`stream::V_TERM_*` bits in `var`), DDP Segment Length `dsl`.
fn term_spec(lt: u8, code: u8, var: u8, dsl: u16, b: u64) -> MsgSpec {
    spec(
        Opcode::Terminate,
        var,
        dsl,
        u32::from_be_bytes([lt, code, 0, 0]),
        b,
    )
}

/// One message of every opcode but Terminate, ULP-data ones with payload.
fn every_opcode() -> Vec<MsgSpec> {
    vec![
        spec(Opcode::Send, 1, 300, 0, 0),
        spec(Opcode::RdmaWrite, 2, 1000, 0x0001_1234, 0x1000),
        spec(Opcode::RdmaReadRequest, 3, 4096, 0x0002_0000, 0x2000),
        spec(Opcode::RdmaReadResponse, 4, 700, 0x0002_0000, 0x2000),
        spec(Opcode::SendInvalidate, 5, 50, 0xdead_be00, 0),
        spec(Opcode::SendSe, 6, 0, 0, 0),
        spec(Opcode::SendSeInvalidate, 7, 5, 0x0bad_f00d, 0),
        spec(Opcode::ImmediateData, 8, 0, 0, 0x0102_0304_0506_0708),
        spec(Opcode::ImmediateDataSe, 9, 0, 0, 0x1112_1314_1516_1718),
        spec(
            Opcode::AtomicRequest,
            1,
            0,
            0x0000_0042,
            0x0000_0000_0001_0000,
        ),
        spec(
            Opcode::AtomicResponse,
            0,
            0,
            0x0000_0042,
            0xffff_ffff_0000_0001,
        ),
    ]
}

fn rx_script(flags: u8, start: u32, mulpdu: u16, msgs: Vec<MsgSpec>) -> RxInput {
    RxInput {
        flags,
        start,
        queues: 4,
        posted: P_EXACT,
        mulpdu,
        msgs,
        ..RxInput::default()
    }
}

/// A stream of FPDUs around `ulpdus`, markers from `markers` on.
fn raw_stream(ulpdus: &[Vec<u8>], markers: Option<u32>, crc: bool) -> Vec<u8> {
    let mut st = markers.map(MarkerState::at);
    let mut out = Vec::new();
    for u in ulpdus {
        let len = mpa::fpdu_wire_len(u.len() as u16, st.as_ref());
        let at = out.len();
        out.resize(at + len, 0);
        let mut e = SoftCrc32c::new();
        let eng: Option<&mut dyn iwarp_core::crc32c::CrcEngine> =
            if crc { Some(&mut e) } else { None };
        mpa::emit_fpdu(u, st.as_mut(), eng, &mut out[at..]).expect("fpdu");
    }
    out
}

fn rx_raw(flags: u8, start: u32, posted: u8, lens: [u16; 4], stream: Vec<u8>) -> RxInput {
    RxInput {
        flags: flags | F_RAW,
        start,
        queues: 4,
        posted,
        lens,
        rest: stream,
        ..RxInput::default()
    }
}

fn send_ulpdu(op: u8, last: bool, msn: u32, mo: u32, payload: &[u8]) -> Vec<u8> {
    cat(&[&hdr(DdpHeader::untagged(op, last, 0, 0, msn, mo)), payload])
}

fn write_ulpdu(last: bool, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    cat(&[&hdr(DdpHeader::tagged(0, last, stag, to)), payload])
}

fn rx_seeds(o: &mut Out) {
    let r = iwarp_core_fuzz::rx_stream::run;
    let ext = F_ATOMICS | F_IMMEDIATE;
    let all = every_opcode();
    // --- scripts: every opcode, CRC and markers on and off ----------------
    for (name, flags, start, mulpdu) in [
        ("script-all-opcodes-crc", F_CRC, 0, 1440u16),
        ("script-all-opcodes-nocrc", 0, 0, 1440),
        ("script-all-opcodes-crc-markers", F_CRC | F_MARKERS, 0, 1440),
        ("script-all-opcodes-markers-mid", F_MARKERS, 508, 1440),
        (
            "script-all-opcodes-crc-markers-big",
            F_CRC | F_MARKERS,
            100,
            65535,
        ),
        ("script-multi-fpdu-crc-markers", F_CRC | F_MARKERS, 0, 120),
        ("script-multi-fpdu-nocrc", 0, 0, 19),
    ] {
        o.put(
            name,
            &rx_script(flags | ext, start, mulpdu, all.clone()).encode(),
            r,
            "ok",
        );
    }
    let mut x = rx_script(F_CRC | F_MARKERS | ext, 0, 300, all.clone());
    x.schedule = vec![1, 7, 0, 255, 3, 64];
    o.put("script-all-opcodes-scheduled", &x.encode(), r, "ok");
    // Big messages (V_BIG: three times the length field), many FPDUs.
    let big = vec![
        spec(Opcode::Send, V_BIG, 4000, 0, 0),
        spec(Opcode::RdmaWrite, V_BIG | 1, 1500, 7, 0xffff_ffff_ffff_0000),
        spec(Opcode::RdmaReadResponse, 2, 999, 8, 0),
    ];
    o.put(
        "script-big-messages-markers",
        &rx_script(F_CRC | F_MARKERS, 0, 1000, big).encode(),
        r,
        "ok",
    );
    // Interleaved lanes: a Send, a Write, single-segment messages between.
    let mixed = vec![
        spec(Opcode::Send, 1, 2000, 0, 0),
        spec(Opcode::RdmaWrite, 2, 1500, 0x77, 0x10),
        spec(Opcode::RdmaReadRequest, 3, 100, 0x55, 0),
        spec(Opcode::SendSe, 4, 700, 0, 0),
        spec(Opcode::AtomicResponse, 5, 0, 9, 9),
        spec(Opcode::RdmaReadResponse, 6, 900, 0x66, 0x20),
        spec(Opcode::ImmediateData, 7, 0, 0, 5),
    ];
    for (name, flags, order) in [
        (
            "script-interleaved",
            F_CRC,
            vec![1, 0, 1, 0, 2, 1, 0, 3, 1, 0, 1, 4, 0],
        ),
        (
            "script-interleaved-markers",
            F_CRC | F_MARKERS,
            vec![0, 1, 2, 3, 4, 0, 1, 0, 1, 0, 1],
        ),
        ("script-interleaved-nocrc", F_MARKERS, vec![7; 40]),
    ] {
        let mut x = rx_script(flags | F_INTERLEAVE | ext, 0, 200, mixed.clone());
        x.rest = order;
        x.schedule = vec![5, 1, 200];
        o.put(name, &x.encode(), r, "ok");
    }
    // Terminates: at the end, with headers attached, and followed by data.
    let mut t = all.clone();
    t.push(term_spec(0x12, 0x02, 2 | V_TERM_M, 77, 5));
    o.put(
        "script-terminate-at-end",
        &rx_script(F_CRC | ext, 0, 1440, t).encode(),
        r,
        "Terminate",
    );
    for (name, var) in [
        ("script-terminate-read-request", 3 | V_TERM_M | V_TERM_R),
        ("script-terminate-tagged-hdr", 1),
        ("script-terminate-bare", 0),
    ] {
        let msgs = vec![
            spec(Opcode::Send, 1, 10, 0, 0),
            term_spec(0x02, 0x06, var, 40, 9),
        ];
        o.put(
            name,
            &rx_script(F_CRC | F_MARKERS, 0, 100, msgs).encode(),
            r,
            "Terminate",
        );
    }
    let msgs = vec![
        term_spec(0x00, 0x01, 0, 0, 0),
        spec(Opcode::Send, 1, 10, 0, 0),
    ];
    o.put(
        "script-data-after-terminate",
        &rx_script(F_CRC, 0, 100, msgs).encode(),
        r,
        "data after Terminate",
    );
    // What the receive configuration refuses.
    let mut x = rx_script(F_CRC | ext, 0, 1000, all.clone());
    x.max_ulpdu = 500;
    o.put("script-ulpdu-over-limit", &x.encode(), r, "ULPDU length");
    o.put(
        "script-extensions-off",
        &rx_script(F_CRC, 0, 1000, all.clone()).encode(),
        r,
        "RDMAP",
    );
    let mut x = rx_script(F_CRC | ext, 0, 1000, all.clone());
    x.queues = 1;
    o.put("script-one-queue", &x.encode(), r, "untagged");
    let mut x = rx_script(F_CRC | ext, 0, 100, all.clone());
    x.posted = 0x0f;
    x.lens = [200, 1, 0, 0];
    o.put("script-posted-too-short", &x.encode(), r, "untagged");
    let mut x = rx_script(F_CRC | ext, 0, 100, all.clone());
    x.posted = 0x0e;
    o.put("script-nothing-posted", &x.encode(), r, "untagged");
    let mut x = rx_script(F_CRC | ext | F_REJECT, 0, 100, all.clone());
    x.reject = (3, 0x01, 0x02);
    o.put("script-reject-protection", &x.encode(), r, "rejected");
    let mut x = rx_script(F_MARKERS | ext | F_REJECT, 0, 100, all.clone());
    x.reject = (0, 0x11, 0x00);
    o.put("script-reject-first", &x.encode(), r, "rejected");
    // Flipped octets.
    for (name, flags, pos, mask, expect) in [
        ("flip-payload-crc", F_CRC, 100u32, 0x20u8, "flip detected"),
        (
            "flip-header-crc-markers",
            F_CRC | F_MARKERS,
            2,
            0x40,
            "flip detected",
        ),
        ("flip-crc-field", F_CRC, 335, 0x01, "flip detected"),
        ("flip-length-crc", F_CRC, 0, 0x01, "flip undetected"),
        (
            "flip-payload-nocrc",
            F_MARKERS,
            1000,
            0xff,
            "flip undetected",
        ),
        (
            "flip-marker-crc",
            F_CRC | F_MARKERS,
            514,
            0x80,
            "flip detected",
        ),
    ] {
        let mut x = rx_script(flags | ext | F_FLIP, 0, 300, all.clone());
        x.flip = (pos, mask);
        x.schedule = vec![3, 1, 100];
        o.put(name, &x.encode(), r, expect);
    }

    // --- hostile raw streams ----------------------------------------------
    let p = b"payload!";
    let s1 = send_ulpdu(3, true, 1, 0, p);
    o.put(
        "raw-empty",
        &rx_raw(F_CRC, 0, 0x01, [100, 0, 0, 0], vec![]).encode(),
        r,
        "ok",
    );
    o.put(
        "raw-send",
        &rx_raw(
            F_CRC,
            0,
            0x01,
            [100, 0, 0, 0],
            raw_stream(&[s1.clone()], None, true),
        )
        .encode(),
        r,
        "ok",
    );
    let mut half = raw_stream(&[s1.clone(), s1.clone()], None, false);
    half.truncate(40);
    o.put(
        "raw-truncated",
        &rx_raw(0, 0, 0x01, [100, 0, 0, 0], half).encode(),
        r,
        "ok",
    );
    let two = vec![
        send_ulpdu(3, false, 1, 0, &[1; 600]),
        send_ulpdu(3, true, 1, 600, &[2; 10]),
        write_ulpdu(false, 9, 0, &[3; 500]),
        write_ulpdu(true, 9, 500, &[4; 500]),
    ];
    o.put(
        "raw-messages-markers",
        &rx_raw(
            F_CRC | F_MARKERS,
            0,
            0x01,
            [4096, 0, 0, 0],
            raw_stream(&two, Some(0), true),
        )
        .encode(),
        r,
        "ok",
    );
    // An empty Send ending at a marker position, then the next FPDU's
    // leading marker: not at an FPDU boundary.
    let empty = send_ulpdu(3, true, 1, 0, &[]);
    let mut lead = raw_stream(&[empty], Some(488), false);
    lead.extend_from_slice(&[0, 0, 0, 0]);
    o.put(
        "raw-ends-in-leading-marker",
        &rx_raw(F_MARKERS, 488, 1, [100, 0, 0, 0], lead).encode(),
        r,
        "ok",
    );
    let mut lenbad = raw_stream(&[s1.clone()], None, false);
    lenbad[1] = 5;
    o.put(
        "raw-ulpdu-length-5",
        &rx_raw(0, 0, 1, [100, 0, 0, 0], lenbad).encode(),
        r,
        "ULPDU length",
    );
    let mut ver = s1.clone();
    ver[0] = 0x42; // DDP version 2
    o.put(
        "raw-ddp-version",
        &rx_raw(0, 0, 1, [100, 0, 0, 0], raw_stream(&[ver], None, false)).encode(),
        r,
        "DDP",
    );
    let mut opc = s1.clone();
    opc[1] = 0x4d; // reserved opcode 0xD
    o.put(
        "raw-reserved-opcode",
        &rx_raw(0, 0, 1, [100, 0, 0, 0], raw_stream(&[opc], None, false)).encode(),
        r,
        "RDMAP",
    );
    let mut crcbad = raw_stream(&[s1.clone()], None, true);
    let n = crcbad.len();
    crcbad[n - 1] ^= 1;
    o.put(
        "raw-bad-crc",
        &rx_raw(F_CRC, 0, 1, [100, 0, 0, 0], crcbad).encode(),
        r,
        "CRC",
    );
    let mut mk = raw_stream(&two, Some(0), false);
    mk[512 + 3] ^= 0x10; // FPDUPTR of the second marker
    o.put(
        "raw-bad-marker",
        &rx_raw(F_MARKERS, 0, 1, [4096, 0, 0, 0], mk).encode(),
        r,
        "marker",
    );
    let change = vec![
        send_ulpdu(3, false, 1, 0, &[1; 8]),
        send_ulpdu(5, true, 1, 8, &[2; 8]),
    ];
    o.put(
        "raw-opcode-changed",
        &rx_raw(0, 0, 1, [100, 0, 0, 0], raw_stream(&change, None, false)).encode(),
        r,
        "opcode changed",
    );
    let stag = vec![
        write_ulpdu(false, 9, 0, &[1; 8]),
        write_ulpdu(true, 10, 8, &[2; 8]),
    ];
    o.put(
        "raw-stag-changed",
        &rx_raw(0, 0, 1, [100, 0, 0, 0], raw_stream(&stag, None, false)).encode(),
        r,
        "tagged",
    );
    let wrap = vec![write_ulpdu(true, 9, u64::MAX - 3, &[1; 8])];
    o.put(
        "raw-to-wrap",
        &rx_raw(0, 0, 1, [100, 0, 0, 0], raw_stream(&wrap, None, false)).encode(),
        r,
        "tagged",
    );
    let msn = vec![send_ulpdu(3, true, 2, 0, p)];
    o.put(
        "raw-wrong-msn",
        &rx_raw(0, 0, 1, [100, 0, 0, 0], raw_stream(&msn, None, false)).encode(),
        r,
        "untagged",
    );
    let tterm = TerminateRepr::new(TermCode::Mpa(MpaCode::CrcError));
    let tu = cat(&[
        &hdr(DdpHeader::untagged(7, true, 0, 2, 1, 0)),
        &term(&tterm),
    ]);
    let mut after = raw_stream(&[tu.clone()], None, true);
    after.push(0);
    o.put(
        "raw-terminate-then-octet",
        &rx_raw(F_CRC, 0, 0, [0; 4], after).encode(),
        r,
        "data after Terminate",
    );
    o.put(
        "raw-terminate",
        &rx_raw(
            F_CRC | F_MARKERS,
            4,
            0,
            [0; 4],
            raw_stream(&[tu], Some(4), true),
        )
        .encode(),
        r,
        "Terminate",
    );
    let mut x = rx_raw(
        F_REJECT,
        0,
        1,
        [100, 0, 0, 0],
        raw_stream(&[s1], None, false),
    );
    x.reject = (0, 0x12, 0x05);
    o.put("raw-reject", &x.encode(), r, "rejected");
}

fn tx_script(flags: u8, start: u32, mulpdu: u16, msgs: Vec<MsgSpec>) -> TxInput {
    TxInput {
        flags,
        start,
        mulpdu,
        msgs,
        ..TxInput::default()
    }
}

fn tx_seeds(o: &mut Out) {
    let r = iwarp_core_fuzz::tx_roundtrip::run;
    let ext = T_ATOMICS | T_IMMEDIATE;
    let all = every_opcode();
    let mut with_term = all.clone();
    with_term.push(term_spec(0x12, 0x01, 3 | V_TERM_M | V_TERM_R, 30, 4));
    for (name, flags, start, mulpdu, budget, sends) in [
        ("tx-all-opcodes-crc", T_CRC, 0, 1440u16, 0u16, vec![]),
        ("tx-all-opcodes-nocrc", 0, 0, 1440, 0, vec![]),
        (
            "tx-all-opcodes-crc-markers",
            T_CRC | T_MARKERS,
            0,
            1440,
            0,
            vec![],
        ),
        (
            "tx-markers-mid-stream",
            T_CRC | T_MARKERS,
            1020,
            536,
            0,
            vec![],
        ),
        ("tx-short-sends", T_CRC, 0, 200, 0, vec![100, 1, 0, 37]),
        (
            "tx-short-sends-markers",
            T_MARKERS,
            8,
            300,
            700,
            vec![251, 2, 0, 255],
        ),
        ("tx-budget-small", T_CRC | T_MARKERS, 0, 100, 150, vec![60]),
        (
            "tx-mulpdu-65535-markers",
            T_CRC | T_MARKERS,
            0,
            65535,
            0,
            vec![200, 3],
        ),
        ("tx-mulpdu-19", T_CRC, 0, 19, 64, vec![9, 0]),
        ("tx-small-batch", T_CRC | T_SMALL_BATCH, 0, 40, 0, vec![17]),
        (
            "tx-small-batch-markers-big",
            T_CRC | T_MARKERS | T_SMALL_BATCH,
            0,
            9000,
            0,
            vec![],
        ),
    ] {
        let mut x = tx_script(flags | ext, start, mulpdu, all.clone());
        x.budget = budget;
        x.sends = sends;
        o.put(name, &x.encode(), r, "round trip");
    }
    let mut x = tx_script(T_CRC | T_MARKERS | T_SCATTERED | ext, 500, 700, all.clone());
    x.cuts = vec![10, 0, 100, 3, 255];
    x.sends = vec![50, 7];
    o.put("tx-scattered", &x.encode(), r, "round trip");
    let x = tx_script(T_SCATTERED | ext, 0, 700, all.clone());
    o.put("tx-no-payload-source-nocrc", &x.encode(), r, "round trip");
    let big = vec![
        spec(Opcode::Send, V_BIG, 5000, 0, 0),
        spec(Opcode::RdmaWrite, V_BIG, 300, 1, 0),
    ];
    let mut x = tx_script(T_CRC | T_MARKERS, 0, 1000, big);
    x.budget = 3000;
    x.sends = vec![255, 200];
    o.put("tx-big-messages", &x.encode(), r, "round trip");
    o.put(
        "tx-terminate-last",
        &tx_script(T_CRC | ext, 0, 1440, with_term.clone()).encode(),
        r,
        "round trip",
    );
    let mut after = with_term.clone();
    after.push(spec(Opcode::Send, 0, 10, 0, 0));
    o.put(
        "tx-data-after-terminate",
        &tx_script(T_CRC | ext, 0, 1440, after).encode(),
        r,
        "round trip, receiver stopped",
    );
    // What start refuses.
    o.put(
        "tx-mulpdu-too-small",
        &tx_script(T_CRC | ext, 0, 14, all.clone()).encode(),
        r,
        "nothing sent",
    );
    o.put(
        "tx-extensions-off",
        &tx_script(T_CRC, 0, 1440, all.clone()).encode(),
        r,
        "round trip",
    );
    let bad = vec![
        term_spec(0x12, 0x01, 1 | V_TERM_BAD, 30, 4),
        spec(Opcode::RdmaWrite, 0, 100, 1, u64::MAX - 10),
        spec(Opcode::Send, 0, 10, 0, 0),
    ];
    o.put(
        "tx-invalid-terminate-to-wrap",
        &tx_script(T_CRC, 0, 1440, bad).encode(),
        r,
        "round trip",
    );
    for (name, flags, pos, expect) in [
        ("tx-flip-crc", T_CRC, 77u32, "flip detected"),
        (
            "tx-flip-crc-markers",
            T_CRC | T_MARKERS,
            600,
            "flip detected",
        ),
        ("tx-flip-nocrc", T_MARKERS, 77, "flip undetected"),
    ] {
        let mut x = tx_script(flags | ext | T_FLIP, 0, 300, all.clone());
        x.flip = (pos, 0x04);
        o.put(name, &x.encode(), r, expect);
    }
}
fn main() {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    let mut hs_out = Out::new(&root, "mpa_handshake");
    handshake_seeds(&mut hs_out);
    let mut wire_out = Out::new(&root, "wire_parsers");
    wire_seeds(&mut wire_out);
    let mut rx_out = Out::new(&root, "rx_stream");
    rx_seeds(&mut rx_out);
    let mut tx_out = Out::new(&root, "tx_roundtrip");
    tx_seeds(&mut tx_out);
    println!(
        "gen_corpus: {} mpa_handshake, {} wire_parsers, {} rx_stream, {} tx_roundtrip seeds in {}",
        hs_out.count,
        wire_out.count,
        rx_out.count,
        tx_out.count,
        root.display()
    );
}
