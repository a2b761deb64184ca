# SPDX-License-Identifier: GPL-2.0
# Faults under traffic (issue #6): packet loss and delay, the link going
# down and up, and `rdma link del` while processes hold QPs. Each ends with
# verified data or a clean failure, every object released, and the device
# (or a new one) serving a verified rping afterwards. The runner checks the
# kernel log (warnings, KASAN, lockdep, hung tasks) and kmemleak after each.

test_80_packet_loss_and_delay() {
	uverbs_pair
	# 3% loss and 1 ms +- 1 ms of jitter (reordering the stream's segments)
	# each way: TCP retransmits, and every octet must still arrive intact.
	netem_on loss 3% delay 1ms 1ms
	echo "    verified rping with 3% loss and jitter each way"
	verified_rping 20 8192 || return 1
	netem_off || return 1
	no_qps rs1 && no_qps rs2
}

# endless_rping: a verified rping without end, rs1 serving rs2, the
# client printing one line per ping to /tmp/client.log; pids in SP, CP.
endless_rping() {
	ip netns exec h1 timeout 400 "$WP" rping -s -a 10.55.0.1 -C 0 -S 64 -V > /tmp/server.log 2>&1 &
	SP=$!
	wait_listen h1 7174 "$SP"
	ip netns exec h2 timeout 400 "$WP" rping -c -a 10.55.0.1 -C 0 -S 64 -V -v > /tmp/client.log 2>&1 &
	CP=$!
}

pings() { grep -c 'ping data' /tmp/client.log || true; }

# wait_pings N SECS: until the client has printed N pings; fails if it
# stopped or SECS passed.
wait_pings() {
	local i
	for ((i = 0; i < $2 * 5; i++)); do
		[ "$(pings)" -ge "$1" ] && return 0
		kill -0 "$CP" 2>/dev/null || break
		nap 0.2
	done
	tail -n 3 /tmp/client.log | cut -c1-120 | sed 's/^/    client| /'
	tail -n 3 /tmp/server.log | sed 's/^/    server| /'
	fail_because "rping reached $(pings) of $1 pings"
}

test_81_link_down_and_up_during_transfer() {
	uverbs_pair
	endless_rping
	wait_pings 20 120 || return 1
	ip -n h2 link set veth2 down
	echo "    veth2 down for 3 s after $(pings) pings: rs2 $(link_state rs2)"
	nap 3
	ip -n h2 link set veth2 up
	# TCP carries the connection across the outage: the same rping goes
	# on, every ping verified (rping -V stops at the first mismatch).
	local before
	before=$(pings)
	wait_pings $((before + 50)) 180 || return 1
	echo "    $(pings) pings, 50+ of them after the outage; rs2 $(link_state rs2)"
	kill "$CP" "$SP" 2>/dev/null || true
	wait "$CP" "$SP" 2>/dev/null || true
	! grep -qi 'mismatch' /tmp/client.log || fail_because "rping saw corrupted data" || return 1
	[ "$(link_state rs2)" = ACTIVE ] || fail_because "rs2 is $(link_state rs2) after link up" || return 1
	no_qps rs1 && no_qps rs2
}

# users_end_by_themselves SECS: the endless rping pair (SP, CP) must end
# on its own within SECS seconds, its device gone under it, the server
# told so by the RDMA CM (rping prints "cma detected device removal");
# prints how each ended.
users_end_by_themselves() {
	local rc who pid log
	for who in server client; do
		pid=$SP log=/tmp/server.log
		[ "$who" = client ] && pid=$CP log=/tmp/client.log
		rc=0; wait_pid "$pid" "$1" || rc=$?
		[ "$rc" != 124 ] || { stop_rping; fail_because "the rping $who still runs $1 s after the device went"; return 1; }
		echo "    rping $who ended (exit $rc): $(grep -iE 'removal|error|fail|disconnect' "$log" | tail -n 1 | cut -c1-70)"
	done
	# The server hears that the device went in one of two ways. A device's
	# clients are removed in the reverse of their registration, and
	# ib_uverbs registers after rdma_cm (both built into the test kernels,
	# linked in that order): the process's context goes first,
	# its QP destroyed (the connection closed, the QP flagged in error in
	# the rings it shares with the process), and only then does the CM
	# report DEVICE_REMOVAL. Usually the CM's DISCONNECTED ends rping's
	# loop and the removal event arrives while it tears down. But a post
	# in that window finds the QP in error and rings its doorbell, which
	# needs the kernel, and the context is gone: EIO (from ibv_post_recv in
	# rping's CQ thread, which then ends the main loop with "rping server
	# failed: -1"; from ibv_post_send in the main loop, "failed: 5"), and
	# rping exits before it reads the CM event. That fits the one failure
	# seen (2026-11-30, "failed: -1", no removal event; the log's earlier
	# lines were not kept): the log tail below is for the next one.
	local heard
	heard=$(grep -E 'device removal|post recv error: 5$|post send error 5$' /tmp/server.log | head -n 1)
	[ -n "$heard" ] || {
		log_tail '    server| ' /tmp/server.log 8
		fail_because "the rping server was told neither of the device removal nor EIO from a verb"
		return 1
	}
	echo "    the rping server heard: $heard"
	! grep -qi 'mismatch' /tmp/client.log || fail_because "rping saw corrupted data"
}

test_82_link_del_under_traffic() {
	uverbs_pair
	endless_rping
	wait_pings 20 120 || return 1
	# A device that goes ends the contexts processes hold on it
	# (disassociate_ucontext): `rdma link del` completes at once while
	# rping still runs, every object of those contexts destroyed. The
	# server sees the device removed (RDMA_CM_EVENT_DEVICE_REMOVAL, EIO
	# from verbs), the client its connection closed; both end by
	# themselves.
	local rc=0
	bounded 30 rdma link del rs1 || rc=$?
	[ "$rc" = 0 ] || { stop_rping; fail_because "rdma link del rs1 under traffic: exit $rc (124: still waiting after 30 s)"; return 1; }
	expect_no_dev rs1 "rs1 still exists after link del" || { stop_rping; return 1; }
	echo "    rs1 deleted under traffic after $(pings) pings"
	users_end_by_themselves 30 || return 1
	no_qps rs2 || return 1
	echo "    a new rs1 serves verified rping"
	ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
	verified_rping 10 1024
}

# stop_rping: kills the endless rping pair (SP, CP) and reaps it.
stop_rping() {
	kill "$CP" "$SP" 2>/dev/null || true
	wait "$CP" 2>/dev/null || true
	wait "$SP" 2>/dev/null || true
}

test_83_veth_deleted_under_traffic() {
	uverbs_pair
	endless_rping
	wait_pings 20 120 || return 1
	# Deleting veth1 deletes its peer veth2 too. siw_rs's netdev notifier
	# unregisters the ib_device of each on NETDEV_UNREGISTER
	# (ib_unregister_device_queued); the unregistration ends the contexts
	# rping holds on them (disassociate_ucontext), so the ib_devices let go
	# of the netdevs and `ip link del` completes while rping still runs.
	local rc=0
	bounded 30 ip -n h1 link del veth1 || rc=$?
	[ "$rc" = 0 ] || { stop_rping; fail_because "ip link del veth1 under traffic: exit $rc (124: still waiting after 30 s)"; return 1; }
	! ip -n h1 link show veth1 > /dev/null 2>&1 || { stop_rping; fail_because "veth1 is still listed"; return 1; }
	wait_dev_gone rs1 || { stop_rping; fail_because "rs1 outlived its netdev"; return 1; }
	wait_dev_gone rs2 || { stop_rping; fail_because "rs2 outlived its netdev"; return 1; }
	echo "    veth pair deleted under traffic after $(pings) pings; rs1 and rs2 gone"
	users_end_by_themselves 30 || return 1
	echo "    new devices on a new veth pair serve verified rping"
	scripts/topology down
	uverbs_pair
	verified_rping 10 1024 || return 1
	no_qps rs1 && no_qps rs2
}

test_84_rmmod_under_traffic() {
	uverbs_pair
	endless_rping
	wait_pings 20 120 || return 1
	# ib_uverbs pins no module whose driver disassociates contexts, but
	# each context's doorbell file does (its file operations are the
	# module's), and each rping holds a context on its device (measured:
	# 2 references). So the module cannot go while rping runs: the
	# kernel refuses delete_module with EWOULDBLOCK (EAGAIN) and
	# kmod's rmmod, which checks the reference count first, says so.
	local refs rc=0 out
	refs=$(cat /sys/module/siw_rs/refcnt)
	[ "$refs" -ge 2 ] || fail_because "siw_rs has $refs references with rping on both devices" || return 1
	out=$(rmmod siw_rs 2>&1) || rc=$?
	echo "    rmmod with $refs references: exit $rc: $out"
	[ "$rc" != 0 ] || fail_because "rmmod siw_rs succeeded under traffic" || return 1
	case $out in *"in use"*) ;; *) fail_because "rmmod did not fail as 'in use'"; return 1 ;; esac
	out=$(python3 -c 'import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(176, b"siw_rs", os.O_NONBLOCK)  # delete_module on x86_64
print(r, os.strerror(ctypes.get_errno()) if r else "")')
	echo "    delete_module(siw_rs, O_NONBLOCK): $out"
	[ "$out" = "-1 $(python3 -c 'import os, errno; print(os.strerror(errno.EAGAIN))')" ] ||
		fail_because "delete_module did not fail with EAGAIN" || return 1
	grep -q '^siw_rs .* Live ' /proc/modules || fail_because "siw_rs is not live after the refused unload" || return 1
	have_dev rs1 && have_dev rs2 || fail_because "a device went away with the refused unload" || return 1
	# The same connections carry on, every ping verified.
	local before
	before=$(pings)
	wait_pings $((before + 20)) 120 || return 1
	echo "    $(pings) pings, 20+ of them after the refused unload"
	stop_rping
	! grep -qi 'mismatch' /tmp/client.log || fail_because "rping saw corrupted data" || return 1
	no_qps rs1 && no_qps rs2 || return 1
	# Without users the references are gone and rmmod removes the module
	# with both devices still registered.
	local i
	for ((i = 0; i < 50; i++)); do
		[ "$(cat /sys/module/siw_rs/refcnt)" = 0 ] && break
		nap 0.2
	done
	[ "$(cat /sys/module/siw_rs/refcnt)" = 0 ] ||
		fail_because "siw_rs keeps $(cat /sys/module/siw_rs/refcnt) references after rping ended" || return 1
	rmmod siw_rs || fail_because "rmmod siw_rs failed without users" || return 1
	expect_no_dev rs1 && expect_no_dev rs2 || return 1
	# Loaded again, the new devices serve verified rping.
	insmod "$SIW_RS_KO"
	ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
	ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
	verified_rping 10 1024 || return 1
	no_qps rs1 && no_qps rs2
}

# Fault injection (failslab, fail_page_alloc) for the processes under test
# only: task-filter on, each attribute set by fault_set DIR KEY=VALUE...
fault_set() {
	local d=/sys/kernel/debug/$1 kv
	shift
	for kv in "$@"; do echo "${kv#*=}" > "$d/${kv%%=*}"; done
}
fault_get() { cat "/sys/kernel/debug/$1/$2"; }

# A preload library that makes a process fail allocations inside its
# verbs and CM system calls, from its first rdma_create_id on:
# /proc/thread-self/make-it-fail is set around each ioctl, write, read
# and mmap on a file the RDMA stack handed out (a character device or an
# anonymous inode: its verbs commands and doorbells, its CM commands and
# events, its ring mappings) and cleared as the call returns.
# Only there: exec, path lookups, page faults, file closes and the exit
# path touch the VM's 9p root, and a failed allocation in the 9p client
# can break it for every process (seen twice with the flag set for the
# whole process, in CI and in a full make check: every later exec in the
# VM failed with EINVAL, once after a hung rping was killed with the flag
# set, once after a run that passed). The verbs and CM calls, their
# error paths and rping's own teardown of what it created all run with
# allocations failing. A fatal signal clears every thread's flag (SIGKILL
# cannot be caught: enomem_run clears them from outside before it kills),
# and so does the exit.
# The library's source: tests/vm/enomem-hook.c.

# enomem_hook_up: copies the hook, built on the host by scripts/check
# (build/enomem-hook.so), into a tmpfs of its own (EH; off the VM's 9p
# root, which a failed allocation could break) and sets HOOK to the
# command prefix that preloads it. enomem_hook_down removes it.
ENOMEM_HOOK_SO=${SIW_RS_ENOMEM_HOOK:-build/enomem-hook.so}
enomem_hook_up() {
	[ -f "$ENOMEM_HOOK_SO" ] || fail_because "$ENOMEM_HOOK_SO not built (scripts/check builds it from tests/vm/enomem-hook.c)" || return 1
	EH=$(mktemp -d)
	mount -t tmpfs tmpfs "$EH"
	cp "$ENOMEM_HOOK_SO" "$EH/hook.so"
	HOOK=(env LC_ALL=C "LD_PRELOAD=$EH/hook.so:libgcc_s.so.1")
}

enomem_hook_down() {
	umount "$EH"
	rmdir "$EH"
}

# enomem_dump: the kernel and user stacks of every rping but the
# persistent server (a run that hangs is a finding to diagnose).
enomem_dump() {
	local pid t
	for pid in $(pgrep -x rping); do
		grep -q -- '-P' "/proc/$pid/cmdline" 2>/dev/null && continue
		echo "      rping $pid: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)"
		for t in /proc/"$pid"/task/*; do
			echo "      thread ${t##*/}: wchan $(cat "$t/wchan" 2>/dev/null)"
			sed 's/^/        /' "$t/stack" 2>/dev/null || true
		done
		timeout 60 gdb -p "$pid" -batch -ex 'thread apply all bt' 2>&1 |
			grep -E '^(#|Thread)' | head -n 40 | sed 's/^/      gdb| /' || true
	done
	rdma res show qp | sed 's/^/      qp| /'
}

# enomem_run CLIENT|SERVER: one verified rping of 2 pings of 1 KiB with the
# client (against the persistent server on port 7174) or a one-time server
# (port 7175, against a plain client) failing allocations as set up; sets
# RUN to ok, failed, hung (not done within 60 s, then killed) or
# unkillable (still there 30 s after SIGKILL: stuck in the kernel), FIRED
# to the number of injected failures, WHERE to what it did.
#
# A hung rping is never killed while it may still fail allocations: a
# process killed by a signal skips the hook's destructor, and its exit
# path, dropping its 9p files with make-it-fail set, could break the 9p
# client for the whole VM (seen in CI: timeout's SIGTERM did this, and
# every exec after it failed with EINVAL). So the deadline is kept here
# by the clock (a loop count ran past timeout's limit on a slow VM), and
# before the kill, injection is switched off and every thread's
# make-it-fail cleared. timeout(1) stays as a backstop well past it.
enomem_run() {
	local fs0 fp0 crc=0 src=0 n cp fsp= i t0 tk
	fs0=$(fault_get failslab times)
	fp0=$(fault_get fail_page_alloc times)
	: > "$EH/server.log"
	if [ "$1" = server ]; then
		ip netns exec h1 timeout -k 5 300 "${HOOK[@]}" "$WP" rping -s -a 10.55.0.1 -p 7175 \
			-C 2 -S 1024 -V -v -d > "$EH/server.log" 2>&1 &
		fsp=$!
		wait_listen h1 7175 "$fsp"
		ip netns exec h2 timeout -k 5 300 "$WP" rping -c -a 10.55.0.1 -p 7175 \
			-C 2 -S 1024 -V -v > "$EH/client.log" 2>&1 &
		cp=$!
	else
		ip netns exec h2 timeout -k 5 300 "${HOOK[@]}" "$WP" rping -c -a 10.55.0.1 \
			-C 2 -S 1024 -V -v -d > "$EH/client.log" 2>&1 &
		cp=$!
	fi
	t0=$SECONDS
	local stuck=
	while kill -0 "$cp" 2>/dev/null || { [ -n "$fsp" ] && kill -0 "$fsp" 2>/dev/null; }; do
		[ $((SECONDS - t0)) -lt 60 ] || { stuck=1; break; }
		nap 0.1
	done
	FIRED=
	if [ -n "$stuck" ]; then
		FIRED=$(( fs0 - $(fault_get failslab times) + fp0 - $(fault_get fail_page_alloc times) ))
		fault_set failslab probability=0 times=0
		fault_set fail_page_alloc probability=0 times=0
		for i in $(pgrep -x rping); do
			for tk in /proc/"$i"/task/*/make-it-fail; do
				echo 0 > "$tk" 2>/dev/null || true
			done
		done
		enomem_dump
		for i in $(pgrep -x rping); do
			grep -q -- '-P' "/proc/$i/cmdline" 2>/dev/null || kill -KILL "$i" 2>/dev/null || true
		done
		# A process SIGKILL cannot end within 30 s is stuck in the kernel.
		for ((i = 0; i < 300; i++)); do
			! kill -0 "$cp" 2>/dev/null && { [ -z "$fsp" ] || ! kill -0 "$fsp" 2>/dev/null; } && break
			nap 0.1
		done
		if [ "$i" = 300 ]; then
			RUN=unkillable FIRED=-1 WHERE="an rping outlived SIGKILL by 30 s"
			return
		fi
	fi
	wait "$cp" || crc=$?
	[ -z "$fsp" ] || wait "$fsp" || src=$?
	[ -n "$FIRED" ] ||
		FIRED=$(( fs0 - $(fault_get failslab times) + fp0 - $(fault_get fail_page_alloc times) ))
	n=$(grep -c '^ping data' "$EH/client.log" || true)
	# 137: killed above (or by timeout's -k); 124: timeout's own SIGTERM.
	if [ -n "$stuck" ] || [ "$crc" = 124 ] || [ "$crc" = 137 ] || [ "$src" = 124 ] || [ "$src" = 137 ]; then
		RUN=hung
	elif [ "$crc" = 0 ] && [ "$src" = 0 ] && [ "$n" = 2 ] && ! grep -q mismatch "$EH/client.log"; then
		RUN=ok
	else
		RUN=failed
	fi
	# Where it stopped: rping -d logs each step it completed. The logs may
	# hold nothing else (a killed rping loses what stdio buffered), and
	# grep's "no line" must not end the test (set -e, pipefail).
	WHERE="client $crc, server $src, $n pings; $(cat "$EH/client.log" "$EH/server.log" |
		{ grep -v -e '^ping data' -e '^server ping data' -e '^cq_thread' -e 'completion$' \
			-e '^RDMA addr' -e '^rdma write from' -e '^Received rkey' -e '^server \(posted\|received\)' || true; } |
		tail -n 2 | cut -c1-60 | tr '\n' '|')"
}

test_85_enomem_injection() {
	uverbs_pair
	enomem_hook_up
	fault_set failslab probability=0 task-filter=Y verbose=0 ignore-gfp-wait=N interval=1 times=0 space=0
	fault_set fail_page_alloc probability=0 task-filter=Y verbose=0 ignore-gfp-wait=N \
		ignore-gfp-highmem=N min-order=0 interval=1 times=0 space=0
	ip netns exec h1 timeout 400 "$WP" rping -s -P -a 10.55.0.1 -C 2 -S 1024 -V > "$EH/pserver.log" 2>&1 &
	local psp=$! restarts=0
	wait_listen h1 7174 "$psp"
	# The allocations a run makes once failing: with a budget ("space",
	# octets for failslab, pages for fail_page_alloc) no run exhausts and
	# probability 100, each attribute counts them down without failing.
	local big=2000000000 slab_c page_c slab_s page_s side
	for side in client server; do
		fault_set failslab probability=100 times=1 space=$big
		fault_set fail_page_alloc probability=100 times=1 space=$big
		enomem_run $side
		[ "$RUN" = ok ] && [ "$FIRED" = 0 ] ||
			fail_because "a $side run without a failure did not pass: $WHERE" || return 1
		if [ $side = client ]; then
			slab_c=$((big - $(fault_get failslab space))) page_c=$((big - $(fault_get fail_page_alloc space)))
		else
			slab_s=$((big - $(fault_get failslab space))) page_s=$((big - $(fault_get fail_page_alloc space)))
		fi
	done
	echo "    failing part of a run allocates: client $slab_c octets of slab, $page_c pages; server $slab_s octets, $page_s pages"
	[ "$slab_c" -gt 0 ] && [ "$page_c" -gt 0 ] && [ "$slab_s" -gt 0 ] ||
		fail_because "the runs allocated nothing under the task filter: make-it-fail not set?" || return 1
	# Runs in turn: a control run without injection; failures at a random
	# point of the client's slab allocations (twice), of its page
	# allocations, and of the server's slab allocations; failures
	# throughout (5% of the client's slab and page allocations, its
	# teardown included). At a point, three allocations in a row fail:
	# every tracked allocation is followed by one of kmemleak's own, which
	# falls back to a reserve pool and so never fails, and slab refills
	# and page faults retry, so a single failure would mostly be absorbed.
	# Every mode once, then as many rounds as fit in 60 s.
	local start=$SECONDS i=0 mode ok=0 tolerated=0 failed=0 hung=0 killed=0 unkillable=0 unexplained=0 b t
	while [ $i -lt 6 ] || { [ $i -lt 36 ] && [ $((SECONDS - start)) -lt 60 ]; }; do
		if ! kill -0 "$psp" 2>/dev/null; then
			# rping -P exits when a connection fails while it is being
			# accepted (a client that died mid-handshake).
			restarts=$((restarts + 1))
			ip netns exec h1 timeout 400 "$WP" rping -s -P -a 10.55.0.1 -C 2 -S 1024 -V >> "$EH/pserver.log" 2>&1 &
			psp=$!
			wait_listen h1 7174 "$psp"
		fi
		fault_set failslab probability=0 times=0 space=0
		fault_set fail_page_alloc probability=0 times=0 space=0
		case $((i % 6)) in
		0) mode="control"; side=client ;;
		1 | 2) b=$(( (RANDOM * 32768 + RANDOM) % slab_c )); mode="client slab at $b"; side=client
			fault_set failslab probability=100 times=3 space=$b ;;
		3) b=$(( (RANDOM * 32768 + RANDOM) % page_c )); mode="client page at $b"; side=client
			fault_set fail_page_alloc probability=100 times=3 space=$b ;;
		4) b=$(( (RANDOM * 32768 + RANDOM) % slab_s )); mode="server slab at $b"; side=server
			fault_set failslab probability=100 times=3 space=$b ;;
		5) mode="client 5%"; side=client
			fault_set failslab probability=5 times=1000
			fault_set fail_page_alloc probability=5 times=1000 ;;
		esac
		t=$SECONDS
		enomem_run $side
		t=$((SECONDS - t))
		i=$((i + 1))
		case $RUN/$FIRED in
		unkillable/*) unkillable=$((unkillable + 1)) ;;
		# A process waiting in user space after an injected failure, which
		# SIGKILL ends: seen once, rping's server after its rdma_accept
		# failed with ENOMEM (its error path leaves the CQ thread waiting).
		# Reported; the checks after the runs (no QP left, kmemleak, a
		# verified rping) still hold it to a full cleanup. Without an
		# injected failure a hang fails the test.
		hung/0) hung=$((hung + 1)) ;;
		hung/*) killed=$((killed + 1)) ;;
		ok/0) ok=$((ok + 1)) ;;
		ok/*) tolerated=$((tolerated + 1)) ;;
		failed/0) unexplained=$((unexplained + 1)) ;;
		failed/*) failed=$((failed + 1)) ;;
		esac
		printf '    %2d %-24s %3ds %-6s %3d injected: %s\n' "$i" "$mode" "$t" "$RUN" "$FIRED" "$WHERE"
		[ "$RUN" != unkillable ] || break
		if [ "$RUN" = hung ] || [ "$RUN/$FIRED" = failed/0 ]; then
			sed 's/^/      client| /' "$EH/client.log" | tail -n 8
			sed 's/^/      server| /' "$EH/server.log" | tail -n 8
		fi
	done
	fault_set failslab probability=0 times=0 space=0
	fault_set fail_page_alloc probability=0 times=0 space=0
	kill "$psp" 2>/dev/null || true
	wait "$psp" 2>/dev/null || true
	echo "    $i runs in $((SECONDS - start)) s: $ok passed without a failure, $tolerated passed despite injected failures," \
		"$failed failed by injection, $killed hung after an injected failure and were killed," \
		"$hung hung without one, $unkillable could not be killed, $unexplained failed without an injected failure;" \
		"persistent server restarted $restarts times"
	[ "$unkillable" = 0 ] || fail_because "an rping is stuck in the kernel" || return 1
	enomem_hook_down
	[ "$hung" = 0 ] || fail_because "$hung runs hung without an injected failure" || return 1
	[ "$unexplained" = 0 ] || fail_because "$unexplained runs failed without an injected failure" || return 1
	[ $((failed + killed)) -ge 2 ] || fail_because "only $((failed + killed)) runs failed by injection: the test tested little" || return 1
	[ "$ok" -ge 1 ] || fail_because "no run without injection passed" || return 1
	# (Unless it was off from boot: the 'rest' VM of make check.)
	kmemleak_off_at_boot || ! dmesg | grep -q 'kmemleak: .*disabled' ||
		fail_because "kmemleak switched itself off" || return 1
	no_qps rs1 && no_qps rs2 || return 1
	verified_rping 10 1024
}

# Sends the stack refuses for want of memory. Every allocation the rping
# client makes from skbuff_fclone_cache (TCP's transmit buffers) inside
# its RDMA system calls fails (the hook arms it around them; up to 1000):
# each doorbell's send from the calling thread is refused. TCP then calls
# write-space at once (nothing in flight); a transmitter that just retries
# spins in the process's system call for as long as memory is short
# (siw_rs before this test: all 1000 failures in the first doorbell). The
# calling thread must give up after its retry and leave the send to a
# worker (whose allocations succeed here): about two failures a doorbell,
# and the pings arrive, verified.
test_86_send_refused_for_memory() {
	uverbs_pair
	local c=/sys/kernel/slab/skbuff_fclone_cache
	# A cache merged with others takes no per-cache flag (EINVAL).
	echo 1 > "$c/failslab" || fail_because "cannot flag $c for failslab (merged?)" || return 1
	enomem_hook_up
	fault_set failslab probability=100 task-filter=Y cache-filter=Y verbose=0 ignore-gfp-wait=N \
		interval=1 space=0 times=1000
	local rc=0 fired
	server_client h1 h2 60 -- "$WP" rping -s -a 10.55.0.1 -C 2 -S 1024 -V \
		-- "${HOOK[@]}" "$WP" rping -c -a 10.55.0.1 -C 2 -S 1024 -V -v || rc=1
	fired=$((1000 - $(fault_get failslab times)))
	fault_set failslab probability=0 times=0 cache-filter=N
	echo 0 > "$c/failslab"
	enomem_hook_down
	echo "    $fired of the client's socket buffer allocations failed"
	[ "$rc" = 0 ] || fail_because "rping did not complete with its sends refused for memory" || return 1
	[ "$fired" -ge 2 ] || fail_because "only $fired allocations failed: the refusal was not tested" || return 1
	[ "$fired" -le 100 ] || fail_because "$fired refused sends: the calling thread kept retrying" || return 1
	[ "$(grep -c 'ping data' /tmp/client.log || true)" = 2 ] || fail_because "the client did not print 2 pings" || return 1
	no_qps rs1 && no_qps rs2
}
