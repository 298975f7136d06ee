#!/usr/bin/env bash
# tests/bench_compare.sh — `./lime bench` of two binaries side by side, at the
# two configs of `make bench`, in alternating rounds whose pairs alternate too
# (old then new, then new then old: a fixed order once made one setting look 9%
# faster, docs/speed.md "Waiting threads"), so that a change in the
# machine's load falls on both; prints the median
# tokens/s of each binary, model (llama, lime, hc), config and thread count,
# new / old, and each binary's hc / llama step time (the ratio of the medians).
# Not part of `make test` (it measures, it checks nothing).
#
#   bash tests/bench_compare.sh OLD_BINARY NEW_BINARY [ROUNDS] [THREADS...]
#   e.g. bash tests/bench_compare.sh /tmp/lime-base ./lime 5 1 2
#   LOAD=2 bash tests/bench_compare.sh ...   the same beside 2 busy processes (`yes`)
old=${1:?usage: bash tests/bench_compare.sh OLD_BINARY NEW_BINARY [ROUNDS] [THREADS...]}
new=${2:?usage: bash tests/bench_compare.sh OLD_BINARY NEW_BINARY [ROUNDS] [THREADS...]}
rounds=${3:-3}
shift 3 2>/dev/null || shift $#
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(1 2)
STEPS=${STEPS:-10}
configs=(
    "d32:--layers 4 --dim 32 --heads 4 --kv-heads 4 --ffn 96 --vocab 21 --batch 128 --seq-len 88"
    "d128:--layers 4 --dim 128 --heads 4 --kv-heads 4 --ffn 352 --vocab 32 --batch 32 --seq-len 64"
)
for b in "$old" "$new"; do [ -x "$b" ] || { echo "bench_compare: $b is not an executable"; exit 2; }; done
pids=()
for ((i = 0; i < ${LOAD:-0}; i++)); do yes > /dev/null & pids+=($!); done
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done' EXIT
tmp=$(mktemp)
echo "load before: $(uptime | sed 's/.*load average/load average/'); ${LOAD:-0} busy processes added; $rounds rounds, $STEPS steps"
for ((r = 1; r <= rounds; r++)); do
    for c in "${configs[@]}"; do
        for t in "${threads[@]}"; do
            pair=("$old" "$new")
            ((r % 2 == 0)) && pair=("$new" "$old")
            for b in "${pair[@]}"; do
                tag=$([ "$b" = "$old" ] && echo old || echo new)
                out=$("$b" bench ${c#*:} --steps "$STEPS" --threads "$t" --json) || { echo "bench_compare: $b failed"; exit 1; }
                for m in llama lime hc; do
                    tps=$(echo "$out" | sed -n "s/.*\"$m\": {[^}]*\"tokens_per_s\": \([0-9.]*\).*/\1/p")
                    echo "${c%%:*} $t $m $tag $tps" >> "$tmp"
                done
            done
        done
    done
done
echo "load after: $(uptime | sed 's/.*load average/load average/')"
printf "%-5s %-7s %-6s %12s %12s %8s\n" config threads model "old tok/s" "new tok/s" new/old
for c in "${configs[@]}"; do
    for t in "${threads[@]}"; do
        for m in llama lime hc; do
            med() { grep "^${c%%:*} $t $m $1 " "$tmp" | awk '{print $5}' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
            o=$(med old); n=$(med new)
            awk -v c="${c%%:*}" -v t="$t" -v m="$m" -v o="$o" -v n="$n" \
                'BEGIN { printf "%-5s %-7s %-6s %12.0f %12.0f %8.2f\n", c, t, m, o, n, (o > 0 ? n / o : 0) }'
            eval "tps_${m}_old=$o tps_${m}_new=$n"
        done
        awk -v c="${c%%:*}" -v t="$t" -v lo="$tps_llama_old" -v ho="$tps_hc_old" -v ln="$tps_llama_new" -v hn="$tps_hc_new" \
            'BEGIN { printf "%-5s %-7s hc / llama step time: old %.3f, new %.3f\n", c, t, (ho > 0 ? lo / ho : 0), (hn > 0 ? ln / hn : 0) }'
    done
done
rm -f "$tmp"
