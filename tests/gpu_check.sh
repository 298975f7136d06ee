#!/usr/bin/env bash
# tests/gpu_check.sh — everything that needs a real GPU, in one go (under 5 minutes on an H100/H200):
#   1. builds ./lime and the native GPU tests for sm_90 (set GENCODE to build for another GPU)
#   2. runs the native GPU tests (every kernel against the CPU, reference vectors, graphs, determinism)
#   3. ./lime verify --device gpu --tf32 0 on every reference file (exact float32 tolerances)
#   4. the benchmark configs (a) and (b), full attention and GQA, TF32 and CUDA graphs, and (a) without the graph
# and prints a short table. Exit status: non-zero if a test or a verify failed.
cd "$(dirname "$0")/.." || exit 2
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

echo "== bench"
A="--layers 4 --dim 32 --heads 4 --ffn 96 --vocab 21 --batch 128 --seq-len 88 --steps 30"
B="--layers 12 --dim 768 --heads 12 --ffn 2048 --vocab 256 --batch 8 --seq-len 1024 --steps 10"
runs=(
    "a full R=4|$A --kv-heads 4"
    "a GQA R=2|$A --kv-heads 2"
    "a full, no graph|$A --kv-heads 4 --graph 0"
    "b full R=12|$B --kv-heads 12"
    "b GQA R=4|$B --kv-heads 4"
)
results=()
for r in "${runs[@]}"; do
    name=${r%%|*}; flags=${r#*|}
    json=$(./lime bench --device gpu --json $flags 2>&1) || { echo "bench $name failed: $json"; status=1; continue; }
    results+=("$name|$json")
done
python3 - "${results[@]}" <<'PY' || printf '%s\n' "${results[@]}"
import json, sys
rows = [r.split("|", 1) for r in sys.argv[1:]]
first = json.loads(rows[0][1]) if rows else {}
print(f"GPU: {first.get('gpu')}, MFU against {first.get('peak_tflops')} TFLOP/s ({first.get('peak_source')}), TF32 {first.get('tf32')}")
print(f"{'config':18} {'llama ms':>9} {'lime ms':>9} {'ratio':>6} {'llama MFU':>9} {'lime MFU':>9} {'llama GB':>9} {'lime GB':>8} {'mem ratio':>9}")
for name, js in rows:
    j = json.loads(js); l, m = j["llama"], j["lime"]
    print(f"{name:18} {l['ms_per_step']:9.3f} {m['ms_per_step']:9.3f} {j['lime_over_llama']:6.3f} {100*l['mfu']:8.1f}% {100*m['mfu']:8.1f}% "
          f"{l['device_gb']:9.3f} {m['device_gb']:8.3f} {j['memory_lime_over_llama']:9.3f}")
PY
exit $status
