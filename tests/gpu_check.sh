#!/usr/bin/env bash
# tests/gpu_check.sh — everything that needs a real GPU, in one go (about 5 minutes on an H200):
#   0. prints the nvcc, the driver and the GPU it runs with
#   1. builds ./lime and the native GPU tests for sm_90 (set GENCODE to build for another GPU), with
#      nvcc's warnings left as warnings (NVWERROR=): another nvcc or host compiler must not stop this run;
#      PREBUILT=1 skips the build and runs ./lime and build/test_gpu_native as they are (built on
#      another machine, e.g. `make lime build/test_gpu_native ARCH_FLAGS=-march=x86-64-v3`, and copied)
#   2. the probe of what cuBLAS's FAST_16BF and TF32 products rounded to (printed), then the native GPU tests (every kernel against the CPU, reference vectors, graphs, determinism);
#      a device ./lime cannot use (no GPU, a driver older than the CUDA runtime) fails here, with the reason
#   3. ./lime verify --device gpu --tf32 0 on every reference file (exact float32 tolerances), matmul and flash attention;
#      then --precision bf16, matmul and flash attention (bf16's tolerances: hc_tiny's and ResFormer's files are
#      expected to fail, docs/checkpoint.md)
#   4. compute-sanitizer's memcheck and racecheck (matmul and flash attention) and initcheck (matmul) on one
#      step of a tiny `bench --graph 0`, when compute-sanitizer is there; any report it makes fails
#   5. an nsys kernel summary of config (b) with GQA (the 15 kernels that take the most GPU time), when nsys is there
#   6. the benchmark configs (a) and (b), full attention and GQA, TF32 and CUDA graphs, (a) without the graph, (b) with flash attention,
#      (b) with --precision bf16
#   7. compare --preset tiny --device gpu (8 runs of 300 steps) with --jobs 1 (one process a run) and --jobs 8 (all in one
#      process, ./lime train-group): the wall time of each, and whether the 8 models are the same bits
# and prints a short table. Time: the sanitizer runs are capped at 30 s each (racecheck at RACECHECK_SECONDS, 120),
# the profile at 60 s.
# Exit status: non-zero if a test, a verify or a sanitizer run failed.
cd "$(dirname "$0")/.." || exit 2
set -o pipefail
GENCODE=${GENCODE:-"-gencode arch=compute_90,code=sm_90"}
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)}
status=0
echo "== nvcc, driver, GPU"
if [ -n "$NVCC" ]; then echo "nvcc: $NVCC, $("$NVCC" --version | grep -i release)"; else echo "nvcc: not found"; fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=driver_version,name,compute_cap --format=csv,noheader 2>&1 |
        awk -F', ' 'NF == 3 { print "driver: " $1 ", GPU: " $2 " (compute capability " $3 ")"; next } { print }'
else
    echo "nvidia-smi: not found"
fi
if [ "${PREBUILT:-0}" = 1 ]; then  # built on another machine (for this GPU) and copied here: ./lime, build/test_gpu_native
    echo "== build: none (PREBUILT=1: ./lime and build/test_gpu_native as they are)"
    for f in ./lime build/test_gpu_native; do
        [ -x "$f" ] || { echo "FAIL: PREBUILT=1 but $f is missing; build it with: make lime build/test_gpu_native"; exit 2; }
        missing=$(ldd "$f" 2>&1 | grep 'not found')
        [ -z "$missing" ] || { echo "FAIL: $f needs libraries this machine lacks:" $missing "(set LD_LIBRARY_PATH, or build here)"; exit 2; }
    done
else
    echo "== build (GENCODE=$GENCODE)"
    rm -f build/lime.o build/test_gpu_native.o
    make -s lime build/test_gpu_native GENCODE="$GENCODE" NVWERROR= ${NVCC:+NVCC="$NVCC"} || exit 2
fi
probe=$(./lime verify --device gpu 2>&1)
if echo "$probe" | grep -q -e "no CUDA device" -e "no GPU support"; then
    echo "FAIL: ./lime cannot use a GPU here: $(echo "$probe" | sed 's/.*--device gpu: //')"
    exit 1
fi

echo "== what cuBLAS rounded (the probe: one FAST_16BF and one TF32 product)"
out=$(build/test_gpu_native gpu_cublas_rounding_probe 2>&1)
echo "$out" | grep -E '^(probe|FAIL|SKIP)'
echo "$out" | grep -q '^probe:' || status=1

echo "== native GPU tests"
out=$(build/test_gpu_native 2>&1); rc=$?
echo "$out" | grep -v '^PASS'
if ! echo "$out" | grep -qE '^[0-9]+ passed, [0-9]+ failed'; then  # a crash: name the test it was in
    last=$(echo "$out" | grep -E '^(PASS|FAIL|SKIP) ' | tail -1 | cut -d' ' -f2 | tr -d ':')
    echo "FAIL build/test_gpu_native ended without its result line (exit $rc), in the test after ${last:-none}"
    status=1
elif [ $rc -ne 0 ]; then status=1; fi
echo "== verify --device gpu --tf32 0"
./lime verify --device gpu --tf32 0 --quiet tests/golden/*.safetensors || status=1
./lime verify --device gpu --tf32 0 --attention flash --quiet tests/golden/*.safetensors || status=1
echo "== verify --device gpu --precision bf16 (hc_tiny's, ResFormer's and MUDDFormer's files: expected to fail; DCA's near 2e-2; not counted)"
./lime verify --device gpu --precision bf16 --tf32 1 --quiet tests/golden/*.safetensors
for attention in matmul flash; do
    ./lime verify --device gpu --precision bf16 --tf32 1 --attention $attention --quiet \
        tests/golden/{llama_tiny,lime_tiny,lime_gqa,llama_ereg,denseformer_tiny,hc_static_gqa}.safetensors || status=1
done

# compute-sanitizer (on the PATH, or beside nvcc): memcheck, racecheck and initcheck on one timed step of
# llama, lime and hc (with the regulariser, so its kernels run too), --graph 0 so every kernel is launched
# where the tool sees it; a tiny shape, since each tool slows the kernels 10-100x. racecheck, slower
# still (on an H200 the shape below took 67-82 s, two side by side), gets a smaller one and RACECHECK_SECONDS;
# one that does not finish is reported as unfinished, not as passed or failed.
SAN=$(command -v compute-sanitizer 2>/dev/null || { [ -n "$NVCC" ] && ls "$(dirname "$NVCC")/compute-sanitizer" 2>/dev/null; })
TINY="--layers 2 --dim 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 21 --batch 4 --seq-len 40 --steps 1 --graph 0 --entropy-reg 0.01"
TINIER="--layers 2 --dim 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 21 --batch 2 --seq-len 20 --steps 1 --graph 0 --entropy-reg 0.01"
RACECHECK_SECONDS=${RACECHECK_SECONDS:-120}
echo "== compute-sanitizer"
if [ -z "$SAN" ]; then
    echo "SKIP compute-sanitizer: not found (it comes with the CUDA Toolkit, beside nvcc)"
else
    for run in "memcheck matmul" "memcheck flash" "racecheck matmul" "racecheck flash" "initcheck matmul"; do
        read -r tool attention <<< "$run"
        cap=30 shape=$TINY
        [ "$tool" = racecheck ] && cap=$RACECHECK_SECONDS shape=$TINIER
        log=$(timeout "$cap" "$SAN" --tool "$tool" --error-exitcode 3 ./lime bench --device gpu $shape --attention "$attention" 2>&1)
        rc=$?
        if [ $rc = 0 ]; then echo "PASS $tool, --attention $attention"; continue; fi
        if [ $rc = 124 ]; then
            echo "UNFINISHED $tool, --attention $attention: still running after $cap s, no report so far (not counted as passed)"
            continue
        fi
        status=1
        echo "FAIL $tool, --attention $attention (exit $rc):"
        { echo "$log" | grep '^=========' || echo "$log"; } | head -20 | sed 's/^/   /'
    done
fi

# nsys (on the PATH): the kernels of 3 steps of config (b) with GQA, the graph's nodes traced one by one,
# the 15 that take the most GPU time.
echo "== nsys kernel summary"
if ! command -v nsys >/dev/null 2>&1; then
    echo "SKIP nsys: not found (Nsight Systems: https://developer.nvidia.com/nsight-systems)"
else
    dir=$(mktemp -d)
    if timeout 60 nsys profile --trace cuda --cuda-graph-trace node --output "$dir/b" --force-overwrite true \
            ./lime bench --device gpu --layers 12 --dim 768 --heads 12 --kv-heads 4 --ffn 2048 --vocab 256 \
            --batch 8 --seq-len 1024 --steps 3 >/dev/null 2>&1 &&
        nsys stats --report cuda_gpu_kern_sum --format csv --output - "$dir/b.nsys-rep" > "$dir/sum.csv" 2>/dev/null; then
        # the CSV's columns: Time (%), Total Time (ns), Instances, Avg, Med, Min, Max, StdDev (ns), Name (quoted: it holds commas)
        awk -F, 'found && n < 15 && $1 ~ /^"?[0-9.]+"?$/ {
                     for (i = 1; i <= 3; i++) gsub(/"/, "", $i)
                     name = $9; for (i = 10; i <= NF; i++) name = name "," $i; gsub(/^"|"$/, "", name)
                     printf "   %5.1f%%  %9.2f ms  %6d launches  %s\n", $1, $2 / 1e6, $3, substr(name, 1, 100); n++ }
                 /^"?Time \(%\)/ { found = 1 }' "$dir/sum.csv"
        [ -s "$dir/sum.csv" ] || echo "   (nsys stats wrote no kernel summary)"
    else
        echo "   nsys profile or nsys stats failed, or ran past 60 s (not counted as a failure: a profile, not a test)"
    fi
    rm -rf "$dir"
fi

echo "== bench"
A="--layers 4 --dim 32 --heads 4 --ffn 96 --vocab 21 --batch 128 --seq-len 88 --steps 30"
B="--layers 12 --dim 768 --heads 12 --ffn 2048 --vocab 256 --batch 8 --seq-len 1024 --steps 10"
runs=(
    "a full R=4|$A --kv-heads 4"
    "a GQA R=2|$A --kv-heads 2"
    "a full, no graph|$A --kv-heads 4 --graph 0"
    "b full R=12|$B --kv-heads 12"
    "b GQA R=4|$B --kv-heads 4"
    "b full, flash attention|$B --kv-heads 12 --attention flash"
    "b full R=12, bf16|$B --kv-heads 12 --precision bf16"
    "b full, flash attention, bf16|$B --kv-heads 12 --attention flash --precision bf16"
)
for r in "${runs[@]}"; do
    name=${r%%|*}; flags=${r#*|}
    echo "-- $name"
    ./lime bench --device gpu $flags 2>&1 | sed 's/^/   /' || { echo "   bench $name failed"; status=1; }
done

echo "== compare --preset tiny --device gpu: --jobs 1 against --jobs 8 (one process)"
dir=$(mktemp -d)
TRAIN="--steps 300 --eval-every 1000"
for jobs in 1 8; do
    start=$(date +%s%N)
    ./lime compare --preset tiny --device gpu --seeds 4 --jobs $jobs --train-args "$TRAIN" --out "$dir/j$jobs" \
        >"$dir/j$jobs.log" 2>&1 || { echo "   --jobs $jobs failed: $(tail -1 "$dir/j$jobs.log")"; status=1; }
    echo "   --jobs $jobs: $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
differ=0
for m in "$dir"/j1/tier*/*/model.safetensors; do
    other=${m/\/j1\//\/j8\/}
    n=$(od -An -t u8 -N8 "$m" | tr -d ' '); k=$(od -An -t u8 -N8 "$other" 2>/dev/null | tr -d ' ')
    cmp -s <(tail -c +$((9 + n)) "$m") <(tail -c +$((9 + ${k:-0})) "$other") || differ=$((differ + 1))
done
echo "   models that differ between --jobs 1 and --jobs 8: $differ"
[ $differ -eq 0 ] || status=1
rm -rf "$dir"
exit $status
