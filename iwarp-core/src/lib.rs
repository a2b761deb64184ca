// SPDX-License-Identifier: GPL-2.0

//! Sans-IO iWARP protocol core: MPA (RFC 5044, RFC 6581), DDP (RFC 5041) and
//! RDMAP (RFC 5040, RFC 7306).
//!
//! The same source files are compiled twice: as this host crate (for `cargo
//! test`, property tests, fuzzing, benchmarks and the `iwarp-peer` tool) and
//! inside `siw_rs.ko`, where `siw_rs/iwarp.rs` includes each module file by
//! `#[path]`. That dual use sets the rules for every file in `src/`:
//!
//! - `core` only: no `std`, no `alloc`, no allocation of any kind;
//! - no `unsafe` (enforced here by `forbid`);
//! - never panic on any input: checked or wrapping arithmetic, `get()` for
//!   every index a peer controls (the kernel has overflow checks on and turns
//!   a panic into `BUG()`);
//! - siblings are named through `super::`, never `crate::`, because in the
//!   kernel the crate root is the module, not this file;
//! - no crate-level attributes in module files; the kernel's lint set
//!   (mirrored below) must pass without warnings.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(non_ascii_idents, rust_2018_idioms, unreachable_pub)]
#![warn(
    clippy::all,
    clippy::float_arithmetic,
    clippy::mut_mut,
    clippy::needless_bitwise_bool
)]
#![allow(
    clippy::collapsible_if,
    clippy::collapsible_match,
    clippy::needless_lifetimes
)]

pub mod crc32c;
pub mod ddp;
pub mod mpa;
pub mod rdmap;
pub mod rx;
pub mod terminate;
pub mod tx;
