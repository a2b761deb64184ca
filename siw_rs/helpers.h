/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C helpers: the static inline functions and macros siw_rs needs, exported to
 * Rust as ordinary functions. Prefix siw_rs_h_ (rust_helper_* names already
 * exist in vmlinux). Keep each one a single call: logic belongs in Rust.
 */
#ifndef SIW_RS_HELPERS_H
#define SIW_RS_HELPERS_H

#include <linux/netdevice.h>
#include <rdma/ib_verbs.h>
#include <net/sock.h>

struct net_device *siw_rs_h_netdev_notifier_info_to_dev(void *info);
void siw_rs_h_dev_put(struct net_device *dev);
bool siw_rs_h_netif_running(const struct net_device *dev);
bool siw_rs_h_netif_carrier_ok(const struct net_device *dev);
/* Whether the netdev sits on a bus device (a NIC), not a virtual one. */
bool siw_rs_h_netdev_has_parent(const struct net_device *dev);
void siw_rs_h_addrconf_addr_eui48(u8 *eui, const u8 *addr);
void siw_rs_h_eth_random_addr(u8 *addr);
int siw_rs_h_ib_mtu_int_to_enum(int mtu);
bool siw_rs_h_ib_device_try_get(struct ib_device *dev);
void siw_rs_h_ib_mark_name_assigned_by_user(struct ib_device *dev);
int siw_rs_h_num_possible_cpus(void);

unsigned long siw_rs_h_spin_lock_irqsave(spinlock_t *lock);
void siw_rs_h_spin_unlock_irqrestore(spinlock_t *lock, unsigned long flags);
void siw_rs_h_spin_lock_bh(spinlock_t *lock);
void siw_rs_h_spin_unlock_bh(spinlock_t *lock);

/*
 * Whether a log line a peer's frames caused may be printed now: one rate
 * limit (5 s, burst 50) shared by every such line, so a hostile peer opening
 * connection after connection cannot flood the kernel log.
 */
bool siw_rs_h_peer_log_ratelimit(void);

/*
 * MPA CRC32c through the kernel's crypto API ("crc32c": the CPU's
 * instructions where a driver for them is loaded, else crc32c-generic).
 * init allocates the transform (0 or a negative errno; on failure siw_rs
 * computes CRCs in software), exit frees it. update advances a running
 * CRC32c register (pre-inverted: ~0 at the start, the value is ~register)
 * over len octets; only after a successful init.
 */
int siw_rs_h_crc32c_init(void);
void siw_rs_h_crc32c_exit(void);
u32 siw_rs_h_crc32c_update(u32 reg, const u8 *data, size_t len);

/* Sockets (net.rs). */
struct net *siw_rs_h_dev_net_get(struct net_device *dev);
void siw_rs_h_net_put(struct net *net);
int siw_rs_h_sock_create(struct net *net, int family, struct socket **res);
void siw_rs_h_sk_callback_write_lock(struct sock *sk);
void siw_rs_h_sk_callback_write_unlock(struct sock *sk);
void siw_rs_h_sk_callback_read_lock(struct sock *sk);
void siw_rs_h_sk_callback_read_unlock(struct sock *sk);
void siw_rs_h_lock_sock(struct sock *sk);
bool siw_rs_h_sk_stream_writeable(const struct sock *sk);
bool siw_rs_h_sk_write_space_ready(struct sock *sk);
void siw_rs_h_sk_set_nospace(struct sock *sk);
bool siw_rs_h_tcp_ack_pushed(const struct sock *sk);
void siw_rs_h_tcp_set_ack_pushed(struct sock *sk, bool pushed);
int siw_rs_h_sk_state(const struct sock *sk);
void siw_rs_h_sk_set_timeouts(struct sock *sk, long rcv_jiffies, long snd_jiffies);
long siw_rs_h_msecs_to_jiffies(unsigned int ms);
void siw_rs_h_sk_set_reuseaddr(struct sock *sk);
/* IPV6_V6ONLY on an unbound AF_INET6 socket: 0, or -EINVAL once bound
 * (-EOPNOTSUPP without IPv6). */
int siw_rs_h_sk_set_v6only(struct sock *sk);

/* User verbs (uverbs.rs): rings mapped into processes, pinned user memory,
 * udata, and the sysfs attribute the rdma-core provider matches on. */
struct ib_ucontext;
struct ib_udata;
struct uverbs_attr_bundle;
struct vm_area_struct;
struct rdma_user_mmap_entry;
struct siw_rs_umem;

extern const struct attribute_group siw_rs_h_attr_group;
struct ib_udata *siw_rs_h_bundle_udata(struct uverbs_attr_bundle *attrs);
struct ib_ucontext *siw_rs_h_udata_ucontext(struct ib_udata *udata);
int siw_rs_h_copy_to_udata(struct ib_udata *udata, const void *src, size_t len);
void *siw_rs_h_ring_alloc(struct ib_ucontext *uctx, size_t bytes, u64 *key,
			  struct rdma_user_mmap_entry **entry);
void siw_rs_h_ring_remove(struct rdma_user_mmap_entry *entry);
int siw_rs_h_mmap(struct ib_ucontext *uctx, struct vm_area_struct *vma);
void siw_rs_h_mmap_free(struct rdma_user_mmap_entry *entry);
int siw_rs_h_umem_init(void);
void siw_rs_h_umem_exit(void);
struct siw_rs_umem *siw_rs_h_umem_get(struct ib_device *dev, u64 start, u64 len, int access);
const u64 *siw_rs_h_umem_pages(struct siw_rs_umem *u, size_t *n);
void siw_rs_h_umem_put(struct siw_rs_umem *u);

/*
 * The doorbell file of a ucontext (uverbs.rs wraps it, doorbell.rs
 * implements the two callbacks). open reserves a file number in the calling
 * process and makes the file with private data priv, owned by the file from
 * then on (release gets it back); it returns the number or a negative
 * errno, and on error priv is not taken. install makes the file visible to
 * the process; discard gives the number back and drops the file instead.
 */
struct file;
enum siw_rs_db_queue {
	SIW_RS_DB_SQ = 0,
	SIW_RS_DB_RQ = 1,
};
int siw_rs_h_db_file_open(void *priv, struct file **file);
void siw_rs_h_db_file_install(int fd, struct file *file);
void siw_rs_h_db_file_discard(int fd, struct file *file);
int siw_rs_doorbell_ring(void *priv, int queue, unsigned long qp_id);
void siw_rs_doorbell_release(void *priv);

/* The module's workqueues (wq.rs): index 0 the connection manager's, 1 the
 * per-CPU transmit queue. siw_rs_h_other_cpu picks the CPU a streaming
 * process's transmit runs on (wq::enqueue_beside). */
struct workqueue_struct;
int siw_rs_h_wq_init(void);
struct workqueue_struct *siw_rs_h_wq(unsigned int which);
int siw_rs_h_other_cpu(unsigned int hint);
void siw_rs_h_wq_exit(void);
void siw_rs_h_sleep_us(unsigned int us);

/* The one lock of the device registry in registry.rs. */
void siw_rs_h_registry_lock(void);
void siw_rs_h_registry_unlock(void);

/* Per-device settings in sysfs, the MPA ones and zero-copy transmit
 * (settings.rs implements them). */
enum siw_rs_setting {
	SIW_RS_SETTING_CRC = 0,
	SIW_RS_SETTING_MARKERS = 1,
	SIW_RS_SETTING_ZCOPY = 2,
	SIW_RS_SETTING_P2P = 3,
};
int siw_rs_setting_get(struct ib_device *ib, int which);
int siw_rs_setting_set(struct ib_device *ib, int which, int value);
/* Messages the device has sent zero-copy (read-only sysfs counter). */
u64 siw_rs_zcopy_sends(struct ib_device *ib);

/*
 * Zero-copy transmit (zcopy.rs). A send's notification: the network stack
 * holds a reference to it for every skb carrying the send's pages, siw_rs
 * one until the send is handed over; when the last goes, the Rust side's
 * siw_rs_zc_released() runs (any context but hard interrupts) and frees it.
 * init: ready, with siw_rs's reference; put: drops a reference.
 */
void siw_rs_h_zc_init(struct ubuf_info *u);
void siw_rs_h_zc_put(struct ubuf_info *u);
void siw_rs_zc_released(struct ubuf_info *u);

/*
 * A piece of what a zero-copy send hands to the socket: `len` octets at
 * `base`, either framing octets (`copy`: copied into a page of their own,
 * so that the caller may reuse its buffer at once) or payload in a
 * registered region (kernel direct-map addresses: a process's pinned
 * pages, or a kernel consumer's memory), which skbs then reference instead
 * of copying, as far as its pages allow (see below).
 */
struct siw_rs_zc_part {
	const void *base;
	size_t len;
	bool copy;
};

/*
 * sendmsg (MSG_ZEROCOPY, non-blocking) of `parts` with notification `u`;
 * `more`: further octets follow (MSG_MORE). Returns the octets the socket
 * took (possibly fewer than given: as many parts as fit one call are
 * sent), -EAGAIN when it is full, -EOPNOTSUPP when nothing could be set
 * up for a zero-copy send (no page for the framing octets, payload at an
 * address outside the direct map or in a page that must not be referenced,
 * such as slab memory): the caller copies instead. The sending stops at
 * the first such payload page; what precedes it goes by reference.
 */
int siw_rs_h_sendmsg_zc(struct socket *sock, const struct siw_rs_zc_part *parts, unsigned int n,
			struct ubuf_info *u, bool more);

#endif
