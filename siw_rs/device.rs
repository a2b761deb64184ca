// SPDX-License-Identifier: GPL-2.0

//! The siw_rs device: a software iWARP RNIC with one port, bound to one
//! net_device, created by `rdma link add NAME type siw_rs netdev DEV`.
//!
//! This is driver logic: it uses the safe wrappers only.

use crate::{
    cq::{self, CqState},
    ffi,
    ib::{self, Device, DeviceAttr, Driver, PortAttr, PortImmutable, PortNum},
    limits::*,
    link::LinkType,
    mem::{self, Mem, NewMem, Stags},
    netdev::{self, NetDevice},
    qp::{self, QpCore, QpTable},
    srq::{self, SrqCore},
    cm::{self, Listener},
    iw::{CmId, ConnParam, IwCm},
    net::Net,
    sync::{new_irq_spinlock, IrqSpinLock},
    uverbs::{NewFile, Ucontext, Udata, UserVerbs},
    registry,
    verbs::{Cq, CqAttr, Mr, MrKind, Notify, Pd, Qp, QpInitAttr, QpModify, QpQuery, QpSlot, RecvWr, SendWr, Srq, SrqAttr, Verbs, WcSink},
};
use core::{ptr::NonNull, sync::atomic::{AtomicU32, Ordering}};
use kernel::{
    c_str, new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
};

use crate::settings::Knobs;

/// The siw_rs driver.
pub(crate) struct SiwRs;

/// What siw_rs keeps per device.
pub(crate) struct DeviceData {
    /// The bound net_device, as an identity (the registry key).
    netdev: usize,
    /// The port's GID prefix: the netdev's MAC at creation (random if it has
    /// none), like upstream siw, so connection management sees a unique GID.
    mac: [u8; 6],
    /// Node GUID (EUI-64 from `mac`), in the byte order the core stores.
    node_guid: u64,
    /// A per-module sequence number, so devices are told apart.
    vendor_part_id: u32,
    /// The STag table of this device's memory regions.
    stags: Arc<Stags>,
    /// Objects in existence, against the limits `query_device` reports.
    counts: Counts,
    /// QP numbers, for the connection manager's `iw_get_qp`.
    qps: Arc<IrqSpinLock<QpTable>>,
    /// Listening endpoints.
    listeners: Arc<Mutex<KVec<Option<Arc<Listener>>>>>,
    /// Settings (sysfs: MPA, zero-copy), shared with the listeners and
    /// connections.
    knobs: Arc<Knobs>,
    /// Connection requests reported to the CM and not yet answered, shared
    /// with the listeners; whatever is left goes with the device.
    requests: Arc<Mutex<cm::Requests>>,
}

impl DeviceData {
    /// The network namespace of the device's netdev.
    pub(crate) fn net(&self, dev: &Device<SiwRs>) -> Result<Net> {
        let nd = dev.netdev(PORT).ok_or(ENODEV)?;
        Net::of(&nd).ok_or(ENODEV)
    }

    /// The device's settings.
    pub(crate) fn knobs(&self) -> &Arc<Knobs> {
        &self.knobs
    }

    /// The device's unanswered connection requests.
    pub(crate) fn requests(&self) -> &Arc<Mutex<cm::Requests>> {
        &self.requests
    }

    /// The interface index of the device's netdev.
    pub(crate) fn ifindex(&self, dev: &Device<SiwRs>) -> Result<i32> {
        Ok(dev.netdev(PORT).ok_or(ENODEV)?.ifindex())
    }
}

/// Live object counts of one device.
#[derive(Default)]
struct Counts {
    pd: AtomicU32,
    cq: AtomicU32,
    qp: AtomicU32,
    mr: AtomicU32,
    srq: AtomicU32,
}

/// Takes one unit of `count` if that keeps it within `max`.
fn reserve(count: &AtomicU32, max: u32) -> Result {
    count
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| if n < max { Some(n + 1) } else { None })
        .map(|_| ())
        .map_err(|_| ENOMEM)
}

fn release(count: &AtomicU32) {
    let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
}

/// Per-MR data: the region and the table it is entered in.
pub(crate) struct MrData {
    pub(crate) mem: Arc<Mem>,
}

/// The only port of a siw_rs device.
const PORT: PortNum = 1;
/// Node description shown by `ibv_devinfo` and sysfs.
const NODE_DESC: &[u8] = b"siw_rs soft-iWARP (Rust)";
/// Reported firmware version: the driver's ABI generation.
const FW_VER: u64 = 1;

static NEXT_PART_ID: AtomicU32 = AtomicU32::new(1);

/// Net devices siw_rs can run on: Ethernet-like devices and loopback.
fn qualified(netdev: &NetDevice) -> bool {
    matches!(
        netdev.hw_type(),
        ffi::ARPHRD_ETHER | ffi::ARPHRD_IEEE802 | ffi::ARPHRD_NONE | ffi::ARPHRD_LOOPBACK
    )
}

fn identity(netdev: &NetDevice) -> usize {
    netdev.as_raw() as usize
}

impl LinkType for SiwRs {
    const TYPE: &'static CStr = c_str!("siw_rs");

    fn newlink(name: &CStr, netdev: &NetDevice) -> Result {
        if !qualified(netdev) {
            pr_info!("{:?}: unsupported netdev type {}\n", name, netdev.hw_type());
            return Err(EINVAL);
        }
        let key = identity(netdev);
        // One device per netdev; the reservation makes concurrent `rdma link
        // add` calls on one netdev fail with EEXIST instead of racing.
        registry::lock().reserve(key)?;
        let ret = create(name, netdev, key);
        if ret.is_err() {
            registry::lock().remove(key, None);
        }
        ret
    }
}

fn create(name: &CStr, netdev: &NetDevice, key: usize) -> Result {
    let mac = match netdev.eth_addr() {
        Some(mac) if mac != [0; 6] => mac,
        _ => {
            let mut mac = [0u8; 6];
            // SAFETY: `mac` is a writable 6-byte buffer.
            unsafe { ffi::siw_rs_h_eth_random_addr(mac.as_mut_ptr()) };
            mac
        }
    };
    let mut eui = [0u8; 8];
    // SAFETY: `eui` has 8 writable bytes, `mac` 6 readable ones.
    unsafe { ffi::siw_rs_h_addrconf_addr_eui48(eui.as_mut_ptr(), mac.as_ptr()) };
    let node_guid = u64::from_ne_bytes(eui);
    let data = DeviceData {
        netdev: key,
        mac,
        node_guid,
        vendor_part_id: NEXT_PART_ID.fetch_add(1, Ordering::Relaxed),
        stags: mem::new_table()?,
        counts: Counts::default(),
        qps: Arc::pin_init(new_irq_spinlock!(QpTable::new()?, "siw_rs_qpn"), GFP_KERNEL)?,
        listeners: Arc::pin_init(new_mutex!(KVec::new()), GFP_KERNEL)?,
        knobs: Arc::new(Knobs::new(netdev.has_parent()), GFP_KERNEL)?,
        requests: Arc::pin_init(new_mutex!(cm::Requests::new()), GFP_KERNEL)?,
    };

    let mut dev = Device::<SiwRs>::new(&crate::THIS_MODULE, data)?;
    dev.set_rnic_identity(node_guid, NODE_DESC, netdev.name());
    dev.set_netdev(netdev, PORT)?;
    let ib = NonNull::new(dev.device().as_raw()).ok_or(EINVAL)?;
    registry::lock().set_device(key, ib);
    // On failure `dev` is freed here and `dealloc` drops the entry's device.
    dev.register(name)?;
    pr_info!(
        "{:?} on {:?} ({:02x?})\n",
        name,
        BStr(netdev.name()),
        mac
    );
    Ok(())
}

/// Formats interface names (bytes) as text in log messages.
struct BStr<'a>(&'a [u8]);

impl core::fmt::Debug for BStr<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for &b in self.0 {
            write!(f, "{}", char::from(b))?;
        }
        Ok(())
    }
}

#[vtable]
impl Driver for SiwRs {
    type Data = DeviceData;
    type Pd = ();
    type Cq = Arc<CqState>;
    type Qp = Arc<QpCore>;
    type Mr = MrData;
    type Srq = Arc<SrqCore>;

    // The stock rdma-core provider for upstream siw matches
    // RDMA_DRIVER_SIW, and upstream siw's netdev notifier looks its devices
    // up by that id; siw_rs must be neither's. The kernel's enum has no entry
    // for an out-of-tree driver, so siw_rs registers as UNKNOWN and keeps its
    // own registry (see registry.rs and Documentation/siw_rs/design.rst).
    const DRIVER_ID: ffi::rdma_driver_id = ffi::RDMA_DRIVER_UNKNOWN;
    const UVERBS_ABI_VER: u32 = ffi::SIW_RS_ABI_VERSION;

    fn query_device(dev: &Device<Self>, attr: &mut DeviceAttr) -> Result {
        let d = dev.data();
        let int = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        attr.fw_ver = FW_VER;
        attr.sys_image_guid = d.node_guid;
        attr.vendor_id = 0;
        attr.vendor_part_id = d.vendor_part_id;
        attr.hw_ver = 0;
        // `rdma link del` may remove the device.
        attr.kernel_cap_flags = u64::from(ffi::IBK_ALLOW_USER_UNREG);
        // Fast registration (IB_WR_REG_MR, IB_WR_LOCAL_INV, Send with
        // Invalidate): what NVMe-oF, iSER and NFS/RDMA need on iWARP.
        attr.device_cap_flags = ffi::IB_DEVICE_MEM_MGT_EXTENSIONS as u64;
        attr.max_mr_size = MAX_MR_SIZE;
        attr.page_size_cap = kernel::page::PAGE_SIZE as u64;
        attr.max_qp = int(MAX_QP);
        attr.max_qp_wr = int(MAX_QP_WR);
        attr.max_send_sge = int(MAX_SGE);
        attr.max_recv_sge = int(MAX_SGE);
        attr.max_sge_rd = int(MAX_SGE_RD);
        attr.max_cq = int(MAX_CQ);
        attr.max_cqe = int(MAX_CQE);
        attr.max_mr = int(MAX_MR);
        attr.max_pd = int(MAX_PD);
        // RFC 7306 Atomic operations, answered in order with Read Requests
        // (they share the IRD/ORD). The target is updated with the CPU's
        // atomic instructions, but only atomicity among this device's
        // operations is promised.
        attr.atomic_cap = ffi::IB_ATOMIC_HCA;
        attr.max_qp_rd_atom = int(MAX_IRD);
        attr.max_qp_init_rd_atom = int(MAX_ORD);
        attr.max_res_rd_atom = int(MAX_QP.saturating_mul(MAX_IRD));
        attr.max_srq = int(MAX_SRQ);
        attr.max_srq_wr = int(MAX_SRQ_WR);
        attr.max_srq_sge = int(MAX_SGE);
        attr.max_fast_reg_page_list_len = MAX_FAST_REG_PAGES;
        Ok(())
    }

    fn query_port(dev: &Device<Self>, port: PortNum, attr: &mut PortAttr) -> Result {
        if port != PORT {
            return Err(EINVAL);
        }
        let nd = dev.netdev(PORT).ok_or(ENODEV)?;
        // Report the link as it is, for IPv4 and IPv6 alike (the core's
        // default for iWARP wants an IPv4 address before it says ACTIVE).
        let up = nd.is_running() && nd.carrier_ok();
        attr.state = if up { ffi::IB_PORT_ACTIVE } else { ffi::IB_PORT_DOWN };
        attr.phys_state = if up {
            ffi::IB_PORT_PHYS_STATE_LINK_UP
        } else {
            ffi::IB_PORT_PHYS_STATE_DISABLED
        } as u8;
        attr.max_mtu = ffi::IB_MTU_4096;
        attr.active_mtu = ib::mtu_enum(nd.mtu());
        attr.gid_tbl_len = 1;
        attr.pkey_tbl_len = 0;
        attr.max_msg_sz = MAX_MSG_SIZE;
        attr.port_cap_flags = ffi::IB_PORT_CM_SUP | ffi::IB_PORT_DEVICE_MGMT_SUP;
        drop(nd);
        let (speed, width) = dev.eth_speed(PORT)?;
        attr.active_speed = speed;
        attr.active_width = width;
        Ok(())
    }

    fn query_gid(dev: &Device<Self>, port: PortNum, index: i32) -> Result<[u8; 16]> {
        if port != PORT || index != 0 {
            return Err(EINVAL);
        }
        let mut gid = [0u8; 16];
        gid[..6].copy_from_slice(&dev.data().mac);
        Ok(gid)
    }

    fn get_port_immutable(_dev: &Device<Self>, port: PortNum, imm: &mut PortImmutable) -> Result {
        if port != PORT {
            return Err(EINVAL);
        }
        imm.gid_tbl_len = 1;
        imm.pkey_tbl_len = 0;
        imm.core_cap_flags = ffi::RDMA_CORE_PORT_IWARP;
        Ok(())
    }

    fn dealloc(dev: &Device<Self>) {
        registry::lock().remove(dev.data().netdev, NonNull::new(dev.as_raw()));
    }
}

impl UserVerbs for SiwRs {
    fn alloc_ucontext(dev: &Device<Self>, uctx: &Ucontext, udata: &Udata) -> Result {
        // Made before the response, which carries its number, and shown to
        // the process only once the response is written (dropped instead
        // if that fails).
        let db = crate::doorbell::open(&dev.data().qps, uctx.id());
        let resp = ffi::siw_rs_uresp_alloc_ctx {
            abi_version: ffi::SIW_RS_ABI_VERSION,
            max_inline: crate::uwqe::MAX_INLINE,
            sqe_size: core::mem::size_of::<ffi::siw_rs_sqe>() as u32,
            rqe_size: core::mem::size_of::<ffi::siw_rs_rqe>() as u32,
            cqe_size: core::mem::size_of::<ffi::siw_rs_cqe>() as u32,
            max_sge: ffi::SIW_RS_MAX_SGE,
            db_fd: db.as_ref().map_or(-1, NewFile::fd),
            rsvd: 0,
        };
        udata.respond(&resp)?;
        if let Some(f) = db {
            f.install();
        }
        Ok(())
    }
}

impl Verbs for SiwRs {
    fn alloc_pd(dev: &Device<Self>, _user: bool) -> Result<()> {
        reserve(&dev.data().counts.pd, MAX_PD)
    }

    fn dealloc_pd(pd: &Pd<Self>) {
        release(&pd.device().data().counts.pd);
    }

    fn create_cq(dev: &Device<Self>, attr: &mut CqAttr, udata: Option<&Udata>) -> Result<Arc<CqState>> {
        let counts = &dev.data().counts;
        reserve(&counts.cq, MAX_CQ)?;
        (|| {
            let uctx = udata.map(Udata::ucontext).transpose()?;
            let cq = CqState::new(attr, MAX_CQE, uctx.as_ref())?;
            if let (Some(u), Some((ring_key, ring_bytes, num_cqe))) = (udata, cq.user_ring()) {
                u.respond(&ffi::siw_rs_uresp_create_cq { ring_key, ring_bytes, cq_id: 0, num_cqe })?;
            }
            Ok(cq)
        })()
        .inspect_err(|_| release(&counts.cq))
    }

    fn destroy_cq(cq: &Cq<Self>) {
        release(&cq.device().data().counts.cq);
    }

    fn poll_cq(cq: &Cq<Self>, sink: &mut WcSink<'_>) {
        cq::poll(cq, sink)
    }

    fn req_notify_cq(cq: &Cq<Self>, how: Notify, report_missed: bool) -> bool {
        cq::arm(cq, how, report_missed)
    }

    fn create_qp(
        pd: &Pd<Self>,
        attr: &mut QpInitAttr,
        slot: QpSlot<Self>,
        udata: Option<&Udata>,
    ) -> Result<(Arc<QpCore>, u32)> {
        let d = pd.device().data();
        reserve(&d.counts.qp, MAX_QP)?;
        (|| {
            let uctx = udata.map(Udata::ucontext).transpose()?;
            let core = QpCore::new(attr, d.stags.clone(), uctx.as_ref())?;
            let qpn = d.qps.lock().insert(slot.raw())?;
            if let (Some(u), Some(resp)) = (udata, core.user_resp()) {
                let resp = ffi::siw_rs_uresp_create_qp { qp_id: qpn, ..resp };
                u.respond(&resp).inspect_err(|_| d.qps.lock().remove(qpn))?;
            }
            Ok((core, qpn))
        })()
        .inspect_err(|_| release(&d.counts.qp))
    }

    fn qp_created(qp: &Qp<Self>) {
        let owner = qp.data().owner();
        qp.device().data().qps.lock().publish(qp.qp_num(), owner);
    }

    fn modify_qp(qp: &Qp<Self>, attr: &QpModify) -> Result {
        qp::modify(qp, attr)
    }

    fn query_qp(qp: &Qp<Self>) -> QpQuery {
        qp::query(qp)
    }

    fn sq_doorbell(qp: &Qp<Self>) {
        qp::sq_doorbell(qp)
    }

    fn rq_doorbell(qp: &Qp<Self>) {
        qp::rq_doorbell(qp)
    }

    fn create_srq(pd: &Pd<Self>, attr: &mut SrqAttr, udata: Option<&Udata>) -> Result<Arc<SrqCore>> {
        let counts = &pd.device().data().counts;
        reserve(&counts.srq, MAX_SRQ)?;
        (|| {
            let uctx = udata.map(Udata::ucontext).transpose()?;
            let srq = SrqCore::new(attr, uctx.as_ref())?;
            if let (Some(u), Some(resp)) = (udata, srq.user_resp()) {
                u.respond(&resp)?;
            }
            Ok(srq)
        })()
        .inspect_err(|_| release(&counts.srq))
    }

    fn modify_srq(s: &Srq<Self>, max_wr: Option<u32>, limit: Option<u32>) -> Result {
        srq::modify(s, max_wr, limit)
    }

    fn query_srq(s: &Srq<Self>) -> SrqAttr {
        srq::query(s)
    }

    fn destroy_srq(s: &Srq<Self>) {
        release(&s.device().data().counts.srq);
    }

    fn post_srq_recv(s: &Srq<Self>, wr: &RecvWr<'_>) -> Result {
        srq::post(s, wr)
    }

    fn destroy_qp(qp: &Qp<Self>) {
        let d = qp.device().data();
        d.qps.lock().remove(qp.qp_num());
        // Out of the table, so no doorbell file finds it any more; wait for
        // those that did.
        qp.data().drain_doorbells();
        // And for the CM's lookups to take their references (which
        // `qp::destroy` then waits for).
        qp.data().drain_cm_lookups();
        qp::destroy(qp);
        release(&d.counts.qp);
    }

    fn post_send(qp: &Qp<Self>, wr: &SendWr<'_, Self>) -> Result {
        qp::post_send(qp, wr)
    }

    fn post_recv(qp: &Qp<Self>, wr: &RecvWr<'_>) -> Result {
        qp::post_recv(qp, wr)
    }

    fn alloc_mr(pd: &Pd<Self>, kind: MrKind) -> Result<(MrData, u32)> {
        let d = pd.device().data();
        reserve(&d.counts.mr, MAX_MR)?;
        let how = match kind {
            MrKind::Dma(a) => NewMem::Dma(a),
            MrKind::Fast(n) => NewMem::Fast(n),
            MrKind::User { umem, iova, len, access } => NewMem::User { umem, iova, len, access },
        };
        let mem = mem::create(&d.stags, pd.id(), how).inspect_err(|_| release(&d.counts.mr))?;
        let stag = mem.stag();
        Ok((MrData { mem }, stag))
    }

    fn mr_reset_pages(mr: &Mr<Self>) {
        mr.data().mem.reset_pages();
    }

    fn mr_add_page(mr: &Mr<Self>, addr: u64) -> Result {
        mr.data().mem.add_page(addr)
    }

    fn dereg_mr(mr: &Mr<Self>) {
        let d = mr.device().data();
        mem::destroy(&d.stags, &mr.data().mem);
        release(&d.counts.mr);
    }
}

impl IwCm for SiwRs {
    fn connect(id: CmId, qp: &Qp<Self>, p: &ConnParam<'_>) -> Result {
        cm::connect(qp.device(), id, qp, p)
    }

    fn accept(id: CmId, qp: &Qp<Self>, p: &ConnParam<'_>) -> Result {
        cm::accept(id, qp, p)
    }

    fn reject(dev: &Device<Self>, id: CmId, private_data: &[u8]) -> Result {
        cm::reject(dev, id, private_data)
    }

    fn create_listen(dev: &Device<Self>, id: CmId, backlog: i32) -> Result {
        let l = cm::create_listen(dev, id, backlog)?;
        {
            let mut ls = dev.data().listeners.lock();
            match ls.iter_mut().find(|s| s.is_none()) {
                Some(slot) => *slot = Some(l.clone()),
                None => ls.push(Some(l.clone()), GFP_KERNEL)?,
            }
        }
        l.start();
        Ok(())
    }

    fn destroy_listen(dev: &Device<Self>, id: CmId) -> Result {
        let found = {
            let mut ls = dev.data().listeners.lock();
            ls.iter_mut()
                .find(|s| s.as_ref().is_some_and(|l| l.id_addr() == id.addr()))
                .and_then(|s| s.take())
        };
        match found {
            Some(l) => {
                l.stop();
                Ok(())
            }
            None => Err(EINVAL),
        }
    }

    fn get_qp(dev: &Device<Self>, qpn: u32) -> Option<NonNull<ffi::ib_qp>> {
        dev.data().qps.lock().get(qpn)
    }

    fn cm_get_qp(dev: &Device<Self>, qpn: u32) -> Option<NonNull<ffi::ib_qp>> {
        let table = dev.data().qps.lock();
        let raw = table.get(qpn)?;
        // SAFETY: a QP the table finds is live with its data in place:
        // `destroy_qp` removes it (under this lock, held here) before the
        // QP is destroyed, and `publish` follows the data's
        // initialisation. The count taken makes `destroy_qp`, which runs
        // only after the entry is gone, wait until `iw_add_ref` has taken
        // the CM's reference (`drain_cm_lookups`).
        let qp = unsafe { Qp::<SiwRs>::from_raw(raw.as_ptr()) };
        qp.data().cm_lookup();
        Some(raw)
    }

    fn add_ref(qp: &Qp<Self>) {
        qp::cm_ref(qp);
    }

    fn rem_ref(qp: &Qp<Self>) {
        qp::cm_unref(qp);
    }
}

impl netdev::Handler for SiwRs {
    fn event(event: netdev::Event, netdev: &NetDevice) {
        let dev = {
            let mut reg = registry::lock();
            match reg.find(identity(netdev)).and_then(|e| e.ib) {
                // SAFETY: a device in the registry is allocated and its data
                // initialised: `dealloc` removes it (under this lock) before
                // the data is dropped and the memory freed.
                Some(ib) => unsafe { Device::<SiwRs>::from_raw(ib.as_ptr()) }.try_get(),
                None => None,
            }
        };
        let Some(dev) = dev else { return };
        match event {
            netdev::Event::Up => dev.port_event(PORT, ffi::IB_EVENT_PORT_ACTIVE),
            netdev::Event::Down => dev.port_event(PORT, ffi::IB_EVENT_PORT_ERR),
            netdev::Event::Change => {
                let ev = if netdev.is_running() && netdev.carrier_ok() {
                    ffi::IB_EVENT_PORT_ACTIVE
                } else {
                    ffi::IB_EVENT_PORT_ERR
                };
                dev.port_event(PORT, ev);
            }
            netdev::Event::ChangeAddr => dev.port_event(PORT, ffi::IB_EVENT_GID_CHANGE),
            netdev::Event::Unregister => dev.unregister_queued(),
        }
    }
}

/// Unregisters every siw_rs device; called at module unload after the link
/// type and the notifier are gone, so no device can appear meanwhile.
pub(crate) fn unregister_all() {
    let mut last = None;
    loop {
        let held = {
            let mut reg = registry::lock();
            // SAFETY: as in `event`, a registry device is allocated while the
            // lock is held; the hold keeps its memory after we unlock.
            reg.any_device().map(|ib| (ib, unsafe { ib::hold(ib) }))
        };
        let Some((ib, held)) = held else { break };
        if last == Some(ib) {
            pr_warn!("a device did not go away on unregistration\n");
            break;
        }
        ib::unregister(&held);
        last = Some(ib);
    }
}
