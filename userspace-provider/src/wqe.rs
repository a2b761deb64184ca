// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Encoding of work requests into ring entries and decoding of completions,
//! shared by `ibv_post_send`/`ibv_post_recv` and the `ibv_wr_*` API.
//! Safe code only: the FFI layer turns C work requests into these types.

use libc::{EINVAL, ENOTSUP};

use crate::abi::{Cqe, Limits, Rqe, Sge, Sqe};
use crate::sys::{self, ibv_sge, ibv_wc};

/// An errno value.
pub type Errno = i32;

/// A send queue operation with its opcode-specific arguments. `imm` is the
/// immediate data as the verbs API holds it (network order); `stag` is an
/// STag to invalidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum SendOp {
    Send,
    SendImm {
        imm: u32,
    },
    SendInv {
        stag: u32,
    },
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    WriteImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    Read {
        remote_addr: u64,
        rkey: u32,
    },
    CmpSwp {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
    LocalInv {
        stag: u32,
    },
}

impl SendOp {
    fn opcode(&self) -> sys::siw_rs_opcode {
        match self {
            SendOp::Send => sys::SIW_RS_OP_SEND,
            SendOp::SendImm { .. } => sys::SIW_RS_OP_SEND_IMM,
            SendOp::SendInv { .. } => sys::SIW_RS_OP_SEND_INV,
            SendOp::Write { .. } => sys::SIW_RS_OP_WRITE,
            SendOp::WriteImm { .. } => sys::SIW_RS_OP_WRITE_IMM,
            SendOp::Read { .. } => sys::SIW_RS_OP_READ,
            SendOp::CmpSwp { .. } => sys::SIW_RS_OP_ATOMIC_CMP_SWP,
            SendOp::FetchAdd { .. } => sys::SIW_RS_OP_ATOMIC_FETCH_ADD,
            SendOp::LocalInv { .. } => sys::SIW_RS_OP_LOCAL_INV,
        }
    }
}

/// What payload an entry's opcode admits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Payload {
    /// Local invalidate: none.
    None,
    /// Reads and atomics: SGEs.
    Sges,
    /// Sends and writes: SGEs or inline data.
    SgesOrInline,
}

fn payload_of(sqe: &Sqe) -> Result<Payload, Errno> {
    Ok(match sqe.opcode as u32 {
        // RFC 7306 has no Send with Immediate (its Immediate Data message
        // takes a receive of its own); the kernel refuses it, and refusing
        // it here keeps the QP usable.
        sys::SIW_RS_OP_SEND_IMM => return Err(ENOTSUP),
        sys::SIW_RS_OP_SEND
        | sys::SIW_RS_OP_SEND_INV
        | sys::SIW_RS_OP_WRITE
        | sys::SIW_RS_OP_WRITE_IMM => Payload::SgesOrInline,
        sys::SIW_RS_OP_READ | sys::SIW_RS_OP_ATOMIC_CMP_SWP | sys::SIW_RS_OP_ATOMIC_FETCH_ADD => {
            Payload::Sges
        }
        sys::SIW_RS_OP_LOCAL_INV => Payload::None,
        _ => return Err(EINVAL),
    })
}

/// `IBV_SEND_*` flags the provider understands.
const KNOWN_SEND_FLAGS: u32 =
    sys::IBV_SEND_SIGNALED | sys::IBV_SEND_SOLICITED | sys::IBV_SEND_FENCE | sys::IBV_SEND_INLINE;

/// Translates `IBV_SEND_*` flags into `SIW_RS_WQE_*` flags (without
/// `INLINE`, which the payload setter adds) and whether inline data was
/// asked for. `sig_all` is the QP's `sq_sig_all`.
pub fn sqe_flags(send_flags: u32, sig_all: bool) -> Result<(u8, bool), Errno> {
    if send_flags & !KNOWN_SEND_FLAGS != 0 {
        return Err(ENOTSUP);
    }
    let mut f = 0;
    if sig_all || send_flags & sys::IBV_SEND_SIGNALED != 0 {
        f |= sys::SIW_RS_WQE_SIGNALED;
    }
    if send_flags & sys::IBV_SEND_SOLICITED != 0 {
        f |= sys::SIW_RS_WQE_SOLICITED;
    }
    if send_flags & sys::IBV_SEND_FENCE != 0 {
        f |= sys::SIW_RS_WQE_FENCE;
    }
    Ok((f as u8, send_flags & sys::IBV_SEND_INLINE != 0))
}

/// A send queue entry with the header filled in and no payload.
pub fn new_sqe(wr_id: u64, op: SendOp, flags: u8) -> Sqe {
    let (mut remote_addr, mut rkey, mut imm_or_inv, mut atomic) = (0, 0, 0, [0u64; 2]);
    match op {
        SendOp::Send => {}
        SendOp::SendImm { imm } => imm_or_inv = imm,
        SendOp::SendInv { stag } | SendOp::LocalInv { stag } => imm_or_inv = stag,
        SendOp::Write {
            remote_addr: a,
            rkey: k,
        }
        | SendOp::Read {
            remote_addr: a,
            rkey: k,
        } => (remote_addr, rkey) = (a, k),
        SendOp::WriteImm {
            remote_addr: a,
            rkey: k,
            imm,
        } => (remote_addr, rkey, imm_or_inv) = (a, k, imm),
        SendOp::CmpSwp {
            remote_addr: a,
            rkey: k,
            compare,
            swap,
        } => (remote_addr, rkey, atomic) = (a, k, [compare, swap]),
        SendOp::FetchAdd {
            remote_addr: a,
            rkey: k,
            add,
        } => (remote_addr, rkey, atomic) = (a, k, [add, 0]),
    }
    Sqe {
        wr_id,
        opcode: op.opcode() as u8,
        flags: flags & !(sys::SIW_RS_WQE_INLINE as u8),
        num_sge: 0,
        rsvd0: 0,
        inline_len: 0,
        remote_addr,
        rkey,
        imm_or_inv,
        atomic,
        rsvd1: [0; 2],
        __bindgen_anon_1: sys::siw_rs_sqe__bindgen_ty_1 {
            inline_data: [0; abi_max_inline()],
        },
    }
}

const fn abi_max_inline() -> usize {
    crate::abi::MAX_INLINE as usize
}

fn to_sges(
    sges: &[ibv_sge],
    max_sge: u32,
) -> Result<([Sge; crate::abi::MAX_SGE as usize], u8), Errno> {
    if sges.len() > max_sge as usize {
        return Err(EINVAL);
    }
    let mut out = [Sge {
        addr: 0,
        length: 0,
        lkey: 0,
    }; crate::abi::MAX_SGE as usize];
    for (o, s) in out.iter_mut().zip(sges) {
        *o = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    Ok((out, sges.len() as u8))
}

/// Sets the SGE list of a send queue entry (replacing any payload).
pub fn set_sges(sqe: &mut Sqe, sges: &[ibv_sge], limits: &Limits) -> Result<(), Errno> {
    if payload_of(sqe)? == Payload::None && !sges.is_empty() {
        return Err(EINVAL);
    }
    let atomic = matches!(
        sqe.opcode as u32,
        sys::SIW_RS_OP_ATOMIC_CMP_SWP | sys::SIW_RS_OP_ATOMIC_FETCH_ADD
    );
    // An atomic returns the original value into one 8-byte buffer, and its
    // target must be naturally aligned (RFC 7306); the kernel would fail
    // the QP for either, so the verb call fails instead.
    if atomic && (sges.len() != 1 || sges[0].length != 8 || !sqe.remote_addr.is_multiple_of(8)) {
        return Err(EINVAL);
    }
    let (sge, n) = to_sges(sges, limits.max_sge)?;
    sqe.__bindgen_anon_1 = sys::siw_rs_sqe__bindgen_ty_1 { sge };
    sqe.num_sge = n;
    sqe.inline_len = 0;
    sqe.flags &= !(sys::SIW_RS_WQE_INLINE as u8);
    Ok(())
}

/// Sets inline data, the concatenation of `bufs`, as the payload of a send
/// queue entry (replacing any payload). `EINVAL` if the operation cannot
/// carry inline data or the data exceeds the QP's inline limit.
pub fn set_inline<'a>(
    sqe: &mut Sqe,
    bufs: impl IntoIterator<Item = &'a [u8]>,
    limits: &Limits,
) -> Result<(), Errno> {
    if payload_of(sqe)? != Payload::SgesOrInline {
        return Err(EINVAL);
    }
    let max = (limits.max_inline as usize).min(abi_max_inline());
    let mut data = [0u8; abi_max_inline()];
    let mut len = 0usize;
    for b in bufs {
        let end = len
            .checked_add(b.len())
            .filter(|&e| e <= max)
            .ok_or(EINVAL)?;
        data[len..end].copy_from_slice(b);
        len = end;
    }
    sqe.__bindgen_anon_1 = sys::siw_rs_sqe__bindgen_ty_1 { inline_data: data };
    sqe.num_sge = 0;
    sqe.inline_len = len as u32;
    sqe.flags |= sys::SIW_RS_WQE_INLINE as u8;
    Ok(())
}

/// Total octets of an SGE list, as the inline check of `ibv_post_send`
/// needs before the data is copied.
pub fn sge_bytes(sges: &[ibv_sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// A receive queue entry.
pub fn new_rqe(wr_id: u64, sges: &[ibv_sge], limits: &Limits) -> Result<Rqe, Errno> {
    let (sge, num_sge) = to_sges(sges, limits.max_sge)?;
    Ok(Rqe {
        wr_id,
        num_sge,
        rsvd0: [0; 7],
        sge,
    })
}

/// The `IBV_WC_*` flags of a completion.
pub fn wc_flags(c: &Cqe) -> u32 {
    let mut f = 0;
    if c.flags as u32 & sys::SIW_RS_CQE_WITH_IMM != 0 {
        f |= sys::IBV_WC_WITH_IMM;
    }
    if c.flags as u32 & sys::SIW_RS_CQE_WITH_INV != 0 {
        f |= sys::IBV_WC_WITH_INV;
    }
    f
}

/// The work completion for a completion queue entry. Opcode and status
/// are the `IBV_WC_*` values the kernel wrote; `imm_or_inv` is either the
/// network-order immediate or the invalidated STag, which share a union in
/// `struct ibv_wc`.
pub fn wc_from_cqe(c: &Cqe) -> ibv_wc {
    ibv_wc {
        wr_id: c.wr_id,
        status: c.status as sys::ibv_wc_status,
        opcode: c.opcode as sys::ibv_wc_opcode,
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        __bindgen_anon_1: sys::ibv_wc__bindgen_ty_1 {
            imm_data: c.imm_or_inv,
        },
        qp_num: c.qp_num,
        src_qp: 0,
        wc_flags: wc_flags(c),
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        max_sge: 6,
        max_inline: 64,
    };

    fn sge(addr: u64, length: u32, lkey: u32) -> ibv_sge {
        ibv_sge { addr, length, lkey }
    }

    fn sges_of(s: &Sqe) -> Vec<(u64, u32, u32)> {
        // SAFETY (test): both union members are plain integer arrays.
        let all = unsafe { s.__bindgen_anon_1.sge };
        all[..s.num_sge as usize]
            .iter()
            .map(|g| (g.addr, g.length, g.lkey))
            .collect()
    }

    fn inline_of(s: &Sqe) -> Vec<u8> {
        // SAFETY (test): as above.
        let d = unsafe { s.__bindgen_anon_1.inline_data };
        d[..s.inline_len as usize].to_vec()
    }

    /// Every opcode of enum siw_rs_opcode, with its header fields.
    #[test]
    fn every_opcode_header() {
        let cases: [(SendOp, u32, u64, u32, u32, [u64; 2]); 9] = [
            (SendOp::Send, sys::SIW_RS_OP_SEND, 0, 0, 0, [0, 0]),
            (
                SendOp::SendImm { imm: 0x1122_3344 },
                sys::SIW_RS_OP_SEND_IMM,
                0,
                0,
                0x1122_3344,
                [0, 0],
            ),
            (
                SendOp::SendInv { stag: 0x55 },
                sys::SIW_RS_OP_SEND_INV,
                0,
                0,
                0x55,
                [0, 0],
            ),
            (
                SendOp::Write {
                    remote_addr: 0x1000,
                    rkey: 7,
                },
                sys::SIW_RS_OP_WRITE,
                0x1000,
                7,
                0,
                [0, 0],
            ),
            (
                SendOp::WriteImm {
                    remote_addr: 0x2000,
                    rkey: 8,
                    imm: 9,
                },
                sys::SIW_RS_OP_WRITE_IMM,
                0x2000,
                8,
                9,
                [0, 0],
            ),
            (
                SendOp::Read {
                    remote_addr: 0x3000,
                    rkey: 10,
                },
                sys::SIW_RS_OP_READ,
                0x3000,
                10,
                0,
                [0, 0],
            ),
            (
                SendOp::CmpSwp {
                    remote_addr: 0x4000,
                    rkey: 11,
                    compare: 12,
                    swap: 13,
                },
                sys::SIW_RS_OP_ATOMIC_CMP_SWP,
                0x4000,
                11,
                0,
                [12, 13],
            ),
            (
                SendOp::FetchAdd {
                    remote_addr: 0x5000,
                    rkey: 14,
                    add: 15,
                },
                sys::SIW_RS_OP_ATOMIC_FETCH_ADD,
                0x5000,
                14,
                0,
                [15, 0],
            ),
            (
                SendOp::LocalInv { stag: 0x66 },
                sys::SIW_RS_OP_LOCAL_INV,
                0,
                0,
                0x66,
                [0, 0],
            ),
        ];
        for (op, opcode, raddr, rkey, imm, atomic) in cases {
            let s = new_sqe(42, op, sys::SIW_RS_WQE_SIGNALED as u8);
            assert_eq!(s.wr_id, 42);
            assert_eq!(s.opcode as u32, opcode, "{op:?}");
            assert_eq!(s.flags as u32, sys::SIW_RS_WQE_SIGNALED);
            assert_eq!(
                (s.remote_addr, s.rkey, s.imm_or_inv, s.atomic),
                (raddr, rkey, imm, atomic)
            );
            assert_eq!(
                (s.num_sge, s.inline_len, s.rsvd0, s.rsvd1),
                (0, 0, 0, [0, 0])
            );
        }
    }

    #[test]
    fn sges_and_limits() {
        let mut s = new_sqe(
            1,
            SendOp::Write {
                remote_addr: 1,
                rkey: 2,
            },
            0,
        );
        set_sges(&mut s, &[sge(0x10, 4, 1), sge(0x20, 8, 2)], &L).unwrap();
        assert_eq!(sges_of(&s), vec![(0x10, 4, 1), (0x20, 8, 2)]);
        let seven = [sge(0, 1, 1); 7];
        assert_eq!(set_sges(&mut s, &seven, &L), Err(EINVAL));
        let tight = Limits {
            max_sge: 1,
            max_inline: 0,
        };
        assert_eq!(set_sges(&mut s, &seven[..2], &tight), Err(EINVAL));
        let mut inv = new_sqe(1, SendOp::LocalInv { stag: 3 }, 0);
        assert_eq!(set_sges(&mut inv, &seven[..1], &L), Err(EINVAL));
        assert_eq!(set_sges(&mut inv, &[], &L), Ok(()));
    }

    /// Atomics take one 8-byte result buffer and an aligned target; Send
    /// with Immediate is refused (RFC 7306 has none); all before the ring.
    #[test]
    fn atomic_and_immediate_checks() {
        let fa = |remote_addr| {
            new_sqe(
                1,
                SendOp::FetchAdd {
                    remote_addr,
                    rkey: 2,
                    add: 3,
                },
                0,
            )
        };
        let cs = |remote_addr| {
            new_sqe(
                1,
                SendOp::CmpSwp {
                    remote_addr,
                    rkey: 2,
                    compare: 3,
                    swap: 4,
                },
                0,
            )
        };
        for mut s in [fa(0x1008), cs(0x1008)] {
            assert_eq!(set_sges(&mut s, &[sge(0x10, 8, 1)], &L), Ok(()));
            assert_eq!(sges_of(&s), vec![(0x10, 8, 1)]);
            assert_eq!(set_sges(&mut s, &[sge(0x10, 4, 1)], &L), Err(EINVAL));
            assert_eq!(
                set_sges(&mut s, &[sge(0x10, 4, 1), sge(0x20, 4, 1)], &L),
                Err(EINVAL)
            );
            assert_eq!(set_sges(&mut s, &[], &L), Err(EINVAL));
            assert_eq!(set_inline(&mut s, [&[0u8; 8][..]], &L), Err(EINVAL));
        }
        for mut s in [fa(0x1004), cs(0x1001)] {
            assert_eq!(set_sges(&mut s, &[sge(0x10, 8, 1)], &L), Err(EINVAL));
        }
        let mut s = new_sqe(1, SendOp::SendImm { imm: 1 }, 0);
        assert_eq!(set_sges(&mut s, &[sge(0x10, 8, 1)], &L), Err(ENOTSUP));
        assert_eq!(set_inline(&mut s, [&b"x"[..]], &L), Err(ENOTSUP));
        let mut w = new_sqe(
            1,
            SendOp::WriteImm {
                remote_addr: 3,
                rkey: 2,
                imm: 1,
            },
            0,
        );
        assert_eq!(set_sges(&mut w, &[sge(0x10, 5, 1)], &L), Ok(()));
        assert_eq!(set_inline(&mut w, [&b"x"[..]], &L), Ok(()));
    }

    #[test]
    fn inline_data() {
        let mut s = new_sqe(1, SendOp::Send, 0);
        set_inline(&mut s, [&b"abc"[..], &b"defg"[..]], &L).unwrap();
        assert_eq!(inline_of(&s), b"abcdefg");
        assert_eq!(s.num_sge, 0);
        assert_ne!(s.flags as u32 & sys::SIW_RS_WQE_INLINE, 0);
        // Exactly the limit fits, one more octet does not.
        let big = [7u8; 65];
        set_inline(&mut s, [&big[..64]], &L).unwrap();
        assert_eq!(set_inline(&mut s, [&big[..]], &L), Err(EINVAL));
        // Not even the ABI maximum is exceeded with a larger QP limit.
        let huge = [0u8; 257];
        let wide = Limits {
            max_sge: 6,
            max_inline: 1024,
        };
        assert_eq!(set_inline(&mut s, [&huge[..]], &wide), Err(EINVAL));
        // Reads and atomics carry no inline data.
        let mut r = new_sqe(
            1,
            SendOp::Read {
                remote_addr: 0,
                rkey: 0,
            },
            0,
        );
        assert_eq!(set_inline(&mut r, [&b"x"[..]], &L), Err(EINVAL));
        let mut a = new_sqe(
            1,
            SendOp::FetchAdd {
                remote_addr: 0,
                rkey: 0,
                add: 1,
            },
            0,
        );
        assert_eq!(set_inline(&mut a, [&b"x"[..]], &L), Err(EINVAL));
        // Switching back to SGEs clears the inline flag.
        set_sges(&mut s, &[sge(1, 1, 1)], &L).unwrap();
        assert_eq!(s.flags as u32 & sys::SIW_RS_WQE_INLINE, 0);
        assert_eq!(s.inline_len, 0);
    }

    #[test]
    fn send_flags() {
        assert_eq!(sqe_flags(0, false), Ok((0, false)));
        assert_eq!(
            sqe_flags(0, true),
            Ok((sys::SIW_RS_WQE_SIGNALED as u8, false))
        );
        let all = sys::IBV_SEND_SIGNALED
            | sys::IBV_SEND_SOLICITED
            | sys::IBV_SEND_FENCE
            | sys::IBV_SEND_INLINE;
        let want = sys::SIW_RS_WQE_SIGNALED | sys::SIW_RS_WQE_SOLICITED | sys::SIW_RS_WQE_FENCE;
        assert_eq!(sqe_flags(all, false), Ok((want as u8, true)));
        assert_eq!(sqe_flags(sys::IBV_SEND_IP_CSUM, false), Err(ENOTSUP));
    }

    #[test]
    fn rqe_encoding() {
        let r = new_rqe(9, &[sge(0x100, 64, 5)], &L).unwrap();
        assert_eq!((r.wr_id, r.num_sge), (9, 1));
        assert_eq!(
            (r.sge[0].addr, r.sge[0].length, r.sge[0].lkey),
            (0x100, 64, 5)
        );
        assert_eq!(new_rqe(9, &[sge(0, 0, 0); 7], &L).err(), Some(EINVAL));
        assert_eq!(new_rqe(9, &[], &L).unwrap().num_sge, 0);
    }

    #[test]
    fn cqe_decoding() {
        let c = Cqe {
            wr_id: 77,
            opcode: sys::IBV_WC_RECV as u8,
            status: sys::IBV_WC_SUCCESS as u8,
            flags: (sys::SIW_RS_CQE_WITH_IMM | sys::SIW_RS_CQE_SOLICITED) as u8,
            rsvd0: 0,
            byte_len: 1000,
            qp_num: 3,
            imm_or_inv: 0xdead_beef,
            vendor_err: 0,
            rsvd1: 0,
        };
        let wc = wc_from_cqe(&c);
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (77, sys::IBV_WC_RECV, sys::IBV_WC_SUCCESS)
        );
        assert_eq!(
            (wc.byte_len, wc.qp_num, wc.wc_flags),
            (1000, 3, sys::IBV_WC_WITH_IMM)
        );
        // SAFETY (test): both union members are u32.
        assert_eq!(unsafe { wc.__bindgen_anon_1.imm_data }, 0xdead_beef);
        let inv = Cqe {
            flags: sys::SIW_RS_CQE_WITH_INV as u8,
            ..c
        };
        assert_eq!(wc_flags(&inv), sys::IBV_WC_WITH_INV);
    }
}
