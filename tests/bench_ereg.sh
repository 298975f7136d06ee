#!/usr/bin/env bash
# tests/bench_ereg.sh — the value-entropy regulariser's cost: `./lime bench
# --entropy-reg LAMBDA` at the two configs of `make bench`, ROUNDS times, each
# round running every config with every binary in turn. Each run times llama
# and lime step by step beside themselves with the regulariser (bench_models:
# the models' steps interleaved in one process, so that a change in the
# machine's load falls on all) and gives the median over the steps of
# (with / without). Prints per binary, config and model the median over the
# rounds of that ratio minus 1, the regulariser's share of a step, and each
# round's, with the mean ms/step without and with it.
# Not part of `make test` (it measures, it checks nothing).
#
#   bash tests/bench_ereg.sh [ROUNDS] [LAMBDA] [THREADS] [BINARY...]
#   e.g. bash tests/bench_ereg.sh 5 0.01 1 /tmp/lime-before ./lime
rounds=${1:-5}
lambda=${2:-0.01}
threads=${3:-1}
shift 3 2>/dev/null || shift $#
bins=("$@")
[ ${#bins[@]} -eq 0 ] && bins=(./lime)
STEPS=${STEPS:-30}
configs=(
    "d32:--layers 4 --dim 32 --heads 4 --kv-heads 4 --ffn 96 --vocab 21 --batch 128 --seq-len 88"
    "d128:--layers 4 --dim 128 --heads 4 --kv-heads 4 --ffn 352 --vocab 32 --batch 32 --seq-len 64"
)
for bin in "${bins[@]}"; do [ -x "$bin" ] || { echo "bench_ereg: $bin is not an executable"; exit 2; }; done
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
echo "load before: $(uptime | sed 's/.*load average/load average/'); $rounds rounds, $STEPS steps, $threads thread(s), lambda $lambda"
for ((r = 1; r <= rounds; r++)); do
    for c in "${configs[@]}"; do
        for k in "${!bins[@]}"; do
            bin=${bins[$k]}
            out=$("$bin" bench ${c#*:} --steps "$STEPS" --threads "$threads" --entropy-reg "$lambda" --json) ||
                { echo "bench_ereg: $bin bench failed"; exit 1; }
            for m in llama lime; do
                field() { echo "$out" | sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p"; }
                off=$(echo "$out" | sed -n "s/.*\"$m\": {\"ms_per_step\": \([0-9.e+-]*\).*/\1/p")
                on=$(field "${m}_reg_ms_per_step")
                ratio=$(field "${m}_reg_over_plain")
                [ -n "$off" ] && [ -n "$on" ] && [ -n "$ratio" ] ||
                    { echo "bench_ereg: no ${m}_reg_over_plain in: $out"; exit 1; }
                echo "$k ${c%%:*} $m $off $on $ratio" >> "$tmp"
            done
        done
    done
done
echo "load after: $(uptime | sed 's/.*load average/load average/')"
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf "%-20s %-5s %-6s %12s %12s %8s  %s\n" binary config model "ms/step off" "ms/step on" "on/off-1" \
    "(median of the rounds' medians over the steps; each round's)"
for k in "${!bins[@]}"; do
    for c in "${configs[@]}"; do
        for m in llama lime; do
            rows=$(grep "^$k ${c%%:*} $m " "$tmp")
            off=$(echo "$rows" | awk '{print $4}' | med); on=$(echo "$rows" | awk '{print $5}' | med)
            ratio=$(echo "$rows" | awk '{print $6 - 1}' | med)
            each=$(echo "$rows" | awk '{printf "%+.1f%% ", 100 * ($6 - 1)}')
            awk -v b="${bins[$k]}" -v c="${c%%:*}" -v m="$m" -v o="$off" -v n="$on" -v r="$ratio" -v e="$each" \
                'BEGIN { printf "%-20s %-5s %-6s %12.2f %12.2f %+7.1f%%  %s\n", b, c, m, o, n, 100 * r, e }'
        done
    done
done
