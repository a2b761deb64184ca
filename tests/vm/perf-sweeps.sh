# SPDX-License-Identifier: GPL-2.0
# Long user-verbs runs for the perf kernel (scripts/check-perf), too slow
# for the debug kernel in make check: every perftest tool with -R over the
# whole -a size sweep, and rping with 1000 verified round trips over IPv4
# and IPv6, siw_rs on both ends. (Issue: userspace.) Sourced by
# tests/vm/run after t-50-uverbs.sh (uverbs_pair, perftest_pair).

# perftest_sweep TOOL: TOOL -a (2 B up to perftest's largest size) with
# 100 iterations per size; the client must report the 2 B and 1 MiB rows.
perftest_sweep() {
	local t=$1
	echo "    $t -a"
	perftest_pair "$t" -a -n 100 || return 1
	grep -qE "^ 2 +100 " /tmp/client.log || fail_because "$t: no 2 B row" || return 1
	grep -qE "^ 1048576 +100 " /tmp/client.log || fail_because "$t: no 1 MiB row" || return 1
	grep -E "^ (2|4096|65536|1048576) +100 " /tmp/client.log | sed 's/^/      /'
}

test_90_perftest_sweeps() {
	uverbs_pair
	local t
	for t in ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat; do
		perftest_sweep "$t" || return 1
	done
}

test_91_rping_1000_verified() {
	uverbs_pair
	local a
	for a in 10.55.0.1 fd55::1; do
		echo "    rping -C 1000 -V over $a"
		server_client h1 h2 600 -- "$WP" rping -s -a "$a" -C 1000 -S 4096 -V \
			-- "$WP" rping -c -a "$a" -C 1000 -S 4096 -V || return 1
	done
}
