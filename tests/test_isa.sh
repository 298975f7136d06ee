#!/usr/bin/env bash
# tests/test_isa.sh — the same bits on any x86-64 machine: ./lime's CPU path
# built by g++ for AVX2 (-march=x86-64-v3, in build/isa/ of its own) and as
# make builds it here (ARCH_FLAGS, -march=native unless set: AVX-512 on a CPU
# that has it; build/lime-cpu, from ./lime's own objects and lime.cu once
# more through g++) trains every model of ARCHS for a few steps at each shape
# of SHAPES, on 1 and 2 threads: each model's four files must be the same
# bytes (cmp). Its cost is the x86-64-v3 build, about 50 s of one core (kept
# in build/isa/ for the next run); the runs take seconds.
cd "$(dirname "$0")/.." || exit 2
source tests/lib.sh

# The models compared, one per entry: the flags after --arch.
ARCHS=("llama" "lime" "lime --router-heads same" "hc" "resformer" "denseformer" "dca" "llama --entropy-reg 0.1")
# d 32: whole vectors everywhere; d 36 (hd 12, one kv head): every sum's scalar
# tail, the 2-lane HC and attention loops and the router's sliced dot products.
SHAPES=("--dim 32 --heads 4 --ffn 96"
        "--dim 36 --heads 3 --kv-heads 1 --ffn 100")
COMMON=(--layers 2 --batch 16 --ops 3 --train-size 512 --test-size 8 --eval-size 8 --quiet
        --steps "${STEPS:-20}")

skip() {
    echo "SKIP isa: $1"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
}
[ "$(uname -m)" = x86_64 ] || skip "this is $(uname -m), not x86-64 (the promise covers x86-64 with AVX2 or AVX-512)"
for f in avx2 fma bmi2 movbe; do
    grep -qw "$f" /proc/cpuinfo || skip "this CPU cannot run an x86-64-v3 (AVX2) build (no $f)"
done
# What the second build targets: make exports a command line's ARCH_FLAGS to
# this script, and its default is -march=native.
native=${ARCH_FLAGS--march=native}
macros=$(${CXX:-g++} $native -dM -E -x c++ /dev/null 2>/dev/null)
grep -q __FMA__ <<<"$macros" || skip "ARCH_FLAGS '$native' has no FMA: the promise covers AVX2 and AVX-512 builds"
if grep -q __AVX512F__ <<<"$macros"; then other="'$native' (AVX-512)"; else other="'$native' (AVX2: no AVX-512 here)"; fi
# A make of its own: make test's jobserver and flags do not reach it (ARCH_FLAGS, from the environment, does).
submake() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -j2 NVCC= "$@" >"$tmp/make.log" 2>&1; }
submake B=build/isa/x86-64-v3 ARCH_FLAGS=-march=x86-64-v3 build/isa/x86-64-v3/lime-cpu ||
    { fail "isa: build -march=x86-64-v3" "$(grep -m1 -i error "$tmp/make.log")"; summary; exit; }
submake build/lime-cpu || { fail "isa: build $native" "$(grep -m1 -i error "$tmp/make.log")"; summary; exit; }
builds=("$PWD/build/isa/x86-64-v3/lime-cpu" "$PWD/build/lime-cpu") names=(x86-64-v3 "$native")

# Each model's run in its own directory, the same --out in each: the file
# keeps its flags (--threads among them: the threads are set by OMP_NUM_THREADS).
for shape in "${SHAPES[@]}"; do
    for arch in "${ARCHS[@]}"; do
        # same-head with one kv head is lime itself, refused: it runs at the first shape
        [[ $arch == *"router-heads same"* && $shape == *"--kv-heads 1"* ]] && continue
        files=() bad=""
        for b in 0 1; do
            for threads in 1 2; do
                run=$tmp/run-$b-$threads
                rm -rf "$run" && mkdir -p "$run"
                # shellcheck disable=SC2086  # the shape and the model's flags are words
                if ! (cd "$run" && OMP_NUM_THREADS=$threads "${builds[$b]}" train --arch $arch $shape \
                        "${COMMON[@]}" --out m --device cpu >out.txt 2>&1); then
                    bad="${names[$b]} on $threads threads: train failed: $(tail -1 "$run/out.txt")"
                    break 2
                fi
                files+=("$tmp/$b-$threads.safetensors")
                mv "$run/m/model.safetensors" "${files[-1]}"
            done
        done
        if [ -z "$bad" ]; then
            labels=("" "x86-64-v3 on 2 threads" "$native on 1 thread" "$native on 2 threads")
            for i in 1 2 3; do
                cmp -s "${files[0]}" "${files[$i]}" || bad="$bad${bad:+, }${labels[$i]}"
            done
            [ -n "$bad" ] && bad="other bytes than x86-64-v3's on 1 thread: $bad"
        fi
        name="isa: --arch $arch $shape, -march=x86-64-v3 (AVX2) against $other, 1 and 2 threads"
        if [ -z "$bad" ]; then pass "$name: the same bytes"; else fail "$name" "$bad"; fi
    done
done
summary
