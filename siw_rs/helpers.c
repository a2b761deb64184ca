// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers for siw_rs: wrappers of static inlines and macros (see helpers.h).
 */
#include <linux/cpumask.h>
#include <linux/etherdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <net/addrconf.h>
#include <rdma/rdma_netlink.h>

#include "helpers.h"

/* `rdma link add ... type siw_rs` loads the module on demand. */
MODULE_ALIAS_RDMA_LINK("siw_rs");

struct net_device *siw_rs_h_netdev_notifier_info_to_dev(void *info)
{
	return netdev_notifier_info_to_dev(info);
}

void siw_rs_h_dev_put(struct net_device *dev)
{
	dev_put(dev);
}

bool siw_rs_h_netif_running(const struct net_device *dev)
{
	return netif_running(dev);
}

bool siw_rs_h_netif_carrier_ok(const struct net_device *dev)
{
	return netif_carrier_ok(dev);
}

void siw_rs_h_addrconf_addr_eui48(u8 *eui, const u8 *addr)
{
	addrconf_addr_eui48(eui, addr);
}

void siw_rs_h_eth_random_addr(u8 *addr)
{
	eth_random_addr(addr);
}

int siw_rs_h_ib_mtu_int_to_enum(int mtu)
{
	return ib_mtu_int_to_enum(mtu);
}

bool siw_rs_h_ib_device_try_get(struct ib_device *dev)
{
	return ib_device_try_get(dev);
}

void siw_rs_h_ib_mark_name_assigned_by_user(struct ib_device *dev)
{
	ib_mark_name_assigned_by_user(dev);
}

int siw_rs_h_num_possible_cpus(void)
{
	return num_possible_cpus();
}

unsigned long siw_rs_h_spin_lock_irqsave(spinlock_t *lock)
{
	unsigned long flags;

	spin_lock_irqsave(lock, flags);
	return flags;
}

void siw_rs_h_spin_unlock_irqrestore(spinlock_t *lock, unsigned long flags)
{
	spin_unlock_irqrestore(lock, flags);
}

void siw_rs_h_atomic_inc(atomic_t *v)
{
	atomic_inc(v);
}

void siw_rs_h_atomic_dec(atomic_t *v)
{
	atomic_dec(v);
}

static DEFINE_MUTEX(siw_rs_registry_mutex);

void siw_rs_h_registry_lock(void)
{
	mutex_lock(&siw_rs_registry_mutex);
}

void siw_rs_h_registry_unlock(void)
{
	mutex_unlock(&siw_rs_registry_mutex);
}
