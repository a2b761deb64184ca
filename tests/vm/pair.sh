# SPDX-License-Identifier: GPL-2.0
# Two kernels joined by a NIC: one half of a scripts/vm-pair run, sourced
# by tests/vm/run in each of two VMs joined by a QEMU link (a virtio NIC
# whose frames travel as UDP datagrams between the two QEMU processes).
# test_66: NVMe over Fabrics (issue #4); test_67: siw_rs sending by
# reference ("zero-copy") over the NIC; test_68: iSER.
#
# In one kernel nvme-rdma and nvmet-rdma always share an RDMA device (see
# t-60-nvmeof.sh), so a target on one driver and a host on the other needs
# two kernels:
#
#   target VM: NIC 52:54:00:66:00:01, 10.66.0.1, PAIR_DRIVER's device, an
#              nvmet-rdma port exporting a RAM disk
#   host VM:   NIC 52:54:00:66:00:02, 10.66.0.2, PAIR_DRIVER's device,
#              nvme-rdma: a verified write/read pass, a disconnect during
#              I/O, a reconnect and a second verified pass
#
# The host tells the target it is finished over the same link (TCP port
# 4499), whatever its own result; each side fails on its own findings, and
# tests/vm/run adds the kernel-log and kmemleak checks to both. A side that
# runs upstream siw has a test name ending in _upstream_siw: siw_rs is not
# loaded in that VM, and reports with frames only in siw are siw's own.
#
# Environment: PAIR_ROLE target|host, PAIR_DRIVER siw_rs|siw (this VM's),
# PAIR_PEER_DRIVER (the other VM's),
# SIW_RS_NVMEOF_MIB (t-60-nvmeof.sh), PAIR_WAIT seconds to wait for the
# other VM (default 1200: under TCG, with both VMs booting on two cores, a
# boot can take minutes).

PAIR_TARGET=10.66.0.1
pair_tests_before=$(declare -F | awk '$3 ~ /^test_/ { print $3 }')
. tests/vm/t-60-nvmeof.sh
ISER_ADDR=$PAIR_TARGET
. tests/vm/t-65-iser.sh
# Only their helpers: their single-VM tests run in make check's VMs. (A
# list of names to unset missed test_63 when it was added, and the pair
# ran it in both VMs, about 2 min each, the host VM's boot competing.)
unset -f $(declare -F | awk '$3 ~ /^test_/ { print $3 }' | grep -vxF -e "$pair_tests_before")

PAIR_SIGNAL_PORT=4499
PAIR_WAIT=${PAIR_WAIT:-1200}

# pair_link N: address 10.66.0.N on the pair NIC (its name in PAIR_IFC)
# and a PAIR_DRIVER device (p1 or p2) on it.
pair_link() {
	local ifc
	ifc=$(ip -o link | awk -v mac="52:54:00:66:00:0$1" '$0 ~ mac { sub(":", "", $2); print $2 }')
	[ -n "$ifc" ] || fail_because "no NIC with MAC 52:54:00:66:00:0$1: not booted by scripts/vm-pair?" || return 1
	PAIR_IFC=$ifc
	# Called as `pair_link N || return 1`, where `set -e` does not apply:
	# every step checks its own result.
	# Each test calls it (the runner deletes the devices after a test).
	ip addr replace "10.66.0.$1/24" dev "$ifc" && ip link set "$ifc" up ||
		fail_because "cannot configure $ifc" || return 1
	case $PAIR_DRIVER in
	siw_rs) load_siw_rs ;;
	siw) grep -q '^siw ' /proc/modules || modprobe siw ;;
	*) fail_because "PAIR_DRIVER must be siw_rs or siw, not '$PAIR_DRIVER'"; return 1 ;;
	esac || fail_because "cannot load $PAIR_DRIVER" || return 1
	rdma link add "p$1" type "$PAIR_DRIVER" netdev "$ifc" && have_dev "p$1" ||
		fail_because "cannot add a $PAIR_DRIVER device on $ifc" || return 1
	echo "    $PAIR_ROLE on $PAIR_DRIVER: device p$1 on $ifc, 10.66.0.$1 ($(cat "/sys/class/infiniband/p$1/ports/1/state"))"
}

# The kernel log lines of the drivers and the CM, shown when a side fails.
pair_dmesg() {
	dmesg | grep -E 'nvme|siw|iw_cm|rdma|cma' | tail -n 20 | sed 's/^/    dmesg| /'
}

pair_target() {
	trap 'rc=$?; kill "$HANG_WATCH" ${PAIR_FOLLOW:-} 2>/dev/null; [ "$rc" = 0 ] || pair_dmesg' EXIT
	hang_watch "${PAIR_WATCH:-$((PAIR_WAIT + 900))}"
	pair_link 1 || return 1
	nvmeof_modules
	# Kernel log lines from before the port is enabled, kept apart: a
	# count of `dmesg` taken after enabling it raced with the host, whose
	# first connection can come before the count under the debug kernel.
	dmesg -W > /tmp/pair-kmsg.log 2>&1 &
	# Global, so that the EXIT trap also ends it when the target fails early.
	PAIR_FOLLOW=$!
	nvmeof_target "$PAIR_TARGET"
	# nvmet enables a port even when the RDMA CM cannot bind it (it only
	# logs that): the target must really listen before the host may try.
	[ -n "$(ss -Hltn "sport = :4420")" ] || fail_because "nothing listens on $PAIR_TARGET:4420" || return 1
	local verdict ctrls
	verdict=$(pair_await)
	kill "$PAIR_FOLLOW" 2>/dev/null || true
	ctrls=$(grep -c 'nvmet: creating nvm controller' /tmp/pair-kmsg.log || true)
	echo "    the host says '${verdict:-nothing}'; $ctrls controllers were created here"
	nvmeof_target_down
	# On siw_rs (zcopy on by default on a NIC), the data of the host's
	# reads goes out from nvmet's pages by reference: two verified passes,
	# at least one message per 64 KiB each.
	local zc=
	[ "$PAIR_DRIVER" != siw_rs ] || zc=$(cat /sys/class/infiniband/p1/zcopy_sends)
	rdma link del p1
	[ -n "$verdict" ] || fail_because "no word from the host VM in $((PAIR_WAIT + 600)) s" || return 1
	# The host's connection and its reconnection after the disconnect
	# during I/O (discovery controllers are counted apart).
	[ "$ctrls" -ge 2 ] || fail_because "only $ctrls controllers: the host never reached this target" || return 1
	pair_zc_check "$zc" "$NVMEOF_MIB"
}

# pair_zc_check ZC MIB: a siw_rs target's zcopy_sends ZC (empty on upstream
# siw: nothing to check) counts at least one message per 64 KiB of the two
# verified passes of MIB MiB the host read.
pair_zc_check() {
	[ -n "$1" ] || return 0
	echo "    $1 messages sent by reference"
	[ "$1" -ge $(($2 * 16 * 2)) ] || fail_because "zcopy_sends is $1, want at least $(($2 * 16 * 2))"
}

# pair_await: the host's verdict (pair_tell), once it has said it: the
# host tries to reach the target for PAIR_WAIT s, then needs time for
# its I/O. Empty when nothing came.
pair_await() {
	timeout $((PAIR_WAIT + 600)) /usr/bin/python3 -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
c, _ = s.accept()
print(c.makefile().readline().strip())
' "$PAIR_TARGET" "$PAIR_SIGNAL_PORT" || true
}

# pair_tell WORD: the host's verdict to the target (a few tries: the
# target may still be setting up its listener).
pair_tell() {
	local i
	for ((i = 0; i < 30; i++)); do
		echo "$1" 2>/dev/null > "/dev/tcp/$PAIR_TARGET/$PAIR_SIGNAL_PORT" && return 0
		nap 2
	done
	echo "    (could not tell the target '$1')"
}

pair_host() {
	# Whatever happens here, the target must hear that the host is done.
	trap 'rc=$?; kill "$HANG_WATCH" 2>/dev/null; [ "$rc" = 0 ] || pair_dmesg; pair_tell "done rc=$rc"' EXIT
	hang_watch "${PAIR_WATCH:-$((PAIR_WAIT + 600))}"
	pair_link 2 || return 1
	modprobe -a nvme-rdma
	local start=$SECONDS tries=0
	until timeout 60 nvme discover -t rdma -a "$PAIR_TARGET" -s 4420 >/tmp/discover.log 2>&1; do
		tries=$((tries + 1))
		if [ $((SECONDS - start)) -ge "$PAIR_WAIT" ]; then
			sed 's/^/    discover| /' /tmp/discover.log | tail -n 5
			fail_because "the target VM did not answer discovery in $PAIR_WAIT s ($tries tries)"
			return 1
		fi
		# Now and then, what the last try said.
		[ $((tries % 12)) != 1 ] || sed 's/^/    discover| /' /tmp/discover.log | tail -n 2
		nap 5
	done
	echo "    the target answered discovery after $((SECONDS - start)) s"
	local dev desc="$PAIR_DRIVER host, $PAIR_OTHER target"
	dev=$(nvmeof_connect "$PAIR_TARGET") || return 1
	nvmeof_verify "$dev" "$desc" || { nvmeof_disconnect; return 1; }
	# I/O in flight while the controller goes away: the writer must fail
	# or finish, never hang.
	timeout 300 dd if=/dev/urandom of="$dev" bs=64k count=64 oflag=direct status=none 2>/dev/null &
	local writer=$!
	nap 2
	nvmeof_disconnect
	wait "$writer" || true
	echo "    disconnected during a write"
	dev=$(nvmeof_connect "$PAIR_TARGET") || return 1
	nvmeof_verify "$dev" "$desc, after a reconnect" || { nvmeof_disconnect; return 1; }
	nvmeof_disconnect
	rdma link del p2
}

# test_67: zero-copy over the NIC. The siw_rs side, with zcopy on (its
# default on a NIC), runs zcopy-verify's client against the siw side's
# server (12 Sends and 12 RDMA Writes of 16 KiB-1 MiB, sent by reference),
# then serves the siw side's client (12 RDMA Reads, whose responses it sends
# by reference). The receiving end checks every octet; zcopy_sends must grow
# by 24 and by 12; the siw_rs side waits until the kernel has destroyed the
# connections' sockets, so that the runner's kernel-log check sees their
# end. The first part runs with 2 % loss on siw_rs's side. Over veth
# (test_59) the receiver copies every skb at once; on a NIC, TCP unclones
# skbs whose clones the NIC still holds, and a note without
# SKBFL_DONT_ORPHAN had their pages copied out and the socket's memory
# accounting upset: WARNING at inet_sock_destruct (sk_forward_alloc).
ZC_PORT_SENDS=7301 ZC_PORT_READS=7302
ZC_VERIFY=build/zcopy-verify

# zc_client ADDR PORT LOG [WRAPPER]: zcopy-verify's client, tried again
# while the server does not listen yet, for up to PAIR_WAIT s. LOG keeps
# every try's words (a try that reached the server and failed its connect
# anyway explains the server's failure); the retry looks at the last one's.
zc_client() {
	local start=$SECONDS tries=0
	: > "$3"
	until ZCOPY_VERIFY_SHORT=1 timeout 600 ${4:-} $ZC_VERIFY client "$1" "$2" > "$3.try" 2>&1; do
		tries=$((tries + 1))
		sed "s/^/[try $tries] /" "$3.try" >> "$3"
		grep -q 'rdma_connect' "$3.try" || { log_tail '    client| ' "$3" 15; fail_because "zcopy-verify's client failed"; return 1; }
		[ $((SECONDS - start)) -lt "$PAIR_WAIT" ] || {
			log_tail '    client| ' "$3" 5; fail_because "no zcopy-verify server on $1:$2 in $PAIR_WAIT s"; return 1; }
		nap 2
	done
	cat "$3.try" >> "$3"
	echo "    client connected after $tries failed connects"
	log_tail '    client| ' "$3" 5
}

# zc_server ADDR PORT LOG [WRAPPER]: zcopy-verify's server, its first
# connection served, waiting for it up to PAIR_WAIT s and 600 s more.
zc_server() {
	ZCOPY_VERIFY_SHORT=1 timeout $((PAIR_WAIT + 600)) ${4:-} $ZC_VERIFY server "$1" "$2" > "$3" 2>&1 ||
		{ log_tail '    server| ' "$3" 15; fail_because "zcopy-verify's server failed or timed out"; return 1; }
	log_tail '    server| ' "$3" 5
}

zc_sends() { cat "/sys/class/infiniband/$1/zcopy_sends"; }

# zc_start N: what both sides of test_67 begin with: the kernel log's
# tail on failure, a bound on the test's time, and the device on the NIC.
zc_start() {
	trap 'rc=$?; kill "$HANG_WATCH" 2>/dev/null; [ "$rc" = 0 ] || pair_dmesg' EXIT
	hang_watch "${PAIR_WATCH:-$((PAIR_WAIT + 900))}"
	[ -x $ZC_VERIFY ] || fail_because "$ZC_VERIFY is not built" || return 1
	pair_link "$1"
}

zc_siw_rs() {
	local n=$1 peer=$2 dev=p$1 before mid after
	zc_start "$n" || return 1
	[ "$(cat /sys/class/infiniband/$dev/zcopy)" = 1 ] || fail_because "zcopy is not on by default on a NIC" || return 1
	before=$(zc_sends $dev)
	# 2 % of this side's frames dropped: TCP sends again from the very
	# pages, after splitting the skbs it holds.
	modprobe sch_netem && tc qdisc add dev "$PAIR_IFC" root netem loss 2% ||
		fail_because "cannot add netem to $PAIR_IFC" || return 1
	zc_client "10.66.0.$peer" $ZC_PORT_SENDS /tmp/zc-client.log "$WP" || { tc qdisc del dev "$PAIR_IFC" root; return 1; }
	local drops
	drops=$(qdisc_drops "$PAIR_IFC")
	tc qdisc del dev "$PAIR_IFC" root
	echo "    netem dropped ${drops:-no} frames"
	[ "${drops:-0}" -gt 0 ] || fail_because "netem dropped nothing" || return 1
	grep -q 'completed in order, 24 of them of 16 KiB or more' /tmp/zc-client.log ||
		fail_because "the client did not complete its 24 large messages" || return 1
	mid=$(zc_sends $dev)
	[ $((mid - before)) = 24 ] || fail_because "zcopy_sends grew by $((mid - before)) for the Sends and Writes, want 24" || return 1
	zc_server "10.66.0.$n" $ZC_PORT_READS /tmp/zc-server.log "$WP" || return 1
	after=$(zc_sends $dev)
	[ $((after - mid)) = 12 ] || fail_because "zcopy_sends grew by $((after - mid)) for the Read Responses, want 12" || return 1
	echo "    24 Sends and Writes and 12 Read Responses sent by reference over the NIC, verified by $PAIR_OTHER"
	bounded 60 rdma link del $dev || fail_because "rdma link del $dev did not finish" || return 1
	# The sockets' end: the kernel's last word on their memory accounting.
	local i left
	for ((i = 0; i < 300; i++)); do
		# (grep finds nothing when all is well: `|| true` under set -e.)
		left=$(ss -Htan state all "( sport = :$ZC_PORT_READS or dport = :$ZC_PORT_SENDS )" | grep -v TIME-WAIT || true)
		[ -n "$left" ] || return 0
		nap 0.2
	done
	printf '%s\n' "$left" | sed 's/^/    ss| /'
	fail_because "the connections' sockets were not destroyed in 60 s"
}

zc_siw() {
	local n=$1 peer=$2
	zc_start "$n" || return 1
	zc_server "10.66.0.$n" $ZC_PORT_SENDS /tmp/zc-server.log || return 1
	grep -q '12 Sends of 16 KiB-1 MiB verified' /tmp/zc-server.log &&
		grep -q '12 RDMA Writes of 16 KiB-1 MiB verified' /tmp/zc-server.log ||
		fail_because "not every Send and Write was verified" || return 1
	# Every request signalled: siw completes an unsignalled one of a page
	# or more when the socket takes its pages, and the client's reuse of
	# the buffer then reaches siw_rs (zcopy-verify.c).
	ZCOPY_VERIFY_SIGNAL_ALL=1 zc_client "10.66.0.$peer" $ZC_PORT_READS /tmp/zc-client.log || return 1
	grep -q '12 RDMA Reads of 16 KiB-1 MiB verified' /tmp/zc-client.log ||
		fail_because "not every Read was verified" || return 1
	echo "    12 Sends, 12 Writes and 12 Read Responses from siw_rs's references verified"
	bounded 60 rdma link del p$n || fail_because "rdma link del p$n did not finish" || return 1
}

# test_68: iSER (t-65-iser.sh) between the two kernels. The target VM
# exports LIO's RAM disk through an iSER portal on 10.66.0.1:3260 (the TCP
# portal in a namespace of its own, as in test_65); the host VM's ib_iser,
# logged in by iscsid, writes a random pattern and reads it back, then
# again over a second session. The target counts the accepted logins
# (both sessions reached it) and, on siw_rs, the RDMA Writes of the data
# the host read going out by reference (at least one per 64 KiB).
iser_pair_target() {
	trap 'rc=$?; kill "$HANG_WATCH" 2>/dev/null; [ "$rc" = 0 ] || pair_dmesg; iser_cleanup' EXIT
	hang_watch "${PAIR_WATCH:-$((PAIR_WAIT + 900))}"
	iser_cleanup
	pair_link 1 || return 1
	iser_target || return 1
	# Only the RDMA device's listener is in this namespace (LIO's TCP
	# portal listens in isct).
	[ -n "$(ss -Hltn "sport = :3260")" ] || fail_because "nothing listens on $ISER_ADDR:3260" || return 1
	local verdict logins zc=
	verdict=$(pair_await)
	logins=$(cat "$LIO/iscsi/$ISER_IQN/fabric_statistics/iscsi_login_stats/accepts" 2>/dev/null || echo 0)
	echo "    the host says '${verdict:-nothing}'; $logins logins were accepted here"
	[ "$PAIR_DRIVER" != siw_rs ] || zc=$(zc_sends p1)
	iser_cleanup
	bounded 60 rdma link del p1 || fail_because "rdma link del p1 did not finish after iSER was stopped" || return 1
	[ -n "$verdict" ] || fail_because "no word from the host VM in $((PAIR_WAIT + 600)) s" || return 1
	[ "$logins" -ge 2 ] || fail_because "only $logins logins: the host's two sessions did not both reach this target" || return 1
	pair_zc_check "$zc" "$ISER_MIB"
}

iser_pair_host() {
	trap 'rc=$?; kill "$HANG_WATCH" 2>/dev/null; [ "$rc" = 0 ] || pair_dmesg; iser_cleanup; pair_tell "done rc=$rc"' EXIT
	hang_watch "${PAIR_WATCH:-$((PAIR_WAIT + 600))}"
	iser_cleanup
	pair_link 2 || return 1
	iser_iscsid || return 1
	local dev qps
	dev=$(iser_login "$PAIR_WAIT") || return 1
	qps=$(rdma res show qp link p2/1 2>/dev/null | grep -c 'state RTS' || true)
	echo "    logged in over iSER to $PAIR_OTHER ($dev); $qps QPs in RTS on p2"
	[ "$qps" -ge 1 ] || fail_because "no QP in RTS on p2" || return 1
	iser_io "$dev" || return 1
	iser_logout || fail_because "the second logout failed or timed out" || return 1
	iser_cleanup
	bounded 60 rdma link del p2 || fail_because "rdma link del p2 did not finish after iSER was stopped" || return 1
}

case ${PAIR_DRIVER:-} in siw) PAIR_OTHER=siw_rs PAIR_NAME=upstream_siw ;; *) PAIR_OTHER=siw PAIR_NAME=siw_rs ;; esac
# scripts/vm-pair says which driver the other VM runs.
PAIR_OTHER=${PAIR_PEER_DRIVER:-$PAIR_OTHER}
case ${PAIR_ROLE:-} in
target)
	PAIR_N=1 PAIR_PEER=2
	eval "test_66_nvmeof_pair_target_on_$PAIR_NAME() { pair_target; }"
	eval "test_68_iser_pair_target_on_$PAIR_NAME() { iser_pair_target; }"
	;;
host)
	PAIR_N=2 PAIR_PEER=1
	eval "test_66_nvmeof_pair_host_on_$PAIR_NAME() { pair_host; }"
	eval "test_68_iser_pair_host_on_$PAIR_NAME() { iser_pair_host; }"
	;;
*) echo "PAIR_ROLE must be target or host" >&2 ;;
esac
# Zero-copy needs a siw_rs side; a pair of one driver has no test_67.
if [ -n "${PAIR_N:-}" ] && [ "$PAIR_OTHER" != "$PAIR_DRIVER" ]; then
	case $PAIR_DRIVER in
	siw_rs) eval "test_67_zcopy_pair_sender_on_siw_rs() { zc_siw_rs $PAIR_N $PAIR_PEER; }" ;;
	siw) eval "test_67_zcopy_pair_peer_on_upstream_siw() { zc_siw $PAIR_N $PAIR_PEER; }" ;;
	esac
fi
