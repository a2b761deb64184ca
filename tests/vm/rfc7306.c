// SPDX-License-Identifier: GPL-2.0
/*
 * rfc7306: RFC 7306 Atomic operations and RDMA Write with Immediate Data
 * through the verbs API, with every result checked. For the siw_rs VM tests.
 *
 *   rfc7306 server ADDR PORT
 *   rfc7306 client ADDR PORT
 *
 * The server registers a target region (remote write, read and atomic
 * rights) and a second one without remote-atomic rights, sends their keys,
 * and checks what arrives:
 *   - N_IMM RDMA Writes with Immediate Data, each completing one receive
 *     as IBV_WC_RECV_RDMA_WITH_IMM with the sender's immediate value and
 *     the Write's length, the written octets in place;
 *   - after the client's "done" Send: the Fetch-and-Add counter holds the
 *     sum of the client's adds and the Compare-and-Swap word the swapped
 *     value;
 *   - then the client's atomic on the region without atomic rights must
 *     move the server's QP to ERROR and leave that word untouched.
 * The client checks every original value the atomics return, reads the
 * counter back with an RDMA Read, checks that a misaligned atomic is a
 * failed verb call (EINVAL) that leaves the QP usable, and that the atomic
 * without rights completes with IBV_WC_REM_ACCESS_ERR.
 * Exit status 0 only if everything held.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define VMTEST_NAME "rfc7306"
#include "vmtest-cm.h"

#define N_ADD 50
#define N_IMM 20
#define SLOT 256
#define IMM_BASE 0xc0de0000u
#define NO_ATOMIC_WORD 0x5a5a5a5a5a5a5a5aull
#define CAS_INITIAL 0x1111ull
#define CAS_SWAPPED 0x2222ull

struct keys {
	uint64_t addr;
	uint64_t noatomic_addr;
	uint32_t rkey;
	uint32_t noatomic_rkey;
};

/* The target region: the counter, the CAS word, then N_IMM write slots. */
struct target {
	uint64_t counter;
	uint64_t cas;
	uint8_t slots[N_IMM][SLOT];
};

static uint8_t pattern(int slot, int i)
{
	return (uint8_t)(slot * 31 + i * 7 + 1);
}

static int slot_len(int slot)
{
	return 16 + slot * 11;
}

static int run_server(struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 8, .max_recv_wr = N_IMM + 2,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	struct rdma_cm_id *listen_id, *id;
	struct target *t = aligned_alloc(4096, sizeof(*t));
	uint64_t *noatomic = aligned_alloc(4096, 4096);
	struct ibv_mr *tmr, *nmr, *kmr;
	struct keys keys;
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	struct ibv_wc wc;
	uint64_t expect = 0;
	int i, rc;

	if (!t || !noatomic)
		return fail("aligned_alloc");
	memset(t, 0, sizeof(*t));
	t->cas = CAS_INITIAL;
	*noatomic = NO_ATOMIC_WORD;
	if (cm_first_request(res, &attr, &listen_id, &id))
		return 1;
	tmr = ibv_reg_mr(id->pd, t, sizeof(*t), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	nmr = ibv_reg_mr(id->pd, noatomic, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_READ);
	kmr = ibv_reg_mr(id->pd, &keys, sizeof(keys), IBV_ACCESS_LOCAL_WRITE);
	if (!tmr || !nmr || !kmr)
		return fail("ibv_reg_mr");
	/* One receive per Immediate Data message, one for "done". */
	for (i = 0; i < N_IMM + 1; i++)
		if (post_recv(id->qp, &keys, sizeof(keys), kmr->lkey, i))
			return fail("ibv_post_recv");
	if (rdma_accept(id, NULL))
		return fail("rdma_accept");

	keys.addr = (uintptr_t)t;
	keys.rkey = tmr->rkey;
	keys.noatomic_addr = (uintptr_t)noatomic;
	keys.noatomic_rkey = nmr->rkey;
	rc = send_and_wait(id->qp, id->send_cq, &keys, sizeof(keys), kmr->lkey);
	if (rc < 0)
		return fail("ibv_post_send keys");
	if (rc)
		return bad("keys send: %s", ibv_wc_status_str(rc));

	for (i = 0; i < N_IMM; i++) {
		uint32_t want = htonl(IMM_BASE + i);

		if (wait_wc(id->recv_cq, &wc))
			return fail("receive of Immediate Data");
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM ||
		    !(wc.wc_flags & IBV_WC_WITH_IMM))
			return bad("receive %d: status %s opcode %d flags %#x", i,
				   ibv_wc_status_str(wc.status), wc.opcode, wc.wc_flags);
		if (wc.wr_id != (uint64_t)i || wc.imm_data != want || wc.byte_len != (uint32_t)slot_len(i))
			return bad("receive %d: wr_id %" PRIu64 " imm %#x (want %#x) byte_len %u (want %d)",
				   i, wc.wr_id, ntohl(wc.imm_data), ntohl(want), wc.byte_len, slot_len(i));
		/* The Write before it is placed. */
		for (int k = 0; k < slot_len(i); k++)
			if (t->slots[i][k] != pattern(i, k))
				return bad("slot %d octet %d: %#x, want %#x", i, k, t->slots[i][k], pattern(i, k));
		for (int k = slot_len(i); k < SLOT; k++)
			if (t->slots[i][k])
				return bad("slot %d octet %d written past the Write", i, k);
	}
	printf("rfc7306: server: %d Writes with Immediate Data verified\n", N_IMM);

	if (wait_wc(id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
		return bad("no \"done\" Send");
	for (i = 1; i <= N_ADD; i++)
		expect += (uint64_t)i * 1000003u;
	if (__atomic_load_n(&t->counter, __ATOMIC_ACQUIRE) != expect)
		return bad("counter %#" PRIx64 ", want %#" PRIx64, t->counter, expect);
	if (__atomic_load_n(&t->cas, __ATOMIC_ACQUIRE) != CAS_SWAPPED)
		return bad("CAS word %#" PRIx64 ", want %#llx", t->cas, CAS_SWAPPED);
	printf("rfc7306: server: counter %#" PRIx64 " and CAS word %#" PRIx64 " as expected\n",
	       t->counter, t->cas);

	/* The atomic without rights ends the connection; nothing is written. */
	for (i = 0; i < 100; i++) {
		if (ibv_query_qp(id->qp, &qattr, IBV_QP_STATE, &qinit))
			return fail("ibv_query_qp");
		if (qattr.qp_state == IBV_QPS_ERR)
			break;
		usleep(100 * 1000);
	}
	if (qattr.qp_state != IBV_QPS_ERR)
		return bad("server QP state %d after the refused atomic, want ERROR", qattr.qp_state);
	if (*noatomic != NO_ATOMIC_WORD)
		return bad("region without atomic rights changed: %#" PRIx64, *noatomic);
	printf("rfc7306: server: refused atomic moved the QP to ERROR, target untouched\n");
	rdma_disconnect(id);
	ibv_dereg_mr(tmr);
	ibv_dereg_mr(nmr);
	ibv_dereg_mr(kmr);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	return 0;
}

static int post_atomic(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t addr, uint32_t rkey,
		       uint64_t compare_add, uint64_t swap, uint64_t *result, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)result, .length = 8, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = op }, *badwr;

	wr.wr.atomic.remote_addr = addr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	return ibv_post_send(qp, &wr, &badwr);
}

/* One atomic, its completion checked; the original value in *result. */
static int atomic(struct rdma_cm_id *id, enum ibv_wr_opcode op, uint64_t addr, uint32_t rkey,
		  uint64_t compare_add, uint64_t swap, uint64_t *result, uint32_t lkey)
{
	struct ibv_wc wc;
	enum ibv_wc_opcode want = op == IBV_WR_ATOMIC_CMP_AND_SWP ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD;

	*result = 0xdeadbeefdeadbeefull;
	if (post_atomic(id->qp, op, addr, rkey, compare_add, swap, result, lkey))
		return fail("ibv_post_send atomic");
	if (wait_wc(id->send_cq, &wc))
		return fail("atomic completion");
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != want || wc.byte_len != 8)
		return bad("atomic: status %s opcode %d byte_len %u", ibv_wc_status_str(wc.status),
			   wc.opcode, wc.byte_len);
	return 0;
}

static int run_client(struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = N_IMM + 4, .max_recv_wr = 2,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	struct rdma_cm_id *id;
	struct keys keys;
	uint64_t *result = aligned_alloc(64, 64);
	uint8_t *src = aligned_alloc(4096, N_IMM * SLOT);
	struct ibv_mr *kmr, *rmr, *smr;
	struct ibv_device_attr dattr;
	struct ibv_wc wc;
	uint64_t sum = 0;
	int i;

	if (!result || !src)
		return fail("aligned_alloc");
	if (rdma_create_ep(&id, res, NULL, &attr))
		return fail("rdma_create_ep");
	if (ibv_query_device(id->verbs, &dattr))
		return fail("ibv_query_device");
	if (dattr.atomic_cap == IBV_ATOMIC_NONE)
		return bad("device reports no atomics");
	kmr = ibv_reg_mr(id->pd, &keys, sizeof(keys), IBV_ACCESS_LOCAL_WRITE);
	rmr = ibv_reg_mr(id->pd, result, 64, IBV_ACCESS_LOCAL_WRITE);
	smr = ibv_reg_mr(id->pd, src, N_IMM * SLOT, IBV_ACCESS_LOCAL_WRITE);
	if (!kmr || !rmr || !smr)
		return fail("ibv_reg_mr");
	if (post_recv(id->qp, &keys, sizeof(keys), kmr->lkey, 1))
		return fail("ibv_post_recv");
	if (rdma_connect(id, NULL))
		return fail("rdma_connect");
	if (wait_wc(id->recv_cq, &wc) || wc.status != IBV_WC_SUCCESS)
		return bad("no keys from the server");

	/* Fetch and Add: each returns the running sum before it. */
	for (i = 1; i <= N_ADD; i++) {
		uint64_t add = (uint64_t)i * 1000003u;

		if (atomic(id, IBV_WR_ATOMIC_FETCH_AND_ADD, keys.addr, keys.rkey, add, 0, result, rmr->lkey))
			return 1;
		if (*result != sum)
			return bad("fetch-add %d returned %#" PRIx64 ", want %#" PRIx64, i, *result, sum);
		sum += add;
	}
	printf("rfc7306: client: %d fetch-and-adds returned the running sum\n", N_ADD);

	/* Compare and Swap: a match swaps, a mismatch does not. */
	if (atomic(id, IBV_WR_ATOMIC_CMP_AND_SWP, keys.addr + 8, keys.rkey, CAS_INITIAL, CAS_SWAPPED,
		   result, rmr->lkey))
		return 1;
	if (*result != CAS_INITIAL)
		return bad("cmp-swap returned %#" PRIx64 ", want %#llx", *result, CAS_INITIAL);
	if (atomic(id, IBV_WR_ATOMIC_CMP_AND_SWP, keys.addr + 8, keys.rkey, CAS_INITIAL, 0x3333,
		   result, rmr->lkey))
		return 1;
	if (*result != CAS_SWAPPED)
		return bad("second cmp-swap returned %#" PRIx64 ", want %#llx", *result, CAS_SWAPPED);
	printf("rfc7306: client: compare-and-swap swapped once, then saw the new value\n");

	/* A misaligned target is a failed verb call; the QP carries on. */
	if (post_atomic(id->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, keys.addr + 4, keys.rkey, 1, 0, result,
			rmr->lkey) != EINVAL)
		return bad("misaligned atomic was not refused with EINVAL");

	/* Read the counter back. */
	{
		struct ibv_sge sge = { .addr = (uintptr_t)result, .length = 8, .lkey = rmr->lkey };
		struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_READ }, *badwr;

		wr.wr.rdma.remote_addr = keys.addr;
		wr.wr.rdma.rkey = keys.rkey;
		if (ibv_post_send(id->qp, &wr, &badwr))
			return fail("ibv_post_send read");
		if (wait_wc(id->send_cq, &wc) || wc.status != IBV_WC_SUCCESS)
			return bad("read back: %s", ibv_wc_status_str(wc.status));
		if (*result != sum)
			return bad("read back %#" PRIx64 ", want %#" PRIx64, *result, sum);
	}

	/* Writes with Immediate Data, posted back to back. */
	for (i = 0; i < N_IMM; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)(src + i * SLOT), .length = slot_len(i),
				       .lkey = smr->lkey };
		struct ibv_send_wr wr = { .wr_id = 200 + i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM }, *badwr;

		for (int k = 0; k < slot_len(i); k++)
			src[i * SLOT + k] = pattern(i, k);
		wr.imm_data = htonl(IMM_BASE + i);
		wr.wr.rdma.remote_addr = keys.addr + offsetof(struct target, slots) + (uint64_t)i * SLOT;
		wr.wr.rdma.rkey = keys.rkey;
		if (ibv_post_send(id->qp, &wr, &badwr))
			return fail("ibv_post_send write with immediate");
	}
	for (i = 0; i < N_IMM; i++) {
		if (wait_wc(id->send_cq, &wc))
			return fail("write with immediate completion");
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RDMA_WRITE ||
		    wc.wr_id != (uint64_t)(200 + i))
			return bad("write with immediate %d: status %s opcode %d wr_id %" PRIu64, i,
				   ibv_wc_status_str(wc.status), wc.opcode, wc.wr_id);
	}
	printf("rfc7306: client: %d Writes with Immediate Data completed\n", N_IMM);

	/* "done", then the atomic the server's region does not allow. */
	{
		struct ibv_sge sge = { .addr = (uintptr_t)&keys, .length = 4, .lkey = kmr->lkey };
		struct ibv_send_wr wr = { .wr_id = 300, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND }, *badwr;

		if (ibv_post_send(id->qp, &wr, &badwr))
			return fail("ibv_post_send done");
		if (wait_wc(id->send_cq, &wc) || wc.status != IBV_WC_SUCCESS)
			return bad("done send: %s", ibv_wc_status_str(wc.status));
	}
	if (post_atomic(id->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, keys.noatomic_addr, keys.noatomic_rkey, 1, 0,
			result, rmr->lkey))
		return fail("ibv_post_send refused atomic");
	if (wait_wc(id->send_cq, &wc))
		return fail("refused atomic completion");
	if (wc.status != IBV_WC_REM_ACCESS_ERR)
		return bad("atomic without rights completed with %s, want REM_ACCESS_ERR",
			   ibv_wc_status_str(wc.status));
	printf("rfc7306: client: atomic without rights: %s\n", ibv_wc_status_str(wc.status));
	rdma_disconnect(id);
	ibv_dereg_mr(kmr);
	ibv_dereg_mr(rmr);
	ibv_dereg_mr(smr);
	rdma_destroy_ep(id);
	return 0;
}

int main(int argc, char **argv)
{
	static const char *const roles[] = { "server", "client", NULL };
	struct rdma_addrinfo *res;
	int rc;

	rc = cm_args(argc, argv, roles, &res) == 0 ? run_server(res) : run_client(res);
	rdma_freeaddrinfo(res);
	if (!rc)
		printf("rfc7306: %s: all checks passed\n", argv[1]);
	return rc;
}
