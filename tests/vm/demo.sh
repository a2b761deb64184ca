#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# The demo, run inside the VM by scripts/demo: two siw_rs devices on the
# two ends of a veth pair (network namespaces h1 and h2), then unmodified
# rdma-core and perftest programs between them through the siw_rs provider.
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
wp() { userspace-provider/with-provider "$@"; }

echo "== siw_rs demo on $(uname -r)"
scripts/topology up
say insmod "$SIW_RS_KO"
say ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
say ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
say rdma link show
say wp ibv_devices
say ip netns exec h1 userspace-provider/with-provider ibv_devinfo -d rs1

echo
echo "== rping: 20 verified round trips, server in h1, client in h2"
ip netns exec h1 userspace-provider/with-provider rping -s -a 10.55.0.1 -C 20 -S 1024 -V &
server=$!
sleep 1
say ip netns exec h2 userspace-provider/with-provider rping -c -a 10.55.0.1 -C 20 -S 1024 -V -v
wait "$server"

echo
echo "== ib_write_bw -R: RDMA Writes over the RDMA CM, server in h1, client in h2"
ip netns exec h1 userspace-provider/with-provider ib_write_bw -R -d rs1 -s 65536 -n ${SIW_RS_DEMO_ITERS:-100} &
server=$!
sleep 2
say ip netns exec h2 userspace-provider/with-provider ib_write_bw -R -d rs2 -s 65536 -n ${SIW_RS_DEMO_ITERS:-100} 10.55.0.1
wait "$server"

say rdma link del rs1
say rdma link del rs2
say rmmod siw_rs
echo "== done"
