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
use kernel::{prelude::*, workqueue::Queue};

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
    queue(0)
}

/// The per-CPU transmit queue: a kick from the receive path runs on the CPU
/// that received.
pub(crate) fn tx() -> &'static Queue {
    queue(1)
}

/// The unbound transmit queue: a hand-off from a streaming process runs on
/// whichever CPU the scheduler finds idle.
pub(crate) fn tx_unbound() -> &'static Queue {
    queue(2)
}

/// Sleeps for about `us` microseconds (process context).
pub(crate) fn sleep_us(us: u32) {
    // SAFETY: a plain sleep; callers run in process context.
    unsafe { ffi::siw_rs_h_sleep_us(us) };
}
