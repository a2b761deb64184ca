// SPDX-License-Identifier: GPL-2.0
//! `iwarp-peer`: command-line front end; see `--help` and the README.

use std::io::Write;
use std::process::ExitCode;

use iwarp_peer::conn::{self, Accepted, Established, Listener};
use iwarp_peer::inject;
use iwarp_peer::opts::{Mode, Options, Role, USAGE};
use iwarp_peer::qp::Qp;
use iwarp_peer::rping;
use iwarp_peer::{Error, Result};

/// Exit status of a failed run (usage errors exit with 2).
const FAILURE: u8 = 1;

fn describe(est: &Established, verbose: bool) -> String {
    let n = &est.negotiated;
    let pd = &est.peer_private_data;
    let pd_hex: String = if verbose {
        pd.iter().map(|b| format!("{b:02x}")).collect()
    } else {
        String::new()
    };
    format!(
        "connected to {}: MPA rev {}, CRC {}, markers rx {} tx {}, enhanced {}, IRD {} ORD {}, RTR {:?}, peer private data {} octets{}{}",
        est.peer,
        n.revision.to_wire(),
        if n.crc { "on" } else { "off" },
        n.markers_rx,
        n.markers_tx,
        n.enhanced,
        n.ird,
        n.ord,
        n.rtr,
        pd.len(),
        if pd_hex.is_empty() { "" } else { ": " },
        pd_hex
    )
}

/// Establishes the connection in the configured role; `None` when the
/// server rejected it as asked.
fn establish(o: &Options) -> Result<Option<Established>> {
    match &o.role {
        Role::Client(addr) => conn::connect(addr, &o.mpa, o.timeout).map(Some),
        Role::Server(addr) => {
            let l = Listener::bind(addr)?;
            println!("listening on {}", l.local_addr()?);
            let _ = std::io::stdout().flush();
            match conn::respond(l.accept(o.timeout)?, &o.mpa)? {
                Accepted::Established(est) => Ok(Some(est)),
                Accepted::Rejected(_) => {
                    println!("rejected the connection");
                    Ok(None)
                }
            }
        }
    }
}

fn run(o: &Options) -> Result<bool> {
    let Some(est) = establish(o)? else {
        return Ok(true);
    };
    println!("{}", describe(&est, o.verbose));
    if let Some(d) = o.rtr_delay {
        est.expect_silence(d, o.timeout)?;
        println!(
            "nothing from the responder in {} ms before our RTR",
            d.as_millis()
        );
    }
    let mut qp = Qp::new(est)?;
    let server = matches!(o.role, Role::Server(_));
    if let Some(kind) = o.inject {
        let outcome = inject::run(&mut qp, kind, server, &o.rping, o.inject_len);
        println!("inject {kind}: {outcome}");
        return Ok(match o.expect {
            Some(e) => outcome.matches(e),
            None => !matches!(
                outcome,
                inject::Outcome::Timeout | inject::Outcome::Failed(_)
            ),
        });
    }
    match o.mode {
        Mode::Handshake => qp.close(),
        Mode::Recv => {
            qp.post_recv(o.rping.size);
            let data = qp.wait_recv()?;
            println!("received a Send of {} octets", data.len());
            qp.close();
        }
        Mode::Rping => {
            let s = if server {
                rping::server(&mut qp, &o.rping)?
            } else {
                rping::client(&mut qp, &o.rping)?
            };
            println!(
                "rping: {} pings of {} octets{}",
                s.pings,
                o.rping.size,
                if s.verified { ", data verified" } else { "" }
            );
        }
    }
    Ok(true)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("fuzz") {
        return ExitCode::from(iwarp_peer::fuzz::main(&argv[1..]));
    }
    if argv.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let o = match Options::parse(&argv) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("iwarp-peer: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("iwarp-peer: the reaction differs from --expect-term");
            ExitCode::from(FAILURE)
        }
        Err(e) => {
            eprintln!("iwarp-peer: error: {e}");
            if let Error::Mismatch { .. } = e {
                eprintln!("iwarp-peer: data verification failed");
            }
            ExitCode::from(FAILURE)
        }
    }
}
