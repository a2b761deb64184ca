// SPDX-License-Identifier: GPL-2.0
//! The application protocol of rdma-core's `rping` example
//! (`librdmacm/examples/rping.c`), both roles.
//!
//! One ping, as `rping` runs it:
//!
//! 1. client: fills its *start* buffer with the ping pattern and Sends a
//!    buffer-info message naming it;
//! 2. server: RDMA Reads the whole advertised buffer into its own buffer,
//!    then Sends a 16-octet "go ahead";
//! 3. client: Sends a buffer-info message naming its *sink* buffer;
//! 4. server: RDMA Writes `strlen(data) + 1` octets of what it read into
//!    the sink, then Sends "go ahead";
//! 5. client (`-V`): compares start and sink buffers octet for octet.
//!
//! The buffer-info message is 16 octets, big endian: buffer address (the
//! Tagged Offset, 8), rkey (the STag, 4), size (4). The "go ahead" is a
//! 16-octet Send whose contents are not looked at (the `rping` server sends
//! its zeroed send buffer). Every Send is exactly 16 octets; each side
//! keeps one 16-octet receive posted. The client disconnects after
//! `count` pings; the server treats the disconnect as success.
//!
//! The ping pattern of ping `n` for a buffer of `size` octets: the text
//! `"rdma-ping-<n>: "`, then the letters `A` (65) to `z` (122) cycling,
//! starting at `65 + n % 58`, and a NUL in the last octet.
//! `rping` itself uses 26 to 65535 octets and 64 by default.

use crate::error::{Error, Result};
use crate::qp::{Access, Qp};

/// Length of the buffer-info and "go ahead" messages.
pub const INFO_LEN: usize = 16;

/// The advertisement of an RDMA buffer (`struct rping_rdma_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferInfo {
    /// Tagged Offset of the buffer's first octet.
    pub addr: u64,
    /// STag.
    pub stag: u32,
    /// Size in octets.
    pub size: u32,
}

impl BufferInfo {
    /// The wire form.
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.stag.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Parses a received buffer-info message (exactly 16 octets, as
    /// `rping` insists).
    pub fn decode(data: &[u8]) -> Result<Self> {
        let b: &[u8; INFO_LEN] = data.try_into().map_err(|_| {
            Error::Protocol(format!(
                "buffer-info Send of {} octets, expected {INFO_LEN}",
                data.len()
            ))
        })?;
        let (addr, rest) = b.split_at(8);
        let (stag, size) = rest.split_at(4);
        Ok(BufferInfo {
            addr: u64::from_be_bytes(addr.try_into().unwrap_or_default()),
            stag: u32::from_be_bytes(stag.try_into().unwrap_or_default()),
            size: u32::from_be_bytes(size.try_into().unwrap_or_default()),
        })
    }
}

/// Options of an `rping` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpingOptions {
    /// Pings to run: the client stops after this many (0: forever); the
    /// server, if non-zero, fails unless exactly this many were run.
    pub count: u32,
    /// Buffer size in octets.
    pub size: usize,
    /// Verify data: the client compares the echo with what it sent (as
    /// `rping -V`); the server compares what it read with the pattern.
    pub verify: bool,
    /// Server: corrupt one octet of every echo (to test verification).
    pub corrupt_echo: bool,
    /// Print every ping.
    pub verbose: bool,
}

impl Default for RpingOptions {
    fn default() -> Self {
        RpingOptions {
            count: 1,
            size: 64,
            verify: false,
            corrupt_echo: false,
            verbose: false,
        }
    }
}

/// The ping pattern of ping `ping` for a buffer of `size` octets.
pub fn ping_data(ping: u32, size: usize) -> Vec<u8> {
    let prefix = format!("rdma-ping-{ping}: ");
    let mut v = vec![0u8; size];
    let n = prefix.len().min(size.saturating_sub(1));
    v[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    let mut c = 65 + (ping % 58) as u8;
    for b in v.iter_mut().skip(prefix.len()) {
        *b = c;
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = v.last_mut() {
        *last = 0;
    }
    v
}

/// Octets the server echoes: `strlen(buf) + 1`, at most the buffer.
pub fn echo_len(buf: &[u8]) -> usize {
    buf.iter()
        .position(|&b| b == 0)
        .map_or(buf.len(), |p| p + 1)
}

/// Compares `actual` with `expected` octet for octet.
pub fn verify(what: &str, expected: &[u8], actual: &[u8]) -> Result<()> {
    if let Some(offset) = expected.iter().zip(actual).position(|(e, a)| e != a) {
        return Err(Error::Mismatch {
            what: what.to_string(),
            offset,
            expected: expected[offset],
            actual: actual[offset],
        });
    }
    if expected.len() != actual.len() {
        return Err(Error::Protocol(format!(
            "{what}: {} octets where {} were expected",
            actual.len(),
            expected.len()
        )));
    }
    Ok(())
}

/// What a run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Pings completed.
    pub pings: u32,
    /// Whether the data was verified.
    pub verified: bool,
}

fn advertise(qp: &mut Qp, stag: u32) -> Result<()> {
    let mr = qp.mr(stag)?;
    let info = BufferInfo {
        addr: mr.base(),
        stag,
        size: u32::try_from(mr.len()).map_err(|_| Error::Local("buffer too large".into()))?,
    };
    qp.send(&info.encode())
}

/// Waits for a 16-octet Send and reposts the receive buffer.
fn next_message(qp: &mut Qp) -> Result<Vec<u8>> {
    let data = qp.wait_recv()?;
    qp.post_recv(INFO_LEN);
    if data.len() != INFO_LEN {
        return Err(Error::Protocol(format!(
            "received a Send of {} octets, expected {INFO_LEN}",
            data.len()
        )));
    }
    Ok(data)
}

/// Client role: `count` pings, then disconnect.
pub fn client(qp: &mut Qp, o: &RpingOptions) -> Result<Summary> {
    let start = qp.register(o.size, Access::REMOTE_RW);
    let sink = qp.register(o.size, Access::REMOTE_RW);
    qp.post_recv(INFO_LEN);
    let mut ping = 0u32;
    while o.count == 0 || ping < o.count {
        qp.mr_mut(start)?
            .data_mut()
            .copy_from_slice(&ping_data(ping, o.size));
        advertise(qp, start)?;
        next_message(qp)?;
        advertise(qp, sink)?;
        next_message(qp)?;
        if o.verify {
            let sent = qp.mr(start)?.data();
            verify(&format!("ping {ping} echo"), sent, qp.mr(sink)?.data())?;
        }
        if o.verbose {
            eprintln!(
                "ping {ping}: {} octets{}",
                o.size,
                if o.verify { " verified" } else { "" }
            );
        }
        ping += 1;
    }
    qp.close();
    Ok(Summary {
        pings: ping,
        verified: o.verify,
    })
}

/// Server: waits for the client's first advertisement of a ping; `None`
/// when the client disconnected instead.
pub fn await_advertisement(qp: &mut Qp) -> Result<Option<BufferInfo>> {
    match next_message(qp) {
        Ok(data) => BufferInfo::decode(&data).map(Some),
        Err(Error::PeerClosed) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Registers the server's buffer and posts its receive; returns the STag.
pub fn server_setup(qp: &mut Qp, o: &RpingOptions) -> u32 {
    let stag = qp.register(o.size, Access::REMOTE_RW);
    qp.post_recv(INFO_LEN);
    stag
}

/// Server: one ping after the client advertised `src`.
fn serve_ping(qp: &mut Qp, o: &RpingOptions, buf: u32, ping: u32, src: BufferInfo) -> Result<()> {
    if src.size as usize > o.size {
        return Err(Error::Protocol(format!(
            "client advertised {} octets, the local buffer has {} (use --size)",
            src.size, o.size
        )));
    }
    qp.read(buf, 0, src.size, src.stag, src.addr)?;
    qp.wait_read()?;
    if o.verify {
        let got = &qp.mr(buf)?.data()[..src.size as usize];
        verify(
            &format!("ping {ping} read"),
            &ping_data(ping, src.size as usize),
            got,
        )?;
    }
    qp.send(&[0u8; INFO_LEN])?;
    let sink = BufferInfo::decode(&next_message(qp)?)?;
    let len = echo_len(qp.mr(buf)?.data()).min(sink.size as usize);
    if o.corrupt_echo && len > 0 {
        qp.mr_mut(buf)?.data_mut()[len / 2] ^= 0x20;
    }
    qp.write(buf, 0, len as u32, sink.stag, sink.addr)?;
    qp.send(&[0u8; INFO_LEN])?;
    if o.verbose {
        eprintln!("ping {ping}: read {} octets, echoed {len}", src.size);
    }
    Ok(())
}

/// Server role: serves pings until the client disconnects.
pub fn server(qp: &mut Qp, o: &RpingOptions) -> Result<Summary> {
    let buf = server_setup(qp, o);
    let mut ping = 0u32;
    while let Some(src) = await_advertisement(qp)? {
        serve_ping(qp, o, buf, ping, src)?;
        ping += 1;
    }
    if o.count != 0 && ping != o.count {
        return Err(Error::Protocol(format!(
            "client ran {ping} pings, expected {}",
            o.count
        )));
    }
    Ok(Summary {
        pings: ping,
        verified: o.verify,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_rping() {
        let d = ping_data(0, 32);
        assert_eq!(&d[..14], b"rdma-ping-0: A");
        assert_eq!(d[14..31].to_vec(), (b'B'..=b'R').collect::<Vec<u8>>());
        assert_eq!(d[31], 0);
        assert_eq!(echo_len(&d), 32);
        // The start letter advances per ping and wraps after 'z'.
        assert_eq!(ping_data(57, 20)[14], b'z'); // "rdma-ping-57: " is 14 octets
        assert_eq!(ping_data(58, 20)[14], b'A');
        assert_eq!(ping_data(3, 1), vec![0]);
        assert_eq!(&ping_data(12, 8)[..], b"rdma-pi\0");
    }

    #[test]
    fn info_roundtrip_is_big_endian() {
        let i = BufferInfo {
            addr: 0x0102_0304_0506_0708,
            stag: 0x0a0b_0c0d,
            size: 64,
        };
        let b = i.encode();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 0xa, 0xb, 0xc, 0xd, 0, 0, 0, 64]);
        assert_eq!(BufferInfo::decode(&b).unwrap(), i);
        assert!(BufferInfo::decode(&b[..15]).is_err());
    }

    #[test]
    fn verify_reports_first_difference() {
        let e = verify("x", b"abcd", b"abzd").unwrap_err();
        assert!(matches!(
            e,
            Error::Mismatch {
                offset: 2,
                expected: b'c',
                actual: b'z',
                ..
            }
        ));
        assert!(verify("x", b"abcd", b"abcd").is_ok());
    }
}
