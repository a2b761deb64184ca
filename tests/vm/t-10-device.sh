# SPDX-License-Identifier: GPL-2.0
# Device lifecycle: load/unload, link add/del, coexistence with upstream siw,
# netdev removal, bad input. (Issue: foundation.)

# Attributes every siw_rs device must show.
check_rnic() {
	local dev=$1
	have_dev "$dev" || fail_because "$dev missing" || return 1
	local nt
	nt=$(cat "/sys/class/infiniband/$dev/node_type")
	[ "$nt" = "4: RNIC" ] || fail_because "$dev node_type is '$nt'" || return 1
	[ "$(link_state "$dev")" = ACTIVE ] || fail_because "$dev port state '$(link_state "$dev")', want ACTIVE" || return 1
}

test_10_load_unload_loop() {
	scripts/topology up
	# Four rounds: each way of ending (link del of both, rmmod with one
	# device left) twice, on a module loaded again after each. (Ten took
	# 150 s of make check's time on the debug kernel.)
	local i
	for ((i = 1; i <= 4; i++)); do
		insmod "$SIW_RS_KO"
		ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
		ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
		check_rnic rs1 && check_rnic rs2 || return 1
		# Every other round, leave one device for rmmod to clean up.
		rdma link del rs1
		expect_no_dev rs1 "rs1 still exists after link del" || return 1
		if ((i % 2)); then rdma link del rs2; fi
		rmmod siw_rs
		expect_no_dev rs2 "rs2 survived rmmod" || return 1
	done
	echo "    4 rounds of insmod, 2x link add, link del, rmmod"
}

# The devices moved between network namespaces (`rdma dev set NAME netns
# NS`, in the RDMA core's exclusive mode, where a device belongs to one
# namespace). The core unregisters the device and registers it again in
# the other namespace, and allows that only to a driver that disassociates
# contexts. Each device is moved from the initial namespace to its
# netdev's; the pair must then serve verified rping; then rs1 is moved
# back while a process holds a context on it (doorbell-file live), which
# ends that context as a deletion would and must not wait for the process.
# The shared mode the other tests use is restored whatever happened (it
# can be changed only while no namespace but the initial one exists).
test_12_devices_moved_between_namespaces() {
	scripts/topology down
	rdma system set netns exclusive || fail_because "rdma system set netns exclusive failed" || return 1
	local rc=0 d ns
	devices_move_between_namespaces || rc=1
	for d in rs1 rs2; do
		for ns in "" h1 h2; do
			${ns:+ip netns exec $ns} rdma link del "$d" 2>/dev/null || true
		done
	done
	ip netns del siw_rs_init 2>/dev/null || true
	scripts/topology down
	rdma system set netns shared || fail_because "rdma system set netns shared failed" || rc=1
	return $rc
}

devices_move_between_namespaces() {
	scripts/topology up
	load_siw_rs
	ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1 || return 1
	ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2 || return 1
	rdma dev show rs1 > /dev/null 2>&1 || fail_because "exclusive mode: rs1 is not in the initial namespace" || return 1
	! ip netns exec h1 rdma dev show rs1 > /dev/null 2>&1 || fail_because "exclusive mode: rs1 is visible in h1 before the move" || return 1
	rdma dev set rs1 netns h1 || fail_because "rdma dev set rs1 netns h1 failed" || return 1
	rdma dev set rs2 netns h2 || fail_because "rdma dev set rs2 netns h2 failed" || return 1
	! rdma dev show rs1 > /dev/null 2>&1 || fail_because "rs1 is still in the initial namespace" || return 1
	ip netns exec h1 rdma dev show rs1 > /dev/null 2>&1 || fail_because "rs1 is not in h1" || return 1
	ip netns exec h2 rdma dev show rs2 > /dev/null 2>&1 || fail_because "rs2 is not in h2" || return 1
	echo "    rs1 moved to h1, rs2 to h2; verified rping between them"
	server_client h1 h2 240 -- "$WP" rping -s -a 10.55.0.1 -C 5 -S 1024 -V \
		-- "$WP" rping -c -a 10.55.0.1 -C 5 -S 1024 -V || return 1

	ip netns attach siw_rs_init 1 || fail_because "ip netns attach failed" || return 1
	live_context_across h1 rs1 "moving rs1 back" ip netns exec h1 rdma dev set rs1 netns siw_rs_init || return 1
	rdma dev show rs1 > /dev/null 2>&1 || fail_because "rs1 is not back in the initial namespace"
}

test_20_gid_guid_and_attrs() {
	scripts/topology up
	load_siw_rs
	ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
	local mac gid guid
	mac=$(ip -n h1 -br link show veth1 | awk '{print $3}')
	gid=$(cat /sys/class/infiniband/rs1/ports/1/gids/0)
	# GID = MAC followed by zeros: aabb:ccdd:eeff:0000:...
	want=$(echo "$mac" | tr -d : | sed 's/\(....\)\(....\)\(....\)/\1:\2:\3/'):0000:0000:0000:0000:0000
	[ "$gid" = "$want" ] || fail_because "gid $gid, want $want (mac $mac)" || return 1
	# Node GUID is the EUI-64 of the MAC (U/L bit flipped, ff:fe inserted).
	guid=$(cat /sys/class/infiniband/rs1/node_guid)
	local m=(${mac//:/ })
	local b0=$(printf '%02x' $((0x${m[0]} ^ 2)))
	want="$b0${m[1]}:${m[2]}ff:fe${m[3]}:${m[4]}${m[5]}"
	[ "$guid" = "$want" ] || fail_because "node_guid $guid, want $want" || return 1
	grep -q "siw_rs" /sys/class/infiniband/rs1/node_desc || fail_because "node_desc $(cat /sys/class/infiniband/rs1/node_desc)" || return 1
	# Port: iWARP, MTU from the netdev, link layer Ethernet.
	[ "$(cat /sys/class/infiniband/rs1/ports/1/link_layer)" = Ethernet ] || fail_because "link_layer" || return 1
	grep -q "ACTIVE" /sys/class/infiniband/rs1/ports/1/state || fail_because "port state $(cat /sys/class/infiniband/rs1/ports/1/state)" || return 1
	# Port follows the netdev: down -> DOWN, up -> ACTIVE.
	ip -n h1 link set veth1 down
	[ "$(link_state rs1)" = DOWN ] || fail_because "state after veth1 down: $(link_state rs1)" || return 1
	ip -n h1 link set veth1 up
	nap 0.5
	[ "$(link_state rs1)" = ACTIVE ] || fail_because "state after veth1 up: $(link_state rs1)" || return 1
	rdma link del rs1
}

test_30_coexist_with_upstream_siw() {
	mixed_pair
	check_rnic rs2 || return 1
	[ "$(link_state siw1)" = ACTIVE ] || fail_because "siw1 state $(link_state siw1)" || return 1
	rdma link show
	# Deleting the veth pair removes the siw_rs device (and upstream's).
	ip -n h1 link del veth1
	wait_dev_gone rs2 || fail_because "rs2 still there after veth deletion" || return 1
	wait_dev_gone siw1 || fail_because "siw1 still there after veth deletion" || return 1
	rmmod siw_rs
	rmmod siw
}

test_40_bad_input() {
	scripts/topology up
	load_siw_rs
	# A netdev that does not exist.
	must_fail ip netns exec h1 rdma link add rsx type siw_rs netdev nosuchdev0 || return 1
	expect_no_dev rsx "device created on a missing netdev" || return 1
	# Twice on one netdev: the second fails, the first is untouched.
	ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
	must_fail ip netns exec h1 rdma link add rs1b type siw_rs netdev veth1 || return 1
	expect_no_dev rs1b "second device on veth1" || return 1
	check_rnic rs1 || return 1
	# The same name twice, on another netdev.
	must_fail ip netns exec h2 rdma link add rs1 type siw_rs netdev veth2 || return 1
	# An over-long name (IB_DEVICE_NAME_MAX is 64).
	local long
	long=$(printf 'r%.0s' {1..80})
	must_fail ip netns exec h2 rdma link add "$long" type siw_rs netdev veth2 || return 1
	expect_no_dev "$long" "over-long name accepted" || return 1
	[ "$(ls /sys/class/infiniband | wc -l)" = 1 ] || fail_because "devices: $(ls /sys/class/infiniband)" || return 1
	# rmmod with a device present removes it.
	rmmod siw_rs
	expect_no_dev rs1 "rs1 survived rmmod" || return 1
	# After all that, a device can be created again.
	insmod "$SIW_RS_KO"
	ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
	check_rnic rs2
}
