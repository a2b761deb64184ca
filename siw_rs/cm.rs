// SPDX-License-Identifier: GPL-2.0

//! Connection management: listening, the MPA handshake in both roles, and
//! handing an established connection to its QP.
//!
//! Driver logic, without `unsafe`. Every blocking step (TCP connect, reading
//! the peer's MPA frame, sending ours) runs in a work item of the
//! long-running system queue with a socket timeout ([`MPA_TIMEOUT_MS`]), so a
//! silent or slow peer costs a worker for at most that long and never hangs
//! the consumer. The passive side keeps the socket and the handshake state
//! of a connection request in the device's [`Requests`] table under a key
//! the CM stores as the child id's provider data until `iw_accept` or
//! `iw_reject` takes the request out. A request the CM never answers (it
//! drops the event while its listener is being destroyed, or cannot create
//! the child id) is reclaimed from the table once its peer has closed or
//! [`REQUEST_TTL_NS`] has passed, and with the device at the latest.

use crate::{
    conn::{now_ns, Conn},
    device::SiwRs,
    ib::Device,
    iw::{CmEvent, CmEventKind, CmId, ConnParam},
    iwarp::mpa::{CrcPolicy, EnhancedConfig, RES_LARGE_FPDUS, Event, Handshake, MpaConfig, Negotiated, RtrSet, FRAME_HEADER_LEN, MAX_FRAME_LEN},
    settings::{Knobs, MpaSettings},
    limits::{MAX_IRD, MAX_ORD},
    net::{ffi_err, Net, SockAddr, SockHandler, SockRef, Socket},
    qp,
    verbs::Qp,
};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, ArcBorrow, Mutex},
    workqueue,
};

/// How long each handshake step may take.
pub(crate) const MPA_TIMEOUT_MS: u32 = 10_000;

/// Most MPA handshakes one listener runs at once (and at most its backlog).
const MAX_PENDING_HANDSHAKES: i32 = 64;

/// How long a reported connection request may wait for `iw_accept` or
/// `iw_reject` before it is reclaimed: six times the peer's wait for the
/// MPA Reply (10 s here, 5 s in upstream siw), so a request that old has
/// been given up by its peer or dropped by the CM.
const REQUEST_TTL_NS: u64 = 60_000_000_000;

/// The MPA configuration of a handshake: revision 2 with the RFC 6581
/// IRD/ORD block, the device's CRC and marker settings, and markers
/// inserted into what this side sends whenever the peer asks. An
/// `initiator` with the device's `mpa_p2p` on asks for peer-to-peer mode,
/// offering only the RTR it sends (a zero-length RDMA Write, see
/// [`Conn::start`]); a responder grants a peer's request either way (the
/// core's default RTR types) and requires it never.
fn mpa_config(s: MpaSettings, initiator: bool, ird: u32, ord: u32, private_data: &[u8]) -> MpaConfig<'_> {
    let ird = u16::try_from(ird.min(MAX_IRD)).unwrap_or(0);
    let ord = u16::try_from(ord.min(MAX_ORD)).unwrap_or(0);
    let mut e = EnhancedConfig::new(ird, ord);
    e.ird_max = u16::try_from(MAX_IRD).unwrap_or(0);
    if initiator && s.p2p {
        e.p2p = true;
        e.rtr = RtrSet::WRITE;
    }
    MpaConfig {
        enhanced: Some(e),
        private_data,
        crc: if s.crc { CrcPolicy::On } else { CrcPolicy::PreferOff },
        markers_rx: s.markers,
        markers_tx: true,
        // siw_rs receives FPDUs of any length.
        reserved: RES_LARGE_FPDUS,
        ..MpaConfig::default()
    }
}

/// Reads exactly `buf.len()` octets.
fn recv_exact(sock: &Socket, buf: &mut [u8]) -> Result {
    let mut off = 0;
    while off < buf.len() {
        let n = sock.recv(buf.get_mut(off..).unwrap_or(&mut []))?;
        if n == 0 {
            return Err(ffi_err(crate::ffi::ECONNRESET));
        }
        off += n;
    }
    Ok(())
}

/// Reads the peer's MPA frame (exactly its octets, so FPDUs that follow
/// stay in the socket for the data path) and feeds it to `hs`. Returns the
/// event and the length of its private data at the end of `frame`.
fn read_frame<'a>(sock: &Socket, hs: &'a mut Handshake, frame: &mut [u8; MAX_FRAME_LEN]) -> Result<Option<Event<'a>>> {
    let (head, rest) = frame.split_at_mut(FRAME_HEADER_LEN);
    recv_exact(sock, head)?;
    let pd_len = usize::from(u16::from_be_bytes([head[18], head[19]]));
    if pd_len > rest.len() {
        return Err(ffi_err(crate::ffi::EPROTO));
    }
    let (pd, _) = rest.split_at_mut(pd_len);
    recv_exact(sock, pd)?;
    let total = FRAME_HEADER_LEN + pd_len;
    let f = hs.feed(frame.get(..total).unwrap_or(&[])).map_err(|_| ffi_err(crate::ffi::EPROTO))?;
    if f.consumed != total {
        return Err(ffi_err(crate::ffi::EPROTO));
    }
    Ok(f.event)
}

fn event<'a>(kind: CmEventKind, status: i32, local: SockAddr, remote: SockAddr, pd: &'a [u8]) -> CmEvent<'a> {
    CmEvent { kind, status, local, remote, private_data: pd, provider_data: 0, ird: 0, ord: 0 }
}

// ---------------------------------------------------------------------------
// Active side
// ---------------------------------------------------------------------------

/// `iw_connect`: the TCP connection and the handshake run in a work item;
/// the outcome is reported with a CONNECT_REPLY event.
pub(crate) fn connect(dev: &Device<SiwRs>, id: CmId, qp: &Qp<SiwRs>, p: &ConnParam<'_>) -> Result {
    let net = dev.data().net(dev)?;
    let mut pd = KVec::new();
    pd.extend_from_slice(p.private_data, GFP_KERNEL)?;
    let (ird, ord) = (p.ird, p.ord);
    let mpa = dev.data().knobs().get();
    let qpp = crate::conn::QpPtr::new(qp);
    // The QP stays alive: the CM holds a reference (`iw_add_ref`) until
    // the CONNECT_REPLY is delivered.
    crate::wq::cm().try_spawn(GFP_KERNEL, move || {
        let qp = qpp.qp();
        let local = id.local_addr();
        let remote = id.remote_addr();
        match active(net, &id, qp, mpa, ird, ord, &pd) {
            Ok((conn, neg, reply_pd)) => {
                let (l, r) = conn.addrs();
                let mut ev = event(CmEventKind::ConnectReply, 0, l, r, &reply_pd);
                ev.ird = u8::try_from(neg.ird).unwrap_or(u8::MAX);
                ev.ord = u8::try_from(neg.ord).unwrap_or(u8::MAX);
                // The CM must see CONNECT_REPLY before any CLOSE, which the
                // socket callbacks may report as soon as they are attached
                // (a peer that closes right after its Reply).
                id.deliver(&ev);
                conn.up();
            }
            Err((e, reply_pd)) => {
                pr_debug!("active connect failed: {:?}\n", e);
                id.deliver(&event(CmEventKind::ConnectReply, e.to_errno(), local, remote, &reply_pd));
            }
        }
    })?;
    Ok(())
}

type ActiveErr = (Error, KVec<u8>);

fn active(net: Net, id: &CmId, qp: &Qp<SiwRs>, mpa: MpaSettings, ird: u32, ord: u32, pd: &[u8]) -> core::result::Result<(Arc<Conn>, Negotiated, KVec<u8>), ActiveErr> {
    let fail = |e: Error| (e, KVec::new());
    let remote = id.remote_addr();
    let local = id.local_addr();
    let sock = Socket::new(net, remote.family()).map_err(fail)?;
    sock.set_timeouts(MPA_TIMEOUT_MS, MPA_TIMEOUT_MS);
    v6only_if_asked(&sock, id, remote.family()).map_err(fail)?;
    if local.port() != 0 {
        sock.bind(&local).map_err(fail)?;
    }
    sock.connect(&remote).map_err(fail)?;
    let cfg = mpa_config(mpa, true, ird, ord, pd);
    let mut out = [0u8; MAX_FRAME_LEN];
    let (hs, n) = Handshake::initiator(&cfg, &mut out).map_err(|_| fail(EINVAL))?;
    sock.send_all(&[out.get(..n).unwrap_or(&[])]).map_err(fail)?;
    let mut hs = KBox::new(hs, GFP_KERNEL).map_err(|_| fail(ENOMEM))?;
    let mut frame = KBox::new([0u8; MAX_FRAME_LEN], GFP_KERNEL).map_err(|_| fail(ENOMEM))?;
    let ev = read_frame(&sock, &mut hs, &mut frame).map_err(fail)?;
    let mut reply_pd = KVec::new();
    match ev {
        Some(Event::Established(neg)) => {
            let _ = reply_pd.extend_from_slice(hs.peer_private_data(), GFP_KERNEL);
            let conn = Conn::start(qp, sock, neg, id.clone(), false).map_err(fail)?;
            qp::establish(qp, conn.clone(), u32::from(neg.ird), u32::from(neg.ord)).map_err(fail)?;
            Ok((conn, neg, reply_pd))
        }
        Some(Event::Rejected { private_data }) => {
            let _ = reply_pd.extend_from_slice(private_data, GFP_KERNEL);
            Err((ffi_err(crate::ffi::ECONNREFUSED), reply_pd))
        }
        _ => Err(fail(ffi_err(crate::ffi::EPROTO))),
    }
}

// ---------------------------------------------------------------------------
// Passive side
// ---------------------------------------------------------------------------

/// A listening endpoint.
#[pin_data]
pub(crate) struct Listener {
    id: CmId,
    sock: Socket,
    stopped: AtomicBool,
    /// Handshakes in progress (each holds a worker for up to the MPA
    /// timeout); bounded by `max_pending` so that peers opening
    /// connections and sending nothing cannot tie up every worker.
    pending: AtomicU32,
    max_pending: u32,
    /// The device's MPA settings, read at each handshake.
    mpa: Arc<Knobs>,
    /// The device's reported connection requests.
    requests: Arc<Mutex<Requests>>,
    #[pin]
    attached: Mutex<Option<crate::net::Attached<Listener>>>,
    /// Accepts what the socket has queued. Part of the listener, so that
    /// the data-ready callback (softirq) never allocates; queueing it while
    /// it is queued is a no-op, and a run drains the whole accept queue.
    #[pin]
    accept_work: workqueue::Work<Listener>,
}

kernel::impl_has_work! {
    impl HasWork<Self> for Listener { self.accept_work }
}

impl workqueue::WorkItem for Listener {
    type Pointer = Arc<Listener>;

    fn run(this: Arc<Listener>) {
        this.accept_all();
    }
}

impl SockHandler for Listener {
    const LISTENS: bool = true;

    fn data_ready(this: ArcBorrow<'_, Self>, _sk: &SockRef) {
        if this.stopped.load(Ordering::Acquire) {
            return;
        }
        // A connection is ready to accept: do it in process context.
        let me: Arc<Listener> = this.into();
        let _ = crate::wq::cm().enqueue(me);
    }

    fn write_space(_this: ArcBorrow<'_, Self>) {}

    fn state_change(_this: ArcBorrow<'_, Self>, _established: bool) {}
}

impl Listener {
    fn accept_all(self: Arc<Self>) {
        while !self.stopped.load(Ordering::Acquire) {
            let r = {
                let a = self.attached.lock();
                match a.as_ref() {
                    Some(a) => self.sock.accept_from(a),
                    None => break,
                }
            };
            match r {
                Ok(Some(s)) => {
                    let busy = self
                        .pending
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                            if n < self.max_pending { Some(n + 1) } else { None }
                        })
                        .is_err();
                    if busy {
                        // Refuse: closing the socket resets the peer.
                        pr_debug!("too many MPA handshakes in progress; refusing a connection\n");
                        continue;
                    }
                    let me = self.clone();
                    if crate::wq::cm()
                        .try_spawn(GFP_KERNEL, move || {
                            me.passive(s);
                            me.pending.fetch_sub(1, Ordering::AcqRel);
                        })
                        .is_err()
                    {
                        self.pending.fetch_sub(1, Ordering::AcqRel);
                        pr_warn!("cannot queue an MPA handshake\n");
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    pr_debug!("accept failed: {:?}\n", e);
                    break;
                }
            }
        }
    }

    /// Reads the MPA Request of a new connection and reports it.
    fn passive(&self, sock: Socket) {
        sock.set_timeouts(MPA_TIMEOUT_MS, MPA_TIMEOUT_MS);
        let res = (|| -> Result<()> {
            let cfg = mpa_config(self.mpa.get(), false, MAX_IRD, MAX_ORD, &[]);
            let mut hs = KBox::new(Handshake::responder(&cfg), GFP_KERNEL)?;
            let mut frame = KBox::new([0u8; MAX_FRAME_LEN], GFP_KERNEL)?;
            let (ird, ord, pd_copy) = match read_frame(&sock, &mut hs, &mut frame) {
                Ok(Some(Event::RequestReceived(req))) => {
                    let (ird, ord) = req.enhanced.map_or((0, 0), |e| (e.ird, e.ord));
                    let mut pd = KVec::new();
                    pd.extend_from_slice(req.private_data, GFP_KERNEL)?;
                    (ird, ord, pd)
                }
                Ok(_) => return Err(ffi_err(crate::ffi::EPROTO)),
                Err(e) => {
                    // A well-formed request we refuse by policy gets a
                    // reject reply, as upstream siw does.
                    if hs.can_reject() {
                        let mut out = [0u8; MAX_FRAME_LEN];
                        if let Ok(n) = hs.reject(&[], &mut out) {
                            let _ = sock.send_all(&[out.get(..n).unwrap_or(&[])]);
                        }
                    }
                    return Err(e);
                }
            };
            if self.stopped.load(Ordering::Acquire) {
                return Err(ECONNABORTED_ERR());
            }
            let (local, remote) = (sock.local_addr(), sock.peer_addr());
            let key = self.requests.lock().add(sock, hs, now_ns())?;
            let mut ev = event(CmEventKind::ConnectRequest, 0, local, remote, &pd_copy);
            ev.provider_data = key;
            // The peer's IRD and ORD, as iw_cm expects them in a connect
            // request: rdma_cm hands `ird` to the consumer as its
            // initiator depth (how many Reads it may have outstanding, the
            // peer's IRD) and `ord` as its responder resources (the
            // peer's ORD). Swapped, a peer asking for ORD 0 and IRD 16 (an
            // nvme-rdma host) left the nvmet target an initiator depth of
            // 0, and its Reads overran the peer's read queue.
            ev.ird = u8::try_from(ird).unwrap_or(u8::MAX);
            ev.ord = u8::try_from(ord).unwrap_or(u8::MAX);
            if self.id.deliver(&ev) != 0 {
                // Not queued: the CM did not keep the key.
                drop(self.requests.lock().take(key));
                return Err(ECONNABORTED_ERR());
            }
            Ok(())
        })();
        if let Err(e) = res {
            pr_debug!("MPA request refused: {:?}\n", e);
        }
    }
}

#[allow(non_snake_case)]
fn ECONNABORTED_ERR() -> Error {
    ffi_err(crate::ffi::ECONNABORTED)
}

/// A connection request reported to the CM, waiting for `iw_accept` or
/// `iw_reject`: its socket (the peer's MPA Request read, nothing sent) and
/// the handshake that answers it.
pub(crate) struct Request {
    /// The provider-data key the CM holds for it (never 0).
    key: usize,
    /// When it was reported (`now_ns`).
    since: u64,
    sock: Socket,
    hs: KBox<Handshake>,
}

/// A device's reported connection requests.
///
/// The CM hands a request's key back exactly once, through `iw_accept` or
/// `iw_reject` on the child id it created for the request, except when it
/// never creates that id: it drops a CONNECT_REQUEST queued while the
/// listening id is destroyed, and one it cannot allocate a child for.
/// Those requests would hold their socket for ever; [`Requests::reap`]
/// frees them once their peer has closed or [`REQUEST_TTL_NS`] has passed.
/// A late `iw_accept` of a reclaimed request (a consumer that answered
/// after its peer gave up) then fails with `ECONNABORTED`. Keys come from a
/// counter of pointer width (no wrap in practice on 64-bit), so a stale
/// key does not find a newer request.
pub(crate) struct Requests {
    last_key: usize,
    slots: KVec<Option<Request>>,
}

impl Requests {
    pub(crate) fn new() -> Self {
        Requests { last_key: 0, slots: KVec::new() }
    }

    /// Stores a request reported at `now` under a new key, reclaiming the
    /// requests nobody will answer first; returns the key.
    fn add(&mut self, sock: Socket, hs: KBox<Handshake>, now: u64) -> Result<usize> {
        self.reap(now);
        self.last_key = self.last_key.wrapping_add(1).max(1);
        let r = Request { key: self.last_key, since: now, sock, hs };
        match self.slots.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(r),
            None => self.slots.push(Some(r), GFP_KERNEL)?,
        }
        Ok(self.last_key)
    }

    /// Takes the request of `key` out; `None` if there is none (reclaimed).
    fn take(&mut self, key: usize) -> Option<Request> {
        self.slots.iter_mut().find(|s| s.as_ref().is_some_and(|r| r.key == key))?.take()
    }

    /// Drops (closing their sockets) the requests whose peer has closed or
    /// that have waited longer than [`REQUEST_TTL_NS`] at `now`.
    fn reap(&mut self, now: u64) {
        for slot in self.slots.iter_mut() {
            let stale = slot.as_ref().is_some_and(|r| {
                now.saturating_sub(r.since) > REQUEST_TTL_NS || !r.sock.is_established()
            });
            if stale {
                if let Some(r) = slot.take() {
                    pr_debug!("connection request {} reclaimed unanswered\n", r.key);
                }
            }
        }
    }
}

/// The request behind a child id's provider data: `EINVAL` if it never had
/// one, `ECONNABORTED` if it was reclaimed.
fn take_request(dev: &Device<SiwRs>, id: &CmId) -> Result<Request> {
    let key = id.provider_data();
    if key == 0 {
        return Err(EINVAL);
    }
    id.set_provider_data(0);
    dev.data().requests().lock().take(key).ok_or_else(ECONNABORTED_ERR)
}

/// Sets `IPV6_V6ONLY` on an IPv6 socket whose CM id is `afonly`
/// (`rdma_set_afonly`, which the RDMA CM passes on): without it a wildcard
/// IPv6 listener would take the IPv4 port too, and a consumer that listens
/// on both families on one port, as the NFS server's RDMA transport does,
/// would get `EADDRINUSE` for the second.
fn v6only_if_asked(sock: &Socket, id: &CmId, family: u32) -> Result {
    if family == crate::ffi::AF_INET6 && id.afonly() {
        sock.set_v6only()?;
    }
    Ok(())
}

/// `iw_create_listen`.
pub(crate) fn create_listen(dev: &Device<SiwRs>, id: CmId, backlog: i32) -> Result<Arc<Listener>> {
    let net = dev.data().net(dev)?;
    let addr = id.local_addr();
    let sock = Socket::new(net, addr.family())?;
    v6only_if_asked(&sock, &id, addr.family())?;
    if addr.is_wildcard() {
        // The RDMA CM asks every device to listen on a wildcard address:
        // each takes only its own interface's connections, so the
        // listeners of several devices (and upstream siw's, which does the
        // same) can share the port. A specific address stays unbound, so
        // connections to it over `lo` are accepted too.
        sock.bind_to_device(dev.data().ifindex(dev)?)?;
    }
    sock.bind(&addr)?;
    sock.listen(backlog.max(1))?;
    let l = Arc::pin_init(
        pin_init!(Listener {
            id,
            sock,
            stopped: AtomicBool::new(false),
            pending: AtomicU32::new(0),
            max_pending: u32::try_from(backlog.clamp(1, MAX_PENDING_HANDSHAKES)).unwrap_or(1),
            mpa: dev.data().knobs().clone(),
            requests: dev.data().requests().clone(),
            attached <- new_mutex!(None),
            accept_work <- workqueue::new_work!("siw_rs_listener_accept"),
        }),
        GFP_KERNEL,
    )?;
    Ok(l)
}

impl Listener {
    /// Installs the accept callback (after the listener is registered so
    /// the callback can find it).
    pub(crate) fn start(self: &Arc<Self>) {
        let a = self.sock.attach(self.clone());
        *self.attached.lock() = Some(a);
        // Connections may have queued before the callback was installed.
        let _ = crate::wq::cm().enqueue(self.clone());
    }

    /// Stops accepting and closes the socket's callbacks.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        if let Some(a) = self.attached.lock().take() {
            self.sock.detach(a);
        }
        self.sock.shutdown();
        // Requests the CM dropped (or will drop) for this listener stay in
        // the table; those whose peer has already gone are reclaimed now,
        // the rest at the device's next request or with the device.
        self.requests.lock().reap(now_ns());
    }

    /// The id this listener serves.
    pub(crate) fn id_addr(&self) -> usize {
        self.id.addr()
    }
}

/// `iw_accept`: sends the MPA Reply and moves the QP to RTS.
pub(crate) fn accept(id: CmId, qp: &Qp<SiwRs>, p: &ConnParam<'_>) -> Result {
    let Request { sock, mut hs, .. } = take_request(qp.device(), &id)?;
    let ird = u16::try_from(p.ird.min(MAX_IRD)).unwrap_or(0);
    let ord = u16::try_from(p.ord.min(MAX_ORD)).unwrap_or(0);
    let mut out = KBox::new([0u8; MAX_FRAME_LEN], GFP_KERNEL)?;
    let (n, neg) = hs.accept(p.private_data, ird, ord, &mut out[..]).map_err(|_| EINVAL)?;
    let conn = Conn::start(qp, sock, neg, id.clone(), true)?;
    qp::establish(qp, conn.clone(), u32::from(neg.ird), u32::from(neg.ord))?;
    // The Reply goes out before anything the data path sends.
    let sent = conn.send_raw(out.get(..n).unwrap_or(&[]));
    if let Err(e) = sent {
        // iw_accept fails; the CM must not also get a CLOSE for an id that
        // never was ESTABLISHED (iw_cm treats that as a bug).
        conn.forget_cm();
        conn.close(None);
        return Err(e);
    }
    let (l, r) = conn.addrs();
    let mut ev = event(CmEventKind::Established, 0, l, r, &[]);
    ev.ird = u8::try_from(neg.ird).unwrap_or(u8::MAX);
    ev.ord = u8::try_from(neg.ord).unwrap_or(u8::MAX);
    // ESTABLISHED first: once the socket callbacks are attached, a peer
    // that closes or errs at once makes the connection report CLOSE, and
    // iw_cm BUG()s on a CLOSE before ESTABLISHED. Whatever arrived
    // meanwhile waits in the socket; attaching processes it.
    id.deliver(&ev);
    conn.up();
    Ok(())
}

/// `iw_reject`: sends a reject Reply and closes.
pub(crate) fn reject(dev: &Device<SiwRs>, id: CmId, private_data: &[u8]) -> Result {
    // A request already reclaimed has nothing left to answer.
    let Ok(Request { sock, mut hs, .. }) = take_request(dev, &id) else {
        return Ok(());
    };
    let mut out = KBox::new([0u8; MAX_FRAME_LEN], GFP_KERNEL)?;
    if let Ok(n) = hs.reject(private_data, &mut out[..]) {
        let _ = sock.send_all(&[out.get(..n).unwrap_or(&[])]);
    }
    sock.shutdown();
    Ok(())
}
