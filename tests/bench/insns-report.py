#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""make bench-insns, host side: instructions per iteration from the guest's
RUN lines (tests/bench/insns.sh) and the insncount plugin's snapshots.

    tests/bench/insns-report.py DIR [TOP]
    tests/bench/insns-report.py --self-test   (run by make check on the host)

DIR holds vm.log, marks.txt, prof-NNN.txt and kallsyms.txt. Writes
DIR/results.json and DIR/results.md and prints the Markdown. TOP: functions
listed per test and pair (default 20).

Each RUN's two marks bracket one client run. For a test and pair, the runs
with N1 and N2 iterations of one round give (count(N2) - count(N1)) /
(N2 - N1) per iteration, for the guest's kernel text, its module space
(siw_rs.ko, siw.ko and every other module) and user space; user space is
mostly the two perftest processes polling, which counts time, not work. The
profile by function is the same difference per block, each block
attributed to the symbol at or below its first instruction.
"""

import bisect
import collections
import json
import os
import statistics
import sys


def short(name):
    """A readable form of a Rust v0 symbol (the identifiers after the
    crate's name, joined with ::), enough to tell functions apart."""
    if not name.startswith("_R"):
        return name
    sym, _, mod = name.partition(" ")
    at = sym.find("siw_rs_main")
    if at < 0:
        return name
    i, parts = at + len("siw_rs_main"), []
    while i < len(sym):
        if sym[i] == "B":
            # A backref: B, base-62 digits, an underscore.
            i = sym.find("_", i) + 1 or len(sym)
            continue
        j = i
        while j < len(sym) and sym[j].isdigit():
            j += 1
        # An identifier is its length, then itself; a disambiguator
        # (s8_) puts digits before an underscore, not a letter.
        if j > i and sym[j:j + 1].isalpha():
            n = int(sym[i:j])
            ident = sym[j:j + n]
            if n > 0 and len(ident) == n and all(c.isalnum() or c == "_" for c in ident):
                parts.append(ident)
                i = j + n
                continue
        i = max(j, i + 1)
    return "::".join(parts) + (" " + mod if mod else "")


def parse_kv(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def main():
    if sys.argv[1:2] == ["--self-test"]:
        return self_test()
    report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)


def report(d, top, quiet=False):
    runs, m = [], 0
    with open(os.path.join(d, "vm.log"), errors="replace") as f:
        for line in f:
            if line.startswith("FAILED "):
                m += 2
            elif line.startswith("RUN "):
                r = parse_kv(line)
                r["mark"] = m
                m += 2
                runs.append(r)
    with open(os.path.join(d, "marks.txt")) as f:
        marks = [parse_kv(l) for l in f if l.startswith("mark ")]
    if len(marks) < m:
        sys.exit("insns-report: %d marks for %d expected: the log and the marks disagree" % (len(marks), m))

    syms = []
    with open(os.path.join(d, "kallsyms.txt")) as f:
        for line in f:
            p = line.split()
            if len(p) >= 3 and p[1] in "tTwW":
                syms.append((int(p[0], 16), short(p[2] + (" " + p[3] if len(p) > 3 else ""))))
    syms.sort()
    addrs = [a for a, _ in syms]

    def sym(va):
        i = bisect.bisect_right(addrs, va) - 1
        return syms[i][1] if i >= 0 else "?"

    def profile(seq):
        p = collections.Counter()
        with open(os.path.join(d, "prof-%03d.txt" % seq)) as f:
            for line in f:
                va, n, e = line.split()
                p[int(va, 16)] += int(n) * int(e)
        return p

    def run_profile(r):
        p = profile(r["mark"] + 1)
        p.subtract(profile(r["mark"]))
        return p

    groups = collections.defaultdict(dict)
    for r in runs:
        key = (r["tool"], int(r["size"]), r["pair"], int(r["round"]))
        groups[key][int(r["n"])] = r

    results = collections.defaultdict(list)
    skipped = []
    for (tool, size, pair, rnd), by_n in sorted(groups.items()):
        if len(by_n) != 2 or any(r.get("rc") != "0" for r in by_n.values()):
            skipped.append("%s %d B %s round %d" % (tool, size, pair, rnd))
            continue
        (n1, r1), (n2, r2) = sorted(by_n.items())
        dn = n2 - n1

        def delta(r, field):
            return int(marks[r["mark"] + 1][field]) - int(marks[r["mark"]][field])

        per = {f: (delta(r2, f) - delta(r1, f)) / dn for f in ("kernel", "module", "user")}
        prof = run_profile(r2)
        prof.subtract(run_profile(r1))
        funcs = collections.Counter()
        for va, v in prof.items():
            funcs[sym(va)] += v / dn
        results[(tool, size, pair)].append({
            "round": rnd, "n": [n1, n2], "result": [r1.get("result"), r2.get("result")],
            "kernel": round(per["kernel"]), "module": round(per["module"]), "user": round(per["user"]),
            "functions": {k: round(v) for k, v in funcs.most_common(200) if round(v) != 0},
        })

    out = {"tests": [{"tool": t, "size": s, "pair": p, "rounds": v} for (t, s, p), v in sorted(results.items())],
           "skipped": skipped}
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(out, f, indent=1)

    def med(v, field):
        return statistics.median(x[field] for x in v)

    lines = ["# Guest instructions per iteration (median of rounds)", "",
             "| test | pair | rounds | kernel | modules | kernel + modules | ratio to siw pair |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for (t, s, p), v in sorted(results.items()):
        tot = med(v, "kernel") + med(v, "module")
        ref = results.get((t, s, "siw"))
        ratio = "%.2fx" % (tot / (med(ref, "kernel") + med(ref, "module"))) if ref and p != "siw" else "-"
        lines.append("| %s %d B | %s | %d | %.0f | %.0f | %.0f | %s |" % (
            t, s, p, len(v), med(v, "kernel"), med(v, "module"), tot, ratio))
    if skipped:
        lines += ["", "Left out (a run of the pair failed): " + ", ".join(skipped) + "."]
    for (t, s, p), v in sorted(results.items()):
        mean = collections.Counter()
        for x in v:
            for k, c in x["functions"].items():
                mean[k] += c / len(v)
        lines += ["", "## %s %d B, %s: functions by instructions per iteration (mean of %d rounds)" % (t, s, p, len(v)),
                  "", "| instructions | function |", "| --- | --- |"]
        lines += ["| %.0f | %s |" % (c, k.replace("|", "\\|")) for k, c in mean.most_common(top)]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(d, "results.md"), "w") as f:
        f.write(md)
    if not quiet:
        print(md)
    return out


def self_test():
    """Synthetic counts with a known answer: per iteration 100 kernel
    instructions (60 in one function, 40 in another) and 50 in a module,
    under a setup cost that differs in nothing between the two runs, and a
    failed attempt whose marks must be skipped."""
    import tempfile
    fa, fb, fc = 0xffffffff81000000, 0xffffffff81000100, 0xffffffffc0001000
    blocks = {fa: 6, fb: 4, fc: 5}  # instructions per block
    state = {fa: 0, fb: 0, fc: 0}
    marks, profs = [], []

    def snap():
        k = state[fa] * 6 + state[fb] * 4
        marks.append("mark seq=%d cpu=0 user=0 kernel=%d module=%d" % (len(marks), k, state[fc] * 5))
        profs.append("".join("%x %d %d\n" % (va, blocks[va], e) for va, e in state.items()))

    def run(iters, setup=True):
        snap()
        if setup:  # connection setup: the same in every run
            state[fa] += 300
            state[fc] += 70
        state[fa] += 10 * iters
        state[fb] += 10 * iters
        state[fc] += 10 * iters
        snap()

    log = []
    run(7)  # the failed attempt: its counts are whatever they are
    log.append("FAILED attempt=1 rc=139")
    run(10)
    log.append("RUN round=1 tool=ib_write_lat pair=siw_rs size=2 n=10 rc=0 result=40.0")
    run(30)
    log.append("RUN round=1 tool=ib_write_lat pair=siw_rs size=2 n=30 rc=0 result=41.0")
    run(5)
    log.append("RUN round=1 tool=ib_send_lat pair=siw_rs size=2 n=5 rc=1 result=none")
    with tempfile.TemporaryDirectory() as d:
        for name, text in (("vm.log", "\n".join(log) + "\n"), ("marks.txt", "\n".join(marks) + "\n"),
                           ("kallsyms.txt", "%x T tcp_a\n%x t tcp_b\n"
                            "%x t _RNvNtCsabc_11siw_rs_main2qp7pull_sq\t[siw_rs]\n" % (fa, fb, fc))):
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        for i, text in enumerate(profs):
            with open(os.path.join(d, "prof-%03d.txt" % i), "w") as f:
                f.write(text)
        out = report(d, 5, quiet=True)
    tests = out["tests"]
    ok = (len(tests) == 1 and tests[0]["pair"] == "siw_rs" and len(tests[0]["rounds"]) == 1)
    r = tests[0]["rounds"][0] if ok else {}
    want = {"tcp_a": 60, "tcp_b": 40, "qp::pull_sq [siw_rs]": 50}
    ok = ok and r["kernel"] == 100 and r["module"] == 50 and r["functions"] == want and r["n"] == [10, 30]
    ok = ok and out["skipped"] == ["ib_send_lat 2 B siw_rs round 1"]
    print("insns-report self-test: %s" % ("ok" if ok else "FAILED: %r" % (tests,)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
