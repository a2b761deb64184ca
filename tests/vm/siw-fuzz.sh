# SPDX-License-Identifier: GPL-2.0
# The hostile-peer fuzzer of t-75-fuzz.sh against upstream siw, for
# comparison: it tests the reference driver, not siw_rs, and only
# reports, so it is not part of make check (make check-perf runs it).
# Needs t-75-fuzz.sh's helpers, sourced first:
#
#   tests/vm/run tests/vm/t-75-fuzz.sh tests/vm/siw-fuzz.sh
#
# In test_99, which never loads siw_rs, a kernel report with frames in
# siw's module or from iw_cm's work queue is upstream's and is printed,
# not failed (upstream_siw_report in lib.sh). test_99 sorts after every
# siw_rs test because such a lockdep report turns lockdep off for the
# rest of the boot.

test_99_fuzzer_against_upstream_siw() {
	local secs=${SIW_RS_FUZZ_SIW_SECS:-30}
	scripts/topology up
	modprobe siw
	ip netns exec h1 rdma link add siw1 type siw netdev veth1
	hang_watch "${SIW_RS_FUZZ_WATCH:-$((secs + 600))}"
	# The stock rdma-core provider (libsiw).
	fuzz_listener h1 10.55.0.1
	# siw writes the TERMINATE control field with C bitfields, on x86 with
	# the layer and type nibbles swapped: read it that way to compare codes.
	# Not by default the two families that can end in siw's iw_cm BUG
	# (an accepted peer-to-peer Request, then a FIN before the RTR: siw
	# may report CLOSE before ESTABLISHED). Its oops can leave a CPU
	# spinning on the lock the dead worker held, and a guest that hangs
	# takes the whole VM run's summary with it. The finding is in the
	# testing guide, with the command that reproduces it.
	# shellcheck disable=SC2086
	run_fuzzer siw "$secs" --terminate-order le-bitfield \
		${SIW_RS_FUZZ_SIW_ARGS---families -mpa-fields,-mpa-p2p-close}
	listener_leftovers siw1
	stop_listener
	kill "$HANG_WATCH" 2>/dev/null || true
	# Upstream siw leaks a connection endpoint (512 octets, with its four
	# 256-octet work items) for some hostile connections; kmemleak sees
	# them once the module is gone, which used to be during the next test.
	# Unload it here and report them: they are siw's, not siw_rs's (which
	# is not loaded in this test).
	# Bounded: now and then a listener connection gets stuck in siw's
	# kernel code and even SIGKILL does not end the process; then
	# removing the device waits for it forever. That is siw's bug, so it
	# is reported, and the device and the module stay (the runner leaves
	# them too).
	local rc=0
	bounded 60 rdma link del siw1 2>/dev/null || rc=$?
	if [ "$rc" = 124 ]; then
		echo "    upstream siw: siw1 cannot be removed after 60 s; the tasks that hold it (reported only):"
		task_stacks $(cat /tmp/listener.pid) $(pgrep -x rdma)
		echo siw1 >> "$ABANDONED_DEVS"
	else
		bounded 60 rmmod siw 2>/dev/null || rc=$?
		if [ "$rc" = 124 ]; then
			echo "    upstream siw: rmmod siw has not ended after 60 s (reported only)"
			echo "(module siw)" >> "$ABANDONED_DEVS"
		fi
	fi
	if kernel_died; then
		echo "    upstream siw: the kernel oopsed (reported only); no kmemleak scan"
	elif kmemleak_available; then
		nap 6
		echo scan > /sys/kernel/debug/kmemleak
		echo scan > /sys/kernel/debug/kmemleak
		echo "    upstream siw left $(grep -c 'unreferenced object' /sys/kernel/debug/kmemleak || true) unreferenced objects (reported only)"
		kmemleak_clear
	fi
	# Upstream siw differs from the RFC codes in places: report only. The
	# run itself must work (exit 0 or 1, not a usage error or a dead
	# server); the runner prints siw's own kernel reports.
	[ "$FUZZ_RC" -le 1 ] || fail_because "the fuzz run against siw broke (exit $FUZZ_RC)" || return 1
}
