// SPDX-License-Identifier: GPL-2.0

//! Memory regions and the STag table.
//!
//! An STag is `index << 8 | key`: the index names a slot of the device's
//! STag table, the key byte is chosen by the consumer at each fast
//! registration. Every remote access names an STag; it is allowed only if
//! the slot holds a valid region whose key matches, whose protection domain
//! is the QP's, whose access rights cover the operation and whose range
//! covers the bytes touched ([`Mem::check`]).
//!
//! Driver logic. The only `unsafe` is in the two copies made under a
//! region's lock once the access is checked: a small send's payload out of
//! the region ([`Mem::copy_out`]) and a received tagged piece into it
//! ([`Mem::place`]). The table is preallocated per device (no allocation
//! under its lock); lookups clone an `Arc`, so a region being deregistered
//! stays alive for operations that already hold it, but is marked invalid
//! first so no new access starts.

use crate::{
    kmem,
    limits::{MAX_FAST_REG_PAGES, MAX_MR},
    sync::{new_bh_spinlock, BhSpinLock},
    uverbs::Umem,
    verbs::Access,
};
use kernel::{prelude::*, sync::Arc};

/// Why an access to registered memory was refused. Each maps to one RFC
/// 5040/5041 TERMINATE code for remote accesses and to a completion status
/// for local ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AccessError {
    /// No such STag, or its key does not match.
    InvalidStag,
    /// The region is not valid (never registered, or invalidated).
    Invalidated,
    /// The STag belongs to another protection domain.
    WrongPd,
    /// The region does not grant the access.
    Rights,
    /// The bytes are outside the region (base or bounds violation).
    Bounds,
}

/// What a region covers.
enum Kind {
    /// All of kernel memory (`get_dma_mr`): addresses are kernel virtual.
    Dma,
    /// A fast-registration region: pages set by `map_mr_sg`, range and
    /// access set by the registration work request.
    Fast {
        /// Page addresses (kernel virtual); the first `npages` are in use.
        pages: KVVec<u64>,
        /// Pages set by the last `map_mr_sg`.
        npages: usize,
        /// First byte of the registered range.
        iova: u64,
        /// Registered length.
        len: u64,
        /// Page size of `pages`.
        page_size: u32,
    },
    /// A process's region (`reg_user_mr`): `len` bytes at `iova`, in the
    /// pinned pages of `umem` (one per `PAGE_SIZE`, the first holding
    /// `iova`'s page offset). Unpinned when the region's last reference
    /// goes.
    User { umem: Umem, iova: u64, len: u64 },
}

/// The pages and range a paged region resolves addresses with.
struct Paged<'a> {
    pages: &'a [u64],
    iova: u64,
    len: u64,
    page_size: u64,
}

impl Kind {
    fn paged(&self) -> Option<Paged<'_>> {
        match self {
            Kind::Dma => None,
            Kind::Fast { pages, npages, iova, len, page_size } => Some(Paged {
                pages: pages.get(..*npages).unwrap_or(&[]),
                iova: *iova,
                len: *len,
                page_size: u64::from(*page_size),
            }),
            Kind::User { umem, iova, len } => Some(Paged {
                pages: umem.pages(),
                iova: *iova,
                len: *len,
                page_size: kernel::page::PAGE_SIZE as u64,
            }),
        }
    }
}

struct State {
    key: u8,
    valid: bool,
    access: Access,
    kind: Kind,
}

/// A memory region.
#[pin_data]
pub(crate) struct Mem {
    /// The identity of its protection domain.
    pd: usize,
    /// The table index (the STag's upper 24 bits).
    index: u32,
    /// A process's region (pinned user pages), not a kernel consumer's.
    user: bool,
    #[pin]
    state: BhSpinLock<State>,
}

impl Mem {
    /// Whether the region is a process's: its pages are pinned, and the
    /// process may not change them while a request that sends them is
    /// outstanding. A kernel consumer's pages may change in flight (page
    /// cache under writeback has no stable-pages guarantee here).
    pub(crate) fn is_user(&self) -> bool {
        self.user
    }

    /// The STag as it is now (index and current key).
    pub(crate) fn stag(&self) -> u32 {
        let key = self.state.lock().key;
        self.index << 8 | u32::from(key)
    }

    /// Checks an access of `len` bytes at `addr` with `rights` through
    /// `stag` from protection domain `pd`.
    pub(crate) fn check(&self, stag: u32, pd: usize, addr: u64, len: u64, rights: u32) -> Result<(), AccessError> {
        self.check_locked(&self.state.lock(), stag, pd, addr, len, rights)
    }

    /// [`Mem::check`] under the region's lock.
    fn check_locked(&self, s: &State, stag: u32, pd: usize, addr: u64, len: u64, rights: u32) -> Result<(), AccessError> {
        if stag & 0xff != u32::from(s.key) {
            return Err(AccessError::InvalidStag);
        }
        if !s.valid {
            return Err(AccessError::Invalidated);
        }
        if pd != self.pd {
            return Err(AccessError::WrongPd);
        }
        if !s.access.allows(rights) {
            return Err(AccessError::Rights);
        }
        match s.kind.paged() {
            None => Ok(()),
            Some(p) => {
                let end = addr.checked_add(len).ok_or(AccessError::Bounds)?;
                let rend = p.iova.checked_add(p.len).ok_or(AccessError::Bounds)?;
                if addr < p.iova || end > rend {
                    Err(AccessError::Bounds)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The most ranges [`Mem::translate`] can produce for `len` bytes.
    pub(crate) fn max_ranges(&self, len: u64) -> usize {
        match self.state.lock().kind.paged() {
            None => 1,
            Some(p) => {
                let ps = p.page_size.max(1);
                usize::try_from(len.checked_div(ps).unwrap_or(0).saturating_add(2)).unwrap_or(usize::MAX)
            }
        }
    }

    /// Calls `f` with the kernel virtual address ranges that hold `len`
    /// bytes at `addr` (already checked with [`Mem::check`]), in order.
    /// Fails with `Bounds` if a range cannot be resolved.
    pub(crate) fn translate(&self, addr: u64, len: u64, f: impl FnMut(u64, usize)) -> Result<(), AccessError> {
        Self::translate_locked(&self.state.lock(), addr, len, f)
    }

    /// Checks an access as [`Mem::check`] does and copies the `dst.len()`
    /// bytes at `addr` into `dst`, in one hold of the region's lock (a
    /// small send's payload, copied as it is sent).
    pub(crate) fn copy_out(&self, stag: u32, pd: usize, addr: u64, rights: u32, dst: &mut [u8]) -> Result<(), AccessError> {
        let s = self.state.lock();
        let len = dst.len() as u64;
        self.check_locked(&s, stag, pd, addr, len, rights)?;
        let mut off = 0usize;
        Self::translate_locked(&s, addr, len, |kva, n| {
            if let Some(d) = dst.get_mut(off..off.saturating_add(n)) {
                // SAFETY: `kva..kva + n` lies in the region, checked above
                // under the lock that keeps its page list in place: pinned
                // pages of a process's region, pages a kernel consumer
                // mapped, or (a DMA region) the consumer's own kernel
                // address, valid until its request completes (the verbs
                // contract).
                d.copy_from_slice(unsafe { kmem::slice(kva, n) });
            }
            off = off.saturating_add(n);
        })
    }

    /// Places `data` at `addr` for a tagged segment received through
    /// `stag` from protection domain `pd`, after checking the whole segment
    /// (`seg`: its first byte and length; `data` is a piece of it) as
    /// [`Mem::check`] does: one hold of the region's lock per piece. A
    /// refused check places nothing.
    pub(crate) fn place(
        &self,
        stag: u32,
        pd: usize,
        seg: (u64, u64),
        rights: u32,
        addr: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let s = self.state.lock();
        self.check_locked(&s, stag, pd, seg.0, seg.1, rights)?;
        // The piece lies inside the segment (the receiver hands out a
        // segment's payload in order); checked again, as a region's
        // bounds are.
        let end = addr.checked_add(data.len() as u64).ok_or(AccessError::Bounds)?;
        if addr < seg.0 || end > seg.0.saturating_add(seg.1) {
            return Err(AccessError::Bounds);
        }
        let mut off = 0usize;
        Self::translate_locked(&s, addr, data.len() as u64, |kva, n| {
            let part = data.get(off..off.saturating_add(n)).unwrap_or(&[]);
            // SAFETY: `kva..kva + n` lies in the region, checked above under
            // the lock that keeps its page list in place (pinned pages of a
            // process's region, pages a kernel consumer mapped, or, for a
            // DMA region, the consumer's own kernel memory it exposed for
            // remote access).
            unsafe { kmem::copy_to(kva, part) };
            off = off.saturating_add(n);
        })
    }

    /// [`Mem::translate`] under the region's lock.
    fn translate_locked(s: &State, addr: u64, len: u64, mut f: impl FnMut(u64, usize)) -> Result<(), AccessError> {
        match s.kind.paged() {
            None => {
                let n = usize::try_from(len).map_err(|_| AccessError::Bounds)?;
                f(addr, n);
                Ok(())
            }
            Some(Paged { pages, iova, page_size: ps, .. }) => {
                // A power of two (the RDMA core's page sizes are; anything
                // else could not be the mask below): a shift and a mask
                // then, not a 64-bit division per page on the data path.
                if !ps.is_power_of_two() {
                    return Err(AccessError::Bounds);
                }
                let shift = ps.trailing_zeros();
                // The first page starts at the page-aligned IOVA.
                let base = iova & !(ps - 1);
                let mut off = addr.checked_sub(base).ok_or(AccessError::Bounds)?;
                let mut left = len;
                while left > 0 {
                    let idx = usize::try_from(off >> shift).map_err(|_| AccessError::Bounds)?;
                    let in_page = off & (ps - 1);
                    let page = *pages.get(idx).ok_or(AccessError::Bounds)?;
                    let n = left.min(ps - in_page);
                    f(page + in_page, usize::try_from(n).map_err(|_| AccessError::Bounds)?);
                    off += n;
                    left -= n;
                }
                Ok(())
            }
        }
    }

    /// Starts a new page list (`map_mr_sg`).
    pub(crate) fn reset_pages(&self) {
        if let Kind::Fast { npages, .. } = &mut self.state.lock().kind {
            *npages = 0;
        }
    }

    /// Appends a page (`map_mr_sg`); `EINVAL` on a DMA region, `ENOMEM`
    /// beyond the size given at `alloc_mr`.
    pub(crate) fn add_page(&self, addr: u64) -> Result {
        match &mut self.state.lock().kind {
            Kind::Fast { pages, npages, .. } => {
                let slot = pages.get_mut(*npages).ok_or(ENOMEM)?;
                *slot = addr;
                *npages += 1;
                Ok(())
            }
            Kind::Dma | Kind::User { .. } => Err(EINVAL),
        }
    }

    /// Executes a fast registration (`IB_WR_REG_MR`): the region becomes
    /// valid for `[iova, iova + len)` with `access` and key byte `key`.
    pub(crate) fn register(&self, key: u8, access: Access, iova: u64, len: u64, page_size: u32) -> Result<(), AccessError> {
        let mut s = self.state.lock();
        if s.valid {
            // Registering a valid region is an error (RFC 5040 / verbs).
            return Err(AccessError::Invalidated);
        }
        match &mut s.kind {
            Kind::Fast { npages, iova: i, len: l, page_size: p, .. } => {
                let need = u64::try_from(*npages).unwrap_or(u64::MAX).saturating_mul(u64::from(page_size));
                // Page sizes are powers of two (as the RDMA core's are):
                // the translation shifts and masks by it.
                if !page_size.is_power_of_two() || len > need {
                    return Err(AccessError::Bounds);
                }
                *i = iova;
                *l = len;
                *p = page_size;
            }
            Kind::Dma | Kind::User { .. } => return Err(AccessError::InvalidStag),
        }
        s.key = key;
        s.access = access;
        s.valid = true;
        Ok(())
    }

    /// Invalidates the region (local or remote invalidation, or
    /// deregistration). `Err` if the key does not match.
    pub(crate) fn invalidate(&self, stag: u32) -> Result<(), AccessError> {
        let mut s = self.state.lock();
        if stag & 0xff != u32::from(s.key) {
            return Err(AccessError::InvalidStag);
        }
        s.valid = false;
        Ok(())
    }

    /// Invalidation by the peer (a Send with Invalidate) arriving on a
    /// QP of protection domain `pd`: only a fast-registered region of that
    /// domain may be invalidated that way (RFC 5040 section 6.10).
    pub(crate) fn remote_invalidate(&self, stag: u32, pd: usize) -> Result<(), AccessError> {
        let mut s = self.state.lock();
        if stag & 0xff != u32::from(s.key) {
            return Err(AccessError::InvalidStag);
        }
        if self.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !matches!(s.kind, Kind::Fast { .. }) {
            return Err(AccessError::Rights);
        }
        s.valid = false;
        Ok(())
    }

    fn invalidate_any(&self) {
        self.state.lock().valid = false;
    }
}

/// A device's STag table.
pub(crate) struct StagTable {
    slots: KVVec<Option<Arc<Mem>>>,
    /// A stack of free indices; the first `nfree` entries are valid.
    free: KVVec<u32>,
    nfree: usize,
}

impl StagTable {
    fn take_free(&mut self) -> Option<u32> {
        let n = self.nfree.checked_sub(1)?;
        let i = *self.free.get(n)?;
        self.nfree = n;
        Some(i)
    }

    fn put_free(&mut self, index: u32) {
        if let Some(slot) = self.free.get_mut(self.nfree) {
            *slot = index;
            self.nfree += 1;
        }
    }
}

/// The table behind its lock (one per device). It and a region's state
/// lock disable bottom halves, not interrupts: they are taken in process
/// context (verbs, transmit) and softirq context (receive), never with
/// interrupts off, and no verb a consumer may call from hard interrupt
/// context (posting, polling) touches them. Under TCG every interrupt
/// re-enable ends the emulator's translated block, a measurable part of a
/// small message's round trip.
pub(crate) type Stags = BhSpinLock<StagTable>;

/// Creates the table with room for `limits::MAX_MR` regions.
pub(crate) fn new_table() -> Result<Arc<Stags>> {
    let n = usize::try_from(MAX_MR).map_err(|_| EINVAL)?;
    let slots = KVVec::from_elem(None, n, GFP_KERNEL)?;
    let mut free = KVVec::with_capacity(n, GFP_KERNEL)?;
    // Index 0 is never used: STag 0 is reserved. Lowest indices first.
    for i in (1..MAX_MR).rev() {
        free.push(i, GFP_KERNEL)?;
    }
    let nfree = free.len();
    free.push(0, GFP_KERNEL)?;
    Arc::pin_init(new_bh_spinlock!(StagTable { slots, free, nfree }, "siw_rs_stags"), GFP_KERNEL)
}

/// How to create a region.
pub(crate) enum NewMem {
    /// A DMA region with the given access, valid at once.
    Dma(Access),
    /// A fast-registration region with room for that many pages.
    Fast(u32),
    /// A user region (`reg_user_mr`): `len` bytes at `iova`, which has the
    /// same offset in its page as the pinned memory's first byte, valid at
    /// once with `access`.
    User { umem: Umem, iova: u64, len: u64, access: Access },
}

/// Creates a region in `pd` and enters it in `table`.
pub(crate) fn create(table: &Stags, pd: usize, how: NewMem) -> Result<Arc<Mem>> {
    let (valid, access, kind) = match how {
        NewMem::Dma(a) => (true, a, Kind::Dma),
        NewMem::User { umem, iova, len, access } => (true, access, Kind::User { umem, iova, len }),
        NewMem::Fast(n) => {
            if n == 0 || n > MAX_FAST_REG_PAGES {
                return Err(EINVAL);
            }
            let n = usize::try_from(n).map_err(|_| EINVAL)?;
            let pages = KVVec::from_elem(0u64, n, GFP_KERNEL)?;
            (false, Access::default(), Kind::Fast { pages, npages: 0, iova: 0, len: 0, page_size: 0 })
        }
    };
    // Reserve the slot first so a full table fails before allocating.
    let index = table.lock().take_free().ok_or(ENOMEM)?;
    let user = matches!(kind, Kind::User { .. });
    let state = State { key: 0, valid, access, kind };
    let mem = Arc::pin_init(
        pin_init!(Mem { pd, index, user, state <- new_bh_spinlock!(state, "siw_rs_mem") }),
        GFP_KERNEL,
    );
    let mut t = table.lock();
    match mem {
        Ok(mem) => {
            if let Some(slot) = usize::try_from(index).ok().and_then(|i| t.slots.get_mut(i)) {
                *slot = Some(mem.clone());
            }
            Ok(mem)
        }
        Err(e) => {
            t.put_free(index);
            Err(e)
        }
    }
}

/// Looks a region up by STag (the key is checked by [`Mem::check`]).
pub(crate) fn lookup(table: &Stags, stag: u32) -> Option<Arc<Mem>> {
    let index = usize::try_from(stag >> 8).ok()?;
    table.lock().slots.get(index).and_then(|s| s.clone())
}

/// Runs `f` on the region `stag` names, under the table's lock, without
/// taking and dropping a reference as [`lookup`] does (an atomic each,
/// with a lock that costs about what the table's does). For short
/// accesses only (bottom halves are off): a small send's payload, a received
/// tagged segment of up to 256 octets. `InvalidStag` if no region has
/// that index, as a failed [`lookup`] is reported.
pub(crate) fn with<R>(
    table: &Stags,
    stag: u32,
    f: impl FnOnce(&Mem) -> Result<R, AccessError>,
) -> Result<R, AccessError> {
    let index = usize::try_from(stag >> 8).map_err(|_| AccessError::InvalidStag)?;
    let t = table.lock();
    t.slots.get(index).and_then(|s| s.as_deref()).map_or(Err(AccessError::InvalidStag), f)
}

/// Removes a region from the table; operations holding it finish, new ones
/// no longer find it.
pub(crate) fn destroy(table: &Stags, mem: &Mem) {
    mem.invalidate_any();
    let old = {
        let mut t = table.lock();
        let old = usize::try_from(mem.index).ok().and_then(|i| t.slots.get_mut(i)).and_then(|s| s.take());
        if old.is_some() {
            t.put_free(mem.index);
        }
        old
    };
    // Dropped outside the lock: the last reference frees the page list,
    // which must not happen with interrupts disabled.
    drop(old);
}
