// SPDX-License-Identifier: GPL-2.0
/*
 * inline-verify: inline sends (IBV_SEND_INLINE) through the verbs API, every
 * octet checked. For the siw_rs VM tests.
 *
 *   inline-verify server ADDR PORT
 *   inline-verify client ADDR PORT
 *   inline-verify client-sge ADDR PORT
 *
 * Once connected, the client sends a hello, and the server answers with the
 * key of its target region (vmtest-cm.h). Inline data is copied when the
 * work request is posted: the client gathers
 * each message from up to three unregistered buffers (lkey 0) and overwrites
 * them as soon as ibv_post_send returns. Its send queue is 8 deep, so the
 * queue's slots are reused many times over while earlier messages are still
 * in flight.
 *   - N_SEND Sends of 0 to 256 octets (every length), each a pattern of its
 *     index; the server checks length, content and order of every receive;
 *   - N_WRITE RDMA Writes of 1 to 256 octets into slots of the server's
 *     region, then a Send "done"; the server checks every slot, and that
 *     nothing was written past a Write;
 *   - a 257-octet inline post fails with EINVAL and the QP carries on: the
 *     Send after it arrives intact.
 * The client checks each signalled completion's wr_id and status.
 *
 * client-sge posts the same messages without IBV_SEND_INLINE, from up to
 * three SGEs of a registered region (one set of buffers per send queue slot,
 * reused only once the slot's request is known complete), and skips the
 * refused post (257 octets are a valid non-inline Send): the server checks
 * the same things. siw_rs copies such small payloads when it sends them, so
 * this covers that path. It then reads every Write back with N_WRITE RDMA
 * Reads at an ORD of 1, queued SQ_DEPTH deep (each waits in the send queue
 * until the response before it is in), and checks every octet and that
 * nothing landed past a Read; its last Send is fenced behind them.
 * Exit status 0 only if everything held.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define VMTEST_NAME "inline-verify"
#include "vmtest-cm.h"

#define N_SEND 600
#define N_WRITE 64
#define SLOT 256
#define MAX_INLINE 256
#define SQ_DEPTH 8
#define SIGNAL_EVERY 4
/* Receives: the Sends, "done", and the Send after the refused post. */
#define N_RECV (N_SEND + 2)

/* client-sge: the registered buffers, SQ_DEPTH slots of three. */
static int registered;
static uint8_t *sge_buf;
static struct ibv_mr *sge_mr;
/* client-sge: where the Reads land, N_WRITE slots. */
static uint8_t *sink;
static struct ibv_mr *sink_mr;
#define SGE_BUF_LEN (MAX_INLINE + 1)


static uint8_t pattern(int msg, int i)
{
	return (uint8_t)(msg * 37 + i * 13 + 5);
}

/* Send i carries i % 257 octets: every length from 0 to 256, twice over. */
static int send_len(int i)
{
	return i % (MAX_INLINE + 1);
}

static int write_len(int i)
{
	return 1 + (i * 61) % MAX_INLINE;
}

/* Checks the N_WRITE slots at `base`: slot i holds Write i's pattern, and
 * past it the `fill` it had before; `what` names the operation. */
static int check_slots(const uint8_t *base, uint8_t fill, const char *what)
{
	for (int i = 0; i < N_WRITE; i++) {
		const uint8_t *p = base + (size_t)i * SLOT;

		for (int k = 0; k < write_len(i); k++)
			if (p[k] != pattern(1000 + i, k))
				return bad("%s %d octet %d: %#x, want %#x", what, i, k, p[k], pattern(1000 + i, k));
		for (int k = write_len(i); k < SLOT; k++)
			if (p[k] != fill)
				return bad("%s %d: octet %d written past its %d", what, i, k, write_len(i));
	}
	return 0;
}

static int run_server(struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 4, .max_recv_wr = N_RECV + 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	struct rdma_cm_id *listen_id, *id;
	uint8_t *rbuf = aligned_alloc(4096, (size_t)N_RECV * SLOT);
	uint8_t *target = aligned_alloc(4096, (size_t)N_WRITE * SLOT);
	struct target_key *keys = aligned_alloc(64, 64);
	struct ibv_mr *rmr, *tmr, *kmr;
	struct ibv_wc wc;
	int i;

	if (!rbuf || !target || !keys)
		return fail("aligned_alloc");
	memset(rbuf, 0xa5, (size_t)N_RECV * SLOT);
	memset(target, 0, (size_t)N_WRITE * SLOT);
	if (cm_first_request(res, &attr, &listen_id, &id))
		return 1;
	rmr = ibv_reg_mr(id->pd, rbuf, (size_t)N_RECV * SLOT, IBV_ACCESS_LOCAL_WRITE);
	tmr = ibv_reg_mr(id->pd, target, (size_t)N_WRITE * SLOT,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	kmr = ibv_reg_mr(id->pd, keys, 64, IBV_ACCESS_LOCAL_WRITE);
	if (!rmr || !tmr || !kmr)
		return fail("ibv_reg_mr");
	if (cm_post_hello(id, keys, kmr->lkey))
		return fail("ibv_post_recv hello");
	for (i = 0; i < N_RECV; i++)
		if (post_recv(id->qp, rbuf + (size_t)i * SLOT, SLOT, rmr->lkey, i))
			return fail("ibv_post_recv");
	if (cm_accept_sending_key(id, keys, target, tmr->rkey, kmr->lkey))
		return 1;

	for (i = 0; i < N_SEND; i++) {
		const uint8_t *p = rbuf + (size_t)i * SLOT;

		if (wait_wc(id->recv_cq, &wc))
			return fail("receive");
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
			return bad("receive %d: status %s opcode %d", i, ibv_wc_status_str(wc.status), wc.opcode);
		if (wc.wr_id != (uint64_t)i || wc.byte_len != (uint32_t)send_len(i))
			return bad("receive %d: wr_id %" PRIu64 " byte_len %u (want %d)", i, wc.wr_id,
				   wc.byte_len, send_len(i));
		for (int k = 0; k < send_len(i); k++)
			if (p[k] != pattern(i, k))
				return bad("send %d octet %d: %#x, want %#x", i, k, p[k], pattern(i, k));
		for (int k = send_len(i); k < SLOT; k++)
			if (p[k] != 0xa5)
				return bad("send %d: octet %d written past its %d", i, k, send_len(i));
	}
	printf("inline-verify: server: %d Sends of 0-%d octets verified\n", N_SEND, MAX_INLINE);

	/* "done": the Writes before it are placed. */
	if (wait_wc(id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV ||
	    wc.byte_len != 4 || memcmp(rbuf + (size_t)N_SEND * SLOT, "done", 4))
		return bad("no \"done\" Send after the Writes");
	if (check_slots(target, 0, "write"))
		return 1;
	printf("inline-verify: server: %d RDMA Writes of 1-%d octets verified\n", N_WRITE, MAX_INLINE);

	/* The Send after the client's refused post. */
	if (wait_wc(id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS || wc.byte_len != MAX_INLINE)
		return bad("no Send after the refused post");
	for (int k = 0; k < MAX_INLINE; k++)
		if (rbuf[(size_t)(N_SEND + 1) * SLOT + k] != pattern(2000, k))
			return bad("the Send after the refused post differs at octet %d", k);
	printf("inline-verify: server: the last %d-octet Send verified\n", MAX_INLINE);
	rdma_disconnect(id);
	ibv_dereg_mr(rmr);
	ibv_dereg_mr(tmr);
	ibv_dereg_mr(kmr);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	return 0;
}

/* Client state: posted and completed counts of the send queue. */
struct sq {
	struct rdma_cm_id *id;
	int posted;	/* work requests posted */
	int done;	/* work requests known complete */
};

/* Waits for the next signalled completion, which must be wr_id
 * `sq->done + SIGNAL_EVERY - 1` (the last of its group), or of the final
 * request when `last` is set. */
static int reap(struct sq *sq, int last)
{
	struct ibv_wc wc;
	int want = last ? sq->posted - 1 : sq->done + SIGNAL_EVERY - 1;

	if (wait_wc(sq->id->send_cq, &wc))
		return fail("send completion");
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)want)
		return bad("send completion: wr_id %" PRIu64 " (want %d) status %s", wc.wr_id, want,
			   ibv_wc_status_str(wc.status));
	sq->done = want + 1;
	return 0;
}

/* Reaps every completion still due, the forced one of the last request
 * included. */
static int drain(struct sq *sq)
{
	while (sq->done + SIGNAL_EVERY - 1 < sq->posted - 1)
		if (reap(sq, 0))
			return 1;
	return reap(sq, 1);
}

/* Posts message `msg` of `len` octets inline: gathered from up to three
 * unregistered buffers, which are overwritten once the post returns. With
 * client-sge, not inline: from the three registered buffers of its send
 * queue slot, left alone until the request completes. `force_signal`: 1
 * signals the request whatever its place, 2 also fences it. */
static int post_inline(struct sq *sq, enum ibv_wr_opcode op, int msg, int len, uint64_t raddr, uint32_t rkey,
		       int force_signal)
{
	static uint8_t a[MAX_INLINE + 1], b[MAX_INLINE + 1], c[MAX_INLINE + 1];
	uint8_t *bufs[3] = { a, b, c };
	uint32_t lkey = 0;
	struct ibv_sge sge[3];
	int nsge = 1 + msg % 3, off = 0, rc;
	struct ibv_send_wr wr = { .wr_id = sq->posted, .sg_list = sge, .opcode = op }, *badwr;

	if (registered) {
		for (int s = 0; s < 3; s++)
			bufs[s] = sge_buf + ((size_t)(sq->posted % SQ_DEPTH) * 3 + s) * SGE_BUF_LEN;
		lkey = sge_mr->lkey;
	}
	if (len < nsge)
		nsge = len ? len : 1;
	for (int s = 0; s < nsge; s++) {
		int n = s == nsge - 1 ? len - off : len / nsge;

		for (int k = 0; k < n; k++)
			bufs[s][k] = pattern(msg, off + k);
		sge[s] = (struct ibv_sge){ .addr = (uintptr_t)bufs[s], .length = n, .lkey = lkey };
		off += n;
	}
	wr.num_sge = nsge;
	wr.send_flags = registered ? 0 : IBV_SEND_INLINE;
	if (force_signal || sq->posted % SIGNAL_EVERY == SIGNAL_EVERY - 1)
		wr.send_flags |= IBV_SEND_SIGNALED;
	if (force_signal & 2)
		wr.send_flags |= IBV_SEND_FENCE;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	rc = ibv_post_send(sq->id->qp, &wr, &badwr);
	/* Inline: the buffers are ours again. */
	if (!registered) {
		memset(a, 0xee, sizeof(a));
		memset(b, 0xee, sizeof(b));
		memset(c, 0xee, sizeof(c));
	}
	if (rc)
		return rc;
	sq->posted++;
	return 0;
}

/* Posts one message, first reaping a completion if the queue is full. */
static int post_one(struct sq *sq, enum ibv_wr_opcode op, int msg, int len, uint64_t raddr, uint32_t rkey)
{
	int rc;

	if (sq->posted - sq->done >= SQ_DEPTH && reap(sq, 0))
		return 1;
	rc = post_inline(sq, op, msg, len, raddr, rkey, 0);
	if (rc) {
		errno = rc;
		return fail("ibv_post_send inline");
	}
	return 0;
}

/* Posts an RDMA Read of Write `i`'s slot back into slot `i` of the sink,
 * first reaping a completion if the queue is full. The Reads start on an
 * empty queue at wr_id `base`; every SIGNAL_EVERY-th from there is
 * signalled, as reap() expects. */
static int post_read(struct sq *sq, int i, struct target_key *keys, int base)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(sink + (size_t)i * SLOT), .length = write_len(i),
			       .lkey = sink_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = sq->posted, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_READ }, *badwr;
	int rc;

	if (sq->posted - sq->done >= SQ_DEPTH && reap(sq, 0))
		return 1;
	if ((sq->posted - base) % SIGNAL_EVERY == SIGNAL_EVERY - 1)
		wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = keys->addr + (uint64_t)i * SLOT;
	wr.wr.rdma.rkey = keys->rkey;
	rc = ibv_post_send(sq->id->qp, &wr, &badwr);
	if (rc) {
		errno = rc;
		return fail("ibv_post_send read");
	}
	sq->posted++;
	return 0;
}

static int run_client(struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = 2, .max_send_sge = 3,
			 .max_recv_sge = 1, .max_inline_data = MAX_INLINE },
		.sq_sig_all = 0,
	};
	struct target_key *keys = aligned_alloc(64, 64);
	struct ibv_qp_init_attr got;
	struct ibv_qp_attr qattr;
	struct ibv_mr *kmr;
	struct ibv_wc wc;
	struct sq sq = { 0 };
	int i, rc;

	if (!keys)
		return fail("aligned_alloc");
	if (rdma_create_ep(&sq.id, res, NULL, &attr))
		return fail("rdma_create_ep");
	if (ibv_query_qp(sq.id->qp, &qattr, IBV_QP_CAP, &got))
		return fail("ibv_query_qp");
	if (got.cap.max_inline_data < MAX_INLINE)
		return bad("QP grants %u inline octets, want %d", got.cap.max_inline_data, MAX_INLINE);
	kmr = ibv_reg_mr(sq.id->pd, keys, 64, IBV_ACCESS_LOCAL_WRITE);
	if (!kmr)
		return fail("ibv_reg_mr");
	if (registered) {
		size_t n = (size_t)SQ_DEPTH * 3 * SGE_BUF_LEN;

		sge_buf = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
		if (!sge_buf)
			return fail("aligned_alloc");
		sge_mr = ibv_reg_mr(sq.id->pd, sge_buf, n, IBV_ACCESS_LOCAL_WRITE);
		sink = aligned_alloc(4096, (size_t)N_WRITE * SLOT);
		if (!sge_mr || !sink)
			return fail("ibv_reg_mr");
		memset(sink, 0x5a, (size_t)N_WRITE * SLOT);
		sink_mr = ibv_reg_mr(sq.id->pd, sink, (size_t)N_WRITE * SLOT, IBV_ACCESS_LOCAL_WRITE);
		if (!sink_mr)
			return fail("ibv_reg_mr");
	}
	if (post_recv(sq.id->qp, keys, 64, kmr->lkey, 1))
		return fail("ibv_post_recv");
	{
		/* An ORD of 1: the Reads of client-sge wait their turn. */
		struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };

		if (cm_connect_hello(sq.id, &cp))
			return 1;
	}
	if (wait_wc(sq.id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS)
		return bad("no keys from the server");

	for (i = 0; i < N_SEND; i++)
		if (post_one(&sq, IBV_WR_SEND, i, send_len(i), 0, 0))
			return 1;
	for (i = 0; i < N_WRITE; i++)
		if (post_one(&sq, IBV_WR_RDMA_WRITE, 1000 + i, write_len(i),
			     keys->addr + (uint64_t)i * SLOT, keys->rkey))
			return 1;
	/* "done", signalled: everything before it completed in order. */
	{
		static const char done[] = "done";
		struct ibv_sge sge = { .addr = (uintptr_t)done, .length = 4, .lkey = 0 };
		struct ibv_send_wr wr = { .wr_id = 0, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED }, *badwr;

		while (sq.posted - sq.done >= SQ_DEPTH)
			if (reap(&sq, 0))
				return 1;
		wr.wr_id = sq.posted;
		if (ibv_post_send(sq.id->qp, &wr, &badwr))
			return fail("ibv_post_send done");
		sq.posted++;
		if (drain(&sq))
			return 1;
	}
	printf("inline-verify: client: %d %s work requests completed in order\n", sq.posted,
	       registered ? "registered-memory" : "inline");

	if (registered) {
		int base = sq.posted;

		for (i = 0; i < N_WRITE; i++)
			if (post_read(&sq, i, keys, base))
				return 1;
		if (drain(&sq))
			return 1;
		if (check_slots(sink, 0x5a, "read"))
			return 1;
		printf("inline-verify: client: %d RDMA Reads of 1-%d octets at ORD 1 verified\n", N_WRITE,
		       MAX_INLINE);
		/* Fenced: sent only once no Read is outstanding. */
		if (post_inline(&sq, IBV_WR_SEND, 2000, MAX_INLINE, 0, 0, 1 | 2) || drain(&sq))
			return bad("the last Send failed");
		rdma_disconnect(sq.id);
		ibv_dereg_mr(sge_mr);
		ibv_dereg_mr(sink_mr);
		ibv_dereg_mr(kmr);
		rdma_destroy_ep(sq.id);
		return 0;
	}
	/* One octet over the limit: refused at the post, nothing queued. */
	rc = post_inline(&sq, IBV_WR_SEND, 2000, MAX_INLINE + 1, 0, 0, 1);
	if (rc != EINVAL)
		return bad("a %d-octet inline post returned %d (%s), want EINVAL", MAX_INLINE + 1, rc,
			   strerror(rc));
	if (post_inline(&sq, IBV_WR_SEND, 2000, MAX_INLINE, 0, 0, 1) || drain(&sq))
		return bad("the Send after the refused post failed");
	printf("inline-verify: client: a %d-octet inline post failed with EINVAL; the QP carries on\n",
	       MAX_INLINE + 1);
	rdma_disconnect(sq.id);
	ibv_dereg_mr(kmr);
	rdma_destroy_ep(sq.id);
	return 0;
}

int main(int argc, char **argv)
{
	static const char *const roles[] = { "server", "client", "client-sge", NULL };
	struct rdma_addrinfo *res;
	int role = cm_args(argc, argv, roles, &res);

	registered = role == 2;
	return role == 0 ? run_server(res) : run_client(res);
}
