// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Load tests of the built plugin against the system's libibverbs (no
//! siw_rs device exists on the host):
//!
//! - dlopen() of the plugin resolves every symbol against Debian's
//!   libibverbs.so.1 (IBVERBS_PRIVATE_34) and runs its constructor;
//! - `ibv_devices` with the plugin active does not crash;
//! - end to end with a fake sysfs (in a private mount namespace, so a fake
//!   /dev/infiniband exists only for the test): libibverbs loads the plugin
//!   through RDMAV_DRIVERS and it claims the siw_rs device of its ABI, but
//!   neither an upstream siw device nor a siw_rs device of another ABI.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}
const RTLD_NOW: c_int = 2;

/// The plugin (the crate's cdylib), built fresh for this test run.
///
/// `cargo test` links integration tests against the rlib and does not build
/// the cdylib, so a clean checkout has none and an incremental one may have a
/// stale one. Build it once per test binary with the same cargo and profile
/// (a no-op when up to date), then use the file next to this test's binary.
fn plugin() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let built = BUILT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "siw-rs-provider", "--lib"]);
        cmd.arg("--target-dir").arg(dir.parent().unwrap());
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("cargo build of the plugin failed: {s}")),
            Err(e) => Err(format!("cannot run cargo to build the plugin: {e}")),
        }
    });
    if let Err(e) = built {
        panic!("{e}");
    }
    let so = dir.join("libsiw_rs.so");
    assert!(so.exists(), "{} not built", so.display());
    so
}

/// A directory holding the plugin under the name libibverbs loads, and the
/// RDMAV_DRIVERS entry naming it.
fn plugin_dir(tag: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("siw_rs-load-{}-{tag}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(plugin(), dir.join("libsiw_rs-rdmav34.so")).unwrap();
    let entry = dir.join("libsiw_rs").to_str().unwrap().to_owned();
    (dir, entry)
}

fn dl(path: &str) -> *mut c_void {
    let c = CString::new(path).unwrap();
    // SAFETY: dlopen with a valid C string; the result is checked.
    let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
    if h.is_null() {
        // SAFETY: dlerror returns the pending error string.
        let e = unsafe { CStr::from_ptr(dlerror()) };
        panic!("dlopen {path}: {}", e.to_string_lossy());
    }
    h
}

#[test]
fn dlopen_resolves_against_system_libibverbs() {
    let h = dl(plugin().to_str().unwrap());
    assert!(!h.is_null());
    // The plugin pulled in libibverbs; listing devices after its
    // constructor registered the provider must work (or fail cleanly:
    // the host has no RDMA devices).
    let ibv = dl("libibverbs.so.1");
    // SAFETY: symbol lookup in a loaded library.
    let get = unsafe { dlsym(ibv, c"ibv_get_device_list".as_ptr()) };
    // SAFETY: symbol lookup in a loaded library.
    let free = unsafe { dlsym(ibv, c"ibv_free_device_list".as_ptr()) };
    assert!(!get.is_null() && !free.is_null());
    type Get = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
    type Free = unsafe extern "C" fn(*mut *mut c_void);
    // SAFETY: the documented prototypes of these libibverbs functions.
    unsafe {
        let get: Get = std::mem::transmute(get);
        let free: Free = std::mem::transmute(free);
        let mut n = 0;
        let list = get(&mut n);
        if !list.is_null() {
            free(list);
        }
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn ibv_devices_with_provider_does_not_crash() {
    if !have("ibv_devices") {
        eprintln!("skipped: ibv_devices not installed");
        return;
    }
    let (dir, entry) = plugin_dir("devices");
    let out = Command::new("ibv_devices")
        .env("RDMAV_DRIVERS", &entry)
        .env("IBV_SHOW_WARNINGS", "1")
        .output()
        .unwrap();
    let _ = fs::remove_dir_all(dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some(),
        "ibv_devices killed: {:?}\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("couldn't load driver"), "{stderr}");
}

/// Writes a fake `/sys` with three uverbs devices: a siw_rs device of our
/// ABI, one of the next ABI, and an upstream siw device.
fn fake_sysfs(root: &Path) {
    let w = |p: &str, v: &str| {
        let p = root.join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, v).unwrap();
    };
    w("class/infiniband_verbs/abi_version", "6\n");
    // siw_rs0 has the provider's ABI, siw_rs1 the next one; the uverbs
    // ABI a siw_rs device reports is its siw_rs ABI (siw reports 1).
    let abi = siw_rs::abi::ABI_VERSION;
    let (ours, next) = (abi.to_string(), (abi + 1).to_string());
    let devs = [
        ("siw_rs0", Some(ours.as_str())),
        ("siw_rs1", Some(next.as_str())),
        ("siw0", None),
    ];
    for (i, (name, abi)) in devs.iter().enumerate() {
        w(
            &format!("class/infiniband_verbs/uverbs{i}/ibdev"),
            &format!("{name}\n"),
        );
        w(
            &format!("class/infiniband_verbs/uverbs{i}/dev"),
            &format!("231:{}\n", 192 + i),
        );
        w(
            &format!("class/infiniband_verbs/uverbs{i}/abi_version"),
            &format!("{}\n", abi.unwrap_or("1")),
        );
        w(&format!("class/infiniband/{name}/node_type"), "4: RNIC\n");
        w(
            &format!("class/infiniband/{name}/node_guid"),
            &format!("0200:00ff:fe00:000{i}\n"),
        );
        if let Some(v) = abi {
            w(
                &format!("class/infiniband/{name}/siw_rs_abi"),
                &format!("{v}\n"),
            );
        }
    }
}

#[test]
fn binds_only_to_siw_rs_devices_of_its_abi() {
    if !have("ibv_devices") || !have("unshare") {
        eprintln!("skipped: ibv_devices or unshare not installed");
        return;
    }
    let (dir, entry) = plugin_dir("sysfs");
    let sys = dir.join("sys");
    fake_sysfs(&sys);
    // libibverbs enumerates by netlink first and falls back to sysfs
    // ($SYSFS_PATH) when that fails, which it does where no RDMA core is
    // loaded (the host). It stats /dev/infiniband/uverbsN: a tmpfs on /dev
    // in a private mount namespace provides those.
    let script = format!(
        "mount -t tmpfs none /dev && mkdir /dev/infiniband && \
         touch /dev/infiniband/uverbs0 /dev/infiniband/uverbs1 /dev/infiniband/uverbs2 && \
         echo '--- with' && RDMAV_DRIVERS={entry} ibv_devices && \
         echo '--- without' && ibv_devices"
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .env("SYSFS_PATH", &sys)
        .env("IBV_SHOW_WARNINGS", "1")
        .output()
        .unwrap();
    let _ = fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !stdout.contains("--- with") {
        eprintln!("skipped: no private mount namespace here: {stderr}");
        return;
    }
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let (with, without) = stdout.split_once("--- without").unwrap();
    let listed = |s: &str, dev: &str| s.lines().any(|l| l.split_whitespace().next() == Some(dev));
    assert!(
        listed(with, "siw_rs0"),
        "siw_rs0 not claimed:\n{stdout}\n{stderr}"
    );
    assert!(
        !listed(with, "siw_rs1"),
        "siw_rs1 (the next ABI) claimed:\n{stdout}"
    );
    assert!(!listed(with, "siw0"), "upstream siw0 claimed:\n{stdout}");
    assert!(
        stderr.contains("no userspace device-specific driver found for siw0"),
        "{stderr}"
    );
    assert!(
        !listed(without, "siw_rs0"),
        "siw_rs0 listed without the plugin:\n{stdout}"
    );
}
