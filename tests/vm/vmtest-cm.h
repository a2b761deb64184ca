/* SPDX-License-Identifier: GPL-2.0 */
/* RDMA CM pieces shared by the VM tests' client/server programs
 * (rfc7306.c, access.c, inline-verify.c, zcopy-verify.c), for a program
 * that defines VMTEST_NAME before including this header. */
#ifndef SIW_RS_VMTEST_CM_H
#define SIW_RS_VMTEST_CM_H

#include <rdma/rdma_cma.h>

#include "vmtest.h"

/* The command line "NAME ROLE ADDR PORT", ROLE one of roles ("server",
 * "client", ..., NULL-terminated; "server" listens): returns ROLE's index
 * in roles, with ADDR PORT resolved into *res. Exits with status 2 after
 * the usage line on other arguments, and with 1 if the address does not
 * resolve. */
static inline int cm_args(int argc, char **argv, const char *const *roles, struct rdma_addrinfo **res)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP };
	int r = 0;

	while (argc == 4 && roles[r] && strcmp(argv[1], roles[r]))
		r++;
	if (argc != 4 || !roles[r]) {
		fputs("usage: " VMTEST_NAME " ", stderr);
		for (int i = 0; roles[i]; i++)
			fprintf(stderr, "%s%s", i ? "|" : "", roles[i]);
		fputs(" ADDR PORT\n", stderr);
		exit(2);
	}
	if (!strcmp(roles[r], "server"))
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], argv[3], &hints, res))
		exit(fail("rdma_getaddrinfo"));
	return r;
}

/* Listens on res (each connection's QP made with attr) and takes the first
 * connection request: its id in *id, the listening id in *listen_id.
 * 0, or 1 after a report. */
static inline int cm_first_request(struct rdma_addrinfo *res, struct ibv_qp_init_attr *attr,
				   struct rdma_cm_id **listen_id, struct rdma_cm_id **id)
{
	if (rdma_create_ep(listen_id, res, NULL, attr))
		return fail("rdma_create_ep");
	if (rdma_listen(*listen_id, 1))
		return fail("rdma_listen");
	if (rdma_get_request(*listen_id, id))
		return fail("rdma_get_request");
	return 0;
}

/* Where a client may write and read: a server's target region. */
struct target_key {
	uint64_t addr;
	uint32_t rkey;
};

/* Accepts id's connection (Reads answered one at a time) and sends *key,
 * set to addr and rkey (key lies in a region of lkey), as its first
 * message: 0, or 1 after a report. */
static inline int cm_accept_sending_key(struct rdma_cm_id *id, struct target_key *key, void *addr, uint32_t rkey,
					uint32_t lkey)
{
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	int rc;

	if (rdma_accept(id, &cp))
		return fail("rdma_accept");
	key->addr = (uintptr_t)addr;
	key->rkey = rkey;
	rc = send_and_wait(id->qp, id->send_cq, key, sizeof(*key), lkey);
	if (rc < 0)
		return fail("ibv_post_send keys");
	if (rc)
		return bad("keys send: %s", ibv_wc_status_str(rc));
	return 0;
}

#endif
