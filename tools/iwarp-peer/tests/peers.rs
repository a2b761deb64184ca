// SPDX-License-Identifier: GPL-2.0
//! Two `iwarp-peer` processes talking over loopback: rping with octet-exact
//! verification in many configurations, every injection against a correct
//! peer (TERMINATE codes asserted numerically on both sides), and the
//! failure exits.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use iwarp_core::mpa::{Handshake, MpaConfig, MpaFrameRepr, MAX_FRAME_LEN};

const BIN: &str = env!("CARGO_BIN_EXE_iwarp-peer");
/// Every tool invocation bounds its waits by this (seconds).
const TOOL_TIMEOUT: &str = "5";
/// A process still running after this is hung: the test fails.
const HANG: Duration = Duration::from_secs(30);

/// How a process ended.
#[derive(Debug)]
struct Exit {
    code: i32,
    stdout: String,
    stderr: String,
}

fn command(role: &str, addr_opt: &str, addr: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args([role, addr_opt, addr, "--timeout", TOOL_TIMEOUT])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for `child`, killing it and failing the test if it hangs.
fn finish(mut child: Child, mut stdout: impl Read + Send + 'static) -> Exit {
    let mut stderr = child.stderr.take().expect("stderr");
    let out = thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + HANG;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("iwarp-peer hung");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Exit {
        code: status.code().unwrap_or(-1),
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}

/// A server that printed its address.
struct Server {
    child: Child,
    stdout: BufReader<ChildStdout>,
    addr: String,
}

fn server(host: &str, args: &[&str]) -> Server {
    let mut child = command("server", "--listen", &format!("{host}:0"), args)
        .spawn()
        .expect("spawn server");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("server output");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("server did not listen: {line:?}"))
        .to_string();
    Server {
        child,
        stdout,
        addr,
    }
}

impl Server {
    fn finish(self) -> Exit {
        finish(self.child, self.stdout)
    }
}

fn client(addr: &str, args: &[&str]) -> Exit {
    let mut child = command("client", "--connect", addr, args)
        .spawn()
        .expect("spawn client");
    let stdout = child.stdout.take().expect("stdout");
    finish(child, stdout)
}

/// Runs a server with `s` and a client with `c` against it.
fn pair_on(host: &str, s: &[&str], c: &[&str]) -> (Exit, Exit) {
    let srv = server(host, s);
    let cl = client(&srv.addr, c);
    (srv.finish(), cl)
}

fn pair(s: &[&str], c: &[&str]) -> (Exit, Exit) {
    pair_on("127.0.0.1", s, c)
}

fn assert_ok(e: &Exit, what: &str) {
    assert_eq!(e.code, 0, "{what} failed: {e:#?}");
}

/// Both sides ran `count` verified pings of `size` octets.
fn assert_rping(s: &Exit, c: &Exit, count: u32, size: usize) {
    assert_ok(s, "server");
    assert_ok(c, "client");
    let want = format!("rping: {count} pings of {size} octets, data verified");
    assert!(s.stdout.contains(&want), "server: {s:#?}");
    assert!(c.stdout.contains(&want), "client: {c:#?}");
}

/// The numeric (layer, type, code) after the first "TERMINATE " in `text`.
fn term_code(text: &str) -> Option<(u8, u8, u8)> {
    let rest = &text[text.find("TERMINATE ")? + "TERMINATE ".len()..];
    let word = rest.split_whitespace().next()?;
    let mut it = word.split('/');
    let l = it.next()?.parse().ok()?;
    let t = it.next()?.parse().ok()?;
    let c = u8::from_str_radix(it.next()?.strip_prefix("0x")?, 16).ok()?;
    Some((l, t, c))
}

#[test]
fn rping_sizes_counts_and_crc() {
    let cases: &[(&str, u32, &str)] = &[
        ("1", 3, "off"),
        ("4096", 2, "off"),
        ("4096", 2, "on"),
        ("1m", 2, "off"),
        ("1m", 1, "on"),
    ];
    for &(size, count, crc) in cases {
        let n = count.to_string();
        let (s, c) = pair(
            &["--verify", "--size", size, "--count", &n],
            &["--verify", "--size", size, "--count", &n, "--crc", crc],
        );
        let bytes = match size {
            "1m" => 1 << 20,
            s => s.parse().unwrap(),
        };
        assert_rping(&s, &c, count, bytes);
        let want = format!("CRC {crc}");
        assert!(
            c.stdout.contains(&want),
            "CRC not negotiated as asked: {c:#?}"
        );
        assert!(
            s.stdout.contains(&want),
            "CRC not negotiated as asked: {s:#?}"
        );
    }
}

#[test]
fn rping_with_markers() {
    // Markers asked by one side, then by both, with CRC covering them.
    let (s, c) = pair(
        &["--verify", "--size", "70000"],
        &["--verify", "--size", "70000", "--markers"],
    );
    assert_rping(&s, &c, 1, 70000);
    assert!(c.stdout.contains("markers rx true tx false"), "{c:#?}");
    let (s, c) = pair(
        &["--verify", "--size", "4097", "--markers"],
        &[
            "--verify",
            "--size",
            "4097",
            "--markers",
            "--crc",
            "on",
            "--count",
            "3",
        ],
    );
    assert_rping(&s, &c, 3, 4097);
    assert!(c.stdout.contains("markers rx true tx true"), "{c:#?}");
}

#[test]
fn rping_mpa_revisions() {
    let (s, c) = pair(
        &["--verify", "--mpa-rev", "1"],
        &["--verify", "--count", "2"],
    );
    assert_rping(&s, &c, 2, 64);
    assert!(
        c.stdout.contains("MPA rev 1") && c.stdout.contains("enhanced false"),
        "{c:#?}"
    );
    let (s, c) = pair(&["--verify"], &["--verify", "--count", "2"]);
    assert_rping(&s, &c, 2, 64);
    assert!(
        c.stdout.contains("MPA rev 2") && c.stdout.contains("enhanced true"),
        "{c:#?}"
    );
}

#[test]
fn rping_peer_to_peer_rtr_types() {
    for rtr in ["write", "read", "send"] {
        let (s, c) = pair(
            &["--verify", "--p2p", "--rtr", rtr],
            &["--verify", "--p2p", "--rtr", rtr],
        );
        assert_rping(&s, &c, 1, 64);
        let want = format!("RTR Some({}{})", rtr[..1].to_uppercase(), &rtr[1..]);
        assert!(
            c.stdout.contains(&want) && s.stdout.contains(&want),
            "{c:#?} {s:#?}"
        );
    }
}

#[test]
fn rping_over_ipv6() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback: skipped");
        return;
    }
    let (s, c) = pair_on(
        "[::1]",
        &["--verify", "--size", "4k"],
        &["--verify", "--size", "4k", "--count", "2"],
    );
    assert_rping(&s, &c, 2, 4096);
    assert!(c.stdout.contains("connected to [::1]:"), "{c:#?}");
}

/// Kinds attacking the correct peer from the client side, with the
/// (layer, type, code) it must answer.
const CLIENT_INJECTIONS: &[(&str, (u8, u8, u8))] = &[
    ("bad-crc", (2, 0, 0x02)),
    ("bad-ddp-version", (1, 2, 0x06)),
    ("bad-rdmap-version", (0, 2, 0x05)),
    ("unknown-opcode", (0, 2, 0x06)),
    ("invalid-stag", (1, 1, 0x00)),
    ("send-too-long", (1, 2, 0x05)),
    ("msn-gap", (1, 2, 0x03)),
    ("truncated-fpdu", (2, 0, 0x01)),
];

/// Kinds needing the victim's buffer advertisement: injected by the server.
const SERVER_INJECTIONS: &[(&str, (u8, u8, u8))] = &[
    ("write-out-of-bounds", (1, 1, 0x01)),
    ("read-out-of-bounds", (0, 1, 0x01)),
    ("invalid-stag", (1, 1, 0x00)),
    ("msn-gap", (1, 2, 0x03)),
];

fn expect_arg(code: (u8, u8, u8)) -> String {
    format!("{}:{}:{:#04x}", code.0, code.1, code.2)
}

/// The injector saw `code` and exited 0; the victim sent `code`, exited
/// non-zero (a TERMINATE is an error) and did not hang.
fn assert_injection(kind: &str, injector: &Exit, victim: &Exit, code: (u8, u8, u8)) {
    assert_ok(injector, kind);
    assert_eq!(
        term_code(&injector.stdout),
        Some(code),
        "{kind}: injector saw {injector:#?}"
    );
    assert_eq!(victim.code, 1, "{kind}: victim {victim:#?}");
    assert_eq!(
        term_code(&victim.stderr),
        Some(code),
        "{kind}: victim sent {victim:#?}"
    );
}

#[test]
fn every_injection_from_the_client() {
    for &(kind, code) in CLIENT_INJECTIONS {
        let exp = expect_arg(code);
        let (victim, injector) = pair(&["--verify"], &["--inject", kind, "--expect-term", &exp]);
        assert_injection(kind, &injector, &victim, code);
    }
}

#[test]
fn every_injection_from_the_server() {
    for &(kind, code) in SERVER_INJECTIONS {
        let exp = expect_arg(code);
        let (injector, victim) = pair(
            &["--inject", kind, "--expect-term", &exp],
            &["--verify", "--size", "4k"],
        );
        assert_injection(kind, &injector, &victim, code);
    }
}

#[test]
fn crafted_frames_are_framed_correctly_with_markers_and_crc() {
    // With markers and CRC in both directions the victim must still find
    // the injected header fault, not a framing fault.
    for &(kind, code) in &CLIENT_INJECTIONS[..5] {
        let (victim, injector) = pair(
            &["--markers", "--crc", "on"],
            &["--markers", "--inject", kind, "--expect-term", "rfc"],
        );
        assert_injection(kind, &injector, &victim, code);
    }
}

#[test]
fn trickled_frame_is_accepted() {
    let (s, c) = pair(
        &["--verify"],
        &["--verify", "--inject", "trickle", "--expect-term", "none"],
    );
    assert_ok(&c, "trickle client");
    assert!(c.stdout.contains("inject trickle: run completed"), "{c:#?}");
    assert!(
        s.stdout
            .contains("rping: 1 pings of 64 octets, data verified"),
        "{s:#?}"
    );
    let (s, c) = pair(&["--inject", "trickle", "--verify"], &["--verify"]);
    assert_ok(&s, "trickle server");
    assert!(
        c.stdout
            .contains("rping: 1 pings of 64 octets, data verified"),
        "{c:#?}"
    );
}

#[test]
fn unexpected_reaction_fails_the_injector() {
    let (_, injector) = pair(&[], &["--inject", "msn-gap", "--expect-term", "1:1:0"]);
    assert_eq!(injector.code, 1, "{injector:#?}");
    assert!(
        injector.stderr.contains("differs from --expect-term"),
        "{injector:#?}"
    );
    let (_, injector) = pair(&[], &["--inject", "msn-gap", "--expect-term", "close"]);
    assert_eq!(injector.code, 1, "{injector:#?}");
}

#[test]
fn absent_peer_fails() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = client(&format!("127.0.0.1:{port}"), &[]);
    assert_eq!(c.code, 1, "{c:#?}");
    assert!(
        c.stderr.contains(&format!("connect to 127.0.0.1:{port}")),
        "{c:#?}"
    );
}

#[test]
fn verification_failure_is_reported() {
    let (s, c) = pair(
        &["--corrupt-echo", "--size", "4k"],
        &["--verify", "--size", "4k"],
    );
    assert_ok(&s, "server");
    assert_eq!(c.code, 1, "{c:#?}");
    assert!(
        c.stderr
            .contains("data mismatch in ping 0 echo at offset 2048"),
        "{c:#?}"
    );
}

#[test]
fn handshake_reject_fails_the_client() {
    let (s, c) = pair(
        &["--reject", "--private-data", "cafe"],
        &["--private-data", "0102"],
    );
    assert_ok(&s, "server");
    assert!(s.stdout.contains("rejected the connection"), "{s:#?}");
    assert_eq!(c.code, 1, "{c:#?}");
    assert!(
        c.stderr
            .contains("rejected by the peer (private data: cafe)"),
        "{c:#?}"
    );
    // A policy conflict is rejected too, and both sides fail.
    let (s, c) = pair(&["--crc", "never"], &["--crc", "on"]);
    assert_eq!((s.code, c.code), (1, 1), "{s:#?} {c:#?}");
    assert!(s.stderr.contains("CRC policy mismatch"), "{s:#?}");
}

#[test]
fn bad_command_line_exits_2() {
    let out = Command::new(BIN)
        .args(["client", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown option --bogus"));
}

#[test]
fn data_before_the_reply_is_rejected() {
    // A raw initiator sends its Request and, in the same write, FPDU octets.
    let srv = server("127.0.0.1", &[]);
    let mut sock = TcpStream::connect(&srv.addr).unwrap();
    let mut frame = [0u8; MAX_FRAME_LEN];
    let (_, n) = Handshake::initiator(&MpaConfig::default(), &mut frame).unwrap();
    let mut wire = frame[..n].to_vec();
    wire.extend_from_slice(&[0u8; 8]);
    sock.write_all(&wire).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = Vec::new();
    let _ = sock.read_to_end(&mut reply);
    let (repr, _) = MpaFrameRepr::parse(&reply).expect("an MPA Reply");
    assert!(repr.flags.reject, "{repr:?}");
    let e = srv.finish();
    assert_eq!(e.code, 1, "{e:#?}");
    assert!(
        e.stderr.contains("data received before the MPA Reply"),
        "{e:#?}"
    );
}
