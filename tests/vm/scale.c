// SPDX-License-Identifier: GPL-2.0
/*
 * scale: the scale checks of issue #7 through the verbs API, for the
 * siw_rs VM tests (tests/vm/scale.sh, tests/vm/t-92-scale.sh).
 *
 *   scale qps --server ADDR PORT N | --client ADDR PORT N
 *	N connections through the RDMA CM at once, one process each side,
 *	one small CQ per QP. The client connects with at most WINDOW
 *	connection attempts outstanding and sends its connection index as
 *	private data. Once all N are established on the server, it Sends
 *	each QP a message holding the QP's index, the address and rkey of
 *	the QP's slot in its region, and a per-QP pattern, which the client
 *	checks byte for byte; only when it has all N does the client RDMA
 *	Write a per-QP pattern into each slot and Send "done", and the server
 *	checks every slot byte for byte. Then the server disconnects all N
 *	and both sides destroy everything. Both print a checkpoint line
 *	(elapsed time, /proc/meminfo's MemFree, Slab and SUnreclaim) after
 *	each quarter of the connections and after each phase; the client
 *	also prints the kernel's resource count of its device (`rdma res
 *	show`) with all N connected and requires exactly N QPs and N CQs.
 *
 *   scale mr --server ADDR PORT --size BYTES | --client ADDR PORT
 *	The server registers one region of BYTES (anonymous memory, pinned by
 *	the registration) and sends its address and rkey. The client RDMA
 *	Writes a pattern to a set of places in it: the start, across a page
 *	boundary, across the 2 GiB and 4 GiB offsets, across the region's
 *	2^32-aligned virtual address, the middle and the very end (those the
 *	size allows), reads each back with an RDMA Read and compares; the
 *	server compares each place and the 4 KiB either side of it (still
 *	zero) with the CPU. Last the client Reads one octet past the end,
 *	which must complete with IBV_WC_REM_ACCESS_ERR. The server times the
 *	registration, the client's check and the deregistration.
 *
 *   scale regs --count N --size S [--window W] [--batch B] [--dev NAME]
 *	N ibv_reg_mr/ibv_dereg_mr cycles of an S-octet buffer, keeping the
 *	last W regions registered (the oldest is deregistered before each new
 *	registration once W are live; their keys must differ); a line per B
 *	cycles with the batch's time and the memory counters.
 *
 * Every wait is bounded. Each side prints "scale: PASS ..." or "scale:
 * FAIL ..." lines; exit status 0 only if nothing failed.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define TIMEOUT_MS 20000
#define SLOT 4096		/* each QP's slot in the qps regions */
#define PAT_LEN 200		/* the server's per-QP pattern in its message */
#define WINDOW 16		/* connection attempts outstanding (client) */
#define MR_LEN 65536		/* each place of the mr check */
#define MR_GUARD 4096		/* checked around each place */
#define MAGIC 0x5343414cu	/* "SCAL" */

enum { MSG_KEYS = 1, MSG_DONE, MSG_VERDICT };

struct msg {
	uint32_t magic;
	uint32_t type;
	uint32_t index;
	uint32_t rkey;
	uint64_t addr;
	uint64_t size;
	uint32_t status;	/* MSG_VERDICT: 0 all places verified */
	uint32_t nplaces;
	uint8_t pat[PAT_LEN];
};

struct conn_pd {
	uint32_t magic;
	uint32_t index;
};

static int failed;
static double t_start;
static const char *side = "";

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("scale: FAIL %s: ", side);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	failed++;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	printf("scale: FAIL %s: ", side);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	exit(1);
}

/* /proc/meminfo's NAME in kB, or -1. */
static long meminfo(const char *name)
{
	char line[256];
	size_t n = strlen(name);
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, n) && line[n] == ':') {
			v = strtol(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* A checkpoint line: what, elapsed time, memory counters. */
static void checkpoint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void checkpoint(const char *fmt, ...)
{
	va_list ap;

	printf("scale: checkpoint %s: ", side);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" | t %.2f s MemFree %ld kB Slab %ld kB SUnreclaim %ld kB\n", now() - t_start,
	       meminfo("MemFree"), meminfo("Slab"), meminfo("SUnreclaim"));
}

static uint8_t s2c_pat(uint32_t k, size_t i) { return (uint8_t)(i * 7 + k * 13 + (k >> 8) * 3 + 0x11); }
static uint8_t c2s_pat(uint32_t k, size_t i) { return (uint8_t)(i * 11 + k * 29 + (k >> 8) * 5 + 0x5b); }
static uint8_t mr_pat(uint32_t p, uint64_t i) { return (uint8_t)(i * 131 + (i >> 8) * 7 + (i >> 16) + p * 37 + 1); }

/* The next CM event of ch within timeout_ms (the caller acks it), or NULL. */
static struct rdma_cm_event *next_cm_event(struct rdma_event_channel *ch, int timeout_ms)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&pfd, 1, timeout_ms) != 1)
		return NULL;
	if (rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

/* Waits for an event of type want on id; anything else fails. */
static int expect_cm_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want, int timeout_ms)
{
	struct rdma_cm_event *ev = next_cm_event(ch, timeout_ms);
	int ok;

	if (!ev) {
		fail("expected %s got no event within %d ms", rdma_event_str(want), timeout_ms);
		return -1;
	}
	ok = ev->event == want;
	if (!ok)
		fail("expected %s got %s (status %d)", rdma_event_str(want), rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
	return ok ? 0 : -1;
}

static int post_recv(struct ibv_qp *qp, void *buf, uint32_t len, uint32_t lkey, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

static int post_one(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, void *buf, uint32_t len, uint32_t lkey,
		    uint64_t raddr, uint32_t rkey, int signaled, struct ibv_send_wr *next)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = signaled ? IBV_SEND_SIGNALED : 0, .next = next }, *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

/* One completion of cq within timeout_ms: 0, or -1. */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc, int timeout_ms)
{
	double end = now() + timeout_ms / 1000.0;

	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0)
			return -1;
		if (n == 1)
			return 0;
		if (now() > end)
			return -1;
		usleep(200);
	}
}

/* The device's resource counts from `rdma res show` (-1 where none). */
struct res_counts { long pd, cq, qp, cm_id, mr; };

static struct res_counts res_show(const char *dev)
{
	struct res_counts r = { -1, -1, -1, -1, -1 };
	char cmd[128], line[512], want[80];
	FILE *f;

	snprintf(cmd, sizeof(cmd), "rdma res show 2>/dev/null");
	snprintf(want, sizeof(want), " %s: ", dev);
	f = popen(cmd, "r");
	if (!f)
		return r;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, want), *tok, *save = NULL;
		long *dst = NULL;

		if (!p)
			continue;
		printf("scale: rdma res %s", line);
		for (tok = strtok_r(p + strlen(want), " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
			if (dst) {
				*dst = strtol(tok, NULL, 10);
				dst = NULL;
				continue;
			}
			dst = !strcmp(tok, "pd") ? &r.pd : !strcmp(tok, "cq") ? &r.cq : !strcmp(tok, "qp") ? &r.qp :
			      !strcmp(tok, "cm_id") ? &r.cm_id : !strcmp(tok, "mr") ? &r.mr : NULL;
		}
	}
	pclose(f);
	return r;
}

/* ------------------------------------------------------------------ */
/* qps */

struct qconn {
	struct rdma_cm_id *id;
	struct ibv_cq *cq;
	int state;		/* 0 none, 1 connecting, 2 established, 3 disconnected */
	int got_msg;		/* client: keys checked; server: done checked */
	int sent;		/* send completions seen */
	double t0;		/* client: id created; server: connect request */
	double t_addr, t_route;	/* client: ADDR_RESOLVED, ROUTE_RESOLVED */
	struct msg peer;	/* client: the server's keys */
};

struct qps {
	int server;
	uint32_t n;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen;
	struct rdma_addrinfo *res;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint8_t *slots;		/* n * SLOT: server's targets, client's sources */
	struct msg *out, *in;	/* n each */
	struct qconn *c;
	uint32_t established, disconnected;
	int quarter;
	double slowest;		/* the longest t0 to ESTABLISHED */
	uint32_t slowest_k;
};

/* Resolves dst once and throws the id away, so that the neighbour entry
 * exists before anything is timed. In a fresh namespace the first
 * resolution sends the ARP request, but ib_core's address resolution
 * (addr.c) was seen to notice the reply only when its timeout expired (5
 * to 20 s): so short timeouts, tried again up to 20 times. */
static void warm_address(struct rdma_event_channel *ch, struct sockaddr *dst)
{
	struct rdma_cm_id *id;
	double t0 = now();

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id: %s", strerror(errno));
	for (int try = 0;; try++) {
		struct rdma_cm_event *ev;
		int type, status;

		if (rdma_resolve_addr(id, NULL, dst, 1000))
			die("rdma_resolve_addr: %s", strerror(errno));
		ev = next_cm_event(ch, 11000);
		if (!ev)
			die("no event within 11 s after rdma_resolve_addr");
		type = ev->event;
		status = ev->status;
		rdma_ack_cm_event(ev);
		if (type == RDMA_CM_EVENT_ADDR_RESOLVED)
			break;
		printf("scale: %s: %s (status %d) after rdma_resolve_addr\n", side, rdma_event_str(type), status);
		if (type != RDMA_CM_EVENT_ADDR_ERROR || try == 19)
			die("address resolution failed");
	}
	printf("scale: %s: the peer's address resolved in %.3f s\n", side, now() - t0);
	if (rdma_destroy_id(id))
		die("rdma_destroy_id: %s", strerror(errno));
}

static void qps_alloc(struct qps *q, struct ibv_context *verbs)
{
	size_t len = (size_t)q->n * SLOT + 2 * (size_t)q->n * sizeof(struct msg);

	q->pd = ibv_alloc_pd(verbs);
	if (!q->pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	q->slots = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
	if (!q->slots)
		die("aligned_alloc %zu", len);
	memset(q->slots, 0, len);
	q->out = (struct msg *)(q->slots + (size_t)q->n * SLOT);
	q->in = q->out + q->n;
	q->mr = ibv_reg_mr(q->pd, q->slots, len,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!q->mr)
		die("ibv_reg_mr: %s", strerror(errno));
}

/* A CQ and a QP for connection k on id. */
static void qps_make_qp(struct qps *q, uint32_t k, struct rdma_cm_id *id)
{
	struct qconn *c = &q->c[k];
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	c->id = id;
	id->context = c;
	c->cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	if (!c->cq)
		die("connection %u: ibv_create_cq: %s", k, strerror(errno));
	attr.send_cq = attr.recv_cq = c->cq;
	if (rdma_create_qp(id, q->pd, &attr))
		die("connection %u: rdma_create_qp: %s", k, strerror(errno));
	if (post_recv(id->qp, &q->in[k], sizeof(struct msg), q->mr->lkey, k))
		die("connection %u: ibv_post_recv: %s", k, strerror(errno));
}

static void qps_established(struct qps *q, struct qconn *c)
{
	if (c->state != 1)
		die("connection %td: ESTABLISHED in state %d", c - q->c, c->state);
	c->state = 2;
	q->established++;
	if (now() - c->t0 > q->slowest) {
		q->slowest = now() - c->t0;
		q->slowest_k = (uint32_t)(c - q->c);
	}
	while (q->quarter < 4 && q->established >= (uint64_t)q->n * (q->quarter + 1) / 4) {
		q->quarter++;
		checkpoint("%u of %u connected", q->established, q->n);
	}
}

/* Handles the CM events of the connect phase until all n are established. */
static void qps_connect_events(struct qps *q, uint32_t *started, uint32_t *inflight)
{
	struct conn_pd cpd;
	/* The first request waits for the client to start. */
	struct rdma_cm_event *ev = next_cm_event(q->ch, *started || q->established ? TIMEOUT_MS : 6 * TIMEOUT_MS);
	struct qconn *c;
	enum rdma_cm_event_type type;
	int status;

	if (!ev)
		die("no CM event within %d ms with %u of %u established", TIMEOUT_MS, q->established, q->n);
	type = ev->event;
	status = ev->status;
	if (q->server && type == RDMA_CM_EVENT_CONNECT_REQUEST) {
		struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
		struct rdma_cm_id *id = ev->id;
		struct conn_pd p = { 0 };
		uint32_t k;

		if (ev->param.conn.private_data && ev->param.conn.private_data_len >= sizeof(p))
			memcpy(&p, ev->param.conn.private_data, sizeof(p));
		if (p.magic != MAGIC)
			die("a connect request without the index (private data %u octets)",
			    ev->param.conn.private_data_len);
		k = p.index;
		rdma_ack_cm_event(ev);
		if (k >= q->n || q->c[k].state)
			die("a connect request for index %u (of %u, state %d)", k, q->n, k < q->n ? q->c[k].state : -1);
		q->c[k].t0 = now();
		(*started)++;
		qps_make_qp(q, k, id);
		q->c[k].state = 1;
		if (rdma_accept(id, &cp))
			die("connection %u: rdma_accept: %s", k, strerror(errno));
		return;
	}
	c = ev->id->context;
	rdma_ack_cm_event(ev);
	if (!c)
		die("%s (status %d) on the listening id", rdma_event_str(type), status);
	uint32_t k = (uint32_t)(c - q->c);

	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		c->t_addr = now();
		if (rdma_resolve_route(c->id, TIMEOUT_MS))
			die("connection %u: rdma_resolve_route: %s", k, strerror(errno));
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED: {
		struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
					      .private_data = &cpd, .private_data_len = sizeof(cpd) };

		c->t_route = now();
		cpd = (struct conn_pd){ .magic = MAGIC, .index = k };
		/* The device is known once the first address is resolved. */
		if (!q->pd)
			qps_alloc(q, c->id->verbs);
		qps_make_qp(q, k, c->id);
		if (rdma_connect(c->id, &cp))
			die("connection %u: rdma_connect: %s", k, strerror(errno));
		break;
	}
	case RDMA_CM_EVENT_ESTABLISHED:
		qps_established(q, c);
		if (!q->server)
			(*inflight)--;
		break;
	default:
		die("connection %u: %s (status %d) with %u of %u established (%u started)", k, rdma_event_str(type),
		    status, q->established, q->n, *started);
	}
}

/* Polls every CQ until `want` completions of the given kind have been
 * handled by fn (which returns 1 for a counted completion). */
static void qps_poll_all(struct qps *q, uint32_t want, int (*fn)(struct qps *, uint32_t, struct ibv_wc *),
			 const char *what)
{
	uint32_t got = 0;
	double end = now() + TIMEOUT_MS / 1000.0 + q->n * 0.05;

	while (got < want) {
		int any = 0;

		for (uint32_t k = 0; k < q->n; k++) {
			struct ibv_wc wc;
			int r;

			while ((r = ibv_poll_cq(q->c[k].cq, 1, &wc)) == 1) {
				any = 1;
				if (wc.status != IBV_WC_SUCCESS)
					die("connection %u: completion %" PRIu64 " %s (%s)", k, wc.wr_id,
					    ibv_wc_status_str(wc.status), what);
				got += fn(q, k, &wc);
			}
			if (r < 0)
				die("connection %u: ibv_poll_cq failed", k);
		}
		if (!any) {
			if (now() > end)
				die("%s: %u of %u completions within the time limit", what, got, want);
			usleep(500);
		}
	}
}

/* Server: a send completion (keys out) or a receive ("done" in). */
static int server_wc(struct qps *q, uint32_t k, struct ibv_wc *wc)
{
	struct qconn *c = &q->c[k];
	const struct msg *m = &q->in[k];
	const uint8_t *slot = q->slots + (size_t)k * SLOT;

	if (wc->opcode == IBV_WC_SEND) {
		c->sent++;
		return 1;
	}
	if (wc->opcode != IBV_WC_RECV)
		die("connection %u: unexpected completion opcode %d", k, wc->opcode);
	if (c->got_msg++)
		die("connection %u: a second message", k);
	if (m->magic != MAGIC || m->type != MSG_DONE || m->index != k)
		die("connection %u: expected \"done %u\" got type %u index %u", k, k, m->type, m->index);
	for (size_t i = 0; i < SLOT; i++)
		if (slot[i] != c2s_pat(k, i))
			die("connection %u: slot octet %zu is %#x, expected %#x", k, i, slot[i], c2s_pat(k, i));
	return 1;
}

/* Client: the server's keys message in, or a Write/Send completion. */
static int client_wc(struct qps *q, uint32_t k, struct ibv_wc *wc)
{
	struct qconn *c = &q->c[k];
	const struct msg *m = &q->in[k];

	if (wc->opcode == IBV_WC_SEND || wc->opcode == IBV_WC_RDMA_WRITE) {
		c->sent++;
		return 1;
	}
	if (wc->opcode != IBV_WC_RECV)
		die("connection %u: unexpected completion opcode %d", k, wc->opcode);
	if (c->got_msg++)
		die("connection %u: a second message", k);
	if (m->magic != MAGIC || m->type != MSG_KEYS || m->index != k)
		die("connection %u: expected keys for %u got type %u index %u", k, k, m->type, m->index);
	for (size_t i = 0; i < PAT_LEN; i++)
		if (m->pat[i] != s2c_pat(k, i))
			die("connection %u: message octet %zu is %#x, expected %#x", k, i, m->pat[i], s2c_pat(k, i));
	c->peer = *m;
	return 1;
}

/* Waits for n DISCONNECTED events (and acks any others of a torn-down
 * connection). */
static void qps_wait_disconnected(struct qps *q)
{
	while (q->disconnected < q->n) {
		struct rdma_cm_event *ev = next_cm_event(q->ch, TIMEOUT_MS);
		struct qconn *c;

		if (!ev)
			die("%u of %u disconnected within %d ms", q->disconnected, q->n, TIMEOUT_MS);
		c = ev->id->context;
		if (ev->event != RDMA_CM_EVENT_DISCONNECTED || !c || c->state != 2)
			die("expected DISCONNECTED got %s (status %d) in state %d", rdma_event_str(ev->event),
			    ev->status, c ? c->state : -1);
		rdma_ack_cm_event(ev);
		c->state = 3;
		q->disconnected++;
	}
}

static void qps_destroy(struct qps *q)
{
	for (uint32_t k = 0; k < q->n; k++) {
		struct qconn *c = &q->c[k];

		rdma_destroy_qp(c->id);
		if (ibv_destroy_cq(c->cq))
			fail("connection %u: ibv_destroy_cq: %s", k, strerror(errno));
		if (rdma_destroy_id(c->id))
			fail("connection %u: rdma_destroy_id: %s", k, strerror(errno));
	}
	if (ibv_dereg_mr(q->mr))
		fail("ibv_dereg_mr: %s", strerror(errno));
	if (ibv_dealloc_pd(q->pd))
		fail("ibv_dealloc_pd: %s", strerror(errno));
	if (q->listen)
		rdma_destroy_id(q->listen);
}

static int run_qps(int server, const char *addr, const char *port, uint32_t n)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP };
	struct qps q = { .server = server, .n = n };
	uint32_t started = 0, inflight = 0;

	q.c = calloc(n, sizeof(*q.c));
	q.ch = rdma_create_event_channel();
	if (!q.c || !q.ch)
		die("setup: %s", strerror(errno));
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(addr, port, &hints, &q.res))
		die("rdma_getaddrinfo %s %s: %s", addr, port, strerror(errno));
	if (!server)
		warm_address(q.ch, q.res->ai_dst_addr);
	checkpoint("start, %u connections", n);
	if (server) {
		if (rdma_create_id(q.ch, &q.listen, NULL, RDMA_PS_TCP) ||
		    rdma_bind_addr(q.listen, q.res->ai_src_addr))
			die("rdma_create_id/bind %s: %s", addr, strerror(errno));
		if (!q.listen->verbs)
			die("%s is not the address of an RDMA device", addr);
		qps_alloc(&q, q.listen->verbs);
		for (uint32_t k = 0; k < n; k++)
			for (size_t i = 0; i < PAT_LEN; i++)
				q.out[k].pat[i] = s2c_pat(k, i);
		if (rdma_listen(q.listen, 1024))
			die("rdma_listen: %s", strerror(errno));
		printf("scale: server listening on %s port %s for %u connections\n", addr, port, n);
		while (q.established < n)
			qps_connect_events(&q, &started, &inflight);
	} else {
		while (q.established < n) {
			while (started < n && inflight < WINDOW) {
				struct rdma_cm_id *id;

				if (rdma_create_id(q.ch, &id, &q.c[started], RDMA_PS_TCP))
					die("rdma_create_id: %s", strerror(errno));
				q.c[started].id = id;
				q.c[started].state = 1;
				q.c[started].t0 = now();
				if (rdma_resolve_addr(id, NULL, q.res->ai_dst_addr, TIMEOUT_MS))
					die("connection %u: rdma_resolve_addr: %s", started, strerror(errno));
				started++;
				inflight++;
			}
			qps_connect_events(&q, &started, &inflight);
		}
	}
	checkpoint("all %u connected; the slowest, %u, took %.3f s from %s to ESTABLISHED", n, q.slowest_k,
		   q.slowest, server ? "its connect request" : "rdma_create_id");
	if (!server)
		printf("scale: the slowest connection: address %.3f s, route %.3f s, connect %.3f s\n",
		       q.c[q.slowest_k].t_addr - q.c[q.slowest_k].t0, q.c[q.slowest_k].t_route - q.c[q.slowest_k].t_addr,
		       q.c[q.slowest_k].t0 + q.slowest - q.c[q.slowest_k].t_route);
	if (!server) {
		struct res_counts r = res_show(ibv_get_device_name(q.pd->context->device));

		if (r.qp != (long)n || r.cq != (long)n)
			fail("rdma res show: %ld QPs and %ld CQs with %u connected, expected %u each", r.qp, r.cq, n,
			     n);
	}

	double t0 = now();

	if (server) {
		/* Every QP gets its keys and pattern. */
		for (uint32_t k = 0; k < n; k++) {
			q.out[k].magic = MAGIC;
			q.out[k].type = MSG_KEYS;
			q.out[k].index = k;
			q.out[k].addr = (uintptr_t)(q.slots + (size_t)k * SLOT);
			q.out[k].rkey = q.mr->rkey;
			if (post_one(q.c[k].id->qp, 1, IBV_WR_SEND, &q.out[k], sizeof(struct msg), q.mr->lkey, 0, 0, 1,
				     NULL))
				die("connection %u: ibv_post_send: %s", k, strerror(errno));
		}
		qps_poll_all(&q, 2 * n, server_wc, "keys out, done in");
		checkpoint("%u slots verified (%u octets each) in %.2f s", n, SLOT, now() - t0);
		t0 = now();
		for (uint32_t k = 0; k < n; k++)
			if (rdma_disconnect(q.c[k].id))
				die("connection %u: rdma_disconnect: %s", k, strerror(errno));
		qps_wait_disconnected(&q);
	} else {
		qps_poll_all(&q, n, client_wc, "keys in");
		checkpoint("%u key messages verified (%u octets each) in %.2f s", n, PAT_LEN, now() - t0);
		t0 = now();
		for (uint32_t k = 0; k < n; k++) {
			uint8_t *src = q.slots + (size_t)k * SLOT;
			struct ibv_sge sge = { .addr = (uintptr_t)&q.out[k], .length = sizeof(struct msg),
					       .lkey = q.mr->lkey };
			struct ibv_send_wr done = { .wr_id = 3, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
						    .send_flags = IBV_SEND_SIGNALED };

			for (size_t i = 0; i < SLOT; i++)
				src[i] = c2s_pat(k, i);
			q.out[k] = (struct msg){ .magic = MAGIC, .type = MSG_DONE, .index = k };
			if (post_one(q.c[k].id->qp, 2, IBV_WR_RDMA_WRITE, src, SLOT, q.mr->lkey, q.c[k].peer.addr,
				     q.c[k].peer.rkey, 1, &done))
				die("connection %u: ibv_post_send: %s", k, strerror(errno));
		}
		qps_poll_all(&q, 2 * n, client_wc, "Write and done out");
		checkpoint("%u slots written (%u octets each) and done sent in %.2f s", n, SLOT, now() - t0);
		t0 = now();
		qps_wait_disconnected(&q);
		for (uint32_t k = 0; k < n; k++)
			rdma_disconnect(q.c[k].id);
	}
	checkpoint("all %u disconnected in %.2f s", n, now() - t0);
	t0 = now();
	qps_destroy(&q);
	checkpoint("all %u destroyed in %.2f s", n, now() - t0);
	rdma_freeaddrinfo(q.res);
	rdma_destroy_event_channel(q.ch);
	if (!failed)
		printf("scale: PASS %s: %u connections at once, %s verified on every one (%.1f s)\n", side, n,
		       server ? "the client's 4096-octet RDMA Write" : "the server's message", now() - t_start);
	return failed != 0;
}

/* ------------------------------------------------------------------ */
/* mr */

struct place { uint64_t off; const char *what; };

/* The places of a SIZE-octet region at virtual address base: sorted,
 * non-overlapping (with MR_GUARD between), inside. */
static int mr_places(uint64_t size, uint64_t base, struct place *p)
{
	struct place cand[8];
	int nc = 0, n = 0;
	uint64_t abs4g = ((base >> 32) + 1) << 32;

	if (size < MR_LEN)
		return 0;
	cand[nc++] = (struct place){ 0, "start" };
	cand[nc++] = (struct place){ MR_LEN + MR_GUARD + 1000, "unaligned, across pages" };
	cand[nc++] = (struct place){ (1ull << 31) - MR_LEN / 2, "across offset 2 GiB" };
	cand[nc++] = (struct place){ (1ull << 32) - MR_LEN / 2, "across offset 4 GiB" };
	cand[nc++] = (struct place){ abs4g - base - MR_LEN / 2, "across virtual address 2^32*k" };
	cand[nc++] = (struct place){ size / 2 + 123, "middle" };
	cand[nc++] = (struct place){ size - MR_LEN, "end (last octet included)" };
	/* Insertion sort by offset. */
	for (int i = 1; i < nc; i++)
		for (int j = i; j > 0 && cand[j].off < cand[j - 1].off; j--) {
			struct place t = cand[j];

			cand[j] = cand[j - 1];
			cand[j - 1] = t;
		}
	for (int i = 0; i < nc; i++) {
		if (cand[i].off > size - MR_LEN || cand[i].off + MR_LEN < cand[i].off)
			continue;
		if (n && cand[i].off < p[n - 1].off + MR_LEN + MR_GUARD) {
			/* Keep the end: it replaces an overlapping one. */
			if (cand[i].off == size - MR_LEN && cand[i].off >= MR_LEN + MR_GUARD)
				n--;
			else
				continue;
		}
		p[n++] = cand[i];
	}
	return n;
}

struct mrconn {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;	/* send */
	struct ibv_cq *rcq;	/* receive */
	struct msg *msg;	/* [0] out, [1] in, [2] the last one in */
	struct ibv_mr *mmr;
};

static void mr_qp(struct mrconn *m, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 32, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	m->id = id;
	m->cq = ibv_create_cq(id->verbs, 64, NULL, NULL, 0);
	m->rcq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	if (!m->cq || !m->rcq)
		die("ibv_create_cq: %s", strerror(errno));
	attr.send_cq = m->cq;
	attr.recv_cq = m->rcq;
	if (rdma_create_qp(id, m->pd, &attr))
		die("rdma_create_qp: %s", strerror(errno));
	m->msg = aligned_alloc(4096, 4096);
	if (!m->msg)
		die("aligned_alloc");
	memset(m->msg, 0, 4096);
	m->mmr = ibv_reg_mr(m->pd, m->msg, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!m->mmr)
		die("ibv_reg_mr: %s", strerror(errno));
	if (post_recv(id->qp, &m->msg[1], sizeof(struct msg), m->mmr->lkey, 1))
		die("ibv_post_recv: %s", strerror(errno));
}

/* Sends m->msg[0] and waits for its completion; 0 or -1. */
static int mr_send(struct mrconn *m)
{
	struct ibv_wc wc;

	if (post_one(m->id->qp, 9, IBV_WR_SEND, &m->msg[0], sizeof(struct msg), m->mmr->lkey, 0, 0, 1, NULL))
		return -1;
	if (wait_wc(m->cq, &wc, TIMEOUT_MS) || wc.status != IBV_WC_SUCCESS || wc.wr_id != 9)
		return -1;
	return 0;
}

/* Waits for the next message (type want) and reposts the receive. */
static int mr_recv(struct mrconn *m, uint32_t want, int timeout_ms)
{
	struct ibv_wc wc;

	if (wait_wc(m->rcq, &wc, timeout_ms) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
		return -1;
	if (m->msg[1].magic != MAGIC || m->msg[1].type != want)
		return -1;
	m->msg[2] = m->msg[1];
	return post_recv(m->id->qp, &m->msg[1], sizeof(struct msg), m->mmr->lkey, 1) ? -1 : 0;
}

static void mr_teardown(struct mrconn *m)
{
	rdma_destroy_qp(m->id);
	ibv_destroy_cq(m->cq);
	ibv_destroy_cq(m->rcq);
	ibv_dereg_mr(m->mmr);
	free(m->msg);
}

static int run_mr_server(const char *addr, const char *port, uint64_t size)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP, .ai_flags = RAI_PASSIVE }, *res;
	struct rdma_conn_param cp = { .responder_resources = 4, .initiator_depth = 4 };
	struct mrconn m = { 0 };
	struct rdma_cm_id *listen;
	struct rdma_cm_event *ev;
	struct place places[8];
	struct ibv_mr *mr;
	uint8_t *buf;
	double t0, t_reg, t_check, t_dereg, t_unmap;
	int np, bad = 0;

	m.ch = rdma_create_event_channel();
	if (!m.ch || rdma_getaddrinfo(addr, port, &hints, &res))
		die("rdma_getaddrinfo %s %s: %s", addr, port, strerror(errno));
	if (rdma_create_id(m.ch, &listen, NULL, RDMA_PS_TCP) || rdma_bind_addr(listen, res->ai_src_addr))
		die("rdma_create_id/bind: %s", strerror(errno));
	if (!listen->verbs)
		die("%s is not the address of an RDMA device", addr);
	m.pd = ibv_alloc_pd(listen->verbs);
	if (!m.pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (buf == MAP_FAILED)
		die("mmap %" PRIu64 ": %s", size, strerror(errno));
	checkpoint("before registering %" PRIu64 " octets at %p", size, (void *)buf);
	t0 = now();
	mr = ibv_reg_mr(m.pd, buf, size,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	t_reg = now() - t0;
	if (!mr)
		die("ibv_reg_mr of %" PRIu64 " octets: %s", size, strerror(errno));
	checkpoint("registered %" PRIu64 " octets (%.0f MiB) in %.3f s, rkey %#x", size, size / 1048576.0, t_reg,
		   mr->rkey);
	np = mr_places(size, (uintptr_t)buf, places);
	if (rdma_listen(listen, 4))
		die("rdma_listen: %s", strerror(errno));
	printf("scale: server listening on %s port %s\n", addr, port);
	ev = next_cm_event(m.ch, 120000);
	if (!ev || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		die("expected a connect request got %s", ev ? rdma_event_str(ev->event) : "none");
	struct rdma_cm_id *id = ev->id;

	rdma_ack_cm_event(ev);
	mr_qp(&m, id);
	if (rdma_accept(id, &cp))
		die("rdma_accept: %s", strerror(errno));
	if (expect_cm_event(m.ch, RDMA_CM_EVENT_ESTABLISHED, TIMEOUT_MS))
		exit(1);
	m.msg[0] = (struct msg){ .magic = MAGIC, .type = MSG_KEYS, .addr = (uintptr_t)buf, .rkey = mr->rkey,
				 .size = size, .nplaces = (uint32_t)np };
	if (mr_send(&m))
		die("sending the keys failed");
	/* The client's check takes its time under TCG: no limit but the test's. */
	if (mr_recv(&m, MSG_DONE, 3600 * 1000))
		die("expected the client's \"done\" got none");
	if (m.msg[2].nplaces != (uint32_t)np)
		die("the client wrote %u places, expected %d", m.msg[2].nplaces, np);
	t0 = now();
	for (int p = 0; p < np; p++) {
		uint64_t off = places[p].off, lo = off >= MR_GUARD ? off - MR_GUARD : 0;
		uint64_t hi = off + MR_LEN + MR_GUARD <= size ? off + MR_LEN + MR_GUARD : size;
		uint64_t i;

		for (i = lo; i < hi; i++) {
			uint8_t want = i >= off && i < off + MR_LEN ? mr_pat(p, i - off) : 0;

			if (buf[i] != want) {
				fail("place %d (%s) at offset %#" PRIx64 ": octet %#" PRIx64 " is %#x, expected %#x", p,
				     places[p].what, off, i, buf[i], want);
				bad = 1;
				break;
			}
		}
		if (i == hi)
			printf("scale: place %d at offset %#" PRIx64 " (%s): %u octets and %" PRIu64
			       " around them as expected\n", p, off, places[p].what, MR_LEN, hi - lo - MR_LEN);
	}
	t_check = now() - t0;
	m.msg[0] = (struct msg){ .magic = MAGIC, .type = MSG_VERDICT, .status = (uint32_t)bad };
	if (mr_send(&m))
		die("sending the verdict failed");
	/* The client's out-of-bounds Read ends the connection. */
	ev = next_cm_event(m.ch, TIMEOUT_MS * 3);
	if (!ev)
		die("the connection did not end after the client's out-of-bounds Read");
	printf("scale: server: %s after the out-of-bounds Read\n", rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
	mr_teardown(&m);
	rdma_destroy_id(id);
	t0 = now();
	if (ibv_dereg_mr(mr))
		die("ibv_dereg_mr: %s", strerror(errno));
	t_dereg = now() - t0;
	checkpoint("deregistered in %.3f s", t_dereg);
	t0 = now();
	munmap(buf, size);
	t_unmap = now() - t0;
	checkpoint("unmapped in %.3f s", t_unmap);
	ibv_dealloc_pd(m.pd);
	rdma_destroy_id(listen);
	rdma_freeaddrinfo(res);
	rdma_destroy_event_channel(m.ch);
	printf("scale: mr %" PRIu64 " octets: reg %.3f s, server check %.3f s, dereg %.3f s, munmap %.3f s\n", size,
	       t_reg, t_check, t_dereg, t_unmap);
	if (!failed)
		printf("scale: PASS mr server: %" PRIu64 "-octet region, %d places of %u octets verified by the CPU\n",
		       size, np, MR_LEN);
	return failed != 0;
}

static int run_mr_client(const char *addr, const char *port)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct rdma_conn_param cp = { .responder_resources = 4, .initiator_depth = 4 };
	struct mrconn m = { 0 };
	struct place places[8];
	struct rdma_cm_id *id;
	struct ibv_mr *lmr;
	struct ibv_wc wc;
	uint8_t *src, *back;
	uint64_t size, base;
	uint32_t rkey;
	double t0, t_check;
	int np;

	m.ch = rdma_create_event_channel();
	if (!m.ch || rdma_getaddrinfo(addr, port, &hints, &res))
		die("rdma_getaddrinfo %s %s: %s", addr, port, strerror(errno));
	warm_address(m.ch, res->ai_dst_addr);
	if (rdma_create_id(m.ch, &id, NULL, RDMA_PS_TCP) || rdma_resolve_addr(id, NULL, res->ai_dst_addr, TIMEOUT_MS))
		die("rdma_resolve_addr: %s", strerror(errno));
	if (expect_cm_event(m.ch, RDMA_CM_EVENT_ADDR_RESOLVED, TIMEOUT_MS))
		exit(1);
	if (rdma_resolve_route(id, TIMEOUT_MS))
		die("rdma_resolve_route: %s", strerror(errno));
	if (expect_cm_event(m.ch, RDMA_CM_EVENT_ROUTE_RESOLVED, TIMEOUT_MS))
		exit(1);
	m.pd = ibv_alloc_pd(id->verbs);
	if (!m.pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	mr_qp(&m, id);
	src = aligned_alloc(4096, 2 * MR_LEN);
	if (!src)
		die("aligned_alloc");
	back = src + MR_LEN;
	lmr = ibv_reg_mr(m.pd, src, 2 * MR_LEN, IBV_ACCESS_LOCAL_WRITE);
	if (!lmr)
		die("ibv_reg_mr: %s", strerror(errno));
	if (rdma_connect(id, &cp))
		die("rdma_connect: %s", strerror(errno));
	if (expect_cm_event(m.ch, RDMA_CM_EVENT_ESTABLISHED, TIMEOUT_MS))
		exit(1);
	if (mr_recv(&m, MSG_KEYS, TIMEOUT_MS))
		die("expected the server's keys got none");
	size = m.msg[2].size;
	base = m.msg[2].addr;
	rkey = m.msg[2].rkey;
	np = mr_places(size, base, places);
	if ((uint32_t)np != m.msg[2].nplaces)
		die("%d places, the server has %u", np, m.msg[2].nplaces);
	printf("scale: client: region of %" PRIu64 " octets at %#" PRIx64 ", rkey %#x, %d places\n", size, base, rkey,
	       np);
	t0 = now();
	for (int p = 0; p < np; p++) {
		uint64_t raddr = base + places[p].off;
		uint64_t i;

		for (i = 0; i < MR_LEN; i++) {
			src[i] = mr_pat(p, i);
			back[i] = (uint8_t)~mr_pat(p, i);
		}
		/* Write then Read back; the Read completes after the Write is placed. */
		struct ibv_sge rs = { .addr = (uintptr_t)back, .length = MR_LEN, .lkey = lmr->lkey };
		struct ibv_send_wr rd = { .wr_id = 20 + p, .sg_list = &rs, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
					  .send_flags = IBV_SEND_SIGNALED };

		rd.wr.rdma.remote_addr = raddr;
		rd.wr.rdma.rkey = rkey;
		if (post_one(id->qp, 10 + p, IBV_WR_RDMA_WRITE, src, MR_LEN, lmr->lkey, raddr, rkey, 1, &rd))
			die("place %d: ibv_post_send: %s", p, strerror(errno));
		for (int w = 0; w < 2; w++) {
			if (wait_wc(m.cq, &wc, 600 * 1000))
				die("place %d (%s): no completion", p, places[p].what);
			if (wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)(w ? 20 + p : 10 + p))
				die("place %d (%s) at offset %#" PRIx64 ": completion %" PRIu64 " %s", p, places[p].what,
				    places[p].off, wc.wr_id, ibv_wc_status_str(wc.status));
		}
		for (i = 0; i < MR_LEN; i++)
			if (back[i] != mr_pat(p, i))
				break;
		if (i < MR_LEN)
			fail("place %d (%s) at offset %#" PRIx64 ": read back octet %" PRIu64 " = %#x, expected %#x", p,
			     places[p].what, places[p].off, i, back[i], mr_pat(p, i));
		else
			printf("scale: place %d at offset %#" PRIx64 " (%s): %u octets written and read back\n", p,
			       places[p].off, places[p].what, MR_LEN);
	}
	t_check = now() - t0;
	m.msg[0] = (struct msg){ .magic = MAGIC, .type = MSG_DONE, .nplaces = (uint32_t)np };
	if (mr_send(&m))
		die("sending \"done\" failed");
	if (mr_recv(&m, MSG_VERDICT, 3600 * 1000))
		die("expected the server's verdict got none");
	if (m.msg[2].status)
		fail("the server found a place not as written");
	/* One octet past the end: refused. */
	if (post_one(id->qp, 30, IBV_WR_RDMA_READ, back, 16, lmr->lkey, base + size - 15, rkey, 1, NULL))
		die("ibv_post_send: %s", strerror(errno));
	if (wait_wc(m.cq, &wc, TIMEOUT_MS))
		die("the out-of-bounds Read did not complete");
	if (wc.wr_id != 30 || wc.status != IBV_WC_REM_ACCESS_ERR)
		fail("the Read of the last 15 octets and one past the end: completion %" PRIu64 " %s, expected "
		     "IBV_WC_REM_ACCESS_ERR", wc.wr_id, ibv_wc_status_str(wc.status));
	else
		printf("scale: a Read ending one octet past the region: IBV_WC_REM_ACCESS_ERR\n");
	rdma_disconnect(id);
	mr_teardown(&m);
	ibv_dereg_mr(lmr);
	free(src);
	ibv_dealloc_pd(m.pd);
	rdma_destroy_id(id);
	rdma_freeaddrinfo(res);
	rdma_destroy_event_channel(m.ch);
	printf("scale: mr client check: %d places of %u octets written and read back in %.3f s\n", np, MR_LEN,
	       t_check);
	if (!failed)
		printf("scale: PASS mr client: %" PRIu64 "-octet region, %d places verified, past-end Read refused\n",
		       size, np);
	return failed != 0;
}

/* ------------------------------------------------------------------ */
/* regs */

static int run_regs(const char *devname, uint64_t count, uint64_t size, uint32_t window, uint64_t batch)
{
	struct ibv_device **list = ibv_get_device_list(NULL), *dev = NULL;
	struct ibv_context *ctx;
	struct ibv_mr **live;
	struct ibv_pd *pd;
	uint8_t *buf;
	uint64_t regs = 0, deregs = 0, head = 0, nlive = 0;
	double t0, tb, first = 0, last = 0;
	long free0, sun0;

	if (!list)
		die("ibv_get_device_list: %s", strerror(errno));
	for (int i = 0; list[i]; i++)
		if (!devname || !strcmp(ibv_get_device_name(list[i]), devname)) {
			dev = list[i];
			break;
		}
	if (!dev)
		die("no RDMA device %s", devname ? devname : "at all");
	ctx = ibv_open_device(dev);
	if (!ctx)
		die("ibv_open_device: %s", strerror(errno));
	pd = ibv_alloc_pd(ctx);
	buf = aligned_alloc(4096, (size + 4095) & ~4095ull);
	live = calloc(window, sizeof(*live));
	if (!pd || !buf || !live)
		die("setup: %s", strerror(errno));
	memset(buf, 0x5a, size);
	free0 = meminfo("MemFree");
	sun0 = meminfo("SUnreclaim");
	checkpoint("%s: %" PRIu64 " registrations of %" PRIu64 " octets, %u live at most, before",
		   ibv_get_device_name(dev), count, size, window);
	t0 = tb = now();
	for (uint64_t c = 0; c < count; c++) {
		struct ibv_mr *mr;

		if (nlive == window) {
			if (ibv_dereg_mr(live[head]))
				die("cycle %" PRIu64 ": ibv_dereg_mr: %s", c, strerror(errno));
			deregs++;
			nlive--;
		}
		mr = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!mr)
			die("cycle %" PRIu64 ": ibv_reg_mr: %s (%" PRIu64 " registered, %" PRIu64 " live)", c,
			    strerror(errno), regs, nlive);
		regs++;
		for (uint64_t j = 0; j < nlive; j++) {
			struct ibv_mr *o = live[(head + window - nlive + j) % window];

			if (o && (o->lkey == mr->lkey || o->rkey == mr->rkey))
				die("cycle %" PRIu64 ": key %#x of a new region is still live", c, mr->lkey);
		}
		live[head] = mr;
		head = (head + 1) % window;
		nlive++;
		if ((c + 1) % batch == 0 || c + 1 == count) {
			double t = now() - tb;
			uint64_t inb = (c + 1) % batch ? (c + 1) % batch : batch;

			if (!first)
				first = t / inb;
			last = t / inb;
			checkpoint("%" PRIu64 " cycles, batch of %" PRIu64 " in %.3f s (%.1f us each)", c + 1, inb, t,
				   t / inb * 1e6);
			tb = now();
		}
	}
	/* The live ones, oldest first. */
	for (uint64_t j = 0; j < window; j++) {
		struct ibv_mr *o = live[(head + j) % window];

		if (o) {
			if (ibv_dereg_mr(o))
				die("ibv_dereg_mr: %s", strerror(errno));
			deregs++;
		}
	}
	double total = now() - t0;

	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(live);
	free(buf);
	sleep(1);
	checkpoint("after (MemFree %+ld kB, SUnreclaim %+ld kB)", meminfo("MemFree") - free0,
		   meminfo("SUnreclaim") - sun0);
	printf("scale: regs: %" PRIu64 " registrations and %" PRIu64 " deregistrations of %" PRIu64
	       " octets in %.2f s (%.1f us per cycle; first batch %.1f us, last %.1f us per cycle)\n",
	       regs, deregs, size, total, total / count * 1e6, first * 1e6, last * 1e6);
	if (regs != count || deregs != count)
		fail("%" PRIu64 " registrations and %" PRIu64 " deregistrations, expected %" PRIu64 " each", regs,
		     deregs, count);
	if (!failed)
		printf("scale: PASS regs: %" PRIu64 " registrations and deregistrations, keys of live regions distinct\n",
		       count);
	return failed != 0;
}

/* ------------------------------------------------------------------ */

static void usage(void)
{
	fprintf(stderr, "usage: scale qps --server|--client ADDR PORT N\n"
			"       scale mr --server ADDR PORT --size BYTES | scale mr --client ADDR PORT\n"
			"       scale regs --count N --size BYTES [--window W] [--batch B] [--dev NAME]\n");
	exit(2);
}

static uint64_t num(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 0);

	if (*end == 'K' || *end == 'k')
		v <<= 10, end++;
	else if (*end == 'M' || *end == 'm')
		v <<= 20, end++;
	else if (*end == 'G' || *end == 'g')
		v <<= 30, end++;
	if (*end)
		usage();
	return v;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	t_start = now();
	if (argc < 2)
		usage();
	if (!strcmp(argv[1], "qps")) {
		if (argc != 6 || (strcmp(argv[2], "--server") && strcmp(argv[2], "--client")))
			usage();
		int server = !strcmp(argv[2], "--server");

		side = server ? "qps server" : "qps client";
		uint64_t n = num(argv[5]);

		if (n == 0 || n > 100000)
			usage();
		return run_qps(server, argv[3], argv[4], (uint32_t)n);
	}
	if (!strcmp(argv[1], "mr")) {
		if (argc == 7 && !strcmp(argv[2], "--server") && !strcmp(argv[5], "--size")) {
			side = "mr server";
			return run_mr_server(argv[3], argv[4], num(argv[6]));
		}
		if (argc == 5 && !strcmp(argv[2], "--client")) {
			side = "mr client";
			return run_mr_client(argv[3], argv[4]);
		}
		usage();
	}
	if (!strcmp(argv[1], "regs")) {
		uint64_t count = 0, size = 0, batch = 10000;
		uint32_t window = 1;
		const char *dev = NULL;

		side = "regs";
		for (int i = 2; i + 1 < argc; i += 2) {
			if (!strcmp(argv[i], "--count"))
				count = num(argv[i + 1]);
			else if (!strcmp(argv[i], "--size"))
				size = num(argv[i + 1]);
			else if (!strcmp(argv[i], "--window"))
				window = (uint32_t)num(argv[i + 1]);
			else if (!strcmp(argv[i], "--batch"))
				batch = num(argv[i + 1]);
			else if (!strcmp(argv[i], "--dev"))
				dev = argv[i + 1];
			else
				usage();
		}
		if (argc % 2 || !count || !size || !window || !batch)
			usage();
		return run_regs(dev, count, size, window, batch);
	}
	usage();
	return 2;
}
