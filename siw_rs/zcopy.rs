// SPDX-License-Identifier: GPL-2.0

//! Zero-copy transmit: notifications of the network stack's release of a
//! send's pages.
//!
//! A large Send, RDMA Write or Read Response from a registered region (a
//! process's or a kernel consumer's) is handed to the socket by reference
//! ([`crate::net::Socket::send_zcopy`]): the skbs point at the region's
//! pages instead of a copy (those the stack may reference), each holding
//! a page reference and a reference to the send's [`Note`] (a `struct
//! ubuf_info`). When the last
//! skb is freed (the data acknowledged by the peer, or copied by the stack
//! on the way, as a veth pair does), the note is released and
//! [`ZcTrack::released`] completes the work request, in order with the
//! rest of the send queue (a Read Response has none). The completion
//! therefore means what a consumer takes it to mean: the buffer may be
//! reused, nothing refers to it any more.
//!
//! A note can outlive its connection and its QP (un-acknowledged data of
//! a closed socket stays queued until TCP gives up on it): it holds only
//! the connection's [`ZcTrack`], whose link to the QP the teardown cuts
//! before the QP may go, and the module's exit waits for the last note
//! ([`Drain`]).
//!
//! Raw FFI with its `unsafe`: the note is handed to C, and comes back
//! through a C callback.

use crate::{conn::ZcTrack, ffi};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering};
use kernel::{prelude::*, sync::Arc, types::Opaque};

/// Notes not yet released, across the module.
static OUTSTANDING: AtomicUsize = AtomicUsize::new(0);

/// A note's memory. `ubuf` comes first: C hands back a pointer to it,
/// which is a pointer to the whole.
#[repr(C)]
struct NoteInner {
    ubuf: Opaque<ffi::ubuf_info>,
    track: Arc<ZcTrack>,
    seq: u64,
}

/// siw_rs's own reference to a zero-copy send's notification, held while
/// the send is being handed to the socket; dropping it lets the release
/// happen (at once if no skb holds the note).
pub(crate) struct Note(NonNull<NoteInner>);

// SAFETY: the note is reference counted by the network stack and freed
// only by the last release; this handle is one reference, usable from any
// thread.
unsafe impl Send for Note {}
// SAFETY: as above; `&Note` only reads the pointer.
unsafe impl Sync for Note {}

impl Note {
    /// A note for send `seq` of `track`'s connection; `None` without
    /// memory (the send is copied then).
    pub(crate) fn new(track: &Arc<ZcTrack>, seq: u64) -> Option<Note> {
        let b = KBox::new(NoteInner { ubuf: Opaque::uninit(), track: track.clone(), seq }, GFP_NOWAIT).ok()?;
        let p = KBox::into_raw(b);
        OUTSTANDING.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `p` is a live allocation; `ubuf` is initialised here,
        // before C sees it, with the one reference this handle owns.
        unsafe { ffi::siw_rs_h_zc_init((*p).ubuf.get()) };
        NonNull::new(p).map(Note)
    }

    /// The `struct ubuf_info` to pass to the socket.
    pub(crate) fn ubuf(&self) -> *mut ffi::ubuf_info {
        // SAFETY: the note lives while this handle's reference does.
        unsafe { (*self.0.as_ptr()).ubuf.get() }
    }
}

impl Drop for Note {
    fn drop(&mut self) {
        // SAFETY: drops this handle's reference (the note may be released
        // and freed in the call; the handle is not used after it).
        unsafe { ffi::siw_rs_h_zc_put(self.ubuf()) };
    }
}

/// Called by C when the last reference to a note is gone (softirq or
/// process context).
///
/// # Safety
///
/// `u` is the `ubuf` of a note made by [`Note::new`], with no reference
/// left.
#[no_mangle]
pub(crate) unsafe extern "C" fn siw_rs_zc_released(u: *mut ffi::ubuf_info) {
    // SAFETY: by the requirements and `NoteInner`'s layout, `u` points at
    // a `NoteInner` from `KBox::into_raw` that nothing else refers to.
    let note = unsafe { KBox::from_raw(u.cast::<NoteInner>()) };
    note.track.released(note.seq);
    drop(note);
    OUTSTANDING.fetch_sub(1, Ordering::Release);
}

/// Waits on drop (module exit) until every note is released: the network
/// stack calls into this module until then.
pub(crate) struct Drain;

impl Drop for Drain {
    fn drop(&mut self) {
        let mut waited_ms = 0u32;
        while OUTSTANDING.load(Ordering::Acquire) > 0 {
            if waited_ms % 10_000 == 0 {
                pr_info!(
                    "waiting for the network stack to release {} zero-copy send(s)\n",
                    OUTSTANDING.load(Ordering::Relaxed)
                );
            }
            crate::wq::sleep_us(10_000);
            waited_ms = waited_ms.wrapping_add(10);
        }
        // The last release may still be returning (see helpers.c).
        // SAFETY: process context.
        unsafe { ffi::synchronize_rcu() };
    }
}
