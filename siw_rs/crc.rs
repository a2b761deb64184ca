// SPDX-License-Identifier: GPL-2.0

//! The CRC32c engine of MPA connections.
//!
//! The kernel's crypto API computes it when its `crc32c` transform could be
//! allocated at module load: that is the CPU's CRC32 instructions where a
//! driver for them is loaded (`crc32c-intel` on x86), else the kernel's
//! generic table code. Without the transform (a kernel built without
//! `CONFIG_CRYPTO_CRC32C`), the protocol core's software engine does the work.
//! Both keep the same running register, so the choice is made per call.

use crate::{
    ffi,
    iwarp::crc32c::{CrcEngine, SoftCrc32c},
};
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::prelude::*;

/// Whether `ffi::siw_rs_h_crc32c_update` may be called: set after the
/// transform was allocated, cleared before it is freed.
static KERNEL_CRC: AtomicBool = AtomicBool::new(false);

/// Owns the kernel transform from module load to module unload.
pub(crate) struct Registration;

impl Registration {
    /// Allocates the transform; a failure leaves the software engine in use.
    pub(crate) fn new() -> Self {
        // SAFETY: called once, at module load, in process context.
        let r = unsafe { ffi::siw_rs_h_crc32c_init() };
        if r == 0 {
            KERNEL_CRC.store(true, Ordering::Release);
        } else {
            pr_info!("no kernel crc32c transform ({}): MPA CRC32c in software\n", r);
        }
        Registration
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Dropped last at module unload, after every device (and with it
        // every connection) is gone: nothing computes a CRC any more.
        if KERNEL_CRC.swap(false, Ordering::AcqRel) {
            // SAFETY: the transform was allocated by `new` and is no longer
            // used.
            unsafe { ffi::siw_rs_h_crc32c_exit() };
        }
    }
}

/// A running CRC32c computation (see `CrcEngine`).
#[derive(Clone, Copy)]
pub(crate) struct Crc32c {
    /// The register, pre-inverted as both engines keep it.
    reg: u32,
}

impl Crc32c {
    pub(crate) const fn new() -> Self {
        Crc32c { reg: !0 }
    }
}

impl CrcEngine for Crc32c {
    fn reset(&mut self) {
        self.reg = !0;
    }

    fn update(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if KERNEL_CRC.load(Ordering::Acquire) {
            // SAFETY: the transform exists (`KERNEL_CRC`); `data` is a live
            // slice of `data.len()` octets.
            self.reg = unsafe { ffi::siw_rs_h_crc32c_update(self.reg, data.as_ptr(), data.len()) };
        } else {
            let mut soft = SoftCrc32c::resume(!self.reg);
            soft.update(data);
            self.reg = !soft.finish();
        }
    }

    fn finish(&self) -> u32 {
        !self.reg
    }
}
