// SPDX-License-Identifier: GPL-2.0
/*
 * ring-fault: a misbehaving process for the siw_rs VM tests.
 *
 *   ring-fault SERVER_ADDR PORT
 *
 * Connects an RC QP (through librdmacm and the siw_rs provider) to a server,
 * then does what no correct provider would: it finds its own send queue ring
 * among its mappings of the uverbs device, fills three entries with garbage,
 * publishes them with the ring's producer index, and rings the doorbell with
 * a raw POST_SEND command. The kernel must refuse the garbage: the first
 * entry completes with IBV_WC_LOC_QP_OP_ERR, the QP goes to ERROR, and
 * nothing else is affected. Exit status 0 only if that is what happened.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_cma.h>

#include "../../uapi/siw_rs-abi.h"

#define SQ_DEPTH 64
#define GARBAGE 3

static int fail(const char *what)
{
	fprintf(stderr, "ring-fault: %s: %s\n", what, strerror(errno));
	return 1;
}

/* The SQ ring: the only uverbs mapping large enough for SQ_DEPTH entries. */
static void *find_sq_ring(size_t *len)
{
	size_t want = SIW_RS_RING_ENTRIES_OFFSET + SQ_DEPTH * sizeof(struct siw_rs_sqe);
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	void *found = NULL;

	if (!f)
		return NULL;
	while (fgets(line, sizeof(line), f)) {
		uintptr_t lo, hi;

		if (!strstr(line, "/dev/infiniband/uverbs"))
			continue;
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) != 2)
			continue;
		if (hi - lo >= want) {
			found = (void *)lo;
			*len = hi - lo;
		}
	}
	fclose(f);
	return found;
}

/* The doorbell, as the provider rings it: POST_SEND with no work requests. */
static int doorbell(struct ibv_qp *qp)
{
	struct ib_uverbs_post_send_resp resp;
	struct {
		struct ib_uverbs_cmd_hdr hdr;
		struct ib_uverbs_post_send cmd;
	} req;

	memset(&req, 0, sizeof(req));
	req.hdr.command = IB_USER_VERBS_CMD_POST_SEND;
	req.hdr.in_words = sizeof(req) / 4;
	req.hdr.out_words = sizeof(resp) / 4;
	req.cmd.response = (uintptr_t)&resp;
	req.cmd.qp_handle = qp->handle;
	req.cmd.wqe_size = sizeof(struct ib_uverbs_send_wr);
	return write(qp->context->cmd_fd, &req, sizeof(req)) == sizeof(req) ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	struct rdma_cm_id *id;
	struct siw_rs_ring_ctrl *ctrl;
	struct ibv_wc wc;
	size_t len;
	uint32_t cons;
	char *ring;
	int i, n = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: ring-fault SERVER_ADDR PORT\n");
		return 2;
	}
	if (rdma_getaddrinfo(argv[1], argv[2], &hints, &res))
		return fail("rdma_getaddrinfo");
	if (rdma_create_ep(&id, res, NULL, &attr))
		return fail("rdma_create_ep");
	if (rdma_connect(id, NULL))
		return fail("rdma_connect");

	ring = find_sq_ring(&len);
	if (!ring) {
		fprintf(stderr, "ring-fault: no send queue ring mapped\n");
		return 1;
	}
	ctrl = (struct siw_rs_ring_ctrl *)ring;
	cons = __atomic_load_n(&ctrl->cons, __ATOMIC_ACQUIRE);
	for (i = 0; i < GARBAGE; i++) {
		size_t slot = (cons + i) % SQ_DEPTH;

		memset(ring + SIW_RS_RING_ENTRIES_OFFSET + slot * sizeof(struct siw_rs_sqe),
		       0xa5, sizeof(struct siw_rs_sqe));
	}
	__atomic_store_n(&ctrl->prod, cons + GARBAGE, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (doorbell(id->qp))
		return fail("doorbell");
	printf("ring-fault: %d garbage entries at %u in a %zu-octet ring, doorbell rung\n",
	       GARBAGE, cons, len);

	/* The first garbage entry fails, the others are flushed. */
	for (i = 0; i < 100 && n < GARBAGE; i++) {
		int got = ibv_poll_cq(id->send_cq, 1, &wc);

		if (got < 0)
			return fail("ibv_poll_cq");
		if (got == 0) {
			usleep(100 * 1000);
			continue;
		}
		printf("ring-fault: completion %d: wr_id %#" PRIx64 " status %s (%d)\n", n,
		       wc.wr_id, ibv_wc_status_str(wc.status), wc.status);
		if (n == 0 && wc.status != IBV_WC_LOC_QP_OP_ERR) {
			fprintf(stderr, "ring-fault: first completion is not LOC_QP_OP_ERR\n");
			return 1;
		}
		if (n > 0 && wc.status != IBV_WC_WR_FLUSH_ERR) {
			fprintf(stderr, "ring-fault: later completion is not WR_FLUSH_ERR\n");
			return 1;
		}
		n++;
	}
	if (n != GARBAGE) {
		fprintf(stderr, "ring-fault: %d of %d completions within 10 s\n", n, GARBAGE);
		return 1;
	}
	if (ibv_query_qp(id->qp, &qattr, IBV_QP_STATE, &qinit))
		return fail("ibv_query_qp");
	printf("ring-fault: QP state %d (IBV_QPS_ERR is %d)\n", qattr.qp_state, IBV_QPS_ERR);
	if (qattr.qp_state != IBV_QPS_ERR)
		return 1;
	rdma_disconnect(id);
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
	return 0;
}
