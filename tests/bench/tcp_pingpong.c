// SPDX-License-Identifier: GPL-2.0
/*
 * tcp_pingpong: the TCP yardstick for the latency rows of make bench.
 *
 *   tcp_pingpong server PORT SIZE ITERATIONS
 *   tcp_pingpong client PORT ADDRESS SIZE ITERATIONS
 *
 * The client sends SIZE octets, the server sends them back, ITERATIONS
 * times after 100 unmeasured warm-up rounds. Both ends set TCP_NODELAY and
 * busy-poll their receives (recv with MSG_DONTWAIT), as perftest's latency
 * tools busy-poll their completions, so the figure is what a doorbell-less
 * TCP round trip costs on the same link. The client prints half of each
 * round trip, like perftest's one-way figures:
 *
 *   tcp_pingpong: size 2 iterations 2000 one-way us: min 12.01 typical 12.93 avg 14.20 p99 40.12
 *
 * Exits non-zero, with a message, on any error or a peer that closes early.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WARMUP 100
#define MAX_SIZE 65536

static unsigned char buf[MAX_SIZE];

static void die(const char *what)
{
	fprintf(stderr, "tcp_pingpong: %s: %s\n", what, strerror(errno));
	exit(1);
}

static long number(const char *s, long lo, long hi, const char *name)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < lo || v > hi) {
		fprintf(stderr, "tcp_pingpong: %s must be %ld..%ld, not '%s'\n", name, lo, hi, s);
		exit(2);
	}
	return v;
}

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Sends all of buf[0..n). */
static void send_all(int fd, size_t n)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = send(fd, buf + done, n - done, MSG_NOSIGNAL);

		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			die("send");
		}
		done += (size_t)r;
	}
}

/* Busy-polls until n octets arrived. */
static void recv_all(int fd, size_t n)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = recv(fd, buf + done, n - done, MSG_DONTWAIT);

		if (r > 0) {
			done += (size_t)r;
		} else if (r == 0) {
			fprintf(stderr, "tcp_pingpong: the peer closed the connection\n");
			exit(1);
		} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			die("recv");
		}
	}
}

static void nodelay(int fd)
{
	int one = 1;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
		die("TCP_NODELAY");
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static int server(int port, size_t size, long iters)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int one = 1, fd, c;

	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1))
		die("listen");
	c = accept(fd, NULL, NULL);
	if (c < 0)
		die("accept");
	nodelay(c);
	for (long i = 0; i < iters + WARMUP; i++) {
		recv_all(c, size);
		send_all(c, size);
	}
	close(c);
	close(fd);
	return 0;
}

static int client(int port, const char *addr, size_t size, long iters)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	double *t, sum = 0;
	int fd;

	if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
		fprintf(stderr, "tcp_pingpong: '%s' is not an IPv4 address\n", addr);
		return 2;
	}
	t = malloc(sizeof(*t) * (size_t)iters);
	if (!t)
		die("malloc");
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)))
		die("connect");
	nodelay(fd);
	for (int i = 0; i < WARMUP; i++) {
		send_all(fd, size);
		recv_all(fd, size);
	}
	for (long i = 0; i < iters; i++) {
		double t0 = now_us();

		send_all(fd, size);
		recv_all(fd, size);
		t[i] = (now_us() - t0) / 2;
		sum += t[i];
	}
	close(fd);
	qsort(t, (size_t)iters, sizeof(*t), cmp);
	printf("tcp_pingpong: size %zu iterations %ld one-way us: min %.2f typical %.2f avg %.2f p99 %.2f\n",
	       size, iters, t[0], t[iters / 2], sum / iters, t[iters * 99 / 100]);
	free(t);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "server"))
		return server(number(argv[2], 1, 65535, "PORT"), number(argv[3], 1, MAX_SIZE, "SIZE"),
			      number(argv[4], 1, 10000000, "ITERATIONS"));
	if (argc == 6 && !strcmp(argv[1], "client"))
		return client(number(argv[2], 1, 65535, "PORT"), argv[3],
			      number(argv[4], 1, MAX_SIZE, "SIZE"),
			      number(argv[5], 1, 10000000, "ITERATIONS"));
	fprintf(stderr, "usage: tcp_pingpong server PORT SIZE ITERATIONS\n"
			"       tcp_pingpong client PORT ADDRESS SIZE ITERATIONS\n");
	return 2;
}
