# SPDX-License-Identifier: GPL-2.0
# The full-size scale checks of issue #7, for scripts/check-perf (the perf
# kernel): 1,000 connected QPs at once, a 4 GiB MR (and one of 4 GiB + 4
# MiB, so that an access crosses the 4 GiB offset), 100,000 registration
# cycles in batches of 10,000. The tests are tests/vm/t-92-scale.sh's;
# make check runs them there with small sizes on the debug kernel.
: "${SIW_RS_SCALE_QPS:=1000}"
: "${SIW_RS_SCALE_MR_SIZES:=4294967296 4299161600}"
: "${SIW_RS_SCALE_REGS:=100000}"
: "${SIW_RS_SCALE_REGS_BATCH:=10000}"
export SIW_RS_SCALE_QPS SIW_RS_SCALE_MR_SIZES SIW_RS_SCALE_REGS SIW_RS_SCALE_REGS_BATCH
. tests/vm/t-92-scale.sh
