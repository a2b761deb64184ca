// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Which devices this provider binds to.
//!
//! siw_rs registers its devices with `RDMA_DRIVER_UNKNOWN`, so rdma-core
//! cannot match them by driver id. libibverbs tries every provider that has
//! a `match_device` hook on a device no driver-id match claimed (see
//! `try_drivers`/`match_device` in libibverbs/init.c); the hook accepts a
//! device only if it is driver-id UNKNOWN (never an upstream siw device,
//! `RDMA_DRIVER_SIW`, which Debian's libsiw serves) and its
//! `<ibdev_path>/siw_rs_abi` attribute holds the ABI version this provider
//! was built for.

use std::fs;
use std::path::Path;

use crate::abi::ABI_VERSION;
use crate::sys;

/// Why a device is not ours.
#[derive(Debug, PartialEq, Eq)]
pub enum NoMatch {
    /// The kernel reported a real driver id: another provider's device.
    DriverId(u32),
    /// No readable `siw_rs_abi` attribute: not a siw_rs device.
    NoAttribute,
    /// A siw_rs device of another ABI version (or an unparsable value).
    AbiVersion(String),
}

/// Decides whether the device at `ibdev_path` (`/sys/class/infiniband/<dev>`)
/// with netlink driver id `driver_id` is a siw_rs device of our ABI.
pub fn siw_rs_device(ibdev_path: &Path, driver_id: u32) -> Result<(), NoMatch> {
    if driver_id != sys::RDMA_DRIVER_UNKNOWN {
        return Err(NoMatch::DriverId(driver_id));
    }
    let attr =
        std::str::from_utf8(&sys::SIW_RS_ABI_SYSFS_ATTR[..sys::SIW_RS_ABI_SYSFS_ATTR.len() - 1])
            .expect("attribute name is ASCII");
    let value = fs::read_to_string(ibdev_path.join(attr)).map_err(|_| NoMatch::NoAttribute)?;
    match value.trim().parse::<u32>() {
        Ok(v) if v == ABI_VERSION => Ok(()),
        _ => Err(NoMatch::AbiVersion(value.trim().to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake `/sys/class/infiniband/<dev>` directory.
    struct FakeDev(PathBuf);

    impl FakeDev {
        fn new(name: &str, abi: Option<&str>) -> Self {
            let dir =
                std::env::temp_dir().join(format!("siw_rs-match-{}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("node_type"), "4: RNIC\n").unwrap();
            if let Some(v) = abi {
                fs::write(dir.join("siw_rs_abi"), v).unwrap();
            }
            FakeDev(dir)
        }
    }

    impl Drop for FakeDev {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn matches_our_abi() {
        let d = FakeDev::new("ok", Some(&format!("{ABI_VERSION}\n")));
        assert_eq!(siw_rs_device(&d.0, sys::RDMA_DRIVER_UNKNOWN), Ok(()));
    }

    #[test]
    fn rejects_other_devices() {
        let upstream_siw = FakeDev::new("siw", None);
        assert_eq!(
            siw_rs_device(&upstream_siw.0, sys::RDMA_DRIVER_SIW),
            Err(NoMatch::DriverId(sys::RDMA_DRIVER_SIW))
        );
        assert_eq!(
            siw_rs_device(&upstream_siw.0, sys::RDMA_DRIVER_UNKNOWN),
            Err(NoMatch::NoAttribute)
        );
        // Even with the attribute, a real driver id is never ours.
        let odd = FakeDev::new("odd", Some("1"));
        assert!(siw_rs_device(&odd.0, sys::RDMA_DRIVER_RXE).is_err());
    }

    #[test]
    fn rejects_other_abi_versions() {
        let d = FakeDev::new("v2", Some(&format!("{}\n", ABI_VERSION + 1)));
        assert!(matches!(
            siw_rs_device(&d.0, 0),
            Err(NoMatch::AbiVersion(_))
        ));
        let junk = FakeDev::new("junk", Some("one"));
        assert!(matches!(
            siw_rs_device(&junk.0, 0),
            Err(NoMatch::AbiVersion(_))
        ));
        let missing = Path::new("/nonexistent/siw_rs0");
        assert_eq!(siw_rs_device(missing, 0), Err(NoMatch::NoAttribute));
    }
}
