// SPDX-License-Identifier: GPL-2.0

//! Raw FFI: the bindgen output for the headers in `bindings_helper.h` and the
//! C helpers of `helpers.c`.
//!
//! This is the only place the generated code is visible from. Everything
//! above it goes through the safe wrappers in [`crate::ib`], [`crate::netdev`]
//! and [`crate::link`]; the driver logic does not name these items.

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    dead_code,
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    improper_ctypes,
    unreachable_pub,
    unsafe_op_in_unsafe_fn,
    unnecessary_transmutes
)]
mod generated {
    use kernel::ffi;

    // Blocklisted by the kernel's bindgen_parameters; defined as rust/ does.
    type __kernel_size_t = usize;
    type __kernel_ssize_t = isize;
    type __kernel_ptrdiff_t = isize;

    include!("bindings_generated.rs");
}

pub(crate) use generated::*;
