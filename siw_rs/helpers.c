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
#include <net/sock.h>
#include <net/tcp.h>
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

void siw_rs_h_spin_lock_bh(spinlock_t *lock)
{
	spin_lock_bh(lock);
}

void siw_rs_h_spin_unlock_bh(spinlock_t *lock)
{
	spin_unlock_bh(lock);
}


struct net *siw_rs_h_dev_net(struct net_device *dev)
{
	return dev_net(dev);
}

void siw_rs_h_sk_callback_write_lock(struct sock *sk)
{
	write_lock_bh(&sk->sk_callback_lock);
}

void siw_rs_h_sk_callback_write_unlock(struct sock *sk)
{
	write_unlock_bh(&sk->sk_callback_lock);
}

void siw_rs_h_sk_callback_read_lock(struct sock *sk)
{
	read_lock_bh(&sk->sk_callback_lock);
}

void siw_rs_h_sk_callback_read_unlock(struct sock *sk)
{
	read_unlock_bh(&sk->sk_callback_lock);
}

void siw_rs_h_lock_sock(struct sock *sk)
{
	lock_sock(sk);
}

int siw_rs_h_sk_stream_wspace(const struct sock *sk)
{
	return sk_stream_wspace(sk);
}

void siw_rs_h_sk_set_nospace(struct sock *sk)
{
	set_bit(SOCK_NOSPACE, &sk->sk_socket->flags);
}

int siw_rs_h_sk_state(const struct sock *sk)
{
	return READ_ONCE(sk->sk_state);
}

void siw_rs_h_sk_set_timeouts(struct sock *sk, long rcv_jiffies, long snd_jiffies)
{
	WRITE_ONCE(sk->sk_rcvtimeo, rcv_jiffies);
	WRITE_ONCE(sk->sk_sndtimeo, snd_jiffies);
}

long siw_rs_h_msecs_to_jiffies(unsigned int ms)
{
	return msecs_to_jiffies(ms);
}

void siw_rs_h_sk_set_reuseaddr(struct sock *sk)
{
	sock_set_reuseaddr(sk);
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
