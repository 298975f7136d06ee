#!/usr/bin/env bash
# tests/gpu_check.sh — everything that needs a real GPU, in one go (under 5 minutes on an H100/H200):
#   1. builds ./lime and the native GPU tests for sm_90 (set GENCODE to build for another GPU)
#   2. runs the native GPU tests (every kernel against the CPU, reference vectors, graphs, determinism)
#   3. ./lime verify --device gpu --tf32 0 on every reference file (exact float32 tolerances), matmul and flash attention
#   4. the benchmark configs (a) and (b), full attention and GQA, TF32 and CUDA graphs, (a) without the graph, (b) with flash attention
# and prints a short table. Exit status: non-zero if a test or a verify failed.
cd "$(dirname "$0")/.." || exit 2
set -o pipefail
GENCODE=${GENCODE:-"-gencode arch=compute_90,code=sm_90"}
status=0
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found)"
echo "== build (GENCODE=$GENCODE)"
rm -f build/lime.o build/test_gpu_native.o
make -s lime build/test_gpu_native GENCODE="$GENCODE" || exit 2

echo "== native GPU tests"
build/test_gpu_native | grep -v '^PASS' || status=1
echo "== verify --device gpu --tf32 0"
./lime verify --device gpu --tf32 0 --quiet tests/golden/*.safetensors || status=1
./lime verify --device gpu --tf32 0 --attention flash --quiet tests/golden/*.safetensors || status=1

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
)
for r in "${runs[@]}"; do
    name=${r%%|*}; flags=${r#*|}
    echo "-- $name"
    ./lime bench --device gpu $flags 2>&1 | sed 's/^/   /' || { echo "   bench $name failed"; status=1; }
done
exit $status
