#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# make bench-insns, guest side: run inside the perf-kernel VM (with the
# insncount QEMU plugin loaded) by scripts/bench-insns.
#
# For each spec TOOL:SIZE:PAIR, runs the perftest client twice, with N1 and
# N2 iterations, each run between two marks (tests/bench/insn-mark), so the
# plugin snapshots its counts around it. The report divides the difference
# of the two runs by N2 - N1: what connecting, exchanging keys and closing
# cost cancels out, and what is left is the instructions of one iteration
# (a latency tool's round trip, a bandwidth tool's message).
#
# Prints one line per run, which tests/bench/insns-report.py pairs with the
# marks:
#   RUN round=R tool=T pair=P size=S n=N rc=RC result=X
# (X: the tool's typical latency in us or its average MB/s, for reference;
# the plugin slows the guest, so these are not benchmark figures), and
#   FAILED attempt=A rc=RC
# for an attempt that was repeated (its two marks are skipped; the report
# leaves out a test whose run failed in the end).
#
# Environment: SIW_RS_KO, INSN_ROUNDS (default 2), INSN_SPECS, INSN_LAT_N
# ("N1 N2", default "1000 6000"), INSN_BW_N (default "200 1200"),
# INSN_MARK (the marker binary).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
wp=$repo/userspace-provider/with-provider
mark=${INSN_MARK:?}
specs=${INSN_SPECS:-ib_write_lat:2:siw_rs ib_write_lat:2:siw ib_send_lat:2:siw_rs ib_send_lat:2:siw}

scripts/topology up >/dev/null
insmod "${SIW_RS_KO:?}" || { echo "insns: insmod failed"; exit 1; }
modprobe siw || { echo "insns: modprobe siw failed"; exit 1; }
dmesg -n 1
# Module symbols as loaded, for the report's profile by function.
cat /proc/kallsyms > "$repo/build/bench-insns/kallsyms.txt"

del_links() {
	local l
	for l in $(rdma link show | awk '$1 == "link" { split($2, a, "/"); print a[1] }'); do
		rdma link del "$l"
	done
}

port=19000
for r in $(seq 1 "${INSN_ROUNDS:-2}"); do
	for spec in $specs; do
		IFS=: read -r tool size pair <<< "$spec"
		case $tool in
		*_lat) read -r n1 n2 <<< "${INSN_LAT_N:-1000 6000}"; extra=(); col=5 ;;
		*) read -r n1 n2 <<< "${INSN_BW_N:-200 1200}"; extra=(-Q 1); col=4 ;;
		esac
		case $pair in
		siw_rs) sdrv=siw_rs sdev=rs1 cdrv=siw_rs cdev=rs2 ;;
		siw) sdrv=siw sdev=siw1 cdrv=siw cdev=siw2 ;;
		mixed) sdrv=siw_rs sdev=rs1 cdrv=siw cdev=siw2 ;;
		*) echo "insns: unknown pair '$pair'"; exit 2 ;;
		esac
		for n in "$n1" "$n2"; do
			del_links
			ip netns exec h1 rdma link add "$sdev" type "$sdrv" netdev veth1
			ip netns exec h2 rdma link add "$cdev" type "$cdrv" netdev veth2
			# perftest's server re-listens between its two connections; a
			# client that comes in between is refused (testing.rst): again.
			for attempt in 1 2 3; do
				port=$((port + 1))
				ip netns exec h1 taskset -c 0 "$wp" "$tool" -d "$sdev" -R -p "$port" -s "$size" -n "$n" "${extra[@]}" \
					> /tmp/insns.server.log 2>&1 &
				spid=$!
				for _ in $(seq 1 100); do
					ip netns exec h1 ss -ltn | grep -q ":$port " && break
					sleep 0.1
				done
				sleep 0.5
				"$mark"
				timeout 300 ip netns exec h2 taskset -c 1 "$wp" "$tool" -d "$cdev" -R -p "$port" -s "$size" -n "$n" \
					"${extra[@]}" 10.55.0.1 > /tmp/insns.client.log 2>&1
				rc=$?
				"$mark"
				[ "$rc" = 0 ] || kill "$spid" 2>/dev/null
				# The server ends with its client; one that does not is ended.
				for _ in $(seq 1 600); do
					kill -0 "$spid" 2>/dev/null || break
					sleep 0.1
				done
				kill "$spid" 2>/dev/null
				wait "$spid"
				# The last attempt's marks go with its RUN line (rc not 0).
				[ "$rc" = 0 ] || [ "$attempt" = 3 ] && break
				echo "FAILED attempt=$attempt rc=$rc"
				tail -3 /tmp/insns.client.log
			done
			res=$(awk -v s="$size" -v c="$col" '$1 == s { print $c; exit }' /tmp/insns.client.log)
			echo "RUN round=$r tool=$tool pair=$pair size=$size n=$n rc=$rc result=${res:-none}"
		done
	done
done
del_links
