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
use crate::conn::Conn;
use core::ptr::NonNull;
use kernel::{
    new_condvar,
    prelude::*,
    sync::{Arc, CondVar},
};

/// SGEs a WQE holds.
pub(crate) const NSGE: usize = MAX_SGE as usize;

/// A send-queue operation as the driver keeps it.
pub(crate) enum WqeOp {
    Send,
    SendInv(u32),
    Write { remote_addr: u64, rkey: u32 },
    Read { remote_addr: u64, rkey: u32 },
    /// A Read that invalidates its local sink STag when its response is in
    /// (RFC 5040 Read with local invalidate). The verbs WR also carries an
    /// `invalidate_rkey`, but the kernel's rdma_rw sets it before it bumps
    /// the MR's key, so it is not used: the sink SGE's lkey is the STag.
    ReadInv { remote_addr: u64, rkey: u32 },
    LocalInv(u32),
    RegMr { mem: Arc<Mem>, key: u8, access: Access, iova: u64, len: u64, page_size: u32 },
}

impl WqeOp {
    fn wc_opcode(&self) -> WcOpcode {
        match self {
            Self::Send | Self::SendInv(_) => WcOpcode::Send,
            Self::Write { .. } => WcOpcode::RdmaWrite,
            Self::Read { .. } | Self::ReadInv { .. } => WcOpcode::RdmaRead,
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
    /// Sent WQEs awaiting completion in order: outbound RDMA Reads (until
    /// their response arrives) and everything sent after them (`true` once
    /// it may complete).
    pending: Fifo<(SendWqe, bool)>,
    /// Outbound Reads in flight (bounded by ORD).
    reads_out: u32,
    /// Inbound Read Requests to answer (bounded by IRD).
    inbound: Fifo<ReadJob>,
    /// The connection while one is established.
    conn: Option<Arc<Conn>>,
    /// References the iWARP CM holds (`iw_add_ref`).
    cm_refs: u32,
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
    /// Signalled when the connection unlinks itself or a CM reference goes.
    #[pin]
    idle: CondVar,
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
            pending: Fifo::new(attr.caps.max_send_wr)?,
            reads_out: 0,
            inbound: Fifo::new(MAX_IRD)?,
            conn: None,
            cm_refs: 0,
        };
        Arc::pin_init(
            pin_init!(QpCore {
                caps: attr.caps,
                sig_all: attr.sig_all,
                has_srq: attr.has_srq,
                stags,
                inner <- new_irq_spinlock!(inner, "siw_rs_qp"),
                idle <- new_condvar!("siw_rs_qp_idle"),
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
    inner.reads_out = 0;
    while inner.inbound.pop().is_some() {}
    while let Some((w, _)) = inner.pending.pop() {
        flush_send(qp, &w, wakes);
    }
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
    let mut close: Option<(Arc<Conn>, bool)> = None;
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
        if next != inner.state {
            if let Some(c) = &inner.conn {
                match next {
                    QpState::Err | QpState::Sqe => close = Some((c.clone(), false)),
                    QpState::Sqd => close = Some((c.clone(), true)),
                    _ => {}
                }
            }
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
    match close {
        Some((c, true)) => c.close_graceful(),
        Some((c, false)) => c.close(None),
        None => {}
    }
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

        SendOp::SendInv(s) => WqeOp::SendInv(s),
        SendOp::Write { remote_addr, rkey } => WqeOp::Write { remote_addr, rkey },

        SendOp::Read { remote_addr, rkey } => WqeOp::Read { remote_addr, rkey },
        SendOp::ReadInv { remote_addr, rkey, .. } => WqeOp::ReadInv { remote_addr, rkey },
        // RFC 7306 atomics and immediate data are not implemented yet (the
        // device does not advertise them).
        SendOp::SendImm(_) | SendOp::WriteImm { .. } | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. } => {
            return Err(crate::verbs::eopnotsupp())
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
            QpState::Rts => inner.sq.push(wqe).map(|()| inner.conn.clone()),
            QpState::Err => {
                flush_send(qp, &wqe, &mut wakes);
                Ok(None)
            }
            _ => Err(crate::verbs::enotconn()),
        }
    };
    wakes.run(qp);
    if let Ok(Some(conn)) = &res {
        conn.kick();
    }
    res.map(|_| ())
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

/// `destroy_qp`: moves the QP to ERROR (closing its connection), waits
/// until the connection has unlinked itself and the connection manager has
/// dropped its references, then drops outstanding work without completions
/// (a consumer destroys a QP only after draining it; completions for a QP
/// that no longer exists could not be attributed).
pub(crate) fn destroy(qp: &Qp<SiwRs>) {
    let core = qp.data();
    let conn = {
        let mut inner = core.inner.lock();
        inner.state = QpState::Err;
        inner.conn.clone()
    };
    if let Some(c) = conn {
        c.close(None);
    }
    let mut inner = core.inner.lock();
    while inner.conn.is_some() || inner.cm_refs > 0 {
        core.idle.wait(&mut inner);
    }
    let (sq, rq) = (core::mem::replace(&mut inner.sq.len, 0), core::mem::replace(&mut inner.rq.len, 0));
    drop(inner);
    if sq != 0 || rq != 0 {
        pr_debug!("qp {}: destroyed with {} send and {} receive requests\n", qp.qp_num(), sq, rq);
    }
}

/// The STag table a QP checks against.
pub(crate) fn stags(qp: &Qp<SiwRs>) -> &Arc<Stags> {
    &qp.data().stags
}

/// The connection manager established a connection: IDLE to RTS.
pub(crate) fn establish(qp: &Qp<SiwRs>, conn: Arc<Conn>, ird: u32, ord: u32) -> Result {
    let mut inner = qp.data().inner.lock();
    if !matches!(inner.state, QpState::Init | QpState::Rtr) || inner.conn.is_some() {
        return Err(EINVAL);
    }
    inner.state = QpState::Rts;
    inner.ird = ird;
    inner.ord = ord;
    inner.conn = Some(conn);
    Ok(())
}

/// The QP's connection, if any.
pub(crate) fn conn_of(qp: &Qp<SiwRs>) -> Option<Arc<Conn>> {
    qp.data().inner.lock().conn.clone()
}

/// The connection finished its teardown.
pub(crate) fn conn_closed(qp: &Qp<SiwRs>) {
    let core = qp.data();
    let old = core.inner.lock().conn.take();
    core.idle.notify_all();
    // The last reference may be this one: drop it outside the lock.
    drop(old);
}

/// Moves the QP to ERROR (if not there) and flushes it.
pub(crate) fn to_error(qp: &Qp<SiwRs>) {
    let mut wakes = Wakes::none();
    {
        let mut inner = qp.data().inner.lock();
        if inner.state != QpState::Err {
            enter_error(qp, &mut inner, &mut wakes);
        }
    }
    wakes.run(qp);
}

/// Whether nothing is left to transmit (for a graceful close).
pub(crate) fn sq_empty(qp: &Qp<SiwRs>) -> bool {
    let inner = qp.data().inner.lock();
    inner.sq.len == 0 && inner.inbound.len == 0 && inner.reads_out == 0
}

/// An inbound RDMA Read Request to answer.
pub(crate) struct ReadJob {
    pub(crate) req: crate::iwarp::rdmap::ReadRequest,
    /// The source region (`None` for a zero-length read).
    pub(crate) mem: Option<Arc<Mem>>,
}

/// What the transmitter does next.
pub(crate) enum Job {
    /// Answer an inbound Read Request.
    Response(ReadJob),
    /// Transmit or execute a send WQE.
    Wqe(SendWqe),
}

fn is_read(op: &WqeOp) -> bool {
    matches!(op, WqeOp::Read { .. } | WqeOp::ReadInv { .. })
}

/// The next job, while in RTS: Read Responses first, then the send queue
/// in order, honouring the fence bit and the ORD.
pub(crate) fn next_job(qp: &Qp<SiwRs>) -> Option<Job> {
    let mut inner = qp.data().inner.lock();
    if inner.state != QpState::Rts {
        return None;
    }
    if let Some(j) = inner.inbound.pop() {
        return Some(Job::Response(j));
    }
    let (fence, read) = {
        let head = inner.sq.slots.get(inner.sq.head).and_then(|s| s.as_ref());
        match head {
            Some(w) if inner.sq.len > 0 => (w.fence, is_read(&w.op)),
            _ => return None,
        }
    };
    if fence && inner.reads_out > 0 {
        return None;
    }
    if read && inner.reads_out >= inner.ord.max(1) {
        return None;
    }
    inner.sq.pop().map(Job::Wqe)
}

/// A WQE was transmitted (or executed) successfully: an RDMA Read now
/// waits for its response; other WQEs complete at once unless an earlier
/// Read is still outstanding.
pub(crate) fn sent(qp: &Qp<SiwRs>, w: SendWqe) {
    let mut inner = qp.data().inner.lock();
    if inner.state == QpState::Rts {
        if is_read(&w.op) {
            if inner.pending.len < inner.pending.slots.len() {
                inner.reads_out += 1;
                let _ = inner.pending.push((w, false));
                return;
            }
        } else if inner.pending.len > 0 && inner.pending.len < inner.pending.slots.len() {
            let _ = inner.pending.push((w, true));
            return;
        }
    }
    drop(inner);
    complete_send(qp, w, WcStatus::Success);
}

/// The response of the oldest outstanding Read arrived completely.
/// Completes it and what waited behind it; returns its sink STag if it
/// asked for a local invalidation (done by the caller first).
pub(crate) fn read_done(qp: &Qp<SiwRs>) -> bool {
    {
        let mut inner = qp.data().inner.lock();
        let head = inner.pending.head;
        let cap = inner.pending.slots.len();
        let mut found = false;
        for k in 0..inner.pending.len {
            let mut i = head + k;
            if i >= cap {
                i -= cap;
            }
            if let Some(Some((w, d))) = inner.pending.slots.get_mut(i) {
                if !*d && is_read(&w.op) {
                    *d = true;
                    found = true;
                    break;
                }
            }
        }
        if !found {
            return false;
        }
        inner.reads_out = inner.reads_out.saturating_sub(1);
    }
    // Complete from the head while entries are done, one at a time so no
    // lock is held while completing.
    loop {
        let next = {
            let mut inner = qp.data().inner.lock();
            match inner.pending.slots.get(inner.pending.head) {
                Some(Some((_, true))) if inner.pending.len > 0 => inner.pending.pop(),
                _ => None,
            }
        };
        match next {
            Some((w, _)) => complete_send(qp, w, WcStatus::Success),
            None => break,
        }
    }
    true
}

/// The sink of the oldest outstanding Read: (lkey, addr, len, the STag to
/// invalidate when it completes).
pub(crate) fn read_sink(qp: &Qp<SiwRs>) -> Option<(u32, u64, u32, Option<u32>)> {
    let inner = qp.data().inner.lock();
    let head = inner.pending.head;
    let cap = inner.pending.slots.len();
    for k in 0..inner.pending.len {
        let mut i = head + k;
        if i >= cap {
            i -= cap;
        }
        if let Some(Some((w, false))) = inner.pending.slots.get(i) {
            let s = w.sges.first().copied().unwrap_or_default();
            let inv = matches!(w.op, WqeOp::ReadInv { .. }).then_some(s.lkey);
            return Some((s.lkey, s.addr, w.len, inv));
        }
    }
    None
}

/// Whether another inbound Read Request fits the IRD.
pub(crate) fn inbound_room(qp: &Qp<SiwRs>) -> bool {
    let inner = qp.data().inner.lock();
    inner.state == QpState::Rts && inner.inbound.len < usize::try_from(inner.ird.max(1)).unwrap_or(1)
}

/// The peer refused the oldest outstanding request (its TERMINATE): that
/// request completes with `status`, which moves the QP to ERROR and flushes
/// the rest.
pub(crate) fn fail_oldest(qp: &Qp<SiwRs>, status: WcStatus) {
    let w = qp.data().inner.lock().pending.pop().map(|(w, _)| w);
    if let Some(w) = w {
        complete_send(qp, w, status);
    }
}

/// Queues an inbound Read Request; `Err` beyond the IRD.
pub(crate) fn queue_response(qp: &Qp<SiwRs>, job: ReadJob) -> core::result::Result<(), ()> {
    let mut inner = qp.data().inner.lock();
    if inner.inbound.len >= usize::try_from(inner.ird.max(1)).unwrap_or(1) {
        return Err(());
    }
    inner.inbound.push(job).map_err(|_| ())
}

/// Completes a send WQE taken by [`next_send`]: a completion if it was
/// signalled or failed; a failure also moves the QP to ERROR.
pub(crate) fn complete_send(qp: &Qp<SiwRs>, w: SendWqe, status: WcStatus) {
    let mut wakes = Wakes::none();
    {
        let mut inner = qp.data().inner.lock();
        let status = if status == WcStatus::Success && inner.state == QpState::Err {
            WcStatus::WrFlushErr
        } else {
            status
        };
        if w.signaled || status != WcStatus::Success {
            let wc = Wc {
                wr_id: w.wr_id,
                status,
                opcode: w.op.wc_opcode(),
                byte_len: w.len,
                qp: qp.id(),
                imm: None,
                invalidated: None,
            };
            Wakes::merge(&mut wakes.send, cq::push(qp.send_cq(), wc, false));
        }
        if status != WcStatus::Success && status != WcStatus::WrFlushErr && inner.state != QpState::Err {
            enter_error(qp, &mut inner, &mut wakes);
        }
    }
    drop(w);
    wakes.run(qp);
}

/// Executes a local operation (registration, invalidation) at its turn in
/// the send queue.
pub(crate) fn execute_local(qp: &Qp<SiwRs>, w: &SendWqe) -> core::result::Result<(), crate::mem::AccessError> {
    match &w.op {
        WqeOp::RegMr { mem, key, access, iova, len, page_size } => {
            mem.register(*key, *access, *iova, *len, *page_size)
        }
        WqeOp::LocalInv(stag) => match crate::mem::lookup(stags(qp), *stag) {
            Some(m) => m.invalidate(*stag),
            None => Err(crate::mem::AccessError::InvalidStag),
        },
        _ => Ok(()),
    }
}

/// The length of the receive WQE at the head of the RQ.
pub(crate) fn peek_recv_len(qp: &Qp<SiwRs>) -> Option<u32> {
    let inner = qp.data().inner.lock();
    if inner.state != QpState::Rts || inner.rq.len == 0 {
        return None;
    }
    inner.rq.slots.get(inner.rq.head).and_then(|s| s.as_ref()).map(|w| w.len)
}

/// Takes the receive WQE at the head of the RQ.
pub(crate) fn pop_recv(qp: &Qp<SiwRs>) -> Option<RecvWqe> {
    let mut inner = qp.data().inner.lock();
    if inner.state != QpState::Rts {
        return None;
    }
    inner.rq.pop()
}

/// Completes a receive WQE.
pub(crate) fn complete_recv(qp: &Qp<SiwRs>, w: RecvWqe, status: WcStatus, len: u32, solicited: bool, inv: Option<u32>) {
    let mut wakes = Wakes::none();
    {
        let mut inner = qp.data().inner.lock();
        let status = if status == WcStatus::Success && inner.state == QpState::Err {
            WcStatus::WrFlushErr
        } else {
            status
        };
        let wc = Wc {
            wr_id: w.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: len,
            qp: qp.id(),
            imm: None,
            invalidated: inv,
        };
        Wakes::merge(&mut wakes.recv, cq::push(qp.recv_cq(), wc, solicited));
        if status != WcStatus::Success && status != WcStatus::WrFlushErr && inner.state != QpState::Err {
            enter_error(qp, &mut inner, &mut wakes);
        }
    }
    wakes.run(qp);
}

/// `iw_add_ref`.
pub(crate) fn cm_ref(qp: &Qp<SiwRs>) {
    let mut inner = qp.data().inner.lock();
    inner.cm_refs = inner.cm_refs.saturating_add(1);
}

/// `iw_rem_ref`.
pub(crate) fn cm_unref(qp: &Qp<SiwRs>) {
    let core = qp.data();
    {
        let mut inner = core.inner.lock();
        inner.cm_refs = inner.cm_refs.saturating_sub(1);
    }
    core.idle.notify_all();
}

/// QP numbers of a device, for `iw_get_qp`.
pub(crate) struct QpTable {
    slots: KVVec<Option<NonNull<crate::ffi::ib_qp>>>,
    next: usize,
}

// SAFETY: the table stores identities of QPs; it is only read under its
// lock and entries are removed before the QP memory goes.
unsafe impl Send for QpTable {}

/// First QP number handed out (0 and 1 are special in the verbs model).
const FIRST_QPN: usize = 2;

impl QpTable {
    /// A table for `limits::MAX_QP` QPs.
    pub(crate) fn new() -> Result<Self> {
        let n = usize::try_from(crate::limits::MAX_QP).map_err(|_| EINVAL)? + FIRST_QPN;
        Ok(QpTable { slots: KVVec::from_elem(None, n, GFP_KERNEL)?, next: FIRST_QPN })
    }

    /// Enters a QP; returns its number.
    pub(crate) fn insert(&mut self, qp: NonNull<crate::ffi::ib_qp>) -> Result<u32> {
        let n = self.slots.len();
        for _ in 0..n {
            let i = if self.next >= n { FIRST_QPN } else { self.next };
            self.next = i + 1;
            if let Some(slot @ None) = self.slots.get_mut(i) {
                *slot = Some(qp);
                return u32::try_from(i).map_err(|_| ENOMEM);
            }
        }
        Err(ENOMEM)
    }

    /// Removes QP number `qpn`.
    pub(crate) fn remove(&mut self, qpn: u32) {
        if let Some(slot) = usize::try_from(qpn).ok().and_then(|i| self.slots.get_mut(i)) {
            *slot = None;
        }
    }

    /// The QP with number `qpn`.
    pub(crate) fn get(&self, qpn: u32) -> Option<NonNull<crate::ffi::ib_qp>> {
        usize::try_from(qpn).ok().and_then(|i| self.slots.get(i)).copied().flatten()
    }
}
