// SPDX-License-Identifier: GPL-2.0
/*
 * zcopy-verify: large Sends and RDMA Writes from registered memory, every
 * octet checked, the sender reusing each buffer as soon as its request is
 * known complete. For the siw_rs VM tests (siw_rs sends such messages by
 * reference, "zero-copy", and completes them once the network stack has
 * released their pages).
 *
 *   zcopy-verify server ADDR PORT
 *   zcopy-verify client ADDR PORT
 *
 * Once connected, the client sends a hello, and the server answers with
 * the key of its target region (vmtest-cm.h). The client's send queue is
 * SQ_DEPTH deep; every signal_every-th request
 * is signalled. Each request takes the buffer of its send queue slot,
 * filled with its message's pattern at a varying, often odd, offset, and
 * gathered from one to three SGEs. When a signalled completion arrives,
 * the buffers of every request it covers are overwritten at once (0xee):
 * a request completed while its pages were still to be sent (or sent
 * again, after a loss) would reach the server with 0xee in it.
 *   - n_send Sends of 16 KiB to 1 MiB (odd lengths among them); the server
 *     checks length, content and order of every receive, and that nothing
 *     landed past one;
 *   - n_write RDMA Writes of the same sizes into areas of the server's
 *     region, then a Send "done"; the server checks every area and the
 *     guard octets after it;
 *   - n_read RDMA Reads of the first of those areas back into the client's
 *     buffers (whose responses siw_rs sends by reference too), one at a
 *     time, each checked octet by octet and for nothing placed past it;
 *     the server disconnects once the client's Send "read" says it is
 *     through.
 * The client checks each signalled completion's wr_id and status and
 * prints how many messages were at least 16 KiB (what siw_rs sends by
 * reference). Exit status 0 only if everything held.
 *
 * With ZCOPY_VERIFY_SHORT=1 in the environment of both ends, 12 of each
 * kind (the two-VM test over a NIC, where the debug kernel carries less
 * than 1 MB/s). With ZCOPY_VERIFY_SIGNAL_ALL=1 the client signals every
 * request: upstream siw sends an unsignalled request of a page or more by
 * reference and completes it when the socket takes it, so over a NIC a
 * buffer reused after a later completion reaches the peer overwritten
 * (test_67 saw it; the client on siw needs this).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define VMTEST_NAME "zcopy-verify"
#include "vmtest-cm.h"

/* How many of each kind (ZCOPY_VERIFY_SHORT: see above). */
static int n_send = 48, n_write = 24, n_read = 12;
#define SQ_DEPTH 8
/* Every how many requests one is signalled (ZCOPY_VERIFY_SIGNAL_ALL: 1). */
static int signal_every = 2;
#define MAX_MSG (1 << 20)
/* A slot: the largest message at the largest offset. */
#define SLOT (MAX_MSG + 8192)
#define GUARD 64
#define FILL 0xa5


static uint8_t pattern(int msg, size_t i)
{
	return (uint8_t)(msg * 41 + i * 7 + (i >> 12) * 3 + 11);
}

/* Message lengths: 16 KiB exactly, odd ones, a page and a bit, 1 MiB. */
static size_t msg_len(int i)
{
	static const size_t lens[] = { 16384, 65536, 16385, 200003, 4096 * 5 + 1, MAX_MSG, 65536 + 13, 131072,
				       40000, 1048575 };

	return lens[i % (int)(sizeof(lens) / sizeof(lens[0]))];
}

/* Where in its slot a message starts. */
static size_t msg_off(int i)
{
	static const size_t offs[] = { 0, 1, 4095, 2048, 7, 4096 };

	return offs[i % (int)(sizeof(offs) / sizeof(offs[0]))];
}

/* Where message i lands at the server: its own area, guard octets after
 * it. */
static size_t area_off(int i)
{
	size_t off = 0;

	for (int k = 0; k < i; k++)
		off += (msg_len(k) + GUARD + 4095) / 4096 * 4096;
	return off;
}

static int check_area(const uint8_t *p, int msg, const char *what, int i)
{
	size_t len = msg_len(i);

	for (size_t k = 0; k < len; k++)
		if (p[k] != pattern(msg, k))
			return bad("%s %d (%zu octets) octet %zu: %#x, want %#x", what, i, len, k, p[k],
				   pattern(msg, k));
	for (size_t k = len; k < len + GUARD; k++)
		if (p[k] != FILL)
			return bad("%s %d: octet %zu written past its %zu", what, i, k, len);
	return 0;
}

static int run_server(struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 4, .max_recv_wr = n_send + 3, .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	size_t rlen = area_off(n_send) + 8192, tlen = area_off(n_write);
	uint8_t *rbuf = aligned_alloc(4096, rlen);
	uint8_t *target = aligned_alloc(4096, tlen);
	struct target_key *keys = aligned_alloc(64, 64);
	struct rdma_cm_id *listen_id, *id;
	struct ibv_mr *rmr, *tmr, *kmr;
	struct ibv_wc wc;
	int i, rc;

	if (!rbuf || !target || !keys)
		return fail("aligned_alloc");
	memset(rbuf, FILL, rlen);
	memset(target, FILL, tlen);
	if (cm_first_request(res, &attr, &listen_id, &id))
		return 1;
	rmr = ibv_reg_mr(id->pd, rbuf, rlen, IBV_ACCESS_LOCAL_WRITE);
	tmr = ibv_reg_mr(id->pd, target, tlen,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	kmr = ibv_reg_mr(id->pd, keys, 64, IBV_ACCESS_LOCAL_WRITE);
	if (!rmr || !tmr || !kmr)
		return fail("ibv_reg_mr");
	if (cm_post_hello(id, keys, kmr->lkey))
		return fail("ibv_post_recv hello");
	for (i = 0; i <= n_send + 1; i++) {
		/* Each receive is exactly as long as its message, but the
		 * last two ("done", "read"), which have room to spare. */
		size_t len = i < n_send ? msg_len(i) : 64;
		size_t at = i <= n_send ? area_off(i) : area_off(n_send) + 4096;

		if (post_recv(id->qp, rbuf + at, (uint32_t)len, rmr->lkey, i))
			return fail("ibv_post_recv");
	}
	if (cm_accept_sending_key(id, keys, target, tmr->rkey, kmr->lkey))
		return 1;

	for (i = 0; i < n_send; i++) {
		if (wait_wc(id->recv_cq, &wc))
			return fail("receive");
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
			return bad("receive %d: status %s opcode %d", i, ibv_wc_status_str(wc.status), wc.opcode);
		if (wc.wr_id != (uint64_t)i || wc.byte_len != msg_len(i))
			return bad("receive %d: wr_id %" PRIu64 " byte_len %u (want %zu)", i, wc.wr_id, wc.byte_len,
				   msg_len(i));
		if (check_area(rbuf + area_off(i), i, "send", i))
			return 1;
	}
	printf("zcopy-verify: server: %d Sends of 16 KiB-1 MiB verified\n", n_send);

	if (wait_wc(id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV ||
	    wc.byte_len != 4 || memcmp(rbuf + area_off(n_send), "done", 4))
		return bad("no \"done\" Send after the Writes");
	for (i = 0; i < n_write; i++)
		if (check_area(target + area_off(i), 1000 + i, "write", i))
			return 1;
	printf("zcopy-verify: server: %d RDMA Writes of 16 KiB-1 MiB verified\n", n_write);
	/* "read": the client's Reads are through. They take the server no
	 * receive completion, and under loss on the debug kernel the twelve
	 * of up to 1 MiB, one at a time, took longer than one wait_wc()
	 * (10 s): wait up to 2 minutes in all. */
	for (int t = 0; (rc = wait_wc(id->recv_cq, &wc)) && errno == ETIMEDOUT && t < 11; t++)
		;
	if (rc || wc.status != IBV_WC_SUCCESS || wc.byte_len != 4 ||
	    memcmp(rbuf + area_off(n_send) + 4096, "read", 4))
		return bad("no \"read\" Send after the Reads (%s)",
			   rc ? strerror(errno) : ibv_wc_status_str(wc.status));
	rdma_disconnect(id);
	ibv_dereg_mr(rmr);
	ibv_dereg_mr(tmr);
	ibv_dereg_mr(kmr);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	return 0;
}

/* Client state. */
static uint8_t *slots, *rsink;
static struct ibv_mr *slots_mr, *rsink_mr;
static struct rdma_cm_id *cid;
static int posted, done;
/* The message each slot's request carries, for the overwrite. */
static int slot_msg[SQ_DEPTH];

/* The buffers of requests `from`..`to - 1` are the client's again:
 * overwritten at once. */
static void reuse(int from, int to)
{
	for (int r = from; r < to; r++) {
		int s = r % SQ_DEPTH;

		memset(slots + (size_t)s * SLOT, 0xee, SLOT);
		slot_msg[s] = -1;
	}
}

/* Waits for the next signalled completion, which must be request `want`,
 * and reuses the buffers of every request up to it. */
static int reap(int want)
{
	struct ibv_wc wc;

	if (wait_wc(cid->send_cq, &wc))
		return fail("send completion");
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)want)
		return bad("send completion: wr_id %" PRIu64 " (want %d) status %s", wc.wr_id, want,
			   ibv_wc_status_str(wc.status));
	reuse(done, want + 1);
	done = want + 1;
	return 0;
}

/* Posts request `posted` for message `msg` (index `i` of its kind),
 * first reaping completions until its slot is free. */
static int post(enum ibv_wr_opcode op, int msg, int i, uint64_t raddr, uint32_t rkey, int last)
{
	size_t len = msg_len(i), off = msg_off(i);
	int s = posted % SQ_DEPTH, nsge = 1 + msg % 3;
	uint8_t *buf = slots + (size_t)s * SLOT + off;
	struct ibv_sge sge[3];
	struct ibv_send_wr wr = { .wr_id = posted, .sg_list = sge, .opcode = op }, *badwr;
	size_t at = 0;
	int rc;

	while (posted - done >= SQ_DEPTH)
		if (reap(done + signal_every - 1))
			return 1;
	if (slot_msg[s] != -1)
		return bad("slot %d reused while request %d may be in flight", s, slot_msg[s]);
	for (size_t k = 0; k < len; k++)
		buf[k] = pattern(msg, k);
	for (int g = 0; g < nsge; g++) {
		size_t n = g == nsge - 1 ? len - at : len / nsge;

		sge[g] = (struct ibv_sge){ .addr = (uintptr_t)(buf + at), .length = (uint32_t)n,
					   .lkey = slots_mr->lkey };
		at += n;
	}
	wr.num_sge = nsge;
	if (last || posted % signal_every == signal_every - 1)
		wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	rc = ibv_post_send(cid->qp, &wr, &badwr);
	if (rc) {
		errno = rc;
		return fail("ibv_post_send");
	}
	slot_msg[s] = msg;
	posted++;
	return 0;
}

static int run_client(struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = 2, .max_send_sge = 3, .max_recv_sge = 1,
			 .max_inline_data = 16 },
		.sq_sig_all = 0,
	};
	struct target_key *keys = aligned_alloc(64, 64);
	struct ibv_mr *kmr;
	struct ibv_wc wc;
	int i, large = 0;

	slots = aligned_alloc(4096, (size_t)SQ_DEPTH * SLOT);
	if (!keys || !slots)
		return fail("aligned_alloc");
	memset(slots, 0xee, (size_t)SQ_DEPTH * SLOT);
	for (i = 0; i < SQ_DEPTH; i++)
		slot_msg[i] = -1;
	if (rdma_create_ep(&cid, res, NULL, &attr))
		return fail("rdma_create_ep");
	kmr = ibv_reg_mr(cid->pd, keys, 64, IBV_ACCESS_LOCAL_WRITE);
	slots_mr = ibv_reg_mr(cid->pd, slots, (size_t)SQ_DEPTH * SLOT, IBV_ACCESS_LOCAL_WRITE);
	if (!kmr || !slots_mr)
		return fail("ibv_reg_mr");
	if (post_recv(cid->qp, keys, 64, kmr->lkey, 1))
		return fail("ibv_post_recv");
	{
		struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };

		if (cm_connect_hello(cid, &cp))
			return 1;
	}
	if (wait_wc(cid->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS)
		return bad("no keys from the server");

	for (i = 0; i < n_send; i++) {
		if (post(IBV_WR_SEND, i, i, 0, 0, 0))
			return 1;
		large += msg_len(i) >= 16384;
	}
	for (i = 0; i < n_write; i++) {
		if (post(IBV_WR_RDMA_WRITE, 1000 + i, i, keys->addr + area_off(i), keys->rkey, 0))
			return 1;
		large += msg_len(i) >= 16384;
	}
	/* "done", signalled: everything before it completed in order. */
	{
		static const char msg[] = "done";
		struct ibv_sge sge = { .addr = (uintptr_t)msg, .length = 4, .lkey = 0 };
		struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED }, *badwr;

		while (posted - done >= SQ_DEPTH)
			if (reap(done + signal_every - 1))
				return 1;
		wr.wr_id = posted;
		if (ibv_post_send(cid->qp, &wr, &badwr))
			return fail("ibv_post_send done");
		posted++;
		while (done + signal_every - 1 < posted - 1)
			if (reap(done + signal_every - 1))
				return 1;
		if (reap(posted - 1))
			return 1;
	}
	printf("zcopy-verify: client: %d work requests completed in order, %d of them of 16 KiB or more\n",
	       posted, large);

	/* Reads of the written areas back into a buffer of their own, one at
	 * a time. */
	rsink = aligned_alloc(4096, SLOT);
	if (!rsink)
		return fail("aligned_alloc");
	rsink_mr = ibv_reg_mr(cid->pd, rsink, SLOT, IBV_ACCESS_LOCAL_WRITE);
	if (!rsink_mr)
		return fail("ibv_reg_mr");
	for (i = 0; i < n_read; i++) {
		size_t len = msg_len(i);
		uint8_t *sinkp = rsink + msg_off(i);
		struct ibv_sge sge = { .addr = (uintptr_t)sinkp, .length = (uint32_t)len, .lkey = rsink_mr->lkey };
		struct ibv_send_wr wr = { .wr_id = posted, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
					  .send_flags = IBV_SEND_SIGNALED }, *badwr;

		memset(rsink, 0xee, SLOT);
		wr.wr.rdma.remote_addr = keys->addr + area_off(i);
		wr.wr.rdma.rkey = keys->rkey;
		if (ibv_post_send(cid->qp, &wr, &badwr))
			return fail("ibv_post_send read");
		posted++;
		if (reap(posted - 1))
			return 1;
		for (size_t k = 0; k < len; k++)
			if (sinkp[k] != pattern(1000 + i, k))
				return bad("read %d (%zu octets) octet %zu: %#x, want %#x", i, len, k, sinkp[k],
					   pattern(1000 + i, k));
		for (size_t k = len; k < len + GUARD && msg_off(i) + k < SLOT; k++)
			if (sinkp[k] != 0xee)
				return bad("read %d: octet %zu placed past its %zu", i, k, len);
	}
	printf("zcopy-verify: client: %d RDMA Reads of 16 KiB-1 MiB verified\n", n_read);
	{
		static const char msg[] = "read";
		struct ibv_sge sge = { .addr = (uintptr_t)msg, .length = 4, .lkey = 0 };
		struct ibv_send_wr wr = { .wr_id = posted, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED }, *badwr;

		if (ibv_post_send(cid->qp, &wr, &badwr))
			return fail("ibv_post_send read");
		posted++;
		if (reap(posted - 1))
			return 1;
	}
	/* The server disconnects once it has checked everything. */
	if (rdma_disconnect(cid))
		return fail("rdma_disconnect");
	ibv_dereg_mr(slots_mr);
	ibv_dereg_mr(rsink_mr);
	ibv_dereg_mr(kmr);
	rdma_destroy_ep(cid);
	return 0;
}

int main(int argc, char **argv)
{
	static const char *const roles[] = { "server", "client", NULL };
	struct rdma_addrinfo *res;
	const char *is_short = getenv("ZCOPY_VERIFY_SHORT");
	const char *all = getenv("ZCOPY_VERIFY_SIGNAL_ALL");

	if (is_short && !strcmp(is_short, "1"))
		n_send = n_write = 12;
	if (all && !strcmp(all, "1"))
		signal_every = 1;
	return cm_args(argc, argv, roles, &res) == 0 ? run_server(res) : run_client(res);
}
