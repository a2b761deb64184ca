// SPDX-License-Identifier: GPL-2.0
//! TCP connection setup and the MPA handshake (RFC 5044, RFC 6581), driving
//! `iwarp_core::mpa::Handshake` over a blocking socket with timeouts.
//!
//! The client side is the MPA initiator (as `rdma_connect` is), the server
//! side the responder (as `rdma_accept` is). Octets that arrive in the same
//! read as the peer's MPA frame are FPDUs: they are handed on in
//! [`Established::leftover`].

use socket2::{Domain, Protocol, Socket, Type};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use iwarp_core::mpa::{
    CrcPolicy, EnhancedConfig, Event, Handshake, MpaConfig, Negotiated, Revision, RtrSet,
    MAX_FRAME_LEN,
};

use crate::error::{is_timeout, Error, Result};

/// MPA settings of one side; the defaults are upstream siw's (revision 2
/// with the RFC 6581 block, CRC only if the peer asks, no markers, no
/// peer-to-peer mode) with IRD = ORD = 1 as `rping` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpaOptions {
    /// Highest MPA revision.
    pub revision: Revision,
    /// CRC policy.
    pub crc: CrcPolicy,
    /// Refuse a peer whose revision, CRC flag or enhanced mode differs.
    pub strict: bool,
    /// Ask the peer to insert markers into the FPDUs this side receives.
    pub markers_rx: bool,
    /// Insert markers when the peer asks (upstream siw refuses instead).
    pub markers_tx: bool,
    /// Send the RFC 6581 IRD/ORD block (revision 2 only).
    pub enhanced: bool,
    /// Inbound RDMA Read queue depth offered.
    pub ird: u16,
    /// Outbound RDMA Read queue depth wanted.
    pub ord: u16,
    /// Initiator: request peer-to-peer mode; responder: require it.
    pub p2p: bool,
    /// RTR message types offered (initiator) or accepted (responder).
    pub rtr: RtrSet,
    /// ULP private data of the Request or Reply.
    pub private_data: Vec<u8>,
    /// Responder: reject every connection (with `private_data`).
    pub reject: bool,
}

impl Default for MpaOptions {
    fn default() -> Self {
        MpaOptions {
            revision: Revision::V2,
            crc: CrcPolicy::PreferOff,
            strict: false,
            markers_rx: false,
            markers_tx: true,
            enhanced: true,
            ird: 1,
            ord: 1,
            p2p: false,
            rtr: RtrSet::WRITE_READ,
            private_data: Vec::new(),
            reject: false,
        }
    }
}

impl MpaOptions {
    /// The core's handshake configuration for these options.
    pub fn config(&self) -> MpaConfig<'_> {
        let enhanced = self.enhanced.then(|| EnhancedConfig {
            p2p: self.p2p,
            rtr: self.rtr,
            ..EnhancedConfig::new(self.ird, self.ord)
        });
        MpaConfig {
            revision: self.revision,
            crc: self.crc,
            strict: self.strict,
            markers_rx: self.markers_rx,
            markers_tx: self.markers_tx,
            enhanced,
            private_data: &self.private_data,
            reserved: 0,
        }
    }
}

/// A connection in full MPA operation.
#[derive(Debug)]
pub struct Established {
    /// The socket, with read and write timeouts set.
    pub stream: TcpStream,
    /// The negotiated parameters.
    pub negotiated: Negotiated,
    /// This side initiated the handshake (sends the RTR in P2P mode).
    pub initiator: bool,
    /// FPDU octets received together with the peer's MPA frame.
    pub leftover: Vec<u8>,
    /// The peer's ULP private data.
    pub peer_private_data: Vec<u8>,
    /// The peer's address.
    pub peer: SocketAddr,
}

impl Established {
    /// An initiator in peer-to-peer mode, before it sends its RTR: waits
    /// `d` and fails if the responder sent anything after its MPA Reply
    /// (RFC 6581: the responder sends nothing until the RTR is in).
    /// Restores the read timeout to `timeout`.
    pub fn expect_silence(&self, d: Duration, timeout: Duration) -> Result<()> {
        if !self.initiator || self.negotiated.rtr.is_none() {
            return Err(Error::Local(
                "--rtr-delay needs peer-to-peer mode, as initiator".into(),
            ));
        }
        let early = |n: usize| {
            Error::Protocol(format!(
                "the responder sent {n} octet(s) within {} ms of its MPA Reply, before our RTR",
                d.as_millis()
            ))
        };
        if !self.leftover.is_empty() {
            return Err(early(self.leftover.len()));
        }
        let deadline = Instant::now() + d;
        let mut b = [0u8; 64];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| Error::io("configure socket", e))?;
            match self.stream.peek(&mut b) {
                Ok(0) => return Err(Error::PeerClosed),
                Ok(n) => return Err(early(n)),
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(Error::io("peek", e)),
            }
        }
        self.stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| Error::io("configure socket", e))
    }
}

/// Result of the responder side of the handshake.
#[derive(Debug)]
pub enum Accepted {
    /// The connection is established.
    Established(Established),
    /// The connection was rejected as configured; the peer's private data.
    Rejected(Vec<u8>),
}

fn prepare(stream: &TcpStream, timeout: Duration) -> Result<()> {
    let set = |r: std::io::Result<()>| r.map_err(|e| Error::io("configure socket", e));
    set(stream.set_read_timeout(Some(timeout)))?;
    set(stream.set_write_timeout(Some(timeout)))?;
    set(stream.set_nodelay(true))
}

fn resolve(addr: &str) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("resolve {addr}"), e))?
        .collect();
    if addrs.is_empty() {
        return Err(Error::Usage(format!("{addr} resolves to no address")));
    }
    Ok(addrs)
}

/// Opens a TCP connection to `addr` (IPv4 or IPv6, `[::1]:port` form for
/// literals), trying each resolved address for at most `timeout`.
///
/// The socket has `SO_REUSEADDR` set, which leaves its local port (an
/// ephemeral one) open to a bind by a socket that also sets it. The RDMA
/// CM picks an iWARP connection's local port from the same range without
/// looking at TCP's ports, and the driver binds its kernel socket there
/// with `SO_REUSEADDR`: without the option here, a port this tool holds,
/// or holds in TIME_WAIT, fails such a connection in the same namespace
/// (`EADDRINUSE`), as it did a well-behaved rping running beside the
/// fuzzer (test_75). Connections of distinct 4-tuples can share a port.
pub fn tcp_connect(addr: &str, timeout: Duration) -> Result<TcpStream> {
    let mut last = None;
    for a in resolve(addr)? {
        match connect_reusing(&a, timeout) {
            Ok(s) => {
                prepare(&s, timeout)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    let err = last.unwrap_or_else(|| std::io::Error::other("no address"));
    Err(Error::Io {
        what: format!("connect to {addr}"),
        err,
    })
}

/// A TCP connection to `a` from a socket with `SO_REUSEADDR` set.
fn connect_reusing(a: &SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(*a), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.connect_timeout(&(*a).into(), timeout)?;
    Ok(sock.into())
}

/// A listening socket whose `accept` honours a timeout.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
}

impl Listener {
    /// Binds `addr` (port 0 picks an ephemeral port).
    pub fn bind(addr: &str) -> Result<Self> {
        let addrs = resolve(addr)?;
        let inner =
            TcpListener::bind(&addrs[..]).map_err(|e| Error::io(format!("listen on {addr}"), e))?;
        inner
            .set_nonblocking(true)
            .map_err(|e| Error::io("configure listener", e))?;
        Ok(Listener { inner })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.inner
            .local_addr()
            .map_err(|e| Error::io("listener address", e))
    }

    /// Waits at most `timeout` for a connection.
    pub fn accept(&self, timeout: Duration) -> Result<TcpStream> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.inner.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)
                        .map_err(|e| Error::io("configure socket", e))?;
                    prepare(&s, timeout)?;
                    return Ok(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout("waiting for a connection".into()));
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(Error::io("accept", e)),
            }
        }
    }
}

fn read_some(stream: &mut TcpStream, buf: &mut [u8], what: &str) -> Result<usize> {
    match stream.read(buf) {
        Ok(0) => Err(Error::PeerClosed),
        Ok(n) => Ok(n),
        Err(e) => Err(Error::io(what, e)),
    }
}

fn write_frame(stream: &mut TcpStream, frame: &[u8]) -> Result<()> {
    stream
        .write_all(frame)
        .map_err(|e| Error::io("send MPA frame", e))
}

fn peer_of(stream: &TcpStream) -> Result<SocketAddr> {
    stream.peer_addr().map_err(|e| Error::io("peer address", e))
}

/// Initiator: sends the MPA Request on `stream` and waits for the Reply.
pub fn initiate(mut stream: TcpStream, opts: &MpaOptions) -> Result<Established> {
    let mut frame = [0u8; MAX_FRAME_LEN];
    let (mut hs, n) = Handshake::initiator(&opts.config(), &mut frame)?;
    write_frame(&mut stream, &frame[..n])?;
    let mut buf = vec![0u8; 4096];
    loop {
        let got = read_some(&mut stream, &mut buf, "waiting for the MPA Reply")?;
        let feed = hs.feed(&buf[..got])?;
        let consumed = feed.consumed;
        match feed.event {
            None => continue,
            Some(Event::Established(negotiated)) => {
                let peer_private_data = hs.peer_private_data().to_vec();
                let peer = peer_of(&stream)?;
                return Ok(Established {
                    stream,
                    negotiated,
                    initiator: true,
                    leftover: buf[consumed..got].to_vec(),
                    peer_private_data,
                    peer,
                });
            }
            Some(Event::Rejected { private_data }) => {
                let private_data = private_data.to_vec();
                let _ = stream.shutdown(Shutdown::Both);
                return Err(Error::Rejected { private_data });
            }
            Some(Event::RequestReceived(_)) => {
                return Err(Error::Protocol(
                    "MPA Request received by the initiator".into(),
                ))
            }
        }
    }
}

/// Connects to `addr` and runs the initiator handshake.
pub fn connect(addr: &str, opts: &MpaOptions, timeout: Duration) -> Result<Established> {
    initiate(tcp_connect(addr, timeout)?, opts)
}

/// Reads until the Request is complete. Octets that followed it in the
/// same read are fed too: the core fails them as `UnexpectedData` (an
/// initiator must not send before the Reply).
fn await_request(stream: &mut TcpStream, hs: &mut Handshake) -> Result<()> {
    let mut buf = vec![0u8; 4096];
    loop {
        let got = read_some(stream, &mut buf, "waiting for the MPA Request")?;
        let feed = hs.feed(&buf[..got])?;
        if feed.event.is_some() {
            let consumed = feed.consumed;
            hs.feed(&buf[consumed..got])?;
            return Ok(());
        }
    }
}

/// Sends a reject Reply if the handshake still allows one.
fn reject_reply(stream: &mut TcpStream, hs: &mut Handshake, private_data: &[u8]) -> Result<()> {
    let mut frame = [0u8; MAX_FRAME_LEN];
    let n = hs.reject(private_data, &mut frame)?;
    write_frame(stream, &frame[..n])?;
    let _ = stream.shutdown(Shutdown::Write);
    Ok(())
}

/// Responder: waits for the MPA Request on `stream` and accepts or rejects
/// it. A Request that violates the local policy is rejected (as siw does)
/// and reported as the handshake error.
pub fn respond(mut stream: TcpStream, opts: &MpaOptions) -> Result<Accepted> {
    let mut hs = Handshake::responder(&opts.config());
    if let Err(e) = await_request(&mut stream, &mut hs) {
        if matches!(e, Error::Mpa(_)) && hs.can_reject() {
            reject_reply(&mut stream, &mut hs, &[])?;
        }
        return Err(e);
    }
    let peer_private_data = hs.peer_private_data().to_vec();
    if opts.reject {
        reject_reply(&mut stream, &mut hs, &opts.private_data)?;
        return Ok(Accepted::Rejected(peer_private_data));
    }
    let mut frame = [0u8; MAX_FRAME_LEN];
    let (n, negotiated) = hs.accept(&opts.private_data, opts.ird, opts.ord, &mut frame)?;
    write_frame(&mut stream, &frame[..n])?;
    let peer = peer_of(&stream)?;
    Ok(Accepted::Established(Established {
        stream,
        negotiated,
        initiator: false,
        leftover: Vec::new(),
        peer_private_data,
        peer,
    }))
}
