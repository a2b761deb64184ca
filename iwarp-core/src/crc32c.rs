// SPDX-License-Identifier: GPL-2.0

//! CRC32c (Castagnoli), the checksum of the MPA FPDU trailer (RFC 5044,
//! which takes the algorithm from iSCSI, RFC 3720).
//!
//! Parameters: polynomial 0x1EDC6F41 (bit-reflected form 0x82F63B78),
//! reflected input and output, initial register 0xFFFFFFFF, final XOR
//! 0xFFFFFFFF. The check value of the ASCII string `"123456789"` is
//! 0xE3069283.
//!
//! # Byte order on the MPA wire
//!
//! The 32-bit CRC value `v` (as returned by [`crc32c`] or
//! [`CrcEngine::finish`]) is transmitted least significant byte first,
//! i.e. the four trailer octets are `v.to_le_bytes()` ([`to_wire`]). This is
//! the order in which RFC 3720 appendix B.4 lists its test vectors (32 zero
//! octets give the octets `aa 36 91 8a`, value 0x8A9136AA), and it is what
//! upstream siw puts on the wire: the kernel crypto `crc32c` shash writes
//! its final value with `put_unaligned_le32(~crc)` straight into the
//! trailer. A receiver that loads the trailer as a network-order (big
//! endian) `u32` therefore sees `v.swap_bytes()`; compare octets, or use
//! [`from_wire`], instead.
//!
//! # Engines
//!
//! [`CrcEngine`] is the streaming interface the rest of the crate computes
//! CRCs through, so the kernel module can plug in the kernel's `crc32c`
//! (crypto API, the CPU's instructions where available; siw_rs/crc.rs);
//! [`SoftCrc32c`] is the portable software
//! implementation (slicing-by-8, tables built at compile time by a
//! `const fn`).

/// The CRC32c generator polynomial in bit-reflected form.
pub const POLYNOMIAL_REFLECTED: u32 = 0x82F6_3B78;

/// Streaming CRC32c computation.
///
/// `reset`, then any number of `update` calls with consecutive pieces of
/// the covered data, then `finish`. Splitting the data differently must not
/// change the result. `finish` does not consume or alter the state: more
/// `update` calls may follow and extend the covered data.
pub trait CrcEngine {
    /// Starts a new computation (forgets all data seen so far).
    fn reset(&mut self);
    /// Feeds the next piece of covered data.
    fn update(&mut self, data: &[u8]);
    /// Returns the CRC32c of all data fed since the last `reset`, as a
    /// value; see the module documentation for its byte order on the wire.
    fn finish(&self) -> u32;
}

/// Slicing-by-8 lookup tables: `TABLES[0]` is the classic byte-wise table,
/// `TABLES[k][b]` is the CRC of byte `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 8] = make_tables();

const fn make_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLYNOMIAL_REFLECTED
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut k = 1;
        while k < 8 {
            let prev = tables[k - 1][i];
            tables[k][i] = (prev >> 8) ^ tables[0][(prev & 0xff) as usize];
            k += 1;
        }
        i += 1;
    }
    tables
}

#[inline]
fn t(k: usize, index: u32) -> u32 {
    // `k` is a constant below 8 at every call site and `index` is masked to
    // eight bits, so both lookups are in bounds.
    match TABLES.get(k) {
        Some(table) => table.get((index & 0xff) as usize).copied().unwrap_or(0),
        None => 0,
    }
}

/// Advances the raw (pre-inverted) CRC register over `data`.
fn update_register(mut reg: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let Ok([b0, b1, b2, b3, b4, b5, b6, b7]) = <[u8; 8]>::try_from(chunk) else {
            continue; // unreachable: chunks_exact yields 8-byte chunks
        };
        let lo = reg ^ u32::from_le_bytes([b0, b1, b2, b3]);
        let hi = u32::from_le_bytes([b4, b5, b6, b7]);
        reg = t(7, lo)
            ^ t(6, lo >> 8)
            ^ t(5, lo >> 16)
            ^ t(4, lo >> 24)
            ^ t(3, hi)
            ^ t(2, hi >> 8)
            ^ t(1, hi >> 16)
            ^ t(0, hi >> 24);
    }
    for &b in chunks.remainder() {
        reg = (reg >> 8) ^ t(0, reg ^ u32::from(b));
    }
    reg
}

/// Software CRC32c engine (slicing-by-8, no allocation, no lazy
/// initialisation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftCrc32c {
    /// The CRC register, kept pre-inverted as the algorithm runs it.
    reg: u32,
}

impl SoftCrc32c {
    /// Creates an engine ready for a new computation.
    pub const fn new() -> Self {
        SoftCrc32c { reg: !0 }
    }

    /// Creates an engine that continues a computation whose data so far
    /// has the CRC32c value `crc` (as returned by `finish`).
    pub const fn resume(crc: u32) -> Self {
        SoftCrc32c { reg: !crc }
    }
}

impl Default for SoftCrc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl CrcEngine for SoftCrc32c {
    fn reset(&mut self) {
        self.reg = !0;
    }

    fn update(&mut self, data: &[u8]) {
        self.reg = update_register(self.reg, data);
    }

    fn finish(&self) -> u32 {
        !self.reg
    }
}

/// Returns the CRC32c of `data` (one-shot form of [`SoftCrc32c`]).
pub fn crc32c(data: &[u8]) -> u32 {
    !update_register(!0, data)
}

/// Extends a CRC32c: given `crc = crc32c(a)`, returns `crc32c(a ++ data)`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    !update_register(!crc, data)
}

/// The four octets that carry CRC value `crc` on the MPA wire, in
/// transmission order (least significant byte first).
pub const fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// The CRC value carried by four trailer octets in transmission order;
/// inverse of [`to_wire`].
pub const fn from_wire(octets: [u8; 4]) -> u32 {
    u32::from_le_bytes(octets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time reference implementation, independent of the tables.
    fn reference(data: &[u8]) -> u32 {
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

    fn pattern(buf: &mut [u8], seed: u32) {
        let mut x = seed | 1;
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = (x >> 24) as u8;
        }
    }

    // RFC 3720 appendix B.4: the data and the CRC octets as transmitted.
    const ISCSI_READ_CMD: [u8; 48] = [
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00,
        0x00, 0x18, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00,
    ];

    fn rfc3720_vectors() -> [([u8; 48], usize, [u8; 4]); 5] {
        let mut inc = [0u8; 48];
        let mut dec = [0u8; 48];
        for i in 0..32 {
            inc[i] = i as u8;
            dec[i] = 31 - i as u8;
        }
        [
            ([0u8; 48], 32, [0xaa, 0x36, 0x91, 0x8a]),
            ([0xffu8; 48], 32, [0x43, 0xab, 0xa8, 0x62]),
            (inc, 32, [0x4e, 0x79, 0xdd, 0x46]),
            (dec, 32, [0x5c, 0xdb, 0x3f, 0x11]),
            (ISCSI_READ_CMD, 48, [0x56, 0x3a, 0x96, 0xd9]),
        ]
    }

    #[test]
    fn rfc3720_b4_vectors_one_shot() {
        for (data, len, wire) in rfc3720_vectors() {
            let crc = crc32c(&data[..len]);
            assert_eq!(to_wire(crc), wire);
            assert_eq!(from_wire(wire), crc);
            assert_eq!(reference(&data[..len]), crc);
        }
    }

    #[test]
    fn rfc3720_b4_values() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        assert_eq!(crc32c(&ISCSI_READ_CMD), 0xD996_3A56);
    }

    #[test]
    fn check_value_and_empty() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[]), 0);
        assert_eq!(SoftCrc32c::new().finish(), 0);
    }

    #[test]
    fn rfc3720_b4_incremental_every_split() {
        for (data, len, wire) in rfc3720_vectors() {
            let data = &data[..len];
            for split in 0..=len {
                let mut e = SoftCrc32c::new();
                e.update(&data[..split]);
                e.update(&data[split..]);
                assert_eq!(to_wire(e.finish()), wire, "split at {split}");
            }
        }
    }

    #[test]
    fn incremental_every_two_splits() {
        let mut data = [0u8; 70];
        pattern(&mut data, 0x1234_5678);
        let want = crc32c(&data);
        for a in 0..=data.len() {
            for b in a..=data.len() {
                let mut e = SoftCrc32c::default();
                e.update(&data[..a]);
                e.update(&data[a..b]);
                e.update(&data[b..]);
                assert_eq!(e.finish(), want, "splits {a} {b}");
            }
        }
    }

    #[test]
    fn byte_at_a_time() {
        let mut data = [0u8; 257];
        pattern(&mut data, 99);
        let mut e = SoftCrc32c::new();
        for b in data.iter() {
            e.update(core::slice::from_ref(b));
        }
        assert_eq!(e.finish(), crc32c(&data));
    }

    #[test]
    fn matches_reference_all_lengths_and_alignments() {
        let mut buf = [0u8; 300];
        pattern(&mut buf, 7);
        for start in 0..9 {
            for len in 0..(buf.len() - start) {
                let s = &buf[start..start + len];
                assert_eq!(crc32c(s), reference(s), "start {start} len {len}");
            }
        }
    }

    #[test]
    fn reset_finish_resume_append() {
        let mut e = SoftCrc32c::new();
        e.update(b"garbage");
        e.reset();
        e.update(b"1234");
        let partial = e.finish();
        assert_eq!(e.finish(), partial, "finish is idempotent");
        e.update(b"56789");
        assert_eq!(e.finish(), 0xE306_9283);
        assert_eq!(crc32c_append(partial, b"56789"), 0xE306_9283);
        let mut r = SoftCrc32c::resume(partial);
        r.update(b"56789");
        assert_eq!(r.finish(), 0xE306_9283);
    }

    #[test]
    fn usable_as_trait_object() {
        let mut soft = SoftCrc32c::new();
        let e: &mut dyn CrcEngine = &mut soft;
        e.reset();
        e.update(b"123456789");
        assert_eq!(e.finish(), 0xE306_9283);
    }

    #[test]
    fn tables_are_consistent() {
        assert_eq!(TABLES[0][0], 0);
        assert_eq!(TABLES[0][1], 0xF26B_8303);
        assert_eq!(TABLES[0][128], POLYNOMIAL_REFLECTED);
        for k in 1..8 {
            for (&prev, &cur) in TABLES[k - 1].iter().zip(TABLES[k].iter()) {
                assert_eq!(cur, (prev >> 8) ^ TABLES[0][(prev & 0xff) as usize]);
            }
        }
    }
}
