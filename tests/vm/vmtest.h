/* SPDX-License-Identifier: GPL-2.0 */
/* Pieces shared by the VM tests' verbs programs (rfc7306.c, access.c). */
#ifndef SIW_RS_VMTEST_H
#define SIW_RS_VMTEST_H

#include <errno.h>
#include <unistd.h>

#include <infiniband/verbs.h>

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

#endif
