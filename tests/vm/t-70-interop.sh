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

# tcp_count NS PORT STATE: TCP connections in NS on local port PORT in
# STATE (an ss state name).
tcp_count() {
	ip netns exec "$1" ss -Htn state "$3" "sport = :$2" 2>/dev/null | wc -l
}

# wait_grep PATTERN FILE: waits up to 30 s until FILE has PATTERN.
wait_grep() {
	local i
	for ((i = 0; i < 300; i++)); do
		grep -q "$1" "$2" && return 0
		nap 0.1
	done
	return 1
}

# wait_tcp_count NS PORT STATE N: waits up to 10 s until tcp_count is N.
wait_tcp_count() {
	local i
	for ((i = 0; i < 100; i++)); do
		[ "$(tcp_count "$1" "$2" "$3")" = "$4" ] && return 0
		nap 0.1
	done
	return 1
}

# A connection request the consumer never answers must not hold its socket
# for ever. A pyverbs listener on rs1 takes two requests and answers
# neither. The first peer gives up waiting for the MPA Reply and closes;
# its socket on rs1 sits in CLOSE-WAIT until the device reclaims the
# request, which it does when the next request comes (the second peer,
# which keeps waiting). The listener's end (its process killed) rejects
# the second: that peer must read a reject Reply, and no socket of either
# may stay behind.
test_74_unanswered_connection_request() {
	peer_topology rs1 siw_rs
	local port=7176 lpid
	cat > /tmp/unanswered.py <<'PY'
import sys, time
from pyverbs.cmid import CMID, AddrInfo
import pyverbs.cm_enums as ce
ai = AddrInfo(src='10.55.0.1', src_service=sys.argv[1], port_space=ce.RDMA_PS_TCP, flags=ce.RAI_PASSIVE)
lid = CMID(creator=ai)
lid.listen()
held = []
for n in (1, 2):
    held.append(lid.get_request())
    print('request', n, flush=True)
time.sleep(600)
PY
	ip netns exec h1 timeout 150 "$WP" /usr/bin/python3 /tmp/unanswered.py "$port" > /tmp/listener.log 2>&1 &
	lpid=$!
	wait_listen h1 "$port" "$lpid"
	tcp_listens "$lpid" "$port" || {
		log_tail '    listener| ' /tmp/listener.log 10
		fail_because "the pyverbs listener did not listen"
		return 1
	}
	echo "    first peer: waits 3 s for the MPA Reply, then closes"
	local rc=0
	ip netns exec h2 timeout 60 "$PEER" client --connect "10.55.0.1:$port" --mode handshake --timeout 3 \
		> /tmp/peer1.log 2>&1 || rc=$?
	log_tail '    peer1| ' /tmp/peer1.log 3
	[ "$rc" != 0 ] || fail_because "the first peer got an MPA Reply nobody sent" || return 1
	wait_grep 'request 1' /tmp/listener.log || fail_because "the listener never got the first request" || return 1
	wait_tcp_count h1 "$port" close-wait 1 ||
		fail_because "the first peer's connection is not in CLOSE-WAIT on rs1" || return 1

	echo "    second peer: its request reclaims the first"
	ip netns exec h2 timeout 120 "$PEER" client --connect "10.55.0.1:$port" --mode handshake --timeout 60 \
		> /tmp/peer2.log 2>&1 &
	local p2=$!
	rc=0
	wait_grep 'request 2' /tmp/listener.log || rc=$?
	log_tail '    listener| ' /tmp/listener.log 3
	[ "$rc" = 0 ] || fail_because "the listener never got the second request" || return 1
	wait_tcp_count h1 "$port" close-wait 0 ||
		fail_because "the first peer's unanswered request still holds its socket" || return 1
	[ "$(tcp_count h1 "$port" established)" = 1 ] ||
		fail_because "the second request's connection is not established" || return 1

	echo "    the listener ends: the second peer is rejected"
	kill "$lpid" 2>/dev/null || true
	wait "$lpid" 2>/dev/null || true
	rc=0
	wait "$p2" || rc=$?
	log_tail '    peer2| ' /tmp/peer2.log 3
	[ "$rc" != 0 ] || fail_because "the second peer was accepted" || return 1
	grep -qi 'reject' /tmp/peer2.log || fail_because "the second peer did not read a reject Reply" || return 1
	# (The rejecting end closes first, so its side of the second
	# connection may rest in TIME-WAIT: state "big" leaves that out.)
	wait_tcp_count h1 "$port" big 0 || {
		ip netns exec h1 ss -tan "sport = :$port" | sed 's/^/    ss| /'
		fail_because "sockets left on port $port"
		return 1
	}
}

# RFC 6581 peer-to-peer mode: the responder sends nothing until the
# initiator's RTR message is in (an FPDU that reaches the initiator before
# it has processed the MPA Reply may be taken for part of it). rfc7306's
# server on rs1 sends its keys (24 octets) as soon as it has accepted;
# iwarp-peer, the initiator, asks for peer-to-peer mode with one RTR type,
# waits 1 s before sending the RTR and fails if anything arrived
# meanwhile, then must receive the keys: the held Send goes once the RTR
# is in. With a Read RTR, rs1 answers the zero-length Read too, after the
# hold. (A module that does not hold fails the first step.) The rfc7306
# server fails afterwards, as the peer speaks no more of its protocol,
# and is stopped.
test_76_p2p_responder_waits_for_the_rtr() {
	peer_topology rs1 siw_rs
	local rtr port=7181 spid rc
	for rtr in write read; do
		ip netns exec h1 timeout 120 "$WP" build/rfc7306 server 10.55.0.1 $port > /tmp/server.log 2>&1 &
		spid=$!
		wait_listen h1 $port "$spid"
		rc=0
		ip netns exec h2 timeout 60 "$PEER" client --connect 10.55.0.1:$port --p2p --rtr $rtr \
			--rtr-delay 1000 --mode recv --timeout 50 > /tmp/peer.log 2>&1 || rc=$?
		kill "$spid" 2>/dev/null || true
		wait "$spid" 2>/dev/null || true
		echo "    $rtr RTR:"
		log_tail '    peer| ' /tmp/peer.log 3
		[ "$rc" = 0 ] || fail_because "$rtr RTR: the peer failed (exit $rc)" || return 1
		grep -q "RTR Some(${rtr^})" /tmp/peer.log || fail_because "rs1 did not choose the $rtr RTR" || return 1
		grep -q 'nothing from the responder in 1000 ms before our RTR' /tmp/peer.log &&
			grep -q 'received a Send of 24 octets' /tmp/peer.log ||
			fail_because "$rtr RTR: not silent before the RTR and the keys after it" || return 1
		port=$((port + 1))
	done
	no_qps rs1
}

# siw_rs as initiator with its device's mpa_p2p on asks for RFC 6581
# peer-to-peer mode, offering a zero-length RDMA Write as its RTR, and
# sends that RTR before anything else. iwarp-peer as responder with --p2p
# refuses a Request without peer-to-peer mode and holds its own sends
# until the RTR is in (its rping server's first Read waits for it, up to
# its --timeout): rping -c on rs1 must fail with mpa_p2p off (the default)
# and pass 10 verified pings with it on, the peer naming the Write RTR.
# Then both ends siw_rs: rfc7306's server, which sends first, on rs1 and
# its client on rs2 with mpa_p2p on (the server holds until the RTR).
# Not against upstream siw as responder: 6.12's siw takes the socket's
# callback lock for writing in softirq when the RTR arrives
# (siw_rtr_data_ready), and lockdep reports an inconsistent lock state
# (usage.rst).
test_77_p2p_initiator_sends_the_rtr() {
	peer_topology rs1 siw_rs
	local port=7191 rc=0 p
	[ "$(cat /sys/class/infiniband/rs1/mpa_p2p)" = 0 ] || fail_because "mpa_p2p is not off by default" || return 1
	! echo 2 > /sys/class/infiniband/rs1/mpa_p2p 2>/dev/null || fail_because "mpa_p2p took the value 2" || return 1
	ip netns exec h2 timeout 60 "$PEER" server --listen 10.55.0.2:$port --p2p --rtr write --count 1 --size 64 \
		--verify --timeout 20 > /tmp/peer.log 2>&1 &
	p=$!
	wait_listen h2 $port "$p"
	ip netns exec h1 timeout 60 "$WP" rping -c -a 10.55.0.2 -p $port -C 1 -S 64 -V > /tmp/rping.log 2>&1 || rc=$?
	kill "$p" 2>/dev/null || true
	wait "$p" 2>/dev/null || true
	echo "    mpa_p2p off, responder requiring peer-to-peer mode:"
	log_tail '    peer| ' /tmp/peer.log 2
	log_tail '    rping| ' /tmp/rping.log 2
	[ "$rc" != 0 ] || fail_because "rping connected without peer-to-peer mode to a responder requiring it" || return 1
	echo 1 > /sys/class/infiniband/rs1/mpa_p2p
	port=$((port + 1))
	echo "    mpa_p2p on, the same responder:"
	server_client h2 h1 120 -- "$PEER" server --listen 10.55.0.2:$port --p2p --rtr write --count 10 --size 4096 \
		--verify --timeout 50 -- "$WP" rping -c -a 10.55.0.2 -p $port -C 10 -S 4096 -V || return 1
	grep -q 'RTR Some(Write)' /tmp/server.log || fail_because "the peer did not settle on the Write RTR" || return 1
	ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
	echo 1 > /sys/class/infiniband/rs2/mpa_p2p
	port=$((port + 1))
	echo "    rfc7306 server on rs1, its client on rs2 with mpa_p2p on:"
	server_client h1 h2 120 -- "$WP" build/rfc7306 server 10.55.0.1 $port \
		-- "$WP" build/rfc7306 client 10.55.0.1 $port || return 1
	no_qps rs1
}
