// SPDX-License-Identifier: GPL-2.0
//! The incremental receive parser on hostile and scripted streams; see
//! `iwarp_core_fuzz::rx_stream` for the input layout and the invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    iwarp_core_fuzz::rx_stream::run(data);
});
