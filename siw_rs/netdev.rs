// SPDX-License-Identifier: GPL-2.0

//! Safe wrappers over `struct net_device` and the netdev notifier chain.

use crate::ffi;
use core::{marker::PhantomData, ptr::NonNull};
use kernel::{error::to_result, ffi::c_void, prelude::*, types::Opaque};

/// A borrowed network device.
///
/// # Invariants
///
/// Wraps a `struct net_device` that stays alive while the reference exists.
#[repr(transparent)]
pub(crate) struct NetDevice(Opaque<ffi::net_device>);

impl NetDevice {
    /// Borrows a raw net_device.
    ///
    /// # Safety
    ///
    /// `nd` must point to a live `net_device` that outlives `'a`.
    pub(crate) unsafe fn from_raw<'a>(nd: *mut ffi::net_device) -> &'a Self {
        // SAFETY: `NetDevice` is a transparent wrapper; validity is the
        // caller's promise.
        unsafe { &*nd.cast::<Self>() }
    }

    /// The raw pointer.
    pub(crate) fn as_raw(&self) -> *mut ffi::net_device {
        self.0.get()
    }

    fn raw(&self) -> &ffi::net_device {
        // SAFETY: by the type invariant the net_device is alive; only plain
        // fields that the stack writes atomically are read through this.
        unsafe { &*self.0.get() }
    }

    /// Whether the interface is administratively up.
    pub(crate) fn is_running(&self) -> bool {
        // SAFETY: the net_device is alive (type invariant).
        unsafe { ffi::siw_rs_h_netif_running(self.as_raw()) }
    }

    /// Whether the link has carrier.
    pub(crate) fn carrier_ok(&self) -> bool {
        // SAFETY: the net_device is alive (type invariant).
        unsafe { ffi::siw_rs_h_netif_carrier_ok(self.as_raw()) }
    }

    /// The interface index.
    pub(crate) fn ifindex(&self) -> i32 {
        self.raw().ifindex
    }

    /// The MTU in bytes.
    pub(crate) fn mtu(&self) -> u32 {
        self.raw().mtu
    }

    /// The hardware type (`ARPHRD_*`).
    pub(crate) fn hw_type(&self) -> u32 {
        u32::from(self.raw().type_)
    }

    /// Whether the netdev sits on a bus device (a NIC, physical or
    /// paravirtual), rather than being a virtual one (veth, loopback, a
    /// bridge, ...) whose traffic stays on the host.
    pub(crate) fn has_parent(&self) -> bool {
        // SAFETY: a live netdev; reads one pointer.
        unsafe { ffi::siw_rs_h_netdev_has_parent(self.as_raw()) }
    }

    /// The interface name, without the terminating NUL.
    pub(crate) fn name(&self) -> &[u8] {
        let name = &self.raw().name;
        // SAFETY: `c_char` is `u8` in the kernel, so the array can be viewed
        // as bytes of the same length.
        let bytes: &[u8] = unsafe { core::slice::from_raw_parts(name.as_ptr().cast(), name.len()) };
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        bytes.get(..len).unwrap_or(&[])
    }

    /// The 6-byte Ethernet address, if the device has one.
    pub(crate) fn eth_addr(&self) -> Option<[u8; 6]> {
        let raw = self.raw();
        if usize::from(raw.addr_len) < 6 || raw.dev_addr.is_null() {
            return None;
        }
        let mut mac = [0u8; 6];
        // SAFETY: `dev_addr` points to at least `addr_len` (>= 6) bytes owned
        // by the live net_device.
        let src = unsafe { core::slice::from_raw_parts(raw.dev_addr, 6) };
        mac.copy_from_slice(src);
        Some(mac)
    }
}

/// A counted reference on a net_device, released on drop (`dev_put`).
pub(crate) struct NetDeviceRef(NonNull<ffi::net_device>);

impl NetDeviceRef {
    /// Adopts a reference the caller already holds.
    ///
    /// # Safety
    ///
    /// `nd` must be NULL or a net_device on which the caller owns one
    /// reference, which this value takes over.
    pub(crate) unsafe fn from_held(nd: *mut ffi::net_device) -> Option<Self> {
        NonNull::new(nd).map(Self)
    }
}

impl core::ops::Deref for NetDeviceRef {
    type Target = NetDevice;
    fn deref(&self) -> &NetDevice {
        // SAFETY: the held reference keeps the net_device alive.
        unsafe { NetDevice::from_raw(self.0.as_ptr()) }
    }
}

impl Drop for NetDeviceRef {
    fn drop(&mut self) {
        // SAFETY: releases the reference owned by this value.
        unsafe { ffi::siw_rs_h_dev_put(self.0.as_ptr()) };
    }
}

/// The netdev events a driver reacts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// The interface came up.
    Up,
    /// The interface went down.
    Down,
    /// The interface is being unregistered.
    Unregister,
    /// The hardware address changed.
    ChangeAddr,
    /// Carrier or other link state changed.
    Change,
}

impl Event {
    fn from_raw(ev: usize) -> Option<Self> {
        let ev = u32::try_from(ev).ok()?;
        Some(match ev {
            ffi::NETDEV_UP => Self::Up,
            ffi::NETDEV_DOWN => Self::Down,
            ffi::NETDEV_UNREGISTER => Self::Unregister,
            ffi::NETDEV_CHANGEADDR => Self::ChangeAddr,
            ffi::NETDEV_CHANGE => Self::Change,
            _ => return None,
        })
    }
}

/// A receiver of netdev events.
pub(crate) trait Handler: 'static {
    /// Called for every event of interest on every net_device, under RTNL.
    fn event(event: Event, netdev: &NetDevice);
}

/// A netdev notifier registration for handler `T`.
///
/// Must be pinned: the notifier chain links the embedded `notifier_block`.
#[pin_data(PinnedDrop)]
pub(crate) struct Notifier<T: Handler> {
    #[pin]
    nb: Opaque<ffi::notifier_block>,
    registered: bool,
    _handler: PhantomData<T>,
}

// SAFETY: the notifier block is only touched by the notifier chain, which
// serialises registration and calls under RTNL.
unsafe impl<T: Handler> Send for Notifier<T> {}
// SAFETY: as above.
unsafe impl<T: Handler> Sync for Notifier<T> {}

impl<T: Handler> Notifier<T> {
    /// Allocates and registers a notifier for `T`.
    pub(crate) fn register() -> Result<Pin<KBox<Self>>> {
        let mut this = KBox::pin_init(
            pin_init!(Self {
                nb: Opaque::new(ffi::notifier_block {
                    notifier_call: Some(notifier_cb::<T>),
                    ..Default::default()
                }),
                registered: false,
                _handler: PhantomData,
            }),
            GFP_KERNEL,
        )?;
        // SAFETY: `nb` is pinned inside the box for as long as it is
        // registered (drop unregisters it first).
        to_result(unsafe { ffi::register_netdevice_notifier(this.nb.get()) })?;
        // SAFETY: `registered` is not structurally pinned.
        unsafe { this.as_mut().get_unchecked_mut().registered = true };
        Ok(this)
    }
}

#[pinned_drop]
impl<T: Handler> PinnedDrop for Notifier<T> {
    fn drop(self: Pin<&mut Self>) {
        if self.registered {
            // SAFETY: the block was registered by `register`; after this
            // returns the chain no longer calls it.
            unsafe { ffi::unregister_netdevice_notifier(self.nb.get()) };
        }
    }
}

unsafe extern "C" fn notifier_cb<T: Handler>(
    _nb: *mut ffi::notifier_block,
    event: kernel::ffi::c_ulong,
    info: *mut c_void,
) -> kernel::ffi::c_int {
    if let Some(ev) = Event::from_raw(event) {
        // SAFETY: the netdev notifier chain passes a `netdev_notifier_info`.
        let nd = unsafe { ffi::siw_rs_h_netdev_notifier_info_to_dev(info) };
        if !nd.is_null() {
            // SAFETY: the net_device is alive for the duration of the call.
            T::event(ev, unsafe { NetDevice::from_raw(nd) });
        }
    }
    ffi::NOTIFY_OK as _
}
