// SPDX-License-Identifier: GPL-2.0

//! siw_rs: a soft-iWARP RDMA provider written in Rust.
//!
//! Layers, bottom up:
//! - [`ffi`]: bindgen output and the C helpers (the only raw FFI);
//! - [`ib`], [`netdev`], [`link`]: safe wrappers in the style of `rust/kernel/`;
//! - [`registry`], [`device`]: the driver logic, on the wrappers only;
//! - [`iwarp`]: the sans-IO protocol core (MPA, DDP, RDMAP), shared with the
//!   host crate `iwarp-core`.

// `pin_init!` of the connection state (conn.rs) nests deeper than the
// default limit.
#![recursion_limit = "256"]

use kernel::prelude::*;

mod cm;
mod conn;
mod crc;
mod cq;
mod device;
mod doorbell;
mod ffi;
mod ib;
mod iw;
pub mod iwarp;
mod kmem;
mod limits;
mod link;
mod mem;
mod settings;
mod net;
mod netdev;
mod qp;
mod registry;
mod srq;
mod sync;
mod uverbs;
mod uwqe;
mod verbs;
mod wq;
mod zcopy;

module! {
    type: SiwRsModule,
    name: "siw_rs",
    author: "siw_rs developers",
    description: "Soft-iWARP RDMA provider (RDMAP/DDP/MPA over TCP) in Rust",
    license: "GPL",
}

/// Module state. Fields drop in declaration order: first the link type (no
/// new devices), then the notifier, then the devices themselves, then the
/// wait for the network stack's last release of a zero-copy send (it calls
/// back into the module), then the module's workqueues (destroying them
/// waits for the last work item's tail, which may drop the last reference
/// to a memory region), then the queue that unpins user memory (drained
/// when dropped), and last the CRC32c transform no connection uses any
/// more by then.
struct SiwRsModule {
    _link: Pin<KBox<link::Registration<device::SiwRs>>>,
    _notifier: Pin<KBox<netdev::Notifier<device::SiwRs>>>,
    _devices: Devices,
    _zcopy: zcopy::Drain,
    _queues: wq::Queues,
    _unpin: Unpinner,
    _crc: crc::Registration,
}

/// Drains the deferred unpinning of user memory on drop.
struct Unpinner;

impl Drop for Unpinner {
    fn drop(&mut self) {
        uverbs::exit();
    }
}

/// Unregisters every device on drop.
struct Devices;

impl Drop for Devices {
    fn drop(&mut self) {
        device::unregister_all();
    }
}

impl kernel::Module for SiwRsModule {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let crc = crc::Registration::new();
        uverbs::init()?;
        let unpin = Unpinner;
        let queues = wq::Queues::new()?;
        let notifier = netdev::Notifier::<device::SiwRs>::register()?;
        let link = link::Registration::<device::SiwRs>::register()?;
        pr_info!("soft-iWARP provider loaded (rdma link type siw_rs)\n");
        Ok(SiwRsModule { _link: link, _notifier: notifier, _devices: Devices, _zcopy: zcopy::Drain, _queues: queues, _unpin: unpin, _crc: crc })
    }
}
