// SPDX-License-Identifier: GPL-2.0
//! Userspace iWARP peer over std TCP, built on the sans-IO `iwarp-core`.
//!
//! The peer speaks MPA (RFC 5044, RFC 6581 enhanced connection setup), DDP
//! (RFC 5041) and RDMAP (RFC 5040) exactly as `iwarp-core` frames and parses
//! them; every octet it puts on the wire comes from the core. It is both a
//! correct RDMA endpoint (memory regions with STags and access rights, a
//! receive queue, inbound RDMA Read service bounded by its IRD, a TERMINATE
//! for every bad inbound frame) and a hostile one (see [`inject`]).
//!
//! Layers:
//!
//! - [`conn`]: TCP connect/accept with timeouts and the MPA handshake in
//!   either role;
//! - [`qp`]: the data path of one connection: Send, RDMA Write and Read
//!   over `tx::Transmitter` / `rx::Receiver`, a small memory-region table
//!   and receive queue;
//! - [`rping`]: the application protocol of rdma-core's `rping` example, in
//!   both roles, so the peer interoperates with `rping -s` / `rping -c`;
//! - [`inject`]: malformed or forbidden frames and the TERMINATE each must
//!   provoke;
//! - [`fuzz`]: the hostile-peer fuzzer, one generated case per connection
//!   against a multi-connection rping server;
//! - [`opts`]: command-line options.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod conn;
pub mod error;
pub mod fuzz;
pub mod inject;
pub mod opts;
pub mod qp;
pub mod rping;

pub use error::{Error, Result};
