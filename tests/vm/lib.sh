# SPDX-License-Identifier: GPL-2.0
# Shared helpers for the VM tests (sourced by tests/vm/run inside the guest).
# A test is a function; it returns non-zero (after calling `fail_because`) on
# failure. The runner adds the kernel-log and kmemleak checks around each one.

SIW_RS_KO=${SIW_RS_KO:?SIW_RS_KO must name the built siw_rs.ko}

# Kernel log patterns that fail any test: warnings, KASAN, lockdep, hung
# tasks, Rust panics, leaks, SLUB debug reports ("BUG kmalloc-64 (Tainted:
# ...): Left Redzone overwritten", no colon after BUG). A kernel general
# protection fault reads "general protection fault: 0000 [#1]" or
# "general protection fault, probably for ..."; a process's reads
# "traps: NAME[PID] general protection fault ip:...", and fails its test
# through the process's exit status instead.
BAD_DMESG='WARNING:|BUG:|BUG [[:alnum:]_.:-]+ \(|KASAN|UBSAN|Oops|general protection fault[,:]|possible recursive locking|circular locking|inconsistent lock state|INFO: task .* blocked|rust_panic|panicked at|unreferenced object|refcount_t:|list_add corruption|list_del corruption'

# Whether a kernel report belongs to upstream siw alone: in a test named
# *_upstream_siw (which never loads siw_rs), a log that names siw_rs
# nowhere and has frames in siw's module, or comes from iw_cm's work queue
# (only siw feeds iw_cm in such a test; iw_cm BUG()s on a connection
# event out of order, such as siw's CLOSE for an id it never reported
# ESTABLISHED), is a finding about the reference driver, to report rather
# than to fail siw_rs on. Any other report still fails.
upstream_siw_report() {
	case $1 in *_upstream_siw) ;; *) return 1 ;; esac
	# (An oops names the last module unloaded: siw_rs, from the test
	# before. That is not siw_rs in the report.)
	printf '%s\n' "$2" | grep -qE '\[siw\]|Workqueue: iw_cm_wq ' &&
		! printf '%s\n' "$2" | sed 's/\[last unloaded: siw_rs[^]]*\]//' | grep -q 'siw_rs'
}

# nap SECS: a sleep without a process. A fork and exec costs 0.3-1 s on the
# debug kernel under TCG, so polling loops wait with a read that times out
# on a FIFO this shell holds open at both ends (nothing is ever written).
NAP_FIFO=/run/siw_rs-nap.$$
[ -p "$NAP_FIFO" ] || mkfifo "$NAP_FIFO"
exec {NAP_FD}<>"$NAP_FIFO"
nap() { read -rt "$1" -u "$NAP_FD" _ || true; }

# cgroup_empty DIR: no process is left in the cgroup DIR.
cgroup_empty() {
	local k v
	while read -r k v; do
		[ "$k" = populated ] && { [ "$v" = 0 ]; return; }
	done < "$1/cgroup.events"
	return 1
}

fail_because() { printf '    %s\n' "$*" >&2; return 1; }

# wait_pid PID SECS: waits up to SECS seconds for the background job PID
# and returns its status; 124 if it is still running then (it is left
# running: a task stuck in the kernel cannot be killed).
wait_pid() {
	local s=$EPOCHSECONDS
	while kill -0 "$1" 2>/dev/null; do
		(( EPOCHSECONDS - s < $2 )) || return 124
		nap 0.2
	done
	wait "$1"
}

# bounded SECS CMD...: runs CMD; fails (124) if it has not ended after
# SECS seconds, and leaves it running.
bounded() {
	local secs=$1
	shift
	"$@" 0<&0 &
	wait_pid $! "$secs"
}

# task_stacks PID...: the kernel stack of every thread of each PID.
task_stacks() {
	local p t
	for p in "$@"; do
		for t in /proc/"$p"/task/*; do
			[ -e "$t/stack" ] || continue
			echo "    task ${t##*/} ($(cat "$t/comm" 2>/dev/null)):"
			sed 's/^/      /' "$t/stack" 2>/dev/null
		done
	done
}

# Whether the kernel has oopsed since boot (taint flag D): what a dead task
# held (locks, references) stays held, so a kmemleak scan or a device
# removal may wait forever, and results after it mean little.
kernel_died() { (( $(< /proc/sys/kernel/tainted) & 128 )); }

# Devices a test had to leave behind because upstream siw cannot let them
# go (a task stuck in its kernel code holds them), one name per line, or
# "(module siw)" when rmmod itself hung: the runner does not try to remove
# them (it would wait forever), nor siw.
ABANDONED_DEVS=/run/siw_rs-abandoned-devs

# Run a command that must fail; its stderr is kept for the log.
must_fail() {
	if "$@" 2>/tmp/must_fail.err; then
		fail_because "expected failure: $*"
		return 1
	fi
	printf '    (expected error) %s: %s\n' "$*" "$(tr '\n' ' ' </tmp/must_fail.err)"
}

# consumer_fail CLEANUP WHAT MSG FILE...: for the kernel-consumer tests
# (NFS, iSER) on t1: says why the test failed (MSG, if not empty), runs
# CLEANUP, removes t1 (bounded: a device a consumer still holds would block
# it) and the test's FILEs, so the next test starts clean. Returns 1.
consumer_fail() {
	local cleanup=$1 what=$2 msg=$3
	shift 3
	[ -z "$msg" ] || fail_because "$msg"
	"$cleanup"
	bounded 60 rdma link del t1 2>/dev/null || fail_because "rdma link del t1 did not finish after $what was stopped"
	rm -f "$@"
	return 1
}

load_siw_rs() { [ -d /sys/module/siw_rs ] || insmod "$SIW_RS_KO"; }
unload_siw_rs() { [ ! -d /sys/module/siw_rs ] || rmmod siw_rs; }

# Whether an RDMA device exists.
have_dev() { [ -e "/sys/class/infiniband/$1" ]; }

# Fail (with a message) if an RDMA device exists.
expect_no_dev() {
	if have_dev "$1"; then
		fail_because "${2:-device $1 exists but should not}"
		return 1
	fi
}

# Wait up to $2 seconds (default 30) for a device to disappear.
wait_dev_gone() {
	local i
	for ((i = 0; i < ${2:-30} * 10; i++)); do
		have_dev "$1" || return 0
		nap 0.1
	done
	return 1
}

# Port state of an RDMA device's port 1 as `rdma link` prints it (sysfs
# has it as "4: ACTIVE"); nothing if there is no such device.
link_state() {
	local s
	{ read -r s < "/sys/class/infiniband/$1/ports/1/state"; } 2>/dev/null || return 0
	echo "${s#*: }"
}

# rs1 on h1/veth1 and rs2 on h2/veth2 (the usual pair), siw_rs on
# both ends; shared by the uverbs, fuzz, fault and soak tests.
uverbs_pair() {
	scripts/topology up
	load_siw_rs
	ip netns exec h1 rdma link add rs1 type siw_rs netdev veth1
	ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
}

# siw1 (upstream siw) on h1/veth1 and rs2 (siw_rs) on h2/veth2: the pair
# of the tests against upstream siw.
mixed_pair() {
	scripts/topology up
	modprobe siw
	load_siw_rs
	ip netns exec h1 rdma link add siw1 type siw netdev veth1
	ip netns exec h2 rdma link add rs2 type siw_rs netdev veth2
}

# hang_watch SECS: if the test still runs after SECS, print what every
# process of the test waits on (kernel stacks of blocked ones) and the
# kernel log's tail, so that a hang explains itself, then end the test;
# HANG_WATCH is its pid.
hang_watch() {
	local test_shell=$BASHPID
	(
		sleep "$1"
		echo "    WATCHDOG: the test still runs after $1 s"
		ps -eo pid=,stat=,wchan:32=,comm= | awk '$4 !~ /^\[/ && $2 !~ /^[RI]/' |
			grep -vE ' (bash|sleep|ps|awk|sed|grep|timeout)$' | sed 's/^/    ps| /'
		for p in $(ps -eo pid=,stat= | awk '$2 ~ /^D/ {print $1}'); do
			echo "    blocked: $p $(cat /proc/"$p"/comm 2>/dev/null)"
			sed 's/^/      /' /proc/"$p"/stack 2>/dev/null
		done
		echo w > /proc/sysrq-trigger 2>/dev/null
		dmesg | tail -n 80 | sed 's/^/    dmesg| /'
		# Its processes may be stuck in the kernel: end the test's shell,
		# so that the runner reports it and checks the kernel log.
		echo "    WATCHDOG: ending the test"
		kill -KILL "$test_shell"
	) &
	HANG_WATCH=$!
}

# Whether the kernel was booted with kmemleak=off (make check's 'rest'
# VM). (Builtins only: the runner asks after every test.)
kmemleak_off_at_boot() {
	local c
	read -r c < /proc/cmdline
	[[ " $c " == *" kmemleak=off "* ]]
}

# Whether kmemleak runs. Booted with kmemleak=off, the kernel still
# creates its debugfs file, and refuses a scan there with EPERM.
kmemleak_available() { [ -w /sys/kernel/debug/kmemleak ] && ! kmemleak_off_at_boot; }

kmemleak_clear() {
	kmemleak_available || return 0
	echo clear > /sys/kernel/debug/kmemleak
}

# no_qps DEV: no QP is left on DEV (every process's objects released).
no_qps() {
	local n i
	for ((i = 0; i < 50; i++)); do
		n=$(rdma res show qp link "$1/1" 2>/dev/null | grep -c lqpn || true)
		[ "$n" = 0 ] && return 0
		nap 0.2
	done
	rdma res show qp link "$1/1" | sed 's/^/    qp| /'
	fail_because "$n QPs left on $1"
}

# kmemleak reports an unreferenced object only once two scans have seen it
# unchanged (the first records a checksum), and a scan takes 13-20 s on the
# debug kernel under TCG. So the runner scans after a test only when 600 s
# have passed since its last scan: a leak made in one test is reported at
# the end of a later one, and kmemleak_check names the test that allocated
# it from the jiffies kmemleak stamps on each object. (The "clear" before
# each test only hides objects that were unreferenced in the last scan;
# one allocated since, or seen there for the first time, stays in play.)
# KMEMLEAK_TESTS holds "START_JIFFIES TEST" lines, one per test so far.

jiffies_now() {
	local k v
	while read -r k v; do
		[ "$k" = jiffies: ] && { echo "$v"; return; }
	done < /proc/timer_list
}

# kmemleak_check [final]: scans (twice, after kmemleak's minimum age, for
# the final check of a run), prints the report and fails if there is one.
kmemleak_check() {
	kmemleak_available || return 0
	if [ "${1:-}" = final ]; then
		nap 6
		echo scan > /sys/kernel/debug/kmemleak
	fi
	echo scan > /sys/kernel/debug/kmemleak
	local report i
	report=$(< /sys/kernel/debug/kmemleak)
	[ -n "$report" ] || return 0
	# The report lists the objects still allocated and unreferenced. One
	# freed later was not leaked, only kept by a reference kmemleak does
	# not scan (test_85 has twice reported a thread's task_struct and what
	# hangs off it, after fault injection into its process): three more
	# scans, 10 s apart, and whatever is still listed then is reported.
	for ((i = 0; i < 3; i++)); do
		nap 10
		echo scan > /sys/kernel/debug/kmemleak
		report=$(< /sys/kernel/debug/kmemleak)
		if [ -z "$report" ]; then
			echo "    kmemleak: the objects it reported were freed within $(((i + 1) * 10)) s and scans: not leaked" >&2
			return 0
		fi
	done
	# Each object's header and allocation backtrace, without the hex
	# dumps, so the backtraces of a few objects fit (one was cut off
	# at 60 lines when test_85 reported five core objects).
	printf '%s\n' "$report" | grep -v -e '^  hex dump' -e '^    [0-9a-f][0-9a-f] [0-9a-f][0-9a-f] ' | head -150 >&2
	printf '%s\n' "$report" | awk -v tests="$KMEMLEAK_TESTS" '
		BEGIN { n = split(tests, line, "\n")
			m = 0
			for (i = 1; i <= n; i++) if (split(line[i], f, " ") == 2) { m++; start[m] = f[1] + 0; name[m] = f[2] } }
		/^ *comm ".*", pid [0-9]+, jiffies [0-9]+/ {
			j = $NF + 0; who = "before the first test"
			for (i = 1; i <= m; i++) if (j >= start[i]) who = "during " name[i]
			count[who]++ }
		END { for (w in count) printf "    kmemleak: %d unreferenced objects allocated %s\n", count[w], w }' >&2
	fail_because "kmemleak reports unreferenced objects"
}

# Run a command with the built siw_rs provider active ($WP for commands
# run through timeout or ip netns exec, wp in the shell).
WP=userspace-provider/with-provider
wp() { "$WP" "$@"; }

# start_holder MODE NS DEVICE LOG: starts `doorbell-file MODE DEVICE`
# (tests/vm/doorbell-file.c) in namespace NS (none if empty), output in
# LOG, its stdin a fifo; sets the caller's `holder` (its pid) and `w` (the
# fifo's write end: a line lets it go on) and waits until it holds its
# context. If it does not within 30 s, closes the fifo and fails.
start_holder() {
	local fifo=/tmp/db-$1.fifo i
	rm -f "$fifo"; mkfifo "$fifo"
	${2:+ip netns exec "$2"} "$WP" build/doorbell-file "$1" "$3" < "$fifo" > "$4" 2>&1 &
	holder=$!
	exec {w}> "$fifo"
	for ((i = 0; i < 300; i++)); do
		grep -q '^held' "$4" && break
		nap 0.1
	done
	if ! grep -q '^held' "$4"; then
		exec {w}>&-
		fail_because "the holder did not start: $(cat "$4")"
		return 1
	fi
}

# live_context_across NS DEVICE WHAT CMD...: `doorbell-file live DEVICE`
# holds a context with objects on DEVICE, run in namespace NS; once it
# holds them, CMD (WHAT names it), which takes the device away from the
# process, must complete within 30 s; the process must then find its
# context ended (the program's checks) and exit 0.
live_context_across() {
	local ns=$1 dev=$2 what=$3
	shift 3
	local log=/tmp/db-live.log rc=0 w holder
	start_holder live "$ns" "$dev" "$log" || return 1
	bounded 30 "$@" || rc=$?
	if [ "$rc" != 0 ]; then
		exec {w}>&-
		fail_because "$what under a live context: exit $rc (124: still waiting after 30 s)"
		return 1
	fi
	echo "    $what completed while a process held a context on $dev"
	echo go >&$w
	exec {w}>&-
	rc=0
	wait_pid "$holder" 60 || rc=$?
	sed 's/^/    /' "$log"
	[ "$rc" = 0 ] && grep -q '^released' "$log" || fail_because "the process after $what (exit $rc)"
}

# log_tail PREFIX FILE N: the last N lines of FILE, each after PREFIX
# (builtins only: server_client runs it twice per call).
log_tail() {
	local -a l
	local i
	mapfile -t l 2>/dev/null < "$2" || return 0
	for ((i = ${#l[@]} > $3 ? ${#l[@]} - $3 : 0; i < ${#l[@]}; i++)); do
		printf '%s%s\n' "$1" "${l[i]}"
	done
}

# server_client SERVER_NS CLIENT_NS TIMEOUT -- SERVER_CMD... -- CLIENT_CMD...
# Starts the server, gives it time to listen, runs the client; both must
# exit 0 within TIMEOUT seconds. Output of both goes to the log.
server_client() {
	local sns=$1 cns=$2 t=$3
	shift 4
	local scmd=() ccmd=()
	while [ "$1" != -- ]; do scmd+=("$1"); shift; done
	shift
	ccmd=("$@")
	ip netns exec "$sns" timeout "$t" "${scmd[@]}" > /tmp/server.log 2>&1 &
	local spid=$!
	wait_listen "$sns" "$(server_port "${scmd[@]}")" "$spid"
	local crc=0 src=0
	ip netns exec "$cns" timeout "$t" "${ccmd[@]}" > /tmp/client.log 2>&1 || crc=$?
	# A client that failed leaves a server waiting for it: end the server
	# rather than wait for its timeout.
	[ "$crc" = 0 ] || kill "$spid" 2>/dev/null || true
	wait "$spid" || src=$?
	log_tail '    server| ' /tmp/server.log 15
	log_tail '    client| ' /tmp/client.log 15
	[ "$crc" = 0 ] || fail_because "client exited $crc: ${ccmd[*]}" || return 1
	[ "$src" = 0 ] || fail_because "server exited $src: ${scmd[*]}" || return 1
}

# verified_rping COUNT SIZE: a verified rping pair, rs1 serving rs2 (used
# by the fault tests and by test_52; here so that each test file runs on
# its own).
verified_rping() {
	server_client h1 h2 240 -- "$WP" rping -s -a 10.55.0.1 -C "$1" -S "$2" -V \
		-- "$WP" rping -c -a 10.55.0.1 -C "$1" -S "$2" -V
}

# netem_on ARGS...: a netem qdisc with ARGS ("loss 3%", ...) on both ends
# of the veth pair. The peers' link addresses are fixed first: netem also
# drops ARP, and rping gives address resolution 2 s, less than two ARP
# retransmissions take. The tests are about the stream, not ARP.
netem_on() {
	modprobe sch_netem
	local mac1 mac2
	mac1=$(ip -n h1 -o link show veth1) mac2=$(ip -n h2 -o link show veth2)
	mac1=${mac1#*link/ether } mac2=${mac2#*link/ether }
	ip -n h2 neigh replace 10.55.0.1 lladdr "${mac1%% *}" dev veth2 nud permanent
	ip -n h1 neigh replace 10.55.0.2 lladdr "${mac2%% *}" dev veth1 nud permanent
	ip -n h1 link set veth1 txqueuelen 1000
	ip -n h2 link set veth2 txqueuelen 1000
	tc -n h1 qdisc add dev veth1 root netem "$@"
	tc -n h2 qdisc add dev veth2 root netem "$@"
}

# qdisc_drops DEV [TC_OPTION...]: the frames DEV's root qdisc dropped
# (nothing if it has none).
qdisc_drops() {
	local dev=$1
	shift
	{ tc "$@" -s qdisc show dev "$dev" || true; } |
		awk '{ for (i = 1; i < NF; i++) if ($i == "(dropped") { sub(",", "", $(i + 1)); print $(i + 1); exit } }'
}

# netem_off [delay]: removes what netem_on set up, and fails the test if
# netem dropped nothing (then it did not test loss), unless the netem was
# a delay only ("delay").
netem_off() {
	local drops=0 d h
	for h in h1:veth1 h2:veth2; do
		d=$(qdisc_drops "${h#*:}" -n "${h%:*}")
		drops=$((drops + ${d:-0}))
	done
	echo "    netem dropped $drops packets"
	tc -n h1 qdisc del dev veth1 root
	tc -n h2 qdisc del dev veth2 root
	ip -n h2 neigh del 10.55.0.1 dev veth2
	ip -n h1 neigh del 10.55.0.2 dev veth1
	[ "${1:-}" = delay ] || [ "$drops" -gt 0 ] || fail_because "netem dropped nothing: the test did not test loss"
}

# The TCP port a test server command listens on: rping 7174, rdma_server
# and ucmatose 7471, perftest 18515, iwarp-peer its --listen port, rfc7306,
# access, inline-verify and zcopy-verify their last argument.
server_port() {
	local a prev=
	for a in "$@"; do
		case $prev in --listen) echo "${a##*:}"; return ;; -p) echo "$a"; return ;; esac
		prev=$a
	done
	case "$*" in
	*rping*) echo 7174 ;;
	*rdma_server* | *ucmatose*) echo 7471 ;;
	*rfc7306* | *build/access\ * | *inline-verify* | *zcopy-verify*) echo "${@: -1}" ;; # PROG server ADDR PORT
	*) echo 18515 ;;
	esac
}

# wait_listen NS PORT [PID]: waits (up to 60 s) until something listens on
# PORT in namespace NS; a server under the debug kernel and TCG may take a
# few seconds to get there. With the PID of a process in NS (the server's
# `ip netns exec`), it reads that process's view of /proc/net/tcp{,6}
# instead of starting a process per look, and stops once the process has
# ended: it will not listen any more.
wait_listen() {
	local i
	for ((i = 0; i < 600; i++)); do
		if [ -n "${3:-}" ]; then
			tcp_listens "$3" "$2" && return 0
			kill -0 "$3" 2>/dev/null || { echo "    (the server, pid $3, ended before it listened on port $2)"; return; }
		else
			[ -n "$(ip netns exec "$1" ss -Hltn "sport = :$2" 2>/dev/null)" ] && return 0
		fi
		nap 0.1
	done
	echo "    (nothing listens on port $2 in $1 after 60 s)"
}

# tcp_listens PID PORT: a TCP socket listens on PORT in PID's namespace.
tcp_listens() {
	local hex f sl local rem st rest
	printf -v hex ':%04X' "$2"
	for f in "/proc/$1/net/tcp" "/proc/$1/net/tcp6"; do
		while read -r sl local rem st rest; do
			[ "$st" = 0A ] && [[ $local == *"$hex" ]] && return 0
		done < "$f"
	done 2>/dev/null
	return 1
}
