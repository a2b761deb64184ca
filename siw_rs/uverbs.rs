// SPDX-License-Identifier: GPL-2.0

//! Safe wrappers for user verbs: rings shared with a process, pinned user
//! memory, command responses, and the ucontext/mmap callbacks.
//!
//! The ABI is `uapi/siw_rs-abi.h` (bindgen makes the `siw_rs_*` types of
//! [`ffi`] from it). A ring is `vmalloc_user` memory that the process maps
//! with mmap(2); the process can write any part of it at any time. So the
//! kernel never forms a Rust reference to ring memory: it reads and writes
//! it only through atomic operations on naturally aligned words
//! ([`UserRing`]), copies an entry out before looking at it, and keeps its
//! own indices. Garbage in a ring can therefore fail only the queue it is
//! in, never the kernel.

use crate::ffi;
use core::{
    mem::{offset_of, size_of},
    ptr::NonNull,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
};
use kernel::{build_assert, error::from_result, ffi::c_int, prelude::*, types::ForeignOwnable};

/// Offset of the entries from the start of a ring mapping.
const ENTRIES_OFFSET: usize = ffi::SIW_RS_RING_ENTRIES_OFFSET as usize;

// The layout the driver logic decodes by word offsets, checked against the
// one definition in the header (x86_64: little endian).
const _: () = {
    assert!(cfg!(target_endian = "little"));
    assert!(size_of::<ffi::siw_rs_ring_ctrl>() <= ENTRIES_OFFSET);
    assert!(size_of::<ffi::siw_rs_sqe>() == SQE_WORDS * 8);
    assert!(size_of::<ffi::siw_rs_rqe>() == RQE_WORDS * 8);
    assert!(size_of::<ffi::siw_rs_cqe>() == CQE_WORDS * 8);
    assert!(offset_of!(ffi::siw_rs_sqe, opcode) == 8);
    assert!(offset_of!(ffi::siw_rs_sqe, inline_len) == 12);
    assert!(offset_of!(ffi::siw_rs_sqe, remote_addr) == 16);
    assert!(offset_of!(ffi::siw_rs_sqe, rkey) == 24);
    assert!(offset_of!(ffi::siw_rs_sqe, imm_or_inv) == 28);
    assert!(offset_of!(ffi::siw_rs_sqe, atomic) == 32);
    assert!(offset_of!(ffi::siw_rs_sqe, __bindgen_anon_1) == 64);
    assert!(offset_of!(ffi::siw_rs_rqe, num_sge) == 8);
    assert!(offset_of!(ffi::siw_rs_rqe, sge) == 16);
    assert!(size_of::<ffi::siw_rs_sge>() == 16);
    assert!(offset_of!(ffi::siw_rs_cqe, byte_len) == 12);
    assert!(offset_of!(ffi::siw_rs_cqe, qp_num) == 16);
    assert!(offset_of!(ffi::siw_rs_cqe, imm_or_inv) == 20);
    assert!(offset_of!(ffi::siw_rs_ring_ctrl, cons) == 64);
    assert!(offset_of!(ffi::siw_rs_ring_ctrl, kflags) == 128);
    assert!(offset_of!(ffi::siw_rs_ring_ctrl, notify) == 132);
};

/// 64-bit words of a send queue entry.
pub(crate) const SQE_WORDS: usize = 40;
/// 64-bit words of a receive queue entry.
pub(crate) const RQE_WORDS: usize = 14;
/// 64-bit words of a completion queue entry.
pub(crate) const CQE_WORDS: usize = 4;

/// Which control word of a ring.
#[derive(Clone, Copy)]
pub(crate) enum Ctrl {
    /// The producer index.
    Prod,
    /// The consumer index.
    Cons,
    /// `SIW_RS_KF_*`, written by the kernel.
    Kflags,
    /// `SIW_RS_NOTIFY_*` (CQ), written by the process.
    Notify,
}

impl Ctrl {
    const fn offset(self) -> usize {
        match self {
            Ctrl::Prod => offset_of!(ffi::siw_rs_ring_ctrl, prod),
            Ctrl::Cons => offset_of!(ffi::siw_rs_ring_ctrl, cons),
            Ctrl::Kflags => offset_of!(ffi::siw_rs_ring_ctrl, kflags),
            Ctrl::Notify => offset_of!(ffi::siw_rs_ring_ctrl, notify),
        }
    }
}

/// A ring in memory shared with a process.
///
/// # Invariants
///
/// `base` points to `bytes` bytes of `vmalloc_user` memory, page aligned,
/// owned by the mmap `entry` of a ucontext; the memory stays allocated until
/// `entry` is removed (in `drop`) and its last user is gone. `entries` is a
/// power of two and `ENTRIES_OFFSET + entries * words * 8 <= bytes`.
pub(crate) struct UserRing {
    base: NonNull<u8>,
    entry: NonNull<ffi::rdma_user_mmap_entry>,
    bytes: usize,
    entries: u32,
    words: usize,
    key: u64,
}

// SAFETY: the ring memory is only accessed through atomics; the entry is
// removed once, by `drop`.
unsafe impl Send for UserRing {}
// SAFETY: as above: every access is atomic.
unsafe impl Sync for UserRing {}

impl UserRing {
    /// Allocates a ring of `entries` (a power of two) entries of `words`
    /// 64-bit words for `uctx` and makes it mappable.
    pub(crate) fn new(uctx: &Ucontext, entries: u32, words: usize) -> Result<Self> {
        if !entries.is_power_of_two() {
            return Err(EINVAL);
        }
        let bytes = usize::try_from(entries)
            .ok()
            .and_then(|n| n.checked_mul(words)?.checked_mul(8)?.checked_add(ENTRIES_OFFSET))
            .ok_or(EINVAL)?;
        let mut key = 0u64;
        let mut entry = core::ptr::null_mut();
        // SAFETY: `uctx` is a live ucontext; the out-pointers are valid.
        let base = unsafe { ffi::siw_rs_h_ring_alloc(uctx.0.as_ptr(), bytes, &mut key, &mut entry) };
        let base = NonNull::new(base.cast::<u8>()).ok_or(ENOMEM)?;
        let entry = NonNull::new(entry).ok_or(ENOMEM)?;
        Ok(UserRing { base, entry, bytes, entries, words, key })
    }

    /// The mmap offset userspace passes to mmap(2).
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// The length of the mapping.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes as u64
    }

    /// Number of entries (a power of two).
    pub(crate) fn entries(&self) -> u32 {
        self.entries
    }

    /// A control word.
    pub(crate) fn ctrl(&self, which: Ctrl) -> &AtomicU32 {
        // SAFETY: the offset is within the control block at the start of
        // the ring (by the invariants), 4-aligned (checked layout), and the
        // memory lives as long as `self`; it is only accessed atomically.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(which.offset()).cast::<u32>()) }
    }

    /// The words of entry `index` (modulo the ring size).
    ///
    /// One slice per entry, so a copy in or out is a loop of loads or
    /// stores: not a call and a bounds computation per word, which the
    /// send path paid for every word of every entry.
    #[inline]
    fn slot(&self, index: u32) -> &[AtomicU64] {
        let slot = (index & (self.entries - 1)) as usize;
        let off = ENTRIES_OFFSET + slot * self.words * 8;
        // SAFETY: `slot < entries`, so `off + words * 8 <= bytes`
        // (invariants); 8-aligned since the base is page aligned and the
        // offset a multiple of 8. `AtomicU64` has the layout of `u64`, the
        // memory lives as long as `self`, and it is only accessed
        // atomically (the process writes it concurrently).
        unsafe { core::slice::from_raw_parts(self.base.as_ptr().add(off).cast::<AtomicU64>(), self.words) }
    }

    /// Copies entry `index` into `out` (as many words as `out` holds).
    #[inline]
    pub(crate) fn read(&self, index: u32, out: &mut [u64]) {
        self.read_from(index, 0, out);
    }

    /// Copies words `first..` of entry `index` into `out`.
    #[inline]
    pub(crate) fn read_from(&self, index: u32, first: usize, out: &mut [u64]) {
        let words = self.slot(index).get(first..).unwrap_or(&[]);
        for (o, w) in out.iter_mut().zip(words) {
            *o = w.load(Ordering::Relaxed);
        }
    }

    /// Writes `words` into entry `index`.
    #[inline]
    pub(crate) fn write(&self, index: u32, words: &[u64]) {
        for (w, v) in self.slot(index).iter().zip(words) {
            w.store(*v, Ordering::Relaxed);
        }
    }
}

impl Drop for UserRing {
    fn drop(&mut self) {
        // SAFETY: the entry was inserted by `new` and is removed once; the
        // memory is not touched by `self` afterwards.
        unsafe { ffi::siw_rs_h_ring_remove(self.entry.as_ptr()) };
    }
}

/// A process's verbs context, as the driver needs it: where its rings are
/// mapped from, and its identity.
pub(crate) struct Ucontext(NonNull<ffi::ib_ucontext>);

/// The core's `ib_ucontext` followed by the driver's part (the core
/// allocates `size_ib_ucontext` octets, zeroed).
#[repr(C)]
struct UctxObj {
    ib: kernel::types::Opaque<ffi::ib_ucontext>,
    /// A number no other context of this module has had, given in
    /// `alloc_ucontext` (0 before).
    id: u64,
}

/// The next context's identity; never 0.
static NEXT_UCTX_ID: AtomicU64 = AtomicU64::new(1);

impl Ucontext {
    /// The context's identity: unique among every context this module has
    /// seen, so it still tells contexts apart after this one is freed and
    /// another takes its memory.
    pub(crate) fn id(&self) -> u64 {
        // SAFETY: every ucontext of a siw_rs device is a `UctxObj`
        // (`size_ib_ucontext`, set by `install`), live while the command
        // that gave `self` runs; `id` is written once, in
        // `alloc_ucontext_cb`, before the context is published.
        unsafe { (*self.0.as_ptr().cast::<UctxObj>()).id }
    }
}

/// A file made for the calling process but not yet visible to it: a
/// reserved file number and the file. [`NewFile::install`] hands both to
/// the process; dropping it instead gives the number back and drops the
/// file (whose release drops its private data).
///
/// # Invariants
///
/// `fd` is a number reserved in the process that made this, and `file` a
/// file holding one reference owned by this value, until `install` or drop.
pub(crate) struct NewFile {
    fd: c_int,
    file: NonNull<ffi::file>,
}

impl NewFile {
    /// Makes a doorbell file (see `helpers.c`) whose private data is
    /// `data`: the file owns it from here, and its release gives it to
    /// `crate::doorbell`'s release callback.
    pub(crate) fn doorbell<D: ForeignOwnable>(data: D) -> Result<Self> {
        let p = data.into_foreign();
        let mut file = core::ptr::null_mut();
        // SAFETY: `p` stays valid until the file's release (or, on error,
        // until it is taken back below); `file` is a valid out-pointer.
        let fd = unsafe { ffi::siw_rs_h_db_file_open(p.cast_mut(), &mut file) };
        match NonNull::new(file) {
            Some(file) if fd >= 0 => Ok(NewFile { fd, file }),
            _ => {
                // SAFETY: the helper failed, so it did not take `p`, which
                // came from `into_foreign` above and is reclaimed once.
                drop(unsafe { D::from_foreign(p) });
                Err(if fd < 0 { Error::from_errno(fd) } else { ENOMEM })
            }
        }
    }

    /// The reserved file number.
    pub(crate) fn fd(&self) -> c_int {
        self.fd
    }

    /// Makes the file visible to the process under [`NewFile::fd`].
    pub(crate) fn install(self) {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: by the invariants; `this` is not dropped, so the number
        // and the reference go to the process exactly once.
        unsafe { ffi::siw_rs_h_db_file_install(this.fd, this.file.as_ptr()) };
    }
}

impl Drop for NewFile {
    fn drop(&mut self) {
        // SAFETY: by the invariants; not installed, so both are still ours.
        unsafe { ffi::siw_rs_h_db_file_discard(self.fd, self.file.as_ptr()) };
    }
}

/// Driver data of a user command (`struct ib_udata`).
pub(crate) struct Udata(NonNull<ffi::ib_udata>);

impl Udata {
    /// Wraps the `udata` of a verb.
    ///
    /// # Safety
    ///
    /// `raw` must be null or the udata of a user command in progress, valid
    /// for the whole call of the verb.
    pub(crate) unsafe fn from_raw(raw: *mut ffi::ib_udata) -> Option<Self> {
        NonNull::new(raw).map(Udata)
    }

    /// The `udata` of a verb that receives a `uverbs_attr_bundle`.
    ///
    /// # Safety
    ///
    /// As for [`Udata::from_raw`], for the bundle.
    pub(crate) unsafe fn from_bundle(bundle: *mut ffi::uverbs_attr_bundle) -> Option<Self> {
        // SAFETY: by the requirements the bundle is null or valid.
        NonNull::new(unsafe { ffi::siw_rs_h_bundle_udata(bundle) }).map(Udata)
    }

    /// The process context the command runs in.
    pub(crate) fn ucontext(&self) -> Result<Ucontext> {
        // SAFETY: a user command's udata belongs to a bundle with a context.
        NonNull::new(unsafe { ffi::siw_rs_h_udata_ucontext(self.0.as_ptr()) }).map(Ucontext).ok_or(EINVAL)
    }

    /// Copies the response `resp` to the process; `EINVAL` if it has no
    /// room for all of it.
    pub(crate) fn respond<R: Copy>(&self, resp: &R) -> Result {
        // SAFETY: `resp` is readable for its size; the udata is valid.
        let rv = unsafe {
            ffi::siw_rs_h_copy_to_udata(self.0.as_ptr(), core::ptr::from_ref(resp).cast(), size_of::<R>())
        };
        kernel::error::to_result(rv)
    }
}

/// Pinned user memory (`ib_umem`) and the kernel virtual address of each of
/// its pages. Dropping it unpins the pages and frees the page array from a
/// work item, so the last reference may go in any context (even under an
/// interrupt-safe lock).
///
/// # Invariants
///
/// `0` is a holder from `siw_rs_h_umem_get`, released only by `drop`; its
/// page array does not change until then.
pub(crate) struct Umem(NonNull<ffi::siw_rs_umem>);

// SAFETY: the holder is used by one owner at a time; release is deferred.
unsafe impl Send for Umem {}
// SAFETY: `&Umem` allows only reading the page list.
unsafe impl Sync for Umem {}

impl Umem {
    /// Pins `len` bytes at user address `start` of the current process.
    pub(crate) fn get(dev: *mut ffi::ib_device, start: u64, len: u64, access: c_int) -> Result<Self> {
        // SAFETY: `dev` is the live device of the verb being executed.
        let p = unsafe { ffi::siw_rs_h_umem_get(dev, start, len, access) };
        // The helper returns a valid pointer or an error pointer.
        let p = kernel::error::from_err_ptr(p)?;
        NonNull::new(p).map(Umem).ok_or(ENOMEM)
    }

    /// The kernel virtual address of each pinned page, in order (the first
    /// is the page of the region's first byte).
    pub(crate) fn pages(&self) -> &[u64] {
        let mut n = 0usize;
        // SAFETY: `self.0` is a live holder (invariant).
        let p = unsafe { ffi::siw_rs_h_umem_pages(self.0.as_ptr(), &mut n) };
        if p.is_null() || n == 0 {
            return &[];
        }
        // SAFETY: the array has `n` entries and is neither written nor freed
        // while `self` lives (invariant).
        unsafe { core::slice::from_raw_parts(p, n) }
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: the holder is released once; it owns itself from here.
        unsafe { ffi::siw_rs_h_umem_put(self.0.as_ptr()) };
    }
}

/// Starts the deferred release of pinned memory (module init).
pub(crate) fn init() -> Result {
    // SAFETY: called once at module init.
    kernel::error::to_result(unsafe { ffi::siw_rs_h_umem_init() })
}

/// Drains the deferred releases (module exit, after every device is gone).
pub(crate) fn exit() {
    // SAFETY: called once at module exit, after `init` succeeded.
    unsafe { ffi::siw_rs_h_umem_exit() };
}

/// The user-context half of a driver.
pub(crate) trait UserVerbs: crate::ib::Driver {
    /// A process opened a context on `dev`: write the driver's response.
    /// `uctx` has its identity already.
    fn alloc_ucontext(dev: &crate::ib::Device<Self>, uctx: &Ucontext, udata: &Udata) -> Result;
}

/// Installs the ucontext, mmap and sysfs parts of the device ops.
pub(crate) fn install<T: UserVerbs>(ops: &mut ffi::ib_device_ops) {
    ops.alloc_ucontext = Some(alloc_ucontext_cb::<T>);
    ops.dealloc_ucontext = Some(dealloc_ucontext_cb);
    ops.disassociate_ucontext = Some(disassociate_ucontext_cb);
    ops.mmap = Some(ffi::siw_rs_h_mmap);
    ops.mmap_free = Some(ffi::siw_rs_h_mmap_free);
    ops.size_ib_ucontext = size_of::<UctxObj>();
    // The core allocates it with kzalloc, which aligns to at least 8.
    build_assert!(core::mem::align_of::<UctxObj>() <= 8);
    // A static of the C helper object, never written.
    ops.device_group = &raw const ffi::siw_rs_h_attr_group;
}

unsafe extern "C" fn alloc_ucontext_cb<T: UserVerbs>(uctx: *mut ffi::ib_ucontext, udata: *mut ffi::ib_udata) -> c_int {
    from_result(|| {
        let uctx = NonNull::new(uctx).ok_or(EINVAL)?;
        // SAFETY: the core passes a fresh context of `size_ib_ucontext`
        // octets (a `UctxObj`), not yet visible to anyone else.
        unsafe { (*uctx.as_ptr().cast::<UctxObj>()).id = NEXT_UCTX_ID.fetch_add(1, Ordering::Relaxed) };
        // SAFETY: the core passes the command's udata.
        let udata = unsafe { Udata::from_raw(udata) }.ok_or(EINVAL)?;
        // SAFETY: the core set `device` before calling the driver; the
        // device is one of `T`'s and outlives its contexts.
        let dev = unsafe { crate::ib::Device::<T>::from_raw((*uctx.as_ptr()).device) };
        T::alloc_ucontext(dev, &Ucontext(uctx), &udata)?;
        Ok(0)
    })
}

unsafe extern "C" fn dealloc_ucontext_cb(_uctx: *mut ffi::ib_ucontext) {}

/// A device going away (`rdma link del`, its netdev deleted, the module
/// unloading) ends the contexts that processes still hold on it, rather
/// than waiting for the processes to close them: with this op present,
/// ib_uverbs destroys every object of such a context (so their ordinary
/// destroy callbacks run), then calls this, then `dealloc_ucontext`, and
/// the process gets `EIO` from every later command.
///
/// Nothing is left for this op to do:
/// - the rings are `vmalloc_user` pages mapped with `remap_vmalloc_range`,
///   which holds a reference on each page for the mapping: freeing a ring
///   leaves the process's mapping on pages that stay allocated until it
///   unmaps them, and nothing in the kernel reads them any more;
/// - the context's doorbell file refers to the device's QP table, from
///   which its QPs are gone, so it rings nothing (the provider then falls
///   back to the command file, which fails with `EIO`);
/// - pinned memory is released with its region's destroy callback.
///
/// Without the op, ib_uverbs also pins the driver's module for each open
/// file; the doorbell file, whose operations are the module's, still
/// pins it (see [`crate::doorbell`]).
unsafe extern "C" fn disassociate_ucontext_cb(_uctx: *mut ffi::ib_ucontext) {}
