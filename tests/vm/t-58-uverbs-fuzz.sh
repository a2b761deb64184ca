# SPDX-License-Identifier: GPL-2.0
# The uverbs surface under a randomized driver of bad verbs calls (issue #6):
# tests/vm/uverbs-fuzz.c, run as an unprivileged user, against rs2 while
# well-behaved verified rping pairs use rs1 and rs2.

# Verified rping pairs (rs1 in h1 serving rs2 in h2) one after the other
# until /tmp/uvf.done appears; the count in /tmp/uvf-pairs.ok, the first
# failure's logs in /tmp/uvf-pairs.fail. Each pair takes a port of its own,
# so that a connection in TIME_WAIT never refuses the next server.
uvf_pair_loop() {
	local n=0 src crc port
	rm -f /tmp/uvf-pairs.fail /tmp/uvf-pairs.ok
	while [ ! -e /tmp/uvf.done ]; do
		port=$((7180 + n % 16))
		ip netns exec h1 timeout 300 "$WP" rping -s -a 10.55.0.1 -p "$port" -C 20 -S 1024 -V \
			> /tmp/uvf-pair-server.log 2>&1 &
		local sp=$!
		wait_listen h1 "$port" "$sp"
		crc=0 src=0
		ip netns exec h2 timeout 300 "$WP" rping -c -a 10.55.0.1 -p "$port" -C 20 -S 1024 -V \
			> /tmp/uvf-pair-client.log 2>&1 || crc=$?
		wait "$sp" || src=$?
		if [ "$crc" != 0 ] || [ "$src" != 0 ]; then
			{
				echo "pair $n: client exit $crc, server exit $src"
				sed 's/^/client| /' /tmp/uvf-pair-client.log | tail -n 5
				sed 's/^/server| /' /tmp/uvf-pair-server.log | tail -n 5
			} > /tmp/uvf-pairs.fail
			break
		fi
		n=$((n + 1))
		echo "$n" > /tmp/uvf-pairs.ok
	done
}

# RDMA objects (QPs, CQs, MRs, PDs, ...) of the restrack on rs1/rs2 that a
# process named uverbs-fuzz owns.
uvf_leftovers() {
	local t
	for t in qp cq mr pd srq; do
		{ rdma res show "$t" 2>/dev/null || true; } | grep -w 'comm uverbs-fuzz' || true
	done
}

# rdma res counts of every kind on our devices, summed.
uvf_objects() { { rdma res show 2>/dev/null || true; } | awk '/^[0-9]+: rs/ {for (i = 4; i <= NF; i += 2) n += $i} END {print n + 0}'; }

# Bad verbs calls from an unprivileged process (sizes, flags, handles,
# addresses, state transitions, destroy orders, raw write() commands,
# mmap offsets, garbage in siw_rs's rings, children SIGKILLed mid-run; see
# the head of tests/vm/uverbs-fuzz.c) get the right errors and break
# nothing: the fuzzer's assertions hold, the rping pairs meanwhile verify
# their data, nothing of the fuzzer is left in the restrack afterwards, and
# the device serves a new verified rping. The runner checks the kernel log
# (warnings, KASAN, lockdep, hung tasks) and kmemleak.
test_58_uverbs_fuzzer_unprivileged() {
	local secs=${SIW_RS_UVERBS_FUZZ_SECS:-40} seed=${SIW_RS_UVERBS_FUZZ_SEED:-$(date +%s)}
	local before rc=0 start pairs ok left after
	uverbs_pair
	# The kernel creates the uverbs nodes world-accessible (uverbs_devnode),
	# as Debian's udev rules keep them; make sure of it in any case.
	local n
	for n in /dev/infiniband/uverbs*; do
		[ "$(stat -c %a "$n")" = 666 ] || chmod 0666 "$n"
	done
	before=$(uvf_objects)
	hang_watch $((secs + 240))
	rm -f /tmp/uvf.done
	uvf_pair_loop &
	pairs=$!
	start=$(date +%s)
	echo "    fuzzing rs2 as uid 65534 for $secs s, seed $seed"
	ip netns exec h2 setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
		timeout $((secs + 120)) "$WP" build/uverbs-fuzz --dev rs2 --secs "$secs" --seed "$seed" \
		> /tmp/uvf.log 2>&1 || rc=$?
	echo "    (the fuzzer ran $(( $(date +%s) - start )) s, exit status $rc)"
	touch /tmp/uvf.done
	wait "$pairs" || true
	kill "$HANG_WATCH" 2>/dev/null || true
	cp /tmp/uvf.log build/uvf-fuzz.log 2>/dev/null || true
	# (awk reads to the end: a pipe closed early would fail the test.)
	awk '/^(MISMATCH|FINDING|NOTE)/ && n++ < 40 {print "    " $0}' /tmp/uvf.log
	awk '/^uverbs-fuzz:/ {print "    " $0}' /tmp/uvf.log
	ok=$(cat /tmp/uvf-pairs.ok 2>/dev/null || echo 0)
	echo "    well-behaved pairs meanwhile: $ok x 20 verified pings of 1024 octets"
	if [ -e /tmp/uvf-pairs.fail ]; then
		sed 's/^/    /' /tmp/uvf-pairs.fail
		fail_because "a well-behaved rping pair failed while the fuzzer ran"
		return 1
	fi
	[ "$ok" -ge 1 ] || fail_because "no well-behaved rping pair completed meanwhile" || return 1
	if [ "$rc" != 0 ]; then
		tail -n 5 /tmp/uvf.log | sed 's/^/    log| /'
		fail_because "uverbs-fuzz exited $rc (seed $seed)"
		return 1
	fi
	grep -q '^uverbs-fuzz: seed .* 0 mismatches, 0 findings$' /tmp/uvf.log ||
		fail_because "uverbs-fuzz printed no clean summary" || return 1
	# The fuzzer and its children are gone, and with them their objects.
	left=$(uvf_leftovers)
	[ -z "$left" ] || fail_because "objects of uverbs-fuzz left: $left" || return 1
	after=$(uvf_objects)
	[ "$after" = "$before" ] ||
		fail_because "RDMA objects before $before, after $after: $(rdma res show 2>&1 | tr '\n' ' ')" || return 1
	echo "    the device still serves a new verified rping"
	server_client h1 h2 120 -- "$WP" rping -s -a 10.55.0.1 -C 5 -S 1024 -V \
		-- "$WP" rping -c -a 10.55.0.1 -C 5 -S 1024 -V || return 1
}
