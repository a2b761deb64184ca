// SPDX-License-Identifier: GPL-2.0

//! Safe wrappers over the iWARP connection manager's interface to drivers:
//! `struct iw_cm_id` (with its reference counting), the events a driver
//! delivers, the connection parameters it receives, and the `iw_*` device
//! callbacks.
//!
//! # Invariants
//!
//! A [`CmId`] holds one reference on its `iw_cm_id` (taken with the id's
//! `add_ref`, dropped with `rem_ref`), which keeps the id alive. The `iw_*`
//! callbacks are only called by the iWARP CM with live ids of this device.

use crate::{
    ffi,
    ib::Device,
    net::SockAddr,
    verbs::{Qp, Verbs},
};
use core::ptr::{self, NonNull};
use kernel::{
    error::from_result,
    ffi::{c_int, c_void},
    prelude::*,
};

/// A counted reference on an `iw_cm_id`.
pub(crate) struct CmId {
    id: NonNull<ffi::iw_cm_id>,
}

// SAFETY: the iWARP CM synchronises its ids internally; we only call its
// handler and reference functions, which may be called from any context.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl CmId {
    /// Takes a reference on `raw`.
    ///
    /// # Safety
    ///
    /// `raw` must be a live `iw_cm_id`.
    unsafe fn get(raw: *mut ffi::iw_cm_id) -> Result<Self> {
        let id = NonNull::new(raw).ok_or(EINVAL)?;
        // SAFETY: by the requirements; `add_ref` is set by the iWARP CM.
        if let Some(add) = unsafe { (*raw).add_ref } {
            // SAFETY: the CM's own reference function on its own id.
            unsafe { add(raw) };
        }
        Ok(CmId { id })
    }

    fn raw(&self) -> *mut ffi::iw_cm_id {
        self.id.as_ptr()
    }

    /// The local address the consumer asked for.
    pub(crate) fn local_addr(&self) -> SockAddr {
        // SAFETY: the id is live (we hold a reference); a plain copy.
        SockAddr(unsafe { (*self.raw()).local_addr })
    }

    /// Whether the consumer asked for its address family only
    /// (`rdma_set_afonly`): an IPv6 address then does not take IPv4 as
    /// well, and an IPv4 listener on the same port can coexist.
    pub(crate) fn afonly(&self) -> bool {
        // SAFETY: the id is live (we hold a reference); a plain read of a
        // flag the RDMA CM sets before it calls the driver.
        unsafe { (*self.raw()).afonly() }
    }

    /// The remote address the consumer asked for.
    pub(crate) fn remote_addr(&self) -> SockAddr {
        // SAFETY: as in `local_addr`.
        SockAddr(unsafe { (*self.raw()).remote_addr })
    }

    /// Stores the driver's per-id token (read back with [`Self::provider_data`]).
    pub(crate) fn set_provider_data(&self, v: usize) {
        // SAFETY: the driver owns `provider_data`.
        unsafe { (*self.raw()).provider_data = v as *mut c_void };
    }

    /// The driver's per-id token.
    pub(crate) fn provider_data(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*self.raw()).provider_data as usize }
    }

    /// Delivers `ev` to the connection manager; returns its verdict (non-zero
    /// means the CM refuses, e.g. a connect request it could not queue).
    pub(crate) fn deliver(&self, ev: &CmEvent<'_>) -> c_int {
        let mut e = ffi::iw_cm_event {
            event: ev.kind as ffi::iw_cm_event_type,
            status: ev.status,
            local_addr: ev.local.0,
            remote_addr: ev.remote.0,
            private_data: ev.private_data.as_ptr().cast_mut().cast(),
            provider_data: ev.provider_data as *mut c_void,
            private_data_len: u8::try_from(ev.private_data.len()).unwrap_or(0),
            ord: ev.ord,
            ird: ev.ird,
        };
        if e.private_data_len == 0 {
            e.private_data = ptr::null_mut();
        }
        pr_debug!("event {:?} status {} on id {:x}\n", ev.kind, ev.status, self.addr());
        // SAFETY: the id is live; the CM copies what it keeps of the event
        // (private data included) before returning.
        match unsafe { (*self.raw()).event_handler } {
            // SAFETY: the CM's handler for its own id.
            Some(h) => unsafe { h(self.raw(), &mut e) },
            None => EINVAL.to_errno(),
        }
    }

    /// Identity of the id (for logs and comparisons).
    pub(crate) fn addr(&self) -> usize {
        self.raw() as usize
    }
}

impl Clone for CmId {
    fn clone(&self) -> Self {
        // SAFETY: we hold a reference, so the id is live.
        if let Some(add) = unsafe { (*self.raw()).add_ref } {
            // SAFETY: the CM's own reference function on its own id.
            unsafe { add(self.raw()) };
        }
        CmId { id: self.id }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: releases the reference taken by `get`.
        if let Some(rem) = unsafe { (*self.raw()).rem_ref } {
            // SAFETY: the CM's own reference function on its own id.
            unsafe { rem(self.raw()) };
        }
    }
}

/// Events a driver reports on an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum CmEventKind {
    /// A connection request arrived on a listening id.
    ConnectRequest = ffi::IW_CM_EVENT_CONNECT_REQUEST,
    /// The outcome of `iw_connect` (status 0 or an errno).
    ConnectReply = ffi::IW_CM_EVENT_CONNECT_REPLY,
    /// `iw_accept` completed.
    Established = ffi::IW_CM_EVENT_ESTABLISHED,
    /// The peer started an orderly close.
    Disconnect = ffi::IW_CM_EVENT_DISCONNECT,
    /// The connection is gone.
    Close = ffi::IW_CM_EVENT_CLOSE,
}

/// One event with its parameters.
pub(crate) struct CmEvent<'a> {
    pub(crate) kind: CmEventKind,
    /// 0 or a negative errno.
    pub(crate) status: i32,
    pub(crate) local: SockAddr,
    pub(crate) remote: SockAddr,
    pub(crate) private_data: &'a [u8],
    /// For a connect request: the token the CM stores in the child id.
    pub(crate) provider_data: usize,
    pub(crate) ird: u8,
    pub(crate) ord: u8,
}

/// `struct iw_cm_conn_param`, decoded.
pub(crate) struct ConnParam<'a> {
    pub(crate) private_data: &'a [u8],
    pub(crate) ird: u32,
    pub(crate) ord: u32,
    pub(crate) qpn: u32,
}

/// The connection-manager callbacks of a driver.
pub(crate) trait IwCm: Verbs {
    /// Starts an active connection for `id` on QP `qp`.
    fn connect(id: CmId, qp: &Qp<Self>, p: &ConnParam<'_>) -> Result;
    /// Accepts the connection request behind `id` on QP `qp`.
    fn accept(id: CmId, qp: &Qp<Self>, p: &ConnParam<'_>) -> Result;
    /// Rejects the connection request behind `id`, a child id of `dev`.
    fn reject(dev: &Device<Self>, id: CmId, private_data: &[u8]) -> Result;
    /// Starts listening on `id`'s local address.
    fn create_listen(dev: &Device<Self>, id: CmId, backlog: i32) -> Result;
    /// Stops listening on `id` (synchronously: no event after return).
    fn destroy_listen(dev: &Device<Self>, id: CmId) -> Result;
    /// The QP with number `qpn`, if any (the driver's own lookup, for a
    /// QP the CM already holds a reference on).
    fn get_qp(dev: &Device<Self>, qpn: u32) -> Option<NonNull<ffi::ib_qp>>;
    /// `iw_get_qp`: the CM's lookup, which `add_ref` follows at once; the
    /// QP must stay until then.
    fn cm_get_qp(dev: &Device<Self>, qpn: u32) -> Option<NonNull<ffi::ib_qp>>;
    /// Takes a CM reference on `qp`.
    fn add_ref(qp: &Qp<Self>);
    /// Drops a CM reference on `qp`.
    fn rem_ref(qp: &Qp<Self>);
}

/// Installs the `iw_*` callbacks of `T`.
pub(crate) fn install<T: IwCm>(ops: &mut ffi::ib_device_ops) {
    ops.iw_connect = Some(connect_cb::<T>);
    ops.iw_accept = Some(accept_cb::<T>);
    ops.iw_reject = Some(reject_cb::<T>);
    ops.iw_create_listen = Some(create_listen_cb::<T>);
    ops.iw_destroy_listen = Some(destroy_listen_cb::<T>);
    ops.iw_get_qp = Some(get_qp_cb::<T>);
    ops.iw_add_ref = Some(add_ref_cb::<T>);
    ops.iw_rem_ref = Some(rem_ref_cb::<T>);
}

/// Decodes a connection parameter block.
///
/// # Safety
///
/// `p` must be valid for the call, its private data readable.
unsafe fn param<'a>(p: *const ffi::iw_cm_conn_param) -> Result<ConnParam<'a>> {
    if p.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: by the requirements.
    let p = unsafe { &*p };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        &[][..]
    } else {
        // SAFETY: the CM passes `private_data_len` readable octets.
        unsafe { core::slice::from_raw_parts(p.private_data.cast::<u8>(), usize::from(p.private_data_len)) }
    };
    Ok(ConnParam { private_data, ird: p.ird, ord: p.ord, qpn: p.qpn })
}

/// The QP named by a connection parameter block, on the id's device.
///
/// # Safety
///
/// `id` must be a live id of a `T` device.
unsafe fn qp_of<'a, T: IwCm>(id: *mut ffi::iw_cm_id, qpn: u32) -> Result<&'a Qp<T>> {
    // SAFETY: by the requirements the id's device is a `T` device.
    let dev = unsafe { Device::<T>::from_raw((*id).device) };
    let raw = T::get_qp(dev, qpn).ok_or(EINVAL)?;
    // SAFETY: `get_qp` returns live QPs of `T`; the CM holds a reference
    // (`iw_add_ref`) across connect/accept.
    Ok(unsafe { Qp::<T>::from_raw(raw.as_ptr()) })
}

unsafe extern "C" fn connect_cb<T: IwCm>(id: *mut ffi::iw_cm_id, p: *mut ffi::iw_cm_conn_param) -> c_int {
    from_result(|| {
        // SAFETY: the CM passes a live id and parameter block.
        let (p, cm) = unsafe { (param(p)?, CmId::get(id)?) };
        // SAFETY: as above.
        let qp = unsafe { qp_of::<T>(id, p.qpn)? };
        let r = T::connect(cm, qp, &p);
        pr_debug!("iw_connect qpn {}: {:?}\n", p.qpn, r);
        r?;
        Ok(0)
    })
}

unsafe extern "C" fn accept_cb<T: IwCm>(id: *mut ffi::iw_cm_id, p: *mut ffi::iw_cm_conn_param) -> c_int {
    from_result(|| {
        // SAFETY: as in `connect_cb`.
        let (p, cm) = unsafe { (param(p)?, CmId::get(id)?) };
        // SAFETY: as above.
        let qp = unsafe { qp_of::<T>(id, p.qpn)? };
        let r = T::accept(cm, qp, &p);
        pr_debug!("iw_accept qpn {} ird {} ord {}: {:?}\n", p.qpn, p.ird, p.ord, r);
        r?;
        Ok(0)
    })
}

unsafe extern "C" fn reject_cb<T: IwCm>(id: *mut ffi::iw_cm_id, pd: *const c_void, len: u8) -> c_int {
    from_result(|| {
        let pd = if pd.is_null() {
            &[][..]
        } else {
            // SAFETY: the CM passes `len` readable octets.
            unsafe { core::slice::from_raw_parts(pd.cast::<u8>(), usize::from(len)) }
        };
        // SAFETY: the CM passes a live id of a `T` device (a child id has
        // its listener's device).
        let (dev, cm) = unsafe { (Device::<T>::from_raw((*id).device), CmId::get(id)?) };
        pr_debug!("iw_reject\n");
        T::reject(dev, cm, pd)?;
        Ok(0)
    })
}

unsafe extern "C" fn create_listen_cb<T: IwCm>(id: *mut ffi::iw_cm_id, backlog: c_int) -> c_int {
    from_result(|| {
        // SAFETY: the CM passes a live id of a `T` device.
        let (dev, cm) = unsafe { (Device::<T>::from_raw((*id).device), CmId::get(id)?) };
        T::create_listen(dev, cm, backlog)?;
        Ok(0)
    })
}

unsafe extern "C" fn destroy_listen_cb<T: IwCm>(id: *mut ffi::iw_cm_id) -> c_int {
    from_result(|| {
        // SAFETY: as above.
        let (dev, cm) = unsafe { (Device::<T>::from_raw((*id).device), CmId::get(id)?) };
        T::destroy_listen(dev, cm)?;
        Ok(0)
    })
}

unsafe extern "C" fn get_qp_cb<T: IwCm>(dev: *mut ffi::ib_device, qpn: c_int) -> *mut ffi::ib_qp {
    // SAFETY: the CM passes a live device of `T`.
    let d = unsafe { Device::<T>::from_raw(dev) };
    match u32::try_from(qpn).ok().and_then(|n| T::cm_get_qp(d, n)) {
        Some(q) => q.as_ptr(),
        None => ptr::null_mut(),
    }
}

unsafe extern "C" fn add_ref_cb<T: IwCm>(qp: *mut ffi::ib_qp) {
    // SAFETY: the CM passes a live QP of `T`.
    T::add_ref(unsafe { Qp::<T>::from_raw(qp) });
}

unsafe extern "C" fn rem_ref_cb<T: IwCm>(qp: *mut ffi::ib_qp) {
    // SAFETY: the CM passes a QP it holds a reference on.
    T::rem_ref(unsafe { Qp::<T>::from_raw(qp) });
}
