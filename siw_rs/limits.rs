// SPDX-License-Identifier: GPL-2.0

//! Device limits reported by `query_device`/`query_port`.
//!
//! One place for every number a consumer can see; Documentation/siw_rs/usage.rst
//! lists them with their reasons. They are limits the driver enforces, not
//! hardware facts, so they are chosen to bound the memory one unprivileged
//! process can pin or make the kernel allocate.

/// Queue pairs per device (1,000 connected QPs at once is a scale target).
pub(crate) const MAX_QP: u32 = 4096;
/// Work requests per send or receive queue.
pub(crate) const MAX_QP_WR: u32 = 4096;
/// Scatter/gather elements per send or receive work request.
pub(crate) const MAX_SGE: u32 = 6;
/// Scatter/gather elements per RDMA Read work request.
pub(crate) const MAX_SGE_RD: u32 = 1;
/// Completion queues per device.
pub(crate) const MAX_CQ: u32 = 4096;
/// Entries per completion queue.
pub(crate) const MAX_CQE: u32 = 65536;
/// Memory regions per device.
pub(crate) const MAX_MR: u32 = 65536;
/// Largest memory region, in bytes (a 4 GiB MR is a scale target).
pub(crate) const MAX_MR_SIZE: u64 = 1 << 40;
/// Protection domains per device.
pub(crate) const MAX_PD: u32 = 4096;
/// Shared receive queues per device.
pub(crate) const MAX_SRQ: u32 = 1024;
/// Work requests per shared receive queue.
pub(crate) const MAX_SRQ_WR: u32 = 4096;
/// Inbound RDMA Read requests outstanding per QP (MPA v2 IRD).
pub(crate) const MAX_IRD: u32 = 128;
/// Outbound RDMA Read requests outstanding per QP (MPA v2 ORD).
pub(crate) const MAX_ORD: u32 = 128;
/// Pages in one fast-registration page list.
pub(crate) const MAX_FAST_REG_PAGES: u32 = 512;
/// Largest message, in bytes.
pub(crate) const MAX_MSG_SIZE: u32 = 0x7fff_ffff;
/// Number of siw_rs devices one host can have at once (one per netdev).
pub(crate) const MAX_DEVICES: usize = 64;
