# lime.cu — build, test, run.
#   make            ./lime (with the GPU path when nvcc is found, else CPU only)
#   make test       every test: CPU, the CUDA kernels on the CPU harness, the CLI
#   make run        train LLaMa and LIMe on the default arithmetic tier, print both accuracies
#   make bench      step time of llama vs lime at the two benchmark configs; the products' GFLOP/s
#   make emu        ./lime-emu: the whole program, --device gpu runs the kernels on the CPU
#   make ref        ./lime-ref: the CPU path on lime.cu's plain loops alone (REFERENCE=1 makes it the default)
#   make test-gpu   the GPU tests on a real GPU (skipped, with the reason, without one)
#   make bench-gpu  step time, MFU and memory of llama vs lime on the GPU (full attention and GQA)
#   make nvcc-check the CUDA code through nvcc for sm_80 and sm_90, warnings as errors, no register spills,
#                   the tensor-core flash kernels' SASS instructions per mma (tests/sass_per_mma.sh)
#   make test-asan  the CPU tests and the CLI suites under AddressSanitizer + UBSan (a few minutes)
#   make fuzz       libFuzzer on the checkpoint, task, reference-file and lab-5 readers, FUZZ_SECONDS each (not in make test)
#   make lab1       a classroom lab's checks on the student's file (labs/README.md; lab1 .. lab5)
CXX      ?= g++
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
# Where the toolkit's libraries live: asked of nvcc itself, since `nvcc` on the PATH
# may be a wrapper script (e.g. /usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc).
ifneq ($(NVCC),)
NVCC_TOP := $(shell $(NVCC) --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^\#\$$ TOP=//p' | head -1)
CUDA_LIB ?= $(firstword $(foreach h,$(NVCC_TOP) $(CUDA_HOME) /usr/local/cuda,\
              $(foreach d,lib64 targets/x86_64-linux/lib targets/sbsa-linux/lib lib,\
                $(if $(wildcard $(h)/$(d)/libcublas.so),$(abspath $(h)/$(d))))))
ifeq ($(CUDA_LIB),)
$(warning nvcc found ($(NVCC)) but no libcublas.so beside it: building the CPU-only ./lime; set CUDA_LIB=/path/to/cuda/lib64 for the GPU path)
override NVCC :=
endif
endif
ARCH_FLAGS ?= $(shell $(CXX) -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native)
# -fno-math-errno: sqrtf and its kind need not set errno (nothing here reads it), so that
# the loops that call them vectorise (AdamW's). -fno-trapping-math: no program here reads
# the floating-point exception flags, so a loop with a choice in it (exp_fast's range
# checks, in SwiGLU, the softmaxes, cross-entropy) may compute both sides and blend them;
# without AVX-512's masks g++ leaves such a loop scalar (on AVX2, d = 32 ran 1.3-1.4x
# slower). Every result stays the same bits. -ffp-contract=off: g++ fuses a * b + c into one
# rounding only where the source says so (mul_add in support/model/cpu_fast.h); left to
# itself it fused a sum in one loop and not in another depending on how it vectorised each
# for the build's vector width, and an AVX2 ./lime trained other bits than an AVX-512 one.
MATH_FLAGS ?= -fno-math-errno -fno-trapping-math -ffp-contract=off
CXXFLAGS ?= -std=c++17 -O3 $(ARCH_FLAGS) $(MATH_FLAGS) -fopenmp -Wall -Wextra -I.
# The test and sanitizer builds carry line tables alone (-g1): their failures and the
# sanitizers' reports still name file and line, and they compile faster (the asan
# tests/test_model.o: 47 s against 68 with -g; CI took 844 s against 980); ./lime-ref and the labs keep -g, to be stepped through in gdb.
TESTFLAGS = -std=c++17 -O2 -g1 $(ARCH_FLAGS) $(MATH_FLAGS) -fopenmp -Wall -Wextra -I. -Itests -DLIME_TESTING
# sm_80 and sm_90 machine code, and compute_90 PTX, which the driver compiles for a newer GPU
# (without it such a GPU fails every launch with "no kernel image is available")
GENCODE  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVWERROR ?= --Werror all-warnings
NVFLAGS  ?= -std=c++17 -O3 $(GENCODE) -I. -Xcompiler "-fopenmp $(ARCH_FLAGS) $(MATH_FLAGS) -Wall -Wextra" $(NVWERROR)

HOST_SRC = support/model/cpu_fast.cpp support/model/cost.cpp support/model/checkpoint.cpp support/model/routers.cpp support/model/names.cpp support/commands/export.cpp support/lib/cli.cpp support/lib/safetensors.cpp support/lib/plot.cpp support/commands/compare.cpp support/commands/analyze.cpp support/commands/verify.cpp support/commands/bench.cpp support/commands/load.cpp \
           data/arith.cpp data/text.cpp data/task.cpp data/prosqa.cpp
HEADERS  = support/model/lime.h support/model/names.h support/commands/export.h support/model/cpu_fast.h support/model/device.cuh support/model/attention_gpu.cuh support/model/flash_attention.cuh support/model/flash_attention_tc.cuh support/model/tensor_cores.cuh support/model/split_k.cuh support/model/products.cuh support/model/gpu_runtime.cuh support/model/memory_check.h $(wildcard support/study/*.cuh) support/lib/gpu_peaks.h support/lib/cpu_peak.h support/lib/safetensors.h data/tasks.h support/lib/rng.h data/prosqa.h support/lib/cli.h support/lib/plot.h support/lib/stats.h support/commands/commands.h
B = build

.DEFAULT_GOAL := all

# stb (Debian's libstb-dev) writes the PNG figures: the one library besides
# the CUDA Toolkit. When its header is missing, `deps` installs it (as root,
# with apt-get) or stops before compiling with the one command to run.
STB_FOUND := $(shell printf '\043include <stb/stb_image_write.h>\n' | $(CXX) -E -x c++ - >/dev/null 2>&1 && echo yes)
STB_HINT  = stb/stb_image_write.h is missing (the PNG figures need it); install it with: sudo apt-get install -y libstb-dev
deps:
ifneq ($(STB_FOUND),yes)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing libstb-dev (stb_image_write.h, for the PNG figures)"; \
	    apt-get install -y libstb-dev >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y libstb-dev >/dev/null 2>&1; } || \
	    { echo "make: $(STB_HINT)"; exit 1; }; \
	else echo "make: $(STB_HINT)"; exit 1; fi
endif

.PHONY: deps all test test-gpu run bench bench-gpu emu ref nvcc-check test-asan fuzz clean
ifeq ($(REFERENCE),1)
all: lime-ref
else
all: lime
endif

$(B):
	mkdir -p $(B)

ifneq ($(NVCC),)
# nvcc found: the GPU path is compiled in; ./lime says clearly when no GPU is there.
$(B)/lime.o: lime.cu $(HEADERS) | $(B)
	$(NVCC) $(NVFLAGS) -c lime.cu -o $@
LIME_LIBS = -L$(CUDA_LIB) -lcublas -lcudart -Wl,-rpath,$(CUDA_LIB)
else
$(B)/lime.o: lime.cu $(HEADERS) | $(B)
	$(CXX) $(CXXFLAGS) -x c++ -c lime.cu -o $@
LIME_LIBS =
endif

# Each host source is compiled once per kind of build, into build/<kind>/:
# rel (./lime, ./lime-ref), test (./lime-emu and the test programs, with the
# fault hooks of LIME_TESTING), asan (the sanitizer suite).
HOST_OBJ = $(HOST_SRC:%.cpp=%.o)
REL_OBJ  = $(addprefix $(B)/rel/,$(HOST_OBJ))
TEST_OBJ = $(addprefix $(B)/test/,$(HOST_OBJ))
ASAN_OBJ = $(addprefix $(B)/asan/,$(HOST_OBJ))
$(B)/rel/%.o: %.cpp $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@
$(B)/test/%.o: %.cpp $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(TESTFLAGS) -c $< -o $@
$(B)/asan/%.o: %.cpp $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(ASANFLAGS) -c $< -o $@

lime: $(B)/rel/train.o $(B)/lime.o $(REL_OBJ)
	$(CXX) $(CXXFLAGS) $^ $(LIME_LIBS) -o $@

# The CPU path alone, compiled by g++ (what the CPU tests link).
$(B)/lime_cpu.o: lime.cu $(HEADERS) | $(B)
	$(CXX) $(CXXFLAGS) -x c++ -c lime.cu -o $@

# ./lime's CPU path alone, linked from g++'s objects (no nvcc): tests/test_isa.sh builds it
# here and for x86-64-v3 in a build directory of its own (B=..., ARCH_FLAGS=...).
$(B)/lime-cpu: $(B)/rel/train.o $(B)/lime_cpu.o $(REL_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@

# The CUDA code compiled by g++ against the harness: kernels run on the CPU. BANKFLAGS:
# g++ calls a function before every load and store (kernel-address sanitizer's outlined
# checks, with no runtime), which the harness defines to count shared-memory bank
# conflicts (LIME_EMU_BANKS=1; support/harness/cuda_on_cpu.h, section 3b).
BANKFLAGS = -DLIME_EMU_COUNT_BANKS -fsanitize=kernel-address --param asan-instrumentation-with-call-threshold=0 \
            --param asan-stack=0 --param asan-globals=0
$(B)/lime_emu.o: lime.cu $(HEADERS) support/harness/cuda_on_cpu.h | $(B)
	$(CXX) $(TESTFLAGS) $(BANKFLAGS) -DLIME_EMU -x c++ -c lime.cu -o $@

emu: lime-emu
lime-emu: $(B)/test/train.o $(B)/lime_emu.o $(TEST_OBJ)
	$(CXX) $(TESTFLAGS) $^ -o $@

# The reference build: the CPU path on lime.cu's plain loops alone (no
# support/model/cpu_fast.cpp kernels), the reading build: -O0 -g, and without
# -fopenmp, so that the plain loops run on one thread in order and gdb steps
# through them line by line (README's session; tests/test_docs.sh runs it);
# its train.cpp with -g too, to step from the training loop down.
ref: lime-ref
$(B)/lime_ref.o: lime.cu $(HEADERS) | $(B)
	$(CXX) -std=c++17 -O0 -g -Wall -Wextra -Wno-unknown-pragmas -I. -DLIME_REFERENCE -x c++ -c lime.cu -o $@
$(B)/ref/train.o: train.cpp $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -g -c $< -o $@
lime-ref: $(B)/ref/train.o $(B)/lime_ref.o $(REL_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@

CPU_TESTS = tests/test_model.cpp tests/test_export.cpp tests/test_safetensors.cpp tests/test_data.cpp tests/test_prosqa.cpp tests/test_stats.cpp tests/test_plot.cpp tests/test_checkpoint.cpp
# tests/test_model.cpp includes lime.cu itself, to reach the static ops.
# Each test file is an object of its own, so that make -j compiles them side by side.
CPU_TEST_SRC = $(CPU_TESTS) tests/test_main.cpp
$(addprefix $(B)/test/,$(CPU_TEST_SRC:.cpp=.o)) $(addprefix $(B)/asan/,$(CPU_TEST_SRC:.cpp=.o)): tests/test.h tests/test_helpers.h
$(B)/test/tests/test_model.o $(B)/asan/tests/test_model.o: lime.cu
$(B)/test_cpu: $(addprefix $(B)/test/,$(CPU_TEST_SRC:.cpp=.o)) $(TEST_OBJ) | $(B) deps
	$(CXX) $(TESTFLAGS) $^ -o $@

# Every GPU test, twice: kernels on the CPU harness (make test), and natively (make test-gpu).
$(B)/test_gpu_emu: tests/test_gpu.cpp tests/test_main.cpp tests/test.h tests/test_helpers.h support/harness/cuda_on_cpu.h lime.cu $(TEST_OBJ) $(HEADERS) | $(B) deps
	$(CXX) $(TESTFLAGS) $(BANKFLAGS) -DLIME_EMU tests/test_gpu.cpp tests/test_main.cpp $(TEST_OBJ) -o $@

ifneq ($(NVCC),)
$(B)/test_gpu_native.o: tests/test_gpu.cpp tests/test.h tests/test_helpers.h lime.cu $(HEADERS) | $(B)
	$(NVCC) $(NVFLAGS) -Itests -x cu -c tests/test_gpu.cpp -o $@
$(B)/test_gpu_native: $(B)/test_gpu_native.o tests/test_main.cpp $(REL_OBJ) $(HEADERS) | deps
	$(CXX) $(CXXFLAGS) -Itests tests/test_main.cpp $(REL_OBJ) $(B)/test_gpu_native.o $(LIME_LIBS) -o $@
# ptxas's resource report (registers, spills) of every kernel for sm_80 and sm_90;
# tests/check_spills.sh fails on a spill in the kernels it lists as spill-free.
$(B)/ptxas.txt: lime.cu $(HEADERS) | $(B)
	$(NVCC) $(NVFLAGS) --resource-usage -c lime.cu -o $(B)/ptxas.o 2> $@.tmp || { cat $@.tmp; rm -f $@.tmp; exit 1; }
	mv $@.tmp $@
nvcc-check: $(B)/lime.o $(B)/test_gpu_native $(B)/ptxas.txt
	@echo "nvcc: lime.cu and tests/test_gpu.cpp build for sm_80 and sm_90 with no warnings"
	@bash tests/check_spills.sh $(B)/ptxas.txt
	@NVCC=$(NVCC) bash tests/sass_per_mma.sh $(B)/lime.o
else
$(B)/test_gpu_native:
	@echo "no nvcc: the native GPU tests are not built"
nvcc-check:
	@echo "no nvcc found (install the CUDA Toolkit, or set NVCC=/path/to/nvcc)"; exit 1
endif

$(B)/test_emu: tests/test_emu_harness.cpp tests/test_main.cpp tests/test.h support/harness/cuda_on_cpu.h | $(B)
	$(CXX) $(TESTFLAGS) $(BANKFLAGS) tests/test_emu_harness.cpp tests/test_main.cpp -o $@

# The shell suites' JSON reader: what the commands print is parsed back by json_parse.
$(B)/json_check: tests/json_check.cpp support/lib/safetensors.cpp support/lib/safetensors.h | $(B)
	$(CXX) -std=c++17 -O1 -Wall -Wextra -I. tests/json_check.cpp support/lib/safetensors.cpp -o $@

test: lime lime-emu lime-ref $(B)/test_cpu $(B)/test_emu $(B)/test_gpu_emu $(B)/json_check lab-deps
	bash tests/run.sh

test-gpu: lime $(B)/test_gpu_native
	bash tests/run_gpu.sh

# Tier 3 (three operators), 20,000 examples, 15 epochs; lr 3e-3 rather than
# docs/training.md's 1e-3, since these small models learn several times faster with it.
# --force: each `make run` starts both runs afresh in runs/llama and runs/lime.
RUN_ARGS ?= --ops 3 --epochs 15 --lr 3e-3
run: lime
	./lime train --arch llama $(RUN_ARGS) --out runs/llama --force
	./lime train --arch lime $(RUN_ARGS) --out runs/lime --force
	@echo; echo "accuracy on 500 held-out questions, greedy decoding:"
	./lime eval --load runs/llama/model.safetensors --load runs/lime/model.safetensors

# Then the memory's speed, the FMA peak of one core and the fast products' GFLOP/s (tests/bench_matmul.cpp);
# tests/bench_compare.sh times two binaries side by side, tests/bench_torch.py PyTorch (README).
bench: lime $(B)/bench_matmul
	./lime bench --layers 4 --dim 32 --heads 4 --kv-heads 4 --ffn 96 --vocab 21 --batch 128 --seq-len 88 --steps 10
	./lime bench --layers 4 --dim 128 --heads 4 --kv-heads 4 --ffn 352 --vocab 32 --batch 32 --seq-len 64 --steps 10
	$(B)/bench_matmul
$(B)/bench_matmul: tests/bench_matmul.cpp $(B)/rel/support/model/cpu_fast.o support/model/cpu_fast.h support/model/lime.h support/lib/cpu_peak.h | $(B)
	$(CXX) $(CXXFLAGS) tests/bench_matmul.cpp $(B)/rel/support/model/cpu_fast.o -o $@

# The two benchmark configs on the GPU, each with full attention (R = H) and GQA.
bench-gpu: lime
	./lime bench --device gpu --layers 4 --dim 32 --heads 4 --kv-heads 4 --ffn 96 --vocab 21 --batch 128 --seq-len 88 --steps 20
	./lime bench --device gpu --layers 4 --dim 32 --heads 4 --kv-heads 2 --ffn 96 --vocab 21 --batch 128 --seq-len 88 --steps 20
	./lime bench --device gpu --layers 12 --dim 768 --heads 12 --kv-heads 12 --ffn 2048 --vocab 256 --batch 8 --seq-len 1024 --steps 10
	./lime bench --device gpu --layers 12 --dim 768 --heads 12 --kv-heads 4 --ffn 2048 --vocab 256 --batch 8 --seq-len 1024 --steps 10
	./lime bench --device gpu --layers 12 --dim 768 --heads 12 --kv-heads 12 --ffn 2048 --vocab 256 --batch 8 --seq-len 1024 --steps 10 --attention flash

# Sanitizers: the CPU tests and a CPU-only ./lime (build/lime-asan), built with
# AddressSanitizer and UndefinedBehaviorSanitizer; tests/run_asan.sh runs the
# CPU tests and the CLI suites on them and fails on any report.
ASANFLAGS = -std=c++17 -O1 -g1 -fopenmp -I. -Itests -DLIME_TESTING -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
$(B)/test_cpu_asan: $(addprefix $(B)/asan/,$(CPU_TEST_SRC:.cpp=.o)) $(ASAN_OBJ) | $(B) deps
	$(CXX) $(ASANFLAGS) $^ -o $@
$(B)/lime_asan.o: lime.cu $(HEADERS) | $(B)
	$(CXX) $(ASANFLAGS) -x c++ -c lime.cu -o $@
$(B)/lime-asan: $(B)/asan/train.o $(B)/lime_asan.o $(ASAN_OBJ)
	$(CXX) $(ASANFLAGS) $^ -o $@
test-asan:
	$(MAKE) -j2 $(B)/test_cpu_asan $(B)/lime-asan
	bash tests/run_asan.sh

# Fuzzing with libFuzzer (clang++; Debian/Ubuntu: packages clang-14 and
# libclang-rt-14-dev). Each target runs FUZZ_SECONDS from its seed corpus in
# tests/fuzz_corpus/ (left untouched); a crash, hang or sanitizer report fails.
FUZZ_SECONDS ?= 60
FUZZ_CXX  ?= clang++
FUZZFLAGS = -std=c++17 -O1 -g1 -I. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Wno-unknown-pragmas -Wno-format-security
# Each source compiled once, to build/fuzz/ (the fuzzers share the objects,
# and make -j2 compiles them side by side), then linked per target.
FUZZ_ST_SRC = support/lib/safetensors.cpp support/model/checkpoint.cpp support/model/routers.cpp support/lib/cli.cpp support/model/cpu_fast.cpp support/model/names.cpp
FUZZ_TASK_SRC = data/arith.cpp data/text.cpp data/task.cpp data/prosqa.cpp support/lib/safetensors.cpp
fuzz_objs = $(addprefix $(B)/fuzz/,$(1:.cpp=.o))
$(B)/fuzz/%.o: %.cpp $(HEADERS) data/prosqa.h labs/lab5/report.h | $(B)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZFLAGS) -c $< -o $@
$(B)/fuzz/lime.o: lime.cu $(HEADERS) | $(B)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZFLAGS) -x c++ -c lime.cu -o $@
$(B)/fuzz/tests/fuzz_reference.o: support/commands/verify.cpp
$(B)/fuzz_safetensors: $(call fuzz_objs,tests/fuzz_safetensors.cpp $(FUZZ_ST_SRC)) $(B)/fuzz/lime.o
	$(FUZZ_CXX) $(FUZZFLAGS) $^ -o $@
$(B)/fuzz_tasks: $(call fuzz_objs,tests/fuzz_tasks.cpp $(FUZZ_TASK_SRC))
	$(FUZZ_CXX) $(FUZZFLAGS) $^ -o $@
# ./lime verify's reader of reference files: support/commands/verify.cpp itself (included), with everything it links.
$(B)/fuzz_reference: $(call fuzz_objs,tests/fuzz_reference.cpp $(filter-out support/commands/verify.cpp,$(HOST_SRC))) $(B)/fuzz/lime.o
	$(FUZZ_CXX) $(FUZZFLAGS) $^ -o $@
# Lab 5's grader of the answers, the report and the heatmap (labs/lab5/report.h).
$(B)/fuzz_lab5: $(call fuzz_objs,tests/fuzz_lab5.cpp)
	$(FUZZ_CXX) $(FUZZFLAGS) $^ -o $@
FUZZ_BINS = $(B)/fuzz_safetensors $(B)/fuzz_tasks $(B)/fuzz_reference $(B)/fuzz_lab5
fuzz: $(FUZZ_BINS)
	bash tests/run_fuzz.sh $(FUZZ_SECONDS) $(FUZZ_BINS)

# Classroom labs (labs/README.md). lime.cu is compiled once for all of them
# with -DLIME_LAB (the functions marked LAB_SWAPPABLE are weak symbols) and
# its CUDA code on the CPU harness; `make lab2` compiles the student's file
# (FILE=..., else labs/lab2/mine.cpp) and runs the lab's checks (labs/run.sh).
# Built once per lab (labs/check.h, "Who decides"): the judge (the checker
# with labs/transcript.cpp replaying, no student code), the recording half
# the student's worker is linked with, and the project's checker (FILE=project).
# A lab that does not exist lists the labs.
LAB_FLAGS = -std=c++17 -O1 -g -fopenmp -Wall -Wextra -Wno-unused-parameter -I. -Itests -DLIME_TESTING -DLIME_LAB -DLIME_EMU
$(B)/lab/lime.o: lime.cu $(HEADERS) support/harness/cuda_on_cpu.h | $(B)
	@mkdir -p $(dir $@)
	$(CXX) $(LAB_FLAGS) -x c++ -c lime.cu -o $@
LAB_OBJ  = $(B)/lab/lime.o $(TEST_OBJ)
# Each code lab's checker; only lab 3's (a kernel) needs the harness's header.
CODE_LABS = $(filter-out lab5,$(patsubst labs/%/check.cpp,%,$(wildcard labs/lab*/check.cpp)))
LAB_DEPS  = labs/check.h labs/lab.h support/harness/cuda_on_cpu.h $(HEADERS)
lab_emu   = $(if $(filter lab3,$(1)),,-ULIME_EMU)
$(B)/lab/%/check.o: labs/%/check.cpp $(LAB_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(LAB_FLAGS) $(call lab_emu,$*) -c $< -o $@
$(B)/lab/%/record.o: labs/transcript.cpp $(LAB_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(LAB_FLAGS) $(call lab_emu,$*) -DLAB_RECORD -DLAB_NUMBER=$(*:lab%=%) -c $< -o $@
$(B)/lab/%/replay.o: labs/transcript.cpp $(LAB_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(LAB_FLAGS) $(call lab_emu,$*) -DLAB_REPLAY -DLAB_NUMBER=$(*:lab%=%) -c $< -o $@
$(B)/lab/%/checker-judge: $(B)/lab/%/check.o $(B)/lab/%/replay.o $(LAB_OBJ)
	$(CXX) $(LAB_FLAGS) $^ -o $@
$(B)/lab/%/checker-project: $(B)/lab/%/check.o $(LAB_OBJ)
	$(CXX) $(LAB_FLAGS) $^ -o $@
LAB_BUILT = $(foreach l,$(CODE_LABS),$(addprefix $(B)/lab/$(l)/,check.o record.o replay.o checker-judge checker-project))
# Lab 5's checker reads the report and the answers as data (labs/lab5/report.h): a program of its own.
$(B)/lab/lab5/check: labs/lab5/check.cpp labs/lab5/report.h
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O1 -g -Wall -Wextra -I. labs/lab5/check.cpp -o $@
export LAB_FLAGS LAB_OBJ  # for labs/run.sh, and tests/test_labs.sh under make test
LABS = $(patsubst labs/%/README.md,%,$(wildcard labs/lab*/README.md))
.PHONY: lab-deps $(LABS)
lab-deps: $(LAB_OBJ) $(LAB_BUILT) $(B)/lab/lab5/check
$(filter-out lab5,$(LABS)): lab-deps
lab5: lime $(B)/lab/lab5/check  # the experiment runs ./lime itself
# FILE and RUN reach labs/run.sh through the environment (make exports the
# variables of its command line), quoted by the shell: a path such as "a;b"
# is a file name, never a command.
export FILE RUN
$(LABS):
	@CXX="$(CXX)" bash labs/run.sh $(@:lab%=%) "$${FILE-}"
lab%:
	@bash labs/run.sh $* "$${FILE-}"

clean:
	rm -rf $(B) lime lime-emu lime-ref
