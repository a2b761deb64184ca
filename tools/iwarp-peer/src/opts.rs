// SPDX-License-Identifier: GPL-2.0
//! Command-line options (hand-rolled parser, no dependencies).

use std::time::Duration;

use iwarp_core::mpa::{CrcPolicy, Revision, Rtr, RtrSet};

use crate::conn::MpaOptions;
use crate::error::{Error, Result};
use crate::inject::{Expect, InjectKind};
use crate::rping::RpingOptions;

/// Usage text.
pub const USAGE: &str = "\
usage: iwarp-peer server --listen ADDR:PORT [OPTIONS]
       iwarp-peer client --connect ADDR:PORT [OPTIONS]
       iwarp-peer fuzz --connect ADDR:PORT [FUZZ OPTIONS]   (fuzz --help)

The client is the MPA initiator, the server the MPA responder. IPv6
literals are written [::1]:PORT; port 0 picks a free port (the server
prints `listening on ADDR`).

Application:
  --mode rping|handshake|recv
                          rping protocol (default), MPA handshake only, or
                          the handshake and one Send from the peer (of at
                          most --size octets; its length is printed)
  --count N               client: pings to run (0: forever; default 1);
                          server: fail unless exactly N pings (default 0: any)
  --size BYTES            rping buffer size, suffix k/m for KiB/MiB (default 64)
  --verify                verify data octet for octet (client: like rping -V;
                          server: the data read against the rping pattern)
  --corrupt-echo          server: corrupt the echoed data (tests verification)
MPA:
  --mpa-rev 1|2           highest MPA revision (default 2)
  --crc off|on|never|require
                          off: use CRC only if the peer asks (siw default);
                          on/require: ask for CRC; never: refuse CRC
  --markers               ask the peer to insert markers into what we receive
  --no-markers-tx         refuse a peer asking for markers (as siw does)
  --no-enhanced           no RFC 6581 IRD/ORD block in revision 2
  --strict                refuse a peer differing in revision, CRC, enhanced
  --ird N --ord N         inbound/outbound RDMA Read depth (default 1/1)
  --p2p                   peer-to-peer mode (initiator asks, responder requires)
  --rtr LIST|none         RTR types offered/accepted: write,read,send
                          (default write,read); none disables P2P
  --rtr-delay MS          client in P2P mode: wait MS before sending the
                          RTR, and fail if the server sent anything meanwhile
  --private-data HEX      private data of the Request/Reply
  --reject                server: reject the connection
Hostile peer:
  --inject KIND           bad-crc bad-ddp-version bad-rdmap-version
                          unknown-opcode invalid-stag write-out-of-bounds
                          read-out-of-bounds send-too-long msn-gap
                          truncated-fpdu trickle
  --inject-len N          length of the send-too-long Send (default 65536)
  --expect-term WHAT      LAYER:TYPE:CODE, a name (see README), close, none,
                          or rfc (what RFC 5040/5041/5044 prescribe);
                          exit 0 only if it is what came back
General:
  --timeout SECS          bound on every wait (default 10)
  -v                      verbose
";

/// Which side of the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Connect to this address (MPA initiator).
    Client(String),
    /// Listen on this address (MPA responder).
    Server(String),
}

/// The application run over the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The `rping` protocol.
    Rping,
    /// Only the MPA handshake, then a graceful close.
    Handshake,
    /// The handshake, then one Send from the peer, then a graceful close.
    Recv,
}

/// Everything the command line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Client or server.
    pub role: Role,
    /// The application.
    pub mode: Mode,
    /// MPA settings.
    pub mpa: MpaOptions,
    /// rping settings.
    pub rping: RpingOptions,
    /// Hostile frame to send.
    pub inject: Option<InjectKind>,
    /// Length of `send-too-long`.
    pub inject_len: u32,
    /// Expected reaction to the injection.
    pub expect: Option<Expect>,
    /// Bound on every wait.
    pub timeout: Duration,
    /// Client in P2P mode: how long to wait, silent, before the RTR.
    pub rtr_delay: Option<Duration>,
    /// Verbose output.
    pub verbose: bool,
}

fn usage(m: impl Into<String>) -> Error {
    Error::Usage(m.into())
}

fn number<T: std::str::FromStr>(opt: &str, v: &str) -> Result<T> {
    v.parse()
        .map_err(|_| usage(format!("{opt}: bad number {v}")))
}

fn size(v: &str) -> Result<usize> {
    let (digits, mult) = match v.char_indices().last() {
        Some((i, 'k' | 'K')) => (&v[..i], 1024),
        Some((i, 'm' | 'M')) => (&v[..i], 1024 * 1024),
        _ => (v, 1),
    };
    let n: usize = number("--size", digits)?;
    match n.checked_mul(mult) {
        Some(s) if s > 0 && u32::try_from(s).is_ok() => Ok(s),
        _ => Err(usage(format!("--size {v}: must be 1 to 4 GiB - 1"))),
    }
}

/// Parses a hex string (optional `0x`, no separators).
pub fn hex(v: &str) -> Result<Vec<u8>> {
    let v = v.strip_prefix("0x").unwrap_or(v);
    if !v.len().is_multiple_of(2) {
        return Err(usage("--private-data: odd number of hex digits"));
    }
    (0..v.len())
        .step_by(2)
        .map(|i| {
            v.get(i..i + 2)
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| usage(format!("--private-data: bad hex {v}")))
        })
        .collect()
}

fn crc(v: &str) -> Result<CrcPolicy> {
    match v {
        "off" => Ok(CrcPolicy::PreferOff),
        "on" | "require" => Ok(CrcPolicy::On),
        "never" => Ok(CrcPolicy::Off),
        _ => Err(usage(format!("--crc {v}: want off, on, never or require"))),
    }
}

fn rtr_set(v: &str) -> Result<RtrSet> {
    if v == "none" {
        return Ok(RtrSet::EMPTY);
    }
    v.split(',').try_fold(RtrSet::EMPTY, |set, t| {
        let r = match t {
            "write" => Rtr::Write,
            "read" => Rtr::Read,
            "send" => Rtr::Send,
            _ => return Err(usage(format!("--rtr: unknown type {t}"))),
        };
        Ok(set.with(r))
    })
}

/// Iterator over arguments that hands out option values.
struct Args<'a> {
    it: std::slice::Iter<'a, String>,
}

impl<'a> Args<'a> {
    fn value(&mut self, opt: &str) -> Result<&'a str> {
        self.it
            .next()
            .map(String::as_str)
            .ok_or_else(|| usage(format!("{opt} needs a value")))
    }
}

impl Options {
    /// Parses the arguments after the program name.
    pub fn parse(argv: &[String]) -> Result<Self> {
        let (cmd, rest) = argv
            .split_first()
            .ok_or_else(|| usage("missing client or server"))?;
        let mut o = Options {
            role: Role::Client(String::new()),
            mode: Mode::Rping,
            mpa: MpaOptions::default(),
            rping: RpingOptions::default(),
            inject: None,
            inject_len: 65536,
            expect: None,
            timeout: Duration::from_secs(10),
            rtr_delay: None,
            verbose: false,
        };
        let mut addr = None;
        let mut crc_given = false;
        let mut expect_rfc = false;
        let mut count = None;
        let mut args = Args { it: rest.iter() };
        while let Some(opt) = args.it.next() {
            let opt = opt.as_str();
            match opt {
                "--listen" if cmd == "server" => addr = Some(args.value(opt)?.to_string()),
                "--connect" if cmd == "client" => addr = Some(args.value(opt)?.to_string()),
                "--mode" => {
                    o.mode = match args.value(opt)? {
                        "rping" => Mode::Rping,
                        "handshake" => Mode::Handshake,
                        "recv" => Mode::Recv,
                        m => {
                            return Err(usage(format!("--mode {m}: want rping, handshake or recv")))
                        }
                    }
                }
                "--count" => count = Some(number(opt, args.value(opt)?)?),
                "--size" => o.rping.size = size(args.value(opt)?)?,
                "--verify" => o.rping.verify = true,
                "--corrupt-echo" => o.rping.corrupt_echo = true,
                "--mpa-rev" => {
                    o.mpa.revision = match args.value(opt)? {
                        "1" => Revision::V1,
                        "2" => Revision::V2,
                        r => return Err(usage(format!("--mpa-rev {r}: want 1 or 2"))),
                    }
                }
                "--crc" => {
                    o.mpa.crc = crc(args.value(opt)?)?;
                    crc_given = true;
                }
                "--markers" => o.mpa.markers_rx = true,
                "--no-markers-tx" => o.mpa.markers_tx = false,
                "--no-enhanced" => o.mpa.enhanced = false,
                "--strict" => o.mpa.strict = true,
                "--ird" => o.mpa.ird = number(opt, args.value(opt)?)?,
                "--ord" => o.mpa.ord = number(opt, args.value(opt)?)?,
                "--p2p" => o.mpa.p2p = true,
                "--rtr" => o.mpa.rtr = rtr_set(args.value(opt)?)?,
                "--rtr-delay" if cmd == "client" => {
                    o.rtr_delay = Some(Duration::from_millis(number(opt, args.value(opt)?)?))
                }
                "--private-data" => o.mpa.private_data = hex(args.value(opt)?)?,
                "--reject" => o.mpa.reject = true,
                "--inject" => {
                    let k = args.value(opt)?;
                    let kind = InjectKind::parse(k)
                        .ok_or_else(|| usage(format!("--inject {k}: unknown kind")))?;
                    o.inject = Some(kind);
                }
                "--inject-len" => o.inject_len = number(opt, args.value(opt)?)?,
                "--expect-term" => match args.value(opt)? {
                    "rfc" => expect_rfc = true,
                    v => o.expect = Some(Expect::parse(v)?),
                },
                "--timeout" => o.timeout = Duration::from_secs(number(opt, args.value(opt)?)?),
                "-v" | "--verbose" => o.verbose = true,
                _ => return Err(usage(format!("unknown option {opt} for {cmd}"))),
            }
        }
        let addr = addr.ok_or_else(|| usage(format!("{cmd} needs --listen or --connect")))?;
        o.role = match cmd.as_str() {
            "server" => Role::Server(addr),
            "client" => Role::Client(addr),
            c => return Err(usage(format!("unknown command {c}"))),
        };
        o.rping.count = count.unwrap_or(u32::from(cmd == "client"));
        o.rping.verbose = o.verbose;
        if o.inject == Some(InjectKind::BadCrc) && !crc_given {
            o.mpa.crc = CrcPolicy::On;
        }
        if expect_rfc {
            let k = o
                .inject
                .ok_or_else(|| usage("--expect-term rfc needs --inject"))?;
            o.expect = Some(k.expected());
        }
        if o.expect.is_some() && o.inject.is_none() {
            return Err(usage("--expect-term needs --inject"));
        }
        if o.mpa.rtr.is_empty() {
            o.mpa.p2p = false;
        }
        if o.rtr_delay.is_some() && !o.mpa.p2p {
            return Err(usage("--rtr-delay needs --p2p"));
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp_core::terminate::{TaggedCode, TermCode};

    fn parse(s: &str) -> Result<Options> {
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        Options::parse(&v)
    }

    #[test]
    fn rtr_delay_needs_p2p_and_a_client() {
        let o = parse("client --connect 10.0.0.1:1 --p2p --rtr read --rtr-delay 250 --mode recv")
            .unwrap();
        assert_eq!(o.rtr_delay, Some(Duration::from_millis(250)));
        assert_eq!((o.mode, o.mpa.rtr), (Mode::Recv, RtrSet::only(Rtr::Read)));
        assert!(parse("client --connect 10.0.0.1:1 --rtr-delay 250").is_err());
        assert!(parse("client --connect 10.0.0.1:1 --p2p --rtr none --rtr-delay 250").is_err());
        assert!(parse("server --listen 0.0.0.0:1 --p2p --rtr-delay 250").is_err());
    }

    #[test]
    fn defaults_are_siw_like() {
        let o = parse("client --connect [::1]:7174").unwrap();
        assert_eq!(o.role, Role::Client("[::1]:7174".into()));
        assert_eq!(o.mpa.crc, CrcPolicy::PreferOff);
        assert_eq!(
            (o.mpa.ird, o.mpa.ord, o.rping.count, o.rping.size),
            (1, 1, 1, 64)
        );
        assert!(o.mpa.enhanced && !o.mpa.markers_rx && !o.mpa.p2p);
    }

    #[test]
    fn options_parse() {
        let o = parse(
            "server --listen 0.0.0.0:0 --size 1m --crc on --rtr send --p2p \
             --private-data 0x01ff --inject invalid-stag --expect-term 1:1:0",
        )
        .unwrap();
        assert_eq!(o.rping.size, 1 << 20);
        assert_eq!(o.rping.count, 0);
        assert_eq!(o.mpa.private_data, vec![1, 0xff]);
        assert_eq!(o.mpa.rtr, RtrSet::only(Rtr::Send));
        assert_eq!(
            o.expect,
            Some(Expect::Term(TermCode::DdpTagged(TaggedCode::InvalidStag)))
        );
        let o = parse("client --connect a:1 --inject bad-crc --expect-term rfc").unwrap();
        assert_eq!(o.mpa.crc, CrcPolicy::On);
        assert_eq!(o.expect, Some(InjectKind::BadCrc.expected()));
    }

    #[test]
    fn bad_options_are_refused() {
        for bad in [
            "client",
            "client --listen x:1",
            "server --listen x:1 --crc maybe",
            "server --listen x:1 --private-data abc",
            "server --listen x:1 --expect-term 9:9:9 --inject msn-gap",
            "server --listen x:1 --expect-term close",
            "server --listen x:1 --size 0",
            "server --listen x:1 --inject nonsense",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
