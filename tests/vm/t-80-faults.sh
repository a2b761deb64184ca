# SPDX-License-Identifier: GPL-2.0
# Faults under traffic (issue #6): packet loss and delay, the link going
# down and up, and `rdma link del` while processes hold QPs. Each ends with
# verified data or a clean failure, every object released, and the device
# (or a new one) serving a verified rping afterwards. The runner checks the
# kernel log (warnings, KASAN, lockdep, hung tasks) and kmemleak after each.

# verified_rping COUNT SIZE: a verified rping pair, rs1 serving rs2.
verified_rping() {
	server_client h1 h2 240 -- "$WP" rping -s -a 10.55.0.1 -C "$1" -S "$2" -V \
		-- "$WP" rping -c -a 10.55.0.1 -C "$1" -S "$2" -V
}

# no_qps DEV: no QP is left on DEV (every process's objects released).
no_qps() {
	local n i
	for ((i = 0; i < 50; i++)); do
		n=$(rdma res show qp link "$1/1" 2>/dev/null | grep -c lqpn || true)
		[ "$n" = 0 ] && return 0
		sleep 0.2
	done
	rdma res show qp link "$1/1" | sed 's/^/    qp| /'
	fail_because "$n QPs left on $1"
}

test_80_packet_loss_and_delay() {
	uverbs_pair
	modprobe sch_netem
	# 3% loss and 1 ms +- 1 ms of jitter (reordering the stream's segments)
	# each way: TCP retransmits, and every octet must still arrive intact.
	ip -n h1 link set veth1 txqueuelen 1000
	ip -n h2 link set veth2 txqueuelen 1000
	tc -n h1 qdisc add dev veth1 root netem loss 3% delay 1ms 1ms
	tc -n h2 qdisc add dev veth2 root netem loss 3% delay 1ms 1ms
	echo "    verified rping with 3% loss and jitter each way"
	verified_rping 20 8192 || return 1
	local drops=0 d h
	for h in h1:veth1 h2:veth2; do
		d=$({ tc -n "${h%:*}" -s qdisc show dev "${h#*:}" || true; } |
			awk '{ for (i = 1; i < NF; i++) if ($i == "(dropped") { sub(",", "", $(i + 1)); print $(i + 1); exit } }')
		drops=$((drops + ${d:-0}))
	done
	echo "    netem dropped $drops packets"
	[ "$drops" -gt 0 ] || fail_because "netem dropped nothing: the test did not test loss" || return 1
	tc -n h1 qdisc del dev veth1 root
	tc -n h2 qdisc del dev veth2 root
	no_qps rs1 && no_qps rs2
}

# endless_rping: a verified rping without end, rs1 serving rs2, the
# client printing one line per ping to /tmp/client.log; pids in SP, CP.
endless_rping() {
	ip netns exec h1 timeout 400 "$WP" rping -s -a 10.55.0.1 -C 0 -S 64 -V > /tmp/server.log 2>&1 &
	SP=$!
	wait_listen h1 7174
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
		sleep 0.2
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
	sleep 3
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

test_82_link_del_under_traffic() {
	uverbs_pair
	endless_rping
	wait_pings 20 120 || return 1
	local sp=$SP cp=$CP
	# The device cannot go while a process holds a context on it (siw_rs,
	# like siw, does not disassociate): `rdma link del` waits for it. The
	# processes are then killed; the deletion must complete.
	rdma link del rs1 &
	local dp=$!
	sleep 3
	# rping itself, not the `timeout` around it (which SIGKILL would not
	# pass on).
	pkill -KILL -x rping || true
	wait "$sp" 2>/dev/null || true
	wait "$cp" 2>/dev/null || true
	local i
	for ((i = 0; i < 150; i++)); do
		kill -0 "$dp" 2>/dev/null || break
		sleep 0.2
	done
	if kill -0 "$dp" 2>/dev/null; then
		fail_because "rdma link del rs1 still waits 30 s after its users died"
		return 1
	fi
	wait "$dp" || fail_because "rdma link del rs1 failed" || return 1
	expect_no_dev rs1 "rs1 still exists after link del" || return 1
	no_qps rs2 || return 1
	echo "    rs1 deleted under traffic; a new rs1 serves verified rping"
	ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
	verified_rping 10 1024
}
