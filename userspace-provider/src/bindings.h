/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Input of bindgen (build.rs): rdma-core's provider interface and the
 * siw_rs user/kernel ABI, the one definition of both for the provider.
 */
#include <infiniband/driver.h>
#include <infiniband/kern-abi.h>
#include <infiniband/verbs.h>
#include <siw_rs-abi.h>

/* The doorbell ioctl numbers as constants bindgen evaluates (it does not
 * expand the _IO() macro). */
enum siw_rs_provider_ioctl {
	SIW_RS_PROVIDER_SQ_DOORBELL = SIW_RS_IOCTL_SQ_DOORBELL,
	SIW_RS_PROVIDER_RQ_DOORBELL = SIW_RS_IOCTL_RQ_DOORBELL,
};
