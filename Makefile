# openvia: build, install and the C conformance programs.
#
#   make                      cargo build --release (libvipl.a, viad, viabench, viainfo),
#                             then link build/lib/libvipl.so.1.VERSION from libvipl.a
#   make install PREFIX=dir   header, libraries, viad, viabench, viainfo, vipl.pc
#                             and the manual pages under dir
#   make uninstall PREFIX=dir
#   make test-install         install into a temporary prefix and check what is there
#                             (the SONAME, the exported symbols, tools, manual pages)
#   make test-c               stage an install, build tests/c against it, run them
#   make test-cxx             the C++ programs of tests/cxx, against the same stage
#   make test-c-asan          the same programs (but fork) with AddressSanitizer and UBSan
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
#   make test                 Rust tests and clippy, then test-install, test-c, test-cxx,
#                             test-c-asan, test-c-valgrind, test-cluster, test-bench and
#                             test-reproduce
#
# test-c, test-cxx, test-c-asan, test-c-valgrind, test-cluster and example install into the
# staging prefix build/stage unless PREFIX is given, and build their programs with an rpath
# to its lib (TEST_RPATH): the installed vipl.pc forces none.

PREFIX  ?= /usr/local
DESTDIR ?=
CARGO   ?= cargo
CC      ?= cc
CXX     ?= g++
INSTALL ?= install
PKG_CONFIG ?= pkg-config

VERSION := $(shell sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)

RELEASE := target/release
AGENT   := $(RELEASE)/viad
TOOLS   := viabench viainfo

# The shared library: ABI 1 of the VIPL API (SONAME libvipl.so.1), linked
# from libvipl.a with the version script of crates/vipl (only Vip* exported,
# in the version node VIPL_1.0).
SOVERSION := 1
SONAME    := libvipl.so.$(SOVERSION)
SHLIB     := libvipl.so.$(SOVERSION).$(VERSION)
# What libvipl.a needs from the system (rustc --print native-static-libs).
NATIVE_LIBS := -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc

MANDIR  = $(PREFIX)/share/man
# The systemd unit of the host agent (dist/viad.service.in).
UNITDIR = $(PREFIX)/lib/systemd/system
MAN1    := man/viabench.1 man/viainfo.1
MAN7    := man/vipl.7
MAN8    := man/viad.8

# The staging prefix of the test targets.
ifneq ($(filter command line environment,$(origin PREFIX)),)
STAGE := $(abspath $(PREFIX))
else
STAGE := $(CURDIR)/build/stage
endif

BUILD := $(CURDIR)/build

# The conformance programs, in the order they run.
TESTS := header giganet gnu89 api_errors memory sendrecv aliases rdma errors connect cq threads handover counters tuning acceptance badinput fences crossuser fork workload
VALGRIND_TESTS := api_errors memory sendrecv badinput
# Not fork under ASan: a child forked while another thread holds the
# sanitizer allocator's lock (the parent's helper thread, allocating)
# inherits it held, and its first allocation on a new thread waits for ever
# (GCC's libsanitizer; glibc's malloc has fork handlers for this).
ASAN_TESTS := $(filter-out fork,$(TESTS))
EXAMPLES := pingpong

# tests/c/header.c checks that vipl.h's version macros say VERSION.
VERSION_DEF := -DVT_LIBRARY_VERSION='"$(VERSION)"'

TEST_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -pthread $(VERSION_DEF)
ASAN_CFLAGS := -std=c11 -O1 -g -Wall -Wextra -Werror -pthread $(VERSION_DEF) \
	-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

# vipl.h under the C standards that VIA programs are written in: the programs of
# GNU89_TESTS are built with -std=gnu89 (after TEST_CFLAGS's -std=c11, so it
# wins), and each program:standard of PEDANTIC_CHECKS whose program is in TESTS
# is also compiled with -pedantic, warnings as errors.
GNU89_TESTS := gnu89
PEDANTIC_CHECKS := gnu89:c89 gnu89:gnu89 gnu89:c99 gnu89:c11 gnu89:c17 giganet:c11 giganet:c17

# The C++ programs (tests/cxx): built with TEST_CXXFLAGS and run; also compiled,
# -pedantic, warnings as errors, under each of CXX_CHECK_STDS.
CXX_TESTS := giganet mvia
TEST_CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -Werror -pthread
CXX_CHECK_STDS := c++11 c++14 c++17 c++20

# pkg-config against the staged install only.
STAGE_PC = PKG_CONFIG_PATH=$(STAGE)/lib/pkgconfig PKG_CONFIG_LIBDIR=$(STAGE)/lib/pkgconfig
VIPL_CFLAGS = $$($(STAGE_PC) $(PKG_CONFIG) --cflags vipl)
# The test programs find the staged library through an rpath of their own.
TEST_RPATH = -Wl,-rpath,$(STAGE)/lib
VIPL_LIBS = $$($(STAGE_PC) $(PKG_CONFIG) --libs vipl) $(TEST_RPATH)

.PHONY: all install uninstall stage test test-rust test-fuzz setup test-c test-c-tuning test-c-asan \
	test-c-valgrind test-hostile test-cluster example test-c-build test-c-asan-build test-cxx \
	test-cxx-build clean test-install

all:
	$(CARGO) build --release
	@$(MAKE) --no-print-directory $(BUILD)/lib/$(SHLIB)

$(BUILD)/lib/$(SHLIB): $(RELEASE)/libvipl.a crates/vipl/vipl.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@.tmp -Wl,-soname,$(SONAME) -Wl,--version-script=crates/vipl/vipl.map \
		-Wl,--gc-sections -Wl,-z,relro,-z,now -Wl,-z,noexecstack -Wl,--no-undefined \
		-Wl,--whole-archive $(RELEASE)/libvipl.a -Wl,--no-whole-archive $(NATIVE_LIBS)
	mv $@.tmp $@

$(BUILD)/vipl.pc: vipl.pc.in Cargo.toml
	@mkdir -p $(BUILD)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@.tmp
	mv $@.tmp $@

# vipl.pc depends on PREFIX, so it is always regenerated.
.PHONY: $(BUILD)/vipl.pc

$(BUILD)/viad.service: dist/viad.service.in
	@mkdir -p $(BUILD)
	sed -e 's|@PREFIX@|$(PREFIX)|g' $< > $@.tmp
	mv $@.tmp $@

# viad.service depends on PREFIX, so it is always regenerated.
.PHONY: $(BUILD)/viad.service

install: all $(BUILD)/vipl.pc $(BUILD)/viad.service
	$(INSTALL) -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin \
		$(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man7 $(DESTDIR)$(MANDIR)/man8 \
		$(DESTDIR)$(UNITDIR)
	$(INSTALL) -m 644 include/vipl.h $(DESTDIR)$(PREFIX)/include/vipl.h
	$(INSTALL) -m 755 $(BUILD)/lib/$(SHLIB) $(DESTDIR)$(PREFIX)/lib/$(SHLIB)
	ln -sf $(SHLIB) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libvipl.so
	$(INSTALL) -m 644 $(RELEASE)/libvipl.a $(DESTDIR)$(PREFIX)/lib/libvipl.a
	$(INSTALL) -m 755 $(AGENT) $(DESTDIR)$(PREFIX)/bin/viad
	$(INSTALL) -m 755 $(addprefix $(RELEASE)/,$(TOOLS)) $(DESTDIR)$(PREFIX)/bin/
	$(INSTALL) -m 644 $(BUILD)/vipl.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/vipl.pc
	$(INSTALL) -m 644 $(MAN1) $(DESTDIR)$(MANDIR)/man1/
	$(INSTALL) -m 644 $(MAN7) $(DESTDIR)$(MANDIR)/man7/
	$(INSTALL) -m 644 $(MAN8) $(DESTDIR)$(MANDIR)/man8/
	$(INSTALL) -m 644 $(BUILD)/viad.service $(DESTDIR)$(UNITDIR)/viad.service

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/vipl.h \
		$(DESTDIR)$(PREFIX)/lib/libvipl.so \
		$(DESTDIR)$(PREFIX)/lib/$(SONAME) \
		$(DESTDIR)$(PREFIX)/lib/$(SHLIB) \
		$(DESTDIR)$(PREFIX)/lib/libvipl.a \
		$(DESTDIR)$(PREFIX)/bin/viad \
		$(addprefix $(DESTDIR)$(PREFIX)/bin/,$(TOOLS)) \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig/vipl.pc \
		$(addprefix $(DESTDIR)$(MANDIR)/man1/,$(notdir $(MAN1))) \
		$(addprefix $(DESTDIR)$(MANDIR)/man7/,$(notdir $(MAN7))) \
		$(addprefix $(DESTDIR)$(MANDIR)/man8/,$(notdir $(MAN8))) \
		$(DESTDIR)$(UNITDIR)/viad.service

# Install into a temporary prefix and check it (tests/install.sh): the
# library's SONAME and exports, the tools, the manual pages, vipl.pc, a
# program built with pkg-config, and uninstall.
test-install: all
	MAKE="$(MAKE)" CC="$(CC)" PKG_CONFIG="$(PKG_CONFIG)" sh tests/install.sh

# pkg-config, valgrind, g++, nftables, python3-matplotlib and python3-crc32c, if missing (scripts/setup.sh).
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
	$(MAKE) --no-print-directory test-install
	$(MAKE) --no-print-directory test-c
	$(MAKE) --no-print-directory test-cxx
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

# Sets std to the -std= option of program $t, if it is not built as c11.
STD_OF = std=; case " $(GNU89_TESTS) " in *" $$t "*) std=-std=gnu89;; esac

test-c-build: stage
	@mkdir -p $(BUILD)/tests/c
	@set -e; for c in $(PEDANTIC_CHECKS); do \
		t=$${c%%:*}; s=$${c#*:}; \
		case " $(TESTS) " in *" $$t "*) ;; *) continue;; esac; \
		echo "CC -std=$$s -pedantic $$t (compile only)"; \
		$(CC) -std=$$s -pedantic -Wall -Wextra -Werror $(VERSION_DEF) $(VIPL_CFLAGS) \
			-fsyntax-only tests/c/$$t.c; \
	done
	@set -e; for t in $(TESTS); do \
		$(STD_OF); \
		echo "CC $$t$${std:+ $$std}"; \
		$(CC) $(TEST_CFLAGS) $$std $(VIPL_CFLAGS) -o $(BUILD)/tests/c/$$t tests/c/$$t.c $(VIPL_LIBS); \
	done

test-c-asan-build: stage
	@mkdir -p $(BUILD)/tests/c-asan
	@set -e; for t in $(ASAN_TESTS); do \
		$(STD_OF); \
		echo "CC (asan) $$t$${std:+ $$std}"; \
		$(CC) $(ASAN_CFLAGS) $$std $(VIPL_CFLAGS) -o $(BUILD)/tests/c-asan/$$t tests/c/$$t.c $(VIPL_LIBS); \
	done

test-c: test-c-build
	STAGE=$(STAGE) sh tests/c/run.sh $(BUILD)/tests/c $(TESTS)

test-cxx-build: stage
	@mkdir -p $(BUILD)/tests/cxx
	@set -e; for t in $(CXX_TESTS); do \
		for s in $(CXX_CHECK_STDS); do \
			echo "CXX -std=$$s -pedantic $$t (compile only)"; \
			$(CXX) -std=$$s -pedantic -Wall -Wextra -Werror $(VIPL_CFLAGS) -fsyntax-only tests/cxx/$$t.cpp; \
		done; \
		echo "CXX $$t"; \
		$(CXX) $(TEST_CXXFLAGS) $(VIPL_CFLAGS) -o $(BUILD)/tests/cxx/$$t tests/cxx/$$t.cpp $(VIPL_LIBS); \
	done

test-cxx: test-cxx-build
	STAGE=$(STAGE) sh tests/c/run.sh $(BUILD)/tests/cxx $(CXX_TESTS)

test-c-asan: test-c-asan-build
	STAGE=$(STAGE) ASAN_OPTIONS=$${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
	UBSAN_OPTIONS=$${UBSAN_OPTIONS:-print_stacktrace=1} \
		sh tests/c/run.sh $(BUILD)/tests/c-asan $(ASAN_TESTS)

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
	@grep -q "transparent huge pages for shared memory" $(BUILD)/bench/report.md

# A smoke run of the papers' experiments (not a timed test): every experiment
# runs reduced and the report is written, under build/.
.PHONY: test-reproduce
test-reproduce:
	reproduce/run --quick --out $(BUILD)/reproduce/out --report $(BUILD)/reproduce/report.md
	@for e in "Baker" "Farrell" "Banikazemi" "Yoon" "McKenzie"; do \
		grep -q "^### $$e" $(BUILD)/reproduce/report.md || { echo "reproduce: no $$e section"; exit 1; }; \
	done
	@! grep -q "^Not measured" $(BUILD)/reproduce/report.md || { echo "reproduce: an experiment measured nothing"; exit 1; }
