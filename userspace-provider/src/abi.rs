// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The siw_rs user/kernel ABI as the provider uses it: the types generated
//! from `uapi/siw_rs-abi.h`, the command responses (generic uverbs response
//! followed by the driver's), and the checks of what the kernel returns.

use std::mem::size_of;

use crate::sys;

pub use crate::sys::{siw_rs_cqe as Cqe, siw_rs_rqe as Rqe, siw_rs_sge as Sge, siw_rs_sqe as Sqe};

/// The ABI version this provider was built for.
pub const ABI_VERSION: u32 = sys::SIW_RS_ABI_VERSION;
/// Scatter/gather entries per work queue entry.
pub const MAX_SGE: u32 = sys::SIW_RS_MAX_SGE;
/// Inline data octets per send queue entry.
pub const MAX_INLINE: u32 = sys::SIW_RS_MAX_INLINE;
/// Offset of the first entry in a ring mapping.
pub const RING_ENTRIES_OFFSET: usize = sys::SIW_RS_RING_ENTRIES_OFFSET as usize;

// The ring control block must fit before the entries, and the entry sizes
// are what the kernel reports in the alloc_context response.
const _: () = assert!(size_of::<sys::siw_rs_ring_ctrl>() <= RING_ENTRIES_OFFSET);
const _: () = assert!(size_of::<Sqe>() == 64 + MAX_INLINE as usize);
const _: () = assert!(size_of::<Sge>() * MAX_SGE as usize <= MAX_INLINE as usize);

/// Response of `ibv_cmd_get_context`.
#[repr(C)]
pub struct AllocCtxResp {
    /// Generic part.
    pub ibv: sys::ib_uverbs_get_context_resp,
    /// siw_rs part.
    pub drv: sys::siw_rs_uresp_alloc_ctx,
}

/// Response of `ibv_cmd_create_cq`.
#[repr(C)]
pub struct CreateCqResp {
    /// Generic part.
    pub ibv: sys::ib_uverbs_create_cq_resp,
    /// siw_rs part.
    pub drv: sys::siw_rs_uresp_create_cq,
}

/// Response of `ibv_cmd_create_cq_ex`.
#[repr(C)]
pub struct CreateCqExResp {
    /// Generic part.
    pub ibv: sys::ib_uverbs_ex_create_cq_resp,
    /// siw_rs part.
    pub drv: sys::siw_rs_uresp_create_cq,
}

/// Response of `ibv_cmd_create_qp_ex`.
#[repr(C)]
pub struct CreateQpResp {
    /// Generic part.
    pub ibv: sys::ib_uverbs_create_qp_resp,
    /// siw_rs part.
    pub drv: sys::siw_rs_uresp_create_qp,
}

/// Response of `ibv_cmd_create_srq`.
#[repr(C)]
pub struct CreateSrqResp {
    /// Generic part.
    pub ibv: sys::ib_uverbs_create_srq_resp,
    /// siw_rs part.
    pub drv: sys::siw_rs_uresp_create_srq,
}

/// Per-context limits negotiated at alloc_context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// SGEs per work queue entry.
    pub max_sge: u32,
    /// Inline octets per send queue entry.
    pub max_inline: u32,
}

/// `ioctl(2)` request of the doorbell file that rings a send queue.
pub const IOCTL_SQ_DOORBELL: u32 = sys::SIW_RS_PROVIDER_SQ_DOORBELL;
/// `ioctl(2)` request of the doorbell file that rings a receive queue.
pub const IOCTL_RQ_DOORBELL: u32 = sys::SIW_RS_PROVIDER_RQ_DOORBELL;

/// The doorbell file the kernel opened for a context, if any: `db_fd` of
/// the alloc_context response, a file number or -1.
pub fn doorbell_fd(r: &sys::siw_rs_uresp_alloc_ctx) -> Result<Option<i32>, String> {
    match r.db_fd {
        -1 => Ok(None),
        fd if fd >= 0 => Ok(Some(fd)),
        fd => Err(format!("kernel doorbell file number {fd}")),
    }
}

/// Checks the driver part of the alloc_context response against what this
/// provider was built for.
pub fn check_alloc_ctx(r: &sys::siw_rs_uresp_alloc_ctx) -> Result<Limits, String> {
    if r.abi_version != ABI_VERSION {
        return Err(format!(
            "kernel siw_rs ABI {} but the provider was built for {}",
            r.abi_version, ABI_VERSION
        ));
    }
    let sizes = [
        ("sqe", r.sqe_size, size_of::<Sqe>()),
        ("rqe", r.rqe_size, size_of::<Rqe>()),
        ("cqe", r.cqe_size, size_of::<Cqe>()),
    ];
    for (what, kernel, ours) in sizes {
        if kernel as usize != ours {
            return Err(format!("kernel {what} size {kernel}, provider {ours}"));
        }
    }
    if r.max_sge == 0 || r.max_sge > MAX_SGE || r.max_inline > MAX_INLINE {
        return Err(format!(
            "kernel limits out of range: max_sge {} max_inline {}",
            r.max_sge, r.max_inline
        ));
    }
    Ok(Limits {
        max_sge: r.max_sge,
        max_inline: r.max_inline,
    })
}

/// Where one ring lives: the mmap offset, the mapping length and the number
/// of entries, checked to be consistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    /// mmap offset on the uverbs fd.
    pub key: u64,
    /// Length of the mapping.
    pub bytes: usize,
    /// Entries in the ring, a power of two.
    pub entries: u32,
}

impl RingGeometry {
    /// Checks a ring described by the kernel whose entries are `entry_size`
    /// octets.
    pub fn new(key: u64, bytes: u64, entries: u32, entry_size: usize) -> Result<Self, String> {
        if entries == 0 || !entries.is_power_of_two() {
            return Err(format!("ring of {entries} entries is not a power of two"));
        }
        let need = (entries as usize)
            .checked_mul(entry_size)
            .and_then(|n| n.checked_add(RING_ENTRIES_OFFSET))
            .ok_or_else(|| format!("ring of {entries} entries overflows"))?;
        let bytes = usize::try_from(bytes).map_err(|_| format!("ring of {bytes} octets"))?;
        if bytes < need {
            return Err(format!(
                "ring mapping of {bytes} octets, {entries} entries need {need}"
            ));
        }
        if i64::try_from(key).is_err() {
            return Err(format!("ring key {key:#x} is not a valid mmap offset"));
        }
        Ok(Self {
            key,
            bytes,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good_ctx() -> sys::siw_rs_uresp_alloc_ctx {
        sys::siw_rs_uresp_alloc_ctx {
            abi_version: ABI_VERSION,
            max_inline: MAX_INLINE,
            sqe_size: size_of::<Sqe>() as u32,
            rqe_size: size_of::<Rqe>() as u32,
            cqe_size: size_of::<Cqe>() as u32,
            max_sge: MAX_SGE,
            db_fd: -1,
            rsvd: 0,
        }
    }

    #[test]
    fn layout_matches_header_comments() {
        assert_eq!(size_of::<sys::siw_rs_ring_ctrl>(), 192);
        assert_eq!(std::mem::offset_of!(sys::siw_rs_ring_ctrl, cons), 64);
        assert_eq!(std::mem::offset_of!(sys::siw_rs_ring_ctrl, kflags), 128);
        assert_eq!(size_of::<Sqe>(), 320);
        assert_eq!(size_of::<Rqe>(), 112);
        assert_eq!(size_of::<Cqe>(), 32);
        assert_eq!(std::mem::offset_of!(CreateCqExResp, drv), 16);
        assert_eq!(std::mem::offset_of!(CreateQpResp, drv), 32);
        assert_eq!(std::mem::offset_of!(CreateSrqResp, drv), 16);
        assert_eq!(std::mem::offset_of!(AllocCtxResp, drv), 8);
    }

    #[test]
    fn alloc_ctx_checks() {
        assert_eq!(
            check_alloc_ctx(&good_ctx()),
            Ok(Limits {
                max_sge: 6,
                max_inline: 256
            })
        );
        let mut r = good_ctx();
        r.abi_version = ABI_VERSION + 1;
        assert!(check_alloc_ctx(&r)
            .unwrap_err()
            .contains(&format!("ABI {}", ABI_VERSION + 1)));
        let mut r = good_ctx();
        r.sqe_size = 64;
        assert!(check_alloc_ctx(&r).unwrap_err().contains("sqe"));
        let mut r = good_ctx();
        r.max_sge = 7;
        assert!(check_alloc_ctx(&r).is_err());
        let mut r = good_ctx();
        r.max_sge = 0;
        assert!(check_alloc_ctx(&r).is_err());
    }

    #[test]
    fn doorbell_file() {
        let mut r = good_ctx();
        assert_eq!(doorbell_fd(&r), Ok(None));
        r.db_fd = 0;
        assert_eq!(doorbell_fd(&r), Ok(Some(0)));
        r.db_fd = 7;
        assert_eq!(doorbell_fd(&r), Ok(Some(7)));
        r.db_fd = -2;
        assert!(doorbell_fd(&r).unwrap_err().contains("-2"));
        // _IO(0x1b, nr): no direction, no size.
        assert_eq!(IOCTL_SQ_DOORBELL, 0x1b80);
        assert_eq!(IOCTL_RQ_DOORBELL, 0x1b81);
    }

    #[test]
    fn ring_geometry_checks() {
        assert!(RingGeometry::new(0x1000, 256 + 4 * 32, 4, 32).is_ok());
        assert!(RingGeometry::new(0x1000, 256 + 3 * 32, 4, 32).is_err());
        assert!(RingGeometry::new(0x1000, 4096, 3, 32).is_err());
        assert!(RingGeometry::new(0x1000, 4096, 0, 32).is_err());
        assert!(RingGeometry::new(u64::MAX, 4096, 4, 32).is_err());
    }
}
