// SPDX-License-Identifier: GPL-2.0
//! The fuzzer against this tool's own server role (a correct RDMA peer
//! built on the same core), served in-process one thread per connection
//! like `rping -s -P`: every case of every family must pass, i.e. draw
//! the RFC code. Then the fuzzer against broken servers (one that closes
//! at once, one that never answers, none at all) must classify the
//! outcomes and report them, and the command line must print the summary
//! and write the JSON report.

use std::io::Read;
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use iwarp_peer::conn::{self, Accepted, Listener, MpaOptions};
use iwarp_peer::fuzz::{
    self, generate, run_case, Family, FuzzOptions, Limit, Outcome, Timing, Verdict,
};
use iwarp_peer::qp::Qp;
use iwarp_peer::rping::{self, RpingOptions};

const BIN: &str = env!("CARGO_BIN_EXE_iwarp-peer");

/// How long the server waits for octets before it gives up on a
/// connection (it must outlast the fuzzer's stalls: trickle up to 3 s).
const SERVER_WAIT: Duration = Duration::from_secs(4);

fn timing() -> Timing {
    Timing {
        timeout: Duration::from_secs(6),
        quiet: Duration::from_millis(150),
        stall_timeout: Duration::from_secs(8),
        size: 64,
        settle: Duration::ZERO,
        le_terminate: false,
    }
}

/// A multi-connection rping server on 127.0.0.1 (this tool's server
/// role, a thread per connection).
struct PeerServer {
    addr: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeerServer {
    fn start(mpa: MpaOptions) -> Self {
        let l = Listener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("address").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let Ok(stream) = l.accept(Duration::from_millis(50)) else {
                    continue;
                };
                let mpa = mpa.clone();
                thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(SERVER_WAIT));
                    let _ = stream.set_write_timeout(Some(SERVER_WAIT));
                    let Ok(Accepted::Established(est)) = conn::respond(stream, &mpa) else {
                        return;
                    };
                    let Ok(mut qp) = Qp::new(est) else { return };
                    let o = RpingOptions {
                        count: 0,
                        ..RpingOptions::default()
                    };
                    let _ = rping::server(&mut qp, &o);
                });
            }
        });
        PeerServer {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn options(addr: &str, limit: Limit, families: Vec<Family>) -> FuzzOptions {
    FuzzOptions {
        target: addr.to_string(),
        seed: 11,
        limit,
        families,
        jobs: 8,
        report: None,
        timing: timing(),
        verbose: false,
    }
}

fn no_log(_: &str) {}

#[test]
fn every_family_draws_the_rfc_reaction_from_a_correct_peer() {
    let srv = PeerServer::start(MpaOptions::default());
    let start = Instant::now();
    // Four cases of each family (a seed per family, for variety), and a
    // flip confined to payload and CRC (which must draw the CRC error);
    // all connections in parallel.
    let mut cases: Vec<_> = Family::ALL
        .iter()
        .enumerate()
        .flat_map(|(i, &f)| (0..4).map(move |k| generate(99 + i as u64, k, &[f])))
        .collect();
    let payload_flip = (0..)
        .map(|k| generate(5, k, &[Family::Flip]))
        .find(|c| {
            matches!(
                c.plan,
                fuzz::Plan::Flip {
                    payload_only: true,
                    ..
                }
            )
        })
        .expect("a payload-only flip");
    cases.push(payload_flip);
    let t = timing();
    let records: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = cases
            .iter()
            .map(|c| s.spawn(|| run_case(&srv.addr, &t, c)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("case")).collect()
    });
    let bad: Vec<String> = records
        .iter()
        .filter(|r| r.verdict != Verdict::Pass)
        .map(|r| {
            format!(
                "{} case {}: {} -> {} (expected {})",
                r.case.family,
                r.case.index,
                r.sent,
                r.outcome,
                r.case.expect()
            )
        })
        .collect();
    for r in &records {
        eprintln!("{}: {} -> {}", r.case.family, r.sent, r.outcome.label());
    }
    assert!(bad.is_empty(), "not passed:\n{}", bad.join("\n"));
    // The well-defined families really drew TERMINATEs, not closes.
    for r in &records {
        if let fuzz::Expect::Term(_) = r.case.expect() {
            assert!(matches!(r.outcome, Outcome::Terminate(_)), "{r:?}");
        }
    }
    eprintln!(
        "{} cases in {:.1} s",
        records.len(),
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn a_peer_asking_for_markers_gets_a_wrong_one_and_terminates() {
    let srv = PeerServer::start(MpaOptions {
        markers_rx: true,
        ..MpaOptions::default()
    });
    let case = generate(1, 0, &[Family::MpaMarkers]);
    let r = run_case(&srv.addr, &timing(), &case);
    assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
    match r.outcome {
        Outcome::Terminate(t) => assert_eq!(t.code.wire(), (2, 0, 3)),
        o => panic!("expected the marker TERMINATE, got {o}"),
    }
}

#[test]
fn a_seeded_run_passes_and_summarises() {
    let srv = PeerServer::start(MpaOptions::default());
    let o = options(&srv.addr, Limit::Cases(64), Vec::new());
    let s = fuzz::run(&o, &no_log);
    assert_eq!(s.records.len(), 64);
    assert_eq!(s.exit_code(), 0, "{}", fuzz::summary_text(&o, &s));
    let idx: Vec<u64> = s.records.iter().map(|r| r.case.index).collect();
    assert_eq!(idx, (0..64).collect::<Vec<_>>());
    let text = fuzz::summary_text(&o, &s);
    eprintln!("{text}");
    assert!(text.starts_with("fuzz: seed 11, 64 cases in "), "{text}");
    assert!(text.contains("cases/s): 64 pass, 0 mismatch, 0 fail; outcomes: "));
    let json = fuzz::report_json(&o, &s);
    assert!(json.contains("\"cases\": 64,") && json.contains("\"results\": ["));
    assert_eq!(json.matches("\"case\": ").count(), 64);
}

#[test]
fn outcomes_of_broken_servers_are_classified() {
    // Closes every connection at once.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let closer = thread::spawn(move || {
        for s in l.incoming().take(3) {
            drop(s);
        }
    });
    let mut t = timing();
    t.timeout = Duration::from_secs(2);
    // A close is the right answer to a bad MPA key; after a valid
    // Request the case cannot run, which fails it.
    let r = run_case(&addr, &t, &generate(3, 0, &[Family::MpaBadKey]));
    assert!(
        matches!(r.outcome, Outcome::Closed | Outcome::Reset),
        "{r:?}"
    );
    assert_eq!(r.verdict, Verdict::Pass);
    for f in [Family::MsnGap, Family::Trickle] {
        let r = run_case(&addr, &t, &generate(3, 0, &[f]));
        match &r.outcome {
            Outcome::Error(m) => assert!(m.starts_with("MPA handshake of a valid Request"), "{m}"),
            o => panic!("{f}: {o:?}"),
        }
        assert_eq!(r.verdict, Verdict::Fail, "{f}: {r:?}");
    }
    // Accepts and never answers: the handshake hangs.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr2 = l.local_addr().unwrap().to_string();
    let mute = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 256];
        let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
        while let Ok(n) = s.read(&mut b) {
            if n == 0 {
                break;
            }
        }
    });
    t.timeout = Duration::from_millis(500);
    let r = run_case(&addr2, &t, &generate(3, 0, &[Family::BadCrc]));
    assert!(matches!(r.outcome, Outcome::Hang(_)), "{:?}", r.outcome);
    assert_eq!(r.verdict, Verdict::Fail);
    // Nothing listens: the run breaks off after a few cases.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut o = options(&dead, Limit::Cases(50), Vec::new());
    o.jobs = 1;
    o.timing.timeout = Duration::from_millis(100);
    let s = fuzz::run(&o, &no_log);
    assert_eq!(s.exit_code(), 3);
    assert!(s.records.len() < 10, "{}", s.records.len());
    closer.join().unwrap();
    mute.join().unwrap();
}

#[test]
fn command_line_prints_the_summary_and_writes_the_report() {
    let srv = PeerServer::start(MpaOptions::default());
    let dir = std::env::temp_dir().join(format!("iwarp-peer-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("r.json");
    let out = Command::new(BIN)
        .args([
            "fuzz",
            "--connect",
            &srv.addr,
            "--seed",
            "4",
            "--cases",
            "12",
            "--jobs",
            "4",
            "--quiet-ms",
            "150",
            "--timeout",
            "6",
            "--report",
        ])
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("fuzz: seed 4, 12 cases in "), "{stdout}");
    let json = std::fs::read_to_string(&report).unwrap();
    assert!(json.contains("\"seed\": 4,"), "{json}");
    // One case again, as the reproduction line says.
    let out = Command::new(BIN)
        .args([
            "fuzz",
            "--connect",
            &srv.addr,
            "--seed",
            "4",
            "--case",
            "7",
            "-v",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("case 7 "), "{stdout}");
    assert!(stdout.contains(" 1 cases in "), "{stdout}");
    // Usage errors exit 2.
    let out = Command::new(BIN)
        .args(["fuzz", "--connect", "x:1", "--cases", "1", "--case", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
