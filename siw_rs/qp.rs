// SPDX-License-Identifier: GPL-2.0

//! Queue pairs: the iWARP QP state machine, the send and receive queues,
//! and flushing.
//!
//! Driver logic. The only `unsafe` is [`QpTable`]'s `Send`: the table
//! stores QP pointers, read under its lock.
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
use crate::iwarp::rdmap::AtomicOp;
use crate::{
    ffi,
    uverbs::{Ctrl, Ucontext, UserRing, RQE_WORDS, SQE_WORDS},
    uwqe,
};
use core::{
    ptr::NonNull,
    sync::atomic::{fence, AtomicU32, Ordering},
};
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
    /// RDMA Write followed by an RFC 7306 Immediate Data message carrying
    /// `imm` (network order) in its first four octets.
    WriteImm { remote_addr: u64, rkey: u32, imm: u32 },
    /// RFC 7306 Atomic Request; the original value lands in the first SGE
    /// (8 bytes). `id` is the Request Identifier, set when it is sent.
    Atomic { op: AtomicOp, remote_addr: u64, rkey: u32, data: u64, compare: u64, id: u32 },
    LocalInv(u32),
    RegMr { mem: Arc<Mem>, key: u8, access: Access, iova: u64, len: u64, page_size: u32 },
}

impl WqeOp {
    /// Whether it owns anything whose drop may do more than free memory
    /// (the last reference to a region): dropped outside the QP lock.
    /// `RegMr` is the only such op.
    fn owns_region(&self) -> bool {
        matches!(self, Self::RegMr { .. })
    }

    fn wc_opcode(&self) -> WcOpcode {
        match self {
            Self::Send | Self::SendInv(_) => WcOpcode::Send,
            Self::Write { .. } | Self::WriteImm { .. } => WcOpcode::RdmaWrite,
            Self::Read { .. } | Self::ReadInv { .. } => WcOpcode::RdmaRead,
            Self::Atomic { op: AtomicOp::CmpSwap, .. } => WcOpcode::CompSwap,
            Self::Atomic { .. } => WcOpcode::FetchAdd,
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
    /// Total bytes of `sges` (or of the inline data).
    pub(crate) len: u32,
    /// A process's inline send: its `len` octets were copied out of the
    /// ring at post time, into the send queue slot's inline buffer, and go
    /// to the transmitter's own buffer with the WQE. Replaces `sges`.
    pub(crate) inline: bool,
}

/// A receive work queue element.
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: [Sge; NSGE],
    pub(crate) nsge: u8,
    pub(crate) len: u32,
}

/// What a sent WQE in [`Inner::pending`] waits for before it completes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Its response (an outbound Read or Atomic Request).
    Response,
    /// The release of its pages by the network stack (a zero-copy send,
    /// by its number: see [`released`]).
    Release(u64),
    /// Nothing: it completes when the WQEs before it have.
    Done,
}

/// A fixed-capacity FIFO, preallocated so posting never allocates.
pub(crate) struct Fifo<T> {
    slots: KVVec<Option<T>>,
    head: usize,
    /// Entries held.
    pub(crate) len: usize,
}

impl<T> Fifo<T> {
    pub(crate) fn new(n: u32) -> Result<Self> {
        let n = usize::try_from(n).map_err(|_| EINVAL)?;
        let mut slots = KVVec::with_capacity(n, GFP_KERNEL)?;
        for _ in 0..n {
            slots.push(None, GFP_KERNEL)?;
        }
        Ok(Fifo { slots, head: 0, len: 0 })
    }

    /// Entries it can hold.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn push(&mut self, v: T) -> Result {
        let idx = self.next_slot().ok_or(ENOMEM)?;
        *self.slots.get_mut(idx).ok_or(ENOMEM)? = Some(v);
        self.len += 1;
        Ok(())
    }

    /// The slot of the entry `k` places after the oldest (`k` at most the
    /// capacity: one subtraction wraps it).
    fn slot(&self, k: usize) -> usize {
        let idx = self.head + k;
        if idx >= self.slots.len() {
            idx - self.slots.len()
        } else {
            idx
        }
    }

    /// The slot of the oldest entry that satisfies `pred`.
    fn find(&self, mut pred: impl FnMut(&T) -> bool) -> Option<usize> {
        (0..self.len)
            .map(|k| self.slot(k))
            .find(|&i| self.slots.get(i).and_then(|s| s.as_ref()).is_some_and(&mut pred))
    }

    /// The newest entry.
    fn last(&self) -> Option<&T> {
        let k = self.len.checked_sub(1)?;
        self.slots.get(self.slot(k))?.as_ref()
    }

    /// The slot the next [`Fifo::push`] fills, if there is room.
    fn next_slot(&self) -> Option<usize> {
        (self.len < self.slots.len()).then(|| self.slot(self.len))
    }

    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.slots.get_mut(self.head).and_then(|s| s.take());
        self.head = self.slot(1);
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
    /// Sent WQEs awaiting completion in order: outbound RDMA Reads and
    /// Atomics (until their response arrives), zero-copy sends (until the
    /// network stack releases their pages) and everything sent after
    /// either. Its capacity is one more than the send queue's:
    /// `sq` and `pending` together hold at most `max_send_wr` WQEs when a
    /// WQE is queued (`sq_room`), and the transmitter holds at most one
    /// more between taking it from `sq` and `sent`.
    pending: Fifo<(SendWqe, Wait)>,
    /// A process's QP: the inline data of the WQE in each `sq` slot. Part
    /// of the QP, so that taking an inline send from the ring (under this
    /// lock, with interrupts off) never allocates and cannot fail for want
    /// of memory. Empty for a kernel consumer's QP (no inline data).
    sq_inline: KVVec<uwqe::Inline>,
    /// Outbound Reads in flight (bounded by ORD).
    reads_out: u32,
    /// Inbound Read and Atomic Requests to answer, in order (bounded by
    /// IRD).
    inbound: Fifo<Inbound>,
    /// The connection while one is established.
    conn: Option<Arc<Conn>>,
    /// References the iWARP CM holds (`iw_add_ref`).
    cm_refs: u32,
    /// A process's QP: the next entries to take from its send and receive
    /// rings (the kernel's own consumer indices).
    sq_next: u32,
    rq_next: u32,
}

/// The rings of a process's QP (uapi/siw_rs-abi.h). Entries are taken
/// into the QP's own queues, which stay the only place the data path looks.
struct UserQueues {
    sq: UserRing,
    /// None with an SRQ.
    rq: Option<UserRing>,
}

impl UserQueues {
    /// Sets (`on`) or clears a `SIW_RS_KF_*` bit in every ring's flags.
    fn kflag(&self, bit: u32, on: bool) {
        for r in [Some(&self.sq), self.rq.as_ref()].into_iter().flatten() {
            let kf = r.ctrl(Ctrl::Kflags);
            if on {
                kf.fetch_or(bit, Ordering::AcqRel);
            } else {
                kf.fetch_and(!bit, Ordering::AcqRel);
            }
        }
    }
}

/// A QP's state (`<SiwRs as Driver>::Qp` is an `Arc` of it).
#[pin_data]
pub(crate) struct QpCore {
    caps: QpCaps,
    sig_all: bool,
    has_srq: bool,
    /// The device's STag table, for registrations and access checks.
    stags: Arc<Stags>,
    /// The rings of a process's QP.
    user: Option<UserQueues>,
    /// The identity of the process context that created it
    /// ([`Ucontext::id`]); 0 for a kernel consumer's QP.
    owner: u64,
    /// Doorbells rung through the context's doorbell file that have not
    /// returned yet (see [`QpCore::drain_doorbells`]).
    doorbells: AtomicU32,
    /// `iw_get_qp` lookups that found the QP and whose `iw_add_ref` has not
    /// taken its reference yet (see [`QpCore::drain_cm_lookups`]).
    cm_lookups: AtomicU32,
    #[pin]
    inner: IrqSpinLock<Inner>,
    /// Signalled when the connection unlinks itself or a CM reference goes,
    /// always with `inner` held: `destroy` waits on it and the QP is freed
    /// once `destroy` returns, so a signal sent after the lock is released
    /// could reach freed memory (a KASAN use-after-free in CI, 2026-11-29).
    #[pin]
    idle: CondVar,
}

fn check_caps(c: &QpCaps, has_srq: bool, max_inline: u32) -> Result {
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
    if c.max_inline_data > max_inline {
        return Err(EINVAL);
    }
    Ok(())
}

impl QpCore {
    /// Creates a QP's state for `attr`, adjusting `attr.caps` to what it
    /// provides.
    pub(crate) fn new(attr: &mut QpInitAttr, stags: Arc<Stags>, uctx: Option<&Ucontext>) -> Result<Arc<Self>> {
        if !attr.rc {
            return Err(EOPNOTSUPP_ERR());
        }
        if attr.create_flags != 0 {
            return Err(EINVAL);
        }
        // Inline data is offered to processes (copied out of their ring);
        // kernel consumers have no use for it.
        let max_inline = if uctx.is_some() { uwqe::MAX_INLINE } else { 0 };
        check_caps(&attr.caps, attr.has_srq, max_inline)?;
        if uctx.is_some() {
            attr.caps.max_inline_data = max_inline;
        }
        attr.caps.max_send_sge = attr.caps.max_send_sge.max(1);
        attr.caps.max_recv_sge = attr.caps.max_recv_sge.max(1);
        let user = match uctx {
            None => None,
            Some(uctx) => {
                // Ring sizes are powers of two; the QP's own queues match
                // them, so a ring's entries always fit once taken.
                let pow2 = |n: u32| n.max(1).checked_next_power_of_two().filter(|&p| p <= MAX_QP_WR).ok_or(EINVAL);
                attr.caps.max_send_wr = pow2(attr.caps.max_send_wr)?;
                let sq = UserRing::new(uctx, attr.caps.max_send_wr, SQE_WORDS)?;
                let rq = if attr.has_srq {
                    attr.caps.max_recv_wr = 0;
                    None
                } else {
                    attr.caps.max_recv_wr = pow2(attr.caps.max_recv_wr)?;
                    Some(UserRing::new(uctx, attr.caps.max_recv_wr, RQE_WORDS)?)
                };
                // Nothing is being processed: the first post rings.
                sq.ctrl(Ctrl::Kflags).store(ffi::SIW_RS_KF_SQ_IDLE, Ordering::Release);
                Some(UserQueues { sq, rq })
            }
        };
        let inner = Inner {
            state: QpState::Reset,
            access: Access::default(),
            ird: 0,
            ord: 0,
            sq: Fifo::new(attr.caps.max_send_wr)?,
            rq: Fifo::new(attr.caps.max_recv_wr)?,
            pending: Fifo::new(attr.caps.max_send_wr.saturating_add(1))?,
            sq_inline: if max_inline > 0 { inline_slots(attr.caps.max_send_wr)? } else { KVVec::new() },
            reads_out: 0,
            inbound: Fifo::new(MAX_IRD)?,
            conn: None,
            cm_refs: 0,
            sq_next: 0,
            rq_next: 0,
        };
        Arc::pin_init(
            pin_init!(QpCore {
                caps: attr.caps,
                sig_all: attr.sig_all,
                has_srq: attr.has_srq,
                stags,
                user,
                owner: uctx.map_or(0, Ucontext::id),
                doorbells: AtomicU32::new(0),
                cm_lookups: AtomicU32::new(0),
                inner <- new_irq_spinlock!(inner, "siw_rs_qp"),
                idle <- new_condvar!("siw_rs_qp_idle"),
            }),
            GFP_KERNEL,
        )
    }
}

impl QpCore {
    /// For a process's QP, the create response: the rings' mmap keys and
    /// lengths and their sizes.
    pub(crate) fn user_resp(&self) -> Option<ffi::siw_rs_uresp_create_qp> {
        let u = self.user.as_ref()?;
        Some(ffi::siw_rs_uresp_create_qp {
            sq_key: u.sq.key(),
            sq_bytes: u.sq.bytes(),
            rq_key: u.rq.as_ref().map_or(0, UserRing::key),
            rq_bytes: u.rq.as_ref().map_or(0, UserRing::bytes),
            qp_id: 0,
            num_sqe: u.sq.entries(),
            num_rqe: u.rq.as_ref().map_or(0, UserRing::entries),
            max_inline: uwqe::MAX_INLINE,
        })
    }
}

#[allow(non_snake_case)]
fn EOPNOTSUPP_ERR() -> Error {
    crate::verbs::eopnotsupp()
}

/// Completions to hand to the CQs once the QP lock is dropped.
struct Wakes {
    send: cq::Pushed,
    recv: cq::Pushed,
    /// A connection to end because the QP failed locally (see
    /// [`user_fault`]); ended here, outside the QP's lock.
    fail: Option<Arc<Conn>>,
    /// The QP entered ERROR with no connection holding SRQ entries: it
    /// reports the last one taken ([`srq_released`]).
    last_wqe: bool,
}

impl Wakes {
    fn none() -> Self {
        Wakes { send: cq::Pushed::default(), recv: cq::Pushed::default(), fail: None, last_wqe: false }
    }

    fn merge(slot: &mut cq::Pushed, r: core::result::Result<bool, cq::Overflow>) {
        slot.add(r);
    }

    fn run(self, qp: &Qp<SiwRs>) {
        cq::wake_all(qp.send_cq(), self.send);
        cq::wake_all(qp.recv_cq(), self.recv);
        if self.last_wqe {
            srq_released(qp);
        }
        if let Some(c) = self.fail {
            c.close_local_error();
        }
    }
}

/// A completion without data: a flushed or refused work request.
fn failed(qp: &Qp<SiwRs>, wr_id: u64, opcode: WcOpcode, status: WcStatus) -> Wc {
    Wc { wr_id, status, opcode, byte_len: 0, qp: qp.id(), qp_num: qp.qp_num(), imm: None, invalidated: None }
}

fn fail_send(qp: &Qp<SiwRs>, wr_id: u64, opcode: WcOpcode, status: WcStatus, wakes: &mut Wakes) {
    Wakes::merge(&mut wakes.send, cq::push(qp.send_cq(), failed(qp, wr_id, opcode, status), false));
}

fn fail_recv(qp: &Qp<SiwRs>, wr_id: u64, status: WcStatus, wakes: &mut Wakes) {
    Wakes::merge(&mut wakes.recv, cq::push(qp.recv_cq(), failed(qp, wr_id, WcOpcode::Recv, status), false));
}

fn flush_send(qp: &Qp<SiwRs>, wqe: &SendWqe, wakes: &mut Wakes) {
    fail_send(qp, wqe.wr_id, wqe.op.wc_opcode(), WcStatus::WrFlushErr, wakes);
}

fn flush_recv(qp: &Qp<SiwRs>, wqe: &RecvWqe, wakes: &mut Wakes) {
    fail_recv(qp, wqe.wr_id, WcStatus::WrFlushErr, wakes);
}

/// The entries a process has posted to `ring` beyond `next`; `None` if
/// its producer index is garbage (more than the ring holds).
pub(crate) fn ring_avail(ring: &UserRing, next: u32) -> Option<u32> {
    let n = ring.ctrl(Ctrl::Prod).load(Ordering::Acquire).wrapping_sub(next);
    (n <= ring.entries()).then_some(n)
}

/// Takes one entry of a process's ring (the kernel's index advances and
/// the slot is given back to the process).
pub(crate) fn take_entry<const W: usize>(ring: &UserRing, next: &mut u32) -> [u64; W] {
    let mut w = [0u64; W];
    ring.read(*next, &mut w);
    consume(ring, next);
    w
}

/// Hands ring entry `*next` back to the process and moves to the next.
fn consume(ring: &UserRing, next: &mut u32) {
    *next = next.wrapping_add(1);
    ring.ctrl(Ctrl::Cons).store(*next, Ordering::Release);
}

/// A copy of a send queue entry (see [`take_sqe`]).
pub(crate) type SqeCopy = [u64; SQE_WORDS];

/// [`take_entry`] for a send queue entry, into `w`, reading only the words
/// it uses: the header, then its SGEs or inline data (an SQE is 40 words,
/// a typical send uses 10). Words past those keep what an earlier entry of
/// the same ring left there, and nothing reads them: the decoder reads no
/// further than [`uwqe::sqe_body_words`] bounds this copy. So the caller's
/// buffer is reused as it is, neither cleared nor returned per entry (320
/// octets each time, a measurable part of a small message's way out).
fn take_sqe(ring: &UserRing, next: &mut u32, w: &mut SqeCopy) {
    let head = uwqe::SQE_HEAD_WORDS;
    if let Some(h) = w.get_mut(..head) {
        ring.read(*next, h);
    }
    let body = uwqe::sqe_body_words(w);
    if let Some(b) = w.get_mut(head..head.saturating_add(body)) {
        ring.read_from(*next, head, b);
    }
    consume(ring, next);
}

/// A process wrote an entry that cannot be executed, or a garbage ring
/// index: the request fails and the QP goes to ERROR. Only this QP.
fn user_fault(qp: &Qp<SiwRs>, inner: &mut Inner, wakes: &mut Wakes) {
    if inner.state != QpState::Err {
        enter_error(qp, inner, wakes);
        // The connection ends too: nothing else would end it (a later
        // SQD from rdma_disconnect finds the QP in ERROR and is a no-op),
        // and the CM would wait for its CLOSE for ever.
        wakes.fail = inner.conn.clone();
    }
}

/// Takes the entries of a process's send ring into the send queue (in RTS)
/// or flushes them (in ERROR); in other states they wait in the ring.
fn pull_sq(qp: &Qp<SiwRs>, inner: &mut Inner, wakes: &mut Wakes) {
    let core = qp.data();
    let Some(u) = &core.user else { return };
    if !matches!(inner.state, QpState::Rts | QpState::Err) {
        return;
    }
    let Some(mut avail) = ring_avail(&u.sq, inner.sq_next) else {
        return user_fault(qp, inner, wakes);
    };
    // In RTS an entry is taken only while it fits beside the WQEs still
    // awaiting completion: the ring slot is the process's again once taken,
    // so without this bound a process could post past `max_send_wr` behind
    // an outstanding Read. The rest stays in the ring until a completion
    // (a Read's response, a zero-copy send's release) kicks the
    // transmitter. (An empty ring returns before the copy is
    // cleared: the transmitter looks here after every message.)
    if avail == 0 {
        return;
    }
    let mut w = [0u64; SQE_WORDS];
    while avail > 0 && (inner.state == QpState::Err || sq_room(inner)) {
        avail -= 1;
        take_sqe(&u.sq, &mut inner.sq_next, &mut w);
        if inner.state == QpState::Err {
            fail_send(qp, w[0], uwqe::send_wc_opcode(&w), WcStatus::WrFlushErr, wakes);
            continue;
        }
        if user_send_wqe(core, &w).and_then(|wqe| queue_user_wqe(inner, &w, wqe)).is_err() {
            return refuse_sqe(qp, inner, &w, wakes);
        }
    }
}

/// Queues `wqe`, decoded from ring entry `w`, at the send queue's tail,
/// an inline send's octets into that slot's buffer. The caller checked
/// `sq_room`, so there is a free slot.
fn queue_user_wqe(inner: &mut Inner, w: &[u64; SQE_WORDS], wqe: SendWqe) -> Result {
    if wqe.inline {
        let slot = inner.sq.next_slot().ok_or(EINVAL)?;
        let buf = inner.sq_inline.get_mut(slot).ok_or(EINVAL)?;
        uwqe::copy_inline(w, wqe.len, buf);
    }
    inner.sq.push(wqe)
}

/// Ring entry `w` cannot be executed: it fails with
/// `IBV_WC_LOC_QP_OP_ERR` and the QP goes to ERROR.
fn refuse_sqe(qp: &Qp<SiwRs>, inner: &mut Inner, w: &[u64; SQE_WORDS], wakes: &mut Wakes) {
    fail_send(qp, w[0], uwqe::send_wc_opcode(w), WcStatus::LocQpOpErr, wakes);
    user_fault(qp, inner, wakes)
}

/// A send WQE from an SQE copied out of a process's ring; an inline send's
/// octets are still in the copy (`inline` set, `len` their count).
fn user_send_wqe(core: &QpCore, w: &[u64; SQE_WORDS]) -> Result<SendWqe> {
    let d = uwqe::decode_send(w).map_err(|_| EINVAL)?;
    let wr = SendWr { wr_id: d.wr_id, op: d.op, flags: d.flags, sges: d.sges.get(..d.nsge).unwrap_or(&[]) };
    // Made where the caller wants it: changed here after it was made, it
    // was moved again, a call to memcpy.
    make_wqe(core, &wr, d.inline)
}

/// The transmitter, finding the send queue empty, takes the ring's next
/// entry itself (copied into its buffer `sqe`): straight to it, without
/// passing through the queue (and, for inline data, straight into the
/// transmitter's buffer `inline`), if it may go now. One that must wait
/// (a fence behind outstanding Reads, a Read beyond the ORD) is queued
/// instead, and `None` returned, as is `None` for an empty ring, a full
/// queue, or a malformed entry (which fails it and moves the QP to ERROR,
/// as [`pull_sq`] does).
fn take_direct(qp: &Qp<SiwRs>, inner: &mut Inner, bufs: TakeBufs<'_>, wakes: &mut Wakes) -> Option<Job> {
    let core = qp.data();
    let u = core.user.as_ref()?;
    if !sq_room(inner) || !matches!(ring_avail(&u.sq, inner.sq_next), Some(n) if n > 0) {
        return None;
    }
    let TakeBufs { inline, sqe: w } = bufs;
    take_sqe(&u.sq, &mut inner.sq_next, w);
    // Looked at where it was made, and moved once, into the job.
    let r = user_send_wqe(core, w);
    let Ok(wqe) = &r else {
        refuse_sqe(qp, inner, w, wakes);
        return None;
    };
    let blocked = (wqe.fence && inner.reads_out > 0) || (awaits_response(&wqe.op) && inner.reads_out >= inner.ord.max(1));
    if !blocked {
        if wqe.inline {
            uwqe::copy_inline(w, wqe.len, inline);
        }
        return r.ok().map(Job::Wqe);
    }
    if r.and_then(|wqe| queue_user_wqe(inner, w, wqe)).is_err() {
        refuse_sqe(qp, inner, w, wakes);
    }
    None
}

/// One inline buffer per send queue slot.
fn inline_slots(n: u32) -> Result<KVVec<uwqe::Inline>> {
    let n = usize::try_from(n).map_err(|_| EINVAL)?;
    let mut v = KVVec::with_capacity(n, GFP_KERNEL)?;
    for _ in 0..n {
        v.push([0u8; uwqe::MAX_INLINE as usize], GFP_KERNEL)?;
    }
    Ok(v)
}

/// Whether another WQE fits the send queue: queued and sent-but-not-completed
/// WQEs count together against `max_send_wr` (the outstanding-work limit of
/// the verbs).
fn sq_room(inner: &Inner) -> bool {
    inner.sq.len + inner.pending.len < inner.sq.slots.len()
}

/// Takes the entries of a process's receive ring into the receive queue
/// (in IDLE/RTS), or flushes them (in ERROR).
fn pull_rq(qp: &Qp<SiwRs>, inner: &mut Inner, wakes: &mut Wakes) {
    let core = qp.data();
    let Some(rq) = core.user.as_ref().and_then(|u| u.rq.as_ref()) else { return };
    let Some(mut avail) = ring_avail(rq, inner.rq_next) else {
        return user_fault(qp, inner, wakes);
    };
    while avail > 0 && inner.rq.len < inner.rq.slots.len() {
        avail -= 1;
        let w = take_entry::<RQE_WORDS>(rq, &mut inner.rq_next);
        if inner.state == QpState::Err {
            fail_recv(qp, w[0], WcStatus::WrFlushErr, wakes);
            continue;
        }
        match user_recv_wqe(&w, core.caps.max_recv_sge) {
            Ok(wqe) => {
                let _ = inner.rq.push(wqe);
            }
            Err(_) => {
                fail_recv(qp, w[0], WcStatus::LocQpOpErr, wakes);
                return user_fault(qp, inner, wakes);
            }
        }
    }
}

/// A receive WQE from an RQE copied out of a process's ring.
pub(crate) fn user_recv_wqe(w: &[u64; RQE_WORDS], max_sge: u32) -> Result<RecvWqe> {
    let (wr_id, sges, n) = uwqe::decode_recv(w).map_err(|_| EINVAL)?;
    let (sges, nsge, len) = take_sges(sges.get(..n).unwrap_or(&[]), max_sge)?;
    Ok(RecvWqe { wr_id, sges, nsge, len })
}

/// On entering ERROR (the state is set and the queues are empty): tells
/// the process (it must ring the doorbell after posting, so new entries
/// get flushed) and flushes what its rings hold, a ring's worth at most.
fn drain_user(qp: &Qp<SiwRs>, inner: &mut Inner, wakes: &mut Wakes) {
    let Some(u) = &qp.data().user else { return };
    u.kflag(ffi::SIW_RS_KF_ERROR, true);
    pull_sq(qp, inner, wakes);
    pull_rq(qp, inner, wakes);
}

/// The doorbell of a process's send queue (`post_send` without work
/// requests): start transmitting what it posted (or, in ERROR, flush it).
///
/// In RTS the entries stay in the ring: the transmitter takes them
/// ([`next_job`]) in the hold of the QP lock in which it takes its job,
/// straight from the ring ([`take_direct`]), so this hold only clears the
/// idle flag and finds the connection. (The lock is still taken three
/// times per message: here, for the job, and for the completion.)
pub(crate) fn sq_doorbell(qp: &Qp<SiwRs>) {
    let Some(u) = &qp.data().user else { return };
    let mut wakes = Wakes::none();
    let (conn, quiet) = {
        let mut inner = qp.data().inner.lock();
        u.sq.ctrl(Ctrl::Kflags).fetch_and(!ffi::SIW_RS_KF_SQ_IDLE, Ordering::AcqRel);
        let conn = if inner.state == QpState::Rts { inner.conn.clone() } else { None };
        if conn.is_none() {
            pull_sq(qp, &mut inner, &mut wakes);
        }
        // No completion of the newest WQE is awaited: nothing to lose if
        // it waits for a worker. (The newest is the ring's, if it holds
        // any; its flags word read alone, a hint.) Only a transmit asks.
        let quiet = conn.is_some()
            && match ring_avail(&u.sq, inner.sq_next) {
                Some(n) if n > 0 => {
                    let mut w1 = [0u64; 1];
                    u.sq.read_from(inner.sq_next.wrapping_add(n - 1), 1, &mut w1);
                    !uwqe::sqe_signaled(w1[0])
                }
                _ => inner.sq.last().is_some_and(|w| !w.signaled),
            };
        (conn, quiet)
    };
    wakes.run(qp);
    match conn {
        // A system call: transmit from here, or hand a stream to a worker.
        Some(c) => c.doorbell(quiet),
        // Nothing will process the queue until the QP is connected; the
        // next post rings again.
        None => {
            u.sq.ctrl(Ctrl::Kflags).fetch_or(ffi::SIW_RS_KF_SQ_IDLE, Ordering::AcqRel);
        }
    }
}

/// The doorbell of a process's receive queue (`post_recv` without work
/// requests): only needed in ERROR, to flush what it posted.
pub(crate) fn rq_doorbell(qp: &Qp<SiwRs>) {
    let mut wakes = Wakes::none();
    {
        let mut inner = qp.data().inner.lock();
        if inner.state == QpState::Err {
            pull_rq(qp, &mut inner, &mut wakes);
        }
    }
    wakes.run(qp);
}

/// Whether a process's send ring is empty; if so, marks the kernel idle so
/// the next post rings the doorbell. The flag is set before the final look
/// at the ring, with a full fence on both sides (the process fences between
/// its producer store and its flag load), so a post is never missed.
fn sq_idle(qp: &Qp<SiwRs>, inner: &Inner) -> bool {
    let Some(u) = &qp.data().user else { return true };
    let kf = u.sq.ctrl(Ctrl::Kflags);
    kf.fetch_or(ffi::SIW_RS_KF_SQ_IDLE, Ordering::AcqRel);
    fence(Ordering::SeqCst);
    if ring_avail(&u.sq, inner.sq_next) == Some(0) {
        return true;
    }
    kf.fetch_and(!ffi::SIW_RS_KF_SQ_IDLE, Ordering::AcqRel);
    false
}

/// Moves the QP to ERROR under its lock and flushes both queues in order.
fn enter_error(qp: &Qp<SiwRs>, inner: &mut Inner, wakes: &mut Wakes) {
    enter_error_after(qp, inner, None, wakes)
}

/// [`enter_error`], with `in_flight` (the WQE the transmitter was
/// sending) flushed in its place: after the requests awaiting responses
/// and before the queued ones.
fn enter_error_after(qp: &Qp<SiwRs>, inner: &mut Inner, in_flight: Option<SendWqe>, wakes: &mut Wakes) {
    inner.state = QpState::Err;
    inner.reads_out = 0;
    while inner.inbound.pop().is_some() {}
    while let Some((w, _)) = inner.pending.pop() {
        flush_send(qp, &w, wakes);
    }
    if let Some(w) = in_flight {
        flush_send(qp, &w, wakes);
    }
    while let Some(w) = inner.sq.pop() {
        flush_send(qp, &w, wakes);
    }
    while let Some(w) = inner.rq.pop() {
        flush_recv(qp, &w, wakes);
    }
    drain_user(qp, inner, wakes);
    // A connection's receive path may hold SRQ entries: its teardown
    // flushes them and then reports the last one.
    wakes.last_wqe = inner.conn.is_none();
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
        if next == QpState::Sqd && matches!(inner.state, QpState::Sqe | QpState::Err) {
            // librdmacm's rdma_disconnect asks an iWARP QP for SQD, a
            // graceful close. When the peer closed or failed first, the
            // QP is already in TERMINATE or ERROR: the close is done, not
            // refused (as in siw). EINVAL made perftest report "Failed to
            // disconnect RDMA CM connection" after its duration runs, and
            // fail when its server closed first.
            return Ok(());
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
                if let Some(u) = &core.user {
                    u.kflag(ffi::SIW_RS_KF_ERROR, false);
                }
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
pub(crate) fn take_sges(sges: &[Sge], max: u32) -> Result<([Sge; NSGE], u8, u32)> {
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

/// Checks a send work request and turns it into a WQE.
/// The WQE of `wr`; `inline`: the length of its inline data, which a
/// process's ring entry carries (the kernel's verbs have no inline data).
fn make_wqe(core: &QpCore, wr: &SendWr<'_, SiwRs>, inline: Option<u32>) -> Result<SendWqe> {
    if wr.flags.inline {
        return Err(EINVAL);
    }
    let is_read = matches!(
        wr.op,
        SendOp::Read { .. } | SendOp::ReadInv { .. } | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. }
    );
    let max = if is_read { crate::limits::MAX_SGE_RD } else { core.caps.max_send_sge };
    let (sges, nsge, len) = take_sges(wr.sges, max)?;
    let atomic = |op, remote_addr, rkey, data, compare| {
        // One 8-byte sink for the original value; the target must be
        // naturally aligned (RFC 7306 section 5.1).
        if nsge != 1 || len != 8 || remote_addr % 8 != 0 {
            return Err(EINVAL);
        }
        Ok(WqeOp::Atomic { op, remote_addr, rkey, data, compare, id: 0 })
    };
    let op = match wr.op {
        SendOp::Send => WqeOp::Send,

        SendOp::SendInv(s) => WqeOp::SendInv(s),
        SendOp::Write { remote_addr, rkey } => WqeOp::Write { remote_addr, rkey },

        SendOp::Read { remote_addr, rkey } => WqeOp::Read { remote_addr, rkey },
        SendOp::ReadInv { remote_addr, rkey, .. } => WqeOp::ReadInv { remote_addr, rkey },
        SendOp::WriteImm { remote_addr, rkey, imm } => WqeOp::WriteImm { remote_addr, rkey, imm },
        SendOp::CmpSwap { remote_addr, rkey, compare, swap } => {
            atomic(AtomicOp::CmpSwap, remote_addr, rkey, swap, compare)?
        }
        SendOp::FetchAdd { remote_addr, rkey, add } => atomic(AtomicOp::FetchAdd, remote_addr, rkey, add, 0)?,
        // RFC 7306 has no Send with Immediate: its Immediate Data message
        // takes a receive buffer of its own, so a Send followed by one would
        // complete two receives (design.rst).
        SendOp::SendImm(_) => return Err(crate::verbs::eopnotsupp()),
        SendOp::LocalInv(s) => WqeOp::LocalInv(s),
        SendOp::RegMr { mr, key, access } => {
            let (iova, len, page_size) = mr.mapping();
            WqeOp::RegMr { mem: mr.data().mem.clone(), key, access, iova, len, page_size }
        }
    };
    Ok(SendWqe {
        wr_id: wr.wr_id,
        op,
        signaled: wr.flags.signaled || core.sig_all,
        solicited: wr.flags.solicited,
        fence: wr.flags.fence,
        sges,
        nsge,
        len: inline.unwrap_or(len),
        inline: inline.is_some(),
    })
}

/// `post_send`: one work request.
pub(crate) fn post_send(qp: &Qp<SiwRs>, wr: &SendWr<'_, SiwRs>) -> Result {
    let core = qp.data();
    if core.user.is_some() {
        // A process posts through its ring.
        return Err(EINVAL);
    }
    let wqe = make_wqe(core, wr, None)?;
    let mut wakes = Wakes::none();
    let res = {
        let mut inner = core.inner.lock();
        match inner.state {
            QpState::Rts if !sq_room(&inner) => Err(ENOMEM),
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
    if core.has_srq || core.user.is_some() {
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

/// A QP in ERROR has completed every SRQ entry it took and takes no more
/// (its connection, if it had one, is torn down past its receive path):
/// the "last WQE reached" event, which `ib_drain_qp` waits for (up to 60
/// s) on a QP with an SRQ. Nothing for a QP without an SRQ.
pub(crate) fn srq_released(qp: &Qp<SiwRs>) {
    if qp.srq().is_some() {
        qp.event(crate::verbs::AsyncEvent::QpLastWqeReached);
    }
}

/// The connection finished its teardown.
pub(crate) fn conn_closed(qp: &Qp<SiwRs>) {
    let core = qp.data();
    let old = {
        let mut inner = core.inner.lock();
        let old = inner.conn.take();
        // Signalled under the lock: once it is released, `destroy` may see
        // the connection gone, return, and the QP (this condition variable
        // with it) be freed.
        core.idle.notify_all();
        old
    };
    // The last reference may be this one: drop it outside the lock.
    drop(old);
}

/// Moves the QP to ERROR (if not there) and flushes it, `in_flight` (the
/// WQE the transmitter was sending) in its place in the send queue's order.
pub(crate) fn to_error(qp: &Qp<SiwRs>, in_flight: Option<SendWqe>) {
    let mut wakes = Wakes::none();
    {
        let mut inner = qp.data().inner.lock();
        if inner.state != QpState::Err {
            enter_error_after(qp, &mut inner, in_flight, &mut wakes);
        } else if let Some(w) = in_flight {
            flush_send(qp, &w, &mut wakes);
        }
    }
    wakes.run(qp);
}

/// Whether nothing is left to transmit (for a graceful close).
pub(crate) fn sq_empty(qp: &Qp<SiwRs>) -> bool {
    let inner = qp.data().inner.lock();
    inner.sq.len == 0 && inner.inbound.len == 0 && inner.reads_out == 0
}

/// Whether a zero-copy send awaits the release of its pages.
pub(crate) fn releases_pending(qp: &Qp<SiwRs>) -> bool {
    qp.data().inner.lock().pending.find(|(_, d)| matches!(d, Wait::Release(_))).is_some()
}

/// An inbound RDMA Read Request to answer.
pub(crate) struct ReadJob {
    pub(crate) req: crate::iwarp::rdmap::ReadRequest,
    /// The source region (`None` for a zero-length read).
    pub(crate) mem: Option<Arc<Mem>>,
}

/// An inbound RFC 7306 Atomic Request to execute and answer.
pub(crate) struct AtomicJob {
    pub(crate) req: crate::iwarp::rdmap::AtomicRequest,
    /// The target region (checked: 8 aligned bytes, remote-atomic rights).
    pub(crate) mem: Arc<Mem>,
}

/// An inbound request, answered in arrival order.
pub(crate) enum Inbound {
    Read(ReadJob),
    Atomic(AtomicJob),
}

/// What the transmitter does next.
pub(crate) enum Job {
    /// Answer an inbound Read or Atomic Request.
    Response(Inbound),
    /// Transmit or execute a send WQE.
    Wqe(SendWqe),
}

fn is_read(op: &WqeOp) -> bool {
    matches!(op, WqeOp::Read { .. } | WqeOp::ReadInv { .. })
}

/// Whether the WQE completes only when the peer's response arrives (Read,
/// Atomic): these count against the ORD and hold later completions back.
fn awaits_response(op: &WqeOp) -> bool {
    is_read(op) || matches!(op, WqeOp::Atomic { .. })
}

/// The transmitter's buffers for the WQE it takes: its inline data, and
/// the copy of a ring entry taken straight from the ring.
pub(crate) struct TakeBufs<'a> {
    pub(crate) inline: &'a mut uwqe::Inline,
    pub(crate) sqe: &'a mut SqeCopy,
}

/// The next job, while in RTS: Read Responses first, then the send queue
/// in order, honouring the fence bit and the ORD. The inline data of a WQE
/// taken is copied to `bufs.inline` (the transmitter's buffer).
pub(crate) fn next_job(qp: &Qp<SiwRs>, bufs: TakeBufs<'_>) -> Option<Job> {
    let mut wakes = Wakes::none();
    let job = next_job_locked(qp, &mut qp.data().inner.lock(), bufs, &mut wakes);
    wakes.run(qp);
    job
}

/// [`next_job`] under the QP lock.
fn next_job_locked(qp: &Qp<SiwRs>, inner: &mut Inner, bufs: TakeBufs<'_>, wakes: &mut Wakes) -> Option<Job> {
    if inner.state != QpState::Rts {
        return None;
    }
    if let Some(j) = inner.inbound.pop() {
        return Some(Job::Response(j));
    }
    let TakeBufs { inline, sqe } = bufs;
    if inner.sq.len == 0 {
        if let j @ Some(_) = take_direct(qp, inner, TakeBufs { inline: &mut *inline, sqe }, wakes) {
            return j;
        }
        pull_sq(qp, inner, wakes);
        // With no room (Reads or zero-copy sends awaiting completion fill
        // `pending`), the ring is not idle: a Read's response or a send's
        // release (`released`) kicks the transmitter, which pulls again.
        while inner.sq.len == 0 && inner.state == QpState::Rts && sq_room(inner) && !sq_idle(qp, inner) {
            pull_sq(qp, inner, wakes);
        }
    }
    let (fence, read) = {
        let head = inner.sq.slots.get(inner.sq.head).and_then(|s| s.as_ref());
        match head {
            Some(w) if inner.sq.len > 0 => (w.fence, awaits_response(&w.op)),
            _ => return None,
        }
    };
    if fence && inner.reads_out > 0 {
        return None;
    }
    if read && inner.reads_out >= inner.ord.max(1) {
        return None;
    }
    let slot = inner.sq.head;
    let (is_inline, len) = {
        let w = inner.sq.slots.get(slot).and_then(|s| s.as_ref())?;
        (w.inline, w.len as usize)
    };
    if is_inline {
        if let (Some(dst), Some(src)) = (inline.get_mut(..len), inner.sq_inline.get(slot).and_then(|b| b.get(..len))) {
            dst.copy_from_slice(src);
        }
    }
    // Popped straight into the result: a WQE moved through a local
    // first is one more call to memcpy.
    inner.sq.pop().map(Job::Wqe)
}

/// A WQE was transmitted (or executed) successfully: it completes at once
/// unless an earlier Read or Atomic still awaits its response. (Reads and
/// Atomics themselves enter `pending` through [`await_response`].)
pub(crate) fn sent(qp: &Qp<SiwRs>, w: SendWqe) {
    let mut wakes = Wakes::none();
    let done = sent_locked(qp, &mut qp.data().inner.lock(), w, &mut wakes);
    // Dropped without the lock: it may hold the last reference to a region.
    drop(done);
    wakes.run(qp);
}

/// [`sent`], then [`next_job`], in one hold of the QP lock: the
/// transmitter's step from one message to the next.
pub(crate) fn sent_then_next(qp: &Qp<SiwRs>, w: SendWqe, bufs: TakeBufs<'_>) -> Option<Job> {
    let mut job = Some(Job::Wqe(w));
    sent_then_next_in(qp, &mut job, bufs);
    job
}

/// [`sent_then_next`] for the WQE the transmitter holds in `job`, which
/// the next job (or `None`) replaces. Nothing is done for a job that is
/// not a WQE, nor for `None`. The WQE completes where it lies unless it
/// must wait behind earlier ones or owns something
/// ([`WqeOp::owns_region`]) to drop after unlocking: a WQE moved is a call
/// to memcpy, and on the way from a small Send or Write to the next it was
/// moved twice.
///
/// Inlined into both callers: called, it counted 48 instructions more per
/// 2 B round trip.
#[inline(always)]
pub(crate) fn sent_then_next_in(qp: &Qp<SiwRs>, job: &mut Option<Job>, bufs: TakeBufs<'_>) {
    let mut wakes = Wakes::none();
    let done = {
        let mut inner = qp.data().inner.lock();
        let done = match job {
            Some(Job::Wqe(w)) if !w.op.owns_region() && !completes_later(&inner) => {
                complete_send_locked(qp, &mut inner, w, WcStatus::Success, &mut wakes);
                // Owns nothing: dropped here, under the lock.
                *job = None;
                None
            }
            Some(Job::Wqe(_)) => match job.take() {
                Some(Job::Wqe(w)) => sent_locked(qp, &mut inner, w, &mut wakes),
                _ => None,
            },
            _ => return,
        };
        *job = next_job_locked(qp, &mut inner, bufs, &mut wakes);
        done
    };
    drop(done);
    wakes.run(qp);
}

/// Whether a WQE sent now completes only after the earlier ones in
/// `pending` (and goes there meanwhile).
fn completes_later(inner: &Inner) -> bool {
    inner.state == QpState::Rts && inner.pending.len > 0 && inner.pending.len < inner.pending.slots.len()
}

/// [`sent`] under the QP lock. Returns the WQE if it completed, for the
/// caller to drop after unlocking.
fn sent_locked(qp: &Qp<SiwRs>, inner: &mut Inner, w: SendWqe, wakes: &mut Wakes) -> Option<SendWqe> {
    if completes_later(inner) {
        let _ = inner.pending.push((w, Wait::Done));
        return None;
    }
    complete_send_locked(qp, inner, &w, WcStatus::Success, wakes);
    Some(w)
}

/// A Read or Atomic Request is about to be transmitted: from now on it
/// awaits its response. `Err` gives the WQE back if the QP left RTS.
pub(crate) fn await_response(qp: &Qp<SiwRs>, w: SendWqe) -> core::result::Result<(), SendWqe> {
    let mut inner = qp.data().inner.lock();
    if inner.state != QpState::Rts || inner.pending.len >= inner.pending.slots.len() {
        return Err(w);
    }
    inner.reads_out += 1;
    let _ = inner.pending.push((w, Wait::Response));
    Ok(())
}

/// Index in `pending` of the oldest request still awaiting its response.
fn oldest_outstanding(inner: &Inner) -> Option<usize> {
    inner.pending.find(|(_, d)| *d == Wait::Response)
}

/// The response to the oldest outstanding request (whose kind the caller
/// checked through [`read_sink`] or [`atomic_sink`]) arrived completely.
/// Completes it and what waited behind it; `false` if none was outstanding.
pub(crate) fn response_done(qp: &Qp<SiwRs>) -> bool {
    {
        let mut inner = qp.data().inner.lock();
        let Some(i) = oldest_outstanding(&inner) else {
            return false;
        };
        if let Some(Some((_, d))) = inner.pending.slots.get_mut(i) {
            *d = Wait::Done;
        }
        inner.reads_out = inner.reads_out.saturating_sub(1);
    }
    complete_done(qp);
    true
}

/// Completes `pending` from its head while its entries are done, one at a
/// time so no lock is held while completing.
fn complete_done(qp: &Qp<SiwRs>) {
    loop {
        let next = {
            let mut inner = qp.data().inner.lock();
            match inner.pending.slots.get(inner.pending.head) {
                Some(Some((_, Wait::Done))) if inner.pending.len > 0 => inner.pending.pop(),
                _ => None,
            }
        };
        match next {
            Some((w, _)) => complete_send(qp, w, WcStatus::Success),
            None => break,
        }
    }
}

/// A zero-copy send was handed to the socket whole: it completes, in
/// order, once the network stack has released its pages ([`released`]
/// with `seq`), and with the WQEs before it. If the QP left RTS it
/// completes at once, as [`sent`] does (flushed in ERROR; its pages may
/// still be in flight, but the connection that would carry them is
/// ending).
pub(crate) fn sent_zcopy(qp: &Qp<SiwRs>, w: SendWqe, seq: u64) {
    let mut wakes = Wakes::none();
    let done = {
        let mut inner = qp.data().inner.lock();
        if inner.state == QpState::Rts && inner.pending.len < inner.pending.slots.len() {
            let _ = inner.pending.push((w, Wait::Release(seq)));
            None
        } else {
            complete_send_locked(qp, &mut inner, &w, WcStatus::Success, &mut wakes);
            Some(w)
        }
    };
    // Dropped without the lock: it may hold the last reference to a region.
    drop(done);
    wakes.run(qp);
}

/// The network stack released the pages of zero-copy send `seq`: it
/// completes now if every WQE before it has. Returns the connection whose
/// transmitter must look at the send ring again (see below).
pub(crate) fn released(qp: &Qp<SiwRs>, seq: u64) -> Option<Arc<Conn>> {
    {
        let mut inner = qp.data().inner.lock();
        let found = inner.pending.find(|(_, d)| *d == Wait::Release(seq));
        if let Some(Some((_, d))) = found.and_then(|i| inner.pending.slots.get_mut(i)) {
            *d = Wait::Done;
        }
    }
    complete_done(qp);
    // While the WQEs awaiting completion fill the send queue, the
    // transmitter leaves a process's ring marked busy (`next_job_locked`),
    // and the process's next post then rings no doorbell: the room made
    // here must restart the transmitter, which takes what the ring holds
    // or marks it idle. (A Read's or Atomic's response does so from the
    // receive path.)
    let u = qp.data().user.as_ref()?;
    if u.sq.ctrl(Ctrl::Kflags).load(Ordering::Acquire) & ffi::SIW_RS_KF_SQ_IDLE != 0 {
        return None;
    }
    conn_of(qp)
}

/// The sink of the oldest outstanding request if it is a Read: (lkey,
/// addr, len, the STag to invalidate when it completes). Responses come
/// back in request order, so a Read Response for anything else is a
/// protocol error.
pub(crate) fn read_sink(qp: &Qp<SiwRs>) -> Option<(u32, u64, u32, Option<u32>)> {
    let inner = qp.data().inner.lock();
    let i = oldest_outstanding(&inner)?;
    let Some(Some((w, _))) = inner.pending.slots.get(i) else { return None };
    if !is_read(&w.op) {
        return None;
    }
    let s = w.sges.first().copied().unwrap_or_default();
    let inv = matches!(w.op, WqeOp::ReadInv { .. }).then_some(s.lkey);
    Some((s.lkey, s.addr, w.len, inv))
}

/// The oldest outstanding request if it is an Atomic: (Request
/// Identifier, sink lkey, sink address) of its 8-byte result.
pub(crate) fn atomic_sink(qp: &Qp<SiwRs>) -> Option<(u32, u32, u64)> {
    let inner = qp.data().inner.lock();
    let i = oldest_outstanding(&inner)?;
    match inner.pending.slots.get(i) {
        Some(Some((w @ SendWqe { op: WqeOp::Atomic { id, .. }, .. }, _))) => {
            let s = w.sges.first().copied().unwrap_or_default();
            Some((*id, s.lkey, s.addr))
        }
        _ => None,
    }
}

/// Whether another inbound Read or Atomic Request fits the IRD.
pub(crate) fn inbound_room(qp: &Qp<SiwRs>) -> bool {
    let inner = qp.data().inner.lock();
    inner.state == QpState::Rts && inner.inbound.len < usize::try_from(inner.ird.max(1)).unwrap_or(1)
}

/// The peer refused the oldest outstanding request (its TERMINATE): that
/// request completes with `status`, which moves the QP to ERROR and flushes
/// the rest.
///
/// The sends before it (zero-copy ones whose pages are still in flight)
/// complete first, successfully, as they would have without zero-copy:
/// they were handed to the socket whole and the peer refused a later
/// message.
pub(crate) fn fail_oldest(qp: &Qp<SiwRs>, status: WcStatus) {
    loop {
        let w = {
            let mut inner = qp.data().inner.lock();
            let head = inner.pending.slots.get(inner.pending.head).and_then(|s| s.as_ref()).map(|(_, d)| *d);
            match head {
                Some(d) if inner.pending.len > 0 => inner.pending.pop().map(|(w, _)| (w, d)),
                _ => None,
            }
        };
        match w {
            Some((w, Wait::Response)) => return complete_send(qp, w, status),
            Some((w, _)) => complete_send(qp, w, WcStatus::Success),
            None => return,
        }
    }
}

/// Queues an inbound Read or Atomic Request; `Err` beyond the IRD.
pub(crate) fn queue_response(qp: &Qp<SiwRs>, job: Inbound) -> core::result::Result<(), ()> {
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
    complete_send_locked(qp, &mut qp.data().inner.lock(), &w, status, &mut wakes);
    // Dropped without the lock: it may hold the last reference to a region.
    drop(w);
    wakes.run(qp);
}

/// [`complete_send`] under the QP lock; the caller drops `w` after
/// unlocking and runs `wakes`.
fn complete_send_locked(qp: &Qp<SiwRs>, inner: &mut Inner, w: &SendWqe, status: WcStatus, wakes: &mut Wakes) {
    let status = effective_status(inner, status);
    if w.signaled || status != WcStatus::Success {
        let wc = Wc {
            wr_id: w.wr_id,
            status,
            opcode: w.op.wc_opcode(),
            byte_len: w.len,
            qp: qp.id(),
            qp_num: qp.qp_num(),
            imm: None,
            invalidated: None,
        };
        Wakes::merge(&mut wakes.send, cq::push(qp.send_cq(), wc, false));
    }
    error_out(qp, inner, status, wakes);
}

/// A request that completes after its QP went to ERROR is flushed.
fn effective_status(inner: &Inner, status: WcStatus) -> WcStatus {
    if status == WcStatus::Success && inner.state == QpState::Err {
        WcStatus::WrFlushErr
    } else {
        status
    }
}

/// A request that failed (other than by a flush) takes the QP to ERROR.
fn error_out(qp: &Qp<SiwRs>, inner: &mut Inner, status: WcStatus, wakes: &mut Wakes) {
    if status != WcStatus::Success && status != WcStatus::WrFlushErr && inner.state != QpState::Err {
        enter_error(qp, inner, wakes);
    }
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

/// Takes the receive WQE for a new inbound message (from the SRQ if the QP
/// has one); `None` if none is posted or the QP is not in RTS.
///
/// The receive path asks once per message, at its first segment, when the
/// protocol core needs the buffer's length, and keeps the entry from then
/// on: the length checked is that of the buffer the message fills, also
/// when other QPs take from the same SRQ meanwhile, and placing the message
/// takes no further look at the queue. An entry the receive path holds when
/// the connection ends is flushed by its teardown, before the QP's queue.
pub(crate) fn claim_recv(qp: &Qp<SiwRs>) -> Option<RecvWqe> {
    if let Some(srq) = qp.srq() {
        if qp.data().inner.lock().state != QpState::Rts {
            return None;
        }
        return crate::srq::take(srq);
    }
    let mut wakes = Wakes::none();
    let w = {
        let mut inner = qp.data().inner.lock();
        if inner.state == QpState::Rts && inner.rq.len == 0 {
            pull_rq(qp, &mut inner, &mut wakes);
        }
        if inner.state != QpState::Rts {
            None
        } else {
            inner.rq.pop()
        }
    };
    wakes.run(qp);
    w
}

/// How a receive WQE was consumed.
#[derive(Clone, Copy)]
pub(crate) enum RecvKind {
    /// By a Send; the peer invalidated this STag if given.
    Send { invalidated: Option<u32> },
    /// By an Immediate Data message (after an RDMA Write of `len` octets);
    /// the immediate value in network order.
    Immediate(u32),
}

/// Completes a receive WQE.
pub(crate) fn complete_recv(qp: &Qp<SiwRs>, wr_id: u64, status: WcStatus, len: u32, solicited: bool, kind: RecvKind) {
    let (opcode, imm, inv) = match kind {
        RecvKind::Send { invalidated } => (WcOpcode::Recv, None, invalidated),
        RecvKind::Immediate(v) => (WcOpcode::RecvRdmaWithImm, Some(v), None),
    };
    let mut wakes = Wakes::none();
    {
        let mut inner = qp.data().inner.lock();
        let status = effective_status(&inner, status);
        let wc = Wc {
            wr_id,
            status,
            opcode,
            byte_len: len,
            qp: qp.id(),
            qp_num: qp.qp_num(),
            imm,
            invalidated: inv,
        };
        Wakes::merge(&mut wakes.recv, cq::push(qp.recv_cq(), wc, solicited));
        error_out(qp, &mut inner, status, &mut wakes);
    }
    wakes.run(qp);
}

/// `iw_add_ref`.
pub(crate) fn cm_ref(qp: &Qp<SiwRs>) {
    let core = qp.data();
    let mut inner = core.inner.lock();
    inner.cm_refs = inner.cm_refs.saturating_add(1);
    // The lookup that found the QP is over once the reference is taken
    // (the reference first, so that `destroy` never sees neither the
    // lookup nor the reference).
    let _ = core.cm_lookups.fetch_update(Ordering::Release, Ordering::Relaxed, |n| n.checked_sub(1));
    drop(inner);
}

impl QpCore {
    /// The process context that created the QP ([`Ucontext::id`]), 0 for
    /// a kernel consumer's.
    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }

    /// A doorbell file starts ringing the QP. Called under the QP table's
    /// lock with the QP in the table, so [`QpCore::drain_doorbells`], which
    /// runs after the QP left the table, sees it.
    pub(crate) fn doorbell_enter(&self) {
        self.doorbells.fetch_add(1, Ordering::Relaxed);
    }

    /// `iw_get_qp` found the QP. Called under the QP table's lock with the
    /// QP in the table, like [`QpCore::doorbell_enter`]. The iw_cm calls
    /// `iw_add_ref` ([`cm_ref`]) right after, under its id's lock, and
    /// that ends the lookup; until then the QP must not go.
    pub(crate) fn cm_lookup(&self) {
        self.cm_lookups.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits until every `iw_get_qp` that found the QP in the table has
    /// had its `iw_add_ref` (so `destroy` then waits for that reference
    /// to go). Called after the QP left the table. The iw_cm pairs the two
    /// calls under one spinlock, so the wait is a few instructions long;
    /// it gives up after a second, with a warning, in case a CM ever looks
    /// a QP up without taking a reference.
    pub(crate) fn drain_cm_lookups(&self) {
        let mut waited = 0u32;
        while self.cm_lookups.load(Ordering::Acquire) != 0 {
            if waited >= 1_000_000 {
                pr_warn!("a QP lookup of the CM took no reference within 1 s\n");
                return;
            }
            crate::wq::sleep_us(50);
            waited += 50;
        }
    }

    /// That doorbell returned; the QP is not touched by it any more.
    pub(crate) fn doorbell_exit(&self) {
        self.doorbells.fetch_sub(1, Ordering::Release);
    }

    /// Waits until every doorbell that found the QP in the table has
    /// returned. Called after it left the table (so none can start), before
    /// it is destroyed. A doorbell sends at most until the socket is full,
    /// so the wait is short; a sleep between looks keeps it off the CPU.
    pub(crate) fn drain_doorbells(&self) {
        while self.doorbells.load(Ordering::Acquire) != 0 {
            crate::wq::sleep_us(50);
        }
    }
}

/// `iw_rem_ref`.
pub(crate) fn cm_unref(qp: &Qp<SiwRs>) {
    let core = qp.data();
    let mut inner = core.inner.lock();
    inner.cm_refs = inner.cm_refs.saturating_sub(1);
    // Under the lock, as in `conn_closed`: after it, the QP may be gone.
    core.idle.notify_all();
    drop(inner);
}

/// QP numbers of a device, for `iw_get_qp` and the doorbell files.
pub(crate) struct QpTable {
    slots: KVVec<Option<QpEntry>>,
    next: usize,
}

/// A QP in the table, and the process context that may ring it through its
/// doorbell file (0: none, a kernel QP or one not yet published).
#[derive(Clone, Copy)]
struct QpEntry {
    qp: NonNull<crate::ffi::ib_qp>,
    owner: u64,
    /// Published: the QP's data is in place. Before, the number is
    /// reserved but no lookup finds the QP.
    ready: bool,
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

    /// Enters a QP; returns its number. No lookup finds it until
    /// [`QpTable::publish`].
    pub(crate) fn insert(&mut self, qp: NonNull<crate::ffi::ib_qp>) -> Result<u32> {
        let n = self.slots.len();
        for _ in 0..n {
            let i = if self.next >= n { FIRST_QPN } else { self.next };
            self.next = i + 1;
            if let Some(slot @ None) = self.slots.get_mut(i) {
                *slot = Some(QpEntry { qp, owner: 0, ready: false });
                return u32::try_from(i).map_err(|_| ENOMEM);
            }
        }
        Err(ENOMEM)
    }

    /// Lets lookups find QP `qpn`, and the doorbell file of context
    /// `owner` (0: none) ring it: called once the QP's data is in place.
    pub(crate) fn publish(&mut self, qpn: u32, owner: u64) {
        if let Some(Some(e)) = self.slot_mut(qpn) {
            e.owner = owner;
            e.ready = true;
        }
    }

    /// Removes QP number `qpn`.
    pub(crate) fn remove(&mut self, qpn: u32) {
        if let Some(slot) = self.slot_mut(qpn) {
            *slot = None;
        }
    }

    fn slot_mut(&mut self, qpn: u32) -> Option<&mut Option<QpEntry>> {
        usize::try_from(qpn).ok().and_then(|i| self.slots.get_mut(i))
    }

    fn entry(&self, qpn: u32) -> Option<QpEntry> {
        usize::try_from(qpn).ok().and_then(|i| self.slots.get(i)).copied().flatten().filter(|e| e.ready)
    }

    /// The QP with number `qpn`.
    pub(crate) fn get(&self, qpn: u32) -> Option<NonNull<crate::ffi::ib_qp>> {
        self.entry(qpn).map(|e| e.qp)
    }

    /// QP `qpn` if the doorbell file of context `owner` (not 0) may ring
    /// it: published by that context.
    pub(crate) fn get_owned(&self, qpn: u32, owner: u64) -> Option<NonNull<crate::ffi::ib_qp>> {
        self.entry(qpn).filter(|e| owner != 0 && e.owner == owner).map(|e| e.qp)
    }
}
