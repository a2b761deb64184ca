// SPDX-License-Identifier: GPL-2.0
/*
 * insncount: a QEMU TCG plugin that counts the guest's instructions, for
 * scripts/bench-insns.
 *
 * Wall-clock latency under TCG moves with the host's load by a factor of
 * two and more from one minute to the next; the number of instructions the
 * guest executes for a round trip does not. This plugin counts every
 * translation block's instructions each time the block runs, per vCPU, in
 * three address ranges (user space, kernel text, module space), and keeps
 * a count per block so that a profile by function can be made from the
 * guest's /proc/kallsyms.
 *
 * The guest asks for a snapshot by executing the marker instruction
 * `nopl 0x53495752(%rax)` (bytes 0f 1f 80 52 57 49 53, "RWIS"; a no-op
 * anywhere else): tests/bench/insn-mark.c. Each snapshot appends one line
 * to the file `out=` names:
 *
 *   mark seq=N cpu=C user=U kernel=K module=M
 *
 * (totals since boot, all vCPUs) and writes DIR/prof-NNN.txt (`dir=`): one
 * line per kernel or module block that has run, "vaddr instructions
 * executions", counts since boot. The last snapshot is taken at exit.
 * `modstart=` sets where module space begins (default 0xffffffffc0000000,
 * x86-64 with KASLR).
 *
 * The plugin API (version 1, QEMU 7.2 as Debian 12 ships it, which has
 * plugin support but no plugin header) is declared here by hand, the few
 * calls used. Build: gcc -O2 -shared -fPIC -fvisibility=hidden.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
struct qemu_info; /* not read */
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS };

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id,
					   void (*cb)(qemu_plugin_id_t, struct qemu_plugin_tb *));
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, void (*cb)(unsigned int, void *),
					  enum qemu_plugin_cb_flags flags, void *udata);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn, void (*cb)(unsigned int, void *),
					    enum qemu_plugin_cb_flags flags, void *udata);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, void *), void *udata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);

#define EXPORT __attribute__((visibility("default")))

EXPORT int qemu_plugin_version = 1;

#define MAX_VCPUS 16
enum range { USER, KERNEL, MODULE, NRANGES };
static const char *const range_name[NRANGES] = { "user", "kernel", "module" };

/* One translated block. A block translated again gets a new record; the
 * report adds records by address. Only the vCPU's own thread writes its
 * counter; a snapshot's reads may be a block behind. The range totals are
 * summed from these at each snapshot, so a block's run costs one add. */
struct block {
	uint64_t vaddr;
	uint32_t insns;
	uint32_t range;
	uint64_t execs[MAX_VCPUS];
	struct block *next;
};

static struct block *blocks;
static uint64_t modstart = 0xffffffffc0000000ull;
static const char *dir = ".";
static FILE *out;
static int seq;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const unsigned char marker[7] = { 0x0f, 0x1f, 0x80, 0x52, 0x57, 0x49, 0x53 };

static void block_ran(unsigned int vcpu, void *udata)
{
	struct block *b = udata;

	if (vcpu < MAX_VCPUS)
		b->execs[vcpu]++;
}

/* Writes DIR/prof-N.txt (kernel and module blocks) and adds every block's
 * instructions to t by range. */
static void write_profile(int n, uint64_t t[NRANGES])
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/prof-%03d.txt", dir, n);
	f = fopen(path, "w");
	for (struct block *b = blocks; b; b = b->next) {
		uint64_t e = 0;

		for (int c = 0; c < MAX_VCPUS; c++)
			e += b->execs[c];
		t[b->range] += e * b->insns;
		if (f && e && b->range != USER)
			fprintf(f, "%llx %u %llu\n", (unsigned long long)b->vaddr, b->insns, (unsigned long long)e);
	}
	if (f)
		fclose(f);
}

static void snapshot(unsigned int vcpu, void *udata)
{
	uint64_t t[NRANGES] = { 0 };

	(void)udata;
	pthread_mutex_lock(&lock);
	write_profile(seq, t);
	fprintf(out, "mark seq=%d cpu=%d", seq, vcpu == ~0u ? -1 : (int)vcpu);
	for (int r = 0; r < NRANGES; r++)
		fprintf(out, " %s=%llu", range_name[r], (unsigned long long)t[r]);
	fputc('\n', out);
	fflush(out);
	seq++;
	pthread_mutex_unlock(&lock);
}

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
	uint64_t va = qemu_plugin_tb_vaddr(tb);
	size_t n = qemu_plugin_tb_n_insns(tb);
	struct block *b = calloc(1, sizeof(*b));

	(void)id;
	if (!b)
		return;
	b->vaddr = va;
	b->insns = (uint32_t)n;
	b->range = va < 0x8000000000000000ull ? USER : va >= modstart ? MODULE : KERNEL;
	pthread_mutex_lock(&lock);
	b->next = blocks;
	blocks = b;
	pthread_mutex_unlock(&lock);
	qemu_plugin_register_vcpu_tb_exec_cb(tb, block_ran, QEMU_PLUGIN_CB_NO_REGS, b);
	if (b->range != USER)
		return;
	for (size_t i = 0; i < n; i++) {
		struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);

		if (qemu_plugin_insn_size(insn) == sizeof(marker) &&
		    !memcmp(qemu_plugin_insn_data(insn), marker, sizeof(marker)))
			qemu_plugin_register_vcpu_insn_exec_cb(insn, snapshot, QEMU_PLUGIN_CB_NO_REGS, NULL);
	}
}

static void at_exit(qemu_plugin_id_t id, void *udata)
{
	(void)id;
	(void)udata;
	snapshot(~0u, NULL);
	fclose(out);
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const struct qemu_info *info, int argc, char **argv)
{
	const char *path = "insncount.out";

	(void)info;
	for (int i = 0; i < argc; i++) {
		if (!strncmp(argv[i], "out=", 4)) {
			path = argv[i] + 4;
		} else if (!strncmp(argv[i], "dir=", 4)) {
			dir = argv[i] + 4;
		} else if (!strncmp(argv[i], "modstart=", 9)) {
			modstart = strtoull(argv[i] + 9, NULL, 0);
		} else {
			fprintf(stderr, "insncount: unknown argument '%s'\n", argv[i]);
			return -1;
		}
	}
	out = fopen(path, "a");
	if (!out) {
		perror(path);
		return -1;
	}
	qemu_plugin_register_vcpu_tb_trans_cb(id, translated);
	qemu_plugin_register_atexit_cb(id, at_exit, NULL);
	return 0;
}
