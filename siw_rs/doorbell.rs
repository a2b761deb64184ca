// SPDX-License-Identifier: GPL-2.0

//! The doorbell file of a process's context.
//!
//! A process rings a send queue whose kernel side went idle with a system
//! call. Through the uverbs command file that is a POST_SEND command with
//! no work requests, and the RDMA core parses it (header, command words,
//! response buffer), looks the QP up in the process's object table, locks
//! it and allocates a work-request buffer before the driver sees it: a
//! doorbell on an idle QP took 2.9 us that way under TCG, and takes 1.1 us
//! through the file, on every small message's way out. So each context
//! gets a file of its own when it is opened (`alloc_ucontext`, the number
//! in the response) whose ioctl goes straight to the driver:
//! `SIW_RS_IOCTL_SQ_DOORBELL` (or `_RQ_`) with the QP number as its
//! argument.
//!
//! The file names QPs by number, so it checks what the core's object table
//! checked: the QP must be one its own context created. The device's QP
//! table records that context for each process's QP ([`QpTable::publish`],
//! once the QP is fully created). A destroyed QP leaves the table first
//! and then waits for the doorbells that found it
//! ([`crate::qp::QpCore::drain_doorbells`]), which is what the core's
//! object lock gave the command path.
//!
//! The file holds the device's QP table, not the device: it may outlive
//! both the context and the device (a process may keep it open), and then
//! finds nothing to ring. Context identities are never reused, so a new
//! context cannot inherit an old file's rights. Its file operations are in
//! `helpers.c`, owned by the module, which stays loaded while one is open.

use crate::{
    device::SiwRs,
    ffi,
    qp::{self, QpTable},
    sync::IrqSpinLock,
    uverbs::NewFile,
    verbs::Qp,
};
use core::ffi::{c_int, c_ulong, c_void};
use kernel::{prelude::*, sync::Arc, types::ForeignOwnable};

/// What one doorbell file rings: the QPs of one context, found in its
/// device's QP table.
pub(crate) struct Doorbells {
    qps: Arc<IrqSpinLock<QpTable>>,
    owner: u64,
}

/// Opens the doorbell file of the context `owner` on the device whose QP
/// table is `qps`: reserved in the calling process, made visible by
/// [`NewFile::install`]. `None` when no file could be made (the process has
/// no free file number, memory is short): the process then rings through
/// the uverbs file, as it may anyway.
pub(crate) fn open(qps: &Arc<IrqSpinLock<QpTable>>, owner: u64) -> Option<NewFile> {
    let d = Arc::new(Doorbells { qps: qps.clone(), owner }, GFP_KERNEL).ok()?;
    NewFile::doorbell(d)
        .inspect_err(|e| pr_debug!("no doorbell file for a new context: {:?}\n", e))
        .ok()
}

/// A QP found for a doorbell; while it is held, destroying the QP waits.
struct Ringing<'a>(&'a Qp<SiwRs>);

impl Ringing<'_> {
    /// QP `qpn` of the file's context, counted as being rung.
    fn find(d: &Doorbells, qpn: u32) -> Option<Self> {
        let table = d.qps.lock();
        let raw = table.get_owned(qpn, d.owner)?;
        // SAFETY: a QP the table names is live: `destroy_qp` removes it
        // (under this lock, held here) before the QP is destroyed, and a
        // published entry's QP has its data in place (`publish` follows
        // the data's initialisation). The reference outlives the lock: the
        // count taken next makes `destroy_qp`, which runs only after the
        // entry is gone, wait (`drain_doorbells`) until `Drop` below.
        let qp = unsafe { Qp::<SiwRs>::from_raw(raw.as_ptr()) };
        qp.data().doorbell_enter();
        Some(Ringing(qp))
    }
}

impl Drop for Ringing<'_> {
    fn drop(&mut self) {
        self.0.data().doorbell_exit();
    }
}

/// The doorbell ioctl (`helpers.c` decoded the request): rings `queue`
/// (`SIW_RS_DB_SQ` or `_RQ`) of QP `qp_id`; 0, or `-EINVAL` if the file's
/// context has no such QP.
///
/// # Safety
///
/// `data` is the private data of a doorbell file, made by [`open`] and not
/// yet released.
#[no_mangle]
pub(crate) unsafe extern "C" fn siw_rs_doorbell_ring(data: *mut c_void, queue: c_int, qp_id: c_ulong) -> c_int {
    // SAFETY: by the requirements `data` came from `Arc::into_foreign` in
    // `NewFile::doorbell` and is released only after the last ioctl.
    let d = unsafe { <Arc<Doorbells> as ForeignOwnable>::borrow(data) };
    let Some(r) = u32::try_from(qp_id).ok().and_then(|qpn| Ringing::find(&d, qpn)) else {
        return EINVAL.to_errno();
    };
    match u32::try_from(queue) {
        Ok(ffi::SIW_RS_DB_SQ) => qp::sq_doorbell(r.0),
        Ok(ffi::SIW_RS_DB_RQ) => qp::rq_doorbell(r.0),
        _ => return EINVAL.to_errno(),
    }
    0
}

/// The doorbell file's release: drops its [`Doorbells`].
///
/// # Safety
///
/// As for [`siw_rs_doorbell_ring`]; called once, after the last ioctl.
#[no_mangle]
pub(crate) unsafe extern "C" fn siw_rs_doorbell_release(data: *mut c_void) {
    // SAFETY: by the requirements; the reference taken by `into_foreign`
    // is given back once.
    drop(unsafe { <Arc<Doorbells> as ForeignOwnable>::from_foreign(data) });
}
