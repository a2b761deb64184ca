# SPDX-License-Identifier: GPL-2.0
# NVMe over Fabrics (nvmet-rdma target, nvme-rdma host) over siw_rs, data
# verified byte for byte. (Issue: kernel data path.)
#
# nvme-rdma and nvmet-rdma create their RDMA CM ids in the initial network
# namespace, where every address of the VM is local. Address resolution of a
# local destination binds the host to the device that owns the destination
# address (it fails with a host address on another device), so in one kernel
# host and target always share one RDMA device: these tests run both on the
# siw_rs device on veth1 (10.55.0.1), as two separate connections per queue
# over TCP. Cross-driver interoperation (siw_rs with upstream siw) is tested
# with the kernel probe and the userspace peer, which use namespaces.

NVMET_CFG=/sys/kernel/config/nvmet
NVMEOF_NQN=siw-rs-test
# Bounded for the debug kernel under TCG (~0.4 MB/s); see testing.rst.
NVMEOF_MIB=${SIW_RS_NVMEOF_MIB:-2}

nvmeof_modules() {
	modprobe -a nvmet nvmet-rdma nvme-rdma
	# A RAM disk with room for the test data (rd_size in KiB, 32 MiB at least).
	local kib=$(( NVMEOF_MIB * 1024 + 16384 ))
	[ "$kib" -ge 32768 ] || kib=32768
	grep -q '^brd ' /proc/modules || modprobe brd rd_nr=1 rd_size=$kib
	mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
}

# nvmeof_target ADDR: export /dev/ram0 on ADDR:4420 over RDMA.
nvmeof_target() {
	local s=$NVMET_CFG/subsystems/$NVMEOF_NQN p=$NVMET_CFG/ports/1
	mkdir "$s"
	echo 1 > "$s/attr_allow_any_host"
	mkdir "$s/namespaces/1"
	echo /dev/ram0 > "$s/namespaces/1/device_path"
	echo 1 > "$s/namespaces/1/enable"
	mkdir "$p"
	echo rdma > "$p/addr_trtype"
	echo ipv4 > "$p/addr_adrfam"
	echo "$1" > "$p/addr_traddr"
	echo 4420 > "$p/addr_trsvcid"
	ln -s "$s" "$p/subsystems/$NVMEOF_NQN"
}

nvmeof_target_down() {
	local s=$NVMET_CFG/subsystems/$NVMEOF_NQN p=$NVMET_CFG/ports/1
	[ -e "$p/subsystems/$NVMEOF_NQN" ] && rm "$p/subsystems/$NVMEOF_NQN"
	[ -d "$p" ] && rmdir "$p"
	if [ -d "$s" ]; then
		echo 0 > "$s/namespaces/1/enable" 2>/dev/null || true
		rmdir "$s/namespaces/1" 2>/dev/null || true
		rmdir "$s"
	fi
}

# nvmeof_connect [ADDR]: host side (target at ADDR, default 10.55.0.1);
# prints the block device.
nvmeof_connect() {
	# A short controller-loss timeout makes I/O fail, not hang, if the
	# connection breaks.
	timeout 120 nvme connect -t rdma -a "${1:-10.55.0.1}" -s 4420 -n "$NVMEOF_NQN" -i 1 -l 20 -c 2 >/dev/null
	local i dev=""
	for ((i = 0; i < 50; i++)); do
		dev=$(nvme list -o json 2>/dev/null | grep -o '"DevicePath" *: *"/dev/nvme[0-9]*n1"' | grep -o '/dev/nvme[0-9]*n1' | head -1)
		[ -n "$dev" ] && [ -b "$dev" ] && break
		nap 0.2
	done
	[ -n "$dev" ] || fail_because "no namespace block device after nvme connect" || return 1
	echo "$dev"
}

nvmeof_disconnect() { timeout 120 nvme disconnect -n "$NVMEOF_NQN" >/dev/null; }

# Leftovers of a failed test would keep the modules busy.
nvmeof_cleanup() {
	timeout 120 nvme disconnect -n "$NVMEOF_NQN" >/dev/null 2>&1 || true
	[ -d "$NVMET_CFG" ] && nvmeof_target_down 2>/dev/null || true
}

# nvmeof_verify DEV: write a random pattern, read it back, compare. The
# two files go afterwards, whatever the outcome: they are as large as the
# check (256 MiB each in make check-perf), and /tmp is a tmpfs that later
# tests of the same VM need (test_68's iSER check ran out of it).
nvmeof_verify() {
	local dev=$1 pat=/tmp/nvmeof.pat back=/tmp/nvmeof.back rc=1
	dd if=/dev/urandom of=$pat bs=1M count="$NVMEOF_MIB" status=none
	# Bounded: a broken data path makes the host reconnect forever.
	if ! timeout 300 dd if=$pat of="$dev" bs=64k oflag=direct status=none; then
		fail_because "writing $NVMEOF_MIB MiB failed or timed out" || true
	elif ! timeout 300 dd if="$dev" of=$back bs=64k count=$((NVMEOF_MIB * 16)) iflag=direct status=none; then
		fail_because "reading $NVMEOF_MIB MiB failed or timed out" || true
	elif ! cmp $pat $back; then
		fail_because "data read back differs from data written" || true
	else
		echo "    $NVMEOF_MIB MiB written and read back identical over $2"
		rc=0
	fi
	rm -f $pat $back
	return $rc
}

# nvmeof_setup TYPE: one device of TYPE on veth1, the target on it.
nvmeof_setup() {
	nvmeof_cleanup
	scripts/topology up-local
	load_siw_rs
	[ "$1" = siw ] && { grep -q '^siw ' /proc/modules || modprobe siw; }
	rdma link add t1 type "$1" netdev veth1
	nvmeof_modules
	nvmeof_target 10.55.0.1
}

nvmeof_teardown() {
	nvmeof_target_down
	rdma link del t1
}

test_60_nvmeof_over_siw_rs() {
	nvmeof_setup siw_rs
	local dev
	dev=$(nvmeof_connect) || return 1
	nvmeof_verify "$dev" "siw_rs" || { nvmeof_disconnect; nvmeof_teardown; return 1; }
	nvmeof_disconnect
	nvmeof_teardown
}

# With zcopy on: the disconnect meets sends the stack still holds pages
# of (the teardown waits for their release before it flushes).
test_61_nvmeof_disconnect_during_io_and_reconnect() {
	nvmeof_setup siw_rs
	echo 1 > /sys/class/infiniband/t1/zcopy
	local dev
	dev=$(nvmeof_connect) || return 1
	# I/O in flight while the controller goes away: the writer must fail
	# or finish, never hang, and the kernel must stay clean.
	timeout 300 dd if=/dev/urandom of="$dev" bs=64k count=256 oflag=direct status=none 2>/dev/null &
	local writer=$!
	nap 2
	nvmeof_disconnect
	wait "$writer" || true
	dev=$(nvmeof_connect) || return 1
	nvmeof_verify "$dev" "siw_rs after a reconnect" || { nvmeof_disconnect; nvmeof_teardown; return 1; }
	nvmeof_disconnect
	nvmeof_teardown
}

# Zero-copy transmit for kernel consumers: with the device's zcopy setting
# on (it is off by default on veth), the host's Read Responses (the data
# of its writes, from the block layer's pages through fast-registered
# regions) and the target's RDMA Writes (the data of the host's reads,
# from nvmet's pages through the DMA region) go to the socket by
# reference and complete once the stack has released the pages. The data
# is verified as in test_60, and zcopy_sends must count at least one
# message per 64 KiB written and one per 64 KiB read (both ends are on
# the one device, t1): a driver that copies a kernel consumer's memory
# counts none. Then again with MPA CRC: a kernel consumer's page may change
# in flight, which would break the CRC computed at framing, so with CRC
# its memory is copied and zcopy_sends must not grow.
test_62_nvmeof_zero_copy() {
	nvmeof_setup siw_rs
	local f=/sys/class/infiniband/t1 dev before after want
	echo 1 > $f/zcopy
	before=$(cat $f/zcopy_sends)
	dev=$(nvmeof_connect) || return 1
	nvmeof_verify "$dev" "siw_rs with zcopy on" || { nvmeof_disconnect; nvmeof_teardown; return 1; }
	after=$(cat $f/zcopy_sends)
	nvmeof_disconnect
	want=$((NVMEOF_MIB * 16 * 2))
	echo "    zcopy_sends grew by $((after - before)) (at least $want wanted)"
	[ $((after - before)) -ge "$want" ] || { nvmeof_teardown; fail_because "zcopy_sends grew by $((after - before)), want at least $want"; return 1; }
	echo 1 > $f/mpa_crc
	before=$(cat $f/zcopy_sends)
	dev=$(nvmeof_connect) || { nvmeof_teardown; return 1; }
	nvmeof_verify "$dev" "siw_rs with zcopy and CRC on" || { nvmeof_disconnect; nvmeof_teardown; return 1; }
	after=$(cat $f/zcopy_sends)
	nvmeof_disconnect
	nvmeof_teardown
	[ "$after" = "$before" ] || fail_because "with CRC on, zcopy_sends grew by $((after - before)), want 0" || return 1
}

# nvmet-rdma loaded with use_srq=1 posts its command buffers to shared
# receive queues (one per completion vector), which all the target's QPs
# take from: each command capsule the host sends fills an entry that the
# QP receiving it claims at the capsule's first segment (qp::claim_recv);
# the disconnect flushes the QPs, and what the SRQs still hold stays. Data
# verified as in test_60; the target must have made its SRQs on the device.
# Removing the port drains the target's QPs: ib_drain_qp on a QP with an
# SRQ waits for the driver's "last WQE reached" event, and without it for
# 60 s per QP (1 min 2 s here with upstream siw, which never reports it;
# about 1 s with the event): the removal must end well inside that.
test_63_nvmeof_target_on_shared_receive_queues() {
	nvmeof_cleanup
	modprobe -r nvmet-rdma || fail_because "nvmet-rdma would not unload" || return 1
	modprobe nvmet-rdma use_srq=1
	local dev srqs rc=0
	[ "$(cat /sys/module/nvmet_rdma/parameters/use_srq)" = Y ] || fail_because "nvmet-rdma not loaded with use_srq=1" || return 1
	nvmeof_setup siw_rs
	if dev=$(nvmeof_connect); then
		srqs=$(rdma res show 2>/dev/null | awk '$2 == "t1:" {for (i = 3; i < NF; i++) if ($i == "srq") print $(i + 1)}')
		echo "    the target holds ${srqs:-no} SRQs on t1"
		if [ "${srqs:-0}" -lt 1 ]; then
			fail_because "no SRQ on t1 with nvmet-rdma's use_srq=1" || true
			rc=1
		elif ! nvmeof_verify "$dev" "siw_rs, the target on SRQs"; then
			rc=1
		fi
		nvmeof_disconnect
	else
		rc=1
	fi
	local t0=$EPOCHSECONDS took
	nvmeof_teardown
	took=$((EPOCHSECONDS - t0))
	echo "    the target's port and QPs went in ${took} s"
	if [ "$took" -ge 40 ]; then
		fail_because "removing the port took $took s: the drain of its SRQ QPs waited out ib_drain_qp's 60 s timeout" || true
		rc=1
	fi
	# Later tests get the target as they load it, without SRQs.
	modprobe -r nvmet-rdma || true
	return $rc
}
