// SPDX-License-Identifier: GPL-2.0

//! The set of siw_rs devices, keyed by the net_device they are bound to.
//!
//! siw_rs registers with `RDMA_DRIVER_UNKNOWN` (see Documentation), so it
//! cannot find its devices through `ib_device_get_by_netdev` (which would
//! also match other drivers' devices) nor unregister them with
//! `ib_unregister_driver`. This table is the driver's own record.
//!
//! # Locking
//!
//! One mutex (defined in helpers.c) guards the table. It is never held while
//! calling into the RDMA core, because the core may call back into
//! `dealloc_driver`, which takes it. It nests inside RTNL (the netdev
//! notifier takes it).

use crate::{ffi, limits::MAX_DEVICES};
use core::{cell::UnsafeCell, ptr::NonNull};
use kernel::prelude::*;

/// One bound net_device and its device.
#[derive(Clone, Copy)]
pub(crate) struct Entry {
    /// The net_device, used as an identity only (never dereferenced here).
    pub(crate) netdev: usize,
    /// The device; `None` while `newlink` is still creating it.
    pub(crate) ib: Option<NonNull<ffi::ib_device>>,
}

struct Table(UnsafeCell<[Option<Entry>; MAX_DEVICES]>);

// SAFETY: the table is only accessed through `Guard`, which holds the mutex.
unsafe impl Sync for Table {}

static TABLE: Table = Table(UnsafeCell::new([None; MAX_DEVICES]));

/// Exclusive access to the table; the mutex is released on drop.
pub(crate) struct Guard(());

/// Locks the table.
pub(crate) fn lock() -> Guard {
    // SAFETY: a plain mutex_lock on a static mutex; may sleep.
    unsafe { ffi::siw_rs_h_registry_lock() };
    Guard(())
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: this guard holds the mutex.
        unsafe { ffi::siw_rs_h_registry_unlock() };
    }
}

// SAFETY: `Entry` only carries identities; the pointers are dereferenced by
// callers under the rules in `device.rs`.
unsafe impl Send for Entry {}

impl Guard {
    fn slots(&mut self) -> &mut [Option<Entry>; MAX_DEVICES] {
        // SAFETY: the mutex is held for the lifetime of `self`.
        unsafe { &mut *TABLE.0.get() }
    }

    /// The entry for `netdev`, if any.
    pub(crate) fn find(&mut self, netdev: usize) -> Option<Entry> {
        self.slots().iter().flatten().find(|e| e.netdev == netdev).copied()
    }

    /// Reserves the entry for `netdev` while its device is being created.
    pub(crate) fn reserve(&mut self, netdev: usize) -> Result {
        if self.find(netdev).is_some() {
            return Err(EEXIST);
        }
        let slot = self.slots().iter_mut().find(|s| s.is_none()).ok_or(ENOSPC)?;
        *slot = Some(Entry { netdev, ib: None });
        Ok(())
    }

    /// Records the device of a reserved entry.
    pub(crate) fn set_device(&mut self, netdev: usize, ib: NonNull<ffi::ib_device>) {
        for e in self.slots().iter_mut().flatten() {
            if e.netdev == netdev {
                e.ib = Some(ib);
            }
        }
    }

    /// Removes the entry of `netdev` if it still refers to `ib` (`None`: a
    /// reservation whose device was never recorded), so a late removal never
    /// takes away a newer entry for the same netdev.
    pub(crate) fn remove(&mut self, netdev: usize, ib: Option<NonNull<ffi::ib_device>>) {
        for slot in self.slots().iter_mut() {
            if matches!(slot, Some(e) if e.netdev == netdev && e.ib == ib) {
                *slot = None;
            }
        }
    }

    /// Any registered device.
    pub(crate) fn any_device(&mut self) -> Option<NonNull<ffi::ib_device>> {
        self.slots().iter().flatten().find_map(|e| e.ib)
    }
}
