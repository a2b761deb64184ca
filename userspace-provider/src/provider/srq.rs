// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Shared receive queues: create/modify/query/destroy and
//! `ibv_post_srq_recv` (a receive ring like a QP's, no doorbell).

use std::ffi::c_int;
use std::mem::size_of;

use super::qp::{post_recv_list, OnError};
use super::{fail, log_err, zeroed_uninit, Context};
use crate::abi::{CreateSrqResp, Limits, RingGeometry, Rqe};
use crate::lock::QueueLock;
use crate::ring::{Producer, Ring};
use crate::sys::{self, ibv_srq};
use crate::wqe::Errno;

/// A shared receive queue.
#[repr(C)]
pub(crate) struct Srq {
    srq: ibv_srq,
    rq: QueueLock<Producer<Rqe>>,
    limits: Limits,
}

impl Srq {
    /// # Safety
    /// `srq` is an SRQ created by this provider and not yet destroyed.
    unsafe fn from_ibv<'a>(srq: *mut ibv_srq) -> &'a Srq {
        // SAFETY: ibv_srq is the first field.
        unsafe { &*srq.cast::<Srq>() }
    }
}

/// # Safety
/// `pd` is a PD of this provider, `attr` the caller's valid attributes.
unsafe fn create(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_srq_init_attr,
) -> Result<*mut Srq, Errno> {
    // SAFETY: pd is ours.
    let ctx = unsafe { (*pd).context };
    // SAFETY: ctx is open (it owns pd).
    let limits = unsafe { Context::from_ibv(ctx) }.limits;
    let mut srq = zeroed_uninit::<Srq>();
    let p = srq.as_mut_ptr();
    // SAFETY: zeroed allocation; the ibv_srq field is valid when zero and
    // keeps its address (the kernel object refers to it).
    let ibsrq = unsafe { &raw mut (*p).srq };
    // SAFETY: all-zero is valid for the command structs.
    let (mut cmd, mut resp) = unsafe {
        (
            std::mem::zeroed::<sys::ibv_create_srq>(),
            std::mem::zeroed::<CreateSrqResp>(),
        )
    };
    // SAFETY: arguments valid per the caller; sizes as passed.
    let ret = unsafe {
        sys::ibv_cmd_create_srq(
            pd,
            ibsrq,
            attr,
            &mut cmd,
            size_of::<sys::ibv_create_srq>(),
            &mut resp.ibv,
            size_of::<CreateSrqResp>(),
        )
    };
    if ret != 0 {
        return Err(ret);
    }
    let d = resp.drv;
    let ring = RingGeometry::new(d.rq_key, d.rq_bytes, d.num_rqe, size_of::<Rqe>())
        .map_err(|msg| {
            log_err(ctx, &format!("create SRQ: {msg}"));
            libc::EPROTO
        })
        .and_then(|geo| {
            // SAFETY: ctx is open.
            let fd = unsafe { (*ctx).cmd_fd };
            Ring::map(fd, &geo).map_err(|e| {
                log_err(ctx, &format!("create SRQ: mmap: {e}"));
                e.raw_os_error().unwrap_or(libc::EIO)
            })
        });
    let ring = match ring {
        Ok(r) => r,
        Err(e) => {
            // SAFETY: the command succeeded, so ibsrq is a live kernel SRQ.
            unsafe { sys::ibv_cmd_destroy_srq(ibsrq) };
            return Err(e);
        }
    };
    // SAFETY: initializing the remaining fields, after which every field of
    // Srq is valid.
    Ok(unsafe {
        (&raw mut (*p).rq).write(QueueLock::new(Producer::new(ring)));
        // SGEs as granted to this SRQ, which libibverbs wrote back into
        // `attr` (see the QP's limits).
        (&raw mut (*p).limits).write(Limits {
            max_sge: (*attr).attr.max_sge.min(limits.max_sge),
            ..limits
        });
        Box::into_raw(srq.assume_init())
    })
}

pub(super) unsafe extern "C" fn create_srq(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_srq_init_attr,
) -> *mut ibv_srq {
    // SAFETY: libibverbs passes a PD of ours and the caller's attributes.
    match unsafe { create(pd, attr) } {
        Ok(srq) => srq.cast(),
        Err(e) => fail(e),
    }
}

pub(super) unsafe extern "C" fn modify_srq(
    srq: *mut ibv_srq,
    attr: *mut sys::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: all-zero is a valid command struct.
    let mut cmd: sys::ibv_modify_srq = unsafe { std::mem::zeroed() };
    // SAFETY: arguments as received from libibverbs.
    unsafe { sys::ibv_cmd_modify_srq(srq, attr, mask, &mut cmd, size_of::<sys::ibv_modify_srq>()) }
}

pub(super) unsafe extern "C" fn query_srq(
    srq: *mut ibv_srq,
    attr: *mut sys::ibv_srq_attr,
) -> c_int {
    // SAFETY: all-zero is a valid command struct.
    let mut cmd: sys::ibv_query_srq = unsafe { std::mem::zeroed() };
    // SAFETY: arguments as received from libibverbs.
    unsafe { sys::ibv_cmd_query_srq(srq, attr, &mut cmd, size_of::<sys::ibv_query_srq>()) }
}

pub(super) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: srq is ours.
    let ret = unsafe { sys::ibv_cmd_destroy_srq(srq) };
    if ret == 0 {
        // SAFETY: created as Box<Srq> by `create`; the kernel SRQ is gone
        // and the application no longer uses it. Dropping unmaps the ring.
        drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
    }
    ret
}

pub(super) unsafe extern "C" fn post_srq_recv(
    ibsrq: *mut ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: ibsrq is ours; wr/bad_wr as received from the caller.
    unsafe {
        let srq = Srq::from_ibv(ibsrq);
        post_recv_list(&srq.rq, &srq.limits, OnError::Refuse, wr, bad_wr).0
    }
}
