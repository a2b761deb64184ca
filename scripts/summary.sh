# SPDX-License-Identifier: GPL-2.0
# Sourced by scripts/check and scripts/vm-pair.
#
# summary_counts PREFIX LOG: prints "PASSED FAILED" from the last line
# "PREFIX: N passed, N failed" of LOG. A log without that line is a run that
# ended early (boot failure, panic, time limit): it counts the tests that did
# report ("PASS "/"FAIL " lines) and the run itself as one more failure.
summary_counts() {
	local prefix=$1 log=$2 line p f
	line=$(grep -E "^$prefix: [0-9]+ passed, [0-9]+ failed" "$log" 2>/dev/null | tail -1)
	if [ -n "$line" ]; then
		echo "$line" | sed -E "s/^$prefix: ([0-9]+) passed, ([0-9]+) failed.*/\\1 \\2/"
	else
		p=$(grep -c '^PASS ' "$log" 2>/dev/null)
		f=$(grep -c '^FAIL ' "$log" 2>/dev/null)
		echo "${p:-0} $(( ${f:-0} + 1 ))"
	fi
}
