// SPDX-License-Identifier: GPL-2.0
//! MPA startup state machine, both roles and the pair; see
//! `iwarp_core_fuzz::hs` for the input layout and the invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    iwarp_core_fuzz::hs::run(data);
});
