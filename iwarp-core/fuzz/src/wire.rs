// SPDX-License-Identifier: GPL-2.0
//! `wire_parsers`: every parser of the wire formats, with round trips
//! (parse, emit, parse again: equal) wherever an emitter exists, and the
//! sender/receiver helpers checked against each other.
//!
//! The first input octet selects the check (modulo [`SEL_COUNT`]); the rest
//! is laid out as described at each `SEL_*` constant. Multi-octet numbers
//! are big endian.

use super::{reference_crc32c, Input};
use iwarp_core::crc32c::{self, CrcEngine, SoftCrc32c};
use iwarp_core::ddp::{self, BufferFields, DdpHeader, Segmenter, TaggedFields, UntaggedFields};
use iwarp_core::mpa::{self, MarkerState, MpaError, MpaFrameRepr};
use iwarp_core::rdmap::{self, Extensions, Opcode, PayloadKind};
use iwarp_core::terminate::{
    self, HeaderCopy, TermCode, TerminateControl, TerminateError, TerminateRepr,
};

/// `frame`: [`MpaFrameRepr::parse`]; round trip (octet-exact but for an S
/// flag that carried no block); every shorter prefix of a valid frame is
/// `Incomplete` with a `needed` that does not overshoot; a short output
/// buffer is refused.
pub const SEL_MPA_FRAME: u8 = 0;
/// `block (4+)`: [`mpa::EnhancedData`] parse/emit, octet-exact.
pub const SEL_ENHANCED: u8 = 1;
/// `ext (1: bit 0 atomics, bit 1 immediate data) | segment`: a DDP segment
/// (header + payload): [`DdpHeader::parse`] round trip (octet-exact but for
/// reserved bits), [`HeaderCopy`], `rdmap::validate` and its invariants, the
/// fixed-payload parser the opcode calls for, and the Terminate that would
/// report the segment's error ([`TerminateRepr::for_segment`]) round trip.
pub const SEL_DDP_SEGMENT: u8 = 2;
/// `which (1: 0 Read Request, 1 Atomic Request, 2 Atomic Response, 3
/// Immediate Data) | payload`: the fixed-payload parsers, round trip.
pub const SEL_RDMAP_FIXED: u8 = 3;
/// `msn (4) | payload`: [`TerminateControl::parse`] and
/// [`TerminateRepr::parse`], round trip of the payload and of the whole
/// message from `emit_message`.
pub const SEL_TERMINATE: u8 = 4;
/// `flags (1: bit 0 CRC) | wire`: [`mpa::parse_fpdu`], re-emit with
/// [`mpa::emit_fpdu`], prefixes, CRC errors.
pub const SEL_FPDU: u8 = 5;
/// `flags (1: bit 0 CRC, bit 1 short ULPDU buffer) | stream position (4) |
/// buffer length (2) | wire`: [`mpa::parse_fpdu_with_markers`], state left
/// alone on error, re-emit from the same position gives the same length and
/// end state, prefixes.
pub const SEL_FPDU_MARKERS: u8 = 6;
/// `n (1, modulo 8) | n piece sizes (2 each) | data`: CRC32c one-shot,
/// streaming in pieces, append/resume, against a bitwise reference, and the
/// FPDU CRC helpers.
pub const SEL_CRC: u8 = 7;
/// `flags (1: bit 0 CRC, bit 1 markers) | stream position (4) | corrupt (2)
/// | n (1, modulo 16) | n ULPDU lengths (2 each, modulo 9000)`: a stream of
/// FPDUs built with `emit_fpdu` parses back FPDU by FPDU to the same ULPDUs
/// and marker state; with CRC, flipping one octet (chosen by `corrupt`) is
/// always detected unless it changed a ULPDU_Length.
pub const SEL_FPDU_STREAM: u8 = 8;
/// `opcode (1) | flags (1: bit 0 tagged) | stag or rsvd_ulp (4) | qn (4) |
/// msn (4) | base TO (8) | message length (4) | mulpdu (4)`: [`Segmenter`]
/// output (contiguous, bounded by MULPDU, L on the last only, headers round
/// trip) accepted by the receiver checks (`UntaggedQueue`, `TaggedStream`,
/// `check_bounds`), and refused by a buffer one octet short.
pub const SEL_SEGMENTER: u8 = 9;
/// A sequence of 8-octet operations on an `UntaggedQueue` and a
/// `TaggedStream` (see [`queue_ops`]); an untagged error leaves the queue
/// unchanged; every error is justified; `check_bounds` against u128
/// arithmetic.
pub const SEL_QUEUES: u8 = 10;
/// `emss (4) | stream position (4) | flags (1: bit 0 markers)`:
/// [`mpa::mulpdu`]: an FPDU of MULPDU octets needs no pad and fits the
/// segment wherever it starts.
pub const SEL_MULPDU: u8 = 11;
/// Number of selectors.
pub const SEL_COUNT: u8 = 12;

/// The `wire_parsers` target. Returns what the input exercised (used by the
/// seed generator).
pub fn run(data: &[u8]) -> &'static str {
    let Some((&sel, rest)) = data.split_first() else {
        return "empty";
    };
    match sel % SEL_COUNT {
        SEL_MPA_FRAME => mpa_frame(rest),
        SEL_ENHANCED => enhanced(rest),
        SEL_DDP_SEGMENT => ddp_segment(rest),
        SEL_RDMAP_FIXED => rdmap_fixed(rest),
        SEL_TERMINATE => terminate(rest),
        SEL_FPDU => fpdu(rest),
        SEL_FPDU_MARKERS => fpdu_markers(rest),
        SEL_CRC => crc(rest),
        SEL_FPDU_STREAM => fpdu_stream(rest),
        SEL_SEGMENTER => segmenter(rest),
        SEL_QUEUES => queue_ops(rest),
        _ => mulpdu(rest),
    }
}

fn engine(on: bool, e: &mut SoftCrc32c) -> Option<&mut dyn CrcEngine> {
    if on {
        Some(e)
    } else {
        None
    }
}

// ---------------------------------------------------------------------------
// MPA Request/Reply frames
// ---------------------------------------------------------------------------

fn mpa_frame(data: &[u8]) -> &'static str {
    match MpaFrameRepr::parse(data) {
        Ok((repr, total)) => {
            assert!(total >= mpa::FRAME_HEADER_LEN && total <= data.len());
            assert!(total <= mpa::MAX_FRAME_LEN);
            assert_eq!(total, repr.buffer_len());
            assert_eq!(&data[..mpa::KEY_LEN], repr.kind.key());
            assert!(repr.flags.reserved <= 0x0f);
            let mut out = [0u8; mpa::MAX_FRAME_LEN];
            let n = repr.emit(&mut out).expect("emit of a parsed frame");
            assert_eq!(n, total);
            let mut want = data[..total].to_vec();
            if repr.enhanced.is_none() {
                want[mpa::KEY_LEN] &= !0x10; // an S flag without a block
            }
            assert_eq!(&out[..n], &want[..], "emit(parse(x)) != x");
            let (again, m) = MpaFrameRepr::parse(&out[..n]).expect("reparse");
            assert_eq!((again, m), (repr, n), "parse(emit(parse(x))) != parse(x)");
            assert_eq!(
                repr.emit(&mut out[..n - 1]),
                Err(MpaError::BufferTooSmall { needed: n })
            );
            for k in 0..total {
                match MpaFrameRepr::parse(&data[..k]) {
                    Err(MpaError::Incomplete { needed }) => {
                        assert!(
                            needed >= 1 && k + needed <= total,
                            "prefix {k}: needed {needed}"
                        )
                    }
                    other => panic!("prefix {k} of a valid frame: {other:?}"),
                }
            }
            "frame"
        }
        Err(MpaError::Incomplete { needed }) => {
            assert!(needed >= 1 && data.len() + needed <= mpa::MAX_FRAME_LEN);
            "incomplete frame"
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    MpaError::BadKey
                        | MpaError::BadRevision(_)
                        | MpaError::PrivateDataTooLong(_)
                        | MpaError::EnhancedDataMissing
                ),
                "frame parse error {e:?}"
            );
            assert_eq!(e.term_code(), Some(0x04));
            "bad frame"
        }
    }
}

fn enhanced(data: &[u8]) -> &'static str {
    match mpa::EnhancedData::parse(data) {
        Ok(e) => {
            assert!(e.ird <= mpa::IRD_ORD_MAX && e.ord <= mpa::IRD_ORD_MAX);
            let mut out = [0u8; 4];
            assert_eq!(e.emit(&mut out), Ok(4));
            assert_eq!(&out[..], &data[..4]);
            assert_eq!(mpa::EnhancedData::parse(&out), Ok(e));
            assert_eq!(
                e.emit(&mut out[..3]),
                Err(MpaError::BufferTooSmall { needed: 4 })
            );
            let bad = mpa::EnhancedData {
                ird: e.ird | 0x4000,
                ..e
            };
            assert_eq!(bad.emit(&mut out), Err(MpaError::InvalidParameter));
            "block"
        }
        Err(e) => {
            assert!(data.len() < 4);
            assert_eq!(
                e,
                MpaError::Incomplete {
                    needed: 4 - data.len()
                }
            );
            "short block"
        }
    }
}

// ---------------------------------------------------------------------------
// DDP / RDMAP / Terminate
// ---------------------------------------------------------------------------

fn ddp_segment(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let ext_bits = inp.u8();
    let ext = Extensions {
        atomics: ext_bits & 1 != 0,
        immediate_data: ext_bits & 2 != 0,
    };
    let seg = inp.rest();
    let hdr = match DdpHeader::parse(seg) {
        Ok(h) => h,
        Err(e) => {
            match e {
                ddp::DdpError::Truncated { needed, available } => {
                    assert_eq!(available, seg.len());
                    assert!(needed > available);
                }
                ddp::DdpError::DdpVersion { version, .. } => assert_ne!(version, ddp::DDP_VERSION),
                ddp::DdpError::RdmapVersion { version } => {
                    assert_ne!(version, ddp::RDMAP_VERSION)
                }
            }
            report(TermCode::from(e), seg);
            return "bad DDP header";
        }
    };
    let ctrl = ddp::ControlField::parse(seg).expect("control field");
    assert_eq!(ctrl.check_versions(), Ok(()));
    let n = hdr.header_len();
    assert_eq!(n, ctrl.header_len());
    assert_eq!(
        (hdr.last, hdr.opcode, hdr.is_tagged()),
        (ctrl.last(), ctrl.opcode(), ctrl.tagged())
    );
    assert_eq!(hdr.tagged_fields().is_some(), hdr.is_tagged());
    assert_eq!(hdr.untagged_fields().is_some(), !hdr.is_tagged());
    // Round trip.
    let mut buf = [0u8; ddp::UNTAGGED_HEADER_LEN];
    assert_eq!(hdr.emit(&mut buf), Ok(n));
    let mut want = seg[..n].to_vec();
    let c = u16::from_be_bytes([want[0], want[1]])
        & !(ddp::CTRL_DDP_RSVD_MASK | ddp::CTRL_RDMAP_RSVD_MASK);
    want[..2].copy_from_slice(&c.to_be_bytes());
    assert_eq!(&buf[..n], &want[..], "DDP emit(parse(x)) != x");
    assert_eq!(DdpHeader::parse(&buf[..n]), Ok(hdr));
    assert_eq!(hdr.control(), ddp::ControlField(c));
    assert!(matches!(
        hdr.emit(&mut buf[..n - 1]),
        Err(ddp::EmitError::BufferTooShort { .. })
    ));
    let copy = HeaderCopy::from_segment(seg).expect("header copy");
    assert_eq!(copy.as_bytes(), &seg[..n]);
    assert_eq!(copy.header(), Ok(hdr));
    assert_eq!(
        HeaderCopy::from_header(&hdr).map(|c| c.header()),
        Ok(Ok(hdr))
    );

    let payload = &seg[n..];
    let op = match rdmap::validate(&hdr, ext) {
        Ok(op) => op,
        Err(e) => {
            report(TermCode::from(e), seg);
            return "RDMAP violation";
        }
    };
    assert_eq!(op.value(), hdr.opcode);
    assert!(ext.allows(op));
    assert_eq!(op.is_tagged(), hdr.is_tagged());
    if let Some(u) = hdr.untagged_fields() {
        assert_eq!(op.queue_number(), Some(u.qn));
    }
    assert!(hdr.last || !op.single_segment());
    assert_eq!(
        rdmap::invalidate_stag(&hdr),
        hdr.untagged_fields()
            .filter(|_| op.uses_invalidate_stag())
            .map(|u| u.rsvd_ulp)
    );
    if let Err(e) = rdmap::check_payload_len(op, payload.len()) {
        assert!(!op.carries_ulp_data());
        report(TermCode::from(e), seg);
        return "payload length";
    }
    match op.payload() {
        PayloadKind::Ulp => "ULP segment",
        PayloadKind::Fixed(len) => {
            assert_eq!(payload.len(), len);
            match op {
                Opcode::RdmaReadRequest => fixed(0, payload),
                Opcode::AtomicRequest => fixed(1, payload),
                Opcode::AtomicResponse => fixed(2, payload),
                Opcode::ImmediateData | Opcode::ImmediateDataSe => fixed(3, payload),
                other => panic!("fixed payload for {other:?}"),
            };
            "fixed-payload message"
        }
        PayloadKind::Terminate => {
            assert!(payload.len() >= rdmap::TERMINATE_MIN_LEN);
            terminate_payload(payload, hdr.untagged_fields().map_or(1, |u| u.msn));
            "Terminate message"
        }
    }
}

/// The Terminate that reports `code` for `segment` must be consistent and
/// round trip.
fn report(code: TermCode, segment: &[u8]) {
    let (l, t, c) = code.wire();
    assert_eq!(TermCode::from_wire(l, t, c), Some(code));
    let len = u16::try_from(segment.len()).unwrap_or(u16::MAX);
    let term = TerminateRepr::for_segment(code, segment, len);
    assert!(term.is_consistent(), "for_segment: {term:?}");
    assert_eq!(term.code, code);
    check_terminate(&term, 1);
}

/// Emit, parse: equal; the whole message parses as a valid Terminate.
fn check_terminate(t: &TerminateRepr, msn: u32) {
    let mut buf = [0u8; terminate::MAX_LEN];
    let n = t.emit(&mut buf).expect("emit of a consistent Terminate");
    assert_eq!(n, t.buffer_len());
    assert_eq!(
        TerminateRepr::parse(&buf[..n]),
        Ok(*t),
        "Terminate round trip"
    );
    if n > 0 {
        assert!(matches!(
            t.emit(&mut buf[..n - 1]),
            Err(ddp::EmitError::BufferTooShort { .. })
        ));
    }
    let mut msg = [0u8; ddp::UNTAGGED_HEADER_LEN + terminate::MAX_LEN];
    let m = t.emit_message(msn, &mut msg).expect("emit_message");
    assert_eq!(m, t.message_len());
    let hdr = DdpHeader::parse(&msg[..m]).expect("Terminate header");
    assert_eq!(hdr, terminate::terminate_header(msn));
    assert_eq!(
        rdmap::validate(&hdr, Extensions::NONE),
        Ok(Opcode::Terminate)
    );
    let payload = &msg[hdr.header_len()..m];
    assert_eq!(
        rdmap::check_payload_len(Opcode::Terminate, payload.len()),
        Ok(())
    );
    assert_eq!(TerminateRepr::parse(payload), Ok(*t));
}

fn terminate_payload(payload: &[u8], msn: u32) -> &'static str {
    if let Ok(c) = TerminateControl::parse(payload) {
        assert_eq!(
            TerminateControl::parse(&c.word().to_be_bytes()),
            Ok(c),
            "control word round trip"
        );
    }
    match TerminateRepr::parse(payload) {
        Ok(t) => {
            assert!(t.is_consistent(), "parsed Terminate inconsistent: {t:?}");
            let mut buf = [0u8; terminate::MAX_LEN];
            let n = t.emit(&mut buf).expect("emit");
            // Octet-exact but for the control word: reserved bits are
            // ignored, and a word in upstream siw's little-endian layout
            // comes back in the RFC's (terminate.rs, "Upstream siw's
            // layout").
            assert_eq!(&buf[4..n], &payload[4..n], "Terminate emit(parse(x)) != x");
            let w_in = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
            let w_out = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            assert!(
                w_out == w_in & !terminate::HDRCT_RESERVED_MASK || w_in == siw_le_word(w_out),
                "Terminate control word {w_in:#010x} read as {w_out:#010x}"
            );
            check_terminate(&t, msn);
            "terminate"
        }
        Err(TerminateError::Truncated { needed, available }) => {
            assert_eq!(available, payload.len());
            assert!(needed > available);
            "truncated terminate"
        }
        Err(TerminateError::UndefinedCode { layer, etype, code }) => {
            assert_eq!(TermCode::from_wire(layer, etype, code), None);
            "undefined code"
        }
        Err(TerminateError::InconsistentHeaderControl(h)) => {
            assert!(!h.d && (h.m || h.r));
            "inconsistent hdrct"
        }
    }
}

/// An RFC Terminate Control word as upstream siw lays it out on a
/// little-endian host: Layer and EType nibbles swapped, M, D and R moved to
/// `terminate::SIW_LE_M`, `_D`, `_R`.
fn siw_le_word(w: u32) -> u32 {
    let top = ((w >> 24) as u8).rotate_left(4);
    let mut s = u32::from(top) << 24 | (w & 0x00ff_0000);
    for (rfc, siw) in [
        (terminate::HDRCT_M, terminate::SIW_LE_M),
        (terminate::HDRCT_D, terminate::SIW_LE_D),
        (terminate::HDRCT_R, terminate::SIW_LE_R),
    ] {
        if w & rfc != 0 {
            s |= siw;
        }
    }
    s
}

fn terminate(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let msn = inp.u32();
    terminate_payload(inp.rest(), msn)
}

/// The fixed-format payload parsers: parse, emit, parse.
fn fixed(which: u8, p: &[u8]) -> &'static str {
    let mut buf = [0u8; rdmap::ATOMIC_REQUEST_LEN];
    match which % 4 {
        0 => match rdmap::ReadRequest::parse(p) {
            Ok(r) => {
                assert_eq!(r.emit(&mut buf), Ok(rdmap::READ_REQUEST_LEN));
                assert_eq!(
                    &buf[..rdmap::READ_REQUEST_LEN],
                    &p[..rdmap::READ_REQUEST_LEN]
                );
                assert_eq!(rdmap::ReadRequest::parse(&buf), Ok(r));
                "read request"
            }
            Err(_) => {
                assert!(p.len() < rdmap::READ_REQUEST_LEN);
                "short read request"
            }
        },
        1 => match rdmap::AtomicRequest::parse(p) {
            Ok(r) => {
                let n = rdmap::ATOMIC_REQUEST_LEN;
                assert_eq!(r.emit(&mut buf), Ok(n));
                let mut want = p[..n].to_vec();
                want[..3].fill(0);
                want[3] &= rdmap::ATOMIC_OPCODE_MASK as u8;
                assert_eq!(&buf[..n], &want[..]);
                assert_eq!(rdmap::AtomicRequest::parse(&buf), Ok(r));
                "atomic request"
            }
            Err(rdmap::RdmapError::UnknownAtomicOp(c)) => {
                assert!(c > 2 && c <= 0x0f);
                "unknown atomic op"
            }
            Err(_) => {
                assert!(p.len() < rdmap::ATOMIC_REQUEST_LEN);
                "short atomic request"
            }
        },
        2 => match rdmap::AtomicResponse::parse(p) {
            Ok(r) => {
                let n = rdmap::ATOMIC_RESPONSE_LEN;
                assert_eq!(r.emit(&mut buf), Ok(n));
                assert_eq!(&buf[..n], &p[..n]);
                assert_eq!(rdmap::AtomicResponse::parse(&buf[..n]), Ok(r));
                "atomic response"
            }
            Err(_) => {
                assert!(p.len() < rdmap::ATOMIC_RESPONSE_LEN);
                "short atomic response"
            }
        },
        _ => match rdmap::ImmediateData::parse(p) {
            Ok(r) => {
                let n = rdmap::IMMEDIATE_DATA_LEN;
                assert_eq!(r.emit(&mut buf), Ok(n));
                assert_eq!(&buf[..n], &p[..n]);
                assert_eq!(rdmap::ImmediateData::parse(&buf[..n]), Ok(r));
                "immediate data"
            }
            Err(_) => {
                assert!(p.len() < rdmap::IMMEDIATE_DATA_LEN);
                "short immediate data"
            }
        },
    }
}

fn rdmap_fixed(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let which = inp.u8();
    fixed(which, inp.rest())
}

// ---------------------------------------------------------------------------
// FPDUs
// ---------------------------------------------------------------------------

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn fpdu(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let crc_on = inp.u8() & 1 != 0;
    let wire = inp.rest();
    let mut eng = SoftCrc32c::new();
    match mpa::parse_fpdu(wire, engine(crc_on, &mut eng)) {
        Ok(f) => {
            let ulen = f.ulpdu.len();
            let wl = f.wire_len;
            assert!(wl <= wire.len());
            assert_eq!(wl, mpa::fpdu_len(ulen as u16));
            assert_eq!(wl, mpa::fpdu_wire_len(ulen as u16, None));
            assert_eq!(wl % 4, 0);
            assert_eq!(mpa::read_ulpdu_length(wire), Ok(ulen as u16));
            assert_eq!(f.ulpdu, &wire[2..2 + ulen]);
            assert_eq!(f.crc, le32(&wire[wl - 4..wl]));
            // Re-emit.
            let mut out = vec![0u8; wl];
            assert_eq!(
                mpa::emit_fpdu(f.ulpdu, None, engine(crc_on, &mut eng), &mut out),
                Ok(wl)
            );
            assert_eq!(&out[..2 + ulen], &wire[..2 + ulen]);
            assert!(
                out[2 + ulen..wl - 4].iter().all(|&b| b == 0),
                "pad not zero"
            );
            let pad_zero = wire[2 + ulen..wl - 4].iter().all(|&b| b == 0);
            if crc_on && pad_zero {
                assert_eq!(&out[..], &wire[..wl], "emit(parse(x)) != x");
            }
            if !crc_on {
                assert_eq!(&out[wl - 4..], &[0; 4]);
            }
            let g = mpa::parse_fpdu(&out, engine(crc_on, &mut eng)).expect("reparse");
            assert_eq!((g.ulpdu, g.wire_len), (f.ulpdu, wl));
            assert_eq!(
                mpa::emit_fpdu(f.ulpdu, None, None, &mut out[..wl - 1]),
                Err(MpaError::BufferTooSmall { needed: wl })
            );
            // Without CRC checking the same octets parse the same way.
            assert_eq!(mpa::parse_fpdu(wire, None), Ok(f));
            // Prefixes.
            for k in [0, 1, 2, 3, wl / 2, wl - 4, wl - 1] {
                let r = mpa::parse_fpdu(&wire[..k], engine(crc_on, &mut eng));
                let needed = if k < 2 { 2 - k } else { wl - k };
                assert_eq!(r, Err(MpaError::Incomplete { needed }), "prefix {k}");
            }
            if crc_on {
                "FPDU with CRC"
            } else {
                "FPDU"
            }
        }
        Err(MpaError::Incomplete { needed }) => {
            let want = match mpa::read_ulpdu_length(wire) {
                Err(_) => 2 - wire.len(),
                Ok(u) => mpa::fpdu_len(u) - wire.len(),
            };
            assert_eq!(needed, want);
            "incomplete FPDU"
        }
        Err(MpaError::BadCrc { computed, received }) => {
            assert!(crc_on);
            let f = mpa::parse_fpdu(wire, None).expect("parses without CRC");
            let wl = f.wire_len;
            assert_eq!(computed, crc32c::crc32c(&wire[..wl - 4]));
            assert_eq!(received, le32(&wire[wl - 4..wl]));
            assert_ne!(computed, received);
            assert_eq!(
                MpaError::BadCrc { computed, received }.term_code(),
                Some(0x02)
            );
            "bad CRC"
        }
        Err(e) => panic!("parse_fpdu: {e:?}"),
    }
}

fn fpdu_markers(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let crc_on = flags & 1 != 0;
    let start = inp.u32();
    let out_len = if flags & 2 != 0 {
        usize::from(inp.u16())
    } else {
        inp.u16();
        mpa::MAX_ULPDU_LEN
    };
    let wire = inp.rest();
    let mut eng = SoftCrc32c::new();
    let before = MarkerState::at(start);
    let mut st = before;
    let mut out = vec![0u8; out_len];
    match mpa::parse_fpdu_with_markers(wire, &mut st, engine(crc_on, &mut eng), &mut out) {
        Ok(m) => {
            let wl = m.wire_len;
            let ulen = m.ulpdu_len;
            assert!(wl <= wire.len() && ulen <= out_len);
            assert_eq!(wl, before.fpdu_wire_len(ulen as u16));
            assert_eq!(wl, mpa::fpdu_wire_len(ulen as u16, Some(&before)));
            assert_eq!(st.stream_pos(), start.wrapping_add(wl as u32));
            if start.is_multiple_of(4) {
                // From a 4-aligned position (any real stream) no marker can
                // split the CRC field, so it is the last four octets.
                assert_eq!(m.crc, le32(&wire[wl - 4..wl]));
            }
            // Same result without CRC checking.
            let mut st_nocrc = before;
            let mut out2 = vec![0u8; ulen];
            assert_eq!(
                mpa::parse_fpdu_with_markers(wire, &mut st_nocrc, None, &mut out2),
                Ok(m)
            );
            assert_eq!((st_nocrc, &out2[..]), (st, &out[..ulen]));
            // Re-emit from the same position: same length, same end state,
            // and it parses back to the same ULPDU.
            let mut tx = before;
            let mut buf = vec![0u8; wl];
            assert_eq!(
                mpa::emit_fpdu(
                    &out[..ulen],
                    Some(&mut tx),
                    engine(crc_on, &mut eng),
                    &mut buf
                ),
                Ok(wl)
            );
            assert_eq!(tx, st, "emit and parse end in different marker states");
            let mut rx = before;
            let mut back = vec![0u8; ulen];
            let r =
                mpa::parse_fpdu_with_markers(&buf, &mut rx, engine(crc_on, &mut eng), &mut back)
                    .expect("reparse");
            assert_eq!((r.wire_len, r.ulpdu_len, rx), (wl, ulen, st));
            assert_eq!(&back[..], &out[..ulen]);
            // Prefixes.
            for k in [0, 1, 2, 4, 6, wl / 2, wl - 4, wl - 1] {
                if k >= wl {
                    continue;
                }
                let mut s = before;
                match mpa::parse_fpdu_with_markers(
                    &wire[..k],
                    &mut s,
                    engine(crc_on, &mut eng),
                    &mut out,
                ) {
                    Err(MpaError::Incomplete { needed }) => {
                        assert!(
                            needed >= 1 && k + needed <= wl,
                            "prefix {k}: needed {needed}"
                        );
                        assert_eq!(s, before);
                    }
                    other => panic!("prefix {k} of a valid marked FPDU: {other:?}"),
                }
            }
            "marked FPDU"
        }
        Err(e) => {
            assert_eq!(st, before, "marker state changed on error {e:?}");
            match e {
                MpaError::Incomplete { needed } => {
                    assert!(needed >= 1);
                    "incomplete marked FPDU"
                }
                MpaError::MarkerMismatch { expected, received } => {
                    assert_ne!(expected & !3, u32::from(received) & !3);
                    assert_eq!(e.term_code(), Some(0x03));
                    "marker mismatch"
                }
                MpaError::BadCrc { .. } => {
                    assert!(crc_on);
                    let mut s = before;
                    let mut o = vec![0u8; out_len];
                    assert!(mpa::parse_fpdu_with_markers(wire, &mut s, None, &mut o).is_ok());
                    "bad CRC (markers)"
                }
                MpaError::BufferTooSmall { needed } => {
                    assert!(needed > out_len);
                    "short ULPDU buffer"
                }
                other => panic!("parse_fpdu_with_markers: {other:?}"),
            }
        }
    }
}

fn crc(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let n = usize::from(inp.u8() % 8);
    let sizes: Vec<usize> = (0..n).map(|_| usize::from(inp.u16())).collect();
    let data = inp.rest();
    let c = crc32c::crc32c(data);
    if data.len() <= 4096 {
        assert_eq!(c, reference_crc32c(data), "table CRC != bitwise CRC");
    }
    // Streaming in pieces.
    let mut pieces: Vec<&[u8]> = Vec::new();
    let mut off = 0;
    let mut i = 0;
    while off < data.len() {
        let s = if sizes.is_empty() {
            data.len()
        } else {
            sizes[i % sizes.len()] % (data.len() - off + 1)
        };
        pieces.push(&data[off..off + s]);
        off += s;
        i += 1;
        if i > 64 {
            pieces.push(&data[off..]);
            break;
        }
    }
    let mut e = SoftCrc32c::new();
    e.update(b"garbage before reset");
    e.reset();
    for p in &pieces {
        e.update(p);
    }
    assert_eq!(e.finish(), c);
    assert_eq!(e.finish(), c, "finish must not change the state");
    // Append and resume at the first cut.
    let cut = pieces.first().map_or(0, |p| p.len());
    let (a, b) = data.split_at(cut);
    assert_eq!(crc32c::crc32c_append(crc32c::crc32c(a), b), c);
    let mut r = SoftCrc32c::resume(crc32c::crc32c(a));
    r.update(b);
    assert_eq!(r.finish(), c);
    // Wire order and the FPDU helpers.
    assert_eq!(crc32c::to_wire(c), c.to_le_bytes());
    assert_eq!(crc32c::from_wire(crc32c::to_wire(c)), c);
    assert_eq!(mpa::crc_trailer(Some(c)), crc32c::to_wire(c));
    assert_eq!(mpa::compute_fpdu_crc(&mut e, &pieces), c);
    assert_eq!(
        mpa::check_fpdu_crc(&mut e, &pieces, &crc32c::to_wire(c)),
        Ok(())
    );
    assert_eq!(
        mpa::check_crc_trailer(c, &crc32c::to_wire(c ^ 1)),
        Err(MpaError::BadCrc {
            computed: c,
            received: c ^ 1
        })
    );
    assert_eq!(
        mpa::check_crc_trailer(c, &crc32c::to_wire(c)[..3]),
        Err(MpaError::Incomplete { needed: 1 })
    );
    "crc"
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seed) as u8)
        .collect()
}

fn fpdu_stream(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let crc_on = flags & 1 != 0;
    let markers = flags & 2 != 0;
    let start = inp.u32();
    let corrupt = inp.u16();
    let n = usize::from(inp.u8() % 16);
    let lens: Vec<usize> = (0..n).map(|_| usize::from(inp.u16()) % 9000).collect();
    let mut eng = SoftCrc32c::new();
    let start_state = markers.then(|| MarkerState::at(start));

    // Transmit.
    let mut tx = start_state;
    let mut wire = Vec::new();
    let mut bounds = Vec::new(); // (offset, wire length, state before)
    for (i, &len) in lens.iter().enumerate() {
        let ulpdu = pattern(len, i);
        let need = mpa::fpdu_wire_len(len as u16, tx.as_ref());
        if let Some(m) = tx {
            assert_eq!(need, m.wire_len_of(mpa::fpdu_len(len as u16)));
            assert_eq!(
                need,
                mpa::fpdu_len(len as u16) + 4 * m.markers_in(mpa::fpdu_len(len as u16))
            );
        }
        let off = wire.len();
        wire.resize(off + need, 0xee);
        let before = tx;
        // A buffer one octet short fails and leaves the state alone.
        assert_eq!(
            mpa::emit_fpdu(
                &ulpdu,
                tx.as_mut(),
                engine(crc_on, &mut eng),
                &mut wire[off..off + need - 1]
            ),
            Err(MpaError::BufferTooSmall { needed: need })
        );
        assert_eq!(tx, before);
        let got = mpa::emit_fpdu(
            &ulpdu,
            tx.as_mut(),
            engine(crc_on, &mut eng),
            &mut wire[off..],
        );
        assert_eq!(got, Ok(need));
        if let (Some(b), Some(a)) = (before, tx) {
            assert_eq!(a.stream_pos(), b.stream_pos().wrapping_add(need as u32));
        }
        bounds.push((off, need, before));
    }

    // Receive, FPDU by FPDU.
    let mut rx = start_state;
    let mut out = vec![0u8; mpa::MAX_ULPDU_LEN];
    for (i, &(off, need, _)) in bounds.iter().enumerate() {
        let ulpdu = pattern(lens[i], i);
        match rx.as_mut() {
            Some(m) => {
                let r = mpa::parse_fpdu_with_markers(
                    &wire[off..],
                    m,
                    engine(crc_on, &mut eng),
                    &mut out,
                )
                .unwrap_or_else(|e| panic!("FPDU {i} of an emitted marked stream: {e:?}"));
                assert_eq!((r.wire_len, r.ulpdu_len), (need, lens[i]));
                assert_eq!(&out[..lens[i]], &ulpdu[..]);
            }
            None => {
                let f = mpa::parse_fpdu(&wire[off..], engine(crc_on, &mut eng))
                    .unwrap_or_else(|e| panic!("FPDU {i} of an emitted stream: {e:?}"));
                assert_eq!(f.wire_len, need);
                assert_eq!(f.ulpdu, &ulpdu[..]);
            }
        }
    }
    assert_eq!(rx, tx, "receiver and sender marker states differ");

    // A flipped octet is caught by the CRC. Only for 4-aligned stream
    // positions, as in a real stream (every FPDU and marker is a multiple
    // of four octets): from an odd position a marker can fall inside the
    // CRC field, where the CRC does not cover it.
    if crc_on && !wire.is_empty() && (!markers || start.is_multiple_of(4)) {
        let pos = usize::from(corrupt) % wire.len();
        let mask = ((corrupt >> 8) as u8) | 1;
        wire[pos] ^= mask;
        let (i, &(off, _, state)) = bounds
            .iter()
            .enumerate()
            .find(|(_, &(o, l, _))| pos >= o && pos < o + l)
            .expect("position inside an FPDU");
        let got_len = match state {
            Some(mut m) => {
                mpa::parse_fpdu_with_markers(&wire[off..], &mut m, Some(&mut eng), &mut out)
                    .map(|r| r.ulpdu_len)
            }
            None => mpa::parse_fpdu(&wire[off..], Some(&mut eng)).map(|f| f.ulpdu.len()),
        };
        if let Ok(l) = got_len {
            assert_ne!(
                l, lens[i],
                "corruption at {pos} (xor {mask:#x}) not detected"
            );
        }
        return "corrupted stream";
    }
    if markers {
        "marked stream"
    } else {
        "stream"
    }
}

fn mulpdu(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let emss = inp.u32();
    let start = inp.u32();
    let markers = inp.u8() & 1 != 0;
    let mu = mpa::mulpdu(emss, markers);
    assert!(mu <= 65534);
    if mu == 0 {
        return "no MULPDU";
    }
    assert_eq!(mpa::pad_len(usize::from(mu)), 0, "MULPDU {mu} needs pad");
    let st = markers.then(|| MarkerState::at(start));
    let wl = mpa::fpdu_wire_len(mu, st.as_ref());
    assert!(
        wl <= emss as usize,
        "FPDU of MULPDU {mu} takes {wl} octets > EMSS {emss} at position {start}"
    );
    let mut tx = st;
    let mut buf = vec![0u8; wl];
    let ulpdu = vec![0x5au8; usize::from(mu)];
    match mpa::emit_fpdu(&ulpdu, tx.as_mut(), None, &mut buf) {
        Ok(n) => {
            assert_eq!(n, wl);
            "mulpdu"
        }
        // With markers, an FPDU whose markers lie more than 65535 octets
        // from its start cannot be sent (FPDUPTR is 16 bits); mulpdu() only
        // gives such a length for an EMSS above 65535, which a TCP MSS
        // (a 16-bit option) never is.
        Err(MpaError::InvalidParameter) if markers && emss > 65535 => "mulpdu, FPDUPTR overflow",
        Err(e) => panic!("emit_fpdu of MULPDU {mu} (EMSS {emss}, position {start}): {e:?}"),
    }
}

// ---------------------------------------------------------------------------
// Segmentation and receive bookkeeping
// ---------------------------------------------------------------------------

fn segmenter(data: &[u8]) -> &'static str {
    const MAX_SEGMENTS: usize = 2048;
    let mut inp = Input::new(data);
    let opcode = inp.u8();
    let tagged = inp.u8() & 1 != 0;
    let stag = inp.u32();
    let qn = inp.u32();
    let msn = inp.u32();
    let base_to = inp.u64();
    let msg_len = inp.u32();
    let mulpdu = inp.u32();
    let target = if tagged {
        BufferFields::Tagged(TaggedFields { stag, to: base_to })
    } else {
        BufferFields::Untagged(UntaggedFields {
            rsvd_ulp: stag,
            qn,
            msn,
            mo: 0xdead_beef, // ignored: MO starts at 0
        })
    };
    let hl = if tagged {
        ddp::TAGGED_HEADER_LEN
    } else {
        ddp::UNTAGGED_HEADER_LEN
    };
    let mut seg = match Segmenter::new(opcode, target, msg_len, mulpdu) {
        Ok(s) => s,
        Err(ddp::SegmentError::OpcodeRange(o)) => {
            assert!(opcode > 0x0f && o == opcode);
            return "opcode range";
        }
        Err(ddp::SegmentError::MulpduTooSmall {
            mulpdu: m,
            header_len,
        }) => {
            assert!(opcode <= 0x0f && m == mulpdu && header_len == hl);
            assert!(mulpdu as usize <= hl);
            return "MULPDU too small";
        }
        Err(ddp::SegmentError::ToWrap) => {
            assert!(tagged && ddp::last_to(base_to, msg_len).is_err());
            return "TO wrap";
        }
    };
    assert!(opcode <= 0x0f && mulpdu as usize > hl);
    let chunk = mulpdu - hl as u32;
    assert_eq!(seg.max_payload(), chunk);
    let count = seg.remaining();
    let want = if msg_len == 0 {
        1
    } else {
        msg_len.div_ceil(chunk) as usize
    };
    assert_eq!(count, want);
    assert_eq!(seg.len(), count);
    let complete = count <= MAX_SEGMENTS;
    let mut segs = Vec::new();
    let mut next_off = 0u32;
    for i in 0..count.min(MAX_SEGMENTS) {
        let s = seg.next().expect("segment");
        assert_eq!(seg.remaining(), count - i - 1);
        assert_eq!(s.offset, next_off);
        assert!(s.len <= chunk);
        assert!(s.len > 0 || msg_len == 0);
        assert!(s.segment_len() <= mulpdu as usize);
        assert_eq!(s.segment_len(), hl + s.len as usize);
        assert_eq!(s.header.last, i == count - 1);
        assert_eq!(s.header.opcode, opcode);
        assert_eq!(
            s.payload_range(),
            s.offset as usize..(s.offset + s.len) as usize
        );
        match s.header.buffer {
            BufferFields::Tagged(t) => {
                assert_eq!((t.stag, t.to), (stag, base_to + u64::from(s.offset)));
            }
            BufferFields::Untagged(u) => {
                assert_eq!((u.rsvd_ulp, u.qn, u.msn, u.mo), (stag, qn, msn, s.offset));
            }
        }
        let mut buf = [0u8; ddp::UNTAGGED_HEADER_LEN];
        assert_eq!(s.header.emit(&mut buf), Ok(hl));
        assert_eq!(DdpHeader::parse(&buf[..hl]), Ok(s.header));
        next_off += s.len;
        segs.push(s);
    }
    if !complete {
        return "long segmentation";
    }
    assert_eq!(next_off, msg_len);
    assert_eq!(seg.next(), None);
    assert_eq!(seg.next(), None, "fused");
    assert_eq!(seg.remaining(), 0);

    // The receiver accepts exactly this.
    if tagged {
        let mut ts = ddp::TaggedStream::new();
        for s in &segs {
            let f = s.header.tagged_fields().expect("tagged");
            assert_eq!(ts.accept(&f, s.len, s.header.last), Ok(()));
            assert_eq!(
                ddp::check_bounds(f.to, s.len, base_to, u64::from(msg_len)),
                Ok(())
            );
        }
        assert_eq!(ts.expected(), None);
        if msg_len > 0 {
            let last = segs
                .iter()
                .rev()
                .find(|s| s.len > 0)
                .expect("a non-empty segment");
            let f = last.header.tagged_fields().expect("tagged");
            assert_eq!(
                ddp::check_bounds(f.to, last.len, base_to, u64::from(msg_len) - 1),
                Err(ddp::TaggedError::BaseBounds)
            );
        }
        "tagged segmentation"
    } else {
        let mut q = ddp::UntaggedQueue::new();
        for (i, s) in segs.iter().enumerate() {
            let u = s.header.untagged_fields().expect("untagged");
            let r = q.accept(u.msn, u.mo, s.len, s.header.last, Some(msg_len));
            if msn != ddp::INITIAL_MSN {
                assert_eq!(
                    r,
                    Err(ddp::UntaggedError::MsnRange {
                        expected: ddp::INITIAL_MSN,
                        got: msn
                    })
                );
                return "untagged segmentation, other MSN";
            }
            let p = r.expect("receiver refuses the sender's segment");
            assert_eq!((p.msn, p.offset, p.len), (msn, s.offset, s.len));
            assert_eq!(p.completed, (i == segs.len() - 1).then_some(msg_len));
        }
        assert_eq!(q.expected_msn(), ddp::INITIAL_MSN.wrapping_add(1));
        assert_eq!(q.in_progress(), None);
        if msg_len > 0 {
            let mut q = ddp::UntaggedQueue::new();
            let mut failed = false;
            for s in &segs {
                let u = s.header.untagged_fields().expect("untagged");
                let before = q;
                match q.accept(u.msn, u.mo, s.len, s.header.last, Some(msg_len - 1)) {
                    Ok(_) => {}
                    Err(e) => {
                        assert!(matches!(e, ddp::UntaggedError::MessageTooLong { .. }));
                        assert_eq!(q, before);
                        failed = true;
                        break;
                    }
                }
            }
            assert!(failed, "message longer than the buffer accepted");
        }
        "untagged segmentation"
    }
}

/// Operations, 8 octets each: `flags (bit 0 L, bit 1 a buffer is posted,
/// bit 2 tagged) | a (i8) | b (i8) | len (2) | buf (2) | c (1)`.
///
/// Untagged: MSN = expected + a, MO = received so far + b, buffer length
/// `buf` if posted. Tagged: the STag continues unless a = 0x7f (then `c`),
/// TO = expected (or `0xffff_ffff_ffff_0000 | buf` between messages) + b.
/// Also `check_bounds(to, len, base = buf << 8, region = c << 4)`.
pub fn queue_ops(data: &[u8]) -> &'static str {
    let mut inp = Input::new(data);
    let mut q = ddp::UntaggedQueue::new();
    let mut ts = ddp::TaggedStream::new();
    let mut ops = 0;
    while data.len() >= (ops + 1) * 8 {
        ops += 1;
        let flags = inp.u8();
        let a = inp.u8() as i8;
        let b = inp.u8() as i8;
        let len = u32::from(inp.u16());
        let buf = inp.u16();
        let c = inp.u8();
        let last = flags & 1 != 0;
        if flags & 4 == 0 {
            let msn = q.expected_msn().wrapping_add(a as i32 as u32);
            let received = q.in_progress().unwrap_or(0);
            let mo = received.wrapping_add(b as i32 as u32);
            let buffer = (flags & 2 != 0).then_some(u32::from(buf));
            let before = q;
            match q.accept(msn, mo, len, last, buffer) {
                Ok(p) => {
                    assert_eq!((p.msn, p.offset, p.len), (msn, mo, len));
                    assert_eq!(msn, before.expected_msn());
                    assert_eq!(mo, received);
                    let end = mo + len;
                    if last {
                        assert_eq!(p.completed, Some(end));
                        assert_eq!(q.expected_msn(), msn.wrapping_add(1));
                        assert_eq!(q.in_progress(), None);
                    } else {
                        assert_eq!(p.completed, None);
                        assert_eq!(q.in_progress(), Some(end));
                        assert_eq!(q.expected_msn(), msn);
                    }
                }
                Err(e) => {
                    assert_eq!(q, before, "queue changed on {e:?}");
                    let _ = TermCode::from(e);
                    match e {
                        ddp::UntaggedError::MsnRange { expected, got } => {
                            assert_eq!((expected, got), (before.expected_msn(), msn));
                            assert_ne!(expected, got);
                        }
                        ddp::UntaggedError::MsnNoBuffer { msn: m } => {
                            assert_eq!(m, msn);
                            assert!(before.in_progress().is_none() && buffer.is_none());
                        }
                        ddp::UntaggedError::InvalidMo { expected, got } => {
                            assert_eq!((expected, got), (received, mo));
                            assert_ne!(expected, got);
                        }
                        ddp::UntaggedError::MessageTooLong { needed, .. } => {
                            assert_eq!(needed, u64::from(mo) + u64::from(len));
                        }
                        ddp::UntaggedError::InvalidQn(_) => panic!("InvalidQn from a queue"),
                    }
                }
            }
        } else {
            let exp = ts.expected();
            let stag = match exp {
                Some(e) if a != 0x7f => e.stag,
                _ => u32::from(c),
            };
            let to = exp
                .map_or(0xffff_ffff_ffff_0000 | u64::from(buf), |e| e.to)
                .wrapping_add(b as i64 as u64);
            let f = TaggedFields { stag, to };
            match ts.accept(&f, len, last) {
                Ok(()) => {
                    if let Some(e) = exp {
                        assert_eq!((e.stag, e.to), (stag, to));
                    }
                    assert!(
                        len == 0 || u128::from(to) + u128::from(len) - 1 <= u128::from(u64::MAX)
                    );
                    if last {
                        assert_eq!(ts.expected(), None);
                    } else {
                        assert_eq!(
                            ts.expected(),
                            Some(TaggedFields {
                                stag,
                                to: to.wrapping_add(u64::from(len))
                            })
                        );
                    }
                }
                Err(e) => {
                    let _ = TermCode::from(e);
                    match e {
                        ddp::TaggedError::InvalidStag(s) => {
                            assert_eq!(s, stag);
                            assert!(exp.is_some_and(|x| x.stag != stag));
                        }
                        ddp::TaggedError::BaseBounds => {
                            assert!(exp.is_some_and(|x| x.to != to));
                        }
                        ddp::TaggedError::ToWrap => {
                            assert!(
                                len > 0
                                    && u128::from(to) + u128::from(len) - 1 > u128::from(u64::MAX)
                            );
                        }
                        ddp::TaggedError::StagNotAssociated(_) => panic!("StagNotAssociated"),
                    }
                }
            }
            // check_bounds against wide arithmetic.
            let base = u64::from(buf) << 8;
            let region = u64::from(c) << 4;
            let want = if len == 0 {
                Ok(())
            } else if u128::from(to) + u128::from(len) - 1 > u128::from(u64::MAX) {
                Err(ddp::TaggedError::ToWrap)
            } else if to < base || u128::from(to - base) + u128::from(len) > u128::from(region) {
                Err(ddp::TaggedError::BaseBounds)
            } else {
                Ok(())
            };
            assert_eq!(ddp::check_bounds(to, len, base, region), want);
        }
    }
    "queue operations"
}
