// SPDX-License-Identifier: GPL-2.0

//! Completion queues: a fixed ring of completions, armed for the next or the
//! next solicited completion.
//!
//! Driver logic: no `unsafe`. The ring is preallocated at creation, so adding
//! a completion never allocates and works in any context. Its lock disables
//! interrupts (completions are added from softirq context and polled from
//! consumers' handlers) and is never held while calling the consumer: the
//! completion handler runs after the lock is dropped.

use crate::{
    device::SiwRs,
    sync::{new_irq_spinlock, IrqSpinLock},
    verbs::{Cq, CqAttr, Notify, Wc, WcSink, WcStatus},
};
use kernel::{prelude::*, sync::Arc};

/// A CQ's state (`<SiwRs as Driver>::Cq` is an `Arc` of it).
#[pin_data]
pub(crate) struct CqState {
    #[pin]
    ring: IrqSpinLock<Ring>,
}

struct Ring {
    wcs: KVVec<Wc>,
    head: usize,
    len: usize,
    armed: Option<Notify>,
    overflowed: bool,
}

/// The ring was full: the completion was lost and the CQ is in error.
/// `first` is set for the completion that overflowed it.
#[derive(Debug)]
pub(crate) struct Overflow {
    pub(crate) first: bool,
}

impl CqState {
    /// Creates the state for `attr.entries` completions (at least one).
    pub(crate) fn new(attr: &mut CqAttr, max: u32) -> Result<Arc<Self>> {
        if attr.entries == 0 || attr.entries > max {
            return Err(EINVAL);
        }
        let n = usize::try_from(attr.entries).map_err(|_| EINVAL)?;
        let wcs = KVVec::from_elem(Wc::EMPTY, n, GFP_KERNEL)?;
        let ring = Ring { wcs, head: 0, len: 0, armed: None, overflowed: false };
        Arc::pin_init(pin_init!(CqState { ring <- new_irq_spinlock!(ring, "siw_rs_cq") }), GFP_KERNEL)
    }
}

/// Adds `wc` to `cq`. A `solicited` completion (a Send with the SE bit) or
/// an error satisfies a CQ armed for solicited completions. Returns whether
/// the consumer must be woken: the caller does that with [`wake`] once it
/// holds no lock of its own, because the consumer's handler may post new
/// work requests right away.
pub(crate) fn push(cq: &Cq<SiwRs>, wc: Wc, solicited: bool) -> core::result::Result<bool, Overflow> {
    let mut r = cq.data().ring.lock();
    let cap = r.wcs.len();
    if r.overflowed || r.len >= cap {
        let first = !r.overflowed;
        r.overflowed = true;
        return Err(Overflow { first });
    }
    let mut idx = r.head + r.len;
    if idx >= cap {
        idx -= cap;
    }
    if let Some(slot) = r.wcs.get_mut(idx) {
        *slot = wc;
    }
    r.len += 1;
    let fire = match r.armed {
        Some(Notify::Next) => true,
        Some(Notify::Solicited) => solicited || wc.status != WcStatus::Success,
        None => false,
    };
    if fire {
        r.armed = None;
    }
    Ok(fire)
}

/// Calls the consumer's completion handler (after [`push`] said so), or
/// reports the overflow [`push`] returned.
pub(crate) fn wake(cq: &Cq<SiwRs>, pushed: core::result::Result<bool, Overflow>) {
    match pushed {
        Ok(true) => cq.notify(),
        Ok(false) => {}
        Err(Overflow { first: true }) => cq.event(crate::verbs::AsyncEvent::CqErr),
        Err(Overflow { first: false }) => {}
    }
}

/// `poll_cq`: moves completions into `sink`, oldest first.
pub(crate) fn poll(cq: &Cq<SiwRs>, sink: &mut WcSink<'_>) {
    let mut r = cq.data().ring.lock();
    while r.len > 0 && sink.room() > 0 {
        let head = r.head;
        let Some(wc) = r.wcs.get(head).copied() else { break };
        sink.push(&wc);
        r.head = if head + 1 >= r.wcs.len() { 0 } else { head + 1 };
        r.len -= 1;
    }
}

/// `req_notify_cq`: arms the CQ. A request for the next completion of any
/// kind supersedes one for solicited completions. Returns whether
/// completions are waiting (for `IB_CQ_REPORT_MISSED_EVENTS`).
pub(crate) fn arm(cq: &Cq<SiwRs>, how: Notify, report_missed: bool) -> bool {
    let mut r = cq.data().ring.lock();
    r.armed = match (r.armed, how) {
        (Some(Notify::Next), _) | (_, Notify::Next) => Some(Notify::Next),
        _ => Some(Notify::Solicited),
    };
    report_missed && r.len > 0
}
