// SPDX-License-Identifier: GPL-2.0
//! The tool's connections leave their local port open to a bind with
//! `SO_REUSEADDR`, as the siw_rs driver's active socket makes it on the
//! port the RDMA CM picked (see `conn::tcp_connect`).

use socket2::{Domain, Protocol, Socket, Type};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Binds a fresh socket with `SO_REUSEADDR` to `local`, as the driver does
/// before its connect.
fn bind_reusing(local: SocketAddr) -> std::io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(local),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    s.bind(&local.into())?;
    Ok(s)
}

#[test]
fn a_connection_port_can_be_bound_by_a_reusing_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap().to_string();

    let ours = iwarp_peer::conn::tcp_connect(&target, Duration::from_secs(5)).unwrap();
    let port = ours.local_addr().unwrap();
    bind_reusing(port).expect("a port of tcp_connect refused a reusing bind");

    // The contrast, which is why tcp_connect sets the option: a plain
    // connection's port refuses that bind.
    let plain = TcpStream::connect(&target).unwrap();
    let err = bind_reusing(plain.local_addr().unwrap())
        .expect_err("a plain connection's port took a bind");
    assert_eq!(err.kind(), ErrorKind::AddrInUse);
}
