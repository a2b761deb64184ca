# SPDX-License-Identifier: GPL-2.0
# iSER (iSCSI Extensions for RDMA): LIO's iSCSI target with isert, and the
# ib_iser initiator logged in by open-iscsi's iscsid, over siw_rs; data
# verified byte for byte. (Issue: kernel consumers.)
#
# As with NVMe-oF (t-60-nvmeof.sh) and NFS (t-64-nfs.sh), initiator and
# target share one kernel and both run on the siw_rs device of veth1
# (10.55.0.1): ib_iser and isert create their RDMA CM ids in the initial
# network namespace.
#
# LIO adds an iSER portal as the child of a TCP portal on the same address
# and port, and the TCP portal's listener takes that port in the network
# namespace of the process that creates the portal. A software iWARP device
# listens with a kernel TCP socket in its netdev's namespace (upstream siw
# does too), so the two cannot both listen on 10.55.0.1:3260 in one
# namespace. The TCP portal is therefore created from a namespace of its own
# (isct, with 10.55.0.1 on a veth there), and the iSER portal, which isert
# creates in the initial namespace, listens on the siw_rs device. nsenter,
# not `ip netns exec`: the latter remounts /sys, which hides configfs.
#
# ib_iser and isert keep work requests and SGEs in packed descriptors
# (isert's send WR at offset 132), so this test also covers the driver
# reading a kernel consumer's WRs and SGE lists unaligned: on the debug
# kernel a reference to a misaligned one panics.

LIO=/sys/kernel/config/target
ISER_IQN=iqn.2026-11.org.siw-rs:iser-test
ISER_TPG=$LIO/iscsi/$ISER_IQN/tpgt_1
# The portal's address (tests/vm/pair.sh sets its own before sourcing).
ISER_ADDR=${ISER_ADDR:-10.55.0.1}
ISER_NP=$ISER_TPG/np/$ISER_ADDR:3260
ISER_DISK=$LIO/core/rd_mcp_0/disk0
# Bounded for the debug kernel under TCG, as NVMe-oF's.
ISER_MIB=${SIW_RS_ISER_MIB:-2}
ISER_LOG=/tmp/iscsid.log
# iser_io's pattern and what it read back (iser_cleanup removes them).
ISER_PAT=/tmp/iser.pat ISER_BACK=/tmp/iser.back

# The node as iscsiadm names it (bounded: a broken path makes it retry).
iser_adm() { timeout 120 iscsiadm -m node -T "$ISER_IQN" -p "$ISER_ADDR:3260" -I iser "$@"; }

# The target: an rd_mcp RAM disk (LIO's own, it keeps what is written) as
# LUN 0 of a portal group open to any initiator, without authentication.
iser_target() {
	modprobe -a target_core_mod iscsi_target_mod ib_isert || fail_because "LIO or isert did not load" || return 1
	mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
	mkdir -p "$ISER_DISK"
	echo "rd_pages=$(((ISER_MIB + 2) * 256))" > "$ISER_DISK/control"
	echo 1 > "$ISER_DISK/enable"
	mkdir -p "$ISER_TPG/lun/lun_0"
	ln -s "$ISER_DISK" "$ISER_TPG/lun/lun_0/disk0"
	ip netns add isct
	ip -n isct link add isct0 type veth peer name isct1
	ip -n isct addr add "$ISER_ADDR/32" dev isct0
	ip -n isct link set isct0 up
	nsenter --net=/run/netns/isct mkdir "$ISER_NP" || fail_because "LIO refused the portal" || return 1
	echo 1 > "$ISER_NP/iser" || fail_because "isert refused the iSER portal on $ISER_ADDR:3260" || return 1
	[ "$(cat "$ISER_NP/iser")" = 1 ] || fail_because "the portal has no iSER child" || return 1
	echo 0 > "$ISER_TPG/attrib/authentication"
	echo 1 > "$ISER_TPG/attrib/generate_node_acls"
	echo 0 > "$ISER_TPG/attrib/demo_mode_write_protect"
	echo 1 > "$ISER_TPG/enable"
}

# Undoes what iser_target made, whatever part of it there is (every step
# may fail: the tests run with `set -e`).
iser_target_down() {
	if [ -d "$ISER_TPG" ]; then
		echo 0 > "$ISER_TPG/enable" || true
		if [ -d "$ISER_NP" ]; then
			echo 0 > "$ISER_NP/iser" || true
			rmdir "$ISER_NP" || true
		fi
		[ ! -L "$ISER_TPG/lun/lun_0/disk0" ] || rm "$ISER_TPG/lun/lun_0/disk0" || true
		[ ! -d "$ISER_TPG/lun/lun_0" ] || rmdir "$ISER_TPG/lun/lun_0" || true
		rmdir "$ISER_TPG" "$LIO/iscsi/$ISER_IQN" || true
	fi
	[ ! -d "$ISER_DISK" ] || rmdir "$ISER_DISK" || true
	[ ! -d "$LIO/core/rd_mcp_0" ] || rmdir "$LIO/core/rd_mcp_0" || true
	ip netns del isct 2>/dev/null || true
}

# iscsid with a state directory of its own (the VM's /etc is the host's,
# under an overlay): the host's iscsid.conf, a fixed initiator name, and
# the test's node record as the only one.
iser_iscsid() {
	[ -r /etc/iscsi/iscsid.conf ] && command -v iscsid >/dev/null ||
		fail_because "open-iscsi is not installed (scripts/setup installs it)" || return 1
	cp /etc/iscsi/iscsid.conf /tmp/iser-iscsid.conf
	mount -t tmpfs none /etc/iscsi
	cp /tmp/iser-iscsid.conf /etc/iscsi/iscsid.conf
	echo "InitiatorName=iqn.2026-11.org.siw-rs:initiator" > /etc/iscsi/initiatorname.iscsi
	mkdir -p /run/lock/iscsi
	modprobe ib_iser || fail_because "ib_iser did not load" || return 1
	# In a session of its own: iscsid stopping signals its whole process
	# group, which would otherwise be this test and the runner.
	setsid iscsid -f > $ISER_LOG 2>&1 < /dev/null &
	local i out
	for ((i = 0; i < 100; i++)); do
		# (Exit status 21 with no session: read its words instead.)
		out=$(iscsiadm -m session 2>&1) || true
		[[ "$out" == *"No active sessions"* ]] && break
		nap 0.2
	done
	[[ "$out" == *"No active sessions"* ]] ||
		fail_because "iscsid did not answer within 20 s: $(tail -n 3 $ISER_LOG 2>/dev/null | tr '\n' ' ')" || return 1
	iser_adm -o new >/dev/null || fail_because "iscsiadm could not add the node" || return 1
}

# iser_login [WAIT]: logs in over iSER, trying again for up to WAIT
# seconds (default 0: once) while the target does not answer; prints the
# SCSI disk.
iser_login() {
	local start=$SECONDS tries=1
	until iser_adm --login >/tmp/iser-login.log 2>&1; do
		[ $((SECONDS - start)) -lt "${1:-0}" ] ||
			fail_because "login over iSER failed or timed out ($tries tries): $(tail -n 2 /tmp/iser-login.log $ISER_LOG 2>/dev/null | tr '\n' ' ')" || return 1
		tries=$((tries + 1))
		nap 5
	done
	[ "$tries" = 1 ] || echo "    (logged in at try $tries, after $((SECONDS - start)) s)" >&2
	local s i dev=""
	s=$(iscsiadm -m session 2>&1) || true
	[[ "$s" == iser:* ]] || fail_because "the session is not over iSER: '$s'" || return 1
	for ((i = 0; i < 150; i++)); do
		dev=$(iscsiadm -m session -P 3 2>/dev/null | awk '/Attached scsi disk/ { print $4; exit }') || true
		[ -n "$dev" ] && [ -b "/dev/$dev" ] && break
		dev=""
		nap 0.2
	done
	[ -n "$dev" ] || fail_because "no SCSI disk 30 s after the login" || return 1
	echo "/dev/$dev"
}

iser_logout() { iser_adm --logout >/dev/null; }

# Logs out, stops iscsid, takes the target down, removes iser_io's files
# (each step may fail).
iser_cleanup() {
	rm -f "$ISER_PAT" "$ISER_BACK"
	if pgrep -x iscsid >/dev/null; then
		timeout 60 iscsiadm -m node -u >/dev/null 2>&1 || true
		pkill -x iscsid || true
		local i
		for ((i = 0; i < 50; i++)); do pgrep -x iscsid >/dev/null || break; nap 0.2; done
	fi
	! mountpoint -q /etc/iscsi || umount /etc/iscsi || true
	[ ! -d "$LIO" ] || iser_target_down 2>/dev/null
}

# iser_fail MSG: says why, stops initiator and target, removes t1
# (consumer_fail) and the test's files (iser_cleanup). Returns 1.
iser_fail() { consumer_fail iser_cleanup iSER "$1"; }

# iser_io DEV [WAIT] (logged in, DEV its disk): a random pattern written
# through the disk (O_DIRECT) reads back identical, then again over a new
# session after a logout (WAIT as for iser_login); logged in afterwards.
# On failure says why (the caller cleans up).
iser_io() {
	local pat=$ISER_PAT back=$ISER_BACK dev=$1
	dd if=/dev/urandom of=$pat bs=1M count="$ISER_MIB" status=none
	timeout 300 dd if=$pat of="$dev" bs=64k oflag=direct status=none ||
		fail_because "writing $ISER_MIB MiB over iSER failed or timed out" || return 1
	{ timeout 300 dd if="$dev" of=$back bs=64k count=$((ISER_MIB * 16)) iflag=direct status=none && cmp $pat $back; } ||
		fail_because "reading $ISER_MIB MiB back over iSER failed or differs" || return 1
	iser_logout || fail_because "the logout failed or timed out" || return 1
	rm -f $back
	dev=$(iser_login "${2:-0}") || return 1
	{ timeout 300 dd if="$dev" of=$back bs=64k count=$((ISER_MIB * 16)) iflag=direct status=none && cmp $pat $back; } ||
		fail_because "reading $ISER_MIB MiB over a second session failed or differs" || return 1
	echo "    $ISER_MIB MiB written over iSER, read back identical, and again over a new session"
	rm -f $pat $back
}

# test_65: iser_io, initiator and target both on t1 (the data lives in
# the target, which saw both connections there). With t1's zcopy on (off
# by default on veth), the initiator's Read Responses (the data of its
# writes, from the block layer's pages through fast-registered regions)
# and the target's RDMA Writes (the data read, from LIO's pages) go to the
# socket by reference: zcopy_sends must count at least one message per
# 64 KiB.
test_65_iser_over_siw_rs() {
	local dev qps zc
	iser_cleanup
	scripts/topology up-local
	load_siw_rs
	rdma link add t1 type siw_rs netdev veth1
	echo 1 > /sys/class/infiniband/t1/zcopy
	# Each step says why it failed.
	iser_target || iser_fail "" || return 1
	iser_iscsid || iser_fail "" || return 1
	dev=$(iser_login) || iser_fail "" || return 1
	qps=$(rdma res show qp link t1/1 2>/dev/null | grep -c 'state RTS' || true)
	echo "    logged in over iSER ($dev); $qps QPs in RTS on t1"
	[ "$qps" -ge 2 ] || iser_fail "want the initiator's and the target's QPs on t1, found $qps" || return 1
	iser_io "$dev" || iser_fail "" || return 1
	zc=$(cat /sys/class/infiniband/t1/zcopy_sends)
	echo "    $zc messages by reference"
	[ "$zc" -ge $((ISER_MIB * 16)) ] || iser_fail "zcopy_sends is $zc, want at least $((ISER_MIB * 16))" || return 1
	iser_logout || iser_fail "the second logout failed or timed out" || return 1
	iser_cleanup
	# Neither the initiator nor the target may keep the device.
	bounded 60 rdma link del t1 || fail_because "rdma link del t1 did not finish after iSER was stopped" || return 1
}
