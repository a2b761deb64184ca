// SPDX-License-Identifier: GPL-2.0
/*
 * uverbs-fuzz: a randomized driver of verbs calls with bad arguments, for
 * the siw_rs VM tests (issue #6, the uverbs surface). Runs unprivileged.
 *
 *   uverbs-fuzz [--seed N] [--secs N] [--dev NAME] [--no-fork]
 *
 * The parent process keeps two verbs contexts on the device and a table of
 * their live objects (PDs, CQs, SRQs, QPs, MRs). Each iteration picks an
 * operation and mostly-bad arguments for it: sizes of 0, -1, the device
 * maximum + 1 or huge, unknown QP types and access flags, addresses that
 * are NULL, unmapped, read-only or in the kernel, lengths beyond
 * RLIMIT_MEMLOCK, invalid state transitions, objects destroyed while in use,
 * work requests with bad opcodes and SGE counts, mmap(2) of the uverbs file
 * at random offsets. Where the right result is known (EINVAL, EBUSY,
 * ENOMEM, success) it is asserted; a mismatch is printed and counted.
 *
 * Meanwhile a child process is forked again and again (unless --no-fork);
 * it opens its own contexts and abuses them below the library: raw write()
 * commands on the uverbs file with random handles, lengths and driver data,
 * handles used after destroy, objects of one context named in another,
 * siw_rs's rings (created by raw CREATE_QP/CREATE_CQ, mapped by their keys)
 * filled with garbage and plausible-but-wrong entries followed by the
 * doorbell (the uverbs command or the context's doorbell file), in RESET
 * and in ERROR (the flush path), and the doorbell files' ioctls with
 * random requests and QP numbers, its own context's and the other's. The
 * parent SIGKILLs the
 * child at a random moment, so the kernel's cleanup of a dying process runs
 * on objects in every state.
 *
 * Prints one summary line per operation kind (calls, successes, errno
 * histogram, assertion mismatches, findings) and exits 1 on any mismatch
 * or finding, 0 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>

#include "../../uapi/siw_rs-abi.h"
#include "vmtest.h"

/* ---------------------------------------------------------------------- */
/* Statistics, shared with the children (MAP_SHARED). */

enum kind {
	K_CREATE_CQ, K_DESTROY_CQ, K_RESIZE_CQ, K_POLL_CQ, K_ALLOC_PD, K_DEALLOC_PD,
	K_CREATE_SRQ, K_MODIFY_SRQ, K_DESTROY_SRQ, K_CREATE_QP, K_MODIFY_QP,
	K_QUERY_QP, K_DESTROY_QP, K_QUERY, K_REG_MR, K_REREG_MR, K_DEREG_MR,
	K_POST_SEND, K_POST_RECV, K_POST_SRQ, K_MMAP,
	/* the children's */
	K_RAW_CMD, K_RAW_CREATE, K_RAW_STALE, K_RAW_BUSY, K_RAW_POST, K_CROSS_CTX,
	K_RING_MMAP, K_RING_GARBAGE, K_CLOSE_CTX, K_DOORBELL_FILE, K_CHILD,
	N_KINDS
};

static const char *const kind_name[N_KINDS] = {
	"create_cq", "destroy_cq", "resize_cq", "poll_cq", "alloc_pd", "dealloc_pd",
	"create_srq", "modify_srq", "destroy_srq", "create_qp", "modify_qp",
	"query_qp", "destroy_qp", "query_dev_port", "reg_mr", "rereg_mr", "dereg_mr",
	"post_send", "post_recv", "post_srq_recv", "mmap_uverbs",
	"raw_cmd", "raw_create_udata", "raw_stale_handle", "raw_destroy_busy",
	"raw_post_wr", "cross_context", "ring_mmap", "ring_garbage", "close_ctx",
	"doorbell_file", "child",
};

#define MAX_ERRNO 160

struct kstat {
	long calls, ok, mismatch, finding, note;
	long err[MAX_ERRNO + 1]; /* [MAX_ERRNO]: any other */
};

static struct kstat *stats;
static int in_child;
static uint64_t seed;

static void add(long *p, long v) { __atomic_add_fetch(p, v, __ATOMIC_RELAXED); }

/* Records a result: 0 or a positive errno. */
static void rec(enum kind k, int e)
{
	add(&stats[k].calls, 1);
	if (e == 0)
		add(&stats[k].ok, 1);
	else
		add(&stats[k].err[e > 0 && e < MAX_ERRNO ? e : MAX_ERRNO], 1);
}

static void report(enum kind k, long *counter, const char *what, const char *fmt, va_list ap)
{
	long n = __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);

	if (n > (what[0] == 'N' ? 3 : 20))
		return;
	printf("%s %s (seed %" PRIu64 "%s): ", what, kind_name[k], seed, in_child ? ", child" : "");
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
}

static void mismatch(enum kind k, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(k, &stats[k].mismatch, "MISMATCH", fmt, ap);
	va_end(ap);
}

/* A known behaviour that is not an error of the call's checks (see the
 * summary in Documentation/siw_rs/testing.rst); counted, not failed. None
 * at present: the one there was, posts beyond a queue's own SGE limit, was
 * fixed in the provider. */
static __attribute__((unused)) void note(enum kind k, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(k, &stats[k].note, "NOTE", fmt, ap);
	va_end(ap);
}

static void finding(enum kind k, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(k, &stats[k].finding, "FINDING", fmt, ap);
	va_end(ap);
}

/* The expected outcome of a call. */
#define WANT_OK 0
#define WANT_FAIL (-1) /* any errno; success with such arguments is a finding */
#define WANT_ANY (-2)

/* Records `got` (0 or errno) against `want` (WANT_* or an errno). */
static void check(enum kind k, int got, int want, const char *desc)
{
	rec(k, got);
	if (want == WANT_ANY || got == want)
		return;
	if (want == WANT_FAIL) {
		if (got == 0)
			finding(k, "%s: succeeded", desc);
		return;
	}
	mismatch(k, "%s: got %s (%d), want %s (%d)", desc, got ? strerror(got) : "success", got,
		 want ? strerror(want) : "success", want);
}

/* ---------------------------------------------------------------------- */
/* PRNG (xorshift64*). */

static uint64_t rng_state;

static uint64_t rnd64(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ULL;
}

static uint32_t rnd(uint32_t n) { return n ? (uint32_t)(rnd64() % n) : 0; }
static int chance(int percent) { return rnd(100) < (uint32_t)percent; }

#define PICK(...) ({ const int64_t _v[] = { __VA_ARGS__ }; \
	_v[rnd(sizeof(_v) / sizeof(_v[0]))]; })

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---------------------------------------------------------------------- */
/* Memory the MRs and SGEs point at. */

#define ARENA (8u << 20)     /* anonymous, read-write */
#define VALID_MR_MAX (32u << 10)
#define MEMLOCK (2u << 20)   /* RLIMIT_MEMLOCK the fuzzer sets for itself */
static char *arena;          /* first 1 MiB touched */
static char *ro_page;        /* PROT_READ */
static char *none_area;      /* PROT_NONE, 1 MiB */
static long page;

static const uint64_t kernel_addrs[] = {
	0xffff888000000000ull, 0xffffffff81000000ull, 0xffffc90000000000ull,
	0xfffffffffffff000ull,
};

/* ---------------------------------------------------------------------- */
/* The parent's tracked objects. */

#define NCTX 2
#define MAXO 12
#define MAXSRQ 3

struct pdo { struct ibv_pd *pd; int users; };
struct cqo { struct ibv_cq *cq; int users; };
struct srqo { struct ibv_srq *srq; int pd; int users; };
struct qpo {
	struct ibv_qp *qp;
	int pd, scq, rcq, srq; /* srq -1: none */
	struct ibv_qp_cap cap;
};
struct mro { struct ibv_mr *mr; int pd; size_t pages; int rereg; };

struct cx {
	struct ibv_context *ctx;
	struct ibv_device_attr da;
	struct pdo pd[MAXO];
	struct cqo cq[MAXO];
	struct srqo srq[MAXSRQ];
	struct qpo qp[MAXO];
	struct mro mr[MAXO];
};

static struct cx cxs[NCTX];
static size_t pinned_pages; /* by live MRs of the parent */

static int free_slot(void **first, size_t stride, int n)
{
	for (int i = 0; i < n; i++)
		if (!*(void **)((char *)first + i * stride))
			return i;
	return -1;
}

static int live_slot(void **first, size_t stride, int n)
{
	int idx[64], m = 0;

	for (int i = 0; i < n; i++)
		if (*(void **)((char *)first + i * stride))
			idx[m++] = i;
	return m ? idx[rnd(m)] : -1;
}

#define FREE(arr) free_slot((void **)&(arr)[0], sizeof((arr)[0]), sizeof(arr) / sizeof((arr)[0]))
#define LIVE(arr) live_slot((void **)&(arr)[0], sizeof((arr)[0]), sizeof(arr) / sizeof((arr)[0]))

static struct ibv_device *the_dev;

/* ---------------------------------------------------------------------- */
/* Parent operations. */

static void op_alloc_pd(struct cx *c)
{
	int s = FREE(c->pd);

	if (s < 0)
		return;
	c->pd[s].pd = ibv_alloc_pd(c->ctx);
	check(K_ALLOC_PD, c->pd[s].pd ? 0 : errno, WANT_OK, "alloc_pd");
	c->pd[s].users = 0;
}

static void op_dealloc_pd(struct cx *c)
{
	int s = LIVE(c->pd), rc;

	if (s < 0)
		return;
	if (c->pd[s].users == 0 && chance(70))
		return; /* keep PDs around to build on */
	rc = ibv_dealloc_pd(c->pd[s].pd);
	check(K_DEALLOC_PD, rc, c->pd[s].users ? EBUSY : WANT_OK,
	      c->pd[s].users ? "dealloc_pd of a PD in use" : "dealloc_pd");
	if (rc == 0)
		c->pd[s].pd = NULL;
}

static void op_create_cq(struct cx *c)
{
	int s = FREE(c->cq), max = c->da.max_cqe, want = WANT_OK;
	int cqe = PICK(0, -1, INT32_MIN, INT32_MAX, max + 1, max, 1, 2, 1 + rnd(64), 1 + rnd(1024),
		       1 + rnd(64), 1 + rnd(4096));
	int vec = chance(80) ? 0 : (int)PICK(1, 2, -1, 1000, INT32_MAX, rnd(64));
	char desc[96];
	struct ibv_cq *cq;

	if (s < 0)
		return;
	if (cqe < 1 || cqe > max || vec < 0 || vec >= c->ctx->num_comp_vectors)
		want = EINVAL;
	snprintf(desc, sizeof(desc), "create_cq(cqe %d, comp_vector %d)", cqe, vec);
	cq = ibv_create_cq(c->ctx, cqe, NULL, NULL, vec);
	check(K_CREATE_CQ, cq ? 0 : errno, want, desc);
	if (cq && (int)cq->cqe < cqe)
		mismatch(K_CREATE_CQ, "%s: provides %d entries", desc, cq->cqe);
	c->cq[s].cq = cq;
	c->cq[s].users = 0;
}

static void op_destroy_cq(struct cx *c)
{
	int s = LIVE(c->cq), rc;

	if (s < 0 || (c->cq[s].users == 0 && chance(50)))
		return;
	rc = ibv_destroy_cq(c->cq[s].cq);
	check(K_DESTROY_CQ, rc, c->cq[s].users ? EBUSY : WANT_OK,
	      c->cq[s].users ? "destroy_cq of a CQ in use" : "destroy_cq");
	if (rc == 0)
		c->cq[s].cq = NULL;
}

static void op_resize_cq(struct cx *c)
{
	int s = LIVE(c->cq), rc;

	if (s < 0)
		return;
	rc = ibv_resize_cq(c->cq[s].cq, PICK(0, -1, 1, 64, c->da.max_cqe + 1, INT32_MAX));
	/* siw_rs does not resize CQs. */
	check(K_RESIZE_CQ, rc, WANT_FAIL, "resize_cq");
}

static void op_poll_cq(struct cx *c)
{
	struct ibv_wc wc[16];
	int s = LIVE(c->cq), ne, n;

	if (s < 0)
		return;
	ne = PICK(-1, 0, 1, 16, INT32_MIN);
	n = ibv_poll_cq(c->cq[s].cq, ne > 16 ? 16 : ne, wc);
	if (ne < 0)
		check(K_POLL_CQ, n < 0 ? EINVAL : 0, EINVAL, "poll_cq with a negative count");
	else
		check(K_POLL_CQ, n < 0 ? EIO : 0, WANT_OK, "poll_cq");
	if (ne >= 0 && n > ne)
		mismatch(K_POLL_CQ, "poll_cq(%d) returned %d", ne, n);
	if (chance(30))
		ibv_req_notify_cq(c->cq[s].cq, rnd(2));
}

static void op_create_srq(struct cx *c)
{
	int s = FREE(c->srq), p = LIVE(c->pd), want = WANT_OK;
	struct ibv_srq_init_attr a = { 0 };
	char desc[128];

	if (s < 0 || p < 0)
		return;
	a.attr.max_wr = PICK(0, 1, 1 + rnd(256), c->da.max_srq_wr, c->da.max_srq_wr + 1, UINT32_MAX);
	a.attr.max_sge = PICK(0, 1, 2, c->da.max_srq_sge, c->da.max_srq_sge + 1, 255, UINT32_MAX);
	a.attr.srq_limit = chance(70) ? 0 : PICK(1, a.attr.max_wr, a.attr.max_wr + 1, UINT32_MAX);
	if (a.attr.max_wr == 0 || a.attr.max_wr > (uint32_t)c->da.max_srq_wr ||
	    a.attr.max_sge > (uint32_t)c->da.max_srq_sge || a.attr.srq_limit > a.attr.max_wr)
		want = EINVAL;
	snprintf(desc, sizeof(desc), "create_srq(max_wr %u, max_sge %u, limit %u)", a.attr.max_wr,
		 a.attr.max_sge, a.attr.srq_limit);
	c->srq[s].srq = ibv_create_srq(c->pd[p].pd, &a);
	check(K_CREATE_SRQ, c->srq[s].srq ? 0 : errno, want, desc);
	if (c->srq[s].srq) {
		c->srq[s].pd = p;
		c->srq[s].users = 0;
		c->pd[p].users++;
	}
}

static void op_modify_srq(struct cx *c)
{
	int s = LIVE(c->srq), rc;
	struct ibv_srq_attr a = { 0 };
	int mask = PICK(IBV_SRQ_LIMIT, IBV_SRQ_MAX_WR, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT, 0x80, 0);

	if (s < 0)
		return;
	a.max_wr = PICK(0, 1, 64, UINT32_MAX);
	a.srq_limit = PICK(0, 1, 1 + rnd(4096), UINT32_MAX);
	rc = ibv_modify_srq(c->srq[s].srq, &a, mask);
	/* siw_rs does not resize SRQs. */
	check(K_MODIFY_SRQ, rc, mask & IBV_SRQ_MAX_WR ? WANT_FAIL : WANT_ANY, "modify_srq");
	if (chance(50)) {
		rc = ibv_query_srq(c->srq[s].srq, &a);
		check(K_MODIFY_SRQ, rc, WANT_OK, "query_srq");
	}
}

static void op_destroy_srq(struct cx *c)
{
	int s = LIVE(c->srq), rc;

	if (s < 0 || (c->srq[s].users == 0 && chance(50)))
		return;
	rc = ibv_destroy_srq(c->srq[s].srq);
	check(K_DESTROY_SRQ, rc, c->srq[s].users ? EBUSY : WANT_OK,
	      c->srq[s].users ? "destroy_srq of an SRQ in use" : "destroy_srq");
	if (rc == 0) {
		c->pd[c->srq[s].pd].users--;
		c->srq[s].srq = NULL;
	}
}

static uint32_t wr_count(const struct cx *c)
{
	uint32_t max = c->da.max_qp_wr;

	return PICK(0, 1, 2, 1 + rnd(64), 1 + rnd(64), 1 + rnd(512), max, max + 1, UINT32_MAX,
		    (uint32_t)rnd64());
}

static void op_create_qp(struct cx *c)
{
	int s = FREE(c->qp), p = LIVE(c->pd), sc = LIVE(c->cq), rc_ = LIVE(c->cq), sr = -1;
	struct ibv_qp_init_attr a = { 0 };
	uint32_t max_sge = c->da.max_sge;
	int want = WANT_OK;
	char desc[200];
	struct ibv_qp *qp;

	if (s < 0 || p < 0 || sc < 0 || rc_ < 0)
		return;
	if (chance(20))
		sr = LIVE(c->srq);
	a.send_cq = c->cq[sc].cq;
	a.recv_cq = c->cq[rc_].cq;
	a.srq = sr >= 0 ? c->srq[sr].srq : NULL;
	a.qp_type = chance(85) ? IBV_QPT_RC : PICK(IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RAW_PACKET,
						     IBV_QPT_XRC_SEND, IBV_QPT_DRIVER, 0, 0x55);
	a.sq_sig_all = rnd(3);
	a.cap.max_send_wr = chance(50) ? 1 + rnd(64) : wr_count(c);
	a.cap.max_recv_wr = chance(50) ? 1 + rnd(64) : wr_count(c);
	a.cap.max_send_sge = chance(50) ? rnd(max_sge + 1) : PICK(0, max_sge, max_sge + 1, 255, UINT32_MAX);
	a.cap.max_recv_sge = chance(50) ? rnd(max_sge + 1) : PICK(0, max_sge, max_sge + 1, 255, UINT32_MAX);
	a.cap.max_inline_data = chance(50) ? rnd(65) : PICK(0, SIW_RS_MAX_INLINE, SIW_RS_MAX_INLINE + 1,
							    4096, UINT32_MAX);
	if (a.qp_type != IBV_QPT_RC)
		want = WANT_FAIL;
	else if (a.cap.max_send_wr == 0 || a.cap.max_send_wr > (uint32_t)c->da.max_qp_wr ||
		 a.cap.max_recv_wr > (uint32_t)c->da.max_qp_wr ||
		 (!a.srq && a.cap.max_recv_wr == 0) || a.cap.max_send_sge > max_sge ||
		 a.cap.max_recv_sge > max_sge || a.cap.max_inline_data > SIW_RS_MAX_INLINE)
		want = EINVAL;
	snprintf(desc, sizeof(desc),
		 "create_qp(type %d, srq %d, send_wr %u, recv_wr %u, send_sge %u, recv_sge %u, inline %u)",
		 a.qp_type, !!a.srq, a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge,
		 a.cap.max_recv_sge, a.cap.max_inline_data);
	struct ibv_qp_cap req = a.cap;
	qp = ibv_create_qp(c->pd[p].pd, &a);
	check(K_CREATE_QP, qp ? 0 : errno, want, desc);
	if (!qp)
		return;
	if (a.cap.max_send_wr < req.max_send_wr || a.cap.max_send_sge < req.max_send_sge ||
	    a.cap.max_recv_sge < req.max_recv_sge || a.cap.max_inline_data < req.max_inline_data ||
	    (!a.srq && a.cap.max_recv_wr < req.max_recv_wr))
		mismatch(K_CREATE_QP, "%s: provides less (send_wr %u, recv_wr %u, send_sge %u, recv_sge %u, inline %u)",
			 desc, a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge,
			 a.cap.max_recv_sge, a.cap.max_inline_data);
	c->qp[s] = (struct qpo){ .qp = qp, .pd = p, .scq = sc, .rcq = rc_, .srq = sr, .cap = a.cap };
	c->pd[p].users++;
	c->cq[sc].users++;
	c->cq[rc_].users++;
	if (sr >= 0)
		c->srq[sr].users++;
}

static void op_destroy_qp(struct cx *c)
{
	int s = LIVE(c->qp), rc;
	struct qpo *q;

	if (s < 0 || chance(30))
		return;
	q = &c->qp[s];
	rc = ibv_destroy_qp(q->qp);
	check(K_DESTROY_QP, rc, WANT_OK, "destroy_qp");
	if (rc)
		return;
	c->pd[q->pd].users--;
	c->cq[q->scq].users--;
	c->cq[q->rcq].users--;
	if (q->srq >= 0)
		c->srq[q->srq].users--;
	q->qp = NULL;
}

/* siw_rs's transition rules (a process cannot reach RTS: only the CM can). */
static int transition_ok(enum ibv_qp_state from, enum ibv_qp_state to)
{
	if (to == IBV_QPS_SQD && (from == IBV_QPS_SQE || from == IBV_QPS_ERR))
		return 1;
	if (to == IBV_QPS_RTS && from != IBV_QPS_RTS)
		return 0;
	if (from == to || to == IBV_QPS_ERR)
		return 1;
	return (from == IBV_QPS_RESET && to == IBV_QPS_INIT) ||
	       (from == IBV_QPS_INIT && to == IBV_QPS_RESET) ||
	       (from == IBV_QPS_INIT && to == IBV_QPS_RTR) ||
	       (from == IBV_QPS_RTR && to == IBV_QPS_INIT) ||
	       (from == IBV_QPS_RTS && to == IBV_QPS_SQD) ||
	       (from == IBV_QPS_RTS && to == IBV_QPS_SQE) ||
	       (from == IBV_QPS_SQD && to == IBV_QPS_SQE) ||
	       (from == IBV_QPS_ERR && to == IBV_QPS_RESET);
}

static int qp_state(struct ibv_qp *qp, enum ibv_qp_state *st)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	int rc = ibv_query_qp(qp, &a, IBV_QP_STATE, &i);

	*st = a.qp_state;
	return rc;
}

static void op_modify_qp(struct cx *c)
{
	int s = LIVE(c->qp), rc, mask, want = WANT_ANY;
	struct ibv_qp_attr a;
	enum ibv_qp_state from;
	char desc[128];

	if (s < 0)
		return;
	rc = qp_state(c->qp[s].qp, &from);
	check(K_QUERY_QP, rc, WANT_OK, "query_qp(state)");
	if (rc)
		return;
	memset(&a, 0, sizeof(a));
	a.qp_state = chance(90) ? rnd(IBV_QPS_ERR + 1) : PICK(7, 8, 255, -1);
	if (chance(70)) {
		/* State only (sometimes with the current state or access
		 * rights): the outcome is known. */
		mask = IBV_QP_STATE;
		if (chance(20)) {
			mask |= IBV_QP_CUR_STATE;
			a.cur_qp_state = chance(50) ? from : rnd(IBV_QPS_ERR + 1);
		}
		if (chance(20)) {
			mask |= IBV_QP_ACCESS_FLAGS;
			a.qp_access_flags = rnd(16);
		}
		if ((unsigned int)a.qp_state > IBV_QPS_ERR ||
		    ((mask & IBV_QP_CUR_STATE) && a.cur_qp_state != from) ||
		    !transition_ok(from, a.qp_state))
			want = EINVAL;
		else
			want = WANT_OK;
	} else {
		mask = chance(50) ? (int)rnd64() & ((IBV_QP_RATE_LIMIT << 1) - 1)
				  : PICK(IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_MAX_DEST_RD_ATOMIC,
					 IBV_QP_PORT, IBV_QP_AV, IBV_QP_PKEY_INDEX, IBV_QP_PATH_MTU,
					 IBV_QP_ACCESS_FLAGS, IBV_QP_STATE | IBV_QP_MAX_QP_RD_ATOMIC);
		a.max_rd_atomic = rnd(256);
		a.max_dest_rd_atomic = rnd(256);
		a.qp_access_flags = (int)rnd64();
		a.port_num = rnd(4);
		a.pkey_index = rnd(4);
		a.path_mtu = rnd(8);
		a.timeout = rnd(32);
		a.ah_attr.port_num = rnd(3);
		a.ah_attr.dlid = rnd(65536);
		if ((mask & ~(IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC)) == 0 && mask &&
		    ((mask & IBV_QP_MAX_QP_RD_ATOMIC && a.max_rd_atomic > c->da.max_qp_init_rd_atom) ||
		     (mask & IBV_QP_MAX_DEST_RD_ATOMIC && a.max_dest_rd_atomic > c->da.max_qp_rd_atom)))
			want = EINVAL;
	}
	snprintf(desc, sizeof(desc), "modify_qp(mask %#x, %d -> %d, cur %d)", mask, from, a.qp_state,
		 a.cur_qp_state);
	rc = ibv_modify_qp(c->qp[s].qp, &a, mask);
	check(K_MODIFY_QP, rc, want, desc);
	if (want == WANT_OK && rc == 0) {
		enum ibv_qp_state after;
		enum ibv_qp_state expect = a.qp_state;

		if (a.qp_state == IBV_QPS_SQD && (from == IBV_QPS_SQE || from == IBV_QPS_ERR))
			expect = from;
		if (qp_state(c->qp[s].qp, &after) == 0 && after != expect)
			mismatch(K_MODIFY_QP, "%s: state %d afterwards", desc, after);
	}
}

static void op_query(struct cx *c)
{
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	int s, rc, port;

	switch (rnd(3)) {
	case 0:
		check(K_QUERY, ibv_query_device(c->ctx, &da), WANT_OK, "query_device");
		break;
	case 1:
		port = PICK(1, 1, 0, 2, 255);
		rc = ibv_query_port(c->ctx, port, &pa);
		check(K_QUERY, rc, port == 1 ? WANT_OK : WANT_FAIL, "query_port");
		break;
	default:
		s = LIVE(c->qp);
		if (s < 0)
			return;
		/* Mask bits beyond the defined ones are refused (EOPNOTSUPP
		 * from the library); any defined mask works. */
		port = chance(50);
		rc = ibv_query_qp(c->qp[s].qp, &qa, port ? (int)(rnd64() & (IBV_QP_RATE_LIMIT - 1)) : (int)rnd64(), &qi);
		check(K_QUERY_QP, rc, port ? WANT_OK : WANT_ANY, "query_qp");
		if (rc == 0 && (qa.cap.max_send_wr < c->qp[s].cap.max_send_wr ||
				qa.cap.max_send_sge != c->qp[s].cap.max_send_sge))
			mismatch(K_QUERY_QP, "query_qp reports caps send_wr %u send_sge %u, create said %u %u",
				 qa.cap.max_send_wr, qa.cap.max_send_sge, c->qp[s].cap.max_send_wr,
				 c->qp[s].cap.max_send_sge);
	}
}

static const int valid_access[] = {
	0, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ,
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC,
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		IBV_ACCESS_REMOTE_ATOMIC,
};

static void op_reg_mr(struct cx *c)
{
	int s = FREE(c->mr), p = LIVE(c->pd), want, access;
	size_t len = 0, pages = 0;
	char *addr = NULL;
	char desc[128];
	struct ibv_mr *mr;

	if (s < 0 || p < 0)
		return;
	access = valid_access[rnd(sizeof(valid_access) / sizeof(valid_access[0]))];
	switch (rnd(10)) {
	case 0: case 1: /* valid */
		addr = arena + rnd(1u << 20);
		len = 1 + rnd(VALID_MR_MAX);
		pages = ((uintptr_t)addr + len + page - 1) / page - (uintptr_t)addr / page;
		/* Unpinning is deferred to a work item: near the limit a
		 * registration may see the pages of one just deregistered. */
		want = (pinned_pages + pages) * page <= MEMLOCK / 2 ? WANT_OK : WANT_ANY;
		snprintf(desc, sizeof(desc), "reg_mr(arena+%#zx, %zu, %#x)", addr - arena, len, access);
		break;
	case 2:
		addr = arena;
		want = EINVAL;
		snprintf(desc, sizeof(desc), "reg_mr(len 0)");
		break;
	case 3:
		addr = arena;
		len = PICK((1ull << 40) + 1, 1ull << 41, 1ull << 62);
		want = EINVAL;
		snprintf(desc, sizeof(desc), "reg_mr(len %#zx, beyond max_mr_size)", len);
		break;
	case 4:
		addr = arena;
		len = PICK(2 * MEMLOCK, ARENA, 1ull << 30);
		want = ENOMEM;
		snprintf(desc, sizeof(desc), "reg_mr(len %#zx, beyond RLIMIT_MEMLOCK)", len);
		break;
	case 5:
		addr = (char *)(uintptr_t)PICK(0, 0x1000, (int64_t)(uintptr_t)none_area,
					       (int64_t)(uintptr_t)(none_area + 4096),
					       (int64_t)kernel_addrs[rnd(4)]);
		len = PICK(1, 4096, 65536);
		want = WANT_FAIL;
		snprintf(desc, sizeof(desc), "reg_mr(%p: NULL, unmapped or kernel)", (void *)addr);
		break;
	case 6: /* read-only pages: a writable registration must fail */
		addr = ro_page;
		len = page;
		access = PICK(IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ);
		want = access & IBV_ACCESS_LOCAL_WRITE ? WANT_FAIL : WANT_OK;
		pages = 1;
		snprintf(desc, sizeof(desc), "reg_mr(read-only page, %#x)", access);
		break;
	case 7:
		addr = arena;
		len = 4096;
		access = PICK(IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_ATOMIC,
			      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
			      IBV_ACCESS_LOCAL_WRITE | 0x400, IBV_ACCESS_LOCAL_WRITE | 0x1000,
			      IBV_ACCESS_LOCAL_WRITE | (1 << 30), (int)0x80000000);
		want = EINVAL;
		snprintf(desc, sizeof(desc), "reg_mr(access %#x)", access);
		break;
	case 8:
		addr = arena;
		len = 4096;
		access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND;
		want = EOPNOTSUPP;
		snprintf(desc, sizeof(desc), "reg_mr(on-demand paging)");
		break;
	default: /* random */
		addr = (char *)(uintptr_t)rnd64();
		len = rnd64() >> rnd(64);
		access = (int)rnd64();
		want = WANT_ANY;
		snprintf(desc, sizeof(desc), "reg_mr(%p, %#zx, %#x)", (void *)addr, len, access);
	}
	mr = ibv_reg_mr(c->pd[p].pd, addr, len, access);
	check(K_REG_MR, mr ? 0 : errno, want, desc);
	if (!mr)
		return;
	if (want != WANT_OK && want != WANT_ANY)
		pages = (len + 2 * page) / page;
	if (want == WANT_ANY && pages == 0)
		pages = len / page + 2;
	c->mr[s] = (struct mro){ .mr = mr, .pd = p, .pages = pages };
	pinned_pages += pages;
	c->pd[p].users++;
}

static void op_rereg_mr(struct cx *c)
{
	int s = LIVE(c->mr), rc;

	if (s < 0)
		return;
	rc = ibv_rereg_mr(c->mr[s].mr, (int)rnd(8), c->pd[c->mr[s].pd].pd, arena, 4096,
			  valid_access[rnd(7)]);
	/* siw_rs has no rereg: a failed rereg leaves the MR as it was. */
	check(K_REREG_MR, rc, WANT_FAIL, "rereg_mr");
	c->mr[s].rereg = 1;
}

static void op_dereg_mr(struct cx *c)
{
	int s = LIVE(c->mr), rc;

	if (s < 0 || chance(30))
		return;
	rc = ibv_dereg_mr(c->mr[s].mr);
	check(K_DEREG_MR, rc, WANT_OK, "dereg_mr");
	if (rc)
		return;
	c->pd[c->mr[s].pd].users--;
	pinned_pages -= c->mr[s].pages;
	c->mr[s].mr = NULL;
}

/* An lkey: of a live MR (of any PD or context), or garbage. */
static uint32_t some_lkey(void)
{
	struct cx *c = &cxs[rnd(NCTX)];
	int s = LIVE(c->mr);

	if (s >= 0 && chance(70))
		return c->mr[s].mr->lkey;
	return PICK(0, 1, 0xffffffff, (uint32_t)rnd64());
}

static struct ibv_sge sges[300];

static void random_sges(int n)
{
	for (int i = 0; i < n && i < 300; i++) {
		sges[i].addr = chance(50) ? (uintptr_t)(arena + rnd(1u << 20))
					  : (uint64_t)PICK(0, (int64_t)kernel_addrs[0], (int64_t)rnd64());
		sges[i].length = PICK(0, 1, 8, 4096, 1 + rnd(1u << 20), UINT32_MAX, 0x80000000u);
		sges[i].lkey = some_lkey();
	}
}

static void op_post_send(struct cx *c)
{
	int s = LIVE(c->qp), rc, want = WANT_ANY, nwr = 1 + rnd(3), i, over_cap = 0;
	struct ibv_send_wr wr[3], *bad = NULL;
	struct qpo *q;
	char desc[128] = "post_send";

	if (s < 0)
		return;
	q = &c->qp[s];
	memset(wr, 0, sizeof(wr));
	random_sges(300);
	for (i = 0; i < nwr; i++) {
		struct ibv_send_wr *w = &wr[i];
		int valid_op = chance(85);

		w->wr_id = rnd64();
		w->next = i + 1 < nwr ? &wr[i + 1] : NULL;
		w->opcode = valid_op ? PICK(IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
					    IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ,
					    IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
					    IBV_WR_LOCAL_INV, IBV_WR_SEND_WITH_INV)
				     : PICK(IBV_WR_BIND_MW, IBV_WR_TSO, IBV_WR_DRIVER1, 0x55, -1);
		w->num_sge = chance(70) ? (int)rnd(q->cap.max_send_sge + 1)
					: PICK(q->cap.max_send_sge + 1, 7, 16, 255, -1, INT32_MIN);
		w->sg_list = sges;
		w->send_flags = chance(70) ? rnd(16) & ~IBV_SEND_INLINE : (uint32_t)rnd64();
		if (w->send_flags & IBV_SEND_INLINE) {
			/* Inline data is read by the library: real buffers. */
			for (int j = 0; j < 300; j++) {
				sges[j].addr = (uintptr_t)(arena + rnd(1u << 20));
				sges[j].length = rnd(5) ? rnd(128) : PICK(256, 257, 4096, 65536);
			}
		}
		w->wr.rdma.remote_addr = rnd64();
		w->wr.rdma.rkey = some_lkey();
		if (w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
			w->wr.atomic.remote_addr = rnd64() & (chance(50) ? ~7ull : ~0ull);
		/* The expectation comes from the first WR: the library
		 * validates a WR before it queues it, and a later WR may
		 * meet a full ring (ENOMEM) first. */
		if (i > 0) {
		} else if (!valid_op) {
			want = WANT_FAIL;
			snprintf(desc, sizeof(desc), "post_send(opcode %d)", w->opcode);
		} else if ((w->num_sge < 0 || (uint32_t)w->num_sge > q->cap.max_send_sge) &&
			   !(w->send_flags & IBV_SEND_INLINE) && w->opcode != IBV_WR_LOCAL_INV) {
			/* Beyond the device's limit: refused (EINVAL, or
			 * EOPNOTSUPP first for unknown send flags). Beyond
			 * only the QP's: must not succeed (below). */
			if (w->num_sge < 0 || w->num_sge > c->da.max_sge)
				want = (w->send_flags & ~0xf) ? WANT_FAIL : EINVAL;
			else
				over_cap = 1;
			snprintf(desc, sizeof(desc), "post_send(num_sge %d > max_send_sge %u, opcode %d)",
				 w->num_sge, q->cap.max_send_sge, w->opcode);
		}
	}
	rc = ibv_post_send(q->qp, wr, &bad);
	check(K_POST_SEND, rc, want, desc);
	if (over_cap && rc == 0)
		mismatch(K_POST_SEND, "%s accepted: beyond the QP's SGE limit", desc);
	if (rc && (bad < wr || bad >= wr + nwr))
		mismatch(K_POST_SEND, "failed post_send sets bad_wr %p outside the list", (void *)bad);
}

static void op_post_recv(struct cx *c)
{
	int s = LIVE(c->qp), rc, want = WANT_ANY, nwr = 1 + rnd(3), i, over_cap = 0;
	struct ibv_recv_wr wr[3], *bad = NULL;
	struct qpo *q;
	char desc[128] = "post_recv";

	if (s < 0)
		return;
	q = &c->qp[s];
	random_sges(300);
	for (i = 0; i < nwr; i++) {
		wr[i].wr_id = rnd64();
		wr[i].next = i + 1 < nwr ? &wr[i + 1] : NULL;
		wr[i].sg_list = sges;
		wr[i].num_sge = chance(70) ? (int)rnd(q->cap.max_recv_sge + 1)
					   : PICK(q->cap.max_recv_sge + 1, 7, 255, -1);
		if (i == 0 && (wr[i].num_sge < 0 || (uint32_t)wr[i].num_sge > q->cap.max_recv_sge)) {
			if (wr[i].num_sge < 0 || wr[i].num_sge > c->da.max_sge)
				want = EINVAL;
			else
				over_cap = 1;
			snprintf(desc, sizeof(desc), "post_recv(num_sge %d > max_recv_sge %u)",
				 wr[i].num_sge, q->cap.max_recv_sge);
		}
	}
	if (q->srq >= 0) {
		want = WANT_FAIL;
		snprintf(desc, sizeof(desc), "post_recv to a QP with an SRQ");
	}
	rc = ibv_post_recv(q->qp, wr, &bad);
	check(K_POST_RECV, rc, want, desc);
	if (over_cap && rc == 0 && q->srq < 0)
		mismatch(K_POST_RECV, "%s accepted: beyond the QP's SGE limit", desc);
}

static void op_post_srq(struct cx *c)
{
	int s = LIVE(c->srq), rc, n;
	struct ibv_recv_wr wr = { 0 }, *bad;
	struct ibv_srq_attr a;

	if (s < 0)
		return;
	if (ibv_query_srq(c->srq[s].srq, &a))
		return;
	random_sges(300);
	n = chance(70) ? (int)rnd(a.max_sge + 1) : PICK(a.max_sge + 1, 7, 255, -1);
	wr.wr_id = rnd64();
	wr.sg_list = sges;
	wr.num_sge = n;
	rc = ibv_post_srq_recv(c->srq[s].srq, &wr, &bad);
	/* Beyond the device's limit: refused (EINVAL, or ENOMEM first when
	 * the ring is full); beyond the SRQ's: refused too (below). */
	check(K_POST_SRQ, rc, n < 0 || n > c->da.max_sge ? WANT_FAIL : WANT_ANY, "post_srq_recv");
	if (rc == 0 && n >= 0 && (uint32_t)n > a.max_sge)
		mismatch(K_POST_SRQ, "post_srq_recv(num_sge %d > max_sge %u) accepted", n, a.max_sge);
}

/* mmap of the uverbs file at random offsets: offsets that name no ring (or
 * a ring with the wrong length) fail; a hit is unmapped again untouched. */
static void op_mmap(struct cx *c)
{
	size_t len = PICK(0, page, 2 * page, 1 + rnd(1u << 20), 64u << 20);
	off_t off = PICK(0, page, rnd(64) * page, (off_t)rnd(1u << 30) * page, 1, page + 1,
			 (off_t)(rnd64() & ~(uint64_t)(page - 1) & INT64_MAX));
	int prot = PICK(PROT_READ, PROT_READ | PROT_WRITE, PROT_WRITE, PROT_EXEC,
			PROT_READ | PROT_WRITE | PROT_EXEC, PROT_NONE);
	int flags = chance(80) ? MAP_SHARED : MAP_PRIVATE;
	void *p = mmap(NULL, len, prot, flags, c->ctx->cmd_fd, off);
	int want = (len == 0 || off % page) ? EINVAL : WANT_ANY;

	check(K_MMAP, p == MAP_FAILED ? errno : 0, want, "mmap(uverbs)");
	if (p != MAP_FAILED)
		munmap(p, len);
}

/* ---------------------------------------------------------------------- */
/* The child: raw commands and rings, in contexts of its own. */

static char *scratch; /* response buffer of raw commands */
#define SCRATCH (512u << 10)

static uint64_t resp_ptr(void)
{
	if (chance(85))
		return (uintptr_t)scratch;
	return PICK(0, 0x1000, (int64_t)(uintptr_t)none_area, (int64_t)(uintptr_t)ro_page,
		    (int64_t)kernel_addrs[0]);
}

/* write() of a command: the header, then `len` bytes of body. Returns 0 or
 * errno; `in_words` -1 means the honest count. */
static int raw(int fd, uint32_t cmd, const void *body, size_t len, int in_words, size_t out_bytes)
{
	char buf[4096];
	struct ib_uverbs_cmd_hdr *h = (void *)buf;
	size_t total = sizeof(*h) + len;

	if (total > sizeof(buf))
		total = sizeof(buf);
	h->command = cmd;
	h->in_words = in_words < 0 ? total / 4 : (uint16_t)in_words;
	h->out_words = out_bytes / 4;
	memcpy(buf + sizeof(*h), body, total - sizeof(*h));
	return write(fd, buf, total) < 0 ? errno : 0;
}

struct rawq {
	uint32_t handle;
	struct siw_rs_uresp_create_qp drv;
	void *sq, *rq;
};

struct child {
	struct ibv_context *ctx[2];
	int db[2];              /* each context's doorbell file, or -1 */
	struct ibv_pd *pd[2];
	struct ibv_cq *cq[2];
	struct ibv_qp *qp[2];
	struct ibv_srq *srq;
	struct rawq rq[4];
	int nrq;
};

/* A handle: of a live object, small, or garbage. */
static uint32_t some_handle(const struct child *ch)
{
	switch (rnd(6)) {
	case 0: return ch->pd[0] ? ch->pd[0]->handle : 0;
	case 1: return ch->cq[0] ? ch->cq[0]->handle : 1;
	case 2: return ch->qp[0] ? ch->qp[0]->handle : 2;
	case 3: return rnd(16);
	case 4: return (uint32_t)rnd64();
	default: return ch->nrq ? ch->rq[rnd(ch->nrq)].handle : 3;
	}
}

static void child_setup(struct child *ch, int i)
{
	struct ibv_qp_init_attr a = { 0 };

	ch->ctx[i] = open_device_db(the_dev, &ch->db[i]);
	if (!ch->ctx[i])
		return;
	ch->pd[i] = ibv_alloc_pd(ch->ctx[i]);
	ch->cq[i] = ibv_create_cq(ch->ctx[i], 1 + rnd(64), NULL, NULL, 0);
	if (!ch->pd[i] || !ch->cq[i])
		return;
	a.send_cq = a.recv_cq = ch->cq[i];
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 1 + rnd(32);
	a.cap.max_recv_wr = 1 + rnd(32);
	a.cap.max_send_sge = a.cap.max_recv_sge = 1 + rnd(6);
	ch->qp[i] = ibv_create_qp(ch->pd[i], &a);
	if (i == 0) {
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 2 } };

		ch->srq = ibv_create_srq(ch->pd[0], &sa);
	}
}

/* Random command, random handles, random lengths. */
static void child_raw_cmd(struct child *ch)
{
	uint32_t body[256];
	size_t len = chance(70) ? 8 + 4 * rnd(40) : 4 * rnd(256);
	uint32_t cmd = chance(90) ? rnd(IB_USER_VERBS_CMD_OPEN_QP + 1) : (uint32_t)rnd64();
	int rc, fd;

	if (cmd == IB_USER_VERBS_CMD_GET_CONTEXT && chance(90))
		cmd = IB_USER_VERBS_CMD_QUERY_PORT;
	for (size_t i = 0; i < 256; i++)
		body[i] = chance(50) ? some_handle(ch) : PICK(0, 1, 16, 4096, UINT32_MAX, (uint32_t)rnd64());
	if (len >= 8 && cmd != IB_USER_VERBS_CMD_DEALLOC_PD && cmd != IB_USER_VERBS_CMD_DEREG_MR &&
	    cmd != IB_USER_VERBS_CMD_MODIFY_QP) {
		uint64_t r = resp_ptr();

		memcpy(body, &r, 8);
	}
	/* Destroying commands go to the second context: the first one's
	 * objects must stay what the other operations believe them to be. */
	switch (cmd) {
	case IB_USER_VERBS_CMD_DEALLOC_PD: case IB_USER_VERBS_CMD_DEREG_MR:
	case IB_USER_VERBS_CMD_DESTROY_CQ: case IB_USER_VERBS_CMD_DESTROY_QP:
	case IB_USER_VERBS_CMD_DESTROY_SRQ: case IB_USER_VERBS_CMD_DESTROY_AH:
	case IB_USER_VERBS_CMD_DEALLOC_MW: case IB_USER_VERBS_CMD_CLOSE_XRCD:
		fd = ch->ctx[1] ? ch->ctx[1]->cmd_fd : -1;
		break;
	default:
		fd = ch->ctx[0]->cmd_fd;
	}
	if (fd < 0)
		return;
	rc = raw(fd, cmd, body, len, chance(90) ? -1 : (int)rnd(65536),
		 chance(80) ? 4 * rnd(64) : 4 * rnd(65536));
	rec(K_RAW_CMD, rc);
}

static int raw_create_cq(struct child *ch, uint32_t cqe, size_t out, uint32_t *handle,
			 struct siw_rs_uresp_create_cq *drv, size_t drv_in)
{
	struct {
		struct ib_uverbs_create_cq c;
		uint8_t drv[64];
	} b;
	struct {
		struct ib_uverbs_create_cq_resp r;
		struct siw_rs_uresp_create_cq d;
		uint8_t pad[64];
	} *resp = (void *)scratch;
	int rc;

	memset(&b, 0, sizeof(b));
	memset(resp, 0, sizeof(*resp));
	for (size_t i = 0; i < sizeof(b.drv); i++)
		b.drv[i] = rnd64();
	b.c.response = (uintptr_t)resp;
	b.c.cqe = cqe;
	b.c.comp_channel = -1;
	rc = raw(ch->ctx[0]->cmd_fd, IB_USER_VERBS_CMD_CREATE_CQ, &b, sizeof(b.c) + drv_in, -1, out);
	if (rc == 0) {
		*handle = resp->r.cq_handle;
		if (drv)
			*drv = resp->d;
	}
	return rc;
}

static int raw_destroy_cq(struct child *ch, uint32_t handle)
{
	struct ib_uverbs_destroy_cq b = { .response = (uintptr_t)scratch, .cq_handle = handle };

	return raw(ch->ctx[0]->cmd_fd, IB_USER_VERBS_CMD_DESTROY_CQ, &b, sizeof(b), -1,
		   sizeof(struct ib_uverbs_destroy_cq_resp));
}

static int raw_create_qp(struct child *ch, const struct ib_uverbs_create_qp *in, size_t drv_in,
			 size_t out, struct rawq *q)
{
	struct {
		struct ib_uverbs_create_qp c;
		uint8_t drv[64];
	} b;
	struct {
		struct ib_uverbs_create_qp_resp r;
		struct siw_rs_uresp_create_qp d;
		uint8_t pad[64];
	} *resp = (void *)scratch;
	int rc;

	b.c = *in;
	for (size_t i = 0; i < sizeof(b.drv); i++)
		b.drv[i] = rnd64();
	b.c.response = (uintptr_t)resp;
	memset(resp, 0, sizeof(*resp));
	rc = raw(ch->ctx[0]->cmd_fd, IB_USER_VERBS_CMD_CREATE_QP, &b, sizeof(b.c) + drv_in, -1, out);
	if (rc == 0 && q) {
		q->handle = resp->r.qp_handle;
		q->drv = resp->d;
		q->sq = q->rq = NULL;
	}
	return rc;
}

static int raw_destroy_qp(struct child *ch, uint32_t handle)
{
	struct ib_uverbs_destroy_qp b = { .response = (uintptr_t)scratch, .qp_handle = handle };

	return raw(ch->ctx[0]->cmd_fd, IB_USER_VERBS_CMD_DESTROY_QP, &b, sizeof(b), -1,
		   sizeof(struct ib_uverbs_destroy_qp_resp));
}

static int raw_modify_state(struct child *ch, uint32_t handle, int state)
{
	struct ib_uverbs_modify_qp b;

	memset(&b, 0, sizeof(b));
	b.qp_handle = handle;
	b.attr_mask = IBV_QP_STATE;
	b.qp_state = state;
	return raw(ch->ctx[0]->cmd_fd, IB_USER_VERBS_CMD_MODIFY_QP, &b, sizeof(b), -1, 0);
}

/* The doorbells: POST_SEND / POST_RECV without work requests. */
static int raw_doorbell(struct child *ch, uint32_t handle, int recv)
{
	struct ib_uverbs_post_send b = {
		.response = (uintptr_t)scratch, .qp_handle = handle,
		.wqe_size = recv ? sizeof(struct ib_uverbs_recv_wr) : sizeof(struct ib_uverbs_send_wr),
	};

	return raw(ch->ctx[0]->cmd_fd, recv ? IB_USER_VERBS_CMD_POST_RECV : IB_USER_VERBS_CMD_POST_SEND,
		   &b, sizeof(b), -1, sizeof(struct ib_uverbs_post_send_resp));
}

/* A doorbell through context 0's doorbell file (when it has one). */
static int file_doorbell(struct child *ch, uint32_t qpn, int recv)
{
	if (ch->db[0] < 0)
		return EBADF;
	return ioctl(ch->db[0], recv ? SIW_RS_IOCTL_RQ_DOORBELL : SIW_RS_IOCTL_SQ_DOORBELL,
		     (unsigned long)qpn) == 0 ? 0 : errno;
}

/* The doorbell files: requests and QP numbers, good and bad. A file rings
 * its own context's live QPs (0) and nothing else (EINVAL), and knows two
 * requests (ENOTTY for any other). */
static void child_doorbell_file(struct child *ch)
{
	int recv = rnd(2);
	unsigned int req = recv ? SIW_RS_IOCTL_RQ_DOORBELL : SIW_RS_IOCTL_SQ_DOORBELL;

	if (ch->db[0] < 0) {
		finding(K_DOORBELL_FILE, "context 0 has no doorbell file");
		return;
	}
	switch (rnd(6)) {
	case 0:
		if (ch->qp[0])
			check(K_DOORBELL_FILE, file_doorbell(ch, ch->qp[0]->qp_num, recv), WANT_OK,
			      "doorbell of the context's own QP");
		break;
	case 1:
		if (ch->nrq) {
			struct rawq *q = &ch->rq[rnd(ch->nrq)];

			check(K_DOORBELL_FILE, file_doorbell(ch, q->drv.qp_id, recv), WANT_OK,
			      "doorbell of a QP made by a raw command");
		}
		break;
	case 2:
		/* The other context's file, and this context's QP. */
		if (ch->qp[0] && ch->db[1] >= 0)
			check(K_DOORBELL_FILE,
			      ioctl(ch->db[1], req, (unsigned long)ch->qp[0]->qp_num) == 0 ? 0 : errno, EINVAL,
			      "doorbell of another context's QP");
		break;
	case 3: {
		/* A request it does not know. */
		unsigned int bad = PICK(_IO(SIW_RS_IOCTL_TYPE, 0x82), _IO(SIW_RS_IOCTL_TYPE, 0x7f),
					_IOW(SIW_RS_IOCTL_TYPE, 0x80, int), 0x5401 /* TCGETS */,
					(unsigned int)rnd64());

		if (bad != SIW_RS_IOCTL_SQ_DOORBELL && bad != SIW_RS_IOCTL_RQ_DOORBELL)
			check(K_DOORBELL_FILE, ioctl(ch->db[0], bad, rnd64()) == 0 ? 0 : errno, ENOTTY,
			      "unknown doorbell-file request");
		break;
	}
	case 4:
		/* A number above 32 bits: never a QP. */
		check(K_DOORBELL_FILE, ioctl(ch->db[0], req, (unsigned long)(rnd64() | (1ull << 32))) == 0 ? 0 : errno,
		      EINVAL, "doorbell of a QP number above 32 bits");
		break;
	default:
		/* Any number: most are no QP, a few may be the context's own. */
		rec(K_DOORBELL_FILE, ioctl(ch->db[0], req, (unsigned long)PICK(0, 1, 2, rnd(64), (uint32_t)rnd64())) == 0
					     ? 0 : errno);
	}
}

/* Creates CQs and QPs by raw commands with random driver data in and
 * response lengths that may be too short for siw_rs's response: a failed
 * create must leave nothing behind (the runner's kmemleak and `rdma res`
 * checks), a successful one must be destroyable. */
static void child_raw_create(struct child *ch)
{
	size_t core = sizeof(struct ib_uverbs_create_qp_resp);
	size_t drv_in = 8 * rnd(9);
	uint32_t h;
	int rc, want;

	if (chance(50)) {
		size_t core_cq = sizeof(struct ib_uverbs_create_cq_resp);
		size_t out = PICK(0, core_cq, core_cq + 8, core_cq + sizeof(struct siw_rs_uresp_create_cq),
				  core_cq + sizeof(struct siw_rs_uresp_create_cq) + 8);
		uint32_t cqe = PICK(1, 64, 0, 65537);

		want = out < core_cq + sizeof(struct siw_rs_uresp_create_cq) || cqe == 0 || cqe > 65536
			       ? WANT_FAIL : WANT_OK;
		rc = raw_create_cq(ch, cqe, out, &h, NULL, drv_in);
		check(K_RAW_CREATE, rc, want, "raw create_cq");
		if (rc == 0)
			check(K_RAW_CREATE, raw_destroy_cq(ch, h), WANT_OK, "raw destroy_cq");
		return;
	}
	if (!ch->pd[0] || !ch->cq[0] || ch->nrq >= 4)
		return;
	struct ib_uverbs_create_qp in = {
		.pd_handle = ch->pd[0]->handle, .send_cq_handle = ch->cq[0]->handle,
		.recv_cq_handle = ch->cq[0]->handle, .max_send_wr = 1 + rnd(64),
		.max_recv_wr = 1 + rnd(64), .max_send_sge = rnd(7), .max_recv_sge = rnd(7),
		.max_inline_data = rnd(257), .qp_type = IBV_QPT_RC,
	};
	size_t out = PICK(0, core, core + 8, core + sizeof(struct siw_rs_uresp_create_qp),
			  core + sizeof(struct siw_rs_uresp_create_qp) + 16);
	struct rawq *q = &ch->rq[ch->nrq];

	want = out < core + sizeof(struct siw_rs_uresp_create_qp) ? WANT_FAIL : WANT_OK;
	if (chance(20) && ch->srq) {
		in.is_srq = 1;
		in.srq_handle = ch->srq->handle;
		in.max_recv_wr = 0;
	}
	rc = raw_create_qp(ch, &in, drv_in, out, q);
	check(K_RAW_CREATE, rc, want, "raw create_qp");
	if (rc == 0)
		ch->nrq++;
}

/* Handles used after their object was destroyed fail (nothing else is
 * created meanwhile, so the handle cannot have been reused). */
static void child_raw_stale(struct child *ch)
{
	uint32_t h;
	int rc;

	if (raw_create_cq(ch, 8, sizeof(struct ib_uverbs_create_cq_resp) + sizeof(struct siw_rs_uresp_create_cq),
			  &h, NULL, 0))
		return;
	if (raw_destroy_cq(ch, h))
		return;
	switch (rnd(3)) {
	case 0:
		rc = raw_destroy_cq(ch, h);
		break;
	case 1: {
		struct ib_uverbs_req_notify_cq b = { .cq_handle = h };

		rc = raw(ch->ctx[0]->cmd_fd, IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, &b, sizeof(b), -1, 0);
		break;
	}
	default: {
		struct ib_uverbs_poll_cq b = { .response = (uintptr_t)scratch, .cq_handle = h, .ne = 4 };

		rc = raw(ch->ctx[0]->cmd_fd, IB_USER_VERBS_CMD_POLL_CQ, &b, sizeof(b), -1, 4096);
	}
	}
	check(K_RAW_STALE, rc, WANT_FAIL, "command on a destroyed CQ's handle");
	/* A QP's too. */
	if (ch->nrq > 0 && chance(30)) {
		struct rawq q = ch->rq[--ch->nrq];

		if (q.sq)
			munmap(q.sq, q.drv.sq_bytes);
		if (q.rq)
			munmap(q.rq, q.drv.rq_bytes);
		check(K_RAW_STALE, raw_destroy_qp(ch, q.handle), WANT_OK, "raw destroy_qp");
		check(K_RAW_STALE, raw_modify_state(ch, q.handle, IBV_QPS_ERR), WANT_FAIL,
		      "modify of a destroyed QP");
		check(K_RAW_STALE, raw_doorbell(ch, q.handle, rnd(2)), WANT_FAIL,
		      "doorbell of a destroyed QP");
	}
}

/* Destroying objects in the wrong order: in use means EBUSY. */
static void child_raw_busy(struct child *ch)
{
	if (!ch->qp[0])
		return;
	if (chance(50)) {
		check(K_RAW_BUSY, raw_destroy_cq(ch, ch->cq[0]->handle), EBUSY, "destroy of a CQ in use");
	} else {
		struct ib_uverbs_dealloc_pd b = { .pd_handle = ch->pd[0]->handle };

		check(K_RAW_BUSY, raw(ch->ctx[0]->cmd_fd, IB_USER_VERBS_CMD_DEALLOC_PD, &b, sizeof(b), -1, 0),
		      EBUSY, "dealloc of a PD in use");
	}
}

/* POST_SEND/POST_RECV with work requests: a process's QP posts through
 * its rings, so the kernel refuses them whatever they hold. */
static void child_raw_post(struct child *ch)
{
	struct {
		struct ib_uverbs_post_send c;
		uint8_t wrs[1024];
	} b;
	int recv = rnd(2), rc;
	uint32_t h = ch->qp[0] && chance(80) ? ch->qp[0]->handle : some_handle(ch);

	memset(&b, 0, sizeof(b));
	for (size_t i = 0; i < sizeof(b.wrs); i++)
		b.wrs[i] = chance(50) ? 0 : rnd64();
	size_t len;

	b.c.response = resp_ptr();
	b.c.qp_handle = h;
	if (chance(50)) {
		/* Well-formed: one WR, its SGEs behind it, as the kernel
		 * parses them; only the driver can refuse it. */
		size_t wsz = recv ? sizeof(struct ib_uverbs_recv_wr) : sizeof(struct ib_uverbs_send_wr);
		struct ib_uverbs_sge *sg;
		uint32_t nsge = rnd(4);

		b.c.wr_count = 1;
		b.c.wqe_size = wsz;
		b.c.sge_count = nsge;
		memset(b.wrs, 0, sizeof(b.wrs));
		if (recv) {
			((struct ib_uverbs_recv_wr *)b.wrs)->num_sge = nsge;
		} else {
			struct ib_uverbs_send_wr *w = (void *)b.wrs;

			w->num_sge = nsge;
			w->opcode = rnd(12);
			w->send_flags = rnd(16);
		}
		sg = (void *)(b.wrs + wsz);
		for (uint32_t i = 0; i < nsge; i++)
			sg[i] = (struct ib_uverbs_sge){ rnd64(), rnd(65536), rnd64() };
		len = sizeof(b.c) + wsz + nsge * sizeof(*sg);
	} else {
		b.c.wr_count = PICK(1, 2, 4, 1000, UINT32_MAX);
		b.c.sge_count = PICK(0, 1, 6, 7, UINT32_MAX);
		b.c.wqe_size = PICK(sizeof(struct ib_uverbs_send_wr), sizeof(struct ib_uverbs_recv_wr), 0, 4,
				    UINT32_MAX, 1024);
		len = sizeof(b.c) + 8 * rnd(129);
	}
	rc = raw(ch->ctx[0]->cmd_fd, recv ? IB_USER_VERBS_CMD_POST_RECV : IB_USER_VERBS_CMD_POST_SEND,
		 &b, len, -1, sizeof(struct ib_uverbs_post_send_resp));
	check(K_RAW_POST, rc, WANT_FAIL, recv ? "raw post_recv with WRs" : "raw post_send with WRs");
}

/* Objects of one context named in the other. */
static void child_cross(struct child *ch)
{
	struct ibv_qp_init_attr a = { 0 };
	struct ibv_qp *qp;
	struct ibv_mr *mr;

	if (!ch->pd[0] || !ch->pd[1] || !ch->cq[0] || !ch->cq[1])
		return;
	a.send_cq = ch->cq[1];
	a.recv_cq = ch->cq[rnd(2)];
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	/* Handles are per file: the kernel looks the other context's handles
	 * up among this one's objects, so a success is not a finding. */
	qp = ibv_create_qp(ch->pd[0], &a);
	rec(K_CROSS_CTX, qp ? 0 : errno);
	if (qp)
		rec(K_CROSS_CTX, ibv_destroy_qp(qp));
	mr = ibv_reg_mr(ch->pd[1], arena, 4096, IBV_ACCESS_LOCAL_WRITE);
	rec(K_CROSS_CTX, mr ? 0 : errno);
	if (mr && ch->qp[0]) {
		struct ibv_sge sge = { (uintptr_t)arena, 64, mr->lkey };
		struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;

		/* An lkey of another context's PD on this QP: posted (the
		 * QP is not connected), fails only this QP if ever sent. */
		rec(K_CROSS_CTX, ibv_post_send(ch->qp[0], &wr, &bad));
	}
	if (mr)
		rec(K_CROSS_CTX, ibv_dereg_mr(mr));
}

/* mmap of a raw QP's rings by their keys, with right and wrong lengths. */
static void child_ring_mmap(struct child *ch)
{
	struct rawq *q;
	size_t len;
	int prot, rc;
	void *p;

	if (!ch->nrq)
		return;
	q = &ch->rq[rnd(ch->nrq)];
	if (!q->drv.sq_bytes)
		return;
	len = (q->drv.sq_bytes + page - 1) & ~(size_t)(page - 1);
	if (chance(40)) {
		/* Wrong length or offset: refused. */
		size_t l = PICK(len + page, len * 2, 64u << 20);
		off_t off = q->drv.sq_key + PICK(page, (int64_t)len);

		int at_key = chance(50);

		/* Past the key, the offset may name another ring whose size
		 * happens to be `l`: only the ring's own key is certain to
		 * be refused. */
		p = mmap(NULL, l, PROT_READ | PROT_WRITE, MAP_SHARED, ch->ctx[0]->cmd_fd,
			 at_key ? (off_t)q->drv.sq_key : off);
		rc = p == MAP_FAILED ? errno : 0;
		check(K_RING_MMAP, rc, at_key ? EINVAL : WANT_ANY, "mmap of a ring, wrong length or offset");
		if (p != MAP_FAILED && at_key)
			finding(K_RING_MMAP, "mmap of a %zu-octet ring with length %zu succeeded", len, l);
		if (p != MAP_FAILED)
			munmap(p, l);
		return;
	}
	prot = chance(80) ? PROT_READ | PROT_WRITE : PICK(PROT_READ, PROT_WRITE | PROT_EXEC, PROT_NONE);
	p = mmap(NULL, len, prot, chance(90) ? MAP_SHARED : MAP_PRIVATE, ch->ctx[0]->cmd_fd,
		 (off_t)q->drv.sq_key);
	rc = p == MAP_FAILED ? errno : 0;
	check(K_RING_MMAP, rc, prot == (PROT_READ | PROT_WRITE) ? WANT_ANY : WANT_ANY, "mmap of a ring");
	if (p == MAP_FAILED)
		return;
	if (prot == (PROT_READ | PROT_WRITE) && !q->sq)
		q->sq = p;
	else
		munmap(p, len);
	if (q->drv.rq_bytes && !q->rq) {
		size_t rl = (q->drv.rq_bytes + page - 1) & ~(size_t)(page - 1);

		p = mmap(NULL, rl, PROT_READ | PROT_WRITE, MAP_SHARED, ch->ctx[0]->cmd_fd,
			 (off_t)q->drv.rq_key);
		check(K_RING_MMAP, p == MAP_FAILED ? errno : 0, WANT_OK, "mmap of an RQ ring");
		if (p != MAP_FAILED)
			q->rq = p;
	}
}

/* A plausible-but-wrong send queue entry (or plain garbage). */
static void bad_sqe(struct siw_rs_sqe *e)
{
	if (chance(30)) {
		for (size_t i = 0; i < sizeof(*e); i++)
			((uint8_t *)e)[i] = rnd64();
		return;
	}
	memset(e, 0, sizeof(*e));
	e->wr_id = rnd64();
	e->opcode = chance(50) ? rnd(9) : PICK(9, 10, 0x55, 255);
	e->flags = rnd(256);
	e->num_sge = chance(50) ? rnd(7) : PICK(7, 16, 255);
	e->inline_len = PICK(0, 1, 256, 257, 4096, UINT32_MAX);
	e->remote_addr = rnd64();
	e->rkey = rnd64();
	e->imm_or_inv = rnd64();
	for (int i = 0; i < SIW_RS_MAX_SGE; i++) {
		e->sge[i].addr = chance(50) ? (uintptr_t)arena : rnd64();
		e->sge[i].length = PICK(0, 1, 4096, UINT32_MAX, 0x80000000u);
		e->sge[i].lkey = rnd64();
	}
}

static void bad_rqe(struct siw_rs_rqe *e)
{
	memset(e, 0, sizeof(*e));
	e->wr_id = rnd64();
	e->num_sge = chance(50) ? rnd(7) : PICK(7, 255);
	for (int i = 0; i < SIW_RS_MAX_SGE; i++) {
		e->sge[i].addr = rnd64();
		e->sge[i].length = PICK(0, 1, UINT32_MAX);
		e->sge[i].lkey = rnd64();
	}
}

/* Garbage in the rings, a random producer index, the doorbells, in the
 * QP's current state and in ERROR (the flush path reads the entries). */
static void child_ring_garbage(struct child *ch)
{
	struct siw_rs_ring_ctrl *ctrl;
	struct rawq *q;
	uint32_t n, cons;

	if (!ch->nrq)
		return;
	q = &ch->rq[rnd(ch->nrq)];
	if (!q->sq || !q->drv.num_sqe)
		return;
	ctrl = q->sq;
	n = q->drv.num_sqe;
	cons = __atomic_load_n(&ctrl->cons, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < 1 + rnd(4); i++)
		bad_sqe((struct siw_rs_sqe *)((char *)q->sq + SIW_RS_RING_ENTRIES_OFFSET) +
			((cons + i) & (n - 1)));
	__atomic_store_n(&ctrl->prod, chance(80) ? cons + 1 + rnd(4) : (uint32_t)rnd64(), __ATOMIC_RELEASE);
	if (chance(20))
		ctrl->kflags = rnd64(); /* the kernel's word: it must not trust it */
	if (q->rq && q->drv.num_rqe) {
		struct siw_rs_ring_ctrl *rc = q->rq;
		uint32_t rn = q->drv.num_rqe, rcons = __atomic_load_n(&rc->cons, __ATOMIC_ACQUIRE);

		for (uint32_t i = 0; i < 1 + rnd(4); i++)
			bad_rqe((struct siw_rs_rqe *)((char *)q->rq + SIW_RS_RING_ENTRIES_OFFSET) +
				((rcons + i) & (rn - 1)));
		__atomic_store_n(&rc->prod, chance(80) ? rcons + 1 + rnd(4) : (uint32_t)rnd64(),
				 __ATOMIC_RELEASE);
	}
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	/* The doorbells through the uverbs command or the doorbell file. */
	int file = chance(50);
#define RING(recv) (file ? file_doorbell(ch, q->drv.qp_id, recv) : raw_doorbell(ch, q->handle, recv))
	check(K_RING_GARBAGE, RING(0), WANT_OK, "send doorbell");
	if (chance(50)) {
		check(K_RING_GARBAGE, raw_modify_state(ch, q->handle, IBV_QPS_ERR), WANT_OK,
		      "modify to ERROR");
		check(K_RING_GARBAGE, RING(0), WANT_OK, "send doorbell in ERROR");
		check(K_RING_GARBAGE, RING(1), WANT_OK, "receive doorbell in ERROR");
#undef RING
		if (chance(30))
			check(K_RING_GARBAGE, raw_modify_state(ch, q->handle, IBV_QPS_RESET), WANT_OK,
			      "ERROR -> RESET");
	}
	/* Drain the CQ the kernel wrote to (the provider's ring). */
	if (ch->cq[0]) {
		struct ibv_wc wc[16];

		while (ibv_poll_cq(ch->cq[0], 16, wc) > 0)
			;
	}
}

/* Closes context 0 with everything in it and opens it again. */
static void child_close(struct child *ch)
{
	for (int i = 0; i < ch->nrq; i++) {
		if (ch->rq[i].sq)
			munmap(ch->rq[i].sq, ch->rq[i].drv.sq_bytes);
		if (ch->rq[i].rq)
			munmap(ch->rq[i].rq, ch->rq[i].drv.rq_bytes);
	}
	ch->nrq = 0;
	/* Objects still alive: the kernel releases them with the file. The
	 * library's own memory for them is leaked, in a short-lived child. */
	rec(K_CLOSE_CTX, ibv_close_device(ch->ctx[0]));
	ch->ctx[0] = NULL;
	ch->pd[0] = NULL;
	ch->cq[0] = NULL;
	ch->qp[0] = NULL;
	ch->srq = NULL;
	child_setup(ch, 0);
}

static void child_main(double secs)
{
	struct child ch;
	double end = now() + secs;

	memset(&ch, 0, sizeof(ch));
	in_child = 1;
	child_setup(&ch, 0);
	child_setup(&ch, 1);
	while (now() < end) {
		if (!ch.ctx[0]) {
			child_setup(&ch, 0);
			if (!ch.ctx[0]) {
				rec(K_CHILD, errno ? errno : EIO);
				usleep(10000);
				continue;
			}
		}
		switch (rnd(20)) {
		case 0: case 1: case 2: case 3: child_raw_cmd(&ch); break;
		case 4: case 5: child_raw_create(&ch); break;
		case 6: child_raw_stale(&ch); break;
		case 7: child_raw_busy(&ch); break;
		case 8: case 9: child_raw_post(&ch); break;
		case 10: child_cross(&ch); break;
		case 11: case 12: case 13: child_ring_mmap(&ch); break;
		case 14: case 15: case 16: case 17: child_ring_garbage(&ch); break;
		case 18: if (chance(10)) child_close(&ch); break;
		case 19: if (chance(50)) child_doorbell_file(&ch); else usleep(rnd(2000)); break;
		default: usleep(rnd(2000));
		}
	}
	/* Exit without cleaning up: the kernel releases what is left. */
	_exit(0);
}

/* ---------------------------------------------------------------------- */

static void cleanup(struct cx *c)
{
	int i;

	for (i = 0; i < MAXO; i++)
		if (c->qp[i].qp)
			check(K_DESTROY_QP, ibv_destroy_qp(c->qp[i].qp), WANT_OK, "final destroy_qp");
	for (i = 0; i < MAXSRQ; i++)
		if (c->srq[i].srq)
			check(K_DESTROY_SRQ, ibv_destroy_srq(c->srq[i].srq), WANT_OK, "final destroy_srq");
	for (i = 0; i < MAXO; i++)
		if (c->mr[i].mr)
			check(K_DEREG_MR, ibv_dereg_mr(c->mr[i].mr), WANT_OK, "final dereg_mr");
	for (i = 0; i < MAXO; i++)
		if (c->cq[i].cq)
			check(K_DESTROY_CQ, ibv_destroy_cq(c->cq[i].cq), WANT_OK, "final destroy_cq");
	for (i = 0; i < MAXO; i++)
		if (c->pd[i].pd)
			check(K_DEALLOC_PD, ibv_dealloc_pd(c->pd[i].pd), WANT_OK, "final dealloc_pd");
	check(K_QUERY, ibv_close_device(c->ctx) ? EIO : 0, WANT_OK, "close_device");
}

static const char *errname(int e)
{
	static char buf[16];

	switch (e) {
	case EPERM: return "EPERM";
	case ENOENT: return "ENOENT";
	case EIO: return "EIO";
	case EBADF: return "EBADF";
	case ENOMEM: return "ENOMEM";
	case EACCES: return "EACCES";
	case EFAULT: return "EFAULT";
	case EBUSY: return "EBUSY";
	case EEXIST: return "EEXIST";
	case ENODEV: return "ENODEV";
	case EINVAL: return "EINVAL";
	case ENOSPC: return "ENOSPC";
	case ENOSYS: return "ENOSYS";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case EPROTO: return "EPROTO";
	case ENOTCONN: return "ENOTCONN";
	case EOVERFLOW: return "EOVERFLOW";
	case ENXIO: return "ENXIO";
	case E2BIG: return "E2BIG";
	case ENOTTY: return "ENOTTY";
	case MAX_ERRNO: return "other";
	}
	snprintf(buf, sizeof(buf), "E%d", e);
	return buf;
}

static void usage(void)
{
	fprintf(stderr, "usage: uverbs-fuzz [--seed N] [--secs N] [--dev NAME] [--no-fork]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *devname = NULL;
	double secs = 60, end, next_child = 0, child_deadline = 0;
	int use_fork = 1, n, i, bad = 0;
	struct ibv_device **list;
	struct rlimit rl;
	pid_t child = 0;
	long iters = 0, children = 0, killed = 0;

	seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--secs") && i + 1 < argc)
			secs = atof(argv[++i]);
		else if (!strcmp(argv[i], "--dev") && i + 1 < argc)
			devname = argv[++i];
		else if (!strcmp(argv[i], "--no-fork"))
			use_fork = 0;
		else
			usage();
	}
	rng_state = seed ? seed : 1;
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("uverbs-fuzz: seed %" PRIu64 ", %.0f s, uid %d\n", seed, secs, (int)getuid());

	page = sysconf(_SC_PAGESIZE);
	stats = mmap(NULL, sizeof(*stats) * N_KINDS, PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	arena = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ro_page = mmap(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	none_area = mmap(NULL, 1u << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	scratch = mmap(NULL, SCRATCH, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (stats == MAP_FAILED || arena == MAP_FAILED || ro_page == MAP_FAILED ||
	    none_area == MAP_FAILED || scratch == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(arena, 0x5a, 1u << 20);
	/* Registrations beyond the limit must fail with ENOMEM. */
	getrlimit(RLIMIT_MEMLOCK, &rl);
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > MEMLOCK) {
		rl.rlim_cur = rl.rlim_max = MEMLOCK;
		if (setrlimit(RLIMIT_MEMLOCK, &rl))
			perror("setrlimit");
	}
	getrlimit(RLIMIT_MEMLOCK, &rl);
	printf("uverbs-fuzz: RLIMIT_MEMLOCK %llu\n", (unsigned long long)rl.rlim_cur);
	if (rl.rlim_cur != MEMLOCK) {
		fprintf(stderr, "uverbs-fuzz: RLIMIT_MEMLOCK must be at least %u\n", MEMLOCK);
		return 1;
	}

	list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		fprintf(stderr, "uverbs-fuzz: no RDMA devices\n");
		return 1;
	}
	for (i = 0; i < n && !the_dev; i++)
		if (!devname || !strcmp(ibv_get_device_name(list[i]), devname))
			the_dev = list[i];
	if (!the_dev) {
		fprintf(stderr, "uverbs-fuzz: no device %s\n", devname);
		return 1;
	}
	for (i = 0; i < NCTX; i++) {
		cxs[i].ctx = ibv_open_device(the_dev);
		if (!cxs[i].ctx || ibv_query_device(cxs[i].ctx, &cxs[i].da)) {
			fprintf(stderr, "uverbs-fuzz: open %s: %s\n", ibv_get_device_name(the_dev),
				strerror(errno));
			return 1;
		}
	}
	printf("uverbs-fuzz: device %s: max_qp_wr %d max_sge %d max_cqe %d max_srq_wr %d comp_vectors %d\n",
	       ibv_get_device_name(the_dev), cxs[0].da.max_qp_wr, cxs[0].da.max_sge, cxs[0].da.max_cqe,
	       cxs[0].da.max_srq_wr, cxs[0].ctx->num_comp_vectors);

	end = now() + secs;
	while (now() < end) {
		struct cx *c = &cxs[rnd(NCTX)];
		double t = now();

		if (use_fork) {
			int st;

			if (child && waitpid(child, &st, WNOHANG) == child) {
				check(K_CHILD, WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : ECHILD, WANT_OK,
				      "child exit");
				child = 0;
			}
			if (child && t > child_deadline) {
				kill(child, SIGKILL);
				waitpid(child, &st, 0);
				killed++;
				child = 0;
			}
			if (!child && t > next_child && t + 1 < end) {
				double life = 0.2 + rnd(3000) / 1000.0;
				uint64_t cseed = rnd64();

				fflush(stdout);
				child = fork();
				if (child == 0) {
					rng_state = cseed ? cseed : 1;
					seed = cseed;
					child_main(life + 1);
				}
				children++;
				/* Killed before its own end, mostly. */
				child_deadline = t + life * (chance(70) ? 0.5 + rnd(50) / 100.0 : 2);
				next_child = t + rnd(1000) / 1000.0;
			}
		}
		iters++;
		switch (rnd(32)) {
		case 0: op_alloc_pd(c); break;
		case 1: op_dealloc_pd(c); break;
		case 2: case 3: op_create_cq(c); break;
		case 4: op_destroy_cq(c); break;
		case 5: op_resize_cq(c); break;
		case 6: op_poll_cq(c); break;
		case 7: op_create_srq(c); break;
		case 8: op_modify_srq(c); break;
		case 9: op_destroy_srq(c); break;
		case 10: case 11: case 12: op_create_qp(c); break;
		case 13: case 14: case 15: op_modify_qp(c); break;
		case 16: op_destroy_qp(c); break;
		case 17: op_query(c); break;
		case 18: case 19: case 20: op_reg_mr(c); break;
		case 21: op_rereg_mr(c); break;
		case 22: op_dereg_mr(c); break;
		case 23: case 24: case 25: op_post_send(c); break;
		case 26: case 27: op_post_recv(c); break;
		case 28: op_post_srq(c); break;
		default: op_mmap(c); break;
		}
	}
	if (child) {
		int st;

		kill(child, SIGKILL);
		waitpid(child, &st, 0);
		killed++;
	}
	for (i = 0; i < NCTX; i++)
		cleanup(&cxs[i]);
	ibv_free_device_list(list);

	long total = 0, mism = 0, find = 0, notes = 0;

	for (int k = 0; k < N_KINDS; k++) {
		struct kstat *s = &stats[k];
		char hist[512] = "";
		size_t o = 0;

		total += s->calls;
		mism += s->mismatch;
		find += s->finding;
		notes += s->note;
		for (int e = 1; e <= MAX_ERRNO; e++)
			if (s->err[e] && o < sizeof(hist) - 32)
				o += snprintf(hist + o, sizeof(hist) - o, " %s:%ld", errname(e), s->err[e]);
		printf("uverbs-fuzz: %-17s calls %7ld ok %7ld mismatches %ld findings %ld notes %ld errno%s\n",
		       kind_name[k], s->calls, s->ok, s->mismatch, s->finding, s->note, o ? hist : " -");
	}
	printf("uverbs-fuzz: seed %" PRIu64 ": %ld calls in %.0f s (%.0f/s), %ld parent iterations, "
	       "%ld children (%ld SIGKILLed), %ld notes, %ld mismatches, %ld findings\n",
	       seed, total, secs, total / secs, iters, children, killed, notes, mism, find);
	bad = mism || find;
	return bad;
}
