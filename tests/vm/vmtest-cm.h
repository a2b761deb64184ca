/* SPDX-License-Identifier: GPL-2.0 */
/* RDMA CM pieces shared by the VM tests' client/server programs
 * (rfc7306.c, access.c, inline-verify.c, zcopy-verify.c), for a program
 * that defines VMTEST_NAME before including this header. */
#ifndef SIW_RS_VMTEST_CM_H
#define SIW_RS_VMTEST_CM_H

#include <inttypes.h>
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

/* The client speaks first. RFC 5044 (section 7.1.2) lets an MPA responder
 * send FPDUs only after it has received one from the initiator, unless
 * RFC 6581's peer-to-peer mode was negotiated, which upstream siw never
 * asks for. siw as initiator holds peers to it: an FPDU that is already in
 * the socket behind the MPA Reply when siw reads the Reply fails the
 * connection ("peer sent extra data", siw_cm.c), after the responder has
 * accepted. A server that sent its key at once lost a siw client that way
 * (test_67, when the two arrived together). So the client sends a 4-octet
 * hello as soon as it is connected, and the server sends only once it has
 * that hello, received on the first receive it posted (cm_post_hello). */
#define CM_HELLO_ID 0x4e110ULL
static const char cm_hello[4] = { 'h', 'e', 'l', 'o' };

/* The server's first receive, before any other: the client's hello, into
 * key (64 octets in a region of lkey, later overwritten by the key).
 * ibv_post_recv's result. */
static inline int cm_post_hello(struct rdma_cm_id *id, struct target_key *key, uint32_t lkey)
{
	return post_recv(id->qp, key, 64, lkey, CM_HELLO_ID);
}

/* The client's connect: rdma_connect with cp, then the hello, inline
 * (the QP must allow 4 inline octets). 0, or 1 after a report whose text
 * starts with "rdma_connect" when the connect itself failed. */
static inline int cm_connect_hello(struct rdma_cm_id *id, struct rdma_conn_param *cp)
{
	struct ibv_sge sge = { .addr = (uintptr_t)cm_hello, .length = sizeof(cm_hello) };
	struct ibv_send_wr wr = { .wr_id = CM_HELLO_ID, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED }, *badwr;
	struct ibv_wc wc;
	int rc;

	if (rdma_connect(id, cp))
		return fail("rdma_connect");
	rc = ibv_post_send(id->qp, &wr, &badwr);
	if (rc) {
		errno = rc;
		return fail("ibv_post_send hello");
	}
	if (wait_wc(id->send_cq, &wc))
		return fail("hello completion");
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != CM_HELLO_ID)
		return bad("hello: status %s wr_id %" PRIu64, ibv_wc_status_str(wc.status), wc.wr_id);
	return 0;
}

/* Accepts id's connection (Reads answered one at a time), waits for the
 * client's hello (cm_post_hello) and sends *key, set to addr and rkey (key
 * lies in a region of lkey), as its first message: 0, or 1 after a
 * report. */
static inline int cm_accept_sending_key(struct rdma_cm_id *id, struct target_key *key, void *addr, uint32_t rkey,
					uint32_t lkey)
{
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	struct ibv_wc wc;
	int rc;

	if (rdma_accept(id, &cp))
		return fail("rdma_accept");
	if (wait_wc(id->recv_cq, &wc))
		return fail("hello");
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != CM_HELLO_ID || wc.byte_len != sizeof(cm_hello) ||
	    memcmp(key, cm_hello, sizeof(cm_hello)))
		return bad("no hello from the client: status %s wr_id %" PRIu64 " byte_len %u",
			   ibv_wc_status_str(wc.status), wc.wr_id, wc.byte_len);
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
