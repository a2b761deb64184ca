#!/usr/bin/env bash
# The demo, run inside the VM by scripts/demo.
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

echo "== siw_rs demo on $(uname -r)"
scripts/topology up
say insmod "$SIW_RS_KO"
say ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
say ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
say rdma link show
say rdma dev show
for d in rs1 rs2; do
	printf '%s: node_type=%s node_guid=%s gid0=%s\n' "$d" \
		"$(cat /sys/class/infiniband/$d/node_type)" \
		"$(cat /sys/class/infiniband/$d/node_guid)" \
		"$(cat /sys/class/infiniband/$d/ports/1/gids/0)"
done
say ip -n h1 link set veth1 down
say rdma link show rs1/1
say ip -n h1 link set veth1 up
sleep 0.5
say rdma link show rs1/1
say ip -n h1 link del veth1
sleep 1
say rdma link show
say rmmod siw_rs
echo "== done"
