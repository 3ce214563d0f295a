# openvia: build, install and the C conformance programs.
#
#   make                      cargo build --release (libvipl.so, libvipl.a, viad)
#   make install PREFIX=dir   header, libraries, viad and vipl.pc under dir
#   make uninstall PREFIX=dir
#   make test-c               stage an install, build tests/c against it, run them
#   make test-c-asan          the same programs with AddressSanitizer and UBSan
#   make test-c-tuning        the same programs under each design alternative
#                             of the provider (docs/tuning.md)
#   make test-c-valgrind      api_errors, memory and sendrecv under valgrind
#   make example              build and run examples/pingpong against the stage
#   make bench                viabench against the floors and other stacks
#                             (bench/compare; writes bench/report.md)
#   make test-hostile         the adversarial suite: a hostile peer against VIA programs
#                             (tests/hostile/run.sh; as root, the attacker runs as uid 65534)
#   make test-cluster         stage an install, run the multi-host tests on hosts
#                             emulated by network namespaces (tests/cluster/run.sh;
#                             needs root and iproute2, else every case is skipped)
#   make test-reproduce       a reduced run of the papers' experiments (reproduce/run --quick)
#   make test                 Rust tests and clippy, then test-c, test-c-asan,
#                             test-c-valgrind, test-cluster, test-bench and test-reproduce
#
# test-c, test-c-asan, test-c-valgrind, test-cluster and example install into the staging
# prefix build/stage unless PREFIX is given.

PREFIX  ?= /usr/local
DESTDIR ?=
CARGO   ?= cargo
CC      ?= cc
INSTALL ?= install
PKG_CONFIG ?= pkg-config

VERSION := $(shell sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)

RELEASE := target/release
AGENT   := $(RELEASE)/viad

# The staging prefix of the test targets.
ifneq ($(filter command line environment,$(origin PREFIX)),)
STAGE := $(abspath $(PREFIX))
else
STAGE := $(CURDIR)/build/stage
endif

BUILD := $(CURDIR)/build

# The conformance programs, in the order they run.
TESTS := header api_errors memory sendrecv rdma errors connect cq threads handover counters tuning acceptance badinput fences crossuser
VALGRIND_TESTS := api_errors memory sendrecv badinput
EXAMPLES := pingpong

TEST_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -pthread
ASAN_CFLAGS := -std=c11 -O1 -g -Wall -Wextra -Werror -pthread \
	-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

# pkg-config against the staged install only.
STAGE_PC = PKG_CONFIG_PATH=$(STAGE)/lib/pkgconfig PKG_CONFIG_LIBDIR=$(STAGE)/lib/pkgconfig
VIPL_CFLAGS = $$($(STAGE_PC) $(PKG_CONFIG) --cflags vipl)
VIPL_LIBS = $$($(STAGE_PC) $(PKG_CONFIG) --libs vipl)

.PHONY: all install uninstall stage test test-rust test-fuzz setup test-c test-c-tuning test-c-asan \
	test-c-valgrind test-hostile test-cluster example test-c-build test-c-asan-build clean

all:
	$(CARGO) build --release

$(BUILD)/vipl.pc: vipl.pc.in Cargo.toml
	@mkdir -p $(BUILD)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@.tmp
	mv $@.tmp $@

# vipl.pc depends on PREFIX, so it is always regenerated.
.PHONY: $(BUILD)/vipl.pc

install: all $(BUILD)/vipl.pc
	$(INSTALL) -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	$(INSTALL) -m 644 include/vipl.h $(DESTDIR)$(PREFIX)/include/vipl.h
	$(INSTALL) -m 755 $(RELEASE)/libvipl.so $(DESTDIR)$(PREFIX)/lib/libvipl.so
	$(INSTALL) -m 644 $(RELEASE)/libvipl.a $(DESTDIR)$(PREFIX)/lib/libvipl.a
	$(INSTALL) -m 755 $(AGENT) $(DESTDIR)$(PREFIX)/bin/viad
	$(INSTALL) -m 644 $(BUILD)/vipl.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/vipl.pc

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/vipl.h \
		$(DESTDIR)$(PREFIX)/lib/libvipl.so \
		$(DESTDIR)$(PREFIX)/lib/libvipl.a \
		$(DESTDIR)$(PREFIX)/bin/viad \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig/vipl.pc

# pkg-config, valgrind, nftables and python3-matplotlib, if missing (scripts/setup.sh).
setup:
	sh scripts/setup.sh

# Install into the staging prefix.
stage:
	$(MAKE) --no-print-directory install PREFIX=$(STAGE) DESTDIR=

# ------------------------------------------------------------------
# Everything

test: setup
	$(MAKE) --no-print-directory test-rust
	$(MAKE) --no-print-directory test-fuzz
	$(MAKE) --no-print-directory test-c
	$(MAKE) --no-print-directory test-c-tuning
	$(MAKE) --no-print-directory test-c-asan
	$(MAKE) --no-print-directory test-c-valgrind
	$(MAKE) --no-print-directory test-hostile
	$(MAKE) --no-print-directory test-cluster
	$(MAKE) --no-print-directory test-bench
	$(MAKE) --no-print-directory test-reproduce

test-rust:
	$(CARGO) fmt --all -- --check
	$(CARGO) test --workspace --release --no-fail-fast
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings

# Bounded fuzzing of every parser of untrusted bytes (FUZZ_SECONDS per target).
FUZZ_SECONDS ?= 30
test-fuzz:
	@if rustup run nightly rustc --version >/dev/null 2>&1; then \
		command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked; \
		sh fuzz/run.sh $(FUZZ_SECONDS); \
	else \
		echo "fuzz: skipped: needs the nightly toolchain"; \
	fi

# ------------------------------------------------------------------
# C conformance programs

test-c-build: stage
	@mkdir -p $(BUILD)/tests/c
	@set -e; for t in $(TESTS); do \
		echo "CC $$t"; \
		$(CC) $(TEST_CFLAGS) $(VIPL_CFLAGS) -o $(BUILD)/tests/c/$$t tests/c/$$t.c $(VIPL_LIBS); \
	done

test-c-asan-build: stage
	@mkdir -p $(BUILD)/tests/c-asan
	@set -e; for t in $(TESTS); do \
		echo "CC (asan) $$t"; \
		$(CC) $(ASAN_CFLAGS) $(VIPL_CFLAGS) -o $(BUILD)/tests/c-asan/$$t tests/c/$$t.c $(VIPL_LIBS); \
	done

test-c: test-c-build
	STAGE=$(STAGE) sh tests/c/run.sh $(BUILD)/tests/c $(TESTS)

test-c-asan: test-c-asan-build
	STAGE=$(STAGE) ASAN_OPTIONS=$${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
	UBSAN_OPTIONS=$${UBSAN_OPTIONS:-print_stacktrace=1} \
		sh tests/c/run.sh $(BUILD)/tests/c-asan $(TESTS)

# The whole suite again under each design alternative of the provider
# (docs/tuning.md): every alternative keeps the VIA semantics.
TUNINGS := VIA_DOORBELL=d1 VIA_DOORBELL=d2 VIA_CQ=cq2 VIA_INLINE_MAX=0,VIA_SPIN_US=adaptive
test-c-tuning: test-c-build
	@set -e; for t in $(TUNINGS); do \
		echo "== $$t" | tr , ' '; \
		env $$(echo $$t | tr , ' ') STAGE=$(STAGE) sh tests/c/run.sh $(BUILD)/tests/c $(TESTS); \
	done
	@if command -v taskset >/dev/null 2>&1; then \
		echo "== every process on CPU 0 (polls and spins yield the CPU)"; \
		VT_WRAPPER="taskset -c 0" STAGE=$(STAGE) sh tests/c/run.sh $(BUILD)/tests/c $(TESTS); \
	fi

test-c-valgrind: test-c-build
	STAGE=$(STAGE) VT_TIMEOUT=300 \
	VT_WRAPPER="valgrind -q --error-exitcode=99 --leak-check=no" \
		sh tests/c/run.sh $(BUILD)/tests/c $(VALGRIND_TESTS)

# ------------------------------------------------------------------
# Multi-host tests

test-cluster: stage
	STAGE=$(STAGE) sh tests/cluster/run.sh

# The adversarial suite: a hostile peer (run as uid 65534 where root)
# against VIA programs built on the staged install (tests/hostile/run.sh).
test-hostile: stage
	@mkdir -p $(BUILD)/tests/hostile
	$(CC) $(TEST_CFLAGS) $(VIPL_CFLAGS) -o $(BUILD)/tests/hostile/victim tests/hostile/victim.c $(VIPL_LIBS)
	$(CARGO) build --release -p via-hostile
	STAGE=$(STAGE) sh tests/hostile/run.sh $(BUILD)/tests/hostile/victim $(RELEASE)/via-hostile

# ------------------------------------------------------------------
# Examples

example: setup stage
	@mkdir -p $(BUILD)/examples
	@set -e; for x in $(EXAMPLES); do \
		echo "CC $$x"; \
		$(CC) $(TEST_CFLAGS) $(VIPL_CFLAGS) -o $(BUILD)/examples/$$x examples/$$x.c $(VIPL_LIBS); \
	done
	@sock=openvia-example-$$$$-$$(date +%s%N); \
	echo "VIA_AGENT_SOCKET=$$sock $(BUILD)/examples/pingpong"; \
	VIA_AGENT_SOCKET=$$sock VIA_VIAD=$(STAGE)/bin/viad timeout 120 $(BUILD)/examples/pingpong; \
	rc=$$?; $(STAGE)/bin/viad --stop --socket $$sock >/dev/null 2>&1; exit $$rc

clean:
	rm -rf $(BUILD)

# ------------------------------------------------------------------
# Benchmark: viabench against the floors and other stacks; writes
# bench/report.md (BENCH_ARGS=--quick for a run of seconds).

.PHONY: bench test-bench
bench:
	bash bench/compare $(BENCH_ARGS)

# A smoke run of the comparison (not a timed test): every contender runs
# and the report is written, under build/.
test-bench:
	bash bench/compare --quick --out $(BUILD)/bench/out --report $(BUILD)/bench/report.md
	@test -s $(BUILD)/bench/report.md && grep -q "viabench via-send" $(BUILD)/bench/report.md
	@if grep -q "UDP path:" $(BUILD)/bench/report.md; then grep -q "viabench raw-ether" $(BUILD)/bench/report.md; fi
	@grep -q "^## Connection set-up" $(BUILD)/bench/report.md

# A smoke run of the papers' experiments (not a timed test): every experiment
# runs reduced and the report is written, under build/.
.PHONY: test-reproduce
test-reproduce:
	reproduce/run --quick --out $(BUILD)/reproduce/out --report $(BUILD)/reproduce/report.md
	@for e in "Baker" "Farrell" "Banikazemi" "Yoon" "McKenzie"; do \
		grep -q "^### $$e" $(BUILD)/reproduce/report.md || { echo "reproduce: no $$e section"; exit 1; }; \
	done
	@! grep -q "^Not measured" $(BUILD)/reproduce/report.md || { echo "reproduce: an experiment measured nothing"; exit 1; }
