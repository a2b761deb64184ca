// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The per-queue lock.
//!
//! ibverbs applications post to one queue from several threads, and the
//! `ibv_wr_start` … `ibv_wr_complete` and `ibv_start_poll` … `ibv_end_poll`
//! APIs hold a queue across several calls into the provider, so besides a
//! scoped guard the lock offers a raw acquire/release pair. Critical
//! sections are a few hundred instructions, so it spins, yielding the CPU
//! when the holder was preempted.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A spinning lock around one queue's producer or consumer state.
pub struct QueueLock<T> {
    locked: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: the data is only reached while holding the lock (or through
// `&mut self`), so sharing the lock between threads shares T with mutual
// exclusion, which requires only T: Send.
unsafe impl<T: Send> Sync for QueueLock<T> {}

impl<T> QueueLock<T> {
    /// A new unlocked lock around `data`.
    pub fn new(data: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            data: UnsafeCell::new(data),
        }
    }

    /// Takes the lock until the guard is dropped.
    pub fn lock(&self) -> QueueGuard<'_, T> {
        self.acquire();
        QueueGuard { lock: self }
    }

    /// Takes the lock without a guard, for APIs that hold a queue across
    /// calls. Pair with [`QueueLock::release`].
    pub fn acquire(&self) {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Releases a lock taken with [`QueueLock::acquire`].
    ///
    /// # Safety
    /// The calling thread holds the lock (through `acquire`) and holds no
    /// reference obtained from [`QueueLock::held`].
    pub unsafe fn release(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// The data, while the lock is held through `acquire`.
    ///
    /// # Safety
    /// The calling thread holds the lock (through `acquire`) until the
    /// returned reference is dropped, and holds no other reference to the
    /// data.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn held(&self) -> &mut T {
        // SAFETY: the caller holds the lock, so no other thread accesses
        // the data, and promises no other reference exists in this one.
        unsafe { &mut *self.data.get() }
    }
}

/// Access to the data of a [`QueueLock`] while it is held.
pub struct QueueGuard<'a, T> {
    lock: &'a QueueLock<T>,
}

impl<T> Deref for QueueGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for QueueGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock and `&mut self` is unique.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for QueueGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the guard took the lock and its data borrows end here.
        unsafe { self.lock.release() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn mutual_exclusion() {
        let l = Arc::new(QueueLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 40_000);
    }

    #[test]
    fn raw_acquire_release() {
        let l = QueueLock::new(1);
        l.acquire();
        // SAFETY: held through acquire just above.
        unsafe {
            *l.held() += 1;
            l.release();
        }
        assert_eq!(*l.lock(), 2);
    }
}
