/* SPDX-License-Identifier: GPL-2.0 */
/* Pieces shared by the VM tests' verbs programs (rfc7306.c, access.c,
 * inline-verify.c, zcopy-verify.c, doorbell-file.c, uverbs-fuzz.c);
 * vmtest-cm.h adds the RDMA CM's. */
#ifndef SIW_RS_VMTEST_H
#define SIW_RS_VMTEST_H

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* Report helpers, for a program that defines VMTEST_NAME (its name in
 * its reports) before including this header. */
#ifdef VMTEST_NAME

/* A failed call: "NAME: what: strerror(errno)" on stderr; returns 1. */
static inline int fail(const char *what)
{
	fprintf(stderr, VMTEST_NAME ": %s: %s\n", what, strerror(errno));
	return 1;
}

/* A failed check: "NAME: FAIL: ..." on stderr; returns 1. */
static inline int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int bad(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs(VMTEST_NAME ": FAIL: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return 1;
}
#endif

/* The siw_rs doorbell files ("[siw_rs_doorbell]", uapi/siw_rs-abi.h)
 * open in this process, at most max of them into fds; returns how many. */
static inline int doorbell_files(int *fds, int max)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)) && n < max) {
		char path[300], link[64];
		ssize_t l;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		l = readlink(path, link, sizeof(link) - 1);
		if (l > 0) {
			link[l] = 0;
			if (strstr(link, "[siw_rs_doorbell]"))
				fds[n++] = atoi(e->d_name);
		}
	}
	if (d)
		closedir(d);
	return n;
}

/* ibv_open_device, and the doorbell file the kernel opened with the
 * context: its number in *db, or -1 (not a siw_rs device, or no file).
 * That file is the one not open before (file numbers are reused lowest
 * first, so sets are compared, not numbers). */
static inline struct ibv_context *open_device_db(struct ibv_device *dev, int *db)
{
	int before[64], after[64], nb = doorbell_files(before, 64), na;
	struct ibv_context *ctx = ibv_open_device(dev);

	*db = -1;
	if (!ctx)
		return NULL;
	na = doorbell_files(after, 64);
	for (int j = 0; j < na; j++) {
		int old = 0;

		for (int k = 0; k < nb; k++)
			old |= before[k] == after[j];
		if (!old)
			*db = after[j];
	}
	return ctx;
}

/* One completion of CQ within 10 s: 0, or -1 (a poll error, or errno
 * ETIMEDOUT). */
static inline int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 10000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0)
			return -1;
		if (n == 1)
			return 0;
		usleep(1000);
	}
	errno = ETIMEDOUT;
	return -1;
}

/* Posts one receive of len octets at buf (region lkey) as work request id:
 * ibv_post_recv's result. */
static inline int post_recv(struct ibv_qp *qp, void *buf, uint32_t len, uint32_t lkey, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *badwr;

	return ibv_post_recv(qp, &wr, &badwr);
}

/* Sends len octets at addr (region lkey) as one signalled Send and waits
 * for its completion: 0 if it succeeded, -1 if the post failed (errno
 * set), or the failed completion's status. */
static inline int send_and_wait(struct ibv_qp *qp, struct ibv_cq *cq, void *addr, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 100, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *badwr;
	struct ibv_wc wc;
	int rc = ibv_post_send(qp, &wr, &badwr);

	if (rc) {
		errno = rc;
		return -1;
	}
	if (wait_wc(cq, &wc))
		return IBV_WC_GENERAL_ERR;
	return wc.status;
}

#endif
