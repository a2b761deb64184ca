/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * siw_rs user/kernel ABI: the one definition shared by the siw_rs kernel
 * module (through bindgen) and the rdma-core provider (libsiw_rs).
 *
 * Overview (Documentation/siw_rs/abi.rst has the full contract):
 *
 * - The provider finds siw_rs devices by the sysfs attribute
 *   /sys/class/infiniband/<dev>/siw_rs_abi, which holds SIW_RS_ABI_VERSION
 *   in decimal. The device registers with RDMA_DRIVER_UNKNOWN and
 *   uverbs_abi_ver SIW_RS_ABI_VERSION, so no other provider binds to it and
 *   the siw_rs provider never binds to an upstream siw device.
 * - Every work queue and completion queue is a ring in kernel memory
 *   (vmalloc_user) mapped into the process with mmap(2) on the uverbs fd at
 *   the offset ("key") returned when the object is created. A ring is a
 *   struct siw_rs_ring_ctrl followed by 2^n entries; the mapping length is
 *   the *_bytes field of the response.
 * - Send and receive queues: userspace produces, the kernel consumes. The
 *   provider writes an entry at index (prod & (n - 1)), then stores prod
 *   with release semantics. The kernel loads prod with acquire semantics,
 *   copies the entry out of the ring, validates the copy (never the ring),
 *   and stores cons with release semantics once the slot may be reused.
 *   A ring of garbage can only fail the QP it belongs to.
 * - Doorbell: after storing sq.prod the provider issues a full fence and
 *   reads ctrl.kflags; only if SIW_RS_KF_SQ_IDLE is set does it make the
 *   doorbell system call: ioctl(db_fd, SIW_RS_IOCTL_SQ_DOORBELL, qp_id) on
 *   the context's doorbell file (db_fd of the get-context response), or,
 *   where there is none, IB_USER_VERBS_CMD_POST_SEND with no work requests
 *   on the uverbs file. The kernel sets the flag, issues a full fence and
 *   reads prod once more before it stops working on the queue, so no posted
 *   entry is left behind (Dekker). Receive queues need no doorbell: the
 *   kernel reads them when a message arrives.
 * - Completion queue: the kernel produces, userspace consumes. The kernel
 *   writes a CQE, then stores prod (release); the provider loads prod
 *   (acquire), reads CQEs and stores cons (release). Arming is a store of
 *   SIW_RS_NOTIFY_* to ctrl.notify by the provider, no system call; the
 *   kernel atomically clears it when it raises the completion event. Both
 *   sides issue a full fence between their store (kernel: prod, process:
 *   notify) and their load of the other's word, so an arming that races
 *   with a completion is never lost.
 * - SIW_RS_KF_ERROR in a work queue's kflags: the QP is in ERROR; entries
 *   posted from then on are flushed when the queue's doorbell is rung (for
 *   the RQ: SIW_RS_IOCTL_RQ_DOORBELL, or IB_USER_VERBS_CMD_POST_RECV with
 *   no work requests).
 * - Indices are free-running 32-bit counters; a ring holds at most n
 *   entries (prod - cons <= n).
 */
#ifndef SIW_RS_ABI_H
#define SIW_RS_ABI_H

#include <linux/types.h>

#define SIW_RS_ABI_VERSION 2

/* Name of the sysfs attribute (under the ib_device) that marks a device. */
#define SIW_RS_ABI_SYSFS_ATTR "siw_rs_abi"

/* Limits of one work queue entry. */
#define SIW_RS_MAX_SGE 6
#define SIW_RS_MAX_INLINE 256

/* Ring control block, at offset 0 of every ring mapping. Each index sits in
 * its own cache line so producer and consumer never share one. */
struct siw_rs_ring_ctrl {
	__u32 prod;            /* written by the producer only */
	__u32 rsvd0[15];
	__u32 cons;            /* written by the consumer only */
	__u32 rsvd1[15];
	__u32 kflags;          /* SIW_RS_KF_*: written by the kernel */
	__u32 notify;          /* CQ only: SIW_RS_NOTIFY_*, set by userspace */
	__u32 rsvd2[14];
};

/* ctrl.kflags */
#define SIW_RS_KF_SQ_IDLE (1u << 0)  /* SQ: the kernel is not processing */
#define SIW_RS_KF_ERROR (1u << 1)    /* QP in ERROR (after posting, ring the
					* doorbell so the entries are flushed);
					* CQ overflowed */

/* ctrl.notify (CQ) */
#define SIW_RS_NOTIFY_SOLICITED (1u << 0)
#define SIW_RS_NOTIFY_NEXT (1u << 1)

/* Entries start at this offset from the ring mapping's start. */
#define SIW_RS_RING_ENTRIES_OFFSET 256

struct siw_rs_sge {
	__aligned_u64 addr;    /* virtual address within the lkey's region */
	__u32 length;
	__u32 lkey;
};

/* siw_rs_sqe.opcode */
enum siw_rs_opcode {
	SIW_RS_OP_SEND = 0,
	SIW_RS_OP_SEND_INV = 1,     /* invalidate: sqe.imm_or_inv */
	SIW_RS_OP_SEND_IMM = 2,     /* RFC 7306 Send with Immediate */
	SIW_RS_OP_WRITE = 3,
	SIW_RS_OP_WRITE_IMM = 4,    /* RFC 7306 Write with Immediate */
	SIW_RS_OP_READ = 5,
	SIW_RS_OP_ATOMIC_CMP_SWP = 6,  /* compare: sqe.atomic[0], swap: [1] */
	SIW_RS_OP_ATOMIC_FETCH_ADD = 7, /* add: sqe.atomic[0] */
	SIW_RS_OP_LOCAL_INV = 8,    /* STag: sqe.imm_or_inv */
};

/* siw_rs_sqe.flags (the IBV_SEND_* meaning) */
#define SIW_RS_WQE_SIGNALED (1u << 0)
#define SIW_RS_WQE_SOLICITED (1u << 1)
#define SIW_RS_WQE_FENCE (1u << 2)
#define SIW_RS_WQE_INLINE (1u << 3)

/* A send queue entry: 64 octets of header, then up to SIW_RS_MAX_SGE SGEs
 * or (SIW_RS_WQE_INLINE) up to SIW_RS_MAX_INLINE octets of data. */
struct siw_rs_sqe {
	__aligned_u64 wr_id;
	__u8 opcode;           /* enum siw_rs_opcode */
	__u8 flags;            /* SIW_RS_WQE_* */
	__u8 num_sge;          /* SGEs, or 0 for inline */
	__u8 rsvd0;
	__u32 inline_len;      /* with SIW_RS_WQE_INLINE */
	__aligned_u64 remote_addr;
	__u32 rkey;
	__u32 imm_or_inv;      /* immediate data (network order) or STag */
	__aligned_u64 atomic[2];
	__aligned_u64 rsvd1[2];
	union {
		struct siw_rs_sge sge[SIW_RS_MAX_SGE];
		__u8 inline_data[SIW_RS_MAX_INLINE];
	};
};

/* A receive queue entry (RQ and SRQ). */
struct siw_rs_rqe {
	__aligned_u64 wr_id;
	__u8 num_sge;
	__u8 rsvd0[7];
	struct siw_rs_sge sge[SIW_RS_MAX_SGE];
};

/* siw_rs_cqe.opcode: the IBV_WC_* values */
/* siw_rs_cqe.status: the IBV_WC_* status values */
/* siw_rs_cqe.flags */
#define SIW_RS_CQE_WITH_IMM (1u << 0)
#define SIW_RS_CQE_WITH_INV (1u << 1)
#define SIW_RS_CQE_SOLICITED (1u << 2)

struct siw_rs_cqe {
	__aligned_u64 wr_id;
	__u8 opcode;
	__u8 status;
	__u8 flags;
	__u8 rsvd0;
	__u32 byte_len;
	__u32 qp_num;
	__u32 imm_or_inv;      /* network order immediate, or invalidated STag */
	__u32 vendor_err;
	__u32 rsvd1;
};

/*
 * The doorbell file: a file the kernel opens in the process for each
 * context (close-on-exec), its number in siw_rs_uresp_alloc_ctx.db_fd. Its
 * ioctls ring a queue of a QP of that context, the QP named by qp_id (the
 * create-QP response's) passed as the argument itself, not a pointer. 0, or
 * -1 with errno EINVAL when no QP of the context has that number (another
 * context's, destroyed, a kernel QP) and ENOTTY for another request. It
 * refers to the context, not the device: once the context is gone its
 * ioctls fail with EINVAL, and closing it ends nothing but the file.
 */
#define SIW_RS_IOCTL_TYPE 0x1b /* RDMA_IOCTL_MAGIC; numbers from 0x80 */
#define SIW_RS_IOCTL_SQ_DOORBELL _IO(SIW_RS_IOCTL_TYPE, 0x80)
#define SIW_RS_IOCTL_RQ_DOORBELL _IO(SIW_RS_IOCTL_TYPE, 0x81)

/* Command responses (driver data after the generic uverbs response). */
struct siw_rs_uresp_alloc_ctx {
	__u32 abi_version;
	__u32 max_inline;      /* inline bytes the kernel accepts */
	__u32 sqe_size;
	__u32 rqe_size;
	__u32 cqe_size;
	__u32 max_sge;
	__s32 db_fd;           /* the doorbell file, or -1: none could be
				* opened (the process is out of file
				* numbers), ring through the uverbs file */
	__u32 rsvd;
};

struct siw_rs_uresp_create_cq {
	__aligned_u64 ring_key;
	__aligned_u64 ring_bytes;
	__u32 cq_id;
	__u32 num_cqe;         /* entries in the ring, a power of two */
};

struct siw_rs_uresp_create_qp {
	__aligned_u64 sq_key;
	__aligned_u64 sq_bytes;
	__aligned_u64 rq_key;  /* 0 with an SRQ */
	__aligned_u64 rq_bytes;
	__u32 qp_id;
	__u32 num_sqe;         /* a power of two */
	__u32 num_rqe;         /* a power of two, 0 with an SRQ */
	__u32 max_inline;
};

struct siw_rs_uresp_create_srq {
	__aligned_u64 rq_key;
	__aligned_u64 rq_bytes;
	__u32 num_rqe;
	__u32 rsvd;
};

#endif /* SIW_RS_ABI_H */
