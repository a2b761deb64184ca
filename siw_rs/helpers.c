// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers for siw_rs: wrappers of static inlines and macros (see helpers.h).
 */
#include <crypto/hash.h>
#include <linux/cpumask.h>
#include <linux/delay.h>
#include <linux/anon_inodes.h>
#include <linux/bvec.h>
#include <linux/etherdevice.h>
#include <linux/file.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/ratelimit.h>
#include <linux/spinlock.h>
#include <net/addrconf.h>
#include <net/ipv6.h>
#include <net/sock.h>
#include <net/tcp.h>
#include <linux/sysfs.h>
#include <linux/vmalloc.h>
#include <linux/workqueue.h>
#include <rdma/ib_umem.h>
#include <rdma/rdma_netlink.h>
#include <rdma/uverbs_ioctl.h>

#include "../uapi/siw_rs-abi.h"

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

bool siw_rs_h_netdev_has_parent(const struct net_device *dev)
{
	return dev->dev.parent != NULL;
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


bool siw_rs_h_peer_log_ratelimit(void)
{
	static DEFINE_RATELIMIT_STATE(peer_log, 5 * HZ, 50);

	return __ratelimit(&peer_log);
}

static struct crypto_shash *crc32c_tfm;

int siw_rs_h_crc32c_init(void)
{
	struct crypto_shash *tfm = crypto_alloc_shash("crc32c", 0, 0);

	if (IS_ERR(tfm))
		return PTR_ERR(tfm);
	/*
	 * update() moves the running register in and out of the descriptor
	 * with import/export: the state must be exactly that register.
	 */
	if (crypto_shash_statesize(tfm) != sizeof(u32)) {
		crypto_free_shash(tfm);
		return -EOPNOTSUPP;
	}
	crc32c_tfm = tfm;
	pr_info("siw_rs: MPA CRC32c by %s\n", crypto_shash_driver_name(tfm));
	return 0;
}

void siw_rs_h_crc32c_exit(void)
{
	crypto_free_shash(crc32c_tfm);
	crc32c_tfm = NULL;
}

u32 siw_rs_h_crc32c_update(u32 reg, const u8 *data, size_t len)
{
	SHASH_DESC_ON_STACK(desc, crc32c_tfm);

	desc->tfm = crc32c_tfm;
	/* crc32c has no key and no failure modes: these return 0. */
	crypto_shash_import(desc, &reg);
	while (len) {
		unsigned int n = min_t(size_t, len, UINT_MAX);

		crypto_shash_update(desc, data, n);
		data += n;
		len -= n;
	}
	crypto_shash_export(desc, &reg);
	return reg;
}

/* A counted reference to the namespace of dev, or NULL if the namespace
 * is being dismantled. */
struct net *siw_rs_h_dev_net_get(struct net_device *dev)
{
	return maybe_get_net(dev_net(dev));
}

void siw_rs_h_net_put(struct net *net)
{
	put_net(net);
}

/* A TCP socket of family in net (the caller holds a reference to net) that
 * holds its own reference to net, as a socket a process makes does. A
 * kernel socket holds none, and siw_rs's sockets may outlive the device
 * and its netdev (a listener's handshakes, a connection torn down late):
 * without one, the namespace could be freed under them. Accepted sockets
 * inherit the reference from the listener. */
int siw_rs_h_sock_create(struct net *net, int family, struct socket **res)
{
	int rv = sock_create_kern(net, family, SOCK_STREAM, IPPROTO_TCP, res);

	if (!rv)
		sk_net_refcnt_upgrade((*res)->sk);
	return rv;
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

bool siw_rs_h_sk_stream_writeable(const struct sock *sk)
{
	return __sk_stream_is_writeable(sk, 1);
}

/*
 * While SOCK_NOSPACE is set, TCP calls sk_write_space on every ACK, and
 * only the callback clears the flag. Clears it once the stream is
 * writeable again (the stack's own test: a third of the send buffer free)
 * and reports whether it did.
 */
bool siw_rs_h_sk_write_space_ready(struct sock *sk)
{
	struct socket *sock = sk->sk_socket;

	if (!sock || !siw_rs_h_sk_stream_writeable(sk))
		return false;
	clear_bit(SOCK_NOSPACE, &sock->flags);
	return true;
}

/*
 * ICSK_ACK_PUSHED: a segment received since the last ACK looked like the end
 * of the peer's write (PSH on a full segment, or a short one); a read that
 * empties the socket then ACKs at once unless the connection is in
 * interactive ("pingpong") mode. See SockRef::ack_pushed in net.rs.
 */
bool siw_rs_h_tcp_ack_pushed(const struct sock *sk)
{
	return inet_csk(sk)->icsk_ack.pending & ICSK_ACK_PUSHED;
}

void siw_rs_h_tcp_set_ack_pushed(struct sock *sk, bool pushed)
{
	if (pushed)
		inet_csk(sk)->icsk_ack.pending |= ICSK_ACK_PUSHED;
	else
		inet_csk(sk)->icsk_ack.pending &= ~ICSK_ACK_PUSHED;
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

int siw_rs_h_sk_set_v6only(struct sock *sk)
{
#if IS_ENABLED(CONFIG_IPV6)
	return ip6_sock_set_v6only(sk);
#else
	return -EOPNOTSUPP;
#endif
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

/* --- User verbs -------------------------------------------------------- */

/* The attribute the rdma-core provider matches siw_rs devices by. */
static ssize_t siw_rs_abi_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", SIW_RS_ABI_VERSION);
}
static DEVICE_ATTR_RO(siw_rs_abi);

/*
 * Per-device settings, 0 or 1: the MPA ones are read by every new
 * connection, zcopy by every large message.
 */
static ssize_t setting_show(struct device *dev, char *buf, int which)
{
	int v = siw_rs_setting_get(rdma_device_to_ibdev(dev), which);

	return v < 0 ? v : sysfs_emit(buf, "%d\n", v);
}

static ssize_t setting_store(struct device *dev, const char *buf, size_t count, int which)
{
	int v, err = kstrtoint(buf, 0, &v);

	if (!err)
		err = siw_rs_setting_set(rdma_device_to_ibdev(dev), which, v);
	return err ? err : count;
}

#define SIW_RS_SETTING_ATTR(name, which)						\
	static ssize_t name##_show(struct device *dev, struct device_attribute *attr,	\
				   char *buf)						\
	{										\
		return setting_show(dev, buf, which);					\
	}										\
	static ssize_t name##_store(struct device *dev, struct device_attribute *attr,	\
				    const char *buf, size_t count)			\
	{										\
		return setting_store(dev, buf, count, which);				\
	}										\
	static DEVICE_ATTR_RW(name)

SIW_RS_SETTING_ATTR(mpa_crc, SIW_RS_SETTING_CRC);
SIW_RS_SETTING_ATTR(mpa_markers, SIW_RS_SETTING_MARKERS);
SIW_RS_SETTING_ATTR(zcopy, SIW_RS_SETTING_ZCOPY);
SIW_RS_SETTING_ATTR(mpa_p2p, SIW_RS_SETTING_P2P);

static ssize_t zcopy_sends_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%llu\n", siw_rs_zcopy_sends(rdma_device_to_ibdev(dev)));
}
static DEVICE_ATTR_RO(zcopy_sends);

static struct attribute *siw_rs_attrs[] = {
	&dev_attr_siw_rs_abi.attr,
	&dev_attr_mpa_crc.attr,
	&dev_attr_mpa_markers.attr,
	&dev_attr_mpa_p2p.attr,
	&dev_attr_zcopy.attr,
	&dev_attr_zcopy_sends.attr,
	NULL
};
const struct attribute_group siw_rs_h_attr_group = { .attrs = siw_rs_attrs };

struct ib_udata *siw_rs_h_bundle_udata(struct uverbs_attr_bundle *attrs)
{
	return attrs ? &attrs->driver_udata : NULL;
}

struct ib_ucontext *siw_rs_h_udata_ucontext(struct ib_udata *udata)
{
	return udata ? rdma_udata_to_uverbs_attr_bundle(udata)->context : NULL;
}

/* A response the provider has no room for is an ABI mismatch. */
int siw_rs_h_copy_to_udata(struct ib_udata *udata, const void *src, size_t len)
{
	if (udata->outlen < len)
		return -EINVAL;
	return ib_copy_to_udata(udata, (void *)src, len);
}

/*
 * The doorbell file of a ucontext (doorbell.rs): an anonymous file whose
 * ioctls ring a QP's queues without the uverbs command parsing. Its private
 * data is the driver's (an Arc, dropped by release); the module stays
 * loaded while one is open.
 */
static long siw_rs_db_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	switch (cmd) {
	case SIW_RS_IOCTL_SQ_DOORBELL:
		return siw_rs_doorbell_ring(f->private_data, SIW_RS_DB_SQ, arg);
	case SIW_RS_IOCTL_RQ_DOORBELL:
		return siw_rs_doorbell_ring(f->private_data, SIW_RS_DB_RQ, arg);
	default:
		return -ENOTTY;
	}
}

static int siw_rs_db_release(struct inode *inode, struct file *f)
{
	siw_rs_doorbell_release(f->private_data);
	return 0;
}

static const struct file_operations siw_rs_db_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = siw_rs_db_ioctl,
	/* The argument is a number, not a pointer: no translation needed. */
	.compat_ioctl = siw_rs_db_ioctl,
	.release = siw_rs_db_release,
	.llseek = noop_llseek,
};

int siw_rs_h_db_file_open(void *priv, struct file **file)
{
	int fd = get_unused_fd_flags(O_CLOEXEC);
	struct file *f;

	if (fd < 0)
		return fd;
	f = anon_inode_getfile("[siw_rs_doorbell]", &siw_rs_db_fops, priv, O_RDWR | O_CLOEXEC);
	if (IS_ERR(f)) {
		put_unused_fd(fd);
		return PTR_ERR(f);
	}
	*file = f;
	return fd;
}

void siw_rs_h_db_file_install(int fd, struct file *file)
{
	fd_install(fd, file);
}

void siw_rs_h_db_file_discard(int fd, struct file *file)
{
	put_unused_fd(fd);
	fput(file);
}

/* A ring: vmalloc_user memory behind an mmap entry of the ucontext. The
 * memory belongs to the entry and is freed by mmap_free, once the entry was
 * removed and no mmap() call holds it any more; pages already mapped into a
 * process keep their own references. */
struct siw_rs_ring_entry {
	struct rdma_user_mmap_entry base;
	void *vaddr;
};

void *siw_rs_h_ring_alloc(struct ib_ucontext *uctx, size_t bytes, u64 *key,
			  struct rdma_user_mmap_entry **entry)
{
	struct siw_rs_ring_entry *e = kzalloc(sizeof(*e), GFP_KERNEL);

	if (!e)
		return NULL;
	e->vaddr = vmalloc_user(bytes);
	if (!e->vaddr)
		goto free_entry;
	if (rdma_user_mmap_entry_insert(uctx, &e->base, PAGE_ALIGN(bytes)))
		goto free_ring;
	*key = rdma_user_mmap_get_offset(&e->base);
	*entry = &e->base;
	return e->vaddr;
free_ring:
	vfree(e->vaddr);
free_entry:
	kfree(e);
	return NULL;
}

void siw_rs_h_ring_remove(struct rdma_user_mmap_entry *entry)
{
	rdma_user_mmap_entry_remove(entry);
}

int siw_rs_h_mmap(struct ib_ucontext *uctx, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *entry = rdma_user_mmap_entry_get(uctx, vma);
	int rv;

	if (!entry)
		return -EINVAL;
	rv = remap_vmalloc_range(vma, container_of(entry, struct siw_rs_ring_entry, base)->vaddr, 0);
	rdma_user_mmap_entry_put(entry);
	return rv;
}

void siw_rs_h_mmap_free(struct rdma_user_mmap_entry *entry)
{
	struct siw_rs_ring_entry *e = container_of(entry, struct siw_rs_ring_entry, base);

	vfree(e->vaddr);
	kfree(e);
}

/* Pinned user memory. The last reference to a region may go in softirq
 * context (a receive holding it), but unpinning may sleep: the release runs
 * from a work item on a module-owned queue, drained at module exit. That
 * may be after the device was unregistered and deallocated (a region's
 * last holder may be a connection torn down late, and rmmod drains the
 * queue after removing the devices), and ib_umem_release reads the
 * device: each holder keeps a reference to it. */
struct siw_rs_umem {
	struct work_struct work;
	struct ib_umem *umem;
	u64 *pages;		/* kernel virtual address of each page */
	size_t npages;
};

/* Every work item of a connection, listener or handshake runs on one of
 * these module-owned queues, which module exit destroys (draining them) once
 * every device is gone: no work item runs module code after the unload. The
 * transmit queues may be needed to make progress under memory pressure (an
 * NVMe-oF or NFS/RDMA consumer writing back), hence WQ_MEM_RECLAIM. The
 * second one's workers run at high priority (WQ_HIGHPRI, as nvme-tcp's
 * I/O queue): it carries a process's own stream of work requests once a
 * worker continues it (see wq.rs). */
static struct workqueue_struct *siw_rs_wqs[3];

int siw_rs_h_wq_init(void)
{
	siw_rs_wqs[0] = alloc_workqueue("siw_rs_cm", 0, 0);
	siw_rs_wqs[1] = alloc_workqueue("siw_rs_tx", WQ_MEM_RECLAIM, 0);
	siw_rs_wqs[2] = alloc_workqueue("siw_rs_txhi", WQ_MEM_RECLAIM | WQ_HIGHPRI, 0);
	if (siw_rs_wqs[0] && siw_rs_wqs[1] && siw_rs_wqs[2])
		return 0;
	siw_rs_h_wq_exit();
	return -ENOMEM;
}

struct workqueue_struct *siw_rs_h_wq(unsigned int which)
{
	return siw_rs_wqs[which < ARRAY_SIZE(siw_rs_wqs) ? which : 0];
}

/* The online CPU after @cpu, wrapping around. */
static unsigned int siw_rs_next_online(unsigned int cpu)
{
	cpu = cpumask_next(cpu, cpu_online_mask);
	return cpu < nr_cpu_ids ? cpu : cpumask_first(cpu_online_mask);
}

/*
 * An online CPU other than the calling one, among the few that follow it
 * (neighbours, likely sharing its cache), chosen by @hint so that different
 * connections spread; the calling CPU if it is the only one. A hint for
 * queue_work_on(), so the CPU may go offline meanwhile (the workqueue then
 * runs the item elsewhere).
 */
int siw_rs_h_other_cpu(unsigned int hint)
{
	unsigned int me = raw_smp_processor_id();
	unsigned int n = num_online_cpus();
	unsigned int cpu = me, k;

	if (n < 2)
		return me;
	for (k = hint % min(n - 1, 8U) + 1; k > 0; k--)
		cpu = siw_rs_next_online(cpu);
	return cpu != me ? cpu : siw_rs_next_online(me);
}

void siw_rs_h_wq_exit(void)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(siw_rs_wqs); i++) {
		if (siw_rs_wqs[i])
			destroy_workqueue(siw_rs_wqs[i]);
		siw_rs_wqs[i] = NULL;
	}
}

void siw_rs_h_sleep_us(unsigned int us)
{
	usleep_range(us, 2 * us);
}

static struct workqueue_struct *siw_rs_umem_wq;

int siw_rs_h_umem_init(void)
{
	siw_rs_umem_wq = alloc_workqueue("siw_rs_umem", WQ_UNBOUND, 0);
	return siw_rs_umem_wq ? 0 : -ENOMEM;
}

void siw_rs_h_umem_exit(void)
{
	destroy_workqueue(siw_rs_umem_wq);
}

static void siw_rs_umem_release(struct work_struct *work)
{
	struct siw_rs_umem *u = container_of(work, struct siw_rs_umem, work);

	struct ib_device *dev = u->umem->ibdev;

	kvfree(u->pages);
	ib_umem_release(u->umem);
	put_device(&dev->dev);
	kfree(u);
}

struct siw_rs_umem *siw_rs_h_umem_get(struct ib_device *dev, u64 start, u64 len, int access)
{
	struct siw_rs_umem *u = kzalloc(sizeof(*u), GFP_KERNEL);
	struct ib_umem *umem;

	if (!u)
		return ERR_PTR(-ENOMEM);
	umem = ib_umem_get(dev, start, len, access);
	if (IS_ERR(umem)) {
		kfree(u);
		return ERR_CAST(umem);
	}
	u->umem = umem;
	u->npages = ib_umem_num_pages(umem);
	u->pages = kvmalloc_array(u->npages, sizeof(u64), GFP_KERNEL);
	if (!u->pages) {
		ib_umem_release(umem);
		kfree(u);
		return ERR_PTR(-ENOMEM);
	}
	{
		struct sg_page_iter it;
		size_t i = 0;

		for_each_sgtable_page(&umem->sgt_append.sgt, &it, 0) {
			if (i >= u->npages)
				break;
			u->pages[i++] = (u64)(uintptr_t)page_address(sg_page_iter_page(&it));
		}
		u->npages = i;
	}
	get_device(&dev->dev);
	INIT_WORK(&u->work, siw_rs_umem_release);
	return u;
}

/* The page array; valid and unchanged until siw_rs_h_umem_put. */
const u64 *siw_rs_h_umem_pages(struct siw_rs_umem *u, size_t *n)
{
	*n = u->npages;
	return u->pages;
}

void siw_rs_h_umem_put(struct siw_rs_umem *u)
{
	queue_work(siw_rs_umem_wq, &u->work);
}

/* Zero-copy transmit (see helpers.h). */
static void siw_rs_zc_complete(struct sk_buff *skb, struct ubuf_info *u, bool zerocopy_success)
{
	if (!refcount_dec_and_test(&u->refcnt))
		return;
	/*
	 * An RCU read-side section, so that module exit's synchronize_rcu()
	 * (after the last notification is released) waits for this call.
	 */
	rcu_read_lock();
	siw_rs_zc_released(u);
	rcu_read_unlock();
}

static const struct ubuf_info_ops siw_rs_zc_ops = {
	.complete = siw_rs_zc_complete,
};

void siw_rs_h_zc_init(struct ubuf_info *u)
{
	u->ops = &siw_rs_zc_ops;
	refcount_set(&u->refcnt, 1);
	/*
	 * DONT_ORPHAN, as MSG_ZEROCOPY's and io_uring's notifications have:
	 * without it TCP copies the pages out (skb_orphan_frags) whenever it
	 * unclones an skb whose clone a NIC still holds (to split or trim it),
	 * and that copy clears SKBFL_PURE_ZEROCOPY without charging the
	 * socket for the payload, which leaves sk_forward_alloc unbalanced.
	 */
	u->flags = SKBFL_ZEROCOPY_FRAG | SKBFL_DONT_ORPHAN;
}

void siw_rs_h_zc_put(struct ubuf_info *u)
{
	net_zcopy_put(u);
}

#define SIW_RS_ZC_BVECS 32

int siw_rs_h_sendmsg_zc(struct socket *sock, const struct siw_rs_zc_part *parts, unsigned int n,
			struct ubuf_info *u, bool more)
{
	struct bio_vec bv[SIW_RS_ZC_BVECS];
	struct msghdr msg = {
		.msg_flags = MSG_ZEROCOPY | MSG_DONTWAIT | MSG_NOSIGNAL,
		.msg_ubuf = u,
	};
	struct page *framing = NULL;
	unsigned int nb = 0, used = 0, i;
	size_t total = 0;
	int r;

	for (i = 0; i < n; i++) {
		const u8 *p = parts[i].base;
		size_t left = parts[i].len;

		if (parts[i].copy) {
			if (!framing)
				framing = alloc_page(GFP_NOWAIT | __GFP_NOWARN);
			if (!framing || nb == SIW_RS_ZC_BVECS || left > PAGE_SIZE - used)
				break;
			memcpy(page_address(framing) + used, p, left);
			bvec_set_page(&bv[nb++], framing, left, used);
			used += left;
			total += left;
			continue;
		}
		/*
		 * Page by page, while the page may be referenced: in the
		 * direct map, and not slab memory or a tail of a non-compound
		 * allocation (sendpage_ok), as a kernel consumer's memory may
		 * be. What stops here is copied by the caller.
		 */
		while (left && nb < SIW_RS_ZC_BVECS && virt_addr_valid(p) && sendpage_ok(virt_to_page(p))) {
			size_t off = offset_in_page(p);
			size_t l = min_t(size_t, left, PAGE_SIZE - off);

			bvec_set_page(&bv[nb++], virt_to_page(p), l, off);
			p += l;
			left -= l;
			total += l;
		}
		if (left)
			break;
	}
	if (!total) {
		if (framing)
			put_page(framing);
		return -EOPNOTSUPP;
	}
	if (more || i < n)
		msg.msg_flags |= MSG_MORE;
	iov_iter_bvec(&msg.msg_iter, ITER_SOURCE, bv, nb, total);
	r = sock_sendmsg(sock, &msg);
	/* The skbs hold their own references to the page. */
	if (framing)
		put_page(framing);
	return r;
}
