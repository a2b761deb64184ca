# SPDX-License-Identifier: GPL-2.0
# NVMe over Fabrics between two kernels (issue #4): one half of a
# scripts/vm-pair run, sourced by tests/vm/run in each of two VMs joined by
# a QEMU link (a virtio NIC whose frames travel as UDP datagrams between the
# two QEMU processes).
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
# Environment: PAIR_ROLE target|host, PAIR_DRIVER siw_rs|siw,
# SIW_RS_NVMEOF_MIB (t-60-nvmeof.sh), PAIR_WAIT seconds to wait for the
# other VM (default 1200: under TCG, with both VMs booting on two cores, a
# boot can take minutes).

. tests/vm/t-60-nvmeof.sh
unset -f test_60_nvmeof_over_siw_rs test_61_nvmeof_disconnect_during_io_and_reconnect

PAIR_TARGET=10.66.0.1
PAIR_SIGNAL_PORT=4499
PAIR_WAIT=${PAIR_WAIT:-1200}

# pair_link N: address 10.66.0.N on the pair NIC and a PAIR_DRIVER device
# (p1 or p2) on it.
pair_link() {
	local ifc
	ifc=$(ip -o link | awk -v mac="52:54:00:66:00:0$1" '$0 ~ mac { sub(":", "", $2); print $2 }')
	[ -n "$ifc" ] || fail_because "no NIC with MAC 52:54:00:66:00:0$1: not booted by scripts/vm-pair?" || return 1
	# Called as `pair_link N || return 1`, where `set -e` does not apply:
	# every step checks its own result.
	ip addr add "10.66.0.$1/24" dev "$ifc" && ip link set "$ifc" up ||
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
	local verdict
	# The host tries discovery for PAIR_WAIT s, then needs time for its I/O.
	verdict=$(timeout $((PAIR_WAIT + 600)) /usr/bin/python3 -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
c, _ = s.accept()
print(c.makefile().readline().strip())
' "$PAIR_TARGET" "$PAIR_SIGNAL_PORT") || true
	local ctrls
	kill "$PAIR_FOLLOW" 2>/dev/null || true
	ctrls=$(grep -c 'nvmet: creating nvm controller' /tmp/pair-kmsg.log || true)
	echo "    the host says '${verdict:-nothing}'; $ctrls controllers were created here"
	nvmeof_target_down
	rdma link del p1
	[ -n "$verdict" ] || fail_because "no word from the host VM in $((PAIR_WAIT + 600)) s" || return 1
	# The host's connection and its reconnection after the disconnect
	# during I/O (discovery controllers are counted apart).
	[ "$ctrls" -ge 2 ] || fail_because "only $ctrls controllers: the host never reached this target" || return 1
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

case ${PAIR_DRIVER:-} in siw) PAIR_OTHER=siw_rs PAIR_NAME=upstream_siw ;; *) PAIR_OTHER=siw PAIR_NAME=siw_rs ;; esac
case ${PAIR_ROLE:-} in
target) eval "test_66_nvmeof_pair_target_on_$PAIR_NAME() { pair_target; }" ;;
host) eval "test_66_nvmeof_pair_host_on_$PAIR_NAME() { pair_host; }" ;;
*) echo "PAIR_ROLE must be target or host" >&2 ;;
esac
