// SPDX-License-Identifier: GPL-2.0

//! Safe wrappers over the RDMA core's `struct ib_device`.
//!
//! The RDMA core allocates a driver's device object itself (`_ib_alloc_device`
//! with the driver's size) and frees it after the driver's `dealloc_driver`
//! callback has run. [`Device<T>`] is that object: a `#[repr(C)]` struct whose
//! first field is the embedded `ib_device`, followed by the driver's data.
//! A [`Driver`] implementation supplies the data type and the callbacks; this
//! module turns them into the C `ib_device_ops` table, with one
//! `unsafe extern "C"` trampoline per callback.
//!
//! # Invariants
//!
//! Every `*mut ib_device` the RDMA core passes to a trampoline of `Driver` `T`
//! was allocated by [`Device::<T>::new`]: it points to a live `Device<T>` whose
//! `data` field is initialised until [`Driver::dealloc`] has returned.

use crate::{ffi, netdev::NetDeviceRef};
use kernel::ffi::{c_char, c_int};
use core::{mem, ptr, ptr::NonNull};
use kernel::{
    error::{from_result, to_result},
    prelude::*,
    types::Opaque,
};

/// The raw value of a port number; iWARP devices have exactly port 1.
pub(crate) type PortNum = u32;

/// Device attributes as `query_device` reports them.
pub(crate) type DeviceAttr = ffi::ib_device_attr;
/// Port attributes as `query_port` reports them.
pub(crate) type PortAttr = ffi::ib_port_attr;
/// Port attributes that never change (`get_port_immutable`).
pub(crate) type PortImmutable = ffi::ib_port_immutable;

/// An RDMA device driver: the per-device data and the device callbacks.
#[vtable]
pub(crate) trait Driver: Sized + 'static {
    /// Per-device driver data, stored right after the `ib_device`.
    type Data: Send + Sync;
    /// Per-PD data (see [`crate::verbs`]).
    type Pd: Send + Sync;
    /// Per-CQ data.
    type Cq: Send + Sync;
    /// Per-QP data.
    type Qp: Send + Sync;
    /// Per-MR data.
    type Mr: Send + Sync;
    /// Per-SRQ data.
    type Srq: Send + Sync;

    /// The `rdma_driver_id` the device is registered with.
    const DRIVER_ID: ffi::rdma_driver_id;
    /// The uverbs ABI version reported to userspace providers.
    const UVERBS_ABI_VER: u32;

    /// Fills in the device attributes.
    fn query_device(dev: &Device<Self>, attr: &mut DeviceAttr) -> Result;
    /// Fills in the attributes of `port`. The RDMA core has already zeroed
    /// `attr` and filled state and MTU from the netdev for iWARP devices.
    fn query_port(dev: &Device<Self>, port: PortNum, attr: &mut PortAttr) -> Result;
    /// Returns GID `index` of `port`.
    fn query_gid(dev: &Device<Self>, port: PortNum, index: i32) -> Result<[u8; 16]>;
    /// Fills in the immutable attributes of `port`.
    fn get_port_immutable(dev: &Device<Self>, port: PortNum, imm: &mut PortImmutable)
        -> Result;
    /// Called once when the RDMA core frees the device, before the data is
    /// dropped.
    fn dealloc(dev: &Device<Self>);
}

/// A driver's device object: the RDMA core's `ib_device` followed by the
/// driver's data.
#[repr(C)]
pub(crate) struct Device<T: Driver> {
    ib: Opaque<ffi::ib_device>,
    data: T::Data,
}

// SAFETY: the RDMA core synchronises its own use of the `ib_device`, and the
// driver data is `Send + Sync`.
unsafe impl<T: Driver> Send for Device<T> {}
// SAFETY: as above.
unsafe impl<T: Driver> Sync for Device<T> {}

impl<T: crate::iw::IwCm + crate::uverbs::UserVerbs> Device<T> {
    /// Allocates a device holding `data`, with `T`'s callbacks installed.
    ///
    /// The result is owned by the caller until [`NewDevice::register`]
    /// succeeds; dropping it frees the device (and drops `data`).
    pub(crate) fn new(module: &'static ThisModule, data: T::Data) -> Result<NewDevice<T>> {
        // The core frees the object through `ib_device`, so it must be first;
        // `#[repr(C)]` guarantees that. kzalloc alignment covers both parts.
        build_assert!(mem::align_of::<Self>() <= 8);

        // SAFETY: `_ib_alloc_device` accepts any size of at least
        // `sizeof(struct ib_device)`; `Self` begins with one.
        let raw = unsafe { ffi::_ib_alloc_device(mem::size_of::<Self>()) };
        let raw = NonNull::new(raw.cast::<Self>()).ok_or(ENOMEM)?;
        // SAFETY: `raw` is a fresh, zeroed, suitably aligned allocation of
        // `size_of::<Self>()` bytes; `data` is written before anyone reads it.
        unsafe { ptr::addr_of_mut!((*raw.as_ptr()).data).write(data) };
        // The legacy post commands are off by default; processes use them
        // (with no work requests) as the doorbells of their rings.
        // SAFETY: the device is ours alone until registered.
        unsafe {
            (*raw.as_ptr().cast::<ffi::ib_device>()).uverbs_cmd_mask |=
                (1u64 << ffi::IB_USER_VERBS_CMD_POST_SEND) | (1u64 << ffi::IB_USER_VERBS_CMD_POST_RECV);
        }

        let mut ops = ffi::ib_device_ops {
            owner: module.as_ptr().cast(),
            driver_id: T::DRIVER_ID,
            uverbs_abi_ver: T::UVERBS_ABI_VER,
            query_device: Some(query_device_cb::<T>),
            query_port: Some(query_port_cb::<T>),
            query_gid: Some(query_gid_cb::<T>),
            get_port_immutable: Some(get_port_immutable_cb::<T>),
            dealloc_driver: Some(dealloc_driver_cb::<T>),
            ..Default::default()
        };
        crate::verbs::install::<T>(&mut ops);
        crate::iw::install::<T>(&mut ops);
        crate::uverbs::install::<T>(&mut ops);
        // SAFETY: `raw` is a valid `ib_device`; the core copies `ops`, so a
        // stack value is fine. From here on `ib_dealloc_device` runs
        // `dealloc_driver_cb`, which drops `data`.
        unsafe { ffi::ib_set_device_ops(raw.as_ptr().cast(), &ops) };
        Ok(NewDevice { dev: raw })
    }
}

impl<T: Driver> Device<T> {
    /// Returns the device behind a raw `ib_device` pointer.
    ///
    /// # Safety
    ///
    /// `ib` must have been allocated by [`Device::<T>::new`], its data must
    /// not have been dropped yet, and it must stay alive for `'a`.
    pub(crate) unsafe fn from_raw<'a>(ib: *mut ffi::ib_device) -> &'a Self {
        // SAFETY: by the safety requirements, `ib` points to a live `Self`
        // (the `ib_device` is its first field).
        unsafe { &*ib.cast::<Self>() }
    }

    /// The raw `ib_device` pointer.
    pub(crate) fn as_raw(&self) -> *mut ffi::ib_device {
        self.ib.get()
    }

    /// The driver data.
    pub(crate) fn data(&self) -> &T::Data {
        &self.data
    }

    /// The netdev bound to `port`, with a reference held, if any.
    pub(crate) fn netdev(&self, port: PortNum) -> Option<NetDeviceRef> {
        // SAFETY: `self.ib` is a valid, allocated `ib_device`; the function
        // returns a held reference or NULL.
        let nd = unsafe { ffi::ib_device_get_netdev(self.as_raw(), port) };
        // SAFETY: `nd` is NULL or a net_device whose reference we now own.
        unsafe { NetDeviceRef::from_held(nd) }
    }

    /// Reports a port event (`IB_EVENT_PORT_ACTIVE`, …) to the RDMA core's
    /// event handlers.
    pub(crate) fn port_event(&self, port: PortNum, event: ffi::ib_event_type) {
        let mut ev = ffi::ib_event {
            device: self.as_raw(),
            event,
            ..Default::default()
        };
        ev.element.port_num = port;
        // SAFETY: `ev` is a fully initialised event for a registered device.
        unsafe { ffi::ib_dispatch_event(&ev) };
    }

    /// The Ethernet speed and width of `port`'s netdev, in IB terms.
    pub(crate) fn eth_speed(&self, port: PortNum) -> Result<(u16, u8)> {
        let (mut speed, mut width) = (0u16, 0u8);
        // SAFETY: the device is registered or being queried by the core; the
        // out-pointers are valid locals. Takes RTNL itself.
        to_result(unsafe { ffi::ib_get_eth_speed(self.as_raw(), port, &mut speed, &mut width) })?;
        Ok((speed, width))
    }

    /// Takes a reference on a registered device; `None` once unregistration
    /// has begun.
    pub(crate) fn try_get(&self) -> Option<DeviceRef<T>> {
        // SAFETY: the device is allocated; `ib_device_try_get` only reads its
        // refcount.
        if unsafe { ffi::siw_rs_h_ib_device_try_get(self.as_raw()) } {
            Some(DeviceRef { dev: NonNull::from(self) })
        } else {
            None
        }
    }
}

/// A device allocated by [`Device::new`] and not yet registered.
pub(crate) struct NewDevice<T: Driver> {
    dev: NonNull<Device<T>>,
}

impl<T: Driver> NewDevice<T> {
    fn ib(&mut self) -> &mut ffi::ib_device {
        // SAFETY: before registration the device is exclusively ours.
        unsafe { &mut *self.dev.as_ptr().cast::<ffi::ib_device>() }
    }

    /// Borrows the device.
    pub(crate) fn device(&self) -> &Device<T> {
        // SAFETY: `dev` is live and initialised while `self` exists.
        unsafe { self.dev.as_ref() }
    }

    /// Sets the identity of an iWARP RNIC with one port: node type, GUID,
    /// node description, completion vectors, and the interface name the
    /// iWARP connection manager binds to.
    pub(crate) fn set_rnic_identity(&mut self, node_guid: u64, desc: &[u8], ifname: &[u8]) {
        let ib = self.ib();
        ib.node_type = ffi::RDMA_NODE_RNIC as _;
        ib.phys_port_cnt = 1;
        ib.node_guid = node_guid;
        // SAFETY: a plain C call with no arguments.
        ib.num_comp_vectors = unsafe { ffi::siw_rs_h_num_possible_cpus() };
        // The iWARP CM talks to the TCP stack directly (no iwpmd).
        ib.iw_driver_flags = ffi::IW_F_NO_PORT_MAP as _;
        copy_cstr(&mut ib.node_desc, desc);
        copy_cstr(&mut ib.iw_ifname, ifname);
    }

    /// Binds `netdev` to `port` (the core holds a reference while bound).
    pub(crate) fn set_netdev(&mut self, netdev: &crate::netdev::NetDevice, port: PortNum) -> Result {
        let ib = self.ib() as *mut ffi::ib_device;
        // SAFETY: `ib` is our unregistered device, `netdev` a live net_device.
        to_result(unsafe { ffi::ib_device_set_netdev(ib, netdev.as_raw(), port) })
    }

    /// Registers the device under `name`, marked as named by the user.
    ///
    /// From then on the RDMA core owns it: it is freed through
    /// `dealloc_driver` after unregistration.
    pub(crate) fn register(mut self, name: &CStr) -> Result {
        let ib = self.ib() as *mut ffi::ib_device;
        // SAFETY: `ib` is a valid device ready for registration; `name` is a
        // NUL-terminated string; a NULL DMA device selects virtual DMA.
        let ret = unsafe {
            ffi::siw_rs_h_ib_mark_name_assigned_by_user(ib);
            ffi::ib_register_device(ib, name.as_char_ptr(), ptr::null_mut())
        };
        // On failure the caller still owns the device: `drop(self)` frees it.
        to_result(ret)?;
        mem::forget(self);
        Ok(())
    }
}

impl<T: Driver> Drop for NewDevice<T> {
    fn drop(&mut self) {
        // SAFETY: the device was never registered (or registration failed,
        // after which the core hands ownership back); this frees it and runs
        // `dealloc_driver_cb`, which drops the data.
        unsafe { ffi::ib_dealloc_device(self.dev.as_ptr().cast()) };
    }
}

/// A counted reference on a registered device (`ib_device_try_get`).
pub(crate) struct DeviceRef<T: Driver> {
    dev: NonNull<Device<T>>,
}

impl<T: Driver> DeviceRef<T> {
    /// Starts unregistration on the RDMA core's workqueue; safe to call from
    /// a netdev notifier (under RTNL).
    pub(crate) fn unregister_queued(&self) {
        // SAFETY: we hold a reference, as `ib_unregister_device_queued` needs.
        unsafe { ffi::ib_unregister_device_queued(self.as_raw()) };
    }
}

impl<T: Driver> core::ops::Deref for DeviceRef<T> {
    type Target = Device<T>;
    fn deref(&self) -> &Device<T> {
        // SAFETY: the reference we hold keeps the device and its data alive.
        unsafe { self.dev.as_ref() }
    }
}

impl<T: Driver> Drop for DeviceRef<T> {
    fn drop(&mut self) {
        // SAFETY: releases the reference taken by `try_get`.
        unsafe { ffi::ib_device_put(self.as_raw()) };
    }
}

/// Unregisters a device synchronously and waits until it is freed or handed
/// to the core's release path. `dev` must be a device of this driver that the
/// caller keeps allocated (see [`hold`]).
pub(crate) fn unregister(dev: &HeldDevice) {
    // SAFETY: `dev` holds a `struct device` reference, so the memory is valid;
    // `ib_unregister_device` copes with devices already being unregistered.
    unsafe { ffi::ib_unregister_device(dev.ib.as_ptr()) };
}

/// A `struct device` reference on an `ib_device`: keeps the memory allocated
/// (not the device registered).
pub(crate) struct HeldDevice {
    ib: NonNull<ffi::ib_device>,
}

/// Takes a `struct device` reference on `ib`.
///
/// # Safety
///
/// `ib` must point to an allocated `ib_device` that cannot be freed during
/// this call.
pub(crate) unsafe fn hold(ib: NonNull<ffi::ib_device>) -> HeldDevice {
    // SAFETY: by the safety requirements `ib` is allocated.
    unsafe { ffi::get_device(ptr::addr_of_mut!((*ib.as_ptr()).__bindgen_anon_1.dev)) };
    HeldDevice { ib }
}

impl Drop for HeldDevice {
    fn drop(&mut self) {
        // SAFETY: releases the reference taken by `hold`.
        unsafe { ffi::put_device(ptr::addr_of_mut!((*self.ib.as_ptr()).__bindgen_anon_1.dev)) };
    }
}

/// The IB MTU enum value for a netdev MTU in bytes.
pub(crate) fn mtu_enum(mtu: u32) -> ffi::ib_mtu {
    let mtu = c_int::try_from(mtu).unwrap_or(c_int::MAX);
    // SAFETY: a pure function of its argument.
    unsafe { ffi::siw_rs_h_ib_mtu_int_to_enum(mtu) as ffi::ib_mtu }
}

/// Copies `src` into the C string buffer `dst`, truncating and always
/// leaving it NUL-terminated.
fn copy_cstr(dst: &mut [c_char], src: &[u8]) {
    let n = src.len().min(dst.len().saturating_sub(1));
    for (d, s) in dst.iter_mut().zip(src.iter().take(n)) {
        *d = *s as _;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

unsafe extern "C" fn query_device_cb<T: Driver>(
    ib: *mut ffi::ib_device,
    attr: *mut DeviceAttr,
    _udata: *mut ffi::ib_udata,
) -> c_int {
    from_result(|| {
        // SAFETY: by the module invariant `ib` is a live `Device<T>`; the core
        // passes a valid, exclusive `attr`.
        let (dev, attr) = unsafe { (Device::<T>::from_raw(ib), &mut *attr) };
        T::query_device(dev, attr)?;
        Ok(0)
    })
}

unsafe extern "C" fn query_port_cb<T: Driver>(
    ib: *mut ffi::ib_device,
    port: u32,
    attr: *mut PortAttr,
) -> c_int {
    from_result(|| {
        // SAFETY: as in `query_device_cb`.
        let (dev, attr) = unsafe { (Device::<T>::from_raw(ib), &mut *attr) };
        T::query_port(dev, port, attr)?;
        Ok(0)
    })
}

unsafe extern "C" fn query_gid_cb<T: Driver>(
    ib: *mut ffi::ib_device,
    port: u32,
    index: c_int,
    gid: *mut ffi::ib_gid,
) -> c_int {
    from_result(|| {
        // SAFETY: as in `query_device_cb`; `gid` is a valid 16-byte union.
        let (dev, gid) = unsafe { (Device::<T>::from_raw(ib), &mut *gid) };
        gid.raw = T::query_gid(dev, port, index)?;
        Ok(0)
    })
}

unsafe extern "C" fn get_port_immutable_cb<T: Driver>(
    ib: *mut ffi::ib_device,
    port: u32,
    imm: *mut PortImmutable,
) -> c_int {
    from_result(|| {
        // SAFETY: as in `query_device_cb`.
        let (dev, imm) = unsafe { (Device::<T>::from_raw(ib), &mut *imm) };
        T::get_port_immutable(dev, port, imm)?;
        Ok(0)
    })
}

unsafe extern "C" fn dealloc_driver_cb<T: Driver>(ib: *mut ffi::ib_device) {
    // SAFETY: by the module invariant `ib` is a live `Device<T>`; the core
    // calls this exactly once, before freeing the memory.
    let dev = unsafe { Device::<T>::from_raw(ib) };
    T::dealloc(dev);
    // SAFETY: nothing uses the data after `dealloc`; it is dropped once.
    unsafe { ptr::drop_in_place(ptr::addr_of_mut!((*ib.cast::<Device<T>>()).data)) };
}
