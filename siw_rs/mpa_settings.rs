// SPDX-License-Identifier: GPL-2.0

//! Per-device MPA settings, set through sysfs and read by every new
//! connection (active or passive) of the device:
//!
//! - `mpa_crc`: `0` (default, as upstream siw) sends no CRC unless the
//!   peer asks for it; `1` asks for CRC on every connection.
//! - `mpa_markers`: `0` (default) asks for no markers; `1` asks the peer to
//!   insert MPA markers into the FPDUs this device receives. Whatever the
//!   setting, siw_rs inserts markers into what it sends when a peer asks
//!   (upstream siw refuses such peers).
//!
//! The files are `/sys/class/infiniband/<dev>/mpa_crc` and `…/mpa_markers`;
//! `helpers.c` declares them and calls the two functions below.

use crate::{device::SiwRs, ffi, ib::Device};
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::prelude::*;

/// The settings of one device, shared with its listeners.
#[derive(Default)]
pub(crate) struct MpaKnobs {
    crc: AtomicBool,
    markers: AtomicBool,
}

/// A snapshot for one handshake.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MpaSettings {
    /// Ask for CRC.
    pub(crate) crc: bool,
    /// Ask for markers on receive.
    pub(crate) markers: bool,
}

impl MpaKnobs {
    pub(crate) fn get(&self) -> MpaSettings {
        MpaSettings { crc: self.crc.load(Ordering::Relaxed), markers: self.markers.load(Ordering::Relaxed) }
    }
}

/// Which setting a sysfs file holds (`enum siw_rs_mpa_attr` in helpers.h).
fn knob(knobs: &MpaKnobs, which: c_int) -> Option<&AtomicBool> {
    match u32::try_from(which).ok()? {
        ffi::SIW_RS_MPA_ATTR_CRC => Some(&knobs.crc),
        ffi::SIW_RS_MPA_ATTR_MARKERS => Some(&knobs.markers),
        _ => None,
    }
}

/// sysfs show: the value (0 or 1), or `-EINVAL`.
///
/// # Safety
///
/// `ib` is a registered siw_rs device (the attribute group is only
/// attached to siw_rs devices, and sysfs calls show only while the
/// attribute exists, i.e. while the device is registered).
#[no_mangle]
pub(crate) unsafe extern "C" fn siw_rs_mpa_attr_get(ib: *mut ffi::ib_device, which: c_int) -> c_int {
    // SAFETY: by the requirements.
    let dev = unsafe { Device::<SiwRs>::from_raw(ib) };
    match knob(dev.data().mpa_knobs(), which) {
        Some(k) => c_int::from(k.load(Ordering::Relaxed)),
        None => EINVAL.to_errno(),
    }
}

/// sysfs store: sets the setting to `value` (0 or 1); `-EINVAL` otherwise.
///
/// # Safety
///
/// As for [`siw_rs_mpa_attr_get`].
#[no_mangle]
pub(crate) unsafe extern "C" fn siw_rs_mpa_attr_set(ib: *mut ffi::ib_device, which: c_int, value: c_int) -> c_int {
    // SAFETY: by the requirements.
    let dev = unsafe { Device::<SiwRs>::from_raw(ib) };
    match (knob(dev.data().mpa_knobs(), which), value) {
        (Some(k), 0 | 1) => {
            k.store(value == 1, Ordering::Relaxed);
            0
        }
        _ => EINVAL.to_errno(),
    }
}
