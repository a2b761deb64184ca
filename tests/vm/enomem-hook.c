// SPDX-License-Identifier: GPL-2.0
// The preload library of t-80-faults.sh's test_85 and test_86 (see the
// comment above enomem_hook_up there): it sets
// /proc/thread-self/make-it-fail around each ioctl, write, read and mmap
// on a file the RDMA stack handed out, from the process's first
// rdma_create_id on, and clears it as the call returns. Built on the host
// by scripts/check (build/enomem-hook.so): compiling it in the VM took
// tens of seconds of make check's time on the debug kernel.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile int armed;
/* This thread: its make-it-fail file, opened (while not failing) on its
 * first wrapped call. */
static __thread int flag_fd = -1;

static volatile int ever_armed;

/* Whether a failed call is worth retrying: an injected failure. */
static int transient(void)
{
	return errno == ENOMEM || errno == EAGAIN || errno == EINTR;
}

/* Retried: the open and the write may themselves fail by injection. */
static void put_flag(const char *path, const char *v)
{
	for (int i = 0; i < 100000; i++) {
		int fd = open(path, O_WRONLY);
		if (fd < 0 && transient())
			continue;
		if (fd < 0)
			return;
		ssize_t n = syscall(SYS_write, fd, v, 1);
		close(fd);
		if (n == 1)
			return;
	}
}

/* Sets this thread flag to v (retried: the write may fail by injection
 * once the flag is set). */
static void self_flag(char v)
{
	if (flag_fd < 0)
		flag_fd = open("/proc/thread-self/make-it-fail", O_WRONLY);
	for (int i = 0; flag_fd >= 0 && i < 100000; i++)
		if (syscall(SYS_write, flag_fd, &v, 1) == 1)
			return;
}

/* Whether the flag at path reads 0 (retried like put_flag). */
static int flag_clear(const char *path)
{
	for (int i = 0; i < 100000; i++) {
		char c = 0;
		int fd = open(path, O_RDONLY);
		if (fd < 0 && transient())
			continue;
		if (fd < 0)
			return errno == ENOENT; /* the thread is gone */
		ssize_t n = syscall(SYS_read, fd, &c, 1);
		close(fd);
		if (n == 1)
			return c == 0x30;
	}
	return 0;
}

/* make-it-fail cleared for every thread, passes repeated until one finds
 * every flag reading 0. Only async-signal-safe calls (open, getdents64,
 * read, write): the signal handler runs it too. */
static void unfail_all(void)
{
	char buf[4096], path[64];

	if (!ever_armed)
		return;
	armed = 0;
	put_flag("/proc/thread-self/make-it-fail", "0");
	for (int pass = 0; pass < 1000; pass++) {
		int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY), all = 1;
		long n;

		if (fd < 0 && transient())
			continue;
		if (fd < 0)
			return;
		while ((n = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0)
			for (long off = 0; off < n;) {
				struct dirent64 *e = (struct dirent64 *)(buf + off);
				size_t len = strlen(e->d_name);

				off += e->d_reclen;
				if (e->d_name[0] == 0x2e || len > 20)
					continue;
				memcpy(path, "/proc/self/task/", 16);
				memcpy(path + 16, e->d_name, len);
				memcpy(path + 16 + len, "/make-it-fail", 14);
				put_flag(path, "0");
				if (!flag_clear(path))
					all = 0;
			}
		close(fd);
		if (n == 0 && all)
			return;
	}
}

/* A fatal signal (SIGTERM from timeout(1), a crash) would skip the
 * destructor: clear the flags first, then die of the signal as before. */
static void on_fatal(int sig)
{
	unfail_all();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* Whether fd is the kind the RDMA stack hands out: a character device
 * (uverbs, rdma_cm) or an anonymous inode (completion and async event
 * channels). Never a file of the 9p root, nor the logs. */
static int rdma_fd(int fd)
{
	struct stat st;

	return fd > 2 && fstat(fd, &st) == 0 && (S_ISCHR(st.st_mode) || (st.st_mode & S_IFMT) == 0);
}

/* The wrapped calls: allocations fail while the kernel runs them. */
#define REAL(name) static __typeof__(name) *real; if (!real) real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)
#define FAILING(fd, call) ({ int on_ = armed && rdma_fd(fd); if (on_) self_flag(0x31); \
	__typeof__(call) r_ = (call); int e_ = errno; if (on_) self_flag(0x30); errno = e_; r_; })

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	void *arg;
	REAL(ioctl);

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	return FAILING(fd, real(fd, req, arg));
}

ssize_t write(int fd, const void *b, size_t n)
{
	REAL(write);
	return FAILING(fd, real(fd, b, n));
}

ssize_t read(int fd, void *b, size_t n)
{
	REAL(read);
	return FAILING(fd, real(fd, b, n));
}

void *mmap(void *a, size_t n, int prot, int fl, int fd, off_t off)
{
	REAL(mmap);
	return FAILING(fd, real(a, n, prot, fl, fd, off));
}

int rdma_create_id(void *ch, void **id, void *ctx, int ps)
{
	static const int fatal[] = { SIGTERM, SIGINT, SIGHUP, SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL };
	static int (*real)(void *, void **, void *, int);

	if (!real)
		real = (int (*)(void *, void **, void *, int))dlsym(RTLD_NEXT, "rdma_create_id");
	if (!armed) {
		for (unsigned int i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
			signal(fatal[i], on_fatal);
		mlockall(MCL_CURRENT);
		ever_armed = armed = 1;
	}
	return real(ch, id, ctx, ps);
}

__attribute__((destructor)) static void unfail(void)
{
	unfail_all();
}
