// SPDX-License-Identifier: GPL-2.0

//! Safe wrappers over the RDMA core's verbs objects: protection domains,
//! completion queues, queue pairs and memory regions, and the work requests
//! and completions that pass through them.
//!
//! # Object memory
//!
//! The RDMA core allocates PDs, CQs and QPs itself (`size_ib_pd`, … in the
//! ops table) and passes the zeroed object to the driver's create callback;
//! it frees the memory after the driver's destroy callback returns, or right
//! away when create fails. [`Pd<T>`], [`Cq<T>`] and [`Qp<T>`] are those
//! objects: `#[repr(C)]` with the C struct first and the driver's data after
//! it. The data is written by the create trampoline and dropped by the
//! destroy trampoline, so it is initialised exactly while the core considers
//! the object alive. Memory regions are allocated by the driver ([`Mr<T>`],
//! a `KBox`) and freed in `dereg_mr`.
//!
//! # Invariants
//!
//! Every `*mut ib_pd`/`ib_cq`/`ib_qp` the core passes to a trampoline of
//! driver `T` other than the create callback points to a live object of `T`
//! whose data is initialised; every `*mut ib_mr` points to a live `Mr<T>`.
//! A QP's `send_cq`, `recv_cq` and `pd` stay alive while the QP exists (the
//! core counts their use and refuses to destroy them before).

use crate::{
    ffi,
    ib::{Device, Driver},
    uverbs::Udata,
};
use core::{marker::PhantomData, mem, ptr, ptr::NonNull};
use kernel::{
    error::from_result,
    ffi::{c_int, c_uint},
    prelude::*,
    types::Opaque,
};

/// Most scatter/gather elements a work request may carry into the driver;
/// longer lists fail with `EINVAL` before the driver sees them.
pub(crate) const MAX_WR_SGE: usize = 16;

/// One scatter/gather element (`struct ib_sge`): `length` bytes at `addr`
/// in the memory region with local key `lkey`.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Sge {
    /// Address: a kernel virtual address (siw_rs uses virtual DMA) or, for
    /// a registered region, an address within its IOVA range.
    pub(crate) addr: u64,
    /// Length in bytes.
    pub(crate) length: u32,
    /// Local key of the memory region.
    pub(crate) lkey: u32,
}

/// QP states as the verbs interface names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpState {
    /// `IB_QPS_RESET`.
    Reset,
    /// `IB_QPS_INIT`.
    Init,
    /// `IB_QPS_RTR` (no meaning for iWARP; treated as INIT).
    Rtr,
    /// `IB_QPS_RTS`.
    Rts,
    /// `IB_QPS_SQD` (iWARP: closing).
    Sqd,
    /// `IB_QPS_SQE` (iWARP: terminate).
    Sqe,
    /// `IB_QPS_ERR`.
    Err,
}

impl QpState {
    fn from_raw(v: ffi::ib_qp_state) -> Result<Self> {
        Ok(match v {
            ffi::IB_QPS_RESET => Self::Reset,
            ffi::IB_QPS_INIT => Self::Init,
            ffi::IB_QPS_RTR => Self::Rtr,
            ffi::IB_QPS_RTS => Self::Rts,
            ffi::IB_QPS_SQD => Self::Sqd,
            ffi::IB_QPS_SQE => Self::Sqe,
            ffi::IB_QPS_ERR => Self::Err,
            _ => return Err(EINVAL),
        })
    }

    fn to_raw(self) -> ffi::ib_qp_state {
        match self {
            Self::Reset => ffi::IB_QPS_RESET,
            Self::Init => ffi::IB_QPS_INIT,
            Self::Rtr => ffi::IB_QPS_RTR,
            Self::Rts => ffi::IB_QPS_RTS,
            Self::Sqd => ffi::IB_QPS_SQD,
            Self::Sqe => ffi::IB_QPS_SQE,
            Self::Err => ffi::IB_QPS_ERR,
        }
    }
}

/// Memory access rights (`IB_ACCESS_*` bits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Access(pub(crate) u32);

impl Access {
    /// The region may be written by local operations (receives, Read sinks).
    pub(crate) const LOCAL_WRITE: u32 = ffi::IB_ACCESS_LOCAL_WRITE;
    /// The peer may RDMA Write into the region.
    pub(crate) const REMOTE_WRITE: u32 = ffi::IB_ACCESS_REMOTE_WRITE;
    /// The peer may RDMA Read from the region.
    pub(crate) const REMOTE_READ: u32 = ffi::IB_ACCESS_REMOTE_READ;
    /// The peer may run RFC 7306 Atomic operations on the region.
    pub(crate) const REMOTE_ATOMIC: u32 = ffi::IB_ACCESS_REMOTE_ATOMIC;

    /// Whether every bit of `bits` is granted.
    pub(crate) fn allows(self, bits: u32) -> bool {
        self.0 & bits == bits
    }
}

/// A send-queue operation with its operation-specific fields.
#[allow(dead_code, reason = "Send with Immediate is decoded; the driver refuses it (design.rst)")]
pub(crate) enum SendOp<'a, T: Driver> {
    /// Send.
    Send,
    /// Send with Immediate Data (RFC 7306); the value is in network order.
    SendImm(u32),
    /// Send with Invalidate of the peer's STag.
    SendInv(u32),
    /// RDMA Write to `rkey` at `remote_addr`.
    Write { remote_addr: u64, rkey: u32 },
    /// RDMA Write with Immediate Data (RFC 7306).
    WriteImm { remote_addr: u64, rkey: u32, imm: u32 },
    /// RDMA Read from `rkey` at `remote_addr`.
    Read { remote_addr: u64, rkey: u32 },
    /// RDMA Read that invalidates the local sink STag `inv` when done.
    ReadInv { remote_addr: u64, rkey: u32, inv: u32 },
    /// Atomic Compare and Swap (RFC 7306).
    CmpSwap { remote_addr: u64, rkey: u32, compare: u64, swap: u64 },
    /// Atomic Fetch and Add (RFC 7306).
    FetchAdd { remote_addr: u64, rkey: u32, add: u64 },
    /// Local invalidate of STag.
    LocalInv(u32),
    /// Fast registration of `mr` with key byte `key` and `access`.
    RegMr { mr: &'a Mr<T>, key: u8, access: Access },
}

/// `IB_SEND_*` flags of a send work request.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SendFlags {
    /// Generate a completion even if the QP signals selectively.
    pub(crate) signaled: bool,
    /// Set the Solicited Event bit (Send variants).
    pub(crate) solicited: bool,
    /// Wait for outstanding RDMA Reads before this request.
    pub(crate) fence: bool,
    /// The payload is to be copied at post time.
    pub(crate) inline: bool,
}

/// A send work request, decoded from `struct ib_send_wr` and its container.
pub(crate) struct SendWr<'a, T: Driver> {
    /// The consumer's identifier, returned in the completion.
    pub(crate) wr_id: u64,
    /// The operation.
    pub(crate) op: SendOp<'a, T>,
    /// Flags.
    pub(crate) flags: SendFlags,
    /// Local data: source of Send/Write, sink of Read/atomics.
    pub(crate) sges: &'a [Sge],
}

/// A receive work request (`struct ib_recv_wr`).
pub(crate) struct RecvWr<'a> {
    /// The consumer's identifier, returned in the completion.
    pub(crate) wr_id: u64,
    /// Where an inbound Send is placed.
    pub(crate) sges: &'a [Sge],
}

/// Completion status (`enum ib_wc_status`) values siw_rs reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum WcStatus {
    /// Success.
    Success = ffi::IB_WC_SUCCESS,
    /// A local length error (message longer than the receive buffer, …).
    LocLenErr = ffi::IB_WC_LOC_LEN_ERR,
    /// A local protection error (lkey, bounds, rights).
    LocProtErr = ffi::IB_WC_LOC_PROT_ERR,
    /// Flushed: the QP left RTS before the request was processed.
    WrFlushErr = ffi::IB_WC_WR_FLUSH_ERR,
    /// The peer refused the remote access.
    RemAccessErr = ffi::IB_WC_REM_ACCESS_ERR,
    /// The peer failed the operation.
    RemOpErr = ffi::IB_WC_REM_OP_ERR,
    /// A Send with Invalidate named an STag that cannot be invalidated.
    RemInvReqErr = ffi::IB_WC_REM_INV_REQ_ERR,
    /// A malformed work request (from a process's ring).
    LocQpOpErr = ffi::IB_WC_LOC_QP_OP_ERR,
    /// Any other fatal error.
    GeneralErr = ffi::IB_WC_GENERAL_ERR,
}

/// Completion opcodes (`enum ib_wc_opcode`).
#[allow(dead_code, reason = "atomic completions come with RFC 7306 support")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum WcOpcode {
    /// A Send variant.
    Send = ffi::IB_WC_SEND,
    /// An RDMA Write.
    RdmaWrite = ffi::IB_WC_RDMA_WRITE,
    /// An RDMA Read.
    RdmaRead = ffi::IB_WC_RDMA_READ,
    /// Compare and Swap.
    CompSwap = ffi::IB_WC_COMP_SWAP,
    /// Fetch and Add.
    FetchAdd = ffi::IB_WC_FETCH_ADD,
    /// Local invalidate.
    LocalInv = ffi::IB_WC_LOCAL_INV,
    /// Fast registration.
    RegMr = ffi::IB_WC_REG_MR,
    /// A received Send.
    Recv = ffi::IB_WC_RECV,
    /// A received RDMA Write with Immediate Data (RFC 7306).
    RecvRdmaWithImm = ffi::IB_WC_RECV_RDMA_WITH_IMM,
}

/// A work completion, as the driver keeps it in its CQ ring.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wc {
    /// The work request's identifier.
    pub(crate) wr_id: u64,
    /// Outcome.
    pub(crate) status: WcStatus,
    /// What completed.
    pub(crate) opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub(crate) byte_len: u32,
    /// The QP (an identity from [`Qp::id`]).
    pub(crate) qp: usize,
    /// The QP's number (what a process sees).
    pub(crate) qp_num: u32,
    /// Immediate data (network order) if `with_imm`.
    pub(crate) imm: Option<u32>,
    /// The STag the peer invalidated, if any.
    pub(crate) invalidated: Option<u32>,
}

impl Wc {
    /// A placeholder for preallocated rings.
    pub(crate) const EMPTY: Wc = Wc {
        wr_id: 0,
        status: WcStatus::GeneralErr,
        opcode: WcOpcode::Send,
        byte_len: 0,
        qp: 0,
        qp_num: 0,
        imm: None,
        invalidated: None,
    };

    fn to_raw(&self) -> ffi::ib_wc {
        let mut out = ffi::ib_wc::default();
        out.__bindgen_anon_1.wr_id = self.wr_id;
        out.status = self.status as ffi::ib_wc_status;
        out.opcode = self.opcode as ffi::ib_wc_opcode;
        out.byte_len = self.byte_len;
        out.qp = self.qp as *mut ffi::ib_qp;
        let mut flags = 0u32;
        if let Some(imm) = self.imm {
            out.ex.imm_data = imm;
            flags |= ffi::IB_WC_WITH_IMM;
        } else if let Some(stag) = self.invalidated {
            out.ex.invalidate_rkey = stag;
            flags |= ffi::IB_WC_WITH_INVALIDATE;
        }
        out.wc_flags = flags as c_int;
        out.port_num = 1;
        out
    }
}

/// What `req_notify_cq` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Notify {
    /// The next completion of any kind.
    Next,
    /// The next solicited (or error) completion.
    Solicited,
}

/// The output array of `poll_cq`: `len` entries at `out`, written by
/// value and unaligned, as the consumer's WRs are read: a kernel consumer
/// may keep its array in a `__packed` structure, where a reference to an
/// entry would be undefined behaviour (and a panic on the debug kernel).
pub(crate) struct WcSink<'a> {
    out: *mut ffi::ib_wc,
    len: usize,
    n: usize,
    _array: PhantomData<&'a mut [ffi::ib_wc]>,
}

impl WcSink<'_> {
    /// Room left.
    pub(crate) fn room(&self) -> usize {
        self.len.saturating_sub(self.n)
    }

    /// Appends `wc`; returns `false` (and drops it) when full.
    pub(crate) fn push(&mut self, wc: &Wc) -> bool {
        if self.n >= self.len {
            return false;
        }
        let entry = wc.to_raw();
        // SAFETY: `n < len`: an entry of the array the consumer handed to
        // this `poll_cq` call, which nothing else accesses during it (see
        // `poll_cq_cb`); written unaligned, by value.
        unsafe { self.out.add(self.n).write_unaligned(entry) };
        self.n += 1;
        true
    }
}

/// CQ creation parameters.
pub(crate) struct CqAttr {
    /// Requested entries in; the driver sets the entries it provides.
    pub(crate) entries: u32,
}

/// Queue sizes of a QP (`struct ib_qp_cap`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpCaps {
    /// Send queue depth.
    pub(crate) max_send_wr: u32,
    /// Receive queue depth.
    pub(crate) max_recv_wr: u32,
    /// SGEs per send WR.
    pub(crate) max_send_sge: u32,
    /// SGEs per receive WR.
    pub(crate) max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub(crate) max_inline_data: u32,
}

impl QpCaps {
    fn from_raw(c: &ffi::ib_qp_cap) -> Self {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }

    fn write_to(&self, c: &mut ffi::ib_qp_cap) {
        c.max_send_wr = self.max_send_wr;
        c.max_recv_wr = self.max_recv_wr;
        c.max_send_sge = self.max_send_sge;
        c.max_recv_sge = self.max_recv_sge;
        c.max_inline_data = self.max_inline_data;
    }
}

/// QP creation parameters.
pub(crate) struct QpInitAttr {
    /// Requested sizes in; the sizes the driver provides out.
    pub(crate) caps: QpCaps,
    /// Every send WR completes (`IB_SIGNAL_ALL_WR`), not only signalled ones.
    pub(crate) sig_all: bool,
    /// Reliable connected (the only type iWARP has).
    pub(crate) rc: bool,
    /// Attached to an SRQ.
    pub(crate) has_srq: bool,
    /// Any create flag set (none supported).
    pub(crate) create_flags: u32,
}

/// The `modify_qp` attributes siw_rs interprets.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpModify {
    /// New state, if `IB_QP_STATE` is in the mask.
    pub(crate) state: Option<QpState>,
    /// The state the consumer believes the QP is in (`IB_QP_CUR_STATE`).
    pub(crate) cur_state: Option<QpState>,
    /// New remote access rights (`IB_QP_ACCESS_FLAGS`).
    pub(crate) access: Option<Access>,
    /// New ORD (`IB_QP_MAX_QP_RD_ATOMIC`).
    pub(crate) ord: Option<u32>,
    /// New IRD (`IB_QP_MAX_DEST_RD_ATOMIC`).
    pub(crate) ird: Option<u32>,
    /// Mask bits siw_rs does not act on (ignored, as for other iWARP RNICs).
    pub(crate) other: u32,
}

/// What `query_qp` reports.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpQuery {
    /// Current state.
    pub(crate) state: Option<QpState>,
    /// Remote access rights.
    pub(crate) access: Access,
    /// Queue sizes.
    pub(crate) caps: QpCaps,
    /// ORD.
    pub(crate) ord: u32,
    /// IRD.
    pub(crate) ird: u32,
    /// Signal all send WRs.
    pub(crate) sig_all: bool,
}

/// Asynchronous events the driver reports on a QP or CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AsyncEvent {
    /// The CQ overflowed.
    CqErr,
    /// The QP went to ERROR: the connection failed (a TERMINATE was sent
    /// or received, or the transport broke).
    QpFatal,
    /// The peer violated an access right.
    QpAccessErr,
    /// A QP on an SRQ is in ERROR and takes no more entries from it: every
    /// entry it took has completed (`ib_drain_qp` waits for this).
    QpLastWqeReached,
    /// An SRQ's entries fell below its armed limit.
    SrqLimitReached,
    /// A process wrote a malformed entry into its SRQ ring.
    SrqErr,
}

impl AsyncEvent {
    fn to_raw(self) -> ffi::ib_event_type {
        match self {
            Self::CqErr => ffi::IB_EVENT_CQ_ERR,
            Self::QpFatal => ffi::IB_EVENT_QP_FATAL,
            Self::QpAccessErr => ffi::IB_EVENT_QP_ACCESS_ERR,
            Self::QpLastWqeReached => ffi::IB_EVENT_QP_LAST_WQE_REACHED,
            Self::SrqLimitReached => ffi::IB_EVENT_SRQ_LIMIT_REACHED,
            Self::SrqErr => ffi::IB_EVENT_SRQ_ERR,
        }
    }
}

macro_rules! core_object {
    ($(#[$doc:meta])* $name:ident, $c:ty, $data:ident) => {
        $(#[$doc])*
        #[repr(C)]
        pub(crate) struct $name<T: Driver> {
            ib: Opaque<$c>,
            data: T::$data,
        }

        // SAFETY: the core synchronises its own fields; the data is
        // `Send + Sync` by the `Driver` bounds.
        unsafe impl<T: Driver> Send for $name<T> {}
        // SAFETY: as above.
        unsafe impl<T: Driver> Sync for $name<T> {}

        impl<T: Driver> $name<T> {
            /// Returns the object behind a raw pointer.
            ///
            /// # Safety
            ///
            /// `raw` must point to a live object of driver `T` whose data is
            /// initialised, for at least `'a`.
            pub(crate) unsafe fn from_raw<'a>(raw: *mut $c) -> &'a Self {
                // SAFETY: by the requirements; the C struct is the first
                // field of this `#[repr(C)]` struct.
                unsafe { &*raw.cast::<Self>() }
            }

            /// The raw C object.
            pub(crate) fn as_raw(&self) -> *mut $c {
                self.ib.get()
            }

            /// The driver's data.
            #[allow(dead_code, reason = "not every object kind needs every accessor")]
            pub(crate) fn data(&self) -> &T::$data {
                &self.data
            }

            /// An identity for the object, stable while it lives (its
            /// address), usable to compare objects and in completions.
            #[allow(dead_code, reason = "not every object kind needs every accessor")]
            pub(crate) fn id(&self) -> usize {
                self.as_raw() as usize
            }

            /// The device the object belongs to.
            pub(crate) fn device(&self) -> &Device<T> {
                // SAFETY: the core set `device` before calling the driver
                // and it never changes; the device outlives its objects.
                unsafe { Device::<T>::from_raw((*self.as_raw()).device) }
            }

            /// Writes the data into a fresh object the core allocated.
            ///
            /// # Safety
            ///
            /// `raw` must be an object of driver `T` allocated by the core,
            /// whose data is not initialised.
            unsafe fn init_data(raw: *mut $c, data: T::$data) {
                // SAFETY: by the requirements the memory is ours to write.
                unsafe { ptr::addr_of_mut!((*raw.cast::<Self>()).data).write(data) };
            }

            /// Drops the data before the core frees the object.
            ///
            /// # Safety
            ///
            /// `raw` must be a live object of `T` with initialised data that
            /// nobody uses any more.
            unsafe fn drop_data(raw: *mut $c) {
                // SAFETY: by the requirements.
                unsafe { ptr::drop_in_place(ptr::addr_of_mut!((*raw.cast::<Self>()).data)) };
            }
        }
    };
}

core_object!(
    /// A protection domain: the core's `ib_pd` followed by `T::Pd`.
    Pd, ffi::ib_pd, Pd
);
core_object!(
    /// A completion queue: the core's `ib_cq` followed by `T::Cq`.
    Cq, ffi::ib_cq, Cq
);
core_object!(
    /// A queue pair: the core's `ib_qp` followed by `T::Qp`.
    Qp, ffi::ib_qp, Qp
);
core_object!(
    /// A shared receive queue: the core's `ib_srq` followed by `T::Srq`.
    Srq, ffi::ib_srq, Srq
);

impl<T: Driver> Srq<T> {
    /// Reports an asynchronous SRQ event to the consumer.
    pub(crate) fn event(&self, ev: AsyncEvent) {
        let raw = self.as_raw();
        // SAFETY: the SRQ is live; the core set the handler and context
        // before calling `create_srq` and does not change them.
        let (handler, ctx) = unsafe { ((*raw).event_handler, (*raw).srq_context) };
        if let Some(handler) = handler {
            let mut e = ffi::ib_event {
                device: self.device().as_raw(),
                event: ev.to_raw(),
                ..Default::default()
            };
            e.element.srq = raw;
            // SAFETY: the handler's contract; `e` lives across the call.
            unsafe { handler(&mut e, ctx) };
        }
    }
}

/// SRQ sizes (`struct ib_srq_attr`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SrqAttr {
    /// Entries.
    pub(crate) max_wr: u32,
    /// SGEs per entry.
    pub(crate) max_sge: u32,
    /// The limit event threshold (0: none).
    pub(crate) limit: u32,
}

impl<T: Driver> Cq<T> {
    /// Calls the consumer's completion handler (after the driver found the
    /// CQ armed for the completion it just added).
    pub(crate) fn notify(&self) {
        let raw = self.as_raw();
        // SAFETY: the CQ is live; the core set the handler and context at
        // creation and does not change them afterwards.
        let (handler, ctx) = unsafe { ((*raw).comp_handler, (*raw).cq_context) };
        if let Some(handler) = handler {
            // SAFETY: calling the consumer's handler with its own context is
            // the contract of `comp_handler`.
            unsafe { handler(raw, ctx) };
        }
    }

    /// Reports an asynchronous CQ event to the consumer.
    pub(crate) fn event(&self, ev: AsyncEvent) {
        let raw = self.as_raw();
        // SAFETY: as in `notify`.
        let (handler, ctx) = unsafe { ((*raw).event_handler, (*raw).cq_context) };
        if let Some(handler) = handler {
            let mut e = ffi::ib_event {
                device: self.device().as_raw(),
                event: ev.to_raw(),
                ..Default::default()
            };
            e.element.cq = raw;
            // SAFETY: the handler's contract; `e` lives across the call.
            unsafe { handler(&mut e, ctx) };
        }
    }

}

impl<T: Driver> Qp<T> {
    /// The SRQ the QP takes its receive buffers from, if any.
    pub(crate) fn srq(&self) -> Option<&Srq<T>> {
        // SAFETY: the core set `srq` before create (null without one) and
        // keeps the SRQ alive while the QP exists; it is an SRQ of this
        // driver.
        let raw = unsafe { (*self.as_raw()).srq };
        // SAFETY: as above.
        (!raw.is_null()).then(|| unsafe { Srq::<T>::from_raw(raw) })
    }

    /// The QP's send CQ.
    pub(crate) fn send_cq(&self) -> &Cq<T> {
        // SAFETY: the core set `send_cq` before create and keeps the CQ
        // alive while the QP exists; it is a CQ of this driver.
        unsafe { Cq::<T>::from_raw((*self.as_raw()).send_cq) }
    }

    /// The QP's receive CQ.
    pub(crate) fn recv_cq(&self) -> &Cq<T> {
        // SAFETY: as for `send_cq`.
        unsafe { Cq::<T>::from_raw((*self.as_raw()).recv_cq) }
    }

    /// The QP's protection domain.
    pub(crate) fn pd(&self) -> &Pd<T> {
        // SAFETY: as for `send_cq`; iWARP QPs never change PD.
        unsafe { Pd::<T>::from_raw((*self.as_raw()).pd) }
    }

    /// The QP number.
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: written once at create, before the QP is visible.
        unsafe { (*self.as_raw()).qp_num }
    }

    /// Reports an asynchronous QP event to the consumer.
    pub(crate) fn event(&self, ev: AsyncEvent) {
        let raw = self.as_raw();
        // SAFETY: the QP is live; the core set the handler at creation.
        let (handler, ctx) = unsafe { ((*raw).event_handler, (*raw).qp_context) };
        if let Some(handler) = handler {
            let mut e = ffi::ib_event {
                device: self.device().as_raw(),
                event: ev.to_raw(),
                ..Default::default()
            };
            e.element.qp = raw;
            // SAFETY: the handler's contract; `e` lives across the call.
            unsafe { handler(&mut e, ctx) };
        }
    }
}

/// A memory region: the `ib_mr` the driver allocates, followed by `T::Mr`.
#[repr(C)]
pub(crate) struct Mr<T: Driver> {
    ib: Opaque<ffi::ib_mr>,
    data: T::Mr,
}

// SAFETY: as for the core objects.
unsafe impl<T: Driver> Send for Mr<T> {}
// SAFETY: as above.
unsafe impl<T: Driver> Sync for Mr<T> {}

impl<T: Driver> Mr<T> {
    /// # Safety
    ///
    /// `raw` must point to a live `Mr<T>` for at least `'a`.
    unsafe fn from_raw<'a>(raw: *mut ffi::ib_mr) -> &'a Self {
        // SAFETY: by the requirements.
        unsafe { &*raw.cast::<Self>() }
    }

    /// The driver's data.
    pub(crate) fn data(&self) -> &T::Mr {
        &self.data
    }

    /// The device (set by the core when the MR was handed to it).
    pub(crate) fn device(&self) -> &Device<T> {
        // SAFETY: the core sets `device` right after the MR is created, before
        // any other callback sees it; the device outlives its MRs.
        unsafe { Device::<T>::from_raw((*self.ib.get()).device) }
    }

    /// The IOVA and length the core's `ib_sg_to_pages` computed in the last
    /// `map_mr_sg`, and the page size it used.
    pub(crate) fn mapping(&self) -> (u64, u64, u32) {
        // SAFETY: the MR is live; these fields are written by the core during
        // `map_mr_sg`, which the consumer does not run concurrently with
        // posting the registration.
        unsafe {
            let r = self.ib.get();
            ((*r).iova, (*r).length, (*r).page_size)
        }
    }

}

/// How a new MR is created.
pub(crate) enum MrKind {
    /// `get_dma_mr`: all of kernel memory, with the given access.
    Dma(Access),
    /// `alloc_mr(IB_MR_TYPE_MEM_REG)`: a fast-registration MR with room for
    /// that many pages, invalid until registered.
    Fast(u32),
    /// `reg_user_mr`: pinned user memory, addressed by `iova` in work
    /// requests and by peers.
    User { umem: crate::uverbs::Umem, iova: u64, len: u64, access: Access },
}

/// The verbs callbacks of a driver (the data-path half of [`Driver`]).
pub(crate) trait Verbs: Driver {
    /// Creates the PD's data.
    fn alloc_pd(dev: &Device<Self>, user: bool) -> Result<Self::Pd>;
    /// Called before the PD's data is dropped.
    fn dealloc_pd(pd: &Pd<Self>);
    /// Creates a CQ's data; may lower or raise `attr.entries`. With
    /// `udata` the CQ is a process's, and the driver writes its response.
    fn create_cq(dev: &Device<Self>, attr: &mut CqAttr, udata: Option<&Udata>) -> Result<Self::Cq>;
    /// Fills `sink` with completions; returns how many.
    fn poll_cq(cq: &Cq<Self>, sink: &mut WcSink<'_>);
    /// Arms the CQ; returns `true` if `report_missed` and completions are
    /// already waiting.
    fn req_notify_cq(cq: &Cq<Self>, how: Notify, report_missed: bool) -> bool;
    /// Creates a QP's data. Sets `attr.caps` to what is provided and
    /// returns the data and the QP number.
    /// With `udata` the QP is a process's, and the driver writes its
    /// response.
    fn create_qp(pd: &Pd<Self>, attr: &mut QpInitAttr, qp: QpSlot<Self>, udata: Option<&Udata>)
        -> Result<(Self::Qp, u32)>;
    /// The QP's data and number are in place (after a successful
    /// `create_qp`). The core may still fail the creation after this; it
    /// then calls `destroy_qp`.
    fn qp_created(qp: &Qp<Self>);
    /// Applies `attr`.
    fn modify_qp(qp: &Qp<Self>, attr: &QpModify) -> Result;
    /// Reports the QP's attributes.
    fn query_qp(qp: &Qp<Self>) -> QpQuery;
    /// Quiesces the QP before its data is dropped: flushes, disconnects,
    /// and waits until nothing else uses it.
    fn destroy_qp(qp: &Qp<Self>);
    /// Quiesces a CQ before its data is dropped.
    fn destroy_cq(cq: &Cq<Self>);
    /// Posts one send work request.
    fn post_send(qp: &Qp<Self>, wr: &SendWr<'_, Self>) -> Result;
    /// Posts one receive work request.
    fn post_recv(qp: &Qp<Self>, wr: &RecvWr<'_>) -> Result;
    /// `post_send` without work requests: a process's send doorbell.
    fn sq_doorbell(qp: &Qp<Self>);
    /// `post_recv` without work requests: a process's receive doorbell.
    fn rq_doorbell(qp: &Qp<Self>);
    /// Creates an SRQ's data; adjusts `attr` to what it provides. With
    /// `udata` the SRQ is a process's, and the driver writes its response.
    fn create_srq(pd: &Pd<Self>, attr: &mut SrqAttr, udata: Option<&Udata>) -> Result<Self::Srq>;
    /// Changes the limit (`max_wr` is `Some` for a resize request).
    fn modify_srq(srq: &Srq<Self>, max_wr: Option<u32>, limit: Option<u32>) -> Result;
    /// Reports the SRQ's attributes.
    fn query_srq(srq: &Srq<Self>) -> SrqAttr;
    /// Called before the SRQ's data is dropped.
    fn destroy_srq(srq: &Srq<Self>);
    /// Posts one receive work request to an SRQ.
    fn post_srq_recv(srq: &Srq<Self>, wr: &RecvWr<'_>) -> Result;
    /// Creates an MR's data; returns it and its STag (lkey = rkey).
    fn alloc_mr(pd: &Pd<Self>, kind: MrKind) -> Result<(Self::Mr, u32)>;
    /// Starts a new page list for `map_mr_sg`.
    fn mr_reset_pages(mr: &Mr<Self>);
    /// Appends a page address during `map_mr_sg`.
    fn mr_add_page(mr: &Mr<Self>, addr: u64) -> Result;
    /// Invalidates the MR before its data is dropped.
    fn dereg_mr(mr: &Mr<Self>);
}

/// The future address of a QP during `create_qp`, for the driver to keep as
/// an identity (the QP is not usable yet).
pub(crate) struct QpSlot<T: Driver> {
    raw: NonNull<ffi::ib_qp>,
    _t: PhantomData<T>,
}

impl<T: Driver> QpSlot<T> {
    /// The raw QP (for the device's QP-number table).
    pub(crate) fn raw(&self) -> NonNull<ffi::ib_qp> {
        self.raw
    }
}

/// Installs the verbs callbacks of `T` and the object sizes into `ops`.
pub(crate) fn install<T: Verbs>(ops: &mut ffi::ib_device_ops) {
    ops.alloc_pd = Some(alloc_pd_cb::<T>);
    ops.dealloc_pd = Some(dealloc_pd_cb::<T>);
    ops.create_cq = Some(create_cq_cb::<T>);
    ops.destroy_cq = Some(destroy_cq_cb::<T>);
    ops.poll_cq = Some(poll_cq_cb::<T>);
    ops.req_notify_cq = Some(req_notify_cq_cb::<T>);
    ops.create_qp = Some(create_qp_cb::<T>);
    ops.modify_qp = Some(modify_qp_cb::<T>);
    ops.query_qp = Some(query_qp_cb::<T>);
    ops.destroy_qp = Some(destroy_qp_cb::<T>);
    ops.post_send = Some(post_send_cb::<T>);
    ops.post_recv = Some(post_recv_cb::<T>);
    ops.get_dma_mr = Some(get_dma_mr_cb::<T>);
    ops.alloc_mr = Some(alloc_mr_cb::<T>);
    ops.map_mr_sg = Some(map_mr_sg_cb::<T>);
    ops.dereg_mr = Some(dereg_mr_cb::<T>);
    ops.reg_user_mr = Some(reg_user_mr_cb::<T>);
    ops.create_srq = Some(create_srq_cb::<T>);
    ops.modify_srq = Some(modify_srq_cb::<T>);
    ops.query_srq = Some(query_srq_cb::<T>);
    ops.destroy_srq = Some(destroy_srq_cb::<T>);
    ops.post_srq_recv = Some(post_srq_recv_cb::<T>);
    ops.size_ib_srq = mem::size_of::<Srq<T>>();
    build_assert!(mem::align_of::<Srq<T>>() <= 8);
    ops.size_ib_pd = mem::size_of::<Pd<T>>();
    ops.size_ib_cq = mem::size_of::<Cq<T>>();
    ops.size_ib_qp = mem::size_of::<Qp<T>>();
    // The core allocates these with kzalloc, which aligns to at least 8.
    build_assert!(mem::align_of::<Pd<T>>() <= 8);
    build_assert!(mem::align_of::<Cq<T>>() <= 8);
    build_assert!(mem::align_of::<Qp<T>>() <= 8);
}

unsafe extern "C" fn alloc_pd_cb<T: Verbs>(pd: *mut ffi::ib_pd, udata: *mut ffi::ib_udata) -> c_int {
    from_result(|| {
        // SAFETY: the core passes a fresh PD of this device with `device` set.
        let dev = unsafe { Device::<T>::from_raw((*pd).device) };
        let data = T::alloc_pd(dev, !udata.is_null())?;
        // SAFETY: `pd` is a fresh object of size `size_ib_pd`.
        unsafe { Pd::<T>::init_data(pd, data) };
        Ok(0)
    })
}

unsafe extern "C" fn dealloc_pd_cb<T: Verbs>(pd: *mut ffi::ib_pd, _udata: *mut ffi::ib_udata) -> c_int {
    // SAFETY: by the module invariant.
    T::dealloc_pd(unsafe { Pd::<T>::from_raw(pd) });
    // SAFETY: by the module invariant; the core destroys a PD only when no
    // object uses it any more.
    unsafe { Pd::<T>::drop_data(pd) };
    0
}

unsafe extern "C" fn create_cq_cb<T: Verbs>(
    cq: *mut ffi::ib_cq,
    attr: *const ffi::ib_cq_init_attr,
    bundle: *mut ffi::uverbs_attr_bundle,
) -> c_int {
    from_result(|| {
        // SAFETY: the core passes a fresh CQ with `device` set and a valid
        // attribute struct.
        let (dev, a) = unsafe { (Device::<T>::from_raw((*cq).device), &*attr) };
        if a.flags != 0 {
            return Err(eopnotsupp());
        }
        // SAFETY: the core passes null (kernel consumers) or the bundle of
        // the user command, valid for the call.
        let udata = unsafe { Udata::from_bundle(bundle) };
        let mut cattr = CqAttr { entries: a.cqe };
        let data = T::create_cq(dev, &mut cattr, udata.as_ref())?;
        // SAFETY: `cq` is a fresh object of size `size_ib_cq`; `cqe` is ours
        // to set before returning.
        unsafe {
            Cq::<T>::init_data(cq, data);
            (*cq).cqe = c_int::try_from(cattr.entries).unwrap_or(c_int::MAX);
        }
        Ok(0)
    })
}

unsafe extern "C" fn destroy_cq_cb<T: Verbs>(cq: *mut ffi::ib_cq, _udata: *mut ffi::ib_udata) -> c_int {
    // SAFETY: by the module invariant; the core checked that no QP uses it.
    let c = unsafe { Cq::<T>::from_raw(cq) };
    T::destroy_cq(c);
    // SAFETY: quiesced above; dropped once.
    unsafe { Cq::<T>::drop_data(cq) };
    0
}

unsafe extern "C" fn poll_cq_cb<T: Verbs>(cq: *mut ffi::ib_cq, n: c_int, wc: *mut ffi::ib_wc) -> c_int {
    let Ok(n) = usize::try_from(n) else {
        return EINVAL.to_errno();
    };
    if n == 0 || wc.is_null() {
        return 0;
    }
    // SAFETY: by the module invariant.
    let c = unsafe { Cq::<T>::from_raw(cq) };
    // The consumer passes `n` writable entries that nothing else accesses
    // during the call; the sink writes only below `n`.
    let mut sink = WcSink { out: wc, len: n, n: 0, _array: PhantomData };
    T::poll_cq(c, &mut sink);
    c_int::try_from(sink.n).unwrap_or(0)
}

unsafe extern "C" fn req_notify_cq_cb<T: Verbs>(cq: *mut ffi::ib_cq, flags: ffi::ib_cq_notify_flags) -> c_int {
    // SAFETY: by the module invariant.
    let c = unsafe { Cq::<T>::from_raw(cq) };
    let how = if flags & ffi::IB_CQ_SOLICITED_MASK == ffi::IB_CQ_SOLICITED {
        Notify::Solicited
    } else {
        Notify::Next
    };
    let missed = T::req_notify_cq(c, how, flags & ffi::IB_CQ_REPORT_MISSED_EVENTS != 0);
    c_int::from(missed)
}

unsafe extern "C" fn create_qp_cb<T: Verbs>(
    qp: *mut ffi::ib_qp,
    attr: *mut ffi::ib_qp_init_attr,
    udata: *mut ffi::ib_udata,
) -> c_int {
    from_result(|| {
        // SAFETY: the core passes a fresh QP with `device`, `pd`, the CQs and
        // `srq` set, and a valid, exclusive attribute struct.
        let (a, pd) = unsafe { (&mut *attr, Pd::<T>::from_raw((*qp).pd)) };
        let mut qattr = QpInitAttr {
            caps: QpCaps::from_raw(&a.cap),
            sig_all: a.sq_sig_type == ffi::IB_SIGNAL_ALL_WR,
            rc: a.qp_type == ffi::IB_QPT_RC,
            has_srq: !a.srq.is_null(),
            create_flags: a.create_flags,
        };
        // SAFETY: null for kernel consumers, else the command's udata.
        let udata = unsafe { Udata::from_raw(udata) };
        let slot = QpSlot { raw: NonNull::new(qp).ok_or(EINVAL)?, _t: PhantomData };
        let (data, qpn) = T::create_qp(pd, &mut qattr, slot, udata.as_ref())?;
        qattr.caps.write_to(&mut a.cap);
        // SAFETY: `qp` is a fresh object of size `size_ib_qp`; the QP number
        // is the driver's to set before returning.
        unsafe {
            Qp::<T>::init_data(qp, data);
            (*qp).qp_num = qpn;
        }
        // SAFETY: the QP's data was just initialised; the core holds it
        // for the call.
        T::qp_created(unsafe { Qp::<T>::from_raw(qp) });
        Ok(0)
    })
}

unsafe extern "C" fn modify_qp_cb<T: Verbs>(
    qp: *mut ffi::ib_qp,
    attr: *mut ffi::ib_qp_attr,
    mask: c_int,
    udata: *mut ffi::ib_udata,
) -> c_int {
    from_result(|| {
        // SAFETY: by the module invariant; `attr` is valid for the call.
        let (q, a) = unsafe { (Qp::<T>::from_raw(qp), &*attr) };
        let _ = udata;
        let mask = mask as u32;
        let mut m = QpModify::default();
        if mask & ffi::IB_QP_STATE != 0 {
            m.state = Some(QpState::from_raw(a.qp_state)?);
        }
        if mask & ffi::IB_QP_CUR_STATE != 0 {
            m.cur_state = Some(QpState::from_raw(a.cur_qp_state)?);
        }
        if mask & ffi::IB_QP_ACCESS_FLAGS != 0 {
            m.access = Some(Access(a.qp_access_flags as u32));
        }
        if mask & ffi::IB_QP_MAX_QP_RD_ATOMIC != 0 {
            m.ord = Some(u32::from(a.max_rd_atomic));
        }
        if mask & ffi::IB_QP_MAX_DEST_RD_ATOMIC != 0 {
            m.ird = Some(u32::from(a.max_dest_rd_atomic));
        }
        m.other = mask
            & !(ffi::IB_QP_STATE
                | ffi::IB_QP_CUR_STATE
                | ffi::IB_QP_ACCESS_FLAGS
                | ffi::IB_QP_MAX_QP_RD_ATOMIC
                | ffi::IB_QP_MAX_DEST_RD_ATOMIC);
        T::modify_qp(q, &m)?;
        Ok(0)
    })
}

unsafe extern "C" fn query_qp_cb<T: Verbs>(
    qp: *mut ffi::ib_qp,
    attr: *mut ffi::ib_qp_attr,
    _mask: c_int,
    init: *mut ffi::ib_qp_init_attr,
) -> c_int {
    // SAFETY: by the module invariant; the out-structs are valid and ours.
    let (q, a, i) = unsafe { (Qp::<T>::from_raw(qp), &mut *attr, &mut *init) };
    let r = T::query_qp(q);
    *a = ffi::ib_qp_attr::default();
    *i = ffi::ib_qp_init_attr::default();
    a.qp_state = r.state.unwrap_or(QpState::Err).to_raw();
    a.cur_qp_state = a.qp_state;
    a.qp_access_flags = r.access.0 as c_int;
    r.caps.write_to(&mut a.cap);
    a.max_rd_atomic = u8::try_from(r.ord).unwrap_or(u8::MAX);
    a.max_dest_rd_atomic = u8::try_from(r.ird).unwrap_or(u8::MAX);
    a.port_num = 1;
    // SAFETY: reading fields the core set at create time.
    unsafe {
        i.send_cq = (*qp).send_cq;
        i.recv_cq = (*qp).recv_cq;
        i.srq = (*qp).srq;
        i.qp_context = (*qp).qp_context;
        i.event_handler = (*qp).registered_event_handler;
    }
    r.caps.write_to(&mut i.cap);
    i.qp_type = ffi::IB_QPT_RC;
    i.sq_sig_type = if r.sig_all { ffi::IB_SIGNAL_ALL_WR } else { ffi::IB_SIGNAL_REQ_WR };
    0
}

unsafe extern "C" fn destroy_qp_cb<T: Verbs>(qp: *mut ffi::ib_qp, _udata: *mut ffi::ib_udata) -> c_int {
    // SAFETY: by the module invariant.
    let q = unsafe { Qp::<T>::from_raw(qp) };
    T::destroy_qp(q);
    // SAFETY: `destroy_qp` quiesced every user; dropped once.
    unsafe { Qp::<T>::drop_data(qp) };
    0
}

/// Copies a C SGE list into `buf`; `EINVAL` if it is longer or malformed.
///
/// Consumers' WRs and SGE lists are read by value and unaligned, never
/// through references: the verbs API does not promise their alignment, and
/// kernel ULPs keep them in packed descriptors (isert's `iser_tx_desc`
/// puts its `ib_send_wr` at offset 132, ib_iser's `iser_rx_desc` its
/// `ib_sge` at an offset that is a multiple of 4 only).
///
/// # Safety
///
/// `list` must point to `n` readable `ib_sge` entries if `n > 0`.
unsafe fn read_sges(list: *const ffi::ib_sge, n: c_int, buf: &mut [Sge; MAX_WR_SGE]) -> Result<usize> {
    let n = usize::try_from(n).map_err(|_| EINVAL)?;
    if n > MAX_WR_SGE {
        return Err(EINVAL);
    }
    if n > 0 && list.is_null() {
        return Err(EINVAL);
    }
    for (i, slot) in buf.iter_mut().take(n).enumerate() {
        // SAFETY: `i < n`, within the caller's list. Read unaligned: the
        // list may sit in a packed structure (ib_iser's and isert's
        // receive descriptors are `__packed`).
        let s = unsafe { list.add(i).read_unaligned() };
        *slot = Sge { addr: s.addr, length: s.length, lkey: s.lkey };
    }
    Ok(n)
}

/// Decodes one C send work request and hands it to the driver.
///
/// # Safety
///
/// `wrp` must point to a valid send WR whose container matches its opcode,
/// as the verbs API requires of consumers (not necessarily aligned, see
/// [`read_sges`]), and `wr` be its copy; an MR in a registration WR must be
/// an MR of driver `T`.
unsafe fn post_one_send<T: Verbs>(q: &Qp<T>, wrp: *const ffi::ib_send_wr, wr: &ffi::ib_send_wr) -> Result {
    let mut sges = [Sge::default(); MAX_WR_SGE];
    // SAFETY: by the requirements.
    let n = unsafe { read_sges(wr.sg_list, wr.num_sge, &mut sges)? };
    let fl = wr.send_flags as u32;
    let flags = SendFlags {
        signaled: fl & ffi::IB_SEND_SIGNALED as u32 != 0,
        solicited: fl & ffi::IB_SEND_SOLICITED as u32 != 0,
        fence: fl & ffi::IB_SEND_FENCE as u32 != 0,
        inline: fl & ffi::IB_SEND_INLINE as u32 != 0,
    };
    // The containers start with the `ib_send_wr`, so the WR pointer is the
    // container's (the C `container_of` with offset 0).
    // SAFETY (for the three helpers): by the requirements the container
    // matches the opcode they are used for; read by value, as the WR.
    let rdma = || unsafe { wrp.cast::<ffi::ib_rdma_wr>().read_unaligned() };
    let atomic = || unsafe { wrp.cast::<ffi::ib_atomic_wr>().read_unaligned() };
    let reg = || unsafe { wrp.cast::<ffi::ib_reg_wr>().read_unaligned() };
    // SAFETY: both members of the union are plain 32-bit integers.
    let ex = unsafe { wr.ex.invalidate_rkey };
    let op = match wr.opcode {
        ffi::IB_WR_SEND => SendOp::Send,
        ffi::IB_WR_SEND_WITH_IMM => SendOp::SendImm(ex),
        ffi::IB_WR_SEND_WITH_INV => SendOp::SendInv(ex),
        ffi::IB_WR_RDMA_WRITE => {
            let r = rdma();
            SendOp::Write { remote_addr: r.remote_addr, rkey: r.rkey }
        }
        ffi::IB_WR_RDMA_WRITE_WITH_IMM => {
            let r = rdma();
            SendOp::WriteImm { remote_addr: r.remote_addr, rkey: r.rkey, imm: ex }
        }
        ffi::IB_WR_RDMA_READ => {
            let r = rdma();
            SendOp::Read { remote_addr: r.remote_addr, rkey: r.rkey }
        }
        ffi::IB_WR_RDMA_READ_WITH_INV => {
            let r = rdma();
            SendOp::ReadInv { remote_addr: r.remote_addr, rkey: r.rkey, inv: ex }
        }
        ffi::IB_WR_ATOMIC_CMP_AND_SWP => {
            let a = atomic();
            SendOp::CmpSwap { remote_addr: a.remote_addr, rkey: a.rkey, compare: a.compare_add, swap: a.swap }
        }
        ffi::IB_WR_ATOMIC_FETCH_AND_ADD => {
            let a = atomic();
            SendOp::FetchAdd { remote_addr: a.remote_addr, rkey: a.rkey, add: a.compare_add }
        }
        ffi::IB_WR_LOCAL_INV => SendOp::LocalInv(ex),
        ffi::IB_WR_REG_MR => {
            let r = reg();
            if r.mr.is_null() {
                return Err(EINVAL);
            }
            // SAFETY: by the requirements the MR is a live MR of `T`; the
            // consumer keeps it until the WR completes.
            let mr = unsafe { Mr::<T>::from_raw(r.mr) };
            SendOp::RegMr { mr, key: (r.key & 0xff) as u8, access: Access(r.access as u32) }
        }
        _ => return Err(EINVAL),
    };
    let swr = SendWr {
        // SAFETY: `wr_id` and `wr_cqe` share the 64 bits; either is returned
        // to the consumer unchanged.
        wr_id: unsafe { wr.__bindgen_anon_1.wr_id },
        op,
        flags,
        sges: sges.get(..n).unwrap_or(&[]),
    };
    T::post_send(q, &swr)
}

unsafe extern "C" fn post_send_cb<T: Verbs>(
    qp: *mut ffi::ib_qp,
    wr: *const ffi::ib_send_wr,
    bad: *mut *const ffi::ib_send_wr,
) -> c_int {
    // SAFETY: by the module invariant.
    let q = unsafe { Qp::<T>::from_raw(qp) };
    if wr.is_null() {
        T::sq_doorbell(q);
        return 0;
    }
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the consumer passes a valid chain of WRs (read by value,
        // see `read_sges`).
        let w = unsafe { cur.read_unaligned() };
        // SAFETY: as above; `w` is its copy.
        if let Err(e) = unsafe { post_one_send(q, cur, &w) } {
            if !bad.is_null() {
                // SAFETY: `bad` is the consumer's out-pointer.
                unsafe { bad.write_unaligned(cur) };
            }
            return e.to_errno();
        }
        cur = w.next;
    }
    0
}

unsafe extern "C" fn post_recv_cb<T: Verbs>(
    qp: *mut ffi::ib_qp,
    wr: *const ffi::ib_recv_wr,
    bad: *mut *const ffi::ib_recv_wr,
) -> c_int {
    // SAFETY: by the module invariant.
    let q = unsafe { Qp::<T>::from_raw(qp) };
    if wr.is_null() {
        T::rq_doorbell(q);
        return 0;
    }
    // SAFETY: the consumer's chain and out-pointer.
    unsafe { post_recv_chain(wr, bad, |rwr| T::post_recv(q, rwr)) }
}

unsafe extern "C" fn post_srq_recv_cb<T: Verbs>(
    srq: *mut ffi::ib_srq,
    wr: *const ffi::ib_recv_wr,
    bad: *mut *const ffi::ib_recv_wr,
) -> c_int {
    // SAFETY: by the module invariant.
    let s = unsafe { Srq::<T>::from_raw(srq) };
    // A process's SRQ ring needs no doorbell.
    if wr.is_null() {
        return 0;
    }
    // SAFETY: the consumer's chain and out-pointer.
    unsafe { post_recv_chain(wr, bad, |rwr| T::post_srq_recv(s, rwr)) }
}

/// Decodes a chain of receive WRs and posts each with `post`; on the first
/// failure sets `*bad` and returns the error.
///
/// # Safety
///
/// `wr` must be a valid chain of receive WRs and `bad` null or writable.
unsafe fn post_recv_chain(
    wr: *const ffi::ib_recv_wr,
    bad: *mut *const ffi::ib_recv_wr,
    mut post: impl FnMut(&RecvWr<'_>) -> Result,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the consumer passes a valid chain of WRs (read by value,
        // see `read_sges`).
        let w = unsafe { cur.read_unaligned() };
        let mut sges = [Sge::default(); MAX_WR_SGE];
        // SAFETY: the WR's list has `num_sge` entries.
        let res = unsafe { read_sges(w.sg_list, w.num_sge, &mut sges) }.and_then(|n| {
            let rwr = RecvWr {
                // SAFETY: as in `post_one_send`.
                wr_id: unsafe { w.__bindgen_anon_1.wr_id },
                sges: sges.get(..n).unwrap_or(&[]),
            };
            post(&rwr)
        });
        if let Err(e) = res {
            if !bad.is_null() {
                // SAFETY: `bad` is the consumer's out-pointer.
                unsafe { bad.write_unaligned(cur) };
            }
            return e.to_errno();
        }
        cur = w.next;
    }
    0
}

unsafe extern "C" fn create_srq_cb<T: Verbs>(
    srq: *mut ffi::ib_srq,
    init: *mut ffi::ib_srq_init_attr,
    udata: *mut ffi::ib_udata,
) -> c_int {
    from_result(|| {
        // SAFETY: the core passes a fresh SRQ with `device` and `pd` set and
        // a valid, exclusive attribute struct.
        let (a, pd) = unsafe { (&mut *init, Pd::<T>::from_raw((*srq).pd)) };
        if a.srq_type != ffi::IB_SRQT_BASIC {
            return Err(eopnotsupp());
        }
        let mut attr = SrqAttr { max_wr: a.attr.max_wr, max_sge: a.attr.max_sge, limit: a.attr.srq_limit };
        // SAFETY: null for kernel consumers, else the command's udata.
        let udata = unsafe { Udata::from_raw(udata) };
        let data = T::create_srq(pd, &mut attr, udata.as_ref())?;
        a.attr.max_wr = attr.max_wr;
        a.attr.max_sge = attr.max_sge;
        // SAFETY: `srq` is a fresh object of size `size_ib_srq`.
        unsafe { Srq::<T>::init_data(srq, data) };
        Ok(0)
    })
}

unsafe extern "C" fn modify_srq_cb<T: Verbs>(
    srq: *mut ffi::ib_srq,
    attr: *mut ffi::ib_srq_attr,
    mask: ffi::ib_srq_attr_mask,
    _udata: *mut ffi::ib_udata,
) -> c_int {
    from_result(|| {
        // SAFETY: by the module invariant; `attr` is valid for the call.
        let (s, a) = unsafe { (Srq::<T>::from_raw(srq), &*attr) };
        let max_wr = (mask & ffi::IB_SRQ_MAX_WR != 0).then_some(a.max_wr);
        let limit = (mask & ffi::IB_SRQ_LIMIT != 0).then_some(a.srq_limit);
        T::modify_srq(s, max_wr, limit)?;
        Ok(0)
    })
}

unsafe extern "C" fn query_srq_cb<T: Verbs>(srq: *mut ffi::ib_srq, attr: *mut ffi::ib_srq_attr) -> c_int {
    // SAFETY: by the module invariant; `attr` is the caller's out-struct.
    let (s, a) = unsafe { (Srq::<T>::from_raw(srq), &mut *attr) };
    let r = T::query_srq(s);
    a.max_wr = r.max_wr;
    a.max_sge = r.max_sge;
    a.srq_limit = r.limit;
    0
}

unsafe extern "C" fn destroy_srq_cb<T: Verbs>(srq: *mut ffi::ib_srq, _udata: *mut ffi::ib_udata) -> c_int {
    // SAFETY: by the module invariant; the core destroys an SRQ only when
    // no QP uses it any more.
    let s = unsafe { Srq::<T>::from_raw(srq) };
    T::destroy_srq(s);
    // SAFETY: quiesced; dropped once.
    unsafe { Srq::<T>::drop_data(srq) };
    0
}

/// Allocates an `Mr<T>` around `data` and returns its `ib_mr` (the core
/// fills in `device`, `pd`, `type`, …) or an error pointer.
fn new_mr<T: Verbs>(pd: &Pd<T>, kind: MrKind) -> *mut ffi::ib_mr {
    let res = (|| -> Result<*mut ffi::ib_mr> {
        let (data, stag) = T::alloc_mr(pd, kind)?;
        let mr = KBox::new(Mr::<T> { ib: Opaque::uninit(), data }, GFP_KERNEL)?;
        let raw = KBox::into_raw(mr);
        // SAFETY: `raw` is our fresh allocation; zero the C part, then set
        // the keys (the core sets the rest on return).
        unsafe {
            let ib = (*raw).ib.get();
            ib.write(ffi::ib_mr::default());
            (*ib).lkey = stag;
            (*ib).rkey = stag;
            Ok(ib)
        }
    })();
    match res {
        Ok(p) => p,
        Err(e) => e.to_ptr(),
    }
}

unsafe extern "C" fn get_dma_mr_cb<T: Verbs>(pd: *mut ffi::ib_pd, access: c_int) -> *mut ffi::ib_mr {
    // SAFETY: by the module invariant.
    let p = unsafe { Pd::<T>::from_raw(pd) };
    new_mr(p, MrKind::Dma(Access(access as u32)))
}

unsafe extern "C" fn alloc_mr_cb<T: Verbs>(pd: *mut ffi::ib_pd, ty: ffi::ib_mr_type, max_sg: u32) -> *mut ffi::ib_mr {
    if ty != ffi::IB_MR_TYPE_MEM_REG {
        return eopnotsupp().to_ptr();
    }
    // SAFETY: by the module invariant.
    let p = unsafe { Pd::<T>::from_raw(pd) };
    new_mr(p, MrKind::Fast(max_sg))
}

unsafe extern "C" fn reg_user_mr_cb<T: Verbs>(
    pd: *mut ffi::ib_pd,
    start: u64,
    len: u64,
    iova: u64,
    access: c_int,
    _udata: *mut ffi::ib_udata,
) -> *mut ffi::ib_mr {
    let page_mask = kernel::page::PAGE_SIZE as u64 - 1;
    // The page list starts at the page of `start`; addresses are resolved
    // from `iova`, so both must have the same offset in their page.
    if len == 0 || (start ^ iova) & page_mask != 0 || len > crate::limits::MAX_MR_SIZE {
        return EINVAL.to_ptr();
    }
    // SAFETY: by the module invariant.
    let p = unsafe { Pd::<T>::from_raw(pd) };
    match crate::uverbs::Umem::get(p.device().as_raw(), start, len, access) {
        Ok(umem) => new_mr(p, MrKind::User { umem, iova, len, access: Access(access as u32) }),
        Err(e) => e.to_ptr(),
    }
}

unsafe extern "C" fn map_mr_sg_cb<T: Verbs>(
    mr: *mut ffi::ib_mr,
    sg: *mut ffi::scatterlist,
    nents: c_int,
    offset: *mut c_uint,
) -> c_int {
    // SAFETY: by the module invariant.
    let m = unsafe { Mr::<T>::from_raw(mr) };
    T::mr_reset_pages(m);
    // SAFETY: the consumer's scatterlist and offset are valid for the call;
    // the core calls `set_page_cb` with this MR for each page.
    unsafe { ffi::ib_sg_to_pages(mr, sg, nents, offset, Some(set_page_cb::<T>)) }
}

/// The per-page callback of `ib_sg_to_pages`.
unsafe extern "C" fn set_page_cb<T: Verbs>(mr: *mut ffi::ib_mr, addr: u64) -> c_int {
    // SAFETY: `ib_sg_to_pages` passes the MR given to `map_mr_sg_cb`.
    let m = unsafe { Mr::<T>::from_raw(mr) };
    match T::mr_add_page(m, addr) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

unsafe extern "C" fn dereg_mr_cb<T: Verbs>(mr: *mut ffi::ib_mr, _udata: *mut ffi::ib_udata) -> c_int {
    // SAFETY: by the module invariant.
    let m = unsafe { Mr::<T>::from_raw(mr) };
    T::dereg_mr(m);
    // SAFETY: `mr` came from `KBox::into_raw` in `new_mr`; the core never
    // uses it after this call.
    drop(unsafe { KBox::from_raw(mr.cast::<Mr<T>>()) });
    0
}

/// `-ENOTCONN` (the 6.12 kernel crate has no constant for it).
pub(crate) fn enotconn() -> Error {
    Error::from_errno(-(ffi::ENOTCONN as c_int))
}

/// `-EOPNOTSUPP` (the 6.12 kernel crate has no constant for it).
pub(crate) fn eopnotsupp() -> Error {
    Error::from_errno(-(ffi::EOPNOTSUPP as c_int))
}
