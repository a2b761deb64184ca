// SPDX-License-Identifier: GPL-2.0

//! Safe wrapper over `rdma_link_ops`: the `rdma link add NAME type T netdev
//! DEV` entry point.

use crate::{ffi, netdev::NetDevice};
use core::marker::PhantomData;
use kernel::{ffi::c_char, prelude::*, types::Opaque};

/// A link type: creates devices on request of `rdma link add`.
pub(crate) trait LinkType: 'static {
    /// The type name given to `rdma link add … type`.
    const TYPE: &'static CStr;
    /// Creates and registers a device named `name` on `netdev`.
    fn newlink(name: &CStr, netdev: &NetDevice) -> Result;
}

/// A registered link type. Must be pinned: the RDMA core links it into its
/// list of link types.
#[pin_data(PinnedDrop)]
pub(crate) struct Registration<T: LinkType> {
    #[pin]
    ops: Opaque<ffi::rdma_link_ops>,
    _type: PhantomData<T>,
}

// SAFETY: the RDMA core serialises access to the ops with its own rwsem.
unsafe impl<T: LinkType> Send for Registration<T> {}
// SAFETY: as above.
unsafe impl<T: LinkType> Sync for Registration<T> {}

impl<T: LinkType> Registration<T> {
    /// Allocates and registers link type `T`.
    pub(crate) fn register() -> Result<Pin<KBox<Self>>> {
        let this = KBox::pin_init(
            pin_init!(Self {
                ops: Opaque::new(ffi::rdma_link_ops {
                    type_: T::TYPE.as_char_ptr(),
                    newlink: Some(newlink_cb::<T>),
                    ..Default::default()
                }),
                _type: PhantomData,
            }),
            GFP_KERNEL,
        )?;
        // SAFETY: the ops are pinned in the box until drop unregisters them;
        // `rdma_link_register` cannot fail.
        unsafe { ffi::rdma_link_register(this.ops.get()) };
        Ok(this)
    }
}

#[pinned_drop]
impl<T: LinkType> PinnedDrop for Registration<T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: registered in `register`; unregistration waits for running
        // `newlink` calls to finish.
        unsafe { ffi::rdma_link_unregister(self.ops.get()) };
    }
}

unsafe extern "C" fn newlink_cb<T: LinkType>(
    name: *const c_char,
    netdev: *mut ffi::net_device,
) -> kernel::ffi::c_int {
    kernel::error::from_result(|| {
        // SAFETY: the RDMA core passes a NUL-terminated name and a net_device
        // it holds a reference on for the duration of the call.
        let (name, netdev) = unsafe { (CStr::from_char_ptr(name), NetDevice::from_raw(netdev)) };
        T::newlink(name, netdev)?;
        Ok(0)
    })
}
