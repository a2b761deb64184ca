// SPDX-License-Identifier: GPL-2.0

//! Access to consumer memory by kernel virtual address.
//!
//! siw_rs registers its devices for virtual DMA (no DMA device), so the
//! "DMA addresses" kernel consumers put into SGEs and fast-registration
//! page lists are kernel virtual addresses of memory the consumer keeps
//! valid while it is registered and in use by a work request. These two
//! functions are the only places the data path turns such an address into a
//! slice; every caller has first resolved it through a registered region
//! (`mem::Mem::check` and `translate`), which is the consumer's promise that
//! the memory exists.

/// Copies `data` to kernel virtual address `addr`.
///
/// # Safety
///
/// `addr..addr + data.len()` must be writable kernel memory of a registered
/// region resolved by `Mem::translate`, not concurrently accessed as Rust
/// data.
pub(crate) unsafe fn copy_to(addr: u64, data: &[u8]) {
    // SAFETY: by the requirements; the source is a separate buffer (an skb
    // or a local slice), so the ranges do not overlap.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len()) };
}

/// Borrows `len` bytes at kernel virtual address `addr`.
///
/// # Safety
///
/// As for [`copy_to`], readable, and valid for `'a`.
pub(crate) unsafe fn slice<'a>(addr: u64, len: usize) -> &'a [u8] {
    // SAFETY: by the requirements.
    unsafe { core::slice::from_raw_parts(addr as usize as *const u8, len) }
}

/// Runs `f` on the 64-bit word at kernel virtual address `addr` as one
/// atomic read-modify-write: `f` maps the current value to the new one
/// (it may run more than once under contention). Returns the value `f`
/// was finally applied to.
///
/// # Safety
///
/// `addr` must be 8-byte aligned, writable kernel memory of a registered
/// region resolved by `Mem::translate`, valid for the call, and not
/// accessed as non-atomic Rust data meanwhile.
pub(crate) unsafe fn update_u64(addr: u64, f: impl Fn(u64) -> u64) -> u64 {
    use core::sync::atomic::{AtomicU64, Ordering};
    // SAFETY: by the requirements: aligned, valid and only accessed
    // atomically for the lifetime of the reference (this call).
    let word = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
    let mut cur = word.load(Ordering::Acquire);
    loop {
        match word.compare_exchange_weak(cur, f(cur), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return cur,
            Err(v) => cur = v,
        }
    }
}
