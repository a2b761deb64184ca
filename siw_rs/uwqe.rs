// SPDX-License-Identifier: GPL-2.0

//! Decoding of the work queue entries a process writes into its rings
//! (`struct siw_rs_sqe`/`siw_rs_rqe` of uapi/siw_rs-abi.h, copied out of the
//! ring as 64-bit words by [`crate::uverbs::UserRing::read`]).
//!
//! Driver logic: no `unsafe`. The words are a copy, so nothing here can
//! change under the decoder; anything malformed is an error the caller
//! turns into a failed work request on that QP only.

use crate::{
    device::SiwRs,
    ffi,
    qp::NSGE,
    uverbs::{RQE_WORDS, SQE_WORDS},
    verbs::{SendFlags, SendOp, Sge, WcOpcode},
};
use kernel::prelude::*;

/// Inline bytes one send may carry.
pub(crate) const MAX_INLINE: u32 = ffi::SIW_RS_MAX_INLINE;
/// The buffer inline data is copied into.
pub(crate) type Inline = [u8; MAX_INLINE as usize];

/// Word index of the first SGE in an SQE and in an RQE.
const SQE_SGE_WORD: usize = 8;
const RQE_SGE_WORD: usize = 2;

/// Words of an SQE before its SGEs or inline data.
pub(crate) const SQE_HEAD_WORDS: usize = SQE_SGE_WORD;

/// Words after the header that an SQE with header `w` uses: its SGEs, or
/// its inline data. Bounded by the entry; what [`decode_send`] refuses
/// (too many SGEs, too much inline data) needs no more than the bound.
pub(crate) fn sqe_body_words(w: &[u64; SQE_WORDS]) -> usize {
    let fl = (lo(w[1]) >> 8) & 0xff;
    let n = if fl & ffi::SIW_RS_WQE_INLINE != 0 {
        (hi(w[1]).min(MAX_INLINE) as usize).div_ceil(8)
    } else {
        2 * (((lo(w[1]) >> 16) & 0xff) as usize).min(NSGE)
    };
    n.min(SQE_WORDS - SQE_SGE_WORD)
}

/// Whether an SQE whose second word (opcode, flags, SGE count, inline
/// length) is `w1` asks for a completion. Read alone, from the ring, as a
/// hint: the entry itself is decoded from a copy when it is taken.
pub(crate) fn sqe_signaled(w1: u64) -> bool {
    (lo(w1) >> 8) & ffi::SIW_RS_WQE_SIGNALED != 0
}

/// A decoded send queue entry.
pub(crate) struct UserSend {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp<'static, SiwRs>,
    pub(crate) flags: SendFlags,
    pub(crate) sges: [Sge; NSGE],
    pub(crate) nsge: usize,
    /// The length of the inline payload (instead of SGEs), which
    /// [`copy_inline`] copies out of the entry.
    pub(crate) inline: Option<u32>,
}

/// Why an entry was refused.
#[derive(Debug)]
pub(crate) struct Malformed;

fn lo(w: u64) -> u32 {
    w as u32
}

fn hi(w: u64) -> u32 {
    (w >> 32) as u32
}

fn sges(words: &[u64], first: usize, n: usize) -> Result<[Sge; NSGE], Malformed> {
    if n > NSGE {
        return Err(Malformed);
    }
    let mut out = [Sge::default(); NSGE];
    for (i, o) in out.iter_mut().take(n).enumerate() {
        let a = *words.get(first + 2 * i).ok_or(Malformed)?;
        let b = *words.get(first + 2 * i + 1).ok_or(Malformed)?;
        *o = Sge { addr: a, length: lo(b), lkey: hi(b) };
    }
    Ok(out)
}

/// Decodes an SQE.
pub(crate) fn decode_send(w: &[u64; SQE_WORDS]) -> Result<UserSend, Malformed> {
    let opcode = lo(w[1]) & 0xff;
    let fl = (lo(w[1]) >> 8) & 0xff;
    let nsge = ((lo(w[1]) >> 16) & 0xff) as usize;
    let (remote_addr, rkey, extra) = (w[2], lo(w[3]), hi(w[3]));
    let op = match opcode {
        ffi::SIW_RS_OP_SEND => SendOp::Send,
        ffi::SIW_RS_OP_SEND_INV => SendOp::SendInv(extra),
        ffi::SIW_RS_OP_SEND_IMM => SendOp::SendImm(extra),
        ffi::SIW_RS_OP_WRITE => SendOp::Write { remote_addr, rkey },
        ffi::SIW_RS_OP_WRITE_IMM => SendOp::WriteImm { remote_addr, rkey, imm: extra },
        ffi::SIW_RS_OP_READ => SendOp::Read { remote_addr, rkey },
        ffi::SIW_RS_OP_ATOMIC_CMP_SWP => {
            SendOp::CmpSwap { remote_addr, rkey, compare: w[4], swap: w[5] }
        }
        ffi::SIW_RS_OP_ATOMIC_FETCH_ADD => SendOp::FetchAdd { remote_addr, rkey, add: w[4] },
        ffi::SIW_RS_OP_LOCAL_INV => SendOp::LocalInv(extra),
        _ => return Err(Malformed),
    };
    let flags = SendFlags {
        signaled: fl & ffi::SIW_RS_WQE_SIGNALED != 0,
        solicited: fl & ffi::SIW_RS_WQE_SOLICITED != 0,
        fence: fl & ffi::SIW_RS_WQE_FENCE != 0,
        inline: false,
    };
    if fl & ffi::SIW_RS_WQE_INLINE != 0 {
        let carries_data = matches!(
            op,
            SendOp::Send | SendOp::SendInv(_) | SendOp::SendImm(_) | SendOp::Write { .. } | SendOp::WriteImm { .. }
        );
        if !carries_data {
            return Err(Malformed);
        }
        let len = hi(w[1]);
        if len > MAX_INLINE {
            return Err(Malformed);
        }
        return Ok(UserSend { wr_id: w[0], op, flags, sges: [Sge::default(); NSGE], nsge: 0, inline: Some(len) });
    }
    Ok(UserSend { wr_id: w[0], op, flags, sges: sges(w, SQE_SGE_WORD, nsge)?, nsge, inline: None })
}

/// Copies the `len` inline octets of an SQE (they follow the header, in
/// memory order; [`decode_send`] gave their length) into `buf`.
pub(crate) fn copy_inline(w: &[u64; SQE_WORDS], len: u32, buf: &mut Inline) {
    let words = w.get(SQE_SGE_WORD..).unwrap_or(&[]);
    let n = (len.min(MAX_INLINE) as usize).div_ceil(8);
    for (chunk, word) in buf.chunks_mut(8).zip(words).take(n) {
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
}

/// The completion opcode a flushed SQE reports (its opcode may be garbage).
pub(crate) fn send_wc_opcode(w: &[u64; SQE_WORDS]) -> WcOpcode {
    match lo(w[1]) & 0xff {
        ffi::SIW_RS_OP_WRITE | ffi::SIW_RS_OP_WRITE_IMM => WcOpcode::RdmaWrite,
        ffi::SIW_RS_OP_READ => WcOpcode::RdmaRead,
        ffi::SIW_RS_OP_ATOMIC_CMP_SWP => WcOpcode::CompSwap,
        ffi::SIW_RS_OP_ATOMIC_FETCH_ADD => WcOpcode::FetchAdd,
        ffi::SIW_RS_OP_LOCAL_INV => WcOpcode::LocalInv,
        _ => WcOpcode::Send,
    }
}

/// Decodes an RQE: its identifier, SGEs and their count.
pub(crate) fn decode_recv(w: &[u64; RQE_WORDS]) -> Result<(u64, [Sge; NSGE], usize), Malformed> {
    let n = (lo(w[1]) & 0xff) as usize;
    Ok((w[0], sges(w, RQE_SGE_WORD, n)?, n))
}
