# SPDX-License-Identifier: GPL-2.0
# Wire interoperation and hostile peers: the userspace iwarp-peer (built on
# the protocol core, over plain TCP) against rping on an upstream siw device
# and on a siw_rs device, in both roles, with verified data; then the same
# peer injecting forbidden frames, which must each get the RFC TERMINATE,
# fail only that connection, and leave the device serving the next one.
# (Issues: kernel data path, robustness.)

PEER=${SIW_RS_PEER:-target/debug/iwarp-peer}

# One RDMA device of type $2 named $1 on h1/veth1; h2 holds only the peer.
# The peer gets 50 s per step (--timeout): its default 10 s is shorter than
# a loaded host may take to start rping in the VM, and a peer server that
# gave up makes the late rping's connect fail with "Connection refused".
peer_topology() {
	scripts/topology up
	modprobe siw
	load_siw_rs
	ip netns exec h1 rdma link add "$1" type "$2" netdev veth1
}

test_70_peer_client_vs_rping_server() {
	local dev type
	for dev in siw1:siw rs1:siw_rs; do
		type=${dev#*:} dev=${dev%:*}
		peer_topology "$dev" "$type"
		echo "    rping -s on $type, iwarp-peer client"
		server_client h1 h2 120 -- "$WP" rping -s -a 10.55.0.1 -C 10 -S 4096 -V \
			-- "$PEER" client --connect 10.55.0.1:7174 --count 10 --size 4096 --verify --timeout 50 -v || return 1
		[ "$(grep -c 'ping' /tmp/client.log)" -ge 10 ] || fail_because "peer reported fewer than 10 pings" || return 1
		rdma link del "$dev"
	done
}

test_71_rping_client_vs_peer_server() {
	local dev type
	for dev in siw1:siw rs1:siw_rs; do
		type=${dev#*:} dev=${dev%:*}
		peer_topology "$dev" "$type"
		echo "    iwarp-peer server, rping -c on $type"
		server_client h2 h1 120 -- "$PEER" server --listen 10.55.0.2:7174 --count 10 --size 4096 --verify --timeout 50 \
			-- "$WP" rping -c -a 10.55.0.2 -C 10 -S 4096 -V || return 1
		rdma link del "$dev"
	done
}

# hostile KIND CODE ROLE: the peer injects KIND at a rping on rs1 and must
# receive TERMINATE CODE (layer:type:code); rping must see its connection
# fail (it does not always exit non-zero: its state machine ends in ERROR,
# state 10, or it reports the error or disconnect); afterwards a clean
# rping over the same device must pass. The peer waits up to 50 s for
# each step (its default 10 s is too short when a loaded host slows the VM
# down: rping may take longer than that just to start).
hostile() {
	local kind=$1 code=$2 role=$3 prc=0 rrc=0
	if [ "$role" = server ]; then
		ip netns exec h2 timeout 60 "$PEER" server --listen 10.55.0.2:7174 --size 64 --timeout 50 \
			--inject "$kind" --expect-term "$code" > /tmp/peer.log 2>&1 &
		local p=$!
		wait_listen h2 7174 "$p"
		ip netns exec h1 timeout 60 "$WP" rping -c -a 10.55.0.2 -C 1 -S 64 -V \
			> /tmp/rping.log 2>&1 || rrc=$?
		wait "$p" || prc=$?
	else
		ip netns exec h1 timeout 60 "$WP" rping -s -a 10.55.0.1 -C 1 -S 64 -V \
			> /tmp/rping.log 2>&1 &
		local r=$!
		wait_listen h1 7174 "$r"
		ip netns exec h2 timeout 60 "$PEER" client --connect 10.55.0.1:7174 --size 64 --timeout 50 \
			--inject "$kind" --expect-term "$code" > /tmp/peer.log 2>&1 || prc=$?
		wait "$r" || rrc=$?
	fi
	sed 's/^/    peer| /' /tmp/peer.log | tail -n 4
	sed 's/^/    rping| /' /tmp/rping.log | tail -n 3
	[ "$prc" = 0 ] || fail_because "$kind: the peer did not get TERMINATE $code (exit $prc)" || return 1
	[ "$rrc" != 0 ] || grep -qE 'state 10|error|DISCONNECT' /tmp/rping.log ||
		fail_because "$kind: rping did not notice its connection failing" || return 1
}

test_72_hostile_peer_gets_the_rfc_terminate() {
	peer_topology rs1 siw_rs
	# Against rping's client, after it advertised its buffer.
	hostile write-out-of-bounds 1:1:1 server || return 1
	hostile read-out-of-bounds 0:1:1 server || return 1
	# Against rping's server.
	hostile invalid-stag 1:1:0 client || return 1
	hostile bad-ddp-version 1:2:6 client || return 1
	hostile bad-rdmap-version 0:2:5 client || return 1
	hostile unknown-opcode 0:2:6 client || return 1
	hostile msn-gap 1:2:3 client || return 1
	hostile send-too-long 1:2:5 client || return 1
	hostile bad-crc 2:0:2 client || return 1
	# The device still serves a well-behaved peer.
	server_client h1 h2 120 -- "$WP" rping -s -a 10.55.0.1 -C 5 -S 1024 -V \
		-- "$PEER" client --connect 10.55.0.1:7174 --count 5 --size 1024 --verify --timeout 50 || return 1
}

# mpa_set DEV crc markers: the per-device MPA settings in sysfs.
mpa_set() {
	echo "$2" > "/sys/class/infiniband/$1/mpa_crc" && echo "$3" > "/sys/class/infiniband/$1/mpa_markers"
}

# Per-device MPA settings (sysfs mpa_crc, mpa_markers): bad values are
# refused; the peer sees what siw_rs asked for, and verified rping data
# crosses connections with CRC and markers in each direction: siw_rs
# receiving markers it asked for, siw_rs inserting markers a peer asked
# for, siw_rs on both ends, and CRC with upstream siw both ways round.
test_73_mpa_crc_and_markers_settings() {
	peer_topology rs1 siw_rs
	local f=/sys/class/infiniband/rs1
	[ "$(cat $f/mpa_crc) $(cat $f/mpa_markers)" = "0 0" ] || fail_because "defaults are not 0 0" || return 1
	if echo 2 > $f/mpa_crc 2>/dev/null || echo x > $f/mpa_markers 2>/dev/null; then
		fail_because "sysfs accepted a value other than 0 or 1"
		return 1
	fi
	[ "$(cat $f/mpa_crc) $(cat $f/mpa_markers)" = "0 0" ] || fail_because "a refused write changed a setting" || return 1

	echo "    rs1 asks for CRC and markers; iwarp-peer client asks for neither"
	mpa_set rs1 1 1
	server_client h1 h2 120 -- "$WP" rping -s -a 10.55.0.1 -C 10 -S 4096 -V \
		-- "$PEER" client --connect 10.55.0.1:7174 --count 10 --size 4096 --verify --timeout 50 -v || return 1
	grep -q 'CRC on, markers rx false tx true' /tmp/client.log ||
		fail_because "the peer did not negotiate CRC and markers towards rs1" || return 1

	echo "    rs1 asks for nothing; iwarp-peer client asks for CRC and markers"
	mpa_set rs1 0 0
	server_client h1 h2 120 -- "$WP" rping -s -a 10.55.0.1 -C 10 -S 4096 -V \
		-- "$PEER" client --connect 10.55.0.1:7174 --count 10 --size 4096 --verify --timeout 50 -v --crc on --markers || return 1
	grep -q 'CRC on, markers rx true' /tmp/client.log ||
		fail_because "rs1 did not agree to insert markers" || return 1

	echo "    siw_rs on both ends, each asking for markers, rs2 for CRC"
	ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
	mpa_set rs1 0 1
	mpa_set rs2 1 1
	server_client h1 h2 120 -- "$WP" rping -s -a 10.55.0.1 -C 20 -S 10000 -V \
		-- "$WP" rping -c -a 10.55.0.1 -C 20 -S 10000 -V || return 1

	echo "    CRC with upstream siw, both ways round"
	rdma link del rs2
	ip netns exec h2 rdma link add siw2 type siw netdev veth2
	mpa_set rs1 1 0
	server_client h1 h2 120 -- "$WP" rping -s -a 10.55.0.1 -C 10 -S 4096 -V \
		-- "$WP" rping -c -a 10.55.0.1 -C 10 -S 4096 -V || return 1
	server_client h2 h1 120 -- "$WP" rping -s -a 10.55.0.2 -C 10 -S 4096 -V \
		-- "$WP" rping -c -a 10.55.0.2 -C 10 -S 4096 -V || return 1
}
