// SPDX-License-Identifier: GPL-2.0
/*
 * doorbell-file: the doorbell file of a siw_rs context (uapi/siw_rs-abi.h,
 * siw_rs/doorbell.rs), for the siw_rs VM tests.
 *
 *   doorbell-file check DEVICE
 *   doorbell-file hold DEVICE
 *   doorbell-file live DEVICE
 *
 * check opens two contexts A and B on DEVICE (through the siw_rs provider)
 * and finds the file each got (a close-on-exec "[siw_rs_doorbell]"):
 *   - A's file rings A's QP (send and receive queue): 0, and a QP in ERROR
 *     flushes what was posted, so each post completes with
 *     IBV_WC_WR_FLUSH_ERR and its wr_id;
 *   - it refuses B's QP, a QP number no QP has, a number above 32 bits
 *     whose low half is A's QP, and A's QP once destroyed: EINVAL; an
 *     unknown request: ENOTTY;
 *   - with A's file closed behind the provider's back, posts still ring
 *     (the provider falls back to the uverbs command) and flush;
 *   - a copy of B's file, kept after B is closed, rings nothing: EINVAL.
 * hold opens a context, keeps a copy of its file, closes the context,
 * prints "held" and waits for a line on stdin (the test deletes the device
 * and tries to unload the module meanwhile); then the copy must ring
 * nothing (EINVAL), and it prints "released" and exits.
 * live keeps a context with a PD, a CQ, a QP, a region and a posted
 * receive, prints "held" and waits for a line on stdin, the test deleting
 * the device meanwhile (the kernel disassociates the context). Then: the
 * async event queue must hold IBV_EVENT_DEVICE_FATAL; a region can no
 * longer be registered (EIO); the doorbell file rings nothing (EINVAL); a
 * Send is refused (EIO: the doorbell falls back to the command file);
 * destroying each object and closing the device succeed; it prints
 * "released" and exits.
 * Exit status 0 only if everything held.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "../../uapi/siw_rs-abi.h"
#include "vmtest.h"

static int failures;

static void check(int ok, const char *what)
{
	printf("%s: %s\n", ok ? "ok" : "FAIL", what);
	if (!ok)
		failures++;
}

struct ctx {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int db;                 /* the context's doorbell file, or -1 */
};

/* Opens DEVICE and finds the doorbell file that came with the context. */
static int open_ctx(const char *name, struct ctx *c)
{
	struct ibv_device **list = ibv_get_device_list(NULL);

	memset(c, 0, sizeof(*c));
	c->db = -1;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			c->ctx = open_device_db(list[i], &c->db);
	if (list)
		ibv_free_device_list(list);
	if (!c->ctx) {
		fprintf(stderr, "doorbell-file: cannot open %s\n", name);
		return -1;
	}
	c->pd = ibv_alloc_pd(c->ctx);
	c->cq = ibv_create_cq(c->ctx, 64, NULL, NULL, 0);
	if (!c->pd || !c->cq) {
		fprintf(stderr, "doorbell-file: pd/cq: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

static struct ibv_qp *make_qp(struct ctx *c)
{
	struct ibv_qp_init_attr a = {
		.send_cq = c->cq,
		.recv_cq = c->cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(c->pd, &a);
}

/* The ioctl's result: 0 or the errno. */
static int ring(int fd, unsigned int req, unsigned long qpn)
{
	return ioctl(fd, req, qpn) == 0 ? 0 : errno;
}

/* Posts a Send (or a receive) with wr_id on a QP in ERROR and waits for
 * its flush completion. */
static int flushed(struct ctx *c, struct ibv_qp *qp, int recv, uint64_t wr_id)
{
	static char buf[16];
	struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof(buf) };
	struct ibv_wc wc;
	int rc;

	if (!mr)
		return 0;
	sge.lkey = mr->lkey;
	if (recv) {
		struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

		rc = ibv_post_recv(qp, &wr, &bad);
	} else {
		struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

		rc = ibv_post_send(qp, &wr, &bad);
	}
	if (rc == 0 && wait_wc(c->cq, &wc))
		rc = errno ? errno : EIO;
	ibv_dereg_mr(mr);
	if (rc) {
		fprintf(stderr, "doorbell-file: post or completion: %s\n", strerror(rc));
		return 0;
	}
	return wc.wr_id == wr_id && wc.status == IBV_WC_WR_FLUSH_ERR;
}

static int to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0;
}

static int do_check(const char *dev)
{
	struct ctx a, b;
	struct ibv_qp *qa, *qa2, *qb;
	uint32_t gone;
	int copy;

	if (open_ctx(dev, &a) || open_ctx(dev, &b))
		return 1;
	check(a.db >= 0 && b.db >= 0 && a.db != b.db, "each context has a doorbell file of its own");
	if (a.db < 0 || b.db < 0)
		return 1;
	check(fcntl(a.db, F_GETFD) & FD_CLOEXEC, "the doorbell file is close-on-exec");
	qa = make_qp(&a);
	qb = make_qp(&b);
	if (!qa || !qb) {
		fprintf(stderr, "doorbell-file: create_qp: %s\n", strerror(errno));
		return 1;
	}
	check(ring(a.db, SIW_RS_IOCTL_SQ_DOORBELL, qa->qp_num) == 0, "A's file rings A's send queue");
	check(ring(a.db, SIW_RS_IOCTL_RQ_DOORBELL, qa->qp_num) == 0, "A's file rings A's receive queue");
	check(ring(a.db, SIW_RS_IOCTL_SQ_DOORBELL, qb->qp_num) == EINVAL, "A's file refuses B's QP (EINVAL)");
	check(ring(b.db, SIW_RS_IOCTL_RQ_DOORBELL, qa->qp_num) == EINVAL, "B's file refuses A's QP (EINVAL)");
	check(ring(a.db, SIW_RS_IOCTL_SQ_DOORBELL, 0) == EINVAL, "QP number 0 is refused (EINVAL)");
	check(ring(a.db, SIW_RS_IOCTL_SQ_DOORBELL, 0x7fffffff) == EINVAL, "a number no QP has is refused (EINVAL)");
	check(ring(a.db, SIW_RS_IOCTL_SQ_DOORBELL, (1ul << 40) | qa->qp_num) == EINVAL,
	      "a number above 32 bits is refused, not truncated (EINVAL)");
	check(ring(a.db, _IO(SIW_RS_IOCTL_TYPE, 0x82), qa->qp_num) == ENOTTY, "an unknown request is refused (ENOTTY)");

	check(to_error(qa), "A's QP to ERROR");
	check(flushed(&a, qa, 0, 1001), "a Send posted in ERROR is flushed (doorbell file)");
	check(flushed(&a, qa, 1, 1002), "a receive posted in ERROR is flushed (doorbell file)");

	gone = qa->qp_num;
	check(ibv_destroy_qp(qa) == 0, "A's QP destroyed");
	check(ring(a.db, SIW_RS_IOCTL_SQ_DOORBELL, gone) == EINVAL, "a destroyed QP is refused (EINVAL)");

	/* The application closes the provider's file: posts must still ring. */
	qa2 = make_qp(&a);
	check(qa2 && to_error(qa2), "a second QP of A, in ERROR");
	check(close(a.db) == 0, "A's doorbell file closed behind the provider");
	if (qa2) {
		check(flushed(&a, qa2, 0, 2001), "a Send is still flushed (command-file fallback)");
		check(flushed(&a, qa2, 1, 2002), "a receive is still flushed (command-file fallback)");
		ibv_destroy_qp(qa2);
	}

	/* A copy of B's file outlives B. */
	copy = dup(b.db);
	ibv_destroy_qp(qb);
	ibv_destroy_cq(b.cq);
	ibv_dealloc_pd(b.pd);
	check(ibv_close_device(b.ctx) == 0, "B closed");
	check(fcntl(b.db, F_GETFD) == -1 && errno == EBADF, "closing B closed its doorbell file");
	check(copy >= 0 && ring(copy, SIW_RS_IOCTL_SQ_DOORBELL, gone) == EINVAL,
	      "a copy of B's file rings nothing after B is closed (EINVAL)");
	close(copy);

	ibv_destroy_cq(a.cq);
	ibv_dealloc_pd(a.pd);
	ibv_close_device(a.ctx);
	printf("doorbell-file: %d failed\n", failures);
	return failures != 0;
}

static int do_hold(const char *dev)
{
	struct ctx c;
	char line[16];
	int copy;

	if (open_ctx(dev, &c) || c.db < 0)
		return 1;
	copy = dup(c.db);
	ibv_destroy_cq(c.cq);
	ibv_dealloc_pd(c.pd);
	ibv_close_device(c.ctx);
	printf("held\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	check(ring(copy, SIW_RS_IOCTL_SQ_DOORBELL, 2) == EINVAL, "the kept file rings nothing (EINVAL)");
	close(copy);
	printf("released\n");
	return failures != 0;
}

static int do_live(const char *dev)
{
	static char buf[4096];
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof(buf) };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *badr;
	struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bads;
	struct ibv_async_event ev;
	struct ibv_qp *qp;
	struct ibv_mr *mr, *mr2;
	struct pollfd pfd;
	struct ctx c;
	char line[16];
	int rc, flags;

	if (open_ctx(dev, &c) || c.db < 0)
		return 1;
	qp = make_qp(&c);
	mr = ibv_reg_mr(c.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!qp || !mr) {
		fprintf(stderr, "doorbell-file: qp/mr: %s\n", strerror(errno));
		return 1;
	}
	sge.lkey = mr->lkey;
	check(ibv_post_recv(qp, &rwr, &badr) == 0, "a receive posted before the device goes");
	printf("held\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;

	flags = fcntl(c.ctx->async_fd, F_GETFL);
	fcntl(c.ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
	pfd = (struct pollfd){ .fd = c.ctx->async_fd, .events = POLLIN };
	rc = poll(&pfd, 1, 10000) == 1 && ibv_get_async_event(c.ctx, &ev) == 0;
	if (rc)
		ibv_ack_async_event(&ev);
	check(rc && ev.event_type == IBV_EVENT_DEVICE_FATAL, "the async event is IBV_EVENT_DEVICE_FATAL");
	mr2 = ibv_reg_mr(c.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	check(!mr2 && errno == EIO, "a new region is refused (EIO)");
	if (mr2)
		ibv_dereg_mr(mr2);
	check(ring(c.db, SIW_RS_IOCTL_SQ_DOORBELL, qp->qp_num) == EINVAL, "the doorbell file rings nothing (EINVAL)");
	rc = ibv_post_send(qp, &swr, &bads);
	printf("    post_send after the device went: %s\n", rc ? strerror(rc) : "accepted");
	check(rc == EIO, "a Send is refused (EIO)");
	check(ibv_destroy_qp(qp) == 0, "the QP is destroyed");
	check(ibv_dereg_mr(mr) == 0, "the region is deregistered");
	check(ibv_destroy_cq(c.cq) == 0, "the CQ is destroyed");
	check(ibv_dealloc_pd(c.pd) == 0, "the PD is freed");
	check(ibv_close_device(c.ctx) == 0, "the device is closed");
	printf("released\n");
	printf("doorbell-file: %d failed\n", failures);
	return failures != 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "check"))
		return do_check(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "hold"))
		return do_hold(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "live"))
		return do_live(argv[2]);
	fprintf(stderr, "usage: doorbell-file check|hold|live DEVICE\n");
	return 2;
}
