// SPDX-License-Identifier: GPL-2.0

//! Queue pairs: the iWARP QP state machine, the send and receive queues,
//! and flushing.
//!
//! Driver logic: no `unsafe`.
//!
//! # States (RFC 5040 section 10 and the verbs mapping)
//!
//! | verbs      | iWARP     | reached by                                    |
//! |------------|-----------|-----------------------------------------------|
//! | RESET/INIT | IDLE      | creation; consumer                            |
//! | RTS        | RTS       | the connection manager, once MPA completed    |
//! | SQD        | CLOSING   | graceful close                                |
//! | SQE        | TERMINATE | a TERMINATE sent or received                  |
//! | ERR        | ERROR     | consumer, errors, teardown (flushes the queues)|
//!
//! Work requests are accepted on the receive queue in IDLE and RTS, and on
//! the send queue in RTS; in ERROR every new request completes at once with
//! `IB_WC_WR_FLUSH_ERR` (that is how `ib_drain_qp` works); in other states
//! posting fails with `ENOTCONN`.
//!
//! # Locking
//!
//! One interrupt-safe lock per QP guards its state and both queues. CQ locks
//! nest inside it (completions are added under the QP lock so they keep the
//! queue order); the consumer's completion handler is called only after all
//! locks are dropped, since it may post to this QP.

use crate::{
    cq,
    device::SiwRs,
    limits::{MAX_IRD, MAX_ORD, MAX_QP_WR, MAX_SGE},
    mem::{Mem, Stags},
    sync::{new_irq_spinlock, IrqSpinLock},
    verbs::{
        Access, Qp, QpCaps, QpInitAttr, QpModify, QpQuery, QpState, RecvWr, SendOp, SendWr, Sge,
        Wc, WcOpcode, WcStatus,
    },
};
use kernel::{prelude::*, sync::Arc};

const NSGE: usize = MAX_SGE as usize;

/// A send-queue operation as the driver keeps it.
pub(crate) enum WqeOp {
    Send,
    SendImm(u32),
    SendInv(u32),
    Write { remote_addr: u64, rkey: u32 },
    WriteImm { remote_addr: u64, rkey: u32, imm: u32 },
    Read { remote_addr: u64, rkey: u32 },
    ReadInv { remote_addr: u64, rkey: u32, inv: u32 },
    CmpSwap { remote_addr: u64, rkey: u32, compare: u64, swap: u64 },
    FetchAdd { remote_addr: u64, rkey: u32, add: u64 },
    LocalInv(u32),
    RegMr { mem: Arc<Mem>, key: u8, access: Access, iova: u64, len: u64, page_size: u32 },
}

impl WqeOp {
    fn wc_opcode(&self) -> WcOpcode {
        match self {
            Self::Send | Self::SendImm(_) | Self::SendInv(_) => WcOpcode::Send,
            Self::Write { .. } | Self::WriteImm { .. } => WcOpcode::RdmaWrite,
            Self::Read { .. } | Self::ReadInv { .. } => WcOpcode::RdmaRead,
            Self::CmpSwap { .. } => WcOpcode::CompSwap,
            Self::FetchAdd { .. } => WcOpcode::FetchAdd,
            Self::LocalInv(_) => WcOpcode::LocalInv,
            Self::RegMr { .. } => WcOpcode::RegMr,
        }
    }
}

/// A send work queue element.
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: WqeOp,
    pub(crate) signaled: bool,
    pub(crate) solicited: bool,
    pub(crate) fence: bool,
    pub(crate) sges: [Sge; NSGE],
    pub(crate) nsge: u8,
    /// Total bytes of `sges`.
    pub(crate) len: u32,
}

/// A receive work queue element.
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: [Sge; NSGE],
    pub(crate) nsge: u8,
    pub(crate) len: u32,
}

/// A fixed-capacity FIFO, preallocated so posting never allocates.
struct Fifo<T> {
    slots: KVVec<Option<T>>,
    head: usize,
    len: usize,
}

impl<T> Fifo<T> {
    fn new(n: u32) -> Result<Self> {
        let n = usize::try_from(n).map_err(|_| EINVAL)?;
        let mut slots = KVVec::with_capacity(n, GFP_KERNEL)?;
        for _ in 0..n {
            slots.push(None, GFP_KERNEL)?;
        }
        Ok(Fifo { slots, head: 0, len: 0 })
    }

    fn push(&mut self, v: T) -> Result {
        let cap = self.slots.len();
        if self.len >= cap {
            return Err(ENOMEM);
        }
        let mut idx = self.head + self.len;
        if idx >= cap {
            idx -= cap;
        }
        *self.slots.get_mut(idx).ok_or(ENOMEM)? = Some(v);
        self.len += 1;
        Ok(())
    }

    fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.slots.get_mut(self.head).and_then(|s| s.take());
        self.head = if self.head + 1 >= self.slots.len() { 0 } else { self.head + 1 };
        self.len -= 1;
        v
    }
}

struct Inner {
    state: QpState,
    access: Access,
    ird: u32,
    ord: u32,
    sq: Fifo<SendWqe>,
    rq: Fifo<RecvWqe>,
}

/// A QP's state (`<SiwRs as Driver>::Qp` is an `Arc` of it).
#[pin_data]
pub(crate) struct QpCore {
    caps: QpCaps,
    sig_all: bool,
    has_srq: bool,
    /// The device's STag table, for registrations and access checks.
    stags: Arc<Stags>,
    #[pin]
    inner: IrqSpinLock<Inner>,
}

fn check_caps(c: &QpCaps, has_srq: bool) -> Result {
    let wr_ok = |n: u32| n <= MAX_QP_WR;
    if c.max_send_wr == 0 || !wr_ok(c.max_send_wr) || !wr_ok(c.max_recv_wr) {
        return Err(EINVAL);
    }
    if !has_srq && c.max_recv_wr == 0 {
        return Err(EINVAL);
    }
    if c.max_send_sge > MAX_SGE || c.max_recv_sge > MAX_SGE {
        return Err(EINVAL);
    }
    if c.max_inline_data > 0 {
        // Inline sends are not implemented yet; say so instead of
        // pretending.
        return Err(EINVAL);
    }
    Ok(())
}

impl QpCore {
    /// Creates a QP's state for `attr`, adjusting `attr.caps` to what it
    /// provides.
    pub(crate) fn new(attr: &mut QpInitAttr, stags: Arc<Stags>) -> Result<Arc<Self>> {
        if !attr.rc {
            return Err(EOPNOTSUPP_ERR());
        }
        if attr.create_flags != 0 {
            return Err(EINVAL);
        }
        if attr.has_srq {
            // Shared receive queues come with the SRQ verbs.
            return Err(EOPNOTSUPP_ERR());
        }
        check_caps(&attr.caps, attr.has_srq)?;
        attr.caps.max_send_sge = attr.caps.max_send_sge.max(1);
        attr.caps.max_recv_sge = attr.caps.max_recv_sge.max(1);
        let inner = Inner {
            state: QpState::Reset,
            access: Access::default(),
            ird: 0,
            ord: 0,
            sq: Fifo::new(attr.caps.max_send_wr)?,
            rq: Fifo::new(attr.caps.max_recv_wr)?,
        };
        Arc::pin_init(
            pin_init!(QpCore {
                caps: attr.caps,
                sig_all: attr.sig_all,
                has_srq: attr.has_srq,
                stags,
                inner <- new_irq_spinlock!(inner, "siw_rs_qp"),
            }),
            GFP_KERNEL,
        )
    }
}

#[allow(non_snake_case)]
fn EOPNOTSUPP_ERR() -> Error {
    crate::verbs::eopnotsupp()
}

/// Completions to hand to the CQs once the QP lock is dropped.
struct Wakes {
    send: Option<core::result::Result<bool, cq::Overflow>>,
    recv: Option<core::result::Result<bool, cq::Overflow>>,
}

impl Wakes {
    fn none() -> Self {
        Wakes { send: None, recv: None }
    }

    fn merge(slot: &mut Option<core::result::Result<bool, cq::Overflow>>, r: core::result::Result<bool, cq::Overflow>) {
        *slot = Some(match (slot.take(), r) {
            (Some(Err(o)), _) | (_, Err(o)) => Err(o),
            (Some(Ok(a)), Ok(b)) => Ok(a || b),
            (None, r) => r,
        });
    }

    fn run(self, qp: &Qp<SiwRs>) {
        if let Some(r) = self.send {
            cq::wake(qp.send_cq(), r);
        }
        if let Some(r) = self.recv {
            cq::wake(qp.recv_cq(), r);
        }
    }
}

fn flush_send(qp: &Qp<SiwRs>, wqe: &SendWqe, wakes: &mut Wakes) {
    let wc = Wc {
        wr_id: wqe.wr_id,
        status: WcStatus::WrFlushErr,
        opcode: wqe.op.wc_opcode(),
        byte_len: 0,
        qp: qp.id(),
        imm: None,
        invalidated: None,
    };
    Wakes::merge(&mut wakes.send, cq::push(qp.send_cq(), wc, false));
}

fn flush_recv(qp: &Qp<SiwRs>, wqe: &RecvWqe, wakes: &mut Wakes) {
    let wc = Wc {
        wr_id: wqe.wr_id,
        status: WcStatus::WrFlushErr,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        qp: qp.id(),
        imm: None,
        invalidated: None,
    };
    Wakes::merge(&mut wakes.recv, cq::push(qp.recv_cq(), wc, false));
}

/// Moves the QP to ERROR under its lock and flushes both queues in order.
fn enter_error(qp: &Qp<SiwRs>, inner: &mut Inner, wakes: &mut Wakes) {
    inner.state = QpState::Err;
    while let Some(w) = inner.sq.pop() {
        flush_send(qp, &w, wakes);
    }
    while let Some(w) = inner.rq.pop() {
        flush_recv(qp, &w, wakes);
    }
}

/// Whether the consumer may move a QP from `from` to `to` (the connection
/// manager's own transitions go through other paths).
fn allowed(from: QpState, to: QpState) -> bool {
    use QpState::*;
    if from == to || to == Err {
        return true;
    }
    matches!(
        (from, to),
        (Reset, Init) | (Init, Reset) | (Init, Rtr) | (Rtr, Init) | (Rts, Sqd) | (Rts, Sqe) | (Sqd, Sqe) | (Err, Reset)
    )
}

/// `modify_qp`.
pub(crate) fn modify(qp: &Qp<SiwRs>, m: &QpModify) -> Result {
    let core = qp.data();
    let mut wakes = Wakes::none();
    let res = (|| {
        let mut inner = core.inner.lock();
        if let Some(cur) = m.cur_state {
            if cur != inner.state {
                return Err(EINVAL);
            }
        }
        if let Some(ord) = m.ord {
            if ord > MAX_ORD {
                return Err(EINVAL);
            }
        }
        if let Some(ird) = m.ird {
            if ird > MAX_IRD {
                return Err(EINVAL);
            }
        }
        let next = m.state.unwrap_or(inner.state);
        if next == QpState::Rts && inner.state != QpState::Rts {
            // RTS needs an established connection: only the connection
            // manager gets a QP there.
            return Err(EINVAL);
        }
        if !allowed(inner.state, next) {
            return Err(EINVAL);
        }
        if let Some(a) = m.access {
            inner.access = a;
        }
        if let Some(ord) = m.ord {
            inner.ord = ord;
        }
        if let Some(ird) = m.ird {
            inner.ird = ird;
        }
        match next {
            QpState::Err if inner.state != QpState::Err => enter_error(qp, &mut inner, &mut wakes),
            QpState::Reset if inner.state == QpState::Err => {
                // Both queues were flushed on entering ERROR.
                inner.state = QpState::Reset;
            }
            s => inner.state = s,
        }
        Ok(())
    })();
    wakes.run(qp);
    res
}

/// `query_qp`.
pub(crate) fn query(qp: &Qp<SiwRs>) -> QpQuery {
    let core = qp.data();
    let inner = core.inner.lock();
    QpQuery {
        state: Some(inner.state),
        access: inner.access,
        caps: core.caps,
        ord: inner.ord,
        ird: inner.ird,
        sig_all: core.sig_all,
    }
}

/// Copies `sges` into a WQE array; `EINVAL` beyond `max` elements or if the
/// total length overflows.
fn take_sges(sges: &[Sge], max: u32) -> Result<([Sge; NSGE], u8, u32)> {
    let max = usize::try_from(max).unwrap_or(0).min(NSGE);
    if sges.len() > max {
        return Err(EINVAL);
    }
    let mut out = [Sge::default(); NSGE];
    let mut total = 0u32;
    for (o, s) in out.iter_mut().zip(sges) {
        *o = *s;
        total = total.checked_add(s.length).ok_or(EINVAL)?;
    }
    Ok((out, sges.len() as u8, total))
}

/// `post_send`: one work request.
pub(crate) fn post_send(qp: &Qp<SiwRs>, wr: &SendWr<'_, SiwRs>) -> Result {
    let core = qp.data();
    if wr.flags.inline {
        return Err(EINVAL);
    }
    let is_read = matches!(wr.op, SendOp::Read { .. } | SendOp::ReadInv { .. });
    let max = if is_read { crate::limits::MAX_SGE_RD } else { core.caps.max_send_sge };
    let (sges, nsge, len) = take_sges(wr.sges, max)?;
    let op = match wr.op {
        SendOp::Send => WqeOp::Send,
        SendOp::SendImm(v) => WqeOp::SendImm(v),
        SendOp::SendInv(s) => WqeOp::SendInv(s),
        SendOp::Write { remote_addr, rkey } => WqeOp::Write { remote_addr, rkey },
        SendOp::WriteImm { remote_addr, rkey, imm } => WqeOp::WriteImm { remote_addr, rkey, imm },
        SendOp::Read { remote_addr, rkey } => WqeOp::Read { remote_addr, rkey },
        SendOp::ReadInv { remote_addr, rkey, inv } => WqeOp::ReadInv { remote_addr, rkey, inv },
        SendOp::CmpSwap { remote_addr, rkey, compare, swap } => {
            if nsge != 1 || len != 8 {
                return Err(EINVAL);
            }
            WqeOp::CmpSwap { remote_addr, rkey, compare, swap }
        }
        SendOp::FetchAdd { remote_addr, rkey, add } => {
            if nsge != 1 || len != 8 {
                return Err(EINVAL);
            }
            WqeOp::FetchAdd { remote_addr, rkey, add }
        }
        SendOp::LocalInv(s) => WqeOp::LocalInv(s),
        SendOp::RegMr { mr, key, access } => {
            let (iova, len, page_size) = mr.mapping();
            WqeOp::RegMr { mem: mr.data().mem.clone(), key, access, iova, len, page_size }
        }
    };
    let wqe = SendWqe {
        wr_id: wr.wr_id,
        op,
        signaled: wr.flags.signaled || core.sig_all,
        solicited: wr.flags.solicited,
        fence: wr.flags.fence,
        sges,
        nsge,
        len,
    };
    let mut wakes = Wakes::none();
    let res = {
        let mut inner = core.inner.lock();
        match inner.state {
            QpState::Rts => inner.sq.push(wqe),
            QpState::Err => {
                flush_send(qp, &wqe, &mut wakes);
                Ok(())
            }
            _ => Err(crate::verbs::enotconn()),
        }
    };
    wakes.run(qp);
    res
}

/// `post_recv`: one work request.
pub(crate) fn post_recv(qp: &Qp<SiwRs>, wr: &RecvWr<'_>) -> Result {
    let core = qp.data();
    if core.has_srq {
        return Err(EINVAL);
    }
    let (sges, nsge, len) = take_sges(wr.sges, core.caps.max_recv_sge)?;
    let wqe = RecvWqe { wr_id: wr.wr_id, sges, nsge, len };
    let mut wakes = Wakes::none();
    let res = {
        let mut inner = core.inner.lock();
        match inner.state {
            QpState::Reset | QpState::Init | QpState::Rtr | QpState::Rts => inner.rq.push(wqe),
            QpState::Err => {
                flush_recv(qp, &wqe, &mut wakes);
                Ok(())
            }
            _ => Err(crate::verbs::enotconn()),
        }
    };
    wakes.run(qp);
    res
}

/// `destroy_qp`: drops outstanding work without completions (the consumer
/// destroys a QP only after draining it; completions for a QP that no
/// longer exists could not be attributed).
pub(crate) fn destroy(qp: &Qp<SiwRs>) {
    let (sq, rq) = {
        let mut inner = qp.data().inner.lock();
        inner.state = QpState::Err;
        (core::mem::replace(&mut inner.sq.len, 0), core::mem::replace(&mut inner.rq.len, 0))
    };
    if sq != 0 || rq != 0 {
        pr_debug!("qp {}: destroyed with {} send and {} receive requests\n", qp.qp_num(), sq, rq);
    }
}

/// The STag table a QP checks against.
pub(crate) fn stags(qp: &Qp<SiwRs>) -> &Arc<Stags> {
    &qp.data().stags
}
