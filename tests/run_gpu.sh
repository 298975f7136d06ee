#!/usr/bin/env bash
# tests/run_gpu.sh — the GPU tests on this machine's GPU (make test-gpu):
# build/test_gpu_native (every kernel against the CPU, the model against the
# reference vectors and the CPU path, graphs, determinism), then
# ./lime verify --device gpu in float32 and with TF32. Without a CUDA device it
# says why and counts one skip; but where `nvidia-smi -L` lists a GPU, a failed
# probe (a driver older than the CUDA runtime, a CPU-only build) is a failure
# with the probe's message. Last line: "N passed, N failed, N skipped".
cd "$(dirname "$0")/.." || exit 2
LIME=${LIME:-./lime}                    # LIME=./lime-emu TESTS=build/test_gpu_emu: the same on the CPU harness
TESTS=${TESTS:-build/test_gpu_native}
probe=$($LIME verify --device gpu 2>&1)  # asks cudaGetDeviceCount before it wants files
if echo "$probe" | grep -q -e "no CUDA device" -e "no GPU support"; then
    reason=$(echo "$probe" | sed 's/.*--device gpu: //; s/; use --device cpu$//')
    gpus=$(nvidia-smi -L 2>/dev/null | grep '^GPU [0-9]')
    if [ -n "$gpus" ]; then
        echo "FAIL gpu tests: nvidia-smi lists $(echo "$gpus" | head -1), but $LIME cannot use it: $reason"
        echo "0 passed, 1 failed, 0 skipped"
        exit 1
    fi
    smi=$(nvidia-smi -L 2>&1 | head -1)
    command -v nvidia-smi >/dev/null 2>&1 || smi="nvidia-smi not found"
    echo "SKIP gpu tests: no CUDA device on this machine ($reason; ${smi:-nvidia-smi lists no GPU})"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
passed=0; failed=0; skipped=0
count() {  # adds up a suite's "N passed, N failed, N skipped" line
    local line=$1
    passed=$((passed + $(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p')))
    failed=$((failed + $(echo "$line" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')))
    skipped=$((skipped + $(echo "$line" | sed -n 's/.* \([0-9]*\) skipped.*/\1/p')))
}
echo "== $TESTS"
out=$($TESTS 2>&1); status=$?
echo "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed'
line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
if [ -z "$line" ]; then echo "FAIL $TESTS ended without a result line (exit $status)"; failed=$((failed + 1)); else count "$line"; fi
for tf32 in 0 1; do
    echo "== $LIME verify --device gpu --tf32 $tf32"
    if $LIME verify --device gpu --tf32 $tf32 --quiet tests/golden/*.safetensors; then
        echo "PASS verify --device gpu --tf32 $tf32"; passed=$((passed + 1))
    else
        echo "FAIL verify --device gpu --tf32 $tf32"; failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
