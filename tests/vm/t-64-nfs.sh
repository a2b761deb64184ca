# SPDX-License-Identifier: GPL-2.0
# NFS over RDMA (the kernel's nfsd with an RDMA listener, the NFS client
# mounting with proto=rdma) over siw_rs, data verified byte for byte on the
# server's side and read back through the client. (Issue: kernel consumers.)
#
# As with NVMe-oF (t-60-nvmeof.sh), the client and the server share one
# kernel, so both run on the siw_rs device of veth1 (10.55.0.1): the client
# resolves a local address and binds to the device owning it. NFSv4.1 only:
# nfsd's RDMA listener on port 20049 is its only one (no TCP, no UDP), and
# rpc.mountd answers the kernel's export lookups without registering any
# RPC service, so neither rpcbind nor lockd is involved.

NFS_EXPORT=/tmp/nfs-export
NFS_MNT=/tmp/nfs-mnt
NFSD_FS=/proc/fs/nfsd
# Bounded for the debug kernel under TCG, as NVMe-oF's.
NFS_MIB=${SIW_RS_NFS_MIB:-2}

nfs_cleanup() {
	mountpoint -q $NFS_MNT && { timeout 60 umount -f $NFS_MNT || timeout 60 umount -l $NFS_MNT; } 2>/dev/null
	if mountpoint -q $NFSD_FS; then
		echo 0 > $NFSD_FS/threads 2>/dev/null || true
		exportfs -ua 2>/dev/null || true
		umount $NFSD_FS 2>/dev/null || true
	fi
	pkill -x rpc.mountd 2>/dev/null || true
	mountpoint -q $NFS_EXPORT && umount $NFS_EXPORT
	mountpoint -q /var/lib/nfs && umount /var/lib/nfs
	true
}

# nfs_server: nfsd exporting a tmpfs as the NFSv4 root, listening on RDMA
# port 20049 only.
nfs_server() {
	modprobe -a nfsd rpcrdma nfsv4
	# nfs-utils keeps its export table here; the VM's root is read-only.
	mount -t tmpfs none /var/lib/nfs
	touch /var/lib/nfs/etab /var/lib/nfs/rmtab
	mkdir -p $NFS_EXPORT $NFS_MNT
	mount -t tmpfs none $NFS_EXPORT
	mountpoint -q $NFSD_FS || mount -t nfsd nfsd $NFSD_FS
	exportfs -o rw,no_root_squash,insecure,no_subtree_check,fsid=0 "*:$NFS_EXPORT"
	rpc.mountd -N 2 -N 3 || fail_because "rpc.mountd did not start" || return 1
	# Versions and times only while no server exists; the RDMA listener
	# creates it; the threads then find a listener and add no TCP or UDP
	# one. The shortest grace period (10 s): without client tracking, a
	# restarted nfsd refuses opens until it ends.
	echo "-2 -3 +4 -4.0 +4.1 -4.2" > $NFSD_FS/versions
	echo 10 > $NFSD_FS/nfsv4leasetime
	echo 10 > $NFSD_FS/nfsv4gracetime
	echo "rdma 20049" > $NFSD_FS/portlist || fail_because "nfsd refused the RDMA listener" || return 1
	echo 2 > $NFSD_FS/threads
	grep -q '^rdma 20049$' $NFSD_FS/portlist || fail_because "nfsd's listeners: $(tr '\n' ' ' < $NFSD_FS/portlist)" || return 1
}

nfs_mount() {
	timeout 120 mount -t nfs -o vers=4.1,proto=rdma,port=20049,hard,timeo=600 10.55.0.1:/ $NFS_MNT ||
		fail_because "mount over RDMA failed" || return 1
	local xprt
	xprt=$(nfs_mountstats | grep -m1 'xprt:' || true)
	[[ "$xprt" =~ xprt:[[:space:]]*rdma ]] || fail_because "the mount's transport is not RDMA: '$xprt'" || return 1
}

# The mount's block of /proc/self/mountstats.
nfs_mountstats() {
	awk -v m="$NFS_MNT" '/^device / { on = ($5 == m) } on' /proc/self/mountstats
}

# nfs_fail MSG: says why, stops NFS, removes t1 and the test's files
# (consumer_fail). Returns 1.
nfs_fail() { consumer_fail nfs_cleanup NFS "$1" /tmp/nfs.pat /tmp/nfs.back; }

# A random pattern written through the client lands in the export as
# written (read there, on the server's side, not through NFS), and reads
# back identical through a new mount (no client cache). Both the client's
# and the server's QPs are on t1 while mounted. With t1's zcopy on (off by
# default on veth), the client's and the server's pages go to the socket by
# reference: zcopy_sends must count at least one message per 64 KiB.
test_64_nfs_over_rdma() {
	local pat=/tmp/nfs.pat back=/tmp/nfs.back qps zc
	nfs_cleanup
	scripts/topology up-local
	load_siw_rs
	rdma link add t1 type siw_rs netdev veth1
	echo 1 > /sys/class/infiniband/t1/zcopy
	# nfs_server and nfs_mount say why they failed.
	nfs_server || nfs_fail "" || return 1
	nfs_mount || nfs_fail "" || return 1
	qps=$(rdma res show qp link t1/1 2>/dev/null | grep -c 'state RTS' || true)
	echo "    mounted over RDMA; $qps QPs in RTS on t1"
	[ "$qps" -ge 2 ] || nfs_fail "want the client's and the server's QPs on t1, found $qps" || return 1
	dd if=/dev/urandom of=$pat bs=1M count="$NFS_MIB" status=none
	timeout 300 dd if=$pat of=$NFS_MNT/f bs=64k oflag=direct status=none ||
		nfs_fail "writing $NFS_MIB MiB over NFS failed or timed out" || return 1
	cmp $pat $NFS_EXPORT/f || nfs_fail "the file in the export differs from what the client wrote" || return 1
	timeout 120 umount $NFS_MNT || nfs_fail "unmounting after the write failed or timed out" || return 1
	nfs_mount || nfs_fail "" || return 1
	{ timeout 300 dd if=$NFS_MNT/f of=$back bs=64k iflag=direct status=none && cmp $pat $back; } ||
		nfs_fail "reading $NFS_MIB MiB back over NFS failed or differs" || return 1
	zc=$(cat /sys/class/infiniband/t1/zcopy_sends)
	echo "    $NFS_MIB MiB written over NFS/RDMA, identical in the export and read back; $zc messages by reference"
	[ "$zc" -ge $((NFS_MIB * 16)) ] || nfs_fail "zcopy_sends is $zc, want at least $((NFS_MIB * 16))" || return 1
	nfs_cleanup
	# Neither the client nor the server may keep the device.
	bounded 60 rdma link del t1 || fail_because "rdma link del t1 did not finish after NFS was stopped" || return 1
	rm -f $pat $back
}
