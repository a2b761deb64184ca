// SPDX-License-Identifier: GPL-2.0
//! The checks behind the iwarp-core fuzz targets, and the input formats they
//! decode.
//!
//! Each target in `fuzz_targets/` is a one-line call into this library, so
//! that `examples/gen_corpus.rs` can build its seeds with the encoders below
//! and run every seed through the very same checks (a seed that does not
//! reach the state it was written for fails generation).
//!
//! Every check panics on a violated invariant; a panic is what libFuzzer
//! reports as a crash. The library code under test must never panic on any
//! input, so a panic inside `iwarp_core` is a finding as well.

pub mod hs;
pub mod rx_stream;
pub mod stream;
pub mod tx_roundtrip;
pub mod wire;

/// Reads fields from the front of a fuzz input. Reads past the end yield
/// zeros, so every input decodes to something.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    /// One octet (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        b
    }

    /// Big-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// Big-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// Big-endian u64.
    pub fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }

    /// Up to `n` octets (fewer at the end of the input).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = self.pos.saturating_add(n);
        &self.data[start..end]
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        self.pos = self.data.len();
        &self.data[start..]
    }
}

/// Piece sizes for feeding a stream in pieces: cycles through the given
/// octets (0 = an empty piece); with none, the whole stream is one piece.
#[derive(Clone, Debug)]
pub struct Schedule<'a> {
    sizes: &'a [u8],
    next: usize,
}

impl<'a> Schedule<'a> {
    /// Maximum number of piece sizes an input may carry.
    pub const MAX: usize = 15;

    /// Decodes `n` (one octet, modulo 16) and then `n` piece sizes.
    pub fn decode(inp: &mut Input<'a>) -> Self {
        let n = usize::from(inp.u8()) % (Self::MAX + 1);
        Schedule {
            sizes: inp.take(n),
            next: 0,
        }
    }

    /// Encodes piece sizes (at most [`Self::MAX`]).
    pub fn encode(sizes: &[u8], out: &mut Vec<u8>) {
        assert!(sizes.len() <= Self::MAX);
        out.push(sizes.len() as u8);
        out.extend_from_slice(sizes);
    }

    /// The next piece size.
    pub fn next_size(&mut self) -> usize {
        if self.sizes.is_empty() {
            return usize::MAX;
        }
        let s = self.sizes[self.next % self.sizes.len()];
        self.next = self.next.wrapping_add(1);
        usize::from(s)
    }
}

/// Bit-at-a-time CRC32c, independent of the crate's table-driven one.
pub fn reference_crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
