// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! libsiw_rs: the rdma-core provider for siw_rs soft-iWARP devices.
//!
//! libibverbs dlopen()s `libsiw_rs-rdmav34.so`; its constructor registers
//! the provider, whose `match_device` claims siw_rs devices (see
//! [`matching`]). Work queues and completion queues are rings shared with
//! the kernel ([`ring`]), filled and drained by the verbs in `provider`.
//!
//! `unsafe` lives in `ring` (the shared mapping), `lock` (the queue lock)
//! and `provider` (the libibverbs FFI boundary); `abi`, `wqe` and
//! `matching` are safe code, unit-tested on the host.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod lock;
pub mod matching;
mod provider;
pub mod ring;
pub mod sys;
pub mod wqe;
