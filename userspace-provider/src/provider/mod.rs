// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The FFI boundary with libibverbs: registration, device and context
//! callbacks, protection domains and memory regions. Completion queues,
//! queue pairs and shared receive queues live in the submodules.
//!
//! Every callback receives pointers that libibverbs guarantees valid for
//! the call (objects it created through this provider, or caller-supplied
//! attribute structs); the `// SAFETY:` comments say which guarantee a
//! block relies on. Provider objects are `#[repr(C)]` structs whose first
//! field is the libibverbs object, so a libibverbs pointer converts back to
//! the provider object by a cast (rdma-core's container_of).

mod cq;
mod qp;
mod srq;

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::mem::{offset_of, size_of, MaybeUninit};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::null_mut;

use crate::abi::{self, AllocCtxResp, Limits};
use crate::matching;
use crate::sys::{self, ibv_context, verbs_context, verbs_context_ops, verbs_device_ops};
use crate::wqe::Errno;

/// Sets `errno` for a callback that reports failure by a NULL return.
fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Sets `errno` to `e` and returns NULL.
fn fail<T>(e: Errno) -> *mut T {
    set_errno(e);
    null_mut()
}

/// A heap object whose every field is zero, as C's calloc gives.
///
/// # Safety
/// All-zero bytes must be a valid `T` (C structs of integers, raw pointers
/// and optional function pointers).
unsafe fn zeroed_box<T>() -> Box<T> {
    // SAFETY: the caller guarantees all-zero is a valid T.
    unsafe { Box::<T>::new_zeroed().assume_init() }
}

/// A heap allocation for a provider object whose libibverbs part (its first
/// field) must have its final address before the creating command runs,
/// while the rest is initialized afterwards. Zero-filled.
fn zeroed_uninit<T>() -> Box<MaybeUninit<T>> {
    Box::<T>::new_zeroed()
}

/// Logs an error through libibverbs' logger (`VERBS_LOG_LEVEL`).
fn log_err(ctx: *mut ibv_context, msg: &str) {
    let Ok(msg) = std::ffi::CString::new(format!("siw_rs: {msg}\n")) else {
        return;
    };
    // SAFETY: every ibv_context libibverbs hands a provider is the
    // `context` field of a verbs_context, so stepping back by its offset
    // yields the verbs_context; __verbs_log only reads it and the format
    // string takes exactly one C string argument.
    unsafe {
        let vctx = ctx
            .byte_sub(offset_of!(verbs_context, context))
            .cast::<verbs_context>();
        sys::__verbs_log(vctx, sys::VERBS_LOG_ERR, c"%s".as_ptr(), msg.as_ptr());
    }
}

// ---------------------------------------------------------------------------
// Registration and device matching

#[repr(transparent)]
struct DeviceOps(verbs_device_ops);
// SAFETY: the ops table is immutable; its raw pointers point to 'static
// immutable data (the name and the match table).
unsafe impl Sync for DeviceOps {}

#[repr(transparent)]
struct MatchTable([sys::verbs_match_ent; 1]);
// SAFETY: immutable, all-zero sentinel entry.
unsafe impl Sync for MatchTable {}

/// Only the sentinel: siw_rs devices have no driver id, name or modalias
/// to match; `match_device` decides. A table is still given because
/// libibverbs walks it before calling the hook.
// SAFETY: an all-zero verbs_match_ent is the VERBS_MATCH_SENTINEL entry.
static MATCH_TABLE: MatchTable = MatchTable([unsafe { std::mem::zeroed() }]);

static DEVICE_OPS: DeviceOps = DeviceOps(verbs_device_ops {
    name: c"siw_rs".as_ptr(),
    match_min_abi_version: abi::ABI_VERSION,
    match_max_abi_version: abi::ABI_VERSION,
    match_table: &MATCH_TABLE.0 as *const _,
    static_providers: null_mut(),
    match_device: Some(match_device),
    alloc_context: Some(alloc_context),
    import_context: None,
    alloc_device: Some(alloc_device),
    uninit_device: Some(uninit_device),
});

/// What rdma-core's PROVIDER_DRIVER macro does: a constructor registering
/// the device ops when libibverbs dlopen()s the plugin. Not in unit-test
/// binaries, which link libibverbs but are no plugin.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static REGISTER: extern "C" fn() = register;

#[cfg_attr(test, allow(dead_code))]
extern "C" fn register() {
    // SAFETY: DEVICE_OPS is 'static and immutable, as libibverbs requires
    // (it keeps the pointer for the life of the process).
    unsafe { sys::verbs_register_driver_34(&DEVICE_OPS.0) };
}

unsafe extern "C" fn match_device(sysfs_dev: *mut sys::verbs_sysfs_dev) -> bool {
    // SAFETY: libibverbs passes a valid sysfs device whose ibdev_path is a
    // NUL-terminated string within the array.
    let (path, driver_id) = unsafe {
        let d = &*sysfs_dev;
        (CStr::from_ptr(d.ibdev_path.as_ptr()), d.driver_id)
    };
    let path = Path::new(OsStr::from_bytes(path.to_bytes()));
    matching::siw_rs_device(path, driver_id).is_ok()
}

#[repr(C)]
struct Device {
    vdev: sys::verbs_device,
}

unsafe extern "C" fn alloc_device(_sysfs: *mut sys::verbs_sysfs_dev) -> *mut sys::verbs_device {
    // SAFETY: Device is a C struct; all-zero is its initial state
    // (libibverbs fills it in after this returns).
    let dev = unsafe { zeroed_box::<Device>() };
    Box::into_raw(dev).cast()
}

unsafe extern "C" fn uninit_device(vdev: *mut sys::verbs_device) {
    // SAFETY: vdev was returned by alloc_device (Box<Device>, vdev first)
    // and libibverbs calls this once, when the last reference goes.
    drop(unsafe { Box::from_raw(vdev.cast::<Device>()) });
}

// ---------------------------------------------------------------------------
// Context

/// The provider's device context.
#[repr(C)]
pub(crate) struct Context {
    vctx: verbs_context,
    limits: Limits,
    /// The context's doorbell file (closed with the context), or `None`:
    /// doorbells go through the uverbs command file.
    db_fd: Option<c_int>,
}

impl Context {
    /// The provider context of a libibverbs context.
    ///
    /// # Safety
    /// `ctx` was created by `alloc_context` and is still open.
    unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> &'a Context {
        // SAFETY: the caller guarantees ctx is the `vctx.context` field of
        // a live Context.
        unsafe {
            &*ctx
                .byte_sub(offset_of!(Context, vctx.context))
                .cast::<Context>()
        }
    }
}

const NO_OPS: verbs_context_ops =
    // SAFETY: verbs_context_ops holds only optional function pointers, for
    // which all-zero is None.
    unsafe { std::mem::zeroed() };

static CONTEXT_OPS: verbs_context_ops = verbs_context_ops {
    query_device_ex: Some(query_device_ex),
    query_port: Some(query_port),
    alloc_pd: Some(alloc_pd),
    dealloc_pd: Some(dealloc_pd),
    reg_mr: Some(reg_mr),
    dereg_mr: Some(dereg_mr),
    create_cq: Some(cq::create_cq),
    create_cq_ex: Some(cq::create_cq_ex),
    poll_cq: Some(cq::poll_cq),
    req_notify_cq: Some(cq::req_notify_cq),
    destroy_cq: Some(cq::destroy_cq),
    create_qp: Some(qp::create_qp),
    create_qp_ex: Some(qp::create_qp_ex),
    modify_qp: Some(qp::modify_qp),
    query_qp: Some(qp::query_qp),
    destroy_qp: Some(qp::destroy_qp),
    post_send: Some(qp::post_send),
    post_recv: Some(qp::post_recv),
    create_srq: Some(srq::create_srq),
    modify_srq: Some(srq::modify_srq),
    query_srq: Some(srq::query_srq),
    destroy_srq: Some(srq::destroy_srq),
    post_srq_recv: Some(srq::post_srq_recv),
    free_context: Some(free_context),
    ..NO_OPS
};

unsafe extern "C" fn alloc_context(
    ibdev: *mut sys::ibv_device,
    cmd_fd: c_int,
    _private_data: *mut c_void,
) -> *mut verbs_context {
    // SAFETY: the verbs_init_and_alloc_context macro: calloc a Context and
    // initialize the verbs_context at offset 0 (passed as a NULL-based
    // offset pointer) for this device and fd.
    let ctx = unsafe {
        sys::_verbs_init_and_alloc_context(
            ibdev,
            cmd_fd,
            size_of::<Context>(),
            offset_of!(Context, vctx) as *mut verbs_context,
            sys::RDMA_DRIVER_UNKNOWN,
        )
    }
    .cast::<Context>();
    if ctx.is_null() {
        return null_mut();
    }
    // SAFETY: ctx is a fresh, initialized, exclusively owned Context.
    let vctx = unsafe {
        (&raw mut (*ctx).db_fd).write(None);
        &raw mut (*ctx).vctx
    };
    // SAFETY: all-zero is valid for these C command/response structs.
    let (mut cmd, mut resp) = unsafe {
        (
            std::mem::zeroed::<sys::ibv_get_context>(),
            std::mem::zeroed::<AllocCtxResp>(),
        )
    };
    // SAFETY: vctx is initialized; cmd/resp are sized as passed.
    let ret = unsafe {
        sys::ibv_cmd_get_context(
            vctx,
            &mut cmd,
            size_of::<sys::ibv_get_context>(),
            &mut resp.ibv,
            size_of::<AllocCtxResp>(),
        )
    };
    let checked = if ret != 0 {
        Err(ret)
    } else {
        // A doorbell file the kernel opened belongs to this context from
        // here, even when the rest of the response is refused (closed
        // below then); a response of another ABI has no such field.
        if resp.drv.abi_version == abi::ABI_VERSION && resp.drv.db_fd >= 0 {
            // SAFETY: ctx is exclusively ours.
            unsafe { (*ctx).db_fd = Some(resp.drv.db_fd) };
        }
        abi::check_alloc_ctx(&resp.drv)
            .and_then(|limits| abi::doorbell_fd(&resp.drv).map(|_| limits))
            .map_err(|msg| {
                // SAFETY: vctx is initialized (context.device is set).
                log_err(unsafe { &raw mut (*vctx).context }, &msg);
                libc::EPROTO
            })
    };
    match checked {
        Ok(limits) => {
            // SAFETY: ctx is valid and exclusively ours; CONTEXT_OPS is
            // 'static.
            unsafe {
                (*ctx).limits = limits;
                sys::verbs_set_ops(vctx, &CONTEXT_OPS);
            }
            vctx
        }
        Err(e) => {
            // SAFETY: ctx is exclusively ours; the file, if any, is this
            // context's and nothing else knows it.
            if let Some(fd) = unsafe { (*ctx).db_fd.take() } {
                // SAFETY: closing a file this context owns.
                unsafe { libc::close(fd) };
            }
            // SAFETY: undo _verbs_init_and_alloc_context (which calloc'ed).
            unsafe {
                sys::verbs_uninit_context(vctx);
                libc::free(ctx.cast());
            }
            fail(e)
        }
    }
}

unsafe extern "C" fn free_context(ibctx: *mut ibv_context) {
    // SAFETY: ibctx is ours and libibverbs is closing it; the Context was
    // calloc'ed by _verbs_init_and_alloc_context.
    unsafe {
        let ctx = (Context::from_ibv(ibctx) as *const Context).cast_mut();
        if let Some(fd) = (*ctx).db_fd {
            // The context's own doorbell file: nothing rings it any more.
            libc::close(fd);
        }
        sys::verbs_uninit_context(&raw mut (*ctx).vctx);
        libc::free(ctx.cast());
    }
}

unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const sys::ibv_query_device_ex_input,
    attr: *mut sys::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    // SAFETY: all-zero is a valid response struct.
    let mut resp: sys::ib_uverbs_ex_query_device_resp = unsafe { std::mem::zeroed() };
    let mut resp_size = size_of::<sys::ib_uverbs_ex_query_device_resp>();
    // SAFETY: arguments as received from libibverbs; resp sized as passed.
    let ret = unsafe {
        sys::ibv_cmd_query_device_any(ctx, input, attr, attr_size, &mut resp, &mut resp_size)
    };
    if ret != 0 {
        return ret;
    }
    let fw = resp.base.fw_ver;
    let text = format!(
        "{}.{}.{}",
        (fw >> 32) & 0xffff,
        (fw >> 16) & 0xffff,
        fw & 0xffff
    );
    // SAFETY: attr is valid for attr_size >= sizeof(orig_attr) octets
    // (ibv_cmd_query_device_any just filled it).
    let dst = unsafe { &mut (*attr).orig_attr.fw_ver };
    for (d, s) in dst.iter_mut().zip(text.bytes().chain(std::iter::repeat(0))) {
        *d = s as c_char;
    }
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
    0
}

unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut sys::ibv_port_attr,
) -> c_int {
    // SAFETY: all-zero is a valid command struct.
    let mut cmd: sys::ibv_query_port = unsafe { std::mem::zeroed() };
    // SAFETY: arguments as received from libibverbs.
    unsafe { sys::ibv_cmd_query_port(ctx, port, attr, &mut cmd, size_of::<sys::ibv_query_port>()) }
}

// ---------------------------------------------------------------------------
// Protection domains and memory regions

unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut sys::ibv_pd {
    // SAFETY: all-zero is valid for ibv_pd and the command structs.
    let (mut pd, mut cmd, mut resp) = unsafe {
        (
            zeroed_box::<sys::ibv_pd>(),
            std::mem::zeroed::<sys::ibv_alloc_pd>(),
            std::mem::zeroed::<sys::ib_uverbs_alloc_pd_resp>(),
        )
    };
    // SAFETY: ctx is an open context of ours; the rest sized as passed.
    let ret = unsafe {
        sys::ibv_cmd_alloc_pd(
            ctx,
            &mut *pd,
            &mut cmd,
            size_of::<sys::ibv_alloc_pd>(),
            &mut resp,
            size_of::<sys::ib_uverbs_alloc_pd_resp>(),
        )
    };
    if ret != 0 {
        return fail(ret);
    }
    Box::into_raw(pd)
}

unsafe extern "C" fn dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
    // SAFETY: pd came from alloc_pd.
    let ret = unsafe { sys::ibv_cmd_dealloc_pd(pd) };
    if ret == 0 {
        // SAFETY: allocated as Box<ibv_pd> in alloc_pd; the kernel object
        // is gone and libibverbs no longer uses the pointer.
        drop(unsafe { Box::from_raw(pd) });
    }
    ret
}

unsafe extern "C" fn reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    hca_va: u64,
    access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: all-zero is valid for verbs_mr and the command structs.
    let (mut mr, mut cmd, mut resp) = unsafe {
        (
            zeroed_box::<sys::verbs_mr>(),
            std::mem::zeroed::<sys::ibv_reg_mr>(),
            std::mem::zeroed::<sys::ib_uverbs_reg_mr_resp>(),
        )
    };
    // SAFETY: pd is ours; the kernel pins and checks the user range.
    let ret = unsafe {
        sys::ibv_cmd_reg_mr(
            pd,
            addr,
            length,
            hca_va,
            access,
            &mut *mr,
            &mut cmd,
            size_of::<sys::ibv_reg_mr>(),
            &mut resp,
            size_of::<sys::ib_uverbs_reg_mr_resp>(),
        )
    };
    if ret != 0 {
        return fail(ret);
    }
    Box::into_raw(mr).cast()
}

unsafe extern "C" fn dereg_mr(vmr: *mut sys::verbs_mr) -> c_int {
    // SAFETY: vmr came from reg_mr.
    let ret = unsafe { sys::ibv_cmd_dereg_mr(vmr) };
    if ret == 0 {
        // SAFETY: allocated as Box<verbs_mr> in reg_mr and now unused.
        drop(unsafe { Box::from_raw(vmr) });
    }
    ret
}
