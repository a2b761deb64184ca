// SPDX-License-Identifier: GPL-2.0

//! Safe wrappers over in-kernel TCP sockets: creation, bind/listen/accept/
//! connect, blocking sends and receives for the MPA handshake, and the
//! socket callbacks (data ready, write space, state change) for the data
//! path, with the receive path reading straight from the socket's skbs.
//!
//! # Invariants
//!
//! A [`Socket`] owns its `struct socket` (released on drop). While a handler
//! is attached ([`Socket::attach`]), `sk_user_data` holds one reference of
//! an `Arc<H>` made by `Arc::into_raw`; it is read only under the socket's
//! callback lock, and [`Socket::detach`] clears it under the same lock
//! (write side) before dropping that reference, so a callback never sees a
//! freed handler.

use crate::ffi;
use core::{mem, ptr, ptr::NonNull};
use kernel::{
    error::to_result,
    ffi::{c_int, c_uint},
    prelude::*,
    sync::{Arc, ArcBorrow},
};

/// Whether a log line that a peer's frames caused may be printed now: one
/// kernel rate limit shared by all of them, so that a hostile peer opening
/// connection after connection cannot flood the kernel log.
pub(crate) fn peer_log_allowed() -> bool {
    // SAFETY: no arguments; the helper only touches its own static
    // rate-limit state, which `__ratelimit` locks.
    unsafe { ffi::siw_rs_h_peer_log_ratelimit() }
}

/// An IPv4 or IPv6 socket address (`struct sockaddr_storage`).
#[derive(Clone, Copy)]
pub(crate) struct SockAddr(pub(crate) ffi::__kernel_sockaddr_storage);

// SAFETY: plain bytes; the pointer member of the C union only serves
// alignment and is never dereferenced.
unsafe impl Send for SockAddr {}
// SAFETY: as above.
unsafe impl Sync for SockAddr {}

impl SockAddr {
    /// The address family (`AF_INET`, `AF_INET6`).
    pub(crate) fn family(&self) -> u32 {
        // SAFETY: the family is the first member of every variant.
        u32::from(unsafe { self.0.__bindgen_anon_1.__bindgen_anon_1.ss_family })
    }

    /// The length of the family's `sockaddr`; `EAFNOSUPPORT` for others.
    fn len(&self) -> Result<c_int> {
        match self.family() {
            ffi::AF_INET => Ok(mem::size_of::<ffi::sockaddr_in>() as c_int),
            ffi::AF_INET6 => Ok(mem::size_of::<ffi::sockaddr_in6>() as c_int),
            _ => Err(ffi_err(ffi::EAFNOSUPPORT)),
        }
    }

    fn as_ptr(&self) -> *mut ffi::sockaddr {
        ptr::from_ref(&self.0).cast_mut().cast()
    }

    /// The port (host order); 0 for other families.
    pub(crate) fn port(&self) -> u16 {
        match self.family() {
            // SAFETY: an AF_INET address is a `sockaddr_in`, an AF_INET6
            // one a `sockaddr_in6`; both fit in the storage.
            ffi::AF_INET => u16::from_be(unsafe { (*self.as_ptr().cast::<ffi::sockaddr_in>()).sin_port }),
            // SAFETY: as above.
            ffi::AF_INET6 => u16::from_be(unsafe { (*self.as_ptr().cast::<ffi::sockaddr_in6>()).sin6_port }),
            _ => 0,
        }
    }

    /// Whether the address is the wildcard (`INADDR_ANY`, `in6addr_any`).
    pub(crate) fn is_wildcard(&self) -> bool {
        // SAFETY: the storage is plain bytes of its own size.
        let b: &[u8] = unsafe { core::slice::from_raw_parts(self.as_ptr().cast::<u8>(), mem::size_of_val(&self.0)) };
        let addr = match self.family() {
            // `sin_addr` and `sin6_addr` (struct sockaddr_in/_in6).
            ffi::AF_INET => b.get(4..8),
            ffi::AF_INET6 => b.get(8..24),
            _ => None,
        };
        addr.is_some_and(|a| a.iter().all(|&x| x == 0))
    }

    fn as_mut_ptr(&mut self) -> *mut ffi::sockaddr {
        ptr::from_mut(&mut self.0).cast()
    }

    fn zeroed() -> Self {
        // SAFETY: an all-zero sockaddr_storage is valid (family 0).
        SockAddr(unsafe { mem::zeroed() })
    }
}

/// A counted reference to a network namespace (`get_net`).
pub(crate) struct Net(NonNull<ffi::net>);

// SAFETY: a namespace is a shared kernel object; we only pass it to socket
// creation, which may happen on any thread.
unsafe impl Send for Net {}
// SAFETY: as above.
unsafe impl Sync for Net {}

impl Net {
    /// The namespace of `netdev`, counted: it stays while this is held
    /// (a connect's work item holds it until its socket exists, and the
    /// socket holds its own). `None` if the namespace is being dismantled.
    pub(crate) fn of(netdev: &crate::netdev::NetDevice) -> Option<Self> {
        // SAFETY: `netdev` is live; the helper reads its namespace and takes
        // a reference unless the namespace's count already reached zero.
        let n = unsafe { ffi::siw_rs_h_dev_net_get(netdev.as_raw()) };
        NonNull::new(n).map(Net)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // SAFETY: the reference `of` took.
        unsafe { ffi::siw_rs_h_net_put(self.0.as_ptr()) };
    }
}

/// Most slices one [`Socket::send`] hands to the stack (each a `kvec` on
/// the stack): enough for a large FPDU's header, its payload pages and
/// trailer in one call.
pub(crate) const MAX_SEND_PARTS: usize = 24;

/// A kernel TCP socket.
pub(crate) struct Socket {
    sock: NonNull<ffi::socket>,
}

// SAFETY: socket calls are internally synchronised by the socket lock.
unsafe impl Send for Socket {}
// SAFETY: as above.
unsafe impl Sync for Socket {}

/// Converts a millisecond timeout to jiffies.
fn jiffies(ms: u32) -> kernel::ffi::c_long {
    // SAFETY: a pure conversion.
    unsafe { ffi::siw_rs_h_msecs_to_jiffies(ms) }
}

impl Socket {
    /// Creates a TCP socket of `family` in `net`, with Nagle off and
    /// address reuse on.
    pub(crate) fn new(net: Net, family: u32) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: `net` holds a reference to a live namespace; `raw`
        // receives the socket, which takes its own reference.
        to_result(unsafe { ffi::siw_rs_h_sock_create(net.0.as_ptr(), family as c_int, &mut raw) })?;
        let sock = NonNull::new(raw).ok_or(ENOMEM)?;
        let s = Socket { sock };
        // SAFETY: a fresh socket with its `sk`.
        unsafe {
            ffi::tcp_sock_set_nodelay(s.sk());
            ffi::siw_rs_h_sk_set_reuseaddr(s.sk());
        }
        Ok(s)
    }

    fn sk(&self) -> *mut ffi::sock {
        // SAFETY: the socket is live; `sk` is set for an inet socket.
        unsafe { (*self.sock.as_ptr()).sk }
    }

    /// Binds to `addr`.
    pub(crate) fn bind(&self, addr: &SockAddr) -> Result {
        let len = addr.len()?;
        // SAFETY: a live socket and a valid address of `len` bytes.
        to_result(unsafe { ffi::kernel_bind(self.sock.as_ptr(), addr.as_ptr(), len) })
    }

    /// Takes IPv6 traffic only (`IPV6_V6ONLY`), so that an IPv4 socket may
    /// bind the same port; before binding, on an `AF_INET6` socket.
    pub(crate) fn set_v6only(&self) -> Result {
        // SAFETY: a live socket; the helper takes the socket lock itself.
        to_result(unsafe { ffi::siw_rs_h_sk_set_v6only(self.sk()) })
    }

    /// Accepts only traffic of interface `ifindex` (`SO_BINDTODEVICE`).
    pub(crate) fn bind_to_device(&self, ifindex: i32) -> Result {
        // SAFETY: a live socket; the call takes the socket lock itself.
        to_result(unsafe { ffi::sock_bindtoindex(self.sk(), ifindex, true) })
    }

    /// Starts listening.
    pub(crate) fn listen(&self, backlog: i32) -> Result {
        // SAFETY: a live, bound socket.
        to_result(unsafe { ffi::kernel_listen(self.sock.as_ptr(), backlog) })
    }

    /// Accepts a pending connection without blocking; `None` if none waits.
    /// A new socket is a clone of the listening one, callbacks included:
    /// `listener` (the listening socket's attachment) gives back the
    /// original callbacks, which the new socket gets instead of ours.
    pub(crate) fn accept_from<H: SockHandler>(&self, listener: &Attached<H>) -> Result<Option<Socket>> {
        let Some(s) = self.accept()? else { return Ok(None) };
        let sk = s.sk();
        // SAFETY: under the new socket's callback write lock we own its
        // callbacks; its `sk_user_data` is a copy of the listener's and owns
        // no reference, so it is simply cleared.
        unsafe {
            ffi::siw_rs_h_sk_callback_write_lock(sk);
            (*sk).sk_user_data = ptr::null_mut();
            (*sk).sk_data_ready = listener.saved.data_ready;
            (*sk).sk_write_space = listener.saved.write_space;
            (*sk).sk_state_change = listener.saved.state_change;
            ffi::siw_rs_h_sk_callback_write_unlock(sk);
        }
        Ok(Some(s))
    }

    /// Accepts a pending connection without blocking; `None` if none waits.
    fn accept(&self) -> Result<Option<Socket>> {
        let mut raw = ptr::null_mut();
        // SAFETY: a live listening socket; `raw` receives the new one.
        let r = unsafe { ffi::kernel_accept(self.sock.as_ptr(), &mut raw, ffi::O_NONBLOCK as c_int) };
        if r == -(ffi::EAGAIN as c_int) {
            return Ok(None);
        }
        to_result(r)?;
        let sock = NonNull::new(raw).ok_or(ENOMEM)?;
        let s = Socket { sock };
        // SAFETY: the accepted socket's `sk`.
        unsafe { ffi::tcp_sock_set_nodelay(s.sk()) };
        Ok(Some(s))
    }

    /// Connects to `addr`, blocking up to the send timeout.
    pub(crate) fn connect(&self, addr: &SockAddr) -> Result {
        let len = addr.len()?;
        // SAFETY: a live socket and a valid address.
        to_result(unsafe { ffi::kernel_connect(self.sock.as_ptr(), addr.as_ptr(), len, 0) })
    }

    /// Sets the blocking receive and send timeouts.
    pub(crate) fn set_timeouts(&self, rcv_ms: u32, snd_ms: u32) {
        // SAFETY: a live socket; plain stores.
        unsafe { ffi::siw_rs_h_sk_set_timeouts(self.sk(), jiffies(rcv_ms), jiffies(snd_ms)) };
    }

    /// Sends every octet of `parts`, blocking (up to the send timeout).
    pub(crate) fn send_all(&self, parts: &[&[u8]]) -> Result {
        for p in parts {
            let mut off = 0usize;
            while off < p.len() {
                let rest = p.get(off..).unwrap_or(&[]);
                let n = self.send(&[rest], false)?;
                if n == 0 {
                    return Err(ffi_err(ffi::ECONNRESET));
                }
                off += n;
            }
        }
        Ok(())
    }

    /// Sends as much of `parts` as the socket takes; with `nonblock` it
    /// returns `Ok(0)` when the socket is full.
    pub(crate) fn send(&self, parts: &[&[u8]], nonblock: bool) -> Result<usize> {
        if let [one] = parts {
            // The common small send: one vector, not an array of them to
            // initialise.
            let mut v = [ffi::kvec { iov_base: one.as_ptr().cast_mut().cast(), iov_len: one.len() }];
            return self.sendmsg(&mut v, one.len(), nonblock);
        }
        const MAXV: usize = MAX_SEND_PARTS;
        let mut vecs: [ffi::kvec; MAXV] = Default::default();
        let mut total = 0usize;
        let mut n = 0usize;
        for (v, p) in vecs.iter_mut().zip(parts.iter()) {
            v.iov_base = p.as_ptr().cast_mut().cast();
            v.iov_len = p.len();
            total += p.len();
            n += 1;
        }
        self.sendmsg(vecs.get_mut(..n).unwrap_or(&mut []), total, nonblock)
    }

    /// Sends `parts` by reference (non-blocking), payload from registered
    /// regions' pages (as far as the stack may reference them, see
    /// `helpers.h`) and framing copied, with `note` as the notification of
    /// their release ([`crate::zcopy`]); `more`: octets follow. Returns the
    /// octets the socket took, `Ok(0)` when it is full, and
    /// `Err(EOPNOTSUPP)` when the first parts cannot go by reference (the
    /// caller copies them instead).
    pub(crate) fn send_zcopy(&self, parts: &[ZcPart<'_>], note: &crate::zcopy::Note, more: bool) -> Result<usize> {
        let mut raw: [ffi::siw_rs_zc_part; MAX_SEND_PARTS] = Default::default();
        let mut n = 0usize;
        for (r, p) in raw.iter_mut().zip(parts.iter()) {
            r.base = p.bytes.as_ptr().cast();
            r.len = p.bytes.len();
            r.copy = !p.payload;
            n += 1;
        }
        let n32 = u32::try_from(n).unwrap_or(0);
        // SAFETY: `raw` describes live slices (the caller's); framing is
        // copied in the call; payload is referenced through page
        // references the skbs take (pages the helper checks may be), and
        // the caller keeps it unmodified until the note is released (the
        // work request's completion).
        let r = unsafe { ffi::siw_rs_h_sendmsg_zc(self.sock.as_ptr(), raw.as_ptr(), n32, note.ubuf(), more) };
        if r == -(ffi::EAGAIN as c_int) {
            return Ok(0);
        }
        to_result(r)?;
        Ok(r as usize)
    }

    /// `kernel_sendmsg` of `vecs`, which describe live slices of `total`
    /// octets.
    fn sendmsg(&self, vecs: &mut [ffi::kvec], total: usize, nonblock: bool) -> Result<usize> {
        let mut msg = ffi::msghdr::default();
        let mut flags = ffi::MSG_NOSIGNAL;
        if nonblock {
            flags |= ffi::MSG_DONTWAIT;
        }
        msg.msg_flags = flags;
        // SAFETY: `vecs` describe live slices of `total` bytes (caller);
        // the socket copies them before returning.
        let r = unsafe { ffi::kernel_sendmsg(self.sock.as_ptr(), &mut msg, vecs.as_mut_ptr(), vecs.len(), total) };
        if r == -(ffi::EAGAIN as c_int) && nonblock {
            return Ok(0);
        }
        to_result(r)?;
        Ok(r as usize)
    }

    /// Receives up to `buf.len()` octets, blocking up to the receive
    /// timeout; `Ok(0)` means the peer closed.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> Result<usize> {
        let mut v = ffi::kvec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut msg = ffi::msghdr::default();
        // SAFETY: `v` describes `buf`, which stays valid for the call.
        let r = unsafe { ffi::kernel_recvmsg(self.sock.as_ptr(), &mut msg, &mut v, 1, buf.len(), 0) };
        to_result(r)?;
        Ok(r as usize)
    }

    /// Shuts both directions down (the peer sees a FIN).
    pub(crate) fn shutdown(&self) {
        // SAFETY: a live socket.
        unsafe { ffi::kernel_sock_shutdown(self.sock.as_ptr(), ffi::SHUT_RDWR) };
    }

    /// The local address.
    pub(crate) fn local_addr(&self) -> SockAddr {
        let mut a = SockAddr::zeroed();
        // SAFETY: a live socket and a sockaddr_storage-sized buffer.
        unsafe { ffi::kernel_getsockname(self.sock.as_ptr(), a.as_mut_ptr()) };
        a
    }

    /// The peer's address.
    pub(crate) fn peer_addr(&self) -> SockAddr {
        let mut a = SockAddr::zeroed();
        // SAFETY: as in `local_addr`.
        unsafe { ffi::kernel_getpeername(self.sock.as_ptr(), a.as_mut_ptr()) };
        a
    }

    /// Whether the stream has room again by the test that makes the
    /// write-space callback fire (a third of the send buffer free).
    pub(crate) fn writeable(&self) -> bool {
        // SAFETY: a live socket; the test reads a few counters.
        unsafe { ffi::siw_rs_h_sk_stream_writeable(self.sk()) }
    }

    /// Asks for a write-space callback when space frees up.
    pub(crate) fn want_write_space(&self) {
        // SAFETY: a live socket.
        unsafe { ffi::siw_rs_h_sk_set_nospace(self.sk()) };
    }

    /// Installs `handler` as the socket's callbacks, saving the originals.
    pub(crate) fn attach<H: SockHandler>(&self, handler: Arc<H>) -> Attached<H> {
        let sk = self.sk();
        let mut saved = Saved::default();
        // SAFETY: under the callback write lock we own `sk_user_data` and the
        // callback pointers; see the module invariants.
        unsafe {
            ffi::siw_rs_h_sk_callback_write_lock(sk);
            saved.data_ready = (*sk).sk_data_ready;
            saved.write_space = (*sk).sk_write_space;
            saved.state_change = (*sk).sk_state_change;
            (*sk).sk_user_data = Arc::into_raw(handler).cast_mut().cast();
            (*sk).sk_data_ready = Some(data_ready_cb::<H>);
            (*sk).sk_write_space = Some(write_space_cb::<H>);
            (*sk).sk_state_change = Some(state_change_cb::<H>);
            ffi::siw_rs_h_sk_callback_write_unlock(sk);
        }
        Attached { saved, _h: core::marker::PhantomData }
    }

    /// Restores the original callbacks and drops the handler reference.
    pub(crate) fn detach<H: SockHandler>(&self, a: Attached<H>) {
        let sk = self.sk();
        // SAFETY: as in `attach`; after the write lock is released no
        // callback can see the handler any more.
        let old = unsafe {
            ffi::siw_rs_h_sk_callback_write_lock(sk);
            let old = (*sk).sk_user_data;
            (*sk).sk_user_data = ptr::null_mut();
            (*sk).sk_data_ready = a.saved.data_ready;
            (*sk).sk_write_space = a.saved.write_space;
            (*sk).sk_state_change = a.saved.state_change;
            ffi::siw_rs_h_sk_callback_write_unlock(sk);
            old
        };
        if !old.is_null() {
            // SAFETY: `old` is the reference `attach` leaked.
            drop(unsafe { Arc::<H>::from_raw(old.cast::<H>()) });
        }
    }

    /// Reads what the socket has queued, handing it to `f` in contiguous
    /// pieces straight from the skbs; `f` returns how much it consumed (less
    /// than given stops the read; the rest stays queued). Call from the
    /// data-ready callback (socket lock held by the stack) or under
    /// [`Socket::with_lock`].
    pub(crate) fn read_sk<F: FnMut(&[u8]) -> usize>(sk: &SockRef, f: &mut F) -> usize {
        let mut desc = ffi::read_descriptor_t::default();
        desc.count = 1;
        desc.arg.data = ptr::from_mut(f).cast();
        // SAFETY: `sk` is a live TCP socket whose lock the caller holds;
        // `recv_actor::<F>` casts `arg.data` back to `F`.
        let r = unsafe { ffi::tcp_read_sock(sk.0.as_ptr(), &mut desc, Some(recv_actor::<F>)) };
        usize::try_from(r).unwrap_or(0)
    }

    /// Runs `f` with the socket lock held (process context).
    /// Whether the TCP connection is still established (not closed or
    /// closing from either side).
    pub(crate) fn is_established(&self) -> bool {
        // SAFETY: a live socket; reading the state is a plain load.
        unsafe { ffi::siw_rs_h_sk_state(self.sk()) == ffi::TCP_ESTABLISHED as c_int }
    }

    pub(crate) fn with_lock<R>(&self, f: impl FnOnce(&SockRef) -> R) -> R {
        let sk = self.sk();
        // SAFETY: a live socket; lock_sock may sleep (process context).
        unsafe { ffi::siw_rs_h_lock_sock(sk) };
        let r = f(&SockRef(NonNull::new(sk).unwrap_or(NonNull::dangling())));
        // SAFETY: releases the lock taken above.
        unsafe { ffi::release_sock(sk) };
        r
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: we own the socket; no callback of ours is attached any
        // more (callers detach first).
        unsafe { ffi::sock_release(self.sock.as_ptr()) };
    }
}

/// A piece of a zero-copy send ([`Socket::send_zcopy`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct ZcPart<'a> {
    pub(crate) bytes: &'a [u8],
    /// Payload in a registered region (sent by reference where its pages
    /// allow); else framing octets (copied).
    pub(crate) payload: bool,
}

/// A borrowed `struct sock` during a callback or under the socket lock.
pub(crate) struct SockRef(NonNull<ffi::sock>);

impl SockRef {
    /// Whether a segment received since the last ACK looked like the end
    /// of the peer's write: PSH set on a full segment, or a short segment
    /// (TCP's `ICSK_ACK_PUSHED`). Then a read that empties the receive
    /// queue sends an ACK at once, unless the connection is in TCP's
    /// interactive ("pingpong") mode, so that a sender waiting for it (a
    /// zero-copy send that completes when its pages are acknowledged, or
    /// one bound by its congestion window) need not wait for the
    /// delayed-ACK timer. Call with the socket lock held.
    pub(crate) fn ack_pushed(&self) -> bool {
        // SAFETY: a live TCP socket whose lock the caller holds; the
        // helper reads one field of its ACK state.
        unsafe { ffi::siw_rs_h_tcp_ack_pushed(self.0.as_ptr()) }
    }

    /// Sets or clears what [`ack_pushed`](Self::ack_pushed) reads. A read
    /// that ends inside an iWARP message clears it: upstream siw sets PSH
    /// on every FPDU (each is a send of its own), so TCP would otherwise
    /// acknowledge each of its segments; the rest of the message follows,
    /// and TCP's own rule of one ACK per two full segments covers it. Call
    /// with the socket lock held (during a read, before TCP decides at its
    /// end whether to acknowledge).
    pub(crate) fn set_ack_pushed(&self, pushed: bool) {
        // SAFETY: a live TCP socket whose lock the caller holds; the
        // helper sets or clears one bit of its ACK state, as TCP does under
        // that lock.
        unsafe { ffi::siw_rs_h_tcp_set_ack_pushed(self.0.as_ptr(), pushed) };
    }
}

/// The saved original callbacks of a socket with a handler attached.
#[derive(Default)]
struct Saved {
    data_ready: Option<unsafe extern "C" fn(*mut ffi::sock)>,
    write_space: Option<unsafe extern "C" fn(*mut ffi::sock)>,
    state_change: Option<unsafe extern "C" fn(*mut ffi::sock)>,
}

/// Proof that a handler is attached; give it back to [`Socket::detach`].
pub(crate) struct Attached<H> {
    saved: Saved,
    _h: core::marker::PhantomData<H>,
}

/// What a socket's callbacks call. All run in softirq context with the
/// socket's callback lock held for reading: no sleeping.
pub(crate) trait SockHandler: Send + Sync + 'static {
    /// The handler serves a listening socket (see `with_handler`).
    const LISTENS: bool = false;
    /// Data arrived (the stack holds the socket lock).
    fn data_ready(this: ArcBorrow<'_, Self>, sk: &SockRef);
    /// Send space freed up.
    fn write_space(this: ArcBorrow<'_, Self>);
    /// The TCP state changed (peer closed, reset, …); `established` tells
    /// whether the connection is still up.
    fn state_change(this: ArcBorrow<'_, Self>, established: bool);
}

/// Runs `f` on the handler attached to `sk`, if any, under the read lock.
///
/// # Safety
///
/// `sk` must be a live socket whose `sk_user_data` is NULL or set by
/// `Socket::attach::<H>`.
unsafe fn with_handler<H: SockHandler>(sk: *mut ffi::sock, f: impl FnOnce(ArcBorrow<'_, H>)) {
    // SAFETY: by the requirements; see the module invariants: a non-NULL
    // pointer is an `Arc<H>` reference that cannot go while we hold the
    // read lock. A socket accepted from a listener inherits the listener's
    // callbacks and pointer until `accept_from` resets them; `H::LISTENS`
    // handlers therefore only act on sockets in the LISTEN state.
    unsafe {
        ffi::siw_rs_h_sk_callback_read_lock(sk);
        let h = (*sk).sk_user_data.cast::<H>();
        let listen_ok = !H::LISTENS || ffi::siw_rs_h_sk_state(sk) == ffi::TCP_LISTEN as c_int;
        if !h.is_null() && listen_ok {
            f(ArcBorrow::from_raw(h));
        }
        ffi::siw_rs_h_sk_callback_read_unlock(sk);
    }
}

unsafe extern "C" fn data_ready_cb<H: SockHandler>(sk: *mut ffi::sock) {
    let r = SockRef(NonNull::new(sk).unwrap_or(NonNull::dangling()));
    // SAFETY: the stack calls this for the socket we attached `H` to.
    unsafe { with_handler::<H>(sk, |h| H::data_ready(h, &r)) };
}

unsafe extern "C" fn write_space_cb<H: SockHandler>(sk: *mut ffi::sock) {
    // TCP calls this on every ACK while SOCK_NOSPACE is set. The handler
    // hears of it once, when the stream has room again and the flag is
    // cleared, not on every ACK in between.
    // SAFETY: the stack calls this for a live socket, as above.
    if unsafe { ffi::siw_rs_h_sk_write_space_ready(sk) } {
        // SAFETY: as above.
        unsafe { with_handler::<H>(sk, |h| H::write_space(h)) };
    }
}

unsafe extern "C" fn state_change_cb<H: SockHandler>(sk: *mut ffi::sock) {
    // SAFETY: as above; reading the state is a plain load.
    let up = unsafe { ffi::siw_rs_h_sk_state(sk) } == ffi::TCP_ESTABLISHED as c_int;
    // SAFETY: as above.
    unsafe { with_handler::<H>(sk, |h| H::state_change(h, up)) };
}

/// The `tcp_read_sock` actor: walks the skb range in contiguous pieces.
unsafe extern "C" fn recv_actor<F: FnMut(&[u8]) -> usize>(
    desc: *mut ffi::read_descriptor_t,
    skb: *mut ffi::sk_buff,
    offset: c_uint,
    len: usize,
) -> c_int {
    // SAFETY: `read_sk` put a `&mut F` into `arg.data` for this call.
    let (desc, f) = unsafe { (&mut *desc, &mut *(*desc).arg.data.cast::<F>()) };
    let Ok(len32) = u32::try_from(len) else { return 0 };
    let Some(end) = offset.checked_add(len32) else { return 0 };
    let mut st = ffi::skb_seq_state::default();
    let mut consumed: u32 = 0;
    // SAFETY: the skb is live for the actor call; the seq state is ours.
    unsafe { ffi::skb_prepare_seq_read(skb, offset, end, &mut st) };
    loop {
        let mut data: *const u8 = ptr::null();
        // SAFETY: `st` was prepared above; `data` receives a mapping valid
        // until the next call.
        let n = unsafe { ffi::skb_seq_read(consumed, &mut data, &mut st) };
        if n == 0 || data.is_null() {
            break;
        }
        // SAFETY: `skb_seq_read` returned `n` readable bytes at `data`.
        let piece = unsafe { core::slice::from_raw_parts(data, n as usize) };
        let used = f(piece).min(piece.len());
        consumed += used as u32;
        if used < piece.len() {
            // SAFETY: ends the sequential read early (unmaps).
            unsafe { ffi::skb_abort_seq_read(&mut st) };
            desc.count = 0;
            break;
        }
    }
    consumed as c_int
}

/// A kernel `Error` for a positive errno constant.
pub(crate) fn ffi_err(errno: u32) -> Error {
    Error::from_errno(-(errno as c_int))
}
