// SPDX-License-Identifier: GPL-2.0
//! Every wire-format parser with round trips; see `iwarp_core_fuzz::wire`
//! for the selectors and what each checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    iwarp_core_fuzz::wire::run(data);
});
