// SPDX-License-Identifier: GPL-2.0
//! The transmit builder against the reference transmitter and the
//! receiver; see `iwarp_core_fuzz::tx_roundtrip` for the input layout and
//! the invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    iwarp_core_fuzz::tx_roundtrip::run(data);
});
