# SPDX-License-Identifier: GPL-2.0
# Soak (issue #6), for scripts/check-perf: SIW_RS_SOAK_JOBS (8) loops side
# by side, each connecting a verified rping pair (rs1 serving rs2, its own
# port), 20 round trips of a size drawn from 64 B to 64 KiB, disconnecting,
# and again, for SIW_RS_SOAK_SECS (300 s). Every pair must pass; afterwards
# no QP is left and the devices serve a new verified rping. Each loop's
# count and first failure land in build/soak/.

# soak_loop K END: pairs on port 7200+K until the clock passes END.
soak_loop() {
	local k=$1 end=$2 port=$((7200 + $1)) n=0 size crc src
	local d=build/soak
	while [ "$(date +%s)" -lt "$end" ]; do
		size=$((64 + RANDOM * 2 % 65472))
		ip netns exec h1 timeout 120 "$WP" rping -s -a 10.55.0.1 -p "$port" -C 20 -S "$size" -V \
			> "$d/server-$k.log" 2>&1 &
		local sp=$!
		wait_listen h1 "$port" "$sp" > /dev/null
		crc=0 src=0
		ip netns exec h2 timeout 120 "$WP" rping -c -a 10.55.0.1 -p "$port" -C 20 -S "$size" -V \
			> "$d/client-$k.log" 2>&1 || crc=$?
		wait "$sp" || src=$?
		if [ "$crc" != 0 ] || [ "$src" != 0 ]; then
			{
				echo "loop $k pair $n (size $size): client exit $crc, server exit $src"
				tail -n 5 "$d/client-$k.log"
				tail -n 5 "$d/server-$k.log"
			} > "$d/fail-$k"
			break
		fi
		n=$((n + 1))
		echo "$n" > "$d/count-$k"
	done
}

test_95_soak() {
	local secs=${SIW_RS_SOAK_SECS:-300} jobs=${SIW_RS_SOAK_JOBS:-8} k total=0 c
	uverbs_pair
	rm -rf build/soak
	mkdir -p build/soak
	local end=$(($(date +%s) + secs)) pids=()
	echo "    $jobs loops of verified rping pairs for $secs s"
	for ((k = 0; k < jobs; k++)); do
		soak_loop "$k" "$end" &
		pids+=($!)
	done
	wait "${pids[@]}" || true
	for ((k = 0; k < jobs; k++)); do
		c=$(cat "build/soak/count-$k" 2>/dev/null || echo 0)
		total=$((total + c))
		[ "$c" -gt 0 ] || fail_because "loop $k completed no pair" || return 1
	done
	echo "    $total pairs (x 20 verified round trips) completed"
	if ls build/soak/fail-* > /dev/null 2>&1; then
		cat build/soak/fail-* | sed 's/^/    /'
		fail_because "a pair failed" || return 1
	fi
	local n
	n=$(rdma res show qp 2>/dev/null | grep -c lqpn || true)
	[ "$n" = 0 ] || fail_because "$n QPs left after the soak" || return 1
	server_client h1 h2 120 -- "$WP" rping -s -a 10.55.0.1 -C 10 -S 4096 -V \
		-- "$WP" rping -c -a 10.55.0.1 -C 10 -S 4096 -V
}
