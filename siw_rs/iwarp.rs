// SPDX-License-Identifier: GPL-2.0

//! The sans-IO protocol core, compiled into the module from the same files
//! as the host crate `iwarp-core` (see iwarp-core/src/lib.rs for its rules).

#[path = "../iwarp-core/src/crc32c.rs"]
pub mod crc32c;
#[path = "../iwarp-core/src/ddp.rs"]
pub mod ddp;
#[path = "../iwarp-core/src/mpa.rs"]
pub mod mpa;
#[path = "../iwarp-core/src/rdmap.rs"]
pub mod rdmap;
#[path = "../iwarp-core/src/rx.rs"]
pub mod rx;
#[path = "../iwarp-core/src/terminate.rs"]
pub mod terminate;
#[path = "../iwarp-core/src/tx.rs"]
pub mod tx;
