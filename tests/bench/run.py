#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""make bench, guest side: run inside the perf-kernel VM by scripts/bench.

    tests/bench/run.py              run the matrix, write build/bench/results.json
    tests/bench/run.py --estimate   print "INVOCATIONS SECONDS" of the plan (host, no root)
    tests/bench/run.py --self-test  check the plan's order (host; run by make check)
    tests/bench/run.py --quick      the quick subset (also SIW_RS_BENCH_QUICK=1)

Pairs (server in netns h1 on veth1, client in netns h2 on veth2, see
scripts/topology):

    siw_rs   rs1 (siw_rs)  <-  rs2 (siw_rs)
    siw      siw1 (siw)    <-  siw2 (siw)
    mixed    rs1 (siw_rs)  <-  siw2 (siw)
    tcp      iperf3 -s     <-  iperf3 -c     (same veth, no RDMA)
             tcp_pingpong server <- client (2 B round trips, the latency yardstick)

Two iWARP devices cannot share a netdev here (both drivers' listeners want
the same TCP port, rdma_listen fails), so each pair gets its devices created
before its runs and deleted after. The matrix runs in rounds: round r runs
every test that wants at least r runs, each test on every pair back to back
(the pairs' order rotating from round to round), so the pairs of one row are
measured within seconds of each other: the emulated machine's speed follows
the host's load and moves by a factor of two within minutes, and a row's
pairs measured minutes apart compared two speeds as much as two drivers.

Every invocation has a timeout; a failure becomes an error entry of that run
and the bench goes on. results.json is rewritten after every run, so a VM
that dies half way still leaves what it measured ("complete": false).

Environment: SIW_RS_KO (siw_rs.ko to load), SIW_RS_BENCH_QUICK=1,
SIW_RS_BENCH_RUNS (runs of the headline rows, default 3; quick 1),
SIW_RS_BENCH_RUNS_OTHER (runs of the other rows, default 1),
SIW_RS_BENCH_RUNS_LAT (runs of the 2 B latency rows and the TCP ping-pong,
default 7, at least SIW_RS_BENCH_RUNS; quick: SIW_RS_BENCH_RUNS),
SIW_RS_BENCH_DURATION (perftest -D and iperf3 -t seconds, default 5),
SIW_RS_BENCH_MARGIN (perftest -f, default 1), SIW_RS_BENCH_LAT_ITERS
(latency iterations, default 2000), SIW_RS_BENCH_COMMIT / _DIRTY (from the
host; git in the guest otherwise). For A/B work on a few rows:
SIW_RS_BENCH_ONLY (comma-separated row keys as the report names them, e.g.
"ib_send_bw 64 KiB q1,iperf3"; the rows of the chosen mode only) and
SIW_RS_BENCH_PAIRS (e.g. "siw,mixed"); an unknown name is an error.
SIW_RS_BENCH_IDLE_SERVER=1 runs the servers of ib_write_bw and ib_read_bw
(which only poll for the end of the test) at SCHED_IDLE, see
Documentation/siw_rs/benchmarks.rst.

Only the Python standard library: the guest is the host's root file system,
and /usr/bin/python3 is Debian's.
"""

import datetime
import glob
import json
import math
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "build", "bench")
RAW = os.path.join(OUT, "raw")
WP = os.path.join(REPO, "userspace-provider", "with-provider")
# Built by scripts/bench from tests/bench/tcp_pingpong.c.
TCP_PINGPONG = os.path.join(REPO, "build", "bench-tools", "tcp_pingpong")
SERVER_IP = "10.55.0.1"

# (pair name, (server driver, server device), (client driver, client device))
PAIRS = [
    ("siw_rs", ("siw_rs", "rs1"), ("siw_rs", "rs2")),
    ("siw", ("siw", "siw1"), ("siw", "siw2")),
    ("mixed", ("siw_rs", "rs1"), ("siw", "siw2")),
]

BW_TOOLS = ["ib_write_bw", "ib_read_bw", "ib_send_bw"]
LAT_TOOLS = ["ib_write_lat", "ib_send_lat"]
BW_SIZES = [64, 4096, 65536, 1048576]
LAT_SIZES = [2, 4096]
LAT_KINDS = ("lat", "tcp_lat")
# Bandwidth tools whose server process does nothing but wait (the client's
# Writes and Reads are served by the server's kernel).
PASSIVE_SERVERS = ("ib_write_bw", "ib_read_bw")
TCP_KINDS = ("tcp", "tcp_lat")

# The same kernel-log patterns tests/vm/lib.sh fails a VM test on.
BAD_DMESG = re.compile(
    r"WARNING:|BUG:|KASAN|UBSAN|Oops|general protection|possible recursive locking|"
    r"circular locking|inconsistent lock state|INFO: task .* blocked|rust_panic|"
    r"panicked at|unreferenced object|refcount_t:|list_add corruption|list_del corruption")

# Rough wall time per invocation beyond its measured seconds (process start,
# perftest's clock calibration, RDMA CM connect, teardown) under TCG on the
# perf kernel, measured on a 2-core host; for the estimate only.
OVERHEAD_S = 11.0

# Extra attempts of a run that failed in one of perftest's own ways
# (retry_reason).
RETRIES = 3


def retry_reason(text):
    """Why a failed run is worth another attempt, from its client's output,
    or None. Both are perftest's own failures, not the driver's:
    - "clock": its cycles-per-microsecond regression failed (a busy host
      under TCG; the latency tools then print inf);
    - "relisten": its server destroys its listening id after the connection
      for the exchange of keys and listens anew for the data connection; a
      client that connects in between is refused, as RDMA_CM_EVENT_REJECTED
      (-111) or, from an upstream siw client, which connects its socket
      inside rdma_connect, as "Failed to connect through RDMA CM." with
      ECONNREFUSED (tests/vm/t-50-uverbs.sh, perftest_retry)."""
    if re.search(r"Can't produce a report|Correlation coefficient", text):
        return "clock"
    if "RDMA_CM_EVENT_REJECTED; error: -111" in text or (
            "Failed to connect through RDMA CM" in text and "ERRNO: Connection refused" in text):
        return "relisten"
    return None


def env_int(name, default):
    v = os.environ.get(name, "")
    return int(v) if v.strip() else default


def env_flag(name):
    """Whether NAME is set to something other than empty or 0."""
    return os.environ.get(name, "0") not in ("", "0")


def env_list(name):
    return [x.strip() for x in os.environ.get(name, "").split(",") if x.strip()]


def pairs(st):
    return [p for p in PAIRS if not st.pairs or p[0] in st.pairs]


class Settings:
    def __init__(self, quick):
        self.quick = quick
        self.runs = env_int("SIW_RS_BENCH_RUNS", 1 if quick else 3)
        # The full matrix with 3 runs everywhere takes over an hour under
        # TCG: by default only the headline rows (the targets) get
        # SIW_RS_BENCH_RUNS, the others one run.
        self.runs_other = env_int("SIW_RS_BENCH_RUNS_OTHER", min(self.runs, 1))
        # The 2 B latency rows (and the TCP ping-pong beside them) take a few
        # seconds a run but spread the most from round to round: three rounds
        # put their median anywhere from 0.70x to 1.15x of siw's within one
        # day. They get more rounds, at about 7 s a run.
        self.runs_lat = env_int("SIW_RS_BENCH_RUNS_LAT", self.runs if quick else max(self.runs, 7))
        self.duration = env_int("SIW_RS_BENCH_DURATION", 5)
        self.margin = env_int("SIW_RS_BENCH_MARGIN", 1)
        self.lat_iters = env_int("SIW_RS_BENCH_LAT_ITERS", 2000)
        if self.duration < 2 * self.margin + 1:
            sys.exit("run.py: SIW_RS_BENCH_DURATION must be at least 2 * SIW_RS_BENCH_MARGIN + 1")
        self.only = env_list("SIW_RS_BENCH_ONLY")
        self.pairs = env_list("SIW_RS_BENCH_PAIRS")
        self.idle_server = env_flag("SIW_RS_BENCH_IDLE_SERVER")
        bad = [n for n in self.pairs if n not in [p[0] for p in PAIRS]]
        if bad:
            sys.exit("run.py: SIW_RS_BENCH_PAIRS: no pair %s (pairs: %s)" % (
                ", ".join(bad), ", ".join(p[0] for p in PAIRS)))

    def as_dict(self):
        return {
            "quick": self.quick, "runs": self.runs, "runs_other": self.runs_other,
            "runs_lat": self.runs_lat,
            "duration_s": self.duration, "margin_s": self.margin,
            "measured_window_s": self.duration - 2 * self.margin,
            "lat_iters": self.lat_iters,
            "only": self.only, "only_pairs": self.pairs,
            "idle_server": self.idle_server,
            "pairs": {p: {"server": s[1], "client": c[1]} for p, s, c in PAIRS},
        }


def size_name(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return "%d MiB" % (n >> 20)
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return "%d KiB" % (n >> 10)
    return "%d B" % n


class Test:
    """One row of the matrix: a perftest tool at a size and QP count, or a TCP
    yardstick (iperf3, or tcp_pingpong for latency)."""

    def __init__(self, kind, tool, size=0, qps=1, headline=False):
        self.kind, self.tool, self.size, self.qps, self.headline = kind, tool, size, qps, headline

    @property
    def key(self):
        if self.kind == "tcp":
            return "iperf3"
        if self.kind == "tcp_lat":
            return "tcp_pingpong %s" % size_name(self.size)
        return "%s %s q%d" % (self.tool, size_name(self.size), self.qps)

    def runs(self, st):
        if not self.headline:
            return st.runs_other
        return st.runs_lat if self.kind in LAT_KINDS else st.runs

    def as_dict(self):
        return {"key": self.key, "kind": self.kind, "tool": self.tool,
                "size": self.size, "qps": self.qps, "headline": self.headline}


def matrix(st):
    """The tests: RDMA ones (run per pair) and the TCP ones (run once a round)."""
    def head(tool, size, qps):
        # The rows the targets are about; the others may get fewer runs.
        return qps == 1 and (size == 65536 or (tool == "ib_write_bw" and size == 64))
    if st.quick:
        rdma = [Test("bw", t, 65536, 1, True) for t in BW_TOOLS]
        rdma += [Test("lat", "ib_write_lat", 2, 1, True), Test("bw", "ib_write_bw", 64, 1, True)]
    else:
        rdma = [Test("bw", t, s, q, head(t, s, q)) for t in BW_TOOLS for s in BW_SIZES for q in (1, 4)]
        rdma += [Test("lat", t, s, 1, s == 2) for t in LAT_TOOLS for s in LAT_SIZES]
    # The TCP yardsticks: iperf3 for bandwidth, a 2 B ping-pong for latency
    # (what a busy-polled TCP round trip costs, with no RDMA layer at all).
    tcp = [Test("tcp", "iperf3", headline=True), Test("tcp_lat", "tcp_pingpong", 2, headline=True)]
    if st.only:
        keys = [t.key for t in rdma + tcp]
        bad = [k for k in st.only if k not in keys]
        if bad:
            sys.exit("run.py: SIW_RS_BENCH_ONLY: no row %s in the %s matrix (rows: %s)" % (
                ", ".join(repr(k) for k in bad), "quick" if st.quick else "full", ", ".join(keys)))
        rdma = [t for t in rdma if t.key in st.only]
        tcp = [t for t in tcp if t.key in st.only]
    return rdma, tcp


def plan(st):
    """[(round, pair or None, test)] in execution order."""
    rdma, tcp = matrix(st)
    rounds = max(t.runs(st) for t in rdma + tcp)
    ps = pairs(st)
    out = []
    for r in range(rounds):
        order = ps[r % len(ps):] + ps[:r % len(ps)]
        for t in rdma:
            if r < t.runs(st):
                out += [(r, pair, t) for pair in order]
        out += [(r, None, t) for t in tcp if r < t.runs(st)]
    return out


def self_test():
    """The plan's order: in every round each test's pairs run back to back,
    each pair once, the round's first pair rotating; every run is planned
    once, the TCP yardsticks once a round after the RDMA tests; the 2 B
    latency rows get more rounds than the bandwidth rows. With the default
    settings: the bench's SIW_RS_BENCH_* environment is left out."""
    ok, why = True, []
    for k in [k for k in os.environ if k.startswith("SIW_RS_BENCH_")]:
        del os.environ[k]
    for quick in (False, True):
        st = Settings(quick)
        st.only, st.pairs = [], []
        rdma, tcp = matrix(st)
        p = plan(st)
        names = [x[0] for x in PAIRS]
        want = sum(t.runs(st) * len(names) for t in rdma) + sum(t.runs(st) for t in tcp)
        if len(p) != want:
            ok = False
            why.append("quick=%s: %d runs planned, %d wanted" % (quick, len(p), want))
        i = 0
        while i < len(p):
            rnd, pair, t = p[i]
            if pair is None:
                i += 1
                continue
            group = [x[1][0] if x[1] else "tcp" for x in p[i:i + len(names)]]
            same = all(x[0] == rnd and x[2] is t for x in p[i:i + len(names)])
            first = names[rnd % len(names)]
            if not same or sorted(group) != sorted(names) or group[0] != first:
                ok = False
                why.append("quick=%s round %d %s: pairs %s" % (quick, rnd, t.key, group))
            i += len(names)
        # The latency yardsticks get their own count of rounds; the
        # bandwidth headline rows keep SIW_RS_BENCH_RUNS.
        for t in rdma + tcp:
            n = sum(1 for x in p if x[2].key == t.key and (x[1] is None or x[1][0] == names[0]))
            if t.headline:
                rounds = st.runs_lat if t.kind in LAT_KINDS else st.runs
            else:
                rounds = st.runs_other
            if n != rounds:
                ok = False
                why.append("quick=%s %s: %d rounds planned, %d wanted" % (quick, t.key, n, rounds))
        if not quick and st.runs_lat <= st.runs:
            ok = False
            why.append("the latency rows get %d rounds, no more than the others' %d" % (st.runs_lat, st.runs))
        for rnd in range(max(t.runs(st) for t in rdma + tcp)):
            kinds = [x[1] is None for x in p if x[0] == rnd]
            if kinds != sorted(kinds):
                ok = False
                why.append("quick=%s round %d: a TCP run before an RDMA run" % (quick, rnd))
    # Which failed runs are attempted again: perftest's own two failures
    # (the texts as perftest 4.5 printed them in bench runs), nothing else.
    for text, want in [
        ("Can't produce a report since the Correlation coefficient is too low", "clock"),
        ("Failed to connect through RDMA CM.\nERRNO: Connection refused.\n"
         "Failed to handle RDMA CM event.\nERRNO: Connection refused.\n", "relisten"),
        ("Unexpected CM event bl blka RDMA_CM_EVENT_REJECTED; error: -111.\n", "relisten"),
        ("Failed to connect through RDMA CM.\nERRNO: Connection timed out.\n", None),
        (" Bad wc status 5\n Unable to write from socket/rdma_cm\n", None),
        ("", None),
    ]:
        got = retry_reason(text)
        if got != want:
            ok = False
            why.append("retry_reason(%r) = %r, want %r" % (text[:40], got, want))
    print("run.py self-test: %s" % ("ok" if ok else "FAILED: " + "; ".join(why[:5])))
    return 0 if ok else 1


def expected_seconds(st, p):
    total = 0.0
    for _, pair, t in p:
        if t.kind in LAT_KINDS:
            # siw at ~70 us (2 B) on the perf kernel; allow 4x for the others.
            total += OVERHEAD_S + st.lat_iters * 300e-6
        else:
            total += OVERHEAD_S + st.duration
    return total + 30  # boot, module load


# --- helpers -----------------------------------------------------------------

def sh(*cmd, check=False, timeout=60):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stdout.strip()))
    return r


def log(msg):
    print("bench: %s" % msg, flush=True)


def proc_stat():
    """The aggregate cpu line of /proc/stat, in clock ticks."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    v += [0] * (10 - len(v))
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice"]
    return dict(zip(names, v))


def cpu_delta(a, b):
    hz = os.sysconf("SC_CLK_TCK")
    d = {k: (b[k] - a[k]) / hz for k in a}
    # guest and guest_nice are already counted in user and nice.
    total = sum(d[k] for k in ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"))
    busy = total - d["idle"] - d["iowait"]
    return {
        "busy_s": round(busy, 3),
        "kernel_s": round(d["system"] + d["irq"] + d["softirq"], 3),
        "user_s": round(d["user"] + d["nice"], 3),
        "total_s": round(total, 3),
    }


def wire_bytes():
    """Octets through veth2 (h2's end) both ways, or None."""
    r = sh("ip", "-n", "h2", "-j", "-s", "link", "show", "dev", "veth2")
    try:
        st = json.loads(r.stdout)[0]["stats64"]
        return st["rx"]["bytes"] + st["tx"]["bytes"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def dmesg_lines():
    r = sh("dmesg")
    return r.stdout.splitlines()


class Proc:
    """A process in its own session (so its whole tree can be killed), output to a file."""

    def __init__(self, cmd, logfile):
        self.cmd = cmd
        self.f = open(logfile, "w")
        self.p = subprocess.Popen(cmd, stdout=self.f, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        self.killed = False

    def wait(self, timeout, done=None, grace=15.0):
        """Exit status; kills the tree (TERM, then KILL) when it overruns
        TIMEOUT, or GRACE seconds after DONE() first returned true (the
        client printed its result but does not exit)."""
        now = time.monotonic()
        deadline = now + timeout
        self.done_at = None
        while True:
            try:
                rc = self.p.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if done is not None and self.done_at is None and done():
                self.done_at = now
                deadline = min(deadline, now + grace)
            if now >= deadline:
                self.killed = True
                self.kill()
                rc = self.p.returncode
                break
        self.f.close()
        return rc

    def kill(self):
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.p.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass


def enable_cores():
    """A tool that crashes leaves its core in RAW (core.<name>.<pid>), next
    to its log: the bench's processes inherit an unlimited core size.
    Returns an error string, or None."""
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    try:
        with open("/proc/sys/kernel/core_pattern", "w") as f:
            f.write(os.path.join(RAW, "core.%e.%p"))
    except OSError as e:
        return "cores not captured: %s" % e
    return None


def cores():
    """The core files in RAW, relative to the output directory."""
    return {"raw/" + os.path.basename(c) for c in glob.glob(os.path.join(RAW, "core.*"))}


def listening(ns, port):
    r = sh("ip", "netns", "exec", ns, "ss", "-Hltn", "sport = :%d" % port)
    return bool(r.stdout.strip())


def wait_listen(ns, port, server, limit=30.0):
    """Until something listens on PORT in NS (or the server died, or LIMIT)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if listening(ns, port):
            return True
        if server.p.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def tail(path, n=6):
    try:
        with open(path, errors="replace") as f:
            return [l.rstrip() for l in f.readlines()[-n:]]
    except OSError:
        return []


# --- output parsing ----------------------------------------------------------

NUM = r"([0-9]+(?:\.[0-9]+)?)"
MIB = 1 << 20


def parse_bw(text, size):
    """The result line of an ib_*_bw run: bytes, iterations, peak, average MiB/s, Mpps."""
    # Not anchored at the end: an error printed without a newline may follow
    # ("0.002419Failed to disconnect RDMA CM connection.").
    m = re.search(r"^\s*%d\s+([0-9]+)\s+%s\s+%s\s+%s" % (size, NUM, NUM, NUM), text, re.M)
    if not m:
        return None
    iters, _peak, avg, mpps = int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))
    # perftest's "MB/sec" is MiB/s (2^20); report decimal MB/s like iperf3.
    return {"mb_s": round(avg * MIB / 1e6, 4), "mpps": mpps, "iterations": iters}


def parse_lat(text, size):
    """The result line of an ib_*_lat run in iteration mode (t_typical is the median)."""
    hdr = re.search(r"^\s*#bytes\s+#iterations\s+(.*)$", text, re.M)
    if not hdr:
        return None
    cols = re.findall(r"(t_\w+|99(?:\.9)?% percentile)", hdr.group(1))
    m = re.search(r"^\s*%d\s+([0-9]+)\s+(.*)$" % size, text[hdr.end():], re.M)
    if not m:
        return None
    d = {}
    for c, x in zip(cols, m.group(2).split()):
        try:
            d[c] = float(x)  # t_stdev may be "-nan"
        except ValueError:
            pass
    # perftest prints inf everywhere when its clock calibration failed.
    d = {c: v for c, v in d.items() if math.isfinite(v)}
    if "t_typical" not in d:
        return None
    out = {"lat_typical_us": d["t_typical"], "iterations": int(m.group(1))}
    for k, name in (("t_min", "lat_min_us"), ("t_max", "lat_max_us"), ("t_avg", "lat_avg_us"),
                    ("99% percentile", "lat_p99_us"), ("99.9% percentile", "lat_p999_us")):
        if k in d:
            out[name] = d[k]
    return out


def parse_tcp_pingpong(text, size):
    """The result line of tcp_pingpong's client (one-way figures, like perftest's)."""
    m = re.search(r"^tcp_pingpong: size %d iterations ([0-9]+) one-way us: min %s typical %s "
                  r"avg %s p99 %s" % (size, NUM, NUM, NUM, NUM), text, re.M)
    if not m:
        return None
    return {"lat_typical_us": float(m.group(3)), "iterations": int(m.group(1)),
            "lat_min_us": float(m.group(2)), "lat_avg_us": float(m.group(4)),
            "lat_p99_us": float(m.group(5))}


def parse_iperf3(text):
    try:
        j = json.loads(text)
        s = j["end"]["sum_received"]
        return {"mb_s": round(s["bytes"] / s["seconds"] / 1e6, 4), "bytes": s["bytes"],
                "seconds": s["seconds"], "retransmits": j["end"]["sum_sent"].get("retransmits")}
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


# --- devices -----------------------------------------------------------------

def del_links():
    r = sh("rdma", "link", "show")
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) > 1 and f[0] == "link":
            sh("rdma", "link", "del", f[1].split("/")[0])


def setup_pair(pair):
    """Creates the pair's two devices; returns an error string or None."""
    del_links()
    _, (sdrv, sdev), (cdrv, cdev) = pair
    for ns, netdev, drv, dev in (("h1", "veth1", sdrv, sdev), ("h2", "veth2", cdrv, cdev)):
        r = sh("ip", "netns", "exec", ns, "rdma", "link", "add", dev, "type", drv, "netdev", netdev)
        if r.returncode != 0:
            return "rdma link add %s type %s: %s" % (dev, drv, r.stdout.strip())
    return None


# --- one run -------------------------------------------------------------------

class Bench:
    def __init__(self, st):
        self.st = st
        self.runs = []
        self.kernel_log = []
        self.seq = 0
        self.started = time.time()
        self.meta = {}
        self.rdma_tests, self.tcp_tests = matrix(st)

    def run_one(self, rnd, pair, test, pair_error):
        """One run of TEST on PAIR; retried when it failed in one of perftest's
        own ways (retry_reason)."""
        self.seq += 1
        pname = pair[0] if pair else "tcp"
        tag = "%03d-%s-%s-%s-q%d-r%d" % (self.seq, pname, test.tool, test.size, test.qps, rnd + 1)
        rec = {"seq": self.seq, "test": test.key, "kind": test.kind, "tool": test.tool,
               "size": test.size, "qps": test.qps, "pair": pname, "run": rnd + 1, "ok": False}
        if pair_error:
            rec["error"] = pair_error
            return rec
        retried = []
        for attempt in range(1, RETRIES + 2):
            t = tag if attempt == 1 else "%s-a%d" % (tag, attempt)
            r = self.attempt(dict(rec, log="raw/%s.client.log" % t), pair, test, t, attempt)
            r["attempts"] = attempt
            if retried:
                r["retried_for"] = list(retried)
            if r["ok"] or not r.get("retry"):
                break
            retried.append(r["retry"])
        return r

    def attempt(self, rec, pair, test, tag, attempt):
        st = self.st
        # A fresh port every time: a killed server's listener may linger.
        port = (18515 if pair else 5201) + (self.seq * (RETRIES + 1) + attempt) % 900
        slog = os.path.join(RAW, tag + ".server.log")
        clog = os.path.join(RAW, tag + ".client.log")
        sns, cns = "h1", "h2"

        if test.kind == "tcp":
            scmd = ["iperf3", "-s", "-1", "-B", SERVER_IP, "-p", str(port)]
            ccmd = ["iperf3", "-c", SERVER_IP, "-p", str(port), "-t", str(st.duration), "--json"]
            climit = st.duration + 60
        elif test.kind == "tcp_lat":
            n = str(st.lat_iters)
            scmd = [TCP_PINGPONG, "server", str(port), str(test.size), n]
            ccmd = [TCP_PINGPONG, "client", str(port), SERVER_IP, str(test.size), n]
            climit = 180
        else:
            _, (_, sdev), (_, cdev) = pair
            args = ["-R", "-p", str(port), "-s", str(test.size)]
            if test.kind == "bw":
                args += ["-D", str(st.duration), "-f", str(st.margin), "-q", str(test.qps)]
                # Duration mode counts a completion as cq_mod messages (default
                # 100): signal every message where fewer than ~100 completions
                # would fall into the window.
                if test.size >= 4096:
                    args += ["-Q", "1"]
                climit = st.duration + 60
            else:
                args += ["-n", str(st.lat_iters)]
                climit = 180
            # Line-buffered: a killed perftest still leaves its output.
            scmd = ["stdbuf", "-oL", "-eL", WP, test.tool, "-d", sdev] + args
            if st.idle_server and test.tool in PASSIVE_SERVERS:
                # The server of a Write or Read test has nothing to do
                # until the client is done, and polls for that: in this
                # one VM it takes its share of a vCPU from the two hosts'
                # data path, which on two machines it would not. At
                # SCHED_IDLE it polls only on a vCPU with nothing else to
                # run.
                scmd = ["chrt", "--idle", "0"] + scmd
            ccmd = ["stdbuf", "-oL", "-eL", WP, test.tool, "-d", cdev] + args + [SERVER_IP]
        if test.kind in LAT_KINDS and (os.cpu_count() or 1) >= 2:
            # Both latency tools busy-poll: on one vCPU each waits out the
            # other's time slice (milliseconds under TCG). Pinned apart, for
            # every driver and the TCP yardstick alike.
            scmd = ["taskset", "-c", "0"] + scmd
            ccmd = ["taskset", "-c", "1"] + ccmd
        rec["server_cmd"] = " ".join(scmd)
        rec["client_cmd"] = " ".join(ccmd)

        d0 = len(dmesg_lines())
        c0 = cores()
        ts = time.monotonic()
        server = Proc(["ip", "netns", "exec", sns] + scmd, slog)
        if not wait_listen(sns, port, server):
            # Go on: the client's error (or success) says more than a guess.
            rec["warning"] = "nothing listened on port %d within 30 s" % port
        s0, w0, t0 = proc_stat(), wire_bytes(), time.monotonic()
        client = Proc(["ip", "netns", "exec", cns] + ccmd, clog)
        parse = {"tcp": lambda t: parse_iperf3(t),
                 "tcp_lat": lambda t: parse_tcp_pingpong(t, test.size),
                 "bw": lambda t: parse_bw(t, test.size),
                 "lat": lambda t: parse_lat(t, test.size)}[test.kind]

        def reported():
            try:
                with open(clog, errors="replace") as f:
                    return parse(f.read()) is not None
            except OSError:
                return False
        crc = client.wait(climit, done=reported)
        s1, w1, t1 = proc_stat(), wire_bytes(), time.monotonic()
        src = server.wait(20)
        wire = w1 - w0 if w0 is not None and w1 is not None else None
        rec.update({"rc_client": crc, "rc_server": src, "wall_s": round(t1 - t0, 3),
                    "listen_s": round(t0 - ts, 3), "server_after_s": round(time.monotonic() - t1, 3),
                    "cpu": cpu_delta(s0, s1), "wire_bytes": wire})
        if wire is not None:
            # Over the client's whole life (setup included): a lower bound,
            # and a check of perftest's own clock.
            rec["wire_mb_s"] = round(wire / (t1 - t0) / 1e6, 4)
        new_cores = sorted(cores() - c0)
        if new_cores:
            rec["cores"] = new_cores
        if client.killed:
            rec["client_timeout"] = climit
        if server.killed:
            rec["server_killed"] = True

        with open(clog, errors="replace") as f:
            text = f.read()
        res = parse(text)
        if res:
            rec.update(res)
            rec["ok"] = True
            if wire and test.kind not in LAT_KINDS:
                # Octets on the veth both ways (headers and acks included),
                # over the same window as the CPU sample.
                cpu = rec["cpu"]
                rec["cpu_s_per_gb"] = round(cpu["busy_s"] / (wire / 1e9), 3)
                rec["kernel_cpu_s_per_gb"] = round(cpu["kernel_s"] / (wire / 1e9), 3)
        if not rec["ok"] and test.kind not in ("tcp", "tcp_lat"):
            why = retry_reason(text)
            if why:
                rec["retry"] = why
        complaints = [l.strip() for l in text.splitlines()
                      if re.search(r"fail|error|unable|errno|can't|cannot", l, re.I)]
        if not rec["ok"]:
            rec["error"] = "client timed out after %d s" % climit if client.killed else \
                "client killed by signal %d" % -crc if crc < 0 else \
                "client exited %s" % crc if crc != 0 else \
                "perftest could not calibrate its clock (inf)" if rec.get("retry") == "clock" else \
                "no result line in the client output"
            if complaints:
                rec["error"] += ": " + "; ".join(complaints[:3])
            rec["client_tail"] = tail(clog)
            rec["server_tail"] = tail(slog)
        else:
            warn = []
            if client.killed:
                warn.append("client hung after its report, killed %.0f s after it" % (
                    t1 - client.done_at if client.done_at else climit))
            elif crc != 0:
                warn.append("client exited %s after its report%s" % (
                    crc, ": " + "; ".join(complaints[:3]) if complaints else ""))
            if src != 0:
                warn.append("server exited %s%s" % (src, " (killed)" if server.killed else ""))
            if warn:
                rec["warning"] = "; ".join(([rec["warning"]] if "warning" in rec else []) + warn)

        new = dmesg_lines()[d0:]
        if new:
            rec["dmesg"] = "raw/%s.dmesg" % tag
            with open(os.path.join(RAW, tag + ".dmesg"), "w") as f:
                f.write("\n".join(new) + "\n")
            notes = [l for l in new if "siw" in l]
            if notes and not rec["ok"]:
                rec["kernel_notes"] = notes[:8]
        bad = [l for l in new if BAD_DMESG.search(l)]
        if bad:
            rec["kernel_log"] = bad[:20]
            self.kernel_log.append({"seq": self.seq, "test": test.key, "pair": rec["pair"],
                                    "lines": new[-80:]})
        return rec

    def describe(self, rec):
        if rec["ok"]:
            if rec["kind"] in LAT_KINDS:
                v = "%.2f us typical" % rec["lat_typical_us"]
            else:
                v = "%.2f MB/s" % rec["mb_s"]
                if rec["kind"] == "bw":
                    v += ", %.6f Mpps" % rec["mpps"]
            if "cpu_s_per_gb" in rec:
                v += ", %.1f CPU-s/GB" % rec["cpu_s_per_gb"]
        else:
            v = "ERROR: " + rec.get("error", "?")
        w = " [%s]" % rec["warning"] if "warning" in rec else ""
        k = " [kernel log: %s]" % rec["kernel_log"][0] if "kernel_log" in rec else ""
        return "%-7s %-26s run %d: %s%s%s" % (rec["pair"], rec["test"], rec["run"], v, w, k)

    def run(self):
        p = plan(self.st)
        log("%d invocations, expected about %d min" % (len(p), expected_seconds(self.st, p) / 60))
        cur = None
        pair_error = None
        for i, (rnd, pair, test) in enumerate(p):
            if pair is not None and pair is not cur:
                cur = pair
                pair_error = setup_pair(pair)
                if pair_error:
                    log("pair %s: %s" % (pair[0], pair_error))
            if pair is None:
                del_links()
                cur = None
            rec = self.run_one(rnd, pair, test, pair_error if pair else None)
            self.runs.append(rec)
            log("[%d/%d] %s" % (i + 1, len(p), self.describe(rec)))
            self.write(complete=False)
        del_links()
        self.write(complete=True)

    # --- results ---------------------------------------------------------------

    def summary(self):
        rows = []
        tests = self.rdma_tests + self.tcp_tests
        for t in tests:
            names = ["tcp"] if t.kind in TCP_KINDS else [p[0] for p in pairs(self.st)]
            for pname in names:
                rs = [r for r in self.runs if r["test"] == t.key and r["pair"] == pname]
                if not rs:
                    continue
                ok = [r for r in rs if r["ok"]]
                row = dict(t.as_dict(), pair=pname, n=len(ok), errors=len(rs) - len(ok))
                metric = "lat_typical_us" if t.kind in LAT_KINDS else "mb_s"
                row["metric"] = metric
                row["unit"] = "us" if t.kind in LAT_KINDS else "MB/s"
                for name in (metric, "mpps", "cpu_s_per_gb", "kernel_cpu_s_per_gb",
                             "wire_mb_s", "lat_avg_us", "lat_p99_us"):
                    vals = [r[name] for r in ok if name in r]
                    if vals:
                        row[name] = {"median": statistics.median(vals), "min": min(vals),
                                     "max": max(vals), "values": vals}
                if row["errors"]:
                    row["error_messages"] = sorted({r.get("error", "?") for r in rs if not r["ok"]})
                rows.append(row)
        return rows

    def write(self, complete):
        doc = {
            "complete": complete,
            "elapsed_s": round(time.time() - self.started, 1),
            "meta": self.meta,
            "settings": self.st.as_dict(),
            "summary": self.summary(),
            "runs": self.runs,
            "kernel_log": self.kernel_log,
        }
        tmp = os.path.join(OUT, "results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, os.path.join(OUT, "results.json"))


def collect_meta(st):
    def first(cmd):
        try:
            return sh(*cmd).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return None
    commit = os.environ.get("SIW_RS_BENCH_COMMIT") or first(
        ["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    model = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    ko = os.environ.get("SIW_RS_KO", "")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "dirty": os.environ.get("SIW_RS_BENCH_DIRTY") == "1",
        "kernel_release": os.uname().release,
        "kernel_version": os.uname().version,
        "vcpus": os.cpu_count(),
        "cpu_model": model,
        "memory_mib": mem_kb // 1024,
        "siw_rs_ko": os.path.relpath(ko, REPO) if ko else None,
        # build/<flavour>/siw_rs/siw_rs.ko, the module's build matches the kernel's flavour
        "flavour": os.path.relpath(ko, REPO).split(os.sep)[1] if ko.startswith(REPO + "/build/") else None,
        "perftest": first(["dpkg-query", "-W", "-f=${Version}", "perftest"]),
        "iperf3": first(["iperf3", "--version"]),
        # "qemu" under TCG, "kvm" with KVM (--vm: the root fs may be a container's).
        "hypervisor": first(["systemd-detect-virt", "--vm"]),
    }


def main():
    args = sys.argv[1:]
    quick = env_flag("SIW_RS_BENCH_QUICK") or "--quick" in args
    if "--self-test" in args:
        return self_test()
    st = Settings(quick)
    if "--estimate" in args:
        p = plan(st)
        print("%d %d" % (len(p), expected_seconds(st, p)))
        return 0

    ko = os.environ.get("SIW_RS_KO")
    if not ko:
        sys.exit("run.py: SIW_RS_KO must name the siw_rs.ko to load")
    os.makedirs(RAW, exist_ok=True)
    os.chdir(REPO)
    sh("dmesg", "-n", "1")
    err = enable_cores()
    if err:
        log(err)

    b = Bench(st)
    b.meta = collect_meta(st)
    log("kernel %s, %s vCPUs, commit %s%s, %s" % (
        b.meta["kernel_release"], b.meta["vcpus"], b.meta["commit"],
        " (dirty)" if b.meta["dirty"] else "", "quick" if quick else "full"))
    sh("scripts/topology", "down")
    sh("scripts/topology", "up", check=True)
    r = sh("insmod", ko)
    if r.returncode != 0 and "File exists" not in r.stdout:
        log("insmod %s failed: %s" % (ko, r.stdout.strip()))
    r = sh("modprobe", "siw")
    if r.returncode != 0:
        log("modprobe siw failed: %s" % r.stdout.strip())
    try:
        b.run()
    finally:
        del_links()
        sh("rmmod", "siw_rs")
        sh("rmmod", "siw")
        sh("scripts/topology", "down")
    ok = sum(1 for r in b.runs if r["ok"])
    log("done: %d of %d runs ok, %d s" % (ok, len(b.runs), time.time() - b.started))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
