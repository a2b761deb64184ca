// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Completion queues: creation (plain and extended), `ibv_poll_cq`, the
//! `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` API, arming, destroy.

use std::ffi::c_int;
use std::mem::size_of;

use libc::{EINVAL, EIO, ENOENT, EOPNOTSUPP, EPROTO};

use super::{fail, log_err, zeroed_uninit};
use crate::abi::{Cqe, CreateCqExResp, CreateCqResp, RingGeometry};
use crate::lock::QueueLock;
use crate::ring::Ring;
use crate::sys::{self, ibv_context, ibv_cq, ibv_cq_ex};
use crate::wqe::{self, Errno};

/// A completion queue.
#[repr(C)]
pub(crate) struct Cq {
    vcq: sys::verbs_cq,
    ring: Ring<Cqe>,
    cursor: QueueLock<Cursor>,
}

/// The consumer's state, under the CQ lock.
struct Cursor {
    /// Next entry to consume.
    cons: u32,
    /// Extended API: entries handed out since `start_poll`.
    taken: u32,
    /// Extended API: the current entry, a copy out of the ring.
    cur: Cqe,
}

const EMPTY_CQE: Cqe = Cqe {
    wr_id: 0,
    opcode: 0,
    status: 0,
    flags: 0,
    rsvd0: 0,
    byte_len: 0,
    qp_num: 0,
    imm_or_inv: 0,
    vendor_err: 0,
    rsvd1: 0,
};

/// Work completion fields of the extended API this provider can report
/// (iWARP has no SLID/SL/path bits: those read as 0).
const SUPPORTED_WC_FLAGS: u64 = (sys::IBV_WC_EX_WITH_BYTE_LEN
    | sys::IBV_WC_EX_WITH_IMM
    | sys::IBV_WC_EX_WITH_QP_NUM
    | sys::IBV_WC_EX_WITH_SRC_QP
    | sys::IBV_WC_EX_WITH_SLID
    | sys::IBV_WC_EX_WITH_SL
    | sys::IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

impl Cq {
    /// # Safety
    /// `cq` is a CQ created by this provider and not yet destroyed.
    unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> &'a Cq {
        // SAFETY: vcq (a union starting with ibv_cq) is the first field.
        unsafe { &*cq.cast::<Cq>() }
    }

    /// # Safety
    /// As `from_ibv`.
    unsafe fn from_ex<'a>(cq: *mut ibv_cq_ex) -> &'a Cq {
        // SAFETY: as above; ibv_cq_ex starts at the same address.
        unsafe { &*cq.cast::<Cq>() }
    }
}

/// Creates the CQ: `cmd` runs the create command on the (final) verbs_cq
/// and returns the driver response; then the ring is mapped.
///
/// # Safety
/// `ctx` is an open context of this provider; `cmd` only runs an
/// ibv_cmd_create_cq* on the pointer it is given.
unsafe fn create(
    ctx: *mut ibv_context,
    cmd: impl FnOnce(*mut sys::verbs_cq) -> Result<sys::siw_rs_uresp_create_cq, Errno>,
) -> Result<*mut Cq, Errno> {
    let mut cq = zeroed_uninit::<Cq>();
    let p = cq.as_mut_ptr();
    // SAFETY: p points to a zeroed allocation; the vcq field is valid when
    // zero and keeps its address (the kernel object refers to it).
    let vcq = unsafe { &raw mut (*p).vcq };
    let drv = cmd(vcq)?;
    let destroy = |e: Errno| {
        // SAFETY: the command succeeded, so vcq is a live kernel CQ.
        unsafe { sys::ibv_cmd_destroy_cq(vcq.cast()) };
        e
    };
    let geo = RingGeometry::new(drv.ring_key, drv.ring_bytes, drv.num_cqe, size_of::<Cqe>())
        .map_err(|msg| {
            log_err(ctx, &format!("create_cq: {msg}"));
            destroy(EPROTO)
        })?;
    // SAFETY: ctx is open.
    let fd = unsafe { (*ctx).cmd_fd };
    let ring = Ring::map(fd, &geo).map_err(|e| {
        log_err(ctx, &format!("create_cq: mmap of the CQ ring: {e}"));
        destroy(e.raw_os_error().unwrap_or(EIO))
    })?;
    let cons = ring.cons().load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: initializing the remaining fields of the allocation, after
    // which every field of Cq is valid.
    let cq = unsafe {
        (&raw mut (*p).ring).write(ring);
        (&raw mut (*p).cursor).write(QueueLock::new(Cursor {
            cons,
            taken: 0,
            cur: EMPTY_CQE,
        }));
        Box::into_raw(cq.assume_init())
    };
    // SAFETY: cq is valid; the extended API entry points are always set
    // (libibverbs only calls the read_* a CQ was created with).
    unsafe {
        let ex = &mut (*cq).vcq.__bindgen_anon_1.cq_ex;
        ex.start_poll = Some(start_poll);
        ex.next_poll = Some(next_poll);
        ex.end_poll = Some(end_poll);
        ex.read_opcode = Some(read_opcode);
        ex.read_vendor_err = Some(read_vendor_err);
        ex.read_wc_flags = Some(read_wc_flags);
        ex.read_byte_len = Some(read_byte_len);
        ex.read_imm_data = Some(read_imm_data);
        ex.read_qp_num = Some(read_qp_num);
        ex.read_src_qp = Some(read_zero_u32);
        ex.read_slid = Some(read_zero_u32);
        ex.read_sl = Some(read_zero_u8);
        ex.read_dlid_path_bits = Some(read_zero_u8);
    }
    Ok(cq)
}

pub(super) unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    channel: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let cmd = |vcq: *mut sys::verbs_cq| {
        // SAFETY: all-zero is valid for the command structs.
        let (mut cmd, mut resp) = unsafe {
            (
                std::mem::zeroed::<sys::ibv_create_cq>(),
                std::mem::zeroed::<CreateCqResp>(),
            )
        };
        // SAFETY: ctx/channel as received; vcq is the CQ's final address.
        let ret = unsafe {
            sys::ibv_cmd_create_cq(
                ctx,
                cqe,
                channel,
                comp_vector,
                vcq.cast(),
                &mut cmd,
                size_of::<sys::ibv_create_cq>(),
                &mut resp.ibv,
                size_of::<CreateCqResp>(),
            )
        };
        if ret != 0 {
            Err(ret)
        } else {
            Ok(resp.drv)
        }
    };
    // SAFETY: ctx is an open context of ours; cmd runs ibv_cmd_create_cq.
    match unsafe { create(ctx, cmd) } {
        Ok(cq) => cq.cast(),
        Err(e) => fail(e),
    }
}

pub(super) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut sys::ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    // SAFETY: libibverbs passes the caller's valid attribute struct.
    let a = unsafe { &*attr };
    if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        return fail(EOPNOTSUPP);
    }
    if a.comp_mask & !sys::IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
        || (a.comp_mask & sys::IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
            && a.flags & !sys::IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0)
    {
        return fail(EOPNOTSUPP);
    }
    let cmd = |vcq: *mut sys::verbs_cq| {
        // SAFETY: all-zero is a valid response struct.
        let mut resp = unsafe { std::mem::zeroed::<CreateCqExResp>() };
        // SAFETY: as in create_cq; a NULL command means "no driver data".
        let ret = unsafe {
            sys::ibv_cmd_create_cq_ex(
                ctx,
                attr,
                vcq,
                std::ptr::null_mut(),
                0,
                &mut resp.ibv,
                size_of::<CreateCqExResp>(),
                0,
            )
        };
        if ret != 0 {
            Err(ret)
        } else {
            Ok(resp.drv)
        }
    };
    // SAFETY: ctx is an open context of ours; cmd runs ibv_cmd_create_cq_ex.
    match unsafe { create(ctx, cmd) } {
        Ok(cq) => cq.cast(),
        Err(e) => fail(e),
    }
}

pub(super) unsafe extern "C" fn destroy_cq(ibcq: *mut ibv_cq) -> c_int {
    // SAFETY: ibcq is ours.
    let ret = unsafe { sys::ibv_cmd_destroy_cq(ibcq) };
    if ret == 0 {
        // SAFETY: created as Box<Cq> by `create`; the kernel CQ is gone and
        // the application no longer uses it. Dropping unmaps the ring.
        drop(unsafe { Box::from_raw(ibcq.cast::<Cq>()) });
    }
    ret
}

pub(super) unsafe extern "C" fn poll_cq(
    ibcq: *mut ibv_cq,
    ne: c_int,
    wc: *mut sys::ibv_wc,
) -> c_int {
    // SAFETY: ibcq is ours.
    let cq = unsafe { Cq::from_ibv(ibcq) };
    let Ok(ne) = u32::try_from(ne) else {
        return -EINVAL;
    };
    let mut cur = cq.cursor.lock();
    let n = match cq.ring.available(cur.cons) {
        Ok(n) => n.min(ne),
        Err(_) => return -EIO,
    };
    for i in 0..n {
        let c = cq.ring.read(cur.cons.wrapping_add(i));
        // SAFETY: the caller's array holds ne >= n entries.
        unsafe { wc.add(i as usize).write(wqe::wc_from_cqe(&c)) };
    }
    // An empty poll stores nothing: the index is unchanged, and a store
    // would take its cache line from the kernel, which reads it each time
    // it adds a completion, once per poll of a busy-polling process.
    if n > 0 {
        cur.cons = cur.cons.wrapping_add(n);
        cq.ring.release(cur.cons);
    }
    n as c_int
}

pub(super) unsafe extern "C" fn req_notify_cq(ibcq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: ibcq is ours.
    let cq = unsafe { Cq::from_ibv(ibcq) };
    cq.ring.arm(if solicited_only != 0 {
        sys::SIW_RS_NOTIFY_SOLICITED
    } else {
        sys::SIW_RS_NOTIFY_NEXT
    });
    0
}

// ---------------------------------------------------------------------------
// Extended polling. Between a successful start_poll and end_poll the
// calling thread holds the CQ lock (the ibv_start_poll contract: no other
// call on this CQ in between), which the `held()` calls below rely on.

/// Makes `cur` the current entry and publishes its status and wr_id.
fn set_current(ibcq: *mut ibv_cq_ex, cur: &Cursor) {
    // SAFETY: ibcq is ours; status and wr_id are plain fields the
    // application reads after start_poll/next_poll.
    unsafe {
        (*ibcq).status = cur.cur.status as sys::ibv_wc_status;
        (*ibcq).wr_id = cur.cur.wr_id;
    }
}

unsafe extern "C" fn start_poll(ibcq: *mut ibv_cq_ex, attr: *mut sys::ibv_poll_cq_attr) -> c_int {
    // SAFETY: attr is the caller's valid attribute struct.
    if unsafe { (*attr).comp_mask } != 0 {
        return EINVAL;
    }
    // SAFETY: ibcq is ours.
    let cq = unsafe { Cq::from_ex(ibcq) };
    cq.cursor.acquire();
    // SAFETY: acquired just above.
    let cur = unsafe { cq.cursor.held() };
    let err = match cq.ring.available(cur.cons) {
        Ok(0) => ENOENT,
        Ok(_) => {
            cur.cur = cq.ring.read(cur.cons);
            cur.taken = 1;
            set_current(ibcq, cur);
            return 0;
        }
        Err(_) => EIO,
    };
    // SAFETY: held by this thread; no end_poll follows a failed start_poll.
    unsafe { cq.cursor.release() };
    err
}

unsafe extern "C" fn next_poll(ibcq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: ibcq is ours, locked by start_poll.
    let (cq, cur) = unsafe {
        let cq = Cq::from_ex(ibcq);
        (cq, cq.cursor.held())
    };
    match cq.ring.available(cur.cons) {
        Ok(n) if n > cur.taken => {
            cur.cur = cq.ring.read(cur.cons.wrapping_add(cur.taken));
            cur.taken += 1;
            set_current(ibcq, cur);
            0
        }
        Ok(_) => ENOENT,
        Err(_) => EIO,
    }
}

unsafe extern "C" fn end_poll(ibcq: *mut ibv_cq_ex) {
    // SAFETY: ibcq is ours, locked by start_poll; unlocked here.
    unsafe {
        let cq = Cq::from_ex(ibcq);
        let cur = cq.cursor.held();
        cur.cons = cur.cons.wrapping_add(cur.taken);
        cur.taken = 0;
        cq.ring.release(cur.cons);
        cq.cursor.release();
    }
}

/// The current entry of a CQ being polled with the extended API.
///
/// # Safety
/// Called between a successful start_poll and end_poll on `ibcq`.
unsafe fn current(ibcq: *mut ibv_cq_ex) -> Cqe {
    // SAFETY: per the caller, this thread holds the CQ lock.
    unsafe { Cq::from_ex(ibcq).cursor.held().cur }
}

unsafe extern "C" fn read_opcode(ibcq: *mut ibv_cq_ex) -> sys::ibv_wc_opcode {
    // SAFETY: a read_* call happens inside a poll batch.
    unsafe { current(ibcq) }.opcode as sys::ibv_wc_opcode
}

unsafe extern "C" fn read_vendor_err(ibcq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { current(ibcq) }.vendor_err
}

unsafe extern "C" fn read_byte_len(ibcq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { current(ibcq) }.byte_len
}

unsafe extern "C" fn read_imm_data(ibcq: *mut ibv_cq_ex) -> sys::__be32 {
    // SAFETY: as read_opcode. Also serves ibv_wc_read_invalidated_rkey.
    unsafe { current(ibcq) }.imm_or_inv
}

unsafe extern "C" fn read_qp_num(ibcq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { current(ibcq) }.qp_num
}

unsafe extern "C" fn read_wc_flags(ibcq: *mut ibv_cq_ex) -> std::ffi::c_uint {
    // SAFETY: as read_opcode.
    wqe::wc_flags(&unsafe { current(ibcq) })
}

unsafe extern "C" fn read_zero_u32(_ibcq: *mut ibv_cq_ex) -> u32 {
    0
}

unsafe extern "C" fn read_zero_u8(_ibcq: *mut ibv_cq_ex) -> u8 {
    0
}
