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
    ffi,
    sync::{new_irq_spinlock, IrqSpinLock},
    uverbs::{Ctrl, UserRing, CQE_WORDS},
    verbs::{Cq, CqAttr, Notify, Wc, WcSink, WcStatus},
};
use core::sync::atomic::{fence, Ordering};
use kernel::{prelude::*, sync::Arc};

/// A CQ's state (`<SiwRs as Driver>::Cq` is an `Arc` of it).
#[pin_data]
pub(crate) struct CqState {
    #[pin]
    ring: IrqSpinLock<Ring>,
}

struct Ring {
    store: Store,
    overflowed: bool,
}

/// Where completions wait for the consumer.
enum Store {
    /// A kernel consumer's CQ: a ring `poll_cq` takes completions from.
    Kernel { wcs: KVVec<Wc>, head: usize, len: usize, armed: Option<Notify> },
    /// A process's CQ: completions go straight into the ring it maps and
    /// polls itself; `prod` is the kernel's own producer index (the one in
    /// the ring is only ever written).
    User { ring: UserRing, prod: u32 },
}

/// The ring was full: the completion was lost and the CQ is in error.
/// `first` is set for the completion that overflowed it.
#[derive(Debug)]
pub(crate) struct Overflow {
    pub(crate) first: bool,
}

impl CqState {
    /// Creates the state for `attr.entries` completions (at least one): a
    /// kernel ring, or with `user` the ring a process maps (the size
    /// rounded up to a power of two and written back to `attr`).
    pub(crate) fn new(attr: &mut CqAttr, max: u32, user: Option<&crate::uverbs::Ucontext>) -> Result<Arc<Self>> {
        if attr.entries == 0 || attr.entries > max {
            return Err(EINVAL);
        }
        let store = match user {
            None => {
                let n = usize::try_from(attr.entries).map_err(|_| EINVAL)?;
                let wcs = KVVec::from_elem(Wc::EMPTY, n, GFP_KERNEL)?;
                Store::Kernel { wcs, head: 0, len: 0, armed: None }
            }
            Some(uctx) => {
                let n = attr.entries.checked_next_power_of_two().ok_or(EINVAL)?;
                attr.entries = n;
                Store::User { ring: UserRing::new(uctx, n, CQE_WORDS)?, prod: 0 }
            }
        };
        let ring = Ring { store, overflowed: false };
        Arc::pin_init(pin_init!(CqState { ring <- new_irq_spinlock!(ring, "siw_rs_cq") }), GFP_KERNEL)
    }

    /// The user ring's mmap key, length and size, for the create response.
    pub(crate) fn user_ring(&self) -> Option<(u64, u64, u32)> {
        match &self.ring.lock().store {
            Store::User { ring, .. } => Some((ring.key(), ring.bytes(), ring.entries())),
            Store::Kernel { .. } => None,
        }
    }
}

/// A completion as `struct siw_rs_cqe` (uapi/siw_rs-abi.h), in words.
fn cqe_words(wc: &Wc) -> [u64; CQE_WORDS] {
    let (flags, extra) = match (wc.imm, wc.invalidated) {
        (Some(imm), _) => (ffi::SIW_RS_CQE_WITH_IMM, imm),
        (None, Some(stag)) => (ffi::SIW_RS_CQE_WITH_INV, stag),
        (None, None) => (0, 0),
    };
    [
        wc.wr_id,
        u64::from(wc.opcode as u32 as u8)
            | u64::from(wc.status as u32 as u8) << 8
            | u64::from(flags as u8) << 16
            | u64::from(wc.byte_len) << 32,
        u64::from(wc.qp_num) | u64::from(extra) << 32,
        0,
    ]
}

/// Adds `wc` to a process's ring; `Err(())` if the ring is full (or its
/// consumer index is garbage). Returns whether the CQ was armed for it.
fn push_user(ring: &UserRing, prod: &mut u32, wc: &Wc, solicited: bool) -> core::result::Result<bool, ()> {
    let cons = ring.ctrl(Ctrl::Cons).load(Ordering::Acquire);
    if prod.wrapping_sub(cons) >= ring.entries() {
        return Err(());
    }
    ring.write(*prod, &cqe_words(wc));
    *prod = prod.wrapping_add(1);
    ring.ctrl(Ctrl::Prod).store(*prod, Ordering::Release);
    // Pairs with the process's fence between arming and polling again
    // (store then load on both sides): either it sees this completion or
    // this sees its arming.
    fence(Ordering::SeqCst);
    let notify = ring.ctrl(Ctrl::Notify);
    let want = notify.load(Ordering::Acquire);
    let hit = want & ffi::SIW_RS_NOTIFY_NEXT != 0
        || (want & ffi::SIW_RS_NOTIFY_SOLICITED != 0 && (solicited || wc.status != WcStatus::Success));
    Ok(hit && notify.swap(0, Ordering::AcqRel) != 0)
}

/// Adds `wc` to `cq`. A `solicited` completion (a Send with the SE bit) or
/// an error satisfies a CQ armed for solicited completions. Returns whether
/// the consumer must be woken: the caller does that with [`wake_all`] once it
/// holds no lock of its own, because the consumer's handler may post new
/// work requests right away.
pub(crate) fn push(cq: &Cq<SiwRs>, wc: Wc, solicited: bool) -> core::result::Result<bool, Overflow> {
    let mut guard = cq.data().ring.lock();
    let r = &mut *guard;
    let fired = if r.overflowed {
        Err(())
    } else {
        match &mut r.store {
            Store::Kernel { wcs, head, len, armed } => push_kernel(wcs, *head, len, armed, wc, solicited),
            Store::User { ring, prod } => push_user(ring, prod, &wc, solicited),
        }
    };
    fired.map_err(|()| {
        let first = !r.overflowed;
        r.overflowed = true;
        if let Store::User { ring, .. } = &r.store {
            ring.ctrl(Ctrl::Kflags).fetch_or(ffi::SIW_RS_KF_ERROR, Ordering::Release);
        }
        Overflow { first }
    })
}

/// Adds `wc` to a kernel ring; `Err(())` if it is full. Returns whether
/// the CQ was armed for it (and disarms it).
fn push_kernel(
    wcs: &mut KVVec<Wc>,
    head: usize,
    len: &mut usize,
    armed: &mut Option<Notify>,
    wc: Wc,
    solicited: bool,
) -> core::result::Result<bool, ()> {
    let cap = wcs.len();
    if *len >= cap {
        return Err(());
    }
    let mut idx = head + *len;
    if idx >= cap {
        idx -= cap;
    }
    if let Some(slot) = wcs.get_mut(idx) {
        *slot = wc;
    }
    *len += 1;
    let fire = match *armed {
        Some(Notify::Next) => true,
        Some(Notify::Solicited) => solicited || wc.status != WcStatus::Success,
        None => false,
    };
    if fire {
        *armed = None;
    }
    Ok(fire)
}

/// What several [`push`]es to one CQ asked for: both the handler call and
/// the overflow report, because a push that found the CQ armed disarmed
/// it, so its wake-up must survive a later push overflowing.
#[derive(Clone, Copy, Default)]
pub(crate) struct Pushed {
    notify: bool,
    overflow: bool,
}

impl Pushed {
    /// Adds one [`push`]'s result.
    pub(crate) fn add(&mut self, r: core::result::Result<bool, Overflow>) {
        match r {
            Ok(n) => self.notify |= n,
            Err(o) => self.overflow |= o.first,
        }
    }
}

/// Calls the consumer's completion handler if a push found the CQ armed,
/// and reports an overflow once (for the push that caused it).
pub(crate) fn wake_all(cq: &Cq<SiwRs>, p: Pushed) {
    if p.notify {
        cq.notify();
    }
    if p.overflow {
        cq.event(crate::verbs::AsyncEvent::CqErr);
    }
}

/// `poll_cq`: moves completions into `sink`, oldest first. A process
/// polls its own ring; for its CQ this finds nothing.
pub(crate) fn poll(cq: &Cq<SiwRs>, sink: &mut WcSink<'_>) {
    let mut r = cq.data().ring.lock();
    let Store::Kernel { wcs, head, len, .. } = &mut r.store else { return };
    while *len > 0 && sink.room() > 0 {
        let Some(wc) = wcs.get(*head).copied() else { break };
        sink.push(&wc);
        *head = if *head + 1 >= wcs.len() { 0 } else { *head + 1 };
        *len -= 1;
    }
}

/// `req_notify_cq`: arms the CQ. A request for the next completion of any
/// kind supersedes one for solicited completions. Returns whether
/// completions are waiting (for `IB_CQ_REPORT_MISSED_EVENTS`).
pub(crate) fn arm(cq: &Cq<SiwRs>, how: Notify, report_missed: bool) -> bool {
    let mut r = cq.data().ring.lock();
    match &mut r.store {
        Store::Kernel { armed, len, .. } => {
            *armed = match (*armed, how) {
                (Some(Notify::Next), _) | (_, Notify::Next) => Some(Notify::Next),
                _ => Some(Notify::Solicited),
            };
            report_missed && *len > 0
        }
        // A process arms its ring itself; the system call does the same.
        Store::User { ring, .. } => {
            let bit = match how {
                Notify::Next => ffi::SIW_RS_NOTIFY_NEXT,
                Notify::Solicited => ffi::SIW_RS_NOTIFY_SOLICITED,
            };
            ring.ctrl(Ctrl::Notify).fetch_or(bit, Ordering::AcqRel);
            false
        }
    }
}
