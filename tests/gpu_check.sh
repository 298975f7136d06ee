#!/usr/bin/env bash
# tests/gpu_check.sh — everything that needs a real GPU, in one go (under 5 minutes on an H100/H200):
#   0. prints the nvcc, the driver and the GPU it runs with
#   1. builds ./lime and the native GPU tests for sm_90 (set GENCODE to build for another GPU), with
#      nvcc's warnings left as warnings (NVWERROR=): another nvcc or host compiler must not stop this run
#   2. runs the native GPU tests (every kernel against the CPU, reference vectors, graphs, determinism);
#      a device ./lime cannot use (no GPU, a driver older than the CUDA runtime) fails here, with the reason
#   3. ./lime verify --device gpu --tf32 0 on every reference file (exact float32 tolerances), matmul and flash attention
#   4. the benchmark configs (a) and (b), full attention and GQA, TF32 and CUDA graphs, (a) without the graph, (b) with flash attention
# and prints a short table. Exit status: non-zero if a test or a verify failed.
cd "$(dirname "$0")/.." || exit 2
set -o pipefail
GENCODE=${GENCODE:-"-gencode arch=compute_90,code=sm_90"}
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)}
status=0
echo "== nvcc, driver, GPU"
if [ -n "$NVCC" ]; then echo "nvcc: $NVCC, $("$NVCC" --version | grep -i release)"; else echo "nvcc: not found"; fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=driver_version,name,compute_cap --format=csv,noheader 2>&1 |
        sed 's/^\([^,]*\), */driver: \1, GPU: /'
else
    echo "nvidia-smi: not found"
fi
echo "== build (GENCODE=$GENCODE)"
rm -f build/lime.o build/test_gpu_native.o
make -s lime build/test_gpu_native GENCODE="$GENCODE" NVWERROR= ${NVCC:+NVCC="$NVCC"} || exit 2
probe=$(./lime verify --device gpu 2>&1)
if echo "$probe" | grep -q -e "no CUDA device" -e "no GPU support"; then
    echo "FAIL: ./lime cannot use a GPU here: $(echo "$probe" | sed 's/.*--device gpu: //')"
    exit 1
fi

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
