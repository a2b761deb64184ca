// SPDX-License-Identifier: GPL-2.0

//! The module's own workqueues, and the short sleep that waits on their items.
//!
//! Every work item of a connection, a listener or a handshake runs on one of
//! these rather than on a system queue: module exit destroys them, which
//! waits for every queued and running item, after every device (and with it
//! every connection, listener and handshake that could queue one) is gone.
//! On a system queue the tail of an item (the return, the drop of its
//! reference) could still be running module code after the unload.

use crate::ffi;
use kernel::{
    prelude::*,
    workqueue::{Queue, RawWorkItem},
};

/// Owns the queues from module init; dropping it destroys them.
pub(crate) struct Queues(());

impl Queues {
    /// Allocates the queues (module init).
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: called once, at module init.
        kernel::error::to_result(unsafe { ffi::siw_rs_h_wq_init() })?;
        Ok(Queues(()))
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        // SAFETY: the queues were allocated by `new`; the module drops this
        // after unregistering every device, so nothing queues work any more.
        unsafe { ffi::siw_rs_h_wq_exit() };
    }
}

/// Indices of the module's queues in the C helper (`siw_rs_h_wq`).
const CM: u32 = 0;
const TX: u32 = 1;
const TX_HI: u32 = 2;

fn queue(which: u32) -> &'static Queue {
    // SAFETY: the queue exists from module init (`Queues::new`, before any
    // device and so before any caller) until module exit, which destroys it
    // only after every device, connection and listener is gone; callers
    // hold the reference no longer than the object that queues work.
    unsafe { Queue::from_raw(ffi::siw_rs_h_wq(which).cast()) }
}

/// The connection manager's queue: handshakes, accepts and teardowns, which
/// may block on the network for a while.
pub(crate) fn cm() -> &'static Queue {
    queue(CM)
}

/// The per-CPU transmit queue: a kick from the receive path runs on the CPU
/// that received.
pub(crate) fn tx() -> &'static Queue {
    queue(TX)
}

/// The per-CPU transmit queue whose workers run at high priority, for a
/// worker that carries on a process's own stream of work requests: after
/// the socket was full (the write-space callback), or beside a process
/// that streams small ones ([`enqueue_beside`]). A process that awaits
/// its completions busy-polls, often on the CPU the worker is woken on;
/// at the same priority the two take turns there, and the stream goes at
/// the worker's share of a CPU. (64 KiB Sends and 64 B Writes and Sends
/// went 1.4x-1.9x as fast this way on the two-vCPU bench; a Read
/// Response, kicked from the receive path, lost when its worker preempted
/// the requester at once, so those kicks stay on [`tx`].)
pub(crate) fn tx_hi() -> &'static Queue {
    queue(TX_HI)
}

/// Queues `w` on the high-priority transmit queue ([`tx_hi`]), to run on a
/// CPU other than the caller's (one of its neighbours, chosen by `hint`;
/// the caller's own when it is the only CPU). For a process that streams
/// small work requests: handing its transmit to a worker only gains if the
/// worker runs beside the process; on the process's own CPU it takes turns
/// with the posting. (An unbound worker is woken on an idle CPU when there
/// is one; with none, the scheduler often picks the waker's.)
pub(crate) fn enqueue_beside<W, const ID: u64>(hint: u32, w: W) -> W::EnqueueOutput
where
    W: RawWorkItem<ID> + Send + 'static,
{
    // SAFETY: a CPU choice, callable from any context.
    let cpu = unsafe { ffi::siw_rs_h_other_cpu(hint) };
    // SAFETY: the queue exists from module init to module exit (see
    // `queue`).
    let queue_ptr = unsafe { ffi::siw_rs_h_wq(TX_HI) }.cast::<kernel::bindings::workqueue_struct>();
    // SAFETY: as in `Queue::enqueue`, with a CPU instead of
    // `WORK_CPU_UNBOUND`: the closure returns false only if the work item is
    // already queued (what `queue_work_on` returns), `W` is `Send` and
    // `'static`, and `__enqueue` keeps the pointer valid for the closure's
    // call and, once queued, until the item runs.
    unsafe {
        w.__enqueue(move |work_ptr| kernel::bindings::queue_work_on(cpu, queue_ptr, work_ptr))
    }
}

/// Sleeps for about `us` microseconds (process context).
pub(crate) fn sleep_us(us: u32) {
    // SAFETY: a plain sleep; callers run in process context.
    unsafe { ffi::siw_rs_h_sleep_us(us) };
}
