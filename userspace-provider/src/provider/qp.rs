// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Queue pairs: creation (plain and extended), modify/query/destroy,
//! `ibv_post_send`, `ibv_post_recv` and the `ibv_wr_*` API.

use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::ptr::null_mut;
use std::slice;

use libc::{EINVAL, EIO, ENOMEM, EOPNOTSUPP, EPROTO};

/// `kflags` bits that make a send queue post ring the doorbell: the kernel
/// is idle, or the QP is in error and flushes what is posted only when
/// rung (with `IBV_WC_WR_FLUSH_ERR`, as the verbs require; the ABI header
/// says so for both queues, the RQ's doorbell being rung only then).
const SQ_DOORBELL: u32 = sys::SIW_RS_KF_SQ_IDLE | sys::SIW_RS_KF_ERROR;

use super::{fail, log_err, zeroed_uninit, Context};
use crate::abi::{self, CreateQpResp, Limits, RingGeometry, Rqe, Sqe};
use crate::lock::QueueLock;
use crate::ring::{Producer, Ring};
use crate::sys::{self, ibv_qp, ibv_qp_ex, ibv_recv_wr, ibv_send_wr, ibv_sge};
use crate::wqe::{self, Errno, SendOp};

/// A queue pair.
#[repr(C)]
pub(crate) struct Qp {
    vqp: sys::verbs_qp,
    sq: QueueLock<SendQueue>,
    /// None when the QP uses an SRQ.
    rq: Option<QueueLock<Producer<Rqe>>>,
    /// The send queue's limits: SGEs as the kernel granted this QP.
    limits: Limits,
    /// The receive queue's (its SGEs as granted; no inline data).
    rq_limits: Limits,
    sig_all: bool,
}

/// The send queue under its lock.
struct SendQueue {
    ring: Producer<Sqe>,
    /// `ibv_wr_*` batch state.
    batch: Batch,
}

/// A batch between `ibv_wr_start` and `ibv_wr_complete`: entries are
/// written to the ring as the next one begins and published at complete.
#[derive(Default)]
struct Batch {
    /// The entry being built (its payload setters may still follow).
    pending: Option<Sqe>,
    /// First error of the batch; later calls are ignored, complete fails.
    err: Errno,
}

const QP_COMP_MASK: u32 = sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

const SEND_OPS: u64 = (sys::IBV_QP_EX_WITH_SEND
    | sys::IBV_QP_EX_WITH_SEND_WITH_IMM
    | sys::IBV_QP_EX_WITH_SEND_WITH_INV
    | sys::IBV_QP_EX_WITH_RDMA_WRITE
    | sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | sys::IBV_QP_EX_WITH_RDMA_READ
    | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | sys::IBV_QP_EX_WITH_LOCAL_INV) as u64;

impl Qp {
    /// # Safety
    /// `qp` is a QP created by this provider and not yet destroyed.
    unsafe fn from_ibv<'a>(qp: *mut ibv_qp) -> &'a Qp {
        // SAFETY: vqp (a union starting with ibv_qp) is the first field.
        unsafe { &*qp.cast::<Qp>() }
    }
}

/// Validates a create request against what siw_rs supports.
fn check_init_attr(a: &sys::ibv_qp_init_attr_ex) -> Result<(), Errno> {
    if a.comp_mask & !QP_COMP_MASK != 0 || a.qp_type != sys::IBV_QPT_RC {
        return Err(EOPNOTSUPP);
    }
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags & !SEND_OPS != 0
    {
        return Err(EOPNOTSUPP);
    }
    Ok(())
}

/// Maps a work queue ring described by the create response.
fn map_ring<E: Copy>(
    ctx: *mut sys::ibv_context,
    what: &str,
    key: u64,
    bytes: u64,
    entries: u32,
) -> Result<Ring<E>, Errno> {
    let geo = RingGeometry::new(key, bytes, entries, size_of::<E>()).map_err(|msg| {
        log_err(ctx, &format!("create {what}: {msg}"));
        EPROTO
    })?;
    // SAFETY: ctx is an open context (the caller's QP/SRQ belongs to it).
    let fd = unsafe { (*ctx).cmd_fd };
    Ring::map(fd, &geo).map_err(|e| {
        log_err(ctx, &format!("create {what}: mmap: {e}"));
        e.raw_os_error().unwrap_or(EIO)
    })
}

/// Creates a QP from extended attributes.
///
/// # Safety
/// `ctx` is an open context of this provider and `attr` a valid attribute
/// struct whose PD, CQs and SRQ belong to it.
unsafe fn create(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> Result<*mut Qp, Errno> {
    // SAFETY: valid per the caller.
    let a = unsafe { &*attr };
    check_init_attr(a)?;
    let send_ops =
        (a.comp_mask & sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
    let has_srq = !a.srq.is_null();
    let sig_all = a.sq_sig_all != 0;
    // SAFETY: ctx is ours.
    let ctx_limits = unsafe { Context::from_ibv(ctx) }.limits;

    let mut qp = zeroed_uninit::<Qp>();
    let p = qp.as_mut_ptr();
    // SAFETY: zeroed allocation; vqp is valid when zero and keeps its
    // address (the kernel object refers to it).
    let vqp = unsafe { &raw mut (*p).vqp };
    // SAFETY: all-zero is valid for the command structs.
    let (mut cmd, mut resp) = unsafe {
        (
            std::mem::zeroed::<sys::ibv_create_qp>(),
            std::mem::zeroed::<CreateQpResp>(),
        )
    };
    // SAFETY: arguments valid per the caller; sizes as passed.
    let ret = unsafe {
        sys::ibv_cmd_create_qp_ex(
            ctx,
            vqp,
            attr,
            &mut cmd,
            size_of::<sys::ibv_create_qp>(),
            &mut resp.ibv,
            size_of::<CreateQpResp>(),
        )
    };
    if ret != 0 {
        return Err(ret);
    }
    let d = resp.drv;
    let rings = map_ring::<Sqe>(ctx, "QP SQ", d.sq_key, d.sq_bytes, d.num_sqe).and_then(|sq| {
        let rq = if has_srq {
            None
        } else {
            Some(map_ring::<Rqe>(
                ctx, "QP RQ", d.rq_key, d.rq_bytes, d.num_rqe,
            )?)
        };
        Ok((sq, rq))
    });
    let (sq, rq) = match rings {
        Ok(r) => r,
        Err(e) => {
            // SAFETY: the command succeeded, so vqp is a live kernel QP.
            unsafe { sys::ibv_cmd_destroy_qp(vqp.cast()) };
            return Err(e);
        }
    };
    // The kernel checks every WQE against the SGE counts it granted this
    // QP: a post beyond them must fail here, with EINVAL, rather than
    // fail the QP when the kernel reads the entry. libibverbs writes the
    // granted capabilities back into `attr` (the ioctl path leaves the
    // write ABI's response fields untouched).
    // SAFETY: valid per the caller, and not otherwise borrowed now.
    let granted = unsafe { (*attr).cap };
    let limits = Limits {
        max_sge: granted.max_send_sge.min(ctx_limits.max_sge),
        max_inline: d.max_inline.min(ctx_limits.max_inline).min(abi::MAX_INLINE),
    };
    let rq_limits = Limits {
        max_sge: granted.max_recv_sge.min(ctx_limits.max_sge),
        max_inline: 0,
    };
    // SAFETY: initializing the remaining fields, after which every field of
    // Qp is valid.
    let qp = unsafe {
        (&raw mut (*p).sq).write(QueueLock::new(SendQueue {
            ring: Producer::new(sq),
            batch: Batch::default(),
        }));
        (&raw mut (*p).rq).write(rq.map(|r| QueueLock::new(Producer::new(r))));
        (&raw mut (*p).limits).write(limits);
        (&raw mut (*p).rq_limits).write(rq_limits);
        (&raw mut (*p).sig_all).write(sig_all);
        Box::into_raw(qp.assume_init())
    };
    if let Some(ops) = send_ops {
        // SAFETY: qp is valid and not yet visible to the application.
        unsafe { install_wr_ops(qp, ops) };
    }
    Ok(qp)
}

pub(super) unsafe extern "C" fn create_qp_ex(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: libibverbs passes an open context of ours and the caller's
    // attributes.
    match unsafe { create(ctx, attr) } {
        Ok(qp) => qp.cast(),
        Err(e) => fail(e),
    }
}

pub(super) unsafe extern "C" fn create_qp(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: pd is ours and attr the caller's valid attribute struct.
    let (ctx, a) = unsafe { ((*pd).context, &mut *attr) };
    // SAFETY: all-zero is a valid ibv_qp_init_attr_ex.
    let mut ex: sys::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.qp_context = a.qp_context;
    ex.send_cq = a.send_cq;
    ex.recv_cq = a.recv_cq;
    ex.srq = a.srq;
    ex.cap = a.cap;
    ex.qp_type = a.qp_type;
    ex.sq_sig_all = a.sq_sig_all;
    ex.comp_mask = sys::IBV_QP_INIT_ATTR_PD;
    ex.pd = pd;
    // SAFETY: ctx is the PD's (open) context; ex is valid.
    match unsafe { create(ctx, &mut ex) } {
        Ok(qp) => {
            a.cap = ex.cap;
            qp.cast()
        }
        Err(e) => fail(e),
    }
}

pub(super) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: all-zero is a valid command struct.
    let mut cmd: sys::ibv_modify_qp = unsafe { std::mem::zeroed() };
    // SAFETY: arguments as received from libibverbs.
    unsafe { sys::ibv_cmd_modify_qp(qp, attr, mask, &mut cmd, size_of::<sys::ibv_modify_qp>()) }
}

pub(super) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
    init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: all-zero is a valid command struct.
    let mut cmd: sys::ibv_query_qp = unsafe { std::mem::zeroed() };
    // SAFETY: arguments as received from libibverbs.
    unsafe {
        sys::ibv_cmd_query_qp(
            qp,
            attr,
            mask,
            init_attr,
            &mut cmd,
            size_of::<sys::ibv_query_qp>(),
        )
    }
}

pub(super) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: qp is ours.
    let ret = unsafe { sys::ibv_cmd_destroy_qp(qp) };
    if ret == 0 {
        // SAFETY: created as Box<Qp> by `create`; the kernel QP is gone and
        // the application no longer uses it. Dropping unmaps the rings.
        drop(unsafe { Box::from_raw(qp.cast::<Qp>()) });
    }
    ret
}

/// POST_SEND in the write() form of the uverbs ABI: the command header,
/// then the command.
#[repr(C)]
struct PostSendCmd {
    hdr: sys::ib_uverbs_cmd_hdr,
    cmd: sys::ib_uverbs_post_send,
}

/// Rings a queue through the context's doorbell file: `ioctl(2)` with the
/// QP number. `None` when the context has no such file, or the call
/// failed (the caller then rings through the command file, whose error is
/// the one to report: the doorbell file can only have failed if the
/// application closed or replaced its file number).
///
/// # Safety
/// `qp` is a live QP of this provider.
unsafe fn ring_doorbell_file(qp: *mut ibv_qp, request: u32) -> Option<()> {
    // SAFETY: qp and its context are live (caller); the context is ours.
    let (ctx, qpn) = unsafe { (Context::from_ibv((*qp).context), (*qp).qp_num) };
    let fd = ctx.db_fd?;
    // SAFETY: an ioctl whose argument is a number, not a pointer.
    let r = unsafe { libc::ioctl(fd, request as libc::c_ulong, libc::c_ulong::from(qpn)) };
    (r == 0).then_some(())
}

/// Rings the send queue doorbell: through the context's doorbell file,
/// else POST_SEND with no work requests.
///
/// The doorbell file's ioctl goes straight to the driver; the command
/// file's POST_SEND passes the RDMA core's command parsing and object
/// lookup first, about 1.7 us more per doorbell under TCG. A doorbell is
/// rung once per burst of posts, often once per message, so that is on the
/// latency path.
///
/// # Safety
/// `qp` is a live QP of this provider.
unsafe fn doorbell(qp: *mut ibv_qp) -> c_int {
    // SAFETY: per the caller.
    if unsafe { ring_doorbell_file(qp, abi::IOCTL_SQ_DOORBELL) }.is_some() {
        return 0;
    }
    // SAFETY: per the caller.
    unsafe { doorbell_cmd(qp) }
}

/// The send queue doorbell as a command: POST_SEND with no work requests.
///
/// Written to the command file directly, as upstream siw's provider does,
/// rather than through `ibv_cmd_post_send`: libibverbs sends that as an
/// ioctl (`INVOKE_WRITE`) whenever the kernel has the ioctl interface, and
/// the kernel's ioctl path (attribute bundle, security hook) costs more per
/// call than the write path.
///
/// # Safety
/// `qp` is a live QP of this provider.
unsafe fn doorbell_cmd(qp: *mut ibv_qp) -> c_int {
    let mut resp = sys::ib_uverbs_post_send_resp { bad_wr: 0 };
    let req = PostSendCmd {
        hdr: sys::ib_uverbs_cmd_hdr {
            command: sys::IB_USER_VERBS_CMD_POST_SEND,
            in_words: (size_of::<PostSendCmd>() / 4) as u16,
            out_words: (size_of::<sys::ib_uverbs_post_send_resp>() / 4) as u16,
        },
        cmd: sys::ib_uverbs_post_send {
            response: core::ptr::from_mut(&mut resp) as u64,
            // SAFETY: qp is live (caller).
            qp_handle: unsafe { (*qp).handle },
            wr_count: 0,
            sge_count: 0,
            wqe_size: size_of::<sys::ib_uverbs_send_wr>() as u32,
            send_wr: sys::__IncompleteArrayField::new(),
        },
    };
    // SAFETY: qp and its context are live (caller); `req` is readable for
    // its size, and the kernel writes the response into `resp`, which
    // outlives the call.
    let n = unsafe {
        libc::write(
            (*(*qp).context).cmd_fd,
            core::ptr::from_ref(&req).cast(),
            size_of::<PostSendCmd>(),
        )
    };
    if n == size_of::<PostSendCmd>() as isize {
        0
    } else if n < 0 {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(EIO)
    } else {
        EIO
    }
}

/// The SGE list of a work request, bounded by `max` entries.
///
/// # Safety
/// `list` holds `num` valid entries when `num` is within bounds.
unsafe fn sge_list<'a>(list: *const ibv_sge, num: c_int, max: u32) -> Result<&'a [ibv_sge], Errno> {
    match u32::try_from(num) {
        Ok(0) => Ok(&[]),
        Ok(n) if n <= max && !list.is_null() => {
            // SAFETY: per the caller.
            Ok(unsafe { slice::from_raw_parts(list, n as usize) })
        }
        _ => Err(EINVAL),
    }
}

/// The memory an SGE names, for inline data.
///
/// # Safety
/// With `IBV_SEND_INLINE` the SGE addresses are readable buffers of their
/// lengths for the duration of ibv_post_send (the verbs contract).
unsafe fn sge_bytes<'a>(s: &ibv_sge) -> &'a [u8] {
    if s.length == 0 {
        return &[];
    }
    // SAFETY: per the caller.
    unsafe { slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize) }
}

/// The operation of a send work request.
fn send_op(w: &ibv_send_wr) -> Result<SendOp, Errno> {
    // SAFETY: the union members are plain integers; for each opcode only
    // the member the verbs API defines for it is read.
    let op = unsafe {
        match w.opcode {
            sys::IBV_WR_SEND => SendOp::Send,
            sys::IBV_WR_SEND_WITH_IMM => SendOp::SendImm {
                imm: w.__bindgen_anon_1.imm_data,
            },
            sys::IBV_WR_SEND_WITH_INV => SendOp::SendInv {
                stag: w.__bindgen_anon_1.invalidate_rkey,
            },
            sys::IBV_WR_RDMA_WRITE => SendOp::Write {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            sys::IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
                imm: w.__bindgen_anon_1.imm_data,
            },
            sys::IBV_WR_RDMA_READ => SendOp::Read {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            sys::IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CmpSwp {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                compare: w.wr.atomic.compare_add,
                swap: w.wr.atomic.swap,
            },
            sys::IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                add: w.wr.atomic.compare_add,
            },
            sys::IBV_WR_LOCAL_INV => SendOp::LocalInv {
                stag: w.__bindgen_anon_1.invalidate_rkey,
            },
            _ => return Err(EINVAL),
        }
    };
    Ok(op)
}

/// Encodes one send work request.
///
/// # Safety
/// `w` is a valid work request (its SGE list and, with inline, the
/// buffers it names, readable).
unsafe fn sqe_from_wr(w: &ibv_send_wr, qp: &Qp) -> Result<Sqe, Errno> {
    let (flags, inline) = wqe::sqe_flags(w.send_flags, qp.sig_all)?;
    let op = send_op(w)?;
    let mut sqe = wqe::new_sqe(w.wr_id, op, flags);
    if let SendOp::LocalInv { .. } = op {
        // No payload; the SGE list, if any, is ignored.
        return Ok(sqe);
    }
    if inline {
        // Each SGE is one buffer; their total is checked before copying.
        // SAFETY: per the caller.
        let sges = unsafe { sge_list(w.sg_list, w.num_sge, abi::MAX_INLINE) }?;
        if wqe::sge_bytes(sges) > u64::from(qp.limits.max_inline) {
            return Err(EINVAL);
        }
        // SAFETY: inline SGEs name readable buffers (per the caller).
        wqe::set_inline(
            &mut sqe,
            sges.iter().map(|s| unsafe { sge_bytes(s) }),
            &qp.limits,
        )?;
    } else {
        // SAFETY: per the caller.
        let sges = unsafe { sge_list(w.sg_list, w.num_sge, qp.limits.max_sge) }?;
        wqe::set_sges(&mut sqe, sges, &qp.limits)?;
    }
    Ok(sqe)
}

pub(super) unsafe extern "C" fn post_send(
    ibqp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: ibqp is ours.
    let qp = unsafe { Qp::from_ibv(ibqp) };
    let (err, ring_doorbell) = {
        let mut sq = qp.sq.lock();
        let mut cur = wr;
        let mut err = 0;
        while err == 0 && !cur.is_null() {
            // SAFETY: the caller passes a valid NULL-terminated list.
            let w = unsafe { &*cur };
            // SAFETY: w is a valid work request (verbs contract).
            match unsafe { sqe_from_wr(w, qp) }
                .and_then(|sqe| sq.ring.push(&sqe).map_err(|_| ENOMEM))
            {
                Ok(()) => cur = w.next,
                Err(e) => err = e,
            }
        }
        if err != 0 {
            // SAFETY: bad_wr is the caller's out pointer.
            unsafe { *bad_wr = cur };
        }
        let ring_doorbell = sq.ring.unpublished() > 0 && {
            sq.ring.publish();
            sq.ring.needs_doorbell(SQ_DOORBELL)
        };
        (err, ring_doorbell)
    };
    if ring_doorbell {
        // SAFETY: ibqp is live. As with rxe, a doorbell failure is returned
        // without *bad_wr: the entries are already in the ring.
        let db = unsafe { doorbell(ibqp) };
        if err == 0 {
            return db;
        }
    }
    err
}

/// How a receive queue treats the kernel's `ERROR` flag.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum OnError {
    /// A QP's RQ: post anyway and ring the RQ doorbell, the kernel flushes.
    Flush,
    /// An SRQ (the kernel found garbage in it): post nothing, `EIO`.
    Refuse,
}

/// Encodes and queues a list of receive work requests and publishes the
/// queued ones. Shared by QPs and SRQs. Returns the error (with `*bad_wr`
/// set) and whether the RQ doorbell must be rung (the QP is in error).
///
/// # Safety
/// `wr` is a valid NULL-terminated list and `bad_wr` a valid out pointer.
pub(super) unsafe fn post_recv_list(
    rq: &QueueLock<Producer<Rqe>>,
    limits: &Limits,
    on_error: OnError,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> (c_int, bool) {
    let mut ring = rq.lock();
    let mut cur = wr;
    let mut err = if on_error == OnError::Refuse && ring.in_error() {
        EIO
    } else {
        0
    };
    while err == 0 && !cur.is_null() {
        // SAFETY: per the caller.
        let w = unsafe { &*cur };
        // SAFETY: the work request's SGE list holds num_sge entries.
        let r = unsafe { sge_list(w.sg_list, w.num_sge, limits.max_sge) }
            .and_then(|sges| wqe::new_rqe(w.wr_id, sges, limits))
            .and_then(|rqe| ring.push(&rqe).map_err(|_| ENOMEM));
        match r {
            Ok(()) => cur = w.next,
            Err(e) => err = e,
        }
    }
    if err != 0 {
        // SAFETY: per the caller.
        unsafe { *bad_wr = cur };
    }
    let ring_doorbell = ring.unpublished() > 0 && {
        ring.publish();
        on_error == OnError::Flush && ring.needs_doorbell(sys::SIW_RS_KF_ERROR)
    };
    (err, ring_doorbell)
}

pub(super) unsafe extern "C" fn post_recv(
    ibqp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: ibqp is ours.
    let qp = unsafe { Qp::from_ibv(ibqp) };
    let Some(rq) = &qp.rq else {
        // Receives go to the SRQ.
        // SAFETY: bad_wr is the caller's out pointer.
        unsafe { *bad_wr = wr };
        return EINVAL;
    };
    // SAFETY: wr/bad_wr as received from the caller.
    let (err, ring_doorbell) =
        unsafe { post_recv_list(rq, &qp.rq_limits, OnError::Flush, wr, bad_wr) };
    if ring_doorbell {
        // SAFETY: ibqp is live.
        let db = if unsafe { ring_doorbell_file(ibqp, abi::IOCTL_RQ_DOORBELL) }.is_some() {
            0
        } else {
            let mut bad = null_mut();
            // SAFETY: ibqp is live; an empty list is the RQ doorbell.
            unsafe { sys::ibv_cmd_post_recv(ibqp, null_mut(), &mut bad) }
        };
        if err == 0 {
            return db;
        }
    }
    err
}

// ---------------------------------------------------------------------------
// The ibv_wr_* API. Between ibv_wr_start and ibv_wr_complete/abort the
// calling thread holds the SQ lock and makes no other call on the QP (the
// API's contract), which the `held()` below relies on.

/// Installs the `ibv_wr_*` entry points for the operations in `ops` and
/// marks the QP extended.
///
/// # Safety
/// `qp` is valid and not yet visible to the application.
unsafe fn install_wr_ops(qp: *mut Qp, ops: u64) {
    // SAFETY: per the caller; qp_ex overlays the QP's ibv_qp.
    let (vqp, ex) = unsafe { (&mut (*qp).vqp, &mut (*qp).vqp.__bindgen_anon_1.qp_ex) };
    let has = |f: u32| ops & u64::from(f) != 0;
    if has(sys::IBV_QP_EX_WITH_SEND) {
        ex.wr_send = Some(wr_send);
    }
    if has(sys::IBV_QP_EX_WITH_SEND_WITH_IMM) {
        ex.wr_send_imm = Some(wr_send_imm);
    }
    if has(sys::IBV_QP_EX_WITH_SEND_WITH_INV) {
        ex.wr_send_inv = Some(wr_send_inv);
    }
    if has(sys::IBV_QP_EX_WITH_RDMA_WRITE) {
        ex.wr_rdma_write = Some(wr_rdma_write);
    }
    if has(sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
        ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if has(sys::IBV_QP_EX_WITH_RDMA_READ) {
        ex.wr_rdma_read = Some(wr_rdma_read);
    }
    if has(sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
        ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if has(sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
        ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
    if has(sys::IBV_QP_EX_WITH_LOCAL_INV) {
        ex.wr_local_inv = Some(wr_local_inv);
    }
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
    vqp.comp_mask |= sys::VERBS_QP_EX;
}

/// The QP and its send queue inside a batch.
///
/// # Safety
/// `ibqp` is ours and this thread is inside wr_start … wr_complete/abort.
unsafe fn in_batch<'a>(ibqp: *mut ibv_qp_ex) -> (&'a Qp, &'a mut SendQueue) {
    // SAFETY: per the caller: ibv_qp_ex is at offset 0 of Qp and the SQ
    // lock is held by this thread.
    unsafe {
        let qp = Qp::from_ibv(ibqp.cast());
        (qp, qp.sq.held())
    }
}

unsafe extern "C" fn wr_start(ibqp: *mut ibv_qp_ex) {
    // SAFETY: ibqp is ours.
    let qp = unsafe { Qp::from_ibv(ibqp.cast()) };
    qp.sq.acquire();
    // SAFETY: acquired just above.
    let sq = unsafe { qp.sq.held() };
    sq.batch = Batch::default();
}

/// Begins a new work request of the batch: the previous one goes into the
/// ring, the new one takes wr_id and wr_flags from the ibv_qp_ex.
///
/// # Safety
/// As `in_batch`.
unsafe fn begin(ibqp: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: per the caller.
    let (qp, sq) = unsafe { in_batch(ibqp) };
    // SAFETY: wr_id and wr_flags are plain fields the application set.
    let (wr_id, wr_flags) = unsafe { ((*ibqp).wr_id, (*ibqp).wr_flags) };
    if sq.batch.err != 0 {
        return;
    }
    let r = flush_pending(sq)
        .and_then(|()| {
            if sq.ring.free_slots() == 0 {
                Err(ENOMEM)
            } else {
                Ok(())
            }
        })
        // Inline data comes through wr_set_inline_data*, not the flag.
        .and_then(|()| wqe::sqe_flags(wr_flags & !sys::IBV_SEND_INLINE, qp.sig_all));
    match r {
        Ok((flags, _)) => sq.batch.pending = Some(wqe::new_sqe(wr_id, op, flags)),
        Err(e) => sq.batch.err = e,
    }
}

fn flush_pending(sq: &mut SendQueue) -> Result<(), Errno> {
    match sq.batch.pending.take() {
        Some(sqe) => sq.ring.push(&sqe).map_err(|_| ENOMEM),
        None => Ok(()),
    }
}

/// Applies a payload setter to the work request being built.
///
/// # Safety
/// As `in_batch`.
unsafe fn set_payload(
    ibqp: *mut ibv_qp_ex,
    f: impl FnOnce(&mut Sqe, &Limits) -> Result<(), Errno>,
) {
    // SAFETY: per the caller.
    let (qp, sq) = unsafe { in_batch(ibqp) };
    if sq.batch.err != 0 {
        return;
    }
    let r = match sq.batch.pending.as_mut() {
        Some(sqe) => f(sqe, &qp.limits),
        None => Err(EINVAL),
    };
    if let Err(e) = r {
        sq.batch.err = e;
    }
}

unsafe extern "C" fn wr_complete(ibqp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: inside a batch (API contract).
    let (qp, sq) = unsafe { in_batch(ibqp) };
    if sq.batch.err == 0 {
        if let Err(e) = flush_pending(sq) {
            sq.batch.err = e;
        }
    }
    let err = sq.batch.err;
    let ring_doorbell = if err != 0 {
        sq.ring.rollback();
        false
    } else {
        sq.ring.unpublished() > 0 && {
            sq.ring.publish();
            sq.ring.needs_doorbell(SQ_DOORBELL)
        }
    };
    sq.batch = Batch::default();
    // SAFETY: the lock was taken by wr_start; `sq` is not used after this.
    unsafe { qp.sq.release() };
    if ring_doorbell {
        // SAFETY: the QP is live.
        return unsafe { doorbell(ibqp.cast()) };
    }
    err
}

unsafe extern "C" fn wr_abort(ibqp: *mut ibv_qp_ex) {
    // SAFETY: inside a batch (API contract); the lock is released last.
    unsafe {
        let (qp, sq) = in_batch(ibqp);
        sq.ring.rollback();
        sq.batch = Batch::default();
        qp.sq.release();
    }
}

unsafe extern "C" fn wr_send(ibqp: *mut ibv_qp_ex) {
    // SAFETY: inside a batch (API contract), as for every wr_* below.
    unsafe { begin(ibqp, SendOp::Send) }
}

unsafe extern "C" fn wr_send_imm(ibqp: *mut ibv_qp_ex, imm: sys::__be32) {
    // SAFETY: inside a batch.
    unsafe { begin(ibqp, SendOp::SendImm { imm }) }
}

unsafe extern "C" fn wr_send_inv(ibqp: *mut ibv_qp_ex, stag: u32) {
    // SAFETY: inside a batch.
    unsafe { begin(ibqp, SendOp::SendInv { stag }) }
}

unsafe extern "C" fn wr_rdma_write(ibqp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: inside a batch.
    unsafe { begin(ibqp, SendOp::Write { remote_addr, rkey }) }
}

unsafe extern "C" fn wr_rdma_write_imm(
    ibqp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: sys::__be32,
) {
    // SAFETY: inside a batch.
    unsafe {
        begin(
            ibqp,
            SendOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            },
        )
    }
}

unsafe extern "C" fn wr_rdma_read(ibqp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: inside a batch.
    unsafe { begin(ibqp, SendOp::Read { remote_addr, rkey }) }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    ibqp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: inside a batch.
    unsafe {
        begin(
            ibqp,
            SendOp::CmpSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            },
        )
    }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    ibqp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // SAFETY: inside a batch.
    unsafe {
        begin(
            ibqp,
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            },
        )
    }
}

unsafe extern "C" fn wr_local_inv(ibqp: *mut ibv_qp_ex, stag: u32) {
    // SAFETY: inside a batch.
    unsafe { begin(ibqp, SendOp::LocalInv { stag }) }
}

unsafe extern "C" fn wr_set_sge(ibqp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let sge = [ibv_sge { addr, length, lkey }];
    // A zero-length SGE is no data at all (as in rxe).
    let sges: &[ibv_sge] = if length == 0 { &[] } else { &sge };
    // SAFETY: inside a batch.
    unsafe { set_payload(ibqp, |sqe, l| wqe::set_sges(sqe, sges, l)) }
}

unsafe extern "C" fn wr_set_sge_list(
    ibqp: *mut ibv_qp_ex,
    num_sge: usize,
    sg_list: *const ibv_sge,
) {
    let n = c_int::try_from(num_sge).unwrap_or(c_int::MAX);
    // SAFETY: inside a batch; sg_list holds num_sge entries (the bound is
    // checked before the slice is formed).
    unsafe {
        set_payload(ibqp, |sqe, l| {
            let sges = sge_list(sg_list, n, l.max_sge)?;
            wqe::set_sges(sqe, sges, l)
        })
    }
}

unsafe extern "C" fn wr_set_inline_data(ibqp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: inside a batch; addr is readable for length octets (the
    // length is checked against the inline limit before the slice is
    // formed).
    unsafe {
        set_payload(ibqp, |sqe, l| {
            if length > l.max_inline as usize {
                return Err(EINVAL);
            }
            let data: &[u8] = if length == 0 {
                &[]
            } else {
                slice::from_raw_parts(addr.cast(), length)
            };
            wqe::set_inline(sqe, [data], l)
        })
    }
}

unsafe extern "C" fn wr_set_inline_data_list(
    ibqp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const sys::ibv_data_buf,
) {
    // SAFETY: inside a batch; buf_list holds num_buf buffers, each readable
    // for its length. set_inline stops at the first buffer that would
    // exceed the inline limit, and a buffer longer than the limit is
    // rejected before its slice is formed.
    unsafe {
        set_payload(ibqp, |sqe, l| {
            if num_buf > 0 && buf_list.is_null() {
                return Err(EINVAL);
            }
            let bufs: &[sys::ibv_data_buf] = if num_buf == 0 {
                &[]
            } else {
                slice::from_raw_parts(buf_list, num_buf)
            };
            if bufs.iter().any(|b| b.length > l.max_inline as usize) {
                return Err(EINVAL);
            }
            let data = bufs.iter().map(|b| -> &[u8] {
                if b.length == 0 {
                    &[]
                } else {
                    slice::from_raw_parts(b.addr.cast(), b.length)
                }
            });
            wqe::set_inline(sqe, data, l)
        })
    }
}
