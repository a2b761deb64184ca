/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The C headers siw_rs binds to. bindgen runs over this file from Kbuild;
 * bindgen_allowlist names the items taken from it.
 */
#include <linux/etherdevice.h>
#include <linux/if_arp.h>
#include <linux/netdevice.h>
#include <net/addrconf.h>
#include <rdma/ib_verbs.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>
#include <rdma/iw_cm.h>
#include <rdma/rdma_netlink.h>
#include <linux/net.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/skbuff.h>
#include <net/sock.h>
#include <net/tcp.h>

#include "helpers.h"
#include "../uapi/siw_rs-abi.h"
