# SPDX-License-Identifier: GPL-2.0
#
# siw_rs top-level Makefile.
#
#   make            build siw_rs.ko (against the cached debug test kernel) and the provider
#   make check      host tests + VM tests; prints "N passed, N failed"
#   make demo       boot a VM, create two siw_rs devices on a netns pair, show them working
#   make bench      benchmarks on the perf kernel (JSON + plot)
#   make bench-insns guest instructions per round trip, counted by QEMU (perf kernel)
#   make check-perf long runs on the perf kernel (perftest -a sweeps, rping -C 1000)
#   make KDIR=/lib/modules/$(uname -r)/build
#                   build against another kernel (it must have CONFIG_RUST and
#                   have been built by /usr/bin/rustc)
#
# When kbuild itself reads this directory (M=...), it uses Kbuild, not this file.

SHELL := /bin/bash
REPO := $(CURDIR)
FLAVOUR ?= debug
-include scripts/toolchain.env
export LIBCLANG_PATH

KVARS := LLVM=$(LLVM) RUSTC=$(RUSTC) HOSTRUSTC=$(HOSTRUSTC) RUSTDOC=$(RUSTDOC) \
	 BINDGEN=$(BINDGEN) RUST_LIB_SRC=$(RUST_LIB_SRC)

ifeq ($(origin KDIR),undefined)
KDIR_FROM_CACHE := 1
BUILD := build/$(FLAVOUR)
else
BUILD := build/kdir-$(subst /,_,$(KDIR))
endif

# What kbuild needs to see, mirrored into $(BUILD) so that objects of
# different kernels never mix and the source tree stays clean.
MODULE_SRCS := Kbuild $(wildcard siw_rs/*.rs siw_rs/*.c siw_rs/*.h) siw_rs/Kbuild \
	       siw_rs/bindgen_allowlist $(wildcard iwarp-core/src/*.rs) $(wildcard uapi/*.h)

.PHONY: all module provider kernel check check-perf demo bench bench-insns install clean setup host-test

all: module provider

setup:
	@scripts/setup

kernel:
	@scripts/build-kernel $(FLAVOUR) >/dev/null

module:
ifdef KDIR_FROM_CACHE
	@scripts/build-kernel $(FLAVOUR) >/dev/null
	$(eval KDIR := $(shell scripts/build-kernel --dir $(FLAVOUR)))
endif
	@mkdir -p $(BUILD)
	@rsync -a --relative $(MODULE_SRCS) $(BUILD)/
	$(MAKE) -C $(KDIR) M=$(REPO)/$(BUILD) $(KVARS) modules
	@echo "module: $(BUILD)/siw_rs/siw_rs.ko"

provider:
	@$(MAKE) -s -C userspace-provider

host-test:
	cargo test --workspace --quiet

check:
	@scripts/check

demo:
	@scripts/demo

bench:
	@scripts/bench

bench-insns:
	@scripts/bench-insns

check-perf:
	@scripts/check-perf

install: module provider
	$(MAKE) -C $(KDIR) M=$(REPO)/$(BUILD) $(KVARS) modules_install
	$(MAKE) -C userspace-provider provider-install

clean:
	rm -rf build target
	@$(MAKE) -s -C userspace-provider clean
