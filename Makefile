# hone: `make` builds the CPU engine (./hone); `make check` installs what is
# missing, builds, and runs the test suite twice: plain and under ASan+UBSan.
#
# Sources are found by wildcard: every src/*/**.c except src/cli goes into
# libhone.a; src/cli/*.c make the hone binary; each tests/test_*.c is its own
# test binary linked with libhone.a. Files named *_avx2.c are compiled for
# AVX2+FMA+F16C, *_avx512.c for AVX-512 F+BW on top, *_vnni.c for AVX-512
# F+BW+VL+VNNI on top, *_avx512bf16.c for AVX-512 F+BW+BF16; on AArch64,
# *_neon.c need nothing beyond the base ISA, *_dotprod.c are compiled for
# the dot-product extension (sdot) and *_i8mm.c for dotprod + i8mm (smmla);
# all only called after a run-time CPU check (each file is empty when built
# for the other architecture).
#
# `make arm-test` cross-builds the kernel tests for aarch64 (build-arm64/,
# Debian's gcc-aarch64-linux-gnu) and runs them under qemu-aarch64 as three
# CPUs: cortex-a53 (NEON), cortex-a76 (+dotprod) and max (+i8mm), so every
# ARM kernel runs against its scalar reference; `make check` runs it when
# both tools are installed (scripts/setup.sh installs them on x86-64).
#
# CUDA (src/backend/cuda/*.cu) is a separate, heavier build: `make CUDA=1`
# (in build-cuda/) compiles it with nvcc (NVCC from the command line, else
# nvcc on PATH, else $(CUDA_HOME)/bin/nvcc); CUDA=auto builds it when nvcc is
# found; plain `make` (CUDA=0) is the CPU engine, in seconds. `make check`
# uses CUDA=auto, so a machine with nvcc builds and tests the CUDA code too
# (GPU tests skip without a device). Its kernels go into libhone_cuda.a,
# HN_HAVE_CUDA is defined for the C side, and the CUDA runtime is linked
# statically: it finds the driver when it runs, so the same binaries run the
# CPU engine on a machine without a GPU or driver.

CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN     = -std=c11 -Wall -Wextra -Werror
DEFS     = -D_GNU_SOURCE
DEPFLAGS = -MMD -MP
LIBS     = -lpcre2-8 -lutf8proc -ljansson -lxxhash -lmicrohttpd -lpthread -lm
ARCH    := $(shell uname -m)

CUDA      ?= 0
CUDA_HOME ?= /usr/local/cuda
ifneq ($(CUDA),0)
ifndef NVCC
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/nvcc))
endif
ifeq ($(CUDA),1)
ifeq ($(strip $(NVCC)),)
$(error CUDA=1 but no nvcc was found (set NVCC or CUDA_HOME))
endif
endif
else
NVCC :=
endif

BUILD   ?= $(if $(strip $(NVCC)),build-cuda,build)
SRC_LIB := $(sort $(shell find src -name '*.c' ! -path 'src/cli/*'))
SRC_CLI := $(sort $(wildcard src/cli/*.c))
SRC_TST := $(sort $(wildcard tests/test_*.c))

OBJ_LIB := $(SRC_LIB:%.c=$(BUILD)/%.o)
OBJ_CLI := $(SRC_CLI:%.c=$(BUILD)/%.o)
BIN_TST := $(SRC_TST:tests/%.c=$(BUILD)/tests/%)
# NVRTC's kernel sources (backend/cuda/rtc/*.cu, and cuda_common.cuh, the
# device code they share with the ahead-of-time kernels), held in every
# binary as text (cuda_rtc.h) by a generated C file in libhone.a
RTC_FILES := src/backend/cuda/cuda_common.cuh $(sort $(wildcard src/backend/cuda/rtc/*.cu))
RTC_GEN   := $(BUILD)/gen/cuda_rtc_src.o

ifneq ($(strip $(NVCC)),)
# where the CUDA runtime library lives: nvcc itself says (its --dryrun
# prints the -L folders it links with), so a wrapper script or symlink named
# nvcc works too; the folders around the resolved nvcc and CUDA_HOME are
# tried after it
ifndef CUDA_LDIR
CUDA_NVCC_L := $(shell $(NVCC) --dryrun -o hone-probe hone-probe.o 2>&1 | sed -n 's/^\#\$$ LIBRARIES=//p' | tr -d '"' | sed 's/-L//g')
CUDA_ROOT   := $(abspath $(dir $(realpath $(NVCC)))/..)
CUDA_LDIR   := $(patsubst %/,%,$(firstword $(dir $(wildcard $(addsuffix /libcudart_static.a,$(CUDA_NVCC_L) $(CUDA_ROOT)/lib64 $(CUDA_ROOT)/lib $(CUDA_ROOT)/targets/*/lib $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib $(CUDA_HOME)/targets/*/lib)))))
endif
ifeq ($(strip $(CUDA_LDIR)),)
$(error nvcc ($(NVCC)) found, but not the CUDA runtime libcudart_static.a next to it: set CUDA_LDIR to its folder, or CUDA=0 for the CPU engine only)
endif
# sm_90 machine code plus its PTX, which newer GPUs compile at load
CUDA_ARCH  ?= -gencode arch=compute_90,code=[sm_90,compute_90]
NVCCFLAGS  ?= -O3 -lineinfo
# no C++ runtime: the C link needs no libstdc++
NVCC_WARN   = -std=c++17 -Xcompiler -Wall,-Wextra,-fno-exceptions,-fno-threadsafe-statics -Werror all-warnings
SRC_CU     := $(sort $(wildcard src/backend/cuda/*.cu))
OBJ_CU     := $(SRC_CU:%.cu=$(BUILD)/%.o)
CUDA_LIB   := $(BUILD)/libhone_cuda.a
CUDA_LIBS  := $(if $(CUDA_LDIR),-L$(CUDA_LDIR)) -lcudart_static -ldl -lrt -lpthread
DEFS       += -DHN_HAVE_CUDA
# NCCL (backend/comm.h's nccl transport, tensor parallel over GPUs): built
# when nccl.h is found beside the toolkit or in the system's include folder;
# libnccl.so.2 is loaded at run time (nothing links against it), from the
# loader's path, HONE_NCCL_LIB, or the file found here at build time
NCCL_INC   ?= $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h $(CUDA_ROOT)/include/nccl.h /usr/include/nccl.h))
ifneq ($(strip $(NCCL_INC)),)
NCCL_SO    ?= $(firstword $(wildcard $(CUDA_LDIR)/libnccl.so.2 $(CUDA_ROOT)/lib64/libnccl.so.2 $(CUDA_ROOT)/lib/libnccl.so.2 $(CUDA_HOME)/lib64/libnccl.so.2 $(CUDA_HOME)/lib/libnccl.so.2 /usr/lib/$(shell uname -m)-linux-gnu/libnccl.so.2))
DEFS       += -DHN_HAVE_NCCL
NVCC_NCCL   = -I$(dir $(NCCL_INC)) $(if $(NCCL_SO),-DHN_NCCL_LIB='"$(NCCL_SO)"')
else
$(info nccl.h not found (CUDA_HOME=$(CUDA_HOME), /usr/include): the NCCL transport is not built; tensor parallel over GPUs is off)
endif
# NVRTC (cuda_rtc.h, HONE_CUDA_RTC=1): libnvrtc is loaded at run time
# (nothing links against it), from HONE_NVRTC_LIB, the loader's path, or the
# file found here at build time
NVRTC_SO   ?= $(firstword $(sort $(wildcard $(CUDA_LDIR)/libnvrtc.so.[0-9]* $(CUDA_HOME)/lib64/libnvrtc.so.[0-9]*)))
$(BUILD)/src/backend/cuda/cuda_rtc.o: DEFS += $(if $(NVRTC_SO),-DHN_NVRTC_LIB='"$(NVRTC_SO)"')
endif

ifeq ($(ARCH),x86_64)
SIMD_AVX2 = -mavx2 -mfma -mf16c
SIMD_AVX512 = $(SIMD_AVX2) -mavx512f -mavx512bw
SIMD_VNNI = $(SIMD_AVX512) -mavx512vl -mavx512vnni
SIMD_AVX512BF16 = $(SIMD_AVX512) -mavx512bf16
endif
ifneq ($(filter aarch64 arm64,$(ARCH)),)
SIMD_DOTPROD = -march=armv8.2-a+dotprod
SIMD_I8MM = -march=armv8.2-a+dotprod+i8mm
endif

.PHONY: all check test asan-test setup demo clean bench-cuda fuzz fuzz-bins fuzz-run fuzz-long arm-test arm-run

all: hone

hone: $(BUILD)/hone
	@ln -sf $(BUILD)/hone hone

$(BUILD)/hone: $(OBJ_CLI) $(BUILD)/libhone.a $(CUDA_LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(OBJ_CLI) -Wl,--start-group $(BUILD)/libhone.a $(CUDA_LIB) -Wl,--end-group $(LIBS) $(CUDA_LIBS)

$(BUILD)/libhone.a: $(OBJ_LIB) $(RTC_GEN)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libhone_cuda.a: $(OBJ_CU)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/src/backend/cuda/%.o: src/backend/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_WARN) $(CUDA_ARCH) $(DEFS) -MMD -MP -c -o $@ $<

$(BUILD)/src/backend/cuda/cuda_comm.o: src/backend/cuda/cuda_comm.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_WARN) $(CUDA_ARCH) $(DEFS) $(NVCC_NCCL) -MMD -MP -c -o $@ $<

# the tuner's cached winners are keyed by a checksum of the kernel sources, so
# a binary whose kernels changed tunes again
KERNEL_SRC := $(sort $(wildcard src/backend/cpu/*.c src/backend/cpu/*.h src/quant/*.c src/quant/*.h))
KERNELS_ID := $(shell cat $(KERNEL_SRC) | cksum | cut -d' ' -f1)
$(BUILD)/src/backend/cpu/cpu_tune.o: $(KERNEL_SRC)
$(BUILD)/src/backend/cpu/cpu_tune.o: DEFS += -DHN_KERNELS_ID='"$(KERNELS_ID)"'
# likewise on the GPU: the cuda tuner's device key holds a digest (sha256) of
# the CUDA sources and the block layouts they read
ifneq ($(strip $(NVCC)),)
CUDA_KSRC  := $(sort $(wildcard src/backend/cuda/*.cu src/backend/cuda/*.cuh src/backend/cuda/*.h src/quant/blocks.h))
CUDA_SRCID := $(or $(shell cat $(CUDA_KSRC) | sha256sum | cut -c1-16),0)
$(BUILD)/src/backend/cuda/cuda_tune.o: $(CUDA_KSRC)
$(BUILD)/src/backend/cuda/cuda_tune.o: DEFS += -DHC_SRC_DIGEST='"$(CUDA_SRCID)"'
endif

# NVRTC's kernel sources (RTC_FILES) as a generated table of name, text pairs
$(BUILD)/gen/cuda_rtc_src.c: $(RTC_FILES)
	@mkdir -p $(dir $@)
	@{ echo '/* generated by the Makefile from $(RTC_FILES) */'; \
	  echo 'const char *const hcr_embedded[] = {'; \
	  for f in $(RTC_FILES); do \
	    echo "\"$${f##*/}\","; \
	    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/?/\\?/g' -e 's/^/"/' -e 's/$$/\\n"/' $$f; \
	    echo ','; \
	  done; \
	  echo '0};'; } > $@.tmp && mv $@.tmp $@
$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(CC) $(CFLAGS) $(WARN) $(DEFS) -c -o $@ $<

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) $(DEPFLAGS) $(SIMD_AVX2) -c -o $@ $<

$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) $(DEPFLAGS) $(SIMD_AVX512) -c -o $@ $<

$(BUILD)/%_vnni.o: %_vnni.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) $(DEPFLAGS) $(SIMD_VNNI) -c -o $@ $<

$(BUILD)/%_avx512bf16.o: %_avx512bf16.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) $(DEPFLAGS) $(SIMD_AVX512BF16) -c -o $@ $<

$(BUILD)/%_dotprod.o: %_dotprod.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) $(DEPFLAGS) $(SIMD_DOTPROD) -c -o $@ $<

$(BUILD)/%_i8mm.o: %_i8mm.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) $(DEPFLAGS) $(SIMD_I8MM) -c -o $@ $<

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) $(DEPFLAGS) -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(BUILD)/libhone.a $(CUDA_LIB) tests/test.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) -Isrc -o $@ $< -Wl,--start-group $(BUILD)/libhone.a $(CUDA_LIB) -Wl,--end-group $(LIBS) $(CUDA_LIBS)

# the CUDA matrix-vector benchmark (needs nvcc; runs on a machine with a GPU)
bench-cuda: $(BUILD)/bench/bench_cuda_gemv
$(BUILD)/bench/bench_cuda_gemv: bench/bench_cuda_gemv.c $(BUILD)/libhone.a $(CUDA_LIB)
	@test -n "$(CUDA_LIB)" || { echo "bench-cuda: no nvcc found (set NVCC or CUDA_HOME)"; exit 1; }
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) -Isrc -o $@ $< -Wl,--start-group $(BUILD)/libhone.a $(CUDA_LIB) -Wl,--end-group $(LIBS) $(CUDA_LIBS)

# headers and sources some tests include besides test.h
$(BUILD)/tests/test_server_limits $(BUILD)/tests/test_server_http: tests/srv_client.h
$(BUILD)/tests/test_spec_mtp $(BUILD)/tests/test_cpu_moe: tests/mtp_fixture.h
$(BUILD)/tests/test_spec_dflash: tests/dflash_fixture.h
$(BUILD)/tests/test_fuzz_replay: tests/fuzz/fuzz_api.c
$(BUILD)/tests/test_fuzz_corpora: tests/fuzz/fuzz_common.h tests/fuzz/fuzz_gguf.c tests/fuzz/fuzz_tokenizer.c tests/fuzz/fuzz_template.c tests/fuzz/fuzz_grammar.c

tests: $(BIN_TST)

# hone serve (and its end-to-end test) switch to the engine when its sources appear

# test: plain build; asan-test: a separate sanitizer build in $(BUILD)-asan/
test: $(BUILD)/hone tests
	HONE_BIN=$(abspath $(BUILD)/hone) scripts/run_tests.sh $(BUILD)

SANITIZE = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
asan-test:
	$(MAKE) BUILD=$(BUILD)-asan CFLAGS="-O1 -g $(SANITIZE)" LDFLAGS="$(SANITIZE)" \
	  HONE_SANITIZED=1 test

# libFuzzer harnesses (tests/fuzz/fuzz_*.c), built with clang under ASan+UBSan
# in build-fuzz/. fuzz-run: a short bounded run of each over its corpus in
# tests/fuzz/corpus/ (new inputs go to build-fuzz/corpus/, not the repository).
FUZZ_SAN     = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_APIS    = chat completions responses messages
FUZZ_ONE     = gguf tokenizer template grammar
FUZZ_SECONDS ?= 20
# extra seed directories read in place (not copied into the repository)
FUZZ_SEEDS_template = ../shared/data/templates/templates
# the whole library (CPU only), instrumented: the server objects the API
# harnesses reach also call into the engine (clang, unlike gcc, warns on an
# unused static inline function)
FUZZ_LIB     = build-fuzz/libhone.a
fuzz:
	$(MAKE) BUILD=build-fuzz CUDA=0 CC=clang CFLAGS="-O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link" \
	  WARN="$(WARN) -Wno-unused-function" $(FUZZ_LIB)
	$(MAKE) BUILD=build-fuzz CUDA=0 fuzz-bins

fuzz-bins: $(FUZZ_APIS:%=build-fuzz/fuzz/api_%) $(FUZZ_ONE:%=build-fuzz/fuzz/%) build-fuzz/gguf_seeds

build-fuzz/fuzz/api_%: tests/fuzz/fuzz_api.c $(FUZZ_LIB)
	@mkdir -p $(dir $@)
	clang -O1 -g $(FUZZ_SAN) -fsanitize=fuzzer $(WARN) $(DEFS) -Isrc -DFUZZ_API='"$*"' -o $@ $< -Wl,--start-group $(FUZZ_LIB) -Wl,--end-group $(LIBS)

# one harness per part: fuzz_<name>.c (gguf, tokenizer, template, grammar)
$(FUZZ_ONE:%=build-fuzz/fuzz/%): build-fuzz/fuzz/%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_LIB)
	@mkdir -p $(dir $@)
	clang -O1 -g $(FUZZ_SAN) -fsanitize=fuzzer $(WARN) $(DEFS) -Isrc -o $@ $< -Wl,--start-group $(FUZZ_LIB) -Wl,--end-group $(LIBS)

# remakes tests/fuzz/corpus/gguf's seeds (build-fuzz/gguf_seeds DIR)
build-fuzz/gguf_seeds: tests/fuzz/gguf_seeds.c $(FUZZ_LIB)
	clang -O1 -g $(FUZZ_SAN) $(WARN) $(DEFS) -Isrc -o $@ $< -Wl,--start-group $(FUZZ_LIB) -Wl,--end-group $(LIBS)

fuzz-run: fuzz
	@for a in $(FUZZ_APIS); do \
	  mkdir -p build-fuzz/corpus/api_$$a build-fuzz/artifacts; \
	  build-fuzz/fuzz/api_$$a -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
	    -artifact_prefix=build-fuzz/artifacts/api_$$a- -print_final_stats=1 \
	    build-fuzz/corpus/api_$$a tests/fuzz/corpus/api_$$a > build-fuzz/api_$$a.log 2>&1; rc=$$?; \
	  echo "fuzz api_$$a ($(FUZZ_SECONDS) s): exit $$rc, $$(grep -o 'number_of_executed_units: *[0-9]*' build-fuzz/api_$$a.log)"; \
	  if [ $$rc -ne 0 ]; then tail -40 build-fuzz/api_$$a.log; exit 1; fi; \
	done
	@for h in $(FUZZ_ONE); do \
	  mkdir -p build-fuzz/corpus/$$h build-fuzz/artifacts; \
	  extra=""; case $$h in template) extra="$(FUZZ_SEEDS_template)";; esac; \
	  build-fuzz/fuzz/$$h -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
	    -artifact_prefix=build-fuzz/artifacts/$$h- -print_final_stats=1 \
	    build-fuzz/corpus/$$h tests/fuzz/corpus/$$h $$extra > build-fuzz/$$h.log 2>&1; rc=$$?; \
	  echo "fuzz $$h ($(FUZZ_SECONDS) s): exit $$rc, $$(grep -o 'number_of_executed_units: *[0-9]*' build-fuzz/$$h.log)"; \
	  if [ $$rc -ne 0 ]; then tail -40 build-fuzz/$$h.log; exit 1; fi; \
	done

# fuzz-long: FUZZ_RUNS executions of each harness (or of FUZZ_HARNESS, a
# list), over FUZZ_JOBS processes (0: one per CPU), finds kept in FUZZ_DIR
# (outside the repository; run_long.sh's default if empty), with a summary
# table (tests/fuzz/run_long.sh -h)
FUZZ_RUNS    ?= 10000000
FUZZ_JOBS    ?= 1
FUZZ_HARNESS ?=
FUZZ_DIR     ?=
fuzz-long: fuzz
	tests/fuzz/run_long.sh -n $(FUZZ_RUNS) -j $(FUZZ_JOBS) $(if $(FUZZ_DIR),-d $(FUZZ_DIR)) $(FUZZ_HARNESS)

# The ARM kernels, cross-built and run under user-mode emulation: only the
# kernel modules (core, quant, the cpu backend's dot / gemm / pack / attention
# files) and the tests that hold every kernel to its scalar reference
# (test_pack's and test_gemm_attn's kernel level: HN_TEST_KERNELS_ONLY), linked statically, so no arm64 builds of the
# library's other dependencies are needed (static: qemu needs no arm64 libc
# path). Each test runs once per emulated CPU. (On an AArch64 host the plain
# test suite runs these kernels natively.)
ARM_CC    ?= aarch64-linux-gnu-gcc
ARM_QEMU  ?= qemu-aarch64
ARM_CPUS  ?= cortex-a53 cortex-a76 max
ARM_TESTS  = test_dot test_gemm test_pack test_pack_kq test_gemm_attn
ARM_KSRC  := $(sort $(wildcard src/core/*.c src/quant/*.c src/backend/cpu/dot*.c src/backend/cpu/gemm*.c src/backend/cpu/pack*.c \
                                src/backend/cpu/cpu_attn*.c))
arm-test:
	$(MAKE) BUILD=build-arm64 CC=$(ARM_CC) ARCH=aarch64 CUDA=0 arm-run

$(BUILD)/libhone_kernels.a: $(ARM_KSRC:%.c=$(BUILD)/%.o)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ktests/%: tests/%.c $(BUILD)/libhone_kernels.a tests/test.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) -DHN_TEST_KERNELS_ONLY -Isrc -static -o $@ $< $(BUILD)/libhone_kernels.a -lpthread -lm

arm-run: $(ARM_TESTS:%=$(BUILD)/ktests/%)
	@fail=0; for cpu in $(ARM_CPUS); do for t in $(ARM_TESTS); do \
	  out=$$($(ARM_QEMU) -cpu $$cpu $(BUILD)/ktests/$$t 2>&1); rc=$$?; \
	  line=$$(printf '%s\n' "$$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$$' | tail -n 1); \
	  [ $$rc -eq 0 ] || { printf '%s\n' "$$out" | tail -n 40; fail=1; }; \
	  printf 'arm64 %-12s %-14s %s (rc=%d)\n' $$cpu $$t "$${line:-no result line}" $$rc; \
	done; done; exit $$fail

setup:
	scripts/setup.sh

# The README's test command: everything from a fresh machine.
check: setup
	$(MAKE) CUDA=auto test
	$(MAKE) CUDA=auto asan-test
	@if [ "$(ARCH)" != x86_64 ]; then :; \
	elif command -v $(ARM_CC) >/dev/null 2>&1 && command -v $(ARM_QEMU) >/dev/null 2>&1; then $(MAKE) arm-test; \
	else echo "check: no $(ARM_CC) / $(ARM_QEMU) here: the ARM kernels were not tested"; fi

# The README's main command: run a prompt on the demo model hone makes itself.
demo: setup
	$(MAKE) hone
	./hone run -p "Once upon a time" -n 32

clean:
.PHONY: all check test asan-test setup demo clean bench-cuda fuzz fuzz-bins fuzz-run fuzz-long arm-test arm-run

-include $(OBJ_LIB:.o=.d) $(OBJ_CLI:.o=.d) $(OBJ_CU:.o=.d)
