// SPDX-License-Identifier: GPL-2.0
/*
 * access: remote access violations through the verbs API, each refused
 * with the RFC 5040/5041 error on both ends and nothing placed. For the
 * siw_rs VM tests (issue #6).
 *
 *   access server ADDR PORT
 *   access client ADDR PORT
 *
 * An access violation ends the connection (TERMINATE, both QPs to ERROR),
 * so every case has a connection of its own: N_CASES connections with a
 * violation each, then a last one with legal operations only. On each
 * connection the server registers a "good" region (local write, remote
 * write and read) and the case's target region, and sends their keys. The
 * client first Writes a pattern into the good region and Reads it back,
 * checked byte for byte (on the connections after the first, this is the
 * fresh connection after the previous violation), then commits the case's
 * violation, the client being the requester:
 *
 *   1  RDMA Write to a region without REMOTE_WRITE (LOCAL_WRITE|REMOTE_READ)
 *   2  RDMA Read from a region without REMOTE_READ
 *   3  Atomic Fetch-and-Add (8-octet aligned) without REMOTE_ATOMIC
 *   4  RDMA Write with a wrong rkey (key byte and index bits flipped)
 *   5  RDMA Write to a valid region of another protection domain
 *   6  RDMA Write starting inside the region, ending 1 octet past its end
 *   7  RDMA Read starting inside the region, ending 1 octet past its end
 *   8  RDMA Write after the server deregistered the advertised region
 *
 * Remote invalidation (Send with Invalidate naming the server's rkey) is
 * not a case: siw_rs offers no memory windows, and userspace can only
 * register plain MRs (ibv_reg_mr), which are not invalidatable; fast
 * registration (IB_WR_REG_MR) exists only for kernel consumers.
 *
 * The client checks its completions: a refused Read or Atomic completes
 * with IBV_WC_REM_ACCESS_ERR and its sink keeps its initial pattern. An
 * RDMA Write is not acknowledged in iWARP (RFC 5040): its completion means
 * only that it was sent, so it completes successfully; the refusal reaches
 * the requester as the responder's TERMINATE, which fails the oldest
 * request still awaiting a response. Each violating Write is therefore
 * posted together with a legal RDMA Read of the good region, which must
 * complete with IBV_WC_REM_ACCESS_ERR, its sink untouched (the responder
 * stops at the Write). The server checks that its QP reported the
 * asynchronous event IBV_EVENT_QP_ACCESS_ERR and, after the connection
 * ended, that the target region (and the memory around it) still holds its
 * initial pattern, and that the good region holds exactly what the client
 * wrote. On the last connection no event may be reported.
 *
 * With ACCESS_CASE=N in the environment (both sides), only case N's
 * connection runs, then the legal one: against a peer that fails the other
 * cases for reasons of its own (test_57_remote_access_violations_against_
 * upstream_siw).
 *
 * Each side prints one line per connection, "PASS case N: ..." (the last
 * one "PASS legal: ...") or a "FAIL case N: ... expected X got Y" line per
 * failed check, and "access: N passed, N failed" (connections) last; exit
 * status 0 only if nothing failed. Every wait is bounded (10 s), and a
 * failed case does not stop the next.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "vmtest.h"

#define TIMEOUT_MS 10000
/* The server's target allocation; the region is [MR_OFF, MR_OFF + MR_LEN),
 * ending inside a page so that the octets past it are mapped. */
#define TGT_ALLOC 8192
#define MR_OFF 256
#define MR_LEN 3000
/* One DDP segment, so a refused Write has no earlier segment to place. */
#define OP_LEN 512
#define OP_OFF 1000
#define ATOMIC_OFF 1024
#define GOOD_ALLOC 4096
#define GOOD_LEN 1500
#define PROBE_LEN 16
#define BAD_RKEY_BITS 0x3c5au
#define MSG_KEYS 1u
#define MSG_GONE 2u
#define MSG_DONE 3u

#define LW IBV_ACCESS_LOCAL_WRITE
#define RW IBV_ACCESS_REMOTE_WRITE
#define RR IBV_ACCESS_REMOTE_READ
#define RA IBV_ACCESS_REMOTE_ATOMIC

enum op { OP_WRITE, OP_READ, OP_ATOMIC };

struct access_case {
	const char *what;
	enum op op;
	int access;	/* the server's registration of the target */
	int other_pd;	/* registered in a second PD, not the QP's */
	int bad_rkey;	/* the client flips bits of the rkey */
	int past_end;	/* the access ends one octet past the region */
	int dereg;	/* deregistered after its key was sent */
};

static const struct access_case cases[] = {
	{ "RDMA Write without REMOTE_WRITE", OP_WRITE, LW | RR, 0, 0, 0, 0 },
	{ "RDMA Read without REMOTE_READ", OP_READ, LW | RW, 0, 0, 0, 0 },
	{ "Fetch-and-Add without REMOTE_ATOMIC", OP_ATOMIC, LW | RW | RR, 0, 0, 0, 0 },
	{ "RDMA Write with a wrong rkey", OP_WRITE, LW | RW | RR, 0, 1, 0, 0 },
	{ "RDMA Write to a region of another PD", OP_WRITE, LW | RW | RR | RA, 1, 0, 0, 0 },
	{ "RDMA Write 1 octet past the end", OP_WRITE, LW | RW | RR, 0, 0, 1, 0 },
	{ "RDMA Read 1 octet past the end", OP_READ, LW | RW | RR, 0, 0, 1, 0 },
	{ "RDMA Write after ibv_dereg_mr", OP_WRITE, LW | RW | RR, 0, 0, 0, 1 },
};
#define N_CASES ((int)(sizeof(cases) / sizeof(cases[0])))
/* Connections 1..N_CASES carry case N; connection N_CASES + 1 is legal only. */
#define N_CONNS (N_CASES + 1)

struct msg {
	uint32_t type;
	uint32_t conn;
	uint64_t addr;
	uint64_t good_addr;
	uint32_t rkey;
	uint32_t good_rkey;
};

/* Cases (connections) passed and failed; whether the current one failed. */
static int passed, failed, conn_failed;
/* ACCESS_CASE: the one case to run (0: all); connections run. */
static int only_case, n_run;

/* Whether connection CONN is left out (ACCESS_CASE). */
static int skipped(int conn)
{
	return only_case && conn != only_case && conn != N_CONNS;
}
/* "case N: what" or "legal": how the current connection's lines start. */
static char label[128] = "setup";

static void set_label(int conn)
{
	if (conn <= N_CASES)
		snprintf(label, sizeof(label), "case %d: %s", conn, cases[conn - 1].what);
	else
		snprintf(label, sizeof(label), "legal");
	conn_failed = 0;
}

/* The current case's line: VERDICT, its label, the message. */
static void say(const char *verdict, const char *fmt, va_list ap)
{
	printf("%s %s: ", verdict, label);
	vprintf(fmt, ap);
	putchar('\n');
	fflush(stdout);
}

/* The current case passed: its one line. */
static void pass(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void pass(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	say("PASS", fmt, ap);
	va_end(ap);
	passed++;
}

/* A failed check of the current case; always returns 1, so a check can
 * `return bad(...)`. */
static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	say("FAIL", fmt, ap);
	va_end(ap);
	if (!conn_failed)
		failed++;
	conn_failed = 1;
	return 1;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint8_t tgt_pat(int conn, size_t i) { return (uint8_t)(i * 13 + conn * 29 + 0x5b); }
static uint8_t good_pat(int conn, size_t i) { return (uint8_t)(i * 7 + conn * 17 + 3); }
static uint8_t src_pat(size_t i) { return (uint8_t)(i * 11 + 0x81); }
static uint8_t sink_pat(size_t i) { return (uint8_t)(0xa5 ^ (i * 3)); }

/* The first octet of buf[0, len) that is not pat(i), or -1. */
static long first_diff(const uint8_t *buf, size_t len, uint8_t (*pat)(size_t))
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != pat(i))
			return (long)i;
	return -1;
}


static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *badwr;

	return ibv_post_send(qp, wr, &badwr);
}

/* A signalled Send of *m; its completion must be a success. */
static int send_msg(struct rdma_cm_id *id, struct msg *m, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)m, .length = sizeof(*m), .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 90, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_wc wc;

	if (post_send(id->qp, &wr))
		return -1;
	if (wait_wc(id->send_cq, &wc) || wc.status != IBV_WC_SUCCESS)
		return -1;
	return 0;
}

static const char *event_name(int type)
{
	return type < 0 ? "no event" : ibv_event_type_str((enum ibv_event_type)type);
}

/*
 * The next asynchronous event of ctx within timeout_ms: its type (acked),
 * whether it names qp in *ours; -1 if none came.
 */
static int next_event(struct ibv_context *ctx, struct ibv_qp *qp, int timeout_ms, int *ours)
{
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int type;

	if (poll(&pfd, 1, timeout_ms) != 1 || ibv_get_async_event(ctx, &ev))
		return -1;
	type = ev.event_type;
	*ours = ev.element.qp == qp;
	ibv_ack_async_event(&ev);
	return type;
}

/* ------------------------------------------------------------------ */

struct server {
	struct rdma_cm_id *listen_id;
	struct ibv_pd *pd2;
	uint8_t *tgt;
	uint8_t *good;
	struct msg *msg;	/* [0] out, [1] in */
};

static int cur_conn;
static uint8_t tgt_cur(size_t i) { return tgt_pat(cur_conn, i); }
static uint8_t good_cur(size_t i) { return good_pat(cur_conn, i); }

/* Connection `conn`: case `conn`, or the legal-only last one. */
static void serve_one(struct server *s, int conn)
{
	const struct access_case *c = conn <= N_CASES ? &cases[conn - 1] : NULL;
	struct rdma_cm_id *id;
	struct ibv_mr *tmr = NULL, *gmr, *mmr;
	struct ibv_wc wc;
	int type = -1, ours = 0;
	long d;

	set_label(conn);
	cur_conn = conn;
	if (rdma_get_request(s->listen_id, &id)) {
		bad("server: rdma_get_request: %s", strerror(errno));
		return;
	}
	if (!s->pd2) {
		int fl = fcntl(id->verbs->async_fd, F_GETFL);

		if (fl < 0 || fcntl(id->verbs->async_fd, F_SETFL, fl | O_NONBLOCK)) {
			bad("server: async fd: %s", strerror(errno));
			return;
		}
		s->pd2 = ibv_alloc_pd(id->verbs);
		if (!s->pd2) {
			bad("server: ibv_alloc_pd: %s", strerror(errno));
			return;
		}
	}
	for (size_t i = 0; i < TGT_ALLOC; i++)
		s->tgt[i] = tgt_pat(conn, i);
	memset(s->good, 0, GOOD_ALLOC);
	gmr = ibv_reg_mr(id->pd, s->good, GOOD_ALLOC, LW | RW | RR);
	mmr = ibv_reg_mr(id->pd, s->msg, 2 * sizeof(*s->msg), LW);
	if (c)
		tmr = ibv_reg_mr(c->other_pd ? s->pd2 : id->pd, s->tgt + MR_OFF, MR_LEN, c->access);
	if (!gmr || !mmr || (c && !tmr)) {
		bad("server: ibv_reg_mr: %s", strerror(errno));
		return;
	}
	if (post_recv(id->qp, &s->msg[1], sizeof(s->msg[1]), mmr->lkey, 1)) {
		bad("server: ibv_post_recv: %s", strerror(errno));
		return;
	}
	if (rdma_accept(id, NULL)) {
		bad("server: rdma_accept: %s", strerror(errno));
		return;
	}
	s->msg[0] = (struct msg){ .type = MSG_KEYS, .conn = conn,
				  .addr = (uintptr_t)(s->tgt + MR_OFF), .rkey = tmr ? tmr->rkey : 0,
				  .good_addr = (uintptr_t)s->good, .good_rkey = gmr->rkey };
	if (send_msg(id, &s->msg[0], mmr->lkey)) {
		bad("server: expected the keys sent got an error");
	} else if (c && c->dereg) {
		/* The key is out; now the region goes, then the client is told. */
		if (ibv_dereg_mr(tmr))
			bad("server: ibv_dereg_mr: %s", strerror(errno));
		tmr = NULL;
		s->msg[0].type = MSG_GONE;
		if (send_msg(id, &s->msg[0], mmr->lkey))
			bad("server: expected \"deregistered\" sent got an error");
	}

	if (c) {
		type = next_event(id->verbs, id->qp, TIMEOUT_MS, &ours);
	} else {
		/* Legal only: the client's "done", and no event at all. */
		if (wait_wc(id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS || s->msg[1].type != MSG_DONE)
			bad("server: expected the client's \"done\" got none");
		type = next_event(id->verbs, id->qp, 0, &ours);
	}
	rdma_disconnect(id);
	ibv_dereg_mr(gmr);
	ibv_dereg_mr(mmr);
	if (tmr)
		ibv_dereg_mr(tmr);
	rdma_destroy_ep(id);

	/* The connection has ended: nothing can be placed any more. */
	if (c && (type != IBV_EVENT_QP_ACCESS_ERR || !ours))
		bad("server: expected IBV_EVENT_QP_ACCESS_ERR on its QP got %s%s", event_name(type),
		    type >= 0 && !ours ? " (on another object)" : "");
	if (!c && type >= 0)
		bad("server: expected no async event got %s", event_name(type));
	d = first_diff(s->tgt, TGT_ALLOC, tgt_cur);
	if (c && d >= 0)
		bad("server: expected the target untouched got octet %ld (region offset %ld) = %#x, not %#x", d,
		    d - MR_OFF, s->tgt[d], tgt_pat(conn, d));
	d = first_diff(s->good, GOOD_LEN, good_cur);
	for (size_t i = GOOD_LEN; d < 0 && i < GOOD_ALLOC; i++)
		if (s->good[i])
			d = (long)i;
	if (d >= 0)
		bad("server: expected the client's legal %d-octet Write in the good region got octet %ld = %#x",
		    GOOD_LEN, d, s->good[d]);
	if (conn_failed)
		return;
	if (c)
		pass("server: IBV_EVENT_QP_ACCESS_ERR on its QP; all %d octets in and around the region unchanged; "
		     "the legal Write before it placed", TGT_ALLOC);
	else
		pass("server: the client's %d-octet Write placed on a fresh connection after case %d; no async event",
		     GOOD_LEN, N_CASES);
}

static int run_server(struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct server s = { 0 };

	s.tgt = aligned_alloc(4096, TGT_ALLOC);
	s.good = aligned_alloc(4096, GOOD_ALLOC);
	s.msg = aligned_alloc(64, 2 * sizeof(*s.msg));
	if (!s.tgt || !s.good || !s.msg)
		return bad("server: aligned_alloc");
	if (rdma_create_ep(&s.listen_id, res, NULL, &attr))
		return bad("server: rdma_create_ep: %s", strerror(errno));
	if (rdma_listen(s.listen_id, 4))
		return bad("server: rdma_listen: %s", strerror(errno));
	for (int conn = 1; conn <= N_CONNS; conn++)
		if (!skipped(conn))
			serve_one(&s, conn);
	if (s.pd2)
		ibv_dealloc_pd(s.pd2);
	rdma_destroy_ep(s.listen_id);
	return 0;
}

/* ------------------------------------------------------------------ */

struct client {
	struct rdma_addrinfo *res;
	uint8_t *src;		/* Write source */
	uint8_t *sink;		/* refused Read's sink, Atomic result, probe sink */
	uint8_t *back;		/* the legal Read's sink */
	struct msg *msg;	/* [0], [1] in, [2] out */
};

/* Posts wr (a chain) and checks each completion's wr_id and status. */
static int expect_wcs(struct rdma_cm_id *id, struct ibv_send_wr *wr, int n, const uint64_t *ids,
		      const enum ibv_wc_status *want)
{
	struct ibv_wc wc;

	if (post_send(id->qp, wr))
		return bad("client: ibv_post_send: %s", strerror(errno));
	for (int i = 0; i < n; i++) {
		if (wait_wc(id->send_cq, &wc))
			return bad("client: expected completion %" PRIu64 " %s got none within %d ms", ids[i],
				   ibv_wc_status_str(want[i]), TIMEOUT_MS);
		if (wc.wr_id != ids[i] || wc.status != want[i])
			return bad("client: expected completion %" PRIu64 " %s got completion %" PRIu64 " %s",
				   ids[i], ibv_wc_status_str(want[i]), wc.wr_id, ibv_wc_status_str(wc.status));
	}
	return 0;
}

static void rdma_wr(struct ibv_send_wr *wr, struct ibv_sge *sge, uint64_t id, enum ibv_wr_opcode op,
		    void *buf, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	*sge = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	*wr = (struct ibv_send_wr){ .wr_id = id, .sg_list = sge, .num_sge = 1, .opcode = op,
				    .send_flags = IBV_SEND_SIGNALED };
	wr->wr.rdma.remote_addr = raddr;
	wr->wr.rdma.rkey = rkey;
}

/* The violation of case c; the connection is up and the keys are in m. On
 * success, what the requester saw, for the PASS line. */
static int violate(struct rdma_cm_id *id, const struct access_case *c, const struct msg *m,
		   struct client *cl, struct ibv_mr *smr, char *saw, size_t saw_len)
{
	uint64_t off = c->past_end ? MR_LEN - OP_LEN + 1 : OP_OFF;
	uint32_t rkey = c->bad_rkey ? m->rkey ^ BAD_RKEY_BITS : m->rkey;
	struct ibv_send_wr wr[2];
	struct ibv_sge sge[2];
	size_t sink_len = c->op == OP_ATOMIC ? 8 : c->op == OP_READ ? OP_LEN : PROBE_LEN;
	long d;

	for (size_t i = 0; i < OP_LEN; i++) {
		cl->src[i] = src_pat(i);
		cl->sink[i] = sink_pat(i);
	}
	switch (c->op) {
	case OP_WRITE: {
		static const uint64_t ids[] = { 10, 11 };
		static const enum ibv_wc_status want[] = { IBV_WC_SUCCESS, IBV_WC_REM_ACCESS_ERR };

		rdma_wr(&wr[0], &sge[0], 10, IBV_WR_RDMA_WRITE, cl->src, OP_LEN, smr->lkey, m->addr + off, rkey);
		rdma_wr(&wr[1], &sge[1], 11, IBV_WR_RDMA_READ, cl->sink, PROBE_LEN, smr->lkey, m->good_addr,
			m->good_rkey);
		wr[0].next = &wr[1];
		if (expect_wcs(id, wr, 2, ids, want))
			return 1;
		snprintf(saw, saw_len, "%d-octet Write IBV_WC_SUCCESS, the Read behind it IBV_WC_REM_ACCESS_ERR",
			 OP_LEN);
		break;
	}
	case OP_READ: {
		static const uint64_t ids[] = { 20 };
		static const enum ibv_wc_status want[] = { IBV_WC_REM_ACCESS_ERR };

		rdma_wr(&wr[0], &sge[0], 20, IBV_WR_RDMA_READ, cl->sink, OP_LEN, smr->lkey, m->addr + off, rkey);
		if (expect_wcs(id, wr, 1, ids, want))
			return 1;
		snprintf(saw, saw_len, "%d-octet Read IBV_WC_REM_ACCESS_ERR", OP_LEN);
		break;
	}
	case OP_ATOMIC: {
		static const uint64_t ids[] = { 30 };
		static const enum ibv_wc_status want[] = { IBV_WC_REM_ACCESS_ERR };

		rdma_wr(&wr[0], &sge[0], 30, IBV_WR_ATOMIC_FETCH_AND_ADD, cl->sink, 8, smr->lkey, 0, 0);
		wr[0].wr.atomic.remote_addr = m->addr + ATOMIC_OFF;
		wr[0].wr.atomic.rkey = rkey;
		wr[0].wr.atomic.compare_add = 1;
		if (expect_wcs(id, wr, 1, ids, want))
			return 1;
		snprintf(saw, saw_len, "Fetch-and-Add IBV_WC_REM_ACCESS_ERR");
		break;
	}
	}
	d = first_diff(cl->sink, OP_LEN, sink_pat);
	if (d >= 0)
		return bad("client: expected its %zu-octet sink untouched got octet %ld = %#x, not %#x", sink_len,
			   d, cl->sink[d], sink_pat(d));
	snprintf(saw + strlen(saw), saw_len - strlen(saw), "; %zu-octet sink untouched", sink_len);
	return 0;
}

/* Connection `conn`: case `conn`, or the legal-only last one. */
static void connect_one(struct client *cl, int conn)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 8, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	static const uint64_t legal_ids[] = { 1, 2 };
	static const enum ibv_wc_status legal_want[] = { IBV_WC_SUCCESS, IBV_WC_SUCCESS };
	const struct access_case *c = conn <= N_CASES ? &cases[conn - 1] : NULL;
	double t0 = now();
	struct rdma_cm_id *id;
	struct ibv_mr *smr, *kmr;
	struct ibv_send_wr wr[2];
	struct ibv_sge sge[2];
	struct ibv_wc wc;
	char saw[256] = "";
	long d;

	set_label(conn);
	cur_conn = conn;
	if (rdma_create_ep(&id, cl->res, NULL, &attr)) {
		bad("client: rdma_create_ep: %s", strerror(errno));
		return;
	}
	/* src, sink and back are one allocation. */
	smr = ibv_reg_mr(id->pd, cl->src, 3 * 4096, LW);
	kmr = ibv_reg_mr(id->pd, cl->msg, 3 * sizeof(*cl->msg), LW);
	if (!smr || !kmr) {
		bad("client: ibv_reg_mr: %s", strerror(errno));
		return;
	}
	memset(cl->msg, 0, 3 * sizeof(*cl->msg));
	if (post_recv(id->qp, &cl->msg[0], sizeof(*cl->msg), kmr->lkey, 1) ||
	    post_recv(id->qp, &cl->msg[1], sizeof(*cl->msg), kmr->lkey, 2)) {
		bad("client: ibv_post_recv: %s", strerror(errno));
		return;
	}
	if (rdma_connect(id, NULL)) {
		bad("client: rdma_connect: %s", strerror(errno));
		goto out;
	}
	if (wait_wc(id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS || cl->msg[0].type != MSG_KEYS ||
	    cl->msg[0].conn != (uint32_t)conn) {
		bad("client: expected the server's keys for connection %d got none", conn);
		goto out;
	}

	/* Legal: Write the good region, Read it back. */
	for (size_t i = 0; i < GOOD_LEN; i++)
		cl->src[i] = good_pat(conn, i);
	memset(cl->back, 0, GOOD_LEN);
	rdma_wr(&wr[0], &sge[0], 1, IBV_WR_RDMA_WRITE, cl->src, GOOD_LEN, smr->lkey, cl->msg[0].good_addr,
		cl->msg[0].good_rkey);
	rdma_wr(&wr[1], &sge[1], 2, IBV_WR_RDMA_READ, cl->back, GOOD_LEN, smr->lkey, cl->msg[0].good_addr,
		cl->msg[0].good_rkey);
	wr[0].next = &wr[1];
	if (expect_wcs(id, wr, 2, legal_ids, legal_want))
		goto out;
	d = first_diff(cl->back, GOOD_LEN, good_cur);
	if (d >= 0) {
		bad("client: expected the legal %d-octet Write read back got octet %ld = %#x, not %#x", GOOD_LEN, d,
		    cl->back[d], good_pat(conn, d));
		goto out;
	}

	if (!c) {
		cl->msg[2] = (struct msg){ .type = MSG_DONE, .conn = conn };
		if (send_msg(id, &cl->msg[2], kmr->lkey))
			bad("client: expected \"done\" sent got an error");
		goto out;
	}
	if (c->dereg && (wait_wc(id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS || cl->msg[1].type != MSG_GONE)) {
		bad("client: expected \"deregistered\" from the server got none");
		goto out;
	}
	violate(id, c, &cl->msg[0], cl, smr, saw, sizeof(saw));
out:
	rdma_disconnect(id);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(kmr);
	rdma_destroy_ep(id);
	if (conn_failed)
		return;
	if (c)
		pass("client: %s; the legal %d-octet Write and Read before it verified%s (%.1f s)", saw, GOOD_LEN,
		     conn > 1 ? " (a fresh connection after the previous case)" : "", now() - t0);
	else
		pass("client: %d-octet Write and Read verified on a fresh connection after case %d (%.1f s)",
		     GOOD_LEN, N_CASES, now() - t0);
}

static int run_client(struct rdma_addrinfo *res)
{
	struct client cl = { .res = res };

	cl.src = aligned_alloc(4096, 3 * 4096);
	cl.msg = aligned_alloc(64, 3 * sizeof(*cl.msg));
	if (!cl.src || !cl.msg)
		return bad("client: aligned_alloc");
	cl.sink = cl.src + 4096;
	cl.back = cl.src + 2 * 4096;
	for (int conn = 1; conn <= N_CONNS; conn++)
		if (!skipped(conn))
			connect_one(&cl, conn);
	return 0;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	double t0 = now();
	int server;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: access server|client ADDR PORT\n");
		return 2;
	}
	if (getenv("ACCESS_CASE")) {
		only_case = atoi(getenv("ACCESS_CASE"));
		if (only_case < 1 || only_case > N_CASES) {
			fprintf(stderr, "access: ACCESS_CASE must be 1 to %d\n", N_CASES);
			return 2;
		}
	}
	for (int conn = 1; conn <= N_CONNS; conn++)
		n_run += !skipped(conn);
	server = !strcmp(argv[1], "server");
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], argv[3], &hints, &res)) {
		fprintf(stderr, "access: rdma_getaddrinfo: %s\n", strerror(errno));
		return 2;
	}
	if (server)
		run_server(res);
	else
		run_client(res);
	rdma_freeaddrinfo(res);
	if (!only_case)
		printf("SKIP case 9: remote invalidation: siw_rs has no memory windows and no invalidatable userspace MRs\n");
	printf("access: %d connections in %.1f s\n", n_run, now() - t0);
	printf("access: %d passed, %d failed\n", passed, failed);
	return failed || !passed;
}
