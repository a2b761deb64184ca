// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The rings shared with the kernel (see `uapi/siw_rs-abi.h`).
//!
//! A ring mapping is a `struct siw_rs_ring_ctrl` followed, at
//! `SIW_RS_RING_ENTRIES_OFFSET`, by 2^n entries. Indices are free-running
//! `u32` counters. This module owns the mapping and is the only place that
//! touches the shared memory:
//!
//! - control words are accessed only as [`AtomicU32`];
//! - the producer writes an entry with a volatile write, then publishes it
//!   with a release store of `prod`;
//! - the consumer loads `prod` with acquire, reads entries with volatile
//!   reads, then releases the slots with a release store of `cons`;
//! - the send-queue doorbell check is a full fence after the `prod` store
//!   followed by a load of `kflags` (the kernel does the mirror image).
//!
//! Nothing read from the ring is trusted: a garbage index from the kernel
//! yields an error or a full ring, never an access outside the mapping.

use std::io;
use std::marker::PhantomData;
use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};

use crate::abi::{RingGeometry, RING_ENTRIES_OFFSET};
use crate::sys;

/// The memory behind a ring.
struct RingMem {
    base: NonNull<u8>,
    len: usize,
    backing: Backing,
}

enum Backing {
    /// An mmap of the uverbs fd, unmapped on drop.
    Mmap,
    /// Heap memory standing in for the kernel's (tests).
    #[cfg(test)]
    Heap(#[allow(dead_code)] Box<[u64]>),
    /// A second view of another ring's memory, playing the kernel (tests).
    #[cfg(test)]
    Alias,
}

impl RingMem {
    fn map(fd: i32, geo: &RingGeometry) -> io::Result<Self> {
        let offset = libc::off_t::try_from(geo.key)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a fresh shared mapping chosen by the kernel (addr NULL);
        // no existing memory is affected. The result is checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                geo.bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(p.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        Ok(Self {
            base,
            len: geo.bytes,
            backing: Backing::Mmap,
        })
    }

    #[cfg(test)]
    fn heap(len: usize) -> Self {
        let mut heap = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        let base = NonNull::new(heap.as_mut_ptr().cast()).unwrap();
        Self {
            base,
            len,
            backing: Backing::Heap(heap),
        }
    }
}

impl Drop for RingMem {
    fn drop(&mut self) {
        if matches!(self.backing, Backing::Mmap) {
            // SAFETY: base/len are exactly the mapping made in `map`, and no
            // reference into it outlives the RingMem (Ring hands out
            // references bound to &self only).
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        }
    }
}

/// A ring of entries of type `E` shared with the kernel.
pub struct Ring<E> {
    mem: RingMem,
    mask: u32,
    _entry: PhantomData<E>,
}

// SAFETY: the control words are only accessed atomically; entries are read
// with volatile reads (racing only with the kernel, outside the Rust memory
// model) and written only through `Producer`, which `&mut` makes unique.
unsafe impl<E: Send> Send for Ring<E> {}
// SAFETY: as above; no `&self` method writes an entry.
unsafe impl<E: Send> Sync for Ring<E> {}

/// The kernel's indices are inconsistent (more entries than the ring holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingCorrupt;

/// No free slot in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFull;

impl<E: Copy> Ring<E> {
    /// Maps the ring described by `geo` from the uverbs fd `fd`.
    pub fn map(fd: i32, geo: &RingGeometry) -> io::Result<Self> {
        debug_assert!(geo.bytes >= RING_ENTRIES_OFFSET + geo.entries as usize * size_of::<E>());
        Ok(Self::with_mem(RingMem::map(fd, geo)?, geo.entries))
    }

    /// A zero-filled ring in heap memory, standing in for a kernel mapping.
    #[cfg(test)]
    pub fn fake(entries: u32) -> Self {
        assert!(entries.is_power_of_two());
        let len = RING_ENTRIES_OFFSET + entries as usize * size_of::<E>();
        Self::with_mem(RingMem::heap(len), entries)
    }

    /// A view of this ring's memory for a test thread playing the kernel.
    /// The view must not outlive `self`.
    #[cfg(test)]
    pub fn kernel_view(&self) -> Self {
        let mem = RingMem {
            base: self.mem.base,
            len: self.mem.len,
            backing: Backing::Alias,
        };
        Self::with_mem(mem, self.entries())
    }

    fn with_mem(mem: RingMem, entries: u32) -> Self {
        assert!(std::mem::align_of::<E>() <= 8);
        assert!(mem.len >= RING_ENTRIES_OFFSET + entries as usize * size_of::<E>());
        Self {
            mem,
            mask: entries - 1,
            _entry: PhantomData,
        }
    }

    /// Number of entries.
    pub fn entries(&self) -> u32 {
        self.mask + 1
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: `offset` is a field offset inside siw_rs_ring_ctrl, which
        // lies within the mapping (abi.rs asserts it fits before the
        // entries), and is 4-aligned in page-aligned (or u64-aligned heap)
        // memory. The word is shared with the kernel, so it is only ever
        // accessed atomically; the reference lives no longer than `self`.
        unsafe { AtomicU32::from_ptr(self.mem.base.as_ptr().add(offset).cast()) }
    }

    /// The producer index (written by the producer only).
    pub fn prod(&self) -> &AtomicU32 {
        self.word(offset_of!(sys::siw_rs_ring_ctrl, prod))
    }

    /// The consumer index (written by the consumer only).
    pub fn cons(&self) -> &AtomicU32 {
        self.word(offset_of!(sys::siw_rs_ring_ctrl, cons))
    }

    /// `SIW_RS_KF_*`, written by the kernel.
    pub fn kflags(&self) -> &AtomicU32 {
        self.word(offset_of!(sys::siw_rs_ring_ctrl, kflags))
    }

    /// CQ arming word (`SIW_RS_NOTIFY_*`).
    pub fn notify(&self) -> &AtomicU32 {
        self.word(offset_of!(sys::siw_rs_ring_ctrl, notify))
    }

    fn slot(&self, idx: u32) -> *mut E {
        let off = RING_ENTRIES_OFFSET + (idx & self.mask) as usize * size_of::<E>();
        // SAFETY: idx & mask < entries, and with_mem checked that all
        // entries lie inside the mapping; the pointer stays in bounds.
        unsafe { self.mem.base.as_ptr().add(off).cast() }
    }

    /// Copies the entry at index `idx` out of the ring.
    pub fn read(&self, idx: u32) -> E {
        // SAFETY: the slot is in bounds and aligned (see `slot`); E is a
        // plain C struct of integers, valid for any bit pattern.
        unsafe { self.slot(idx).read_volatile() }
    }

    /// Writes the entry at index `idx`. Only the queue's single producer
    /// may call this (`Producer` guarantees it with `&mut`; tests use it to
    /// play the kernel's part on a fake ring).
    fn write(&self, idx: u32, e: &E) {
        // SAFETY: in bounds and aligned (see `slot`); the caller is the only
        // writer of this ring's entries.
        unsafe { self.slot(idx).write_volatile(*e) }
    }

    /// Entries published by the producer and not yet consumed, given the
    /// consumer's index `cons`.
    pub fn available(&self, cons: u32) -> Result<u32, RingCorrupt> {
        let n = self.prod().load(Ordering::Acquire).wrapping_sub(cons);
        if n > self.entries() {
            return Err(RingCorrupt);
        }
        Ok(n)
    }

    /// Gives consumed slots back to the producer.
    pub fn release(&self, cons: u32) {
        self.cons().store(cons, Ordering::Release);
    }

    /// Arms a completion queue: or-s `flags` into `notify`, then a full
    /// fence so that a later load of `prod` cannot be ordered before it
    /// (a completion the kernel writes after seeing the flag raises an
    /// event; one written before is seen by the next poll). This closes
    /// the race because the kernel, too, issues a full fence between its
    /// `prod` store and its `notify` load when it adds a completion (the
    /// ABI header states it; a release store followed by an acquire load
    /// would not order them).
    pub fn arm(&self, flags: u32) {
        self.notify().fetch_or(flags, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
}

/// The producer side of a ring: userspace for send and receive queues.
pub struct Producer<E> {
    ring: Ring<E>,
    /// Next index to write.
    prod: u32,
    /// Index last stored to `ctrl.prod`.
    published: u32,
}

impl<E: Copy> Producer<E> {
    /// Takes the producer role on `ring`, continuing from its `prod`.
    pub fn new(ring: Ring<E>) -> Self {
        let prod = ring.prod().load(Ordering::Relaxed);
        Self {
            ring,
            prod,
            published: prod,
        }
    }

    /// The ring.
    pub fn ring(&self) -> &Ring<E> {
        &self.ring
    }

    /// Free slots, counting entries written but not yet published as used.
    /// An impossible consumer index reads as a full ring.
    pub fn free_slots(&self) -> u32 {
        let used = self
            .prod
            .wrapping_sub(self.ring.cons().load(Ordering::Acquire));
        self.ring.entries().saturating_sub(used)
    }

    /// Writes `e` into the next slot without publishing it.
    pub fn push(&mut self, e: &E) -> Result<(), RingFull> {
        if self.free_slots() == 0 {
            return Err(RingFull);
        }
        self.ring.write(self.prod, e);
        self.prod = self.prod.wrapping_add(1);
        Ok(())
    }

    /// Entries written since the last publish.
    pub fn unpublished(&self) -> u32 {
        self.prod.wrapping_sub(self.published)
    }

    /// Forgets the entries written since the last publish.
    pub fn rollback(&mut self) {
        self.prod = self.published;
    }

    /// Makes the written entries visible to the kernel (release store).
    pub fn publish(&mut self) {
        self.ring.prod().store(self.prod, Ordering::Release);
        self.published = self.prod;
    }

    /// After `publish`: whether any of the `kflags` bits in `mask` is set,
    /// i.e. whether the doorbell system call is needed. The full fence
    /// orders the `prod` store before the `kflags` load (Dekker with the
    /// kernel's "set the flag, fence, re-read prod"): for `SQ_IDLE`, the
    /// kernel has stopped working on the queue; for `ERROR`, it flushes
    /// new entries only when rung.
    pub fn needs_doorbell(&self, mask: u32) -> bool {
        fence(Ordering::SeqCst);
        self.ring.kflags().load(Ordering::Relaxed) & mask != 0
    }

    /// Whether the kernel has put the queue in error.
    pub fn in_error(&self) -> bool {
        self.ring.kflags().load(Ordering::Acquire) & sys::SIW_RS_KF_ERROR != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Clone, Copy, Debug, PartialEq)]
    #[repr(C)]
    struct E {
        a: u64,
        b: u64,
    }

    /// Plays the kernel consumer: takes every published entry.
    fn kernel_consume(r: &Ring<E>, out: &mut Vec<E>) {
        let mut cons = r.cons().load(Ordering::Relaxed);
        let n = r.available(cons).unwrap();
        for _ in 0..n {
            out.push(r.read(cons));
            cons = cons.wrapping_add(1);
        }
        r.release(cons);
    }

    #[test]
    fn produce_publish_consume() {
        let mut p = Producer::new(Ring::<E>::fake(4));
        assert_eq!(p.free_slots(), 4);
        for i in 0..4 {
            p.push(&E { a: i, b: !i }).unwrap();
        }
        assert_eq!(p.push(&E { a: 9, b: 9 }), Err(RingFull));
        // Nothing visible before publish.
        assert_eq!(p.ring().available(0), Ok(0));
        p.publish();
        let mut got = vec![];
        kernel_consume(p.ring(), &mut got);
        assert_eq!(got.len(), 4);
        assert_eq!(got[3], E { a: 3, b: !3 });
        assert_eq!(p.free_slots(), 4);
    }

    #[test]
    fn wraps_around_u32() {
        let r = Ring::<E>::fake(2);
        r.prod().store(u32::MAX - 1, Ordering::Relaxed);
        r.cons().store(u32::MAX - 1, Ordering::Relaxed);
        let mut p = Producer::new(r);
        let mut got = vec![];
        for i in 0..10 {
            p.push(&E { a: i, b: 0 }).unwrap();
            p.publish();
            kernel_consume(p.ring(), &mut got);
        }
        assert_eq!(
            got.iter().map(|e| e.a).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        assert_eq!(p.ring().prod().load(Ordering::Relaxed), 8);
    }

    #[test]
    fn rollback_drops_unpublished() {
        let mut p = Producer::new(Ring::<E>::fake(4));
        p.push(&E { a: 1, b: 1 }).unwrap();
        p.publish();
        p.push(&E { a: 2, b: 2 }).unwrap();
        assert_eq!(p.unpublished(), 1);
        p.rollback();
        assert_eq!(p.unpublished(), 0);
        assert_eq!(p.free_slots(), 3);
        assert_eq!(p.ring().available(0), Ok(1));
    }

    #[test]
    fn garbage_indices_are_contained() {
        let r = Ring::<E>::fake(4);
        r.prod().store(100, Ordering::Relaxed);
        assert_eq!(r.available(0), Err(RingCorrupt));
        let p = Producer::new(Ring::<E>::fake(4));
        p.ring().cons().store(77, Ordering::Relaxed);
        assert_eq!(p.free_slots(), 0);
    }

    #[test]
    fn doorbell_and_error_flags() {
        let mut p = Producer::new(Ring::<E>::fake(4));
        p.push(&E { a: 1, b: 1 }).unwrap();
        p.publish();
        let both = sys::SIW_RS_KF_SQ_IDLE | sys::SIW_RS_KF_ERROR;
        assert!(!p.needs_doorbell(both));
        p.ring()
            .kflags()
            .store(sys::SIW_RS_KF_SQ_IDLE, Ordering::Relaxed);
        assert!(p.needs_doorbell(both));
        assert!(!p.needs_doorbell(sys::SIW_RS_KF_ERROR));
        assert!(!p.in_error());
        p.ring()
            .kflags()
            .store(sys::SIW_RS_KF_ERROR, Ordering::Relaxed);
        assert!(p.in_error());
        assert!(p.needs_doorbell(sys::SIW_RS_KF_ERROR));
    }

    #[test]
    fn arm_ors_flags() {
        let r = Ring::<E>::fake(2);
        r.arm(sys::SIW_RS_NOTIFY_SOLICITED);
        r.arm(sys::SIW_RS_NOTIFY_NEXT);
        assert_eq!(r.notify().load(Ordering::Relaxed), 3);
    }

    /// A kernel thread consuming while userspace produces: every entry
    /// arrives once, in order, intact.
    #[test]
    fn concurrent_producer_consumer() {
        const N: u64 = 20_000;
        let mut p = Producer::new(Ring::<E>::fake(8));
        // The view does not outlive `p`: the thread is joined below.
        let r = p.ring().kernel_view();
        let seen = Arc::new(AtomicU32::new(0));
        let seen2 = seen.clone();
        let t = std::thread::spawn(move || {
            let mut next = 0u64;
            let mut cons = 0u32;
            while next < N {
                let n = r.available(cons).unwrap();
                for _ in 0..n {
                    let e = r.read(cons);
                    assert_eq!(
                        e,
                        E {
                            a: next,
                            b: next * 3
                        }
                    );
                    next += 1;
                    cons = cons.wrapping_add(1);
                }
                r.release(cons);
                std::hint::spin_loop();
            }
            seen2.store(1, Ordering::Release);
        });
        let mut i = 0;
        while i < N {
            if p.push(&E { a: i, b: i * 3 }).is_ok() {
                i += 1;
                if i % 3 == 0 {
                    p.publish();
                }
            } else {
                p.publish();
                std::thread::yield_now();
            }
        }
        p.publish();
        t.join().unwrap();
        assert_eq!(seen.load(Ordering::Acquire), 1);
    }
}
