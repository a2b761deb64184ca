// SPDX-License-Identifier: GPL-2.0

//! Per-device settings, set through sysfs. The MPA settings are read by
//! every new connection (active or passive) of the device:
//!
//! - `mpa_crc`: `0` (default, as upstream siw) sends no CRC unless the
//!   peer asks for it; `1` asks for CRC on every connection.
//! - `mpa_markers`: `0` (default) asks for no markers; `1` asks the peer to
//!   insert MPA markers into the FPDUs this device receives. Whatever the
//!   setting, siw_rs inserts markers into what it sends when a peer asks
//!   (upstream siw refuses such peers).
//! - `mpa_p2p`: `0` (default, as upstream siw) connects without RFC 6581
//!   peer-to-peer mode; `1` asks for it as initiator, offering a
//!   zero-length RDMA Write as the ready-to-receive (RTR) message, which
//!   this side then sends as its first FPDU: a responder that holds its
//!   own sends until the RTR (siw_rs does) then serves a server that
//!   sends first safely. Not for upstream siw as responder (usage.rst,
//!   "Who sends first"). As responder siw_rs grants a peer's request
//!   whatever the setting.
//!
//! And one transmit setting, read for each large message:
//!
//! - `zcopy`: `1` sends large Sends, RDMA Writes and Read Responses from
//!   registered memory (a process's, or a kernel consumer's where its pages
//!   allow) by reference, completing them once the network stack
//!   has released their pages ([`crate::zcopy`]); `0` copies them into the
//!   socket, completing them as it takes them. The default is `1` on a
//!   NIC's netdev (one with a parent device) and `0` on a virtual one
//!   (veth, loopback, ...): traffic that stays on the host is copied by
//!   the stack as it is received (`skb_orphan_frags_rx`), so by reference
//!   it costs a page allocation per skb and a later completion on top of
//!   that copy (measured on the benchmark's veth pair: 0.7x-0.8x the
//!   throughput of the copy at 64 KiB and 1 MiB). `test_67` (two VMs over
//!   a virtio NIC) covers the NIC default. `zcopy_sends` (read-only)
//!   counts the messages sent by reference.
//!
//! The files are `/sys/class/infiniband/<dev>/mpa_crc`, `…/mpa_markers`,
//! `…/mpa_p2p`, `…/zcopy` and `…/zcopy_sends`; `helpers.c` declares them and calls the
//! functions below.

use crate::{device::SiwRs, ffi, ib::Device};
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use kernel::prelude::*;

/// The settings of one device, shared with its listeners and
/// connections.
pub(crate) struct Knobs {
    crc: AtomicBool,
    markers: AtomicBool,
    p2p: AtomicBool,
    /// Large Sends, RDMA Writes and Read Responses from a process's
    /// memory go to the socket by reference ([`crate::zcopy`]).
    zcopy: AtomicBool,
    /// Messages sent that way.
    zcopy_sends: AtomicU64,
}

impl Knobs {
    /// The defaults: MPA settings off, `zcopy` as given (see the
    /// module's documentation).
    pub(crate) fn new(zcopy: bool) -> Self {
        Knobs {
            crc: AtomicBool::new(false),
            markers: AtomicBool::new(false),
            p2p: AtomicBool::new(false),
            zcopy: AtomicBool::new(zcopy),
            zcopy_sends: AtomicU64::new(0),
        }
    }
}

/// A snapshot for one handshake.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MpaSettings {
    /// Ask for CRC.
    pub(crate) crc: bool,
    /// Ask for markers on receive.
    pub(crate) markers: bool,
    /// As initiator, ask for peer-to-peer mode (a Write RTR).
    pub(crate) p2p: bool,
}

impl Knobs {
    pub(crate) fn get(&self) -> MpaSettings {
        MpaSettings {
            crc: self.crc.load(Ordering::Relaxed),
            markers: self.markers.load(Ordering::Relaxed),
            p2p: self.p2p.load(Ordering::Relaxed),
        }
    }

    /// Whether zero-copy transmit is on (read for each large message).
    pub(crate) fn zcopy(&self) -> bool {
        self.zcopy.load(Ordering::Relaxed)
    }

    /// Counts a message sent by reference.
    pub(crate) fn count_zcopy(&self) {
        self.zcopy_sends.fetch_add(1, Ordering::Relaxed);
    }
}

/// Which setting a sysfs file holds (`enum siw_rs_setting` in helpers.h).
fn knob(knobs: &Knobs, which: c_int) -> Option<&AtomicBool> {
    match u32::try_from(which).ok()? {
        ffi::SIW_RS_SETTING_CRC => Some(&knobs.crc),
        ffi::SIW_RS_SETTING_MARKERS => Some(&knobs.markers),
        ffi::SIW_RS_SETTING_ZCOPY => Some(&knobs.zcopy),
        ffi::SIW_RS_SETTING_P2P => Some(&knobs.p2p),
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
pub(crate) unsafe extern "C" fn siw_rs_setting_get(ib: *mut ffi::ib_device, which: c_int) -> c_int {
    // SAFETY: by the requirements.
    let dev = unsafe { Device::<SiwRs>::from_raw(ib) };
    match knob(dev.data().knobs(), which) {
        Some(k) => c_int::from(k.load(Ordering::Relaxed)),
        None => EINVAL.to_errno(),
    }
}

/// sysfs store: sets the setting to `value` (0 or 1); `-EINVAL` otherwise.
///
/// # Safety
///
/// As for [`siw_rs_setting_get`].
#[no_mangle]
pub(crate) unsafe extern "C" fn siw_rs_setting_set(ib: *mut ffi::ib_device, which: c_int, value: c_int) -> c_int {
    // SAFETY: by the requirements.
    let dev = unsafe { Device::<SiwRs>::from_raw(ib) };
    match (knob(dev.data().knobs(), which), value) {
        (Some(k), 0 | 1) => {
            k.store(value == 1, Ordering::Relaxed);
            0
        }
        _ => EINVAL.to_errno(),
    }
}

/// sysfs show of `zcopy_sends`: messages the device sent zero-copy.
///
/// # Safety
///
/// As for [`siw_rs_setting_get`].
#[no_mangle]
pub(crate) unsafe extern "C" fn siw_rs_zcopy_sends(ib: *mut ffi::ib_device) -> u64 {
    // SAFETY: by the requirements.
    let dev = unsafe { Device::<SiwRs>::from_raw(ib) };
    dev.data().knobs().zcopy_sends.load(Ordering::Relaxed)
}
