// SPDX-License-Identifier: GPL-2.0

//! Shared receive queues: one queue of receive buffers for many QPs, with
//! the limit event (`IB_EVENT_SRQ_LIMIT_REACHED`).
//!
//! Driver logic: no `unsafe`. A QP attached to an SRQ takes one entry when
//! the first segment of a Send arrives ([`take`]); the entry is the QP's
//! from then on (flushed with the QP if it fails). Entries still in the SRQ
//! are not flushed when a QP fails: they belong to the SRQ. A process's
//! SRQ is a ring like a receive queue (uapi/siw_rs-abi.h); a malformed
//! entry is dropped and reported as `IB_EVENT_SRQ_ERR`.

use crate::{
    device::SiwRs,
    ffi,
    limits::{MAX_SGE, MAX_SRQ_WR},
    qp::{self, Fifo, RecvWqe},
    sync::{new_irq_spinlock, IrqSpinLock},
    uverbs::{Ctrl, Ucontext, UserRing, RQE_WORDS},
    verbs::{AsyncEvent, RecvWr, Srq, SrqAttr},
};
use core::sync::atomic::Ordering;
use kernel::{prelude::*, sync::Arc};

/// An SRQ's state (`<SiwRs as Driver>::Srq` is an `Arc` of it).
#[pin_data]
pub(crate) struct SrqCore {
    max_wr: u32,
    max_sge: u32,
    /// A process's ring.
    user: Option<UserRing>,
    #[pin]
    inner: IrqSpinLock<Inner>,
}

struct Inner {
    rq: Fifo<RecvWqe>,
    /// The limit, and whether the event is armed.
    limit: u32,
    armed: bool,
    /// A process's SRQ: the next ring entry to take.
    next: u32,
}

impl SrqCore {
    /// Creates an SRQ for `attr` (sizes adjusted to what it provides).
    pub(crate) fn new(attr: &mut SrqAttr, uctx: Option<&Ucontext>) -> Result<Arc<Self>> {
        if attr.max_wr == 0 || attr.max_wr > MAX_SRQ_WR || attr.max_sge > MAX_SGE || attr.limit > attr.max_wr {
            return Err(EINVAL);
        }
        attr.max_sge = attr.max_sge.max(1);
        let user = match uctx {
            None => None,
            Some(uctx) => {
                attr.max_wr = attr.max_wr.checked_next_power_of_two().filter(|&n| n <= MAX_SRQ_WR).ok_or(EINVAL)?;
                Some(UserRing::new(uctx, attr.max_wr, RQE_WORDS)?)
            }
        };
        let inner = Inner { rq: Fifo::new(attr.max_wr)?, limit: attr.limit, armed: attr.limit > 0, next: 0 };
        Arc::pin_init(
            pin_init!(SrqCore {
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                user,
                inner <- new_irq_spinlock!(inner, "siw_rs_srq"),
            }),
            GFP_KERNEL,
        )
    }

    /// The create response of a process's SRQ.
    pub(crate) fn user_resp(&self) -> Option<ffi::siw_rs_uresp_create_srq> {
        let r = self.user.as_ref()?;
        Some(ffi::siw_rs_uresp_create_srq { rq_key: r.key(), rq_bytes: r.bytes(), num_rqe: r.entries(), rsvd: 0 })
    }
}

/// `post_srq_recv`: one work request (kernel consumers).
pub(crate) fn post(srq: &Srq<SiwRs>, wr: &RecvWr<'_>) -> Result {
    let core = srq.data();
    if core.user.is_some() {
        return Err(EINVAL);
    }
    let (sges, nsge, len) = qp::take_sges(wr.sges, core.max_sge)?;
    core.inner.lock().rq.push(RecvWqe { wr_id: wr.wr_id, sges, nsge, len })
}

/// `modify_srq`: only the limit can change (arming the event); resizing is
/// not supported.
pub(crate) fn modify(srq: &Srq<SiwRs>, max_wr: Option<u32>, limit: Option<u32>) -> Result {
    let core = srq.data();
    if max_wr.is_some() {
        return Err(crate::verbs::eopnotsupp());
    }
    if let Some(l) = limit {
        if l > core.max_wr {
            return Err(EINVAL);
        }
        let mut inner = core.inner.lock();
        inner.limit = l;
        inner.armed = l > 0;
    }
    Ok(())
}

/// `query_srq`.
pub(crate) fn query(srq: &Srq<SiwRs>) -> SrqAttr {
    let core = srq.data();
    SrqAttr { max_wr: core.max_wr, max_sge: core.max_sge, limit: core.inner.lock().limit }
}

/// Takes the oldest entry for a QP. Raises the limit event if this left
/// fewer entries than the armed limit.
pub(crate) fn take(srq: &Srq<SiwRs>) -> Option<RecvWqe> {
    let core = srq.data();
    let mut malformed = false;
    let (w, fire) = {
        let mut inner = core.inner.lock();
        if let Some(r) = &core.user {
            malformed = pull(core, r, &mut inner);
        }
        let w = inner.rq.pop();
        let fire = inner.armed && (inner.rq.len as u64) < u64::from(inner.limit);
        if fire {
            inner.armed = false;
        }
        (w, fire)
    };
    if malformed {
        srq.event(AsyncEvent::SrqErr);
    }
    if fire {
        srq.event(AsyncEvent::SrqLimitReached);
    }
    w
}

/// Takes a process's posted entries into the queue; returns whether one
/// was malformed (dropped) or the ring index is garbage.
fn pull(core: &SrqCore, r: &UserRing, inner: &mut Inner) -> bool {
    let Some(mut avail) = qp::ring_avail(r, inner.next) else { return true };
    let mut bad = false;
    while avail > 0 && inner.rq.len < inner.rq.capacity() {
        avail -= 1;
        let w = qp::take_entry::<RQE_WORDS>(r, &mut inner.next);
        match qp::user_recv_wqe(&w, core.max_sge) {
            Ok(wqe) => {
                let _ = inner.rq.push(wqe);
            }
            Err(_) => bad = true,
        }
    }
    if bad {
        r.ctrl(Ctrl::Kflags).fetch_or(ffi::SIW_RS_KF_ERROR, Ordering::AcqRel);
    }
    bad
}
