// SPDX-License-Identifier: GPL-2.0
//! Hostile-peer fuzzer (`iwarp-peer fuzz`): connects again and again to
//! an rping server (`rping -s -P`, one connection per case), sends one
//! generated hostile case per connection, and judges the reaction.
//!
//! - [`cases`]: the deterministic case generator (families, parameters,
//!   what a conforming peer must do);
//! - [`session`]: the connection driver on top of the core's transmit
//!   builder and receive parser;
//! - [`exec`]: running one case and judging its outcome;
//! - this module: options, the (optionally parallel) run loop, the
//!   summary and the JSON report.
//!
//! Case `K` of seed `N` is the same on every run, so a failure reproduces
//! with `--seed N --case K`.

pub mod cases;
pub mod exec;
pub mod session;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

pub use cases::{generate, Case, Expect, Family, Plan, Rng};
pub use exec::{judge, run_case, Outcome, Record, Timing, Verdict};

use crate::error::{Error, Result};

/// Usage text of `iwarp-peer fuzz`.
pub const USAGE: &str = "\
usage: iwarp-peer fuzz --connect ADDR:PORT [OPTIONS]

Connects repeatedly to an rping server that accepts many connections
(rping -s -P), sends one hostile case per connection and judges the
reaction against RFC 5040/5041/5044/6581. Exit status: 0 every case
passed, 1 some case failed or mismatched, 2 bad command line, 3 the
server could not be reached (the run broke off).

  --seed N              case generator seed (default: from the clock)
  --cases N             run cases 0..N-1 (default 100)
  --duration SECS       run cases until SECS have passed
  --case K              run only case K (reproduce a failure)
  --families LIST       only these families (comma-separated; see README),
                        or all but those named with a leading -
  --jobs N              connections in parallel (default 1)
  --report FILE         write a JSON report
  --timeout SECS        bound on every wait for a reaction (default 10)
  --quiet-ms MS         wait this long before probing a silent peer (1000)
  --stall-timeout SECS  bound for the peer to drop a stalled MPA Request (20)
  --size BYTES          rping buffer size advertised, at most the server's
                        -S (default 64, rping's default)
  --terminate-order rfc|le-bitfield
                        read TERMINATEs as RFC 5040 lays them out (default)
                        or as upstream siw does on x86 (layer and type
                        nibbles swapped), to compare siw's codes
  --settle-ms MS        pause after the MPA Reply before the case (default
                        0: at once; a pause steps around setup races)
  -v                    one line per case
";

/// How many cases to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Cases `0..n`.
    Cases(u64),
    /// Cases until the time is up.
    Duration(Duration),
    /// Only this case.
    One(u64),
}

/// Options of a fuzz run.
#[derive(Clone, Debug)]
pub struct FuzzOptions {
    /// The rping server.
    pub target: String,
    /// Generator seed.
    pub seed: u64,
    /// Cases to run.
    pub limit: Limit,
    /// Restrict to these families (empty: all).
    pub families: Vec<Family>,
    /// Parallel connections.
    pub jobs: usize,
    /// JSON report path.
    pub report: Option<String>,
    /// Timing and sizes.
    pub timing: Timing,
    /// One line per case.
    pub verbose: bool,
}

fn usage(m: impl Into<String>) -> Error {
    Error::Usage(m.into())
}

fn number<T: std::str::FromStr>(opt: &str, v: Option<&String>) -> Result<T> {
    let v = v.ok_or_else(|| usage(format!("{opt} needs a value")))?;
    v.parse()
        .map_err(|_| usage(format!("{opt}: bad number {v}")))
}

/// `--families`: names to run, or (each with a leading `-`) names to
/// leave out of all of them.
fn families(v: &str) -> Result<Vec<Family>> {
    let mut only = Vec::new();
    let mut without = Vec::new();
    for item in v.split(',') {
        let (list, name) = match item.strip_prefix('-') {
            Some(n) => (&mut without, n),
            None => (&mut only, item),
        };
        list.push(
            Family::parse(name)
                .ok_or_else(|| usage(format!("--families: unknown family {name}")))?,
        );
    }
    if !only.is_empty() && !without.is_empty() {
        return Err(usage("--families: either names or -names, not both"));
    }
    if without.is_empty() {
        return Ok(only);
    }
    Ok(Family::ALL
        .iter()
        .copied()
        .filter(|f| !without.contains(f))
        .collect())
}

impl FuzzOptions {
    /// Parses the arguments after `fuzz`.
    pub fn parse(argv: &[String]) -> Result<Self> {
        let mut target = None;
        let mut seed = None;
        let mut cases = None;
        let mut duration = None;
        let mut one = None;
        let mut o = FuzzOptions {
            target: String::new(),
            seed: 0,
            limit: Limit::Cases(100),
            families: Vec::new(),
            jobs: 1,
            report: None,
            timing: Timing {
                timeout: Duration::from_secs(10),
                quiet: Duration::from_millis(1000),
                stall_timeout: Duration::from_secs(20),
                size: 64,
                settle: Duration::ZERO,
                le_terminate: false,
            },
            verbose: false,
        };
        let mut it = argv.iter();
        while let Some(opt) = it.next() {
            let opt = opt.as_str();
            match opt {
                "--connect" => {
                    target = Some(
                        it.next()
                            .ok_or_else(|| usage("--connect needs a value"))?
                            .clone(),
                    )
                }
                "--seed" => seed = Some(number(opt, it.next())?),
                "--cases" => cases = Some(number(opt, it.next())?),
                "--duration" => duration = Some(number::<u64>(opt, it.next())?),
                "--case" => one = Some(number(opt, it.next())?),
                "--families" => {
                    let v = it.next().ok_or_else(|| usage("--families needs a value"))?;
                    o.families = families(v)?;
                }
                "--jobs" => o.jobs = number(opt, it.next())?,
                "--report" => {
                    o.report = Some(
                        it.next()
                            .ok_or_else(|| usage("--report needs a value"))?
                            .clone(),
                    )
                }
                "--timeout" => o.timing.timeout = Duration::from_secs(number(opt, it.next())?),
                "--quiet-ms" => o.timing.quiet = Duration::from_millis(number(opt, it.next())?),
                "--stall-timeout" => {
                    o.timing.stall_timeout = Duration::from_secs(number(opt, it.next())?)
                }
                "--size" => o.timing.size = number(opt, it.next())?,
                "--terminate-order" => {
                    o.timing.le_terminate = match it.next().map(String::as_str) {
                        Some("rfc") => false,
                        Some("le-bitfield") => true,
                        _ => return Err(usage("--terminate-order: rfc or le-bitfield")),
                    }
                }
                "--settle-ms" => o.timing.settle = Duration::from_millis(number(opt, it.next())?),
                "-v" | "--verbose" => o.verbose = true,
                _ => return Err(usage(format!("unknown option {opt} for fuzz"))),
            }
        }
        o.target = target.ok_or_else(|| usage("fuzz needs --connect"))?;
        o.limit = match (cases, duration, one) {
            (None, None, None) => Limit::Cases(100),
            (Some(n), None, None) => Limit::Cases(n),
            (None, Some(d), None) => Limit::Duration(Duration::from_secs(d)),
            (None, None, Some(k)) => Limit::One(k),
            _ => return Err(usage("give one of --cases, --duration and --case")),
        };
        if o.jobs == 0 || o.jobs > 64 {
            return Err(usage("--jobs: 1 to 64"));
        }
        if o.timing.size == 0 || o.timing.size > 65535 {
            return Err(usage("--size: 1 to 65535 (rping's range)"));
        }
        o.seed = seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        });
        Ok(o)
    }

    /// The command line reproducing case `k`.
    pub fn repro(&self, k: u64) -> String {
        let mut s = format!(
            "iwarp-peer fuzz --connect {} --seed {} --case {k}",
            self.target, self.seed
        );
        if !self.families.is_empty() {
            // The shorter spelling that gives the same pool in the same
            // order (the order matters to the generator).
            let without: Vec<Family> = Family::ALL
                .iter()
                .copied()
                .filter(|f| !self.families.contains(f))
                .collect();
            let v: Vec<String> = if without.len() < self.families.len()
                && Family::ALL
                    .iter()
                    .copied()
                    .filter(|f| !without.contains(f))
                    .eq(self.families.iter().copied())
            {
                without.iter().map(|f| format!("-{}", f.name())).collect()
            } else {
                self.families.iter().map(|f| f.name().to_string()).collect()
            };
            let _ = write!(s, " --families {}", v.join(","));
        }
        if self.timing.size != 64 {
            let _ = write!(s, " --size {}", self.timing.size);
        }
        if self.timing.le_terminate {
            s.push_str(" --terminate-order le-bitfield");
        }
        if !self.timing.settle.is_zero() {
            let _ = write!(s, " --settle-ms {}", self.timing.settle.as_millis());
        }
        s
    }
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Every case run, in case order.
    pub records: Vec<Record>,
    /// Wall time.
    pub elapsed: Duration,
    /// The run broke off (the server could not be reached).
    pub broken: Option<String>,
}

impl Summary {
    /// Cases with this verdict.
    pub fn count(&self, v: Verdict) -> usize {
        self.records.iter().filter(|r| r.verdict == v).count()
    }

    /// Outcome label -> cases.
    pub fn outcomes(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for r in &self.records {
            *m.entry(r.outcome.label()).or_insert(0) += 1;
        }
        m
    }

    /// Cases per second.
    pub fn rate(&self) -> f64 {
        self.records.len() as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    /// The process exit status: 0, 1 (a case did not pass), 3 (broken).
    pub fn exit_code(&self) -> u8 {
        if self.broken.is_some() {
            3
        } else if self.records.iter().any(|r| r.verdict != Verdict::Pass) {
            1
        } else {
            0
        }
    }
}

/// Consecutive cases that could not connect before the run breaks off.
const MAX_CONNECT_FAILURES: usize = 5;

/// One line about a case.
pub fn case_line(o: &FuzzOptions, r: &Record) -> String {
    format!(
        "case {} {} [{}]: {} -> {} (expected {}; {} ms){}",
        r.case.index,
        r.case.family,
        r.verdict.name(),
        r.sent,
        r.outcome,
        r.case.expect(),
        r.elapsed.as_millis(),
        if r.verdict == Verdict::Pass {
            String::new()
        } else {
            format!("\n  reproduce: {}", o.repro(r.case.index))
        }
    )
}

/// Runs the cases `o` asks for; `log` gets a line per case that did not
/// pass (every case with `verbose`) as it finishes.
pub fn run(o: &FuzzOptions, log: &(dyn Fn(&str) + Sync)) -> Summary {
    let start = Instant::now();
    let (first, end, deadline) = match o.limit {
        Limit::Cases(n) => (0, n, None),
        Limit::Duration(d) => (0, u64::MAX, Some(start + d)),
        Limit::One(k) => (k, k.saturating_add(1), None),
    };
    let next = AtomicU64::new(first);
    let records = Mutex::new(Vec::new());
    let refused = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let broken = Mutex::new(None);
    thread::scope(|scope| {
        for _ in 0..o.jobs {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= end {
                    break;
                }
                let case = generate(o.seed, k, &o.families);
                let r = run_case(&o.target, &o.timing, &case);
                if let Outcome::Error(m) = &r.outcome {
                    if m.starts_with("connect") {
                        if refused.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_CONNECT_FAILURES {
                            stop.store(true, Ordering::Relaxed);
                            *broken.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
                                "{MAX_CONNECT_FAILURES} cases in a row could not connect: {m}"
                            ));
                        }
                    } else {
                        refused.store(0, Ordering::Relaxed);
                    }
                } else {
                    refused.store(0, Ordering::Relaxed);
                }
                if o.verbose || r.verdict != Verdict::Pass {
                    log(&case_line(o, &r));
                }
                records.lock().unwrap_or_else(|e| e.into_inner()).push(r);
            });
        }
    });
    let mut records = records.into_inner().unwrap_or_else(|e| e.into_inner());
    records.sort_by_key(|r| r.case.index);
    Summary {
        records,
        elapsed: start.elapsed(),
        broken: broken.into_inner().unwrap_or_else(|e| e.into_inner()),
    }
}

/// The summary line (and a reproduction line per case that did not pass).
pub fn summary_text(o: &FuzzOptions, s: &Summary) -> String {
    let hist: Vec<String> = s
        .outcomes()
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let mut t = format!(
        "fuzz: seed {}, {} cases in {:.1} s ({:.2} cases/s): {} pass, {} mismatch, {} fail; outcomes: {}",
        o.seed,
        s.records.len(),
        s.elapsed.as_secs_f64(),
        s.rate(),
        s.count(Verdict::Pass),
        s.count(Verdict::Mismatch),
        s.count(Verdict::Fail),
        hist.join(", ")
    );
    for r in s.records.iter().filter(|r| r.verdict != Verdict::Pass) {
        let _ = write!(
            t,
            "\n  {} case {} ({}): {} -> {}; reproduce: {}",
            r.verdict.name(),
            r.case.index,
            r.case.family,
            r.sent,
            r.outcome,
            o.repro(r.case.index)
        );
    }
    if let Some(b) = &s.broken {
        let _ = write!(t, "\n  run broken off: {b}");
    }
    t
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The JSON report.
pub fn report_json(o: &FuzzOptions, s: &Summary) -> String {
    let mut j = String::from("{\n");
    let _ = writeln!(j, "  \"target\": {},", json_str(&o.target));
    let _ = writeln!(j, "  \"seed\": {},", o.seed);
    let _ = writeln!(
        j,
        "  \"terminate_order\": {},",
        json_str(if o.timing.le_terminate {
            "le-bitfield"
        } else {
            "rfc"
        })
    );
    let _ = writeln!(j, "  \"settle_ms\": {},", o.timing.settle.as_millis());
    let _ = writeln!(j, "  \"cases\": {},", s.records.len());
    let _ = writeln!(j, "  \"seconds\": {:.3},", s.elapsed.as_secs_f64());
    let _ = writeln!(j, "  \"cases_per_second\": {:.3},", s.rate());
    let _ = writeln!(
        j,
        "  \"verdicts\": {{\"pass\": {}, \"mismatch\": {}, \"fail\": {}}},",
        s.count(Verdict::Pass),
        s.count(Verdict::Mismatch),
        s.count(Verdict::Fail)
    );
    let hist: Vec<String> = s
        .outcomes()
        .iter()
        .map(|(k, v)| format!("{}: {v}", json_str(k)))
        .collect();
    let _ = writeln!(j, "  \"outcomes\": {{{}}},", hist.join(", "));
    let mut fam: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
    for r in &s.records {
        let e = fam.entry(r.case.family.name()).or_default();
        e[r.verdict as usize] += 1;
    }
    let fams: Vec<String> = fam
        .iter()
        .map(|(k, v)| {
            format!(
                "    {}: {{\"pass\": {}, \"mismatch\": {}, \"fail\": {}}}",
                json_str(k),
                v[0],
                v[1],
                v[2]
            )
        })
        .collect();
    let _ = writeln!(j, "  \"families\": {{\n{}\n  }},", fams.join(",\n"));
    let _ = writeln!(
        j,
        "  \"broken\": {},",
        s.broken.as_deref().map_or("null".into(), json_str)
    );
    let recs: Vec<String> = s
        .records
        .iter()
        .map(|r| {
            format!(
                "    {{\"case\": {}, \"family\": {}, \"sent\": {}, \"expected\": {}, \"outcome\": {}, \"label\": {}, \"verdict\": {}, \"ms\": {}, \"reproduce\": {}}}",
                r.case.index,
                json_str(r.case.family.name()),
                json_str(&r.sent),
                json_str(&r.case.expect().to_string()),
                json_str(&r.outcome.to_string()),
                json_str(&r.outcome.label()),
                json_str(r.verdict.name()),
                r.elapsed.as_millis(),
                json_str(&o.repro(r.case.index))
            )
        })
        .collect();
    let _ = writeln!(j, "  \"results\": [\n{}\n  ]", recs.join(",\n"));
    j.push_str("}\n");
    j
}

/// `iwarp-peer fuzz`: runs, prints the summary, writes the report;
/// returns the exit status.
pub fn main(argv: &[String]) -> u8 {
    if argv.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return 0;
    }
    let o = match FuzzOptions::parse(argv) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("iwarp-peer: {e}\n\n{USAGE}");
            return 2;
        }
    };
    println!(
        "fuzz: {} seed {} ({:?}, {} job{})",
        o.target,
        o.seed,
        o.limit,
        o.jobs,
        if o.jobs == 1 { "" } else { "s" }
    );
    let log = |l: &str| println!("{l}");
    let s = run(&o, &log);
    println!("{}", summary_text(&o, &s));
    if let Some(path) = &o.report {
        if let Err(e) = std::fs::write(path, report_json(&o, &s)) {
            eprintln!("iwarp-peer: cannot write {path}: {e}");
            return 3;
        }
    }
    s.exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<FuzzOptions> {
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        FuzzOptions::parse(&v)
    }

    #[test]
    fn options() {
        let o =
            parse("--connect a:1 --seed 5 --duration 30 --jobs 2 --families msn-gap,flip").unwrap();
        assert_eq!(o.seed, 5);
        assert_eq!(o.limit, Limit::Duration(Duration::from_secs(30)));
        assert_eq!(o.families, vec![Family::MsnGap, Family::Flip]);
        assert_eq!(
            o.repro(7),
            "iwarp-peer fuzz --connect a:1 --seed 5 --case 7 --families msn-gap,flip"
        );
        assert_eq!(parse("--connect a:1").unwrap().limit, Limit::Cases(100));
        let o = parse("--connect a:1 --families -flip,-trickle").unwrap();
        assert_eq!(o.families.len(), Family::ALL.len() - 2);
        assert!(!o.families.contains(&Family::Flip) && o.families.contains(&Family::MsnGap));
        assert!(
            o.repro(1).ends_with("--case 1 --families -flip,-trickle"),
            "{}",
            o.repro(1)
        );
        for bad in [
            "--seed 1",
            "--connect a:1 --cases 3 --duration 4",
            "--connect a:1 --families nope",
            "--connect a:1 --jobs 0",
            "--connect a:1 --size 0",
            "--connect a:1 --families flip,-trickle",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_escapes() {
        assert_eq!(json_str("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}
