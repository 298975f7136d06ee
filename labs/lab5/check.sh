#!/usr/bin/env bash
# labs/lab5/check.sh ANSWERS RUN — lab 5's checks (labs/run.sh runs it): each
# answer in ANSWERS against the student's own experiment in RUN (the --out of
# ./lime compare): RUN/report.md's tables, and ./lime analyze of the seed-1
# LIMe model there. A wrong answer gets a FAIL that says where to look, never
# the value. One PASS or FAIL line per answer.
answers=$1 run=$2 LIME=${LIME:-./lime}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
report=$run/report.md
if [ ! -f "$report" ]; then
    fail run_found "no report at $report: run the experiment first (labs/lab5/README.md), or name its directory: make lab5 RUN=dir"
    exit 1
fi
# The answer after "key:" (a comment after # dropped), "" if none.
answer() { sed -n "s/^$1:\([^#]*\).*/\1/p" "$answers" | head -1 | tr -d ' \t\r'; }
# Field f (1-based, between the |s) of model m's first row in the table under "## title".
cell() {
    awk -F'|' -v t="## $1" -v m="$2" -v f="$3" '$0 == t {on = 1; next} /^## / {on = 0}
        on && $3 ~ "^ *" m " *$" {gsub(/^ +| +$/, "", $(f + 1)); print $(f + 1); exit}' "$report"
}
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { exit !(a != "" && a - b <= t && b - a <= t) }'; }
first() { sed 's/[^0-9.].*//' <<<"$1"; }  # "80.7 ± 3.2%" -> 80.7
# Checks one answer: key, whether it is right (a command), where to look.
check() {
    local key=$1 where=$2; shift 2
    local got; got=$(answer "$key")
    if [ -z "$got" ]; then fail "$key" "no answer in $answers (a line \"$key: ...\")"
    elif "$@" "$got"; then pass "$key"
    else fail "$key" "your answer $got does not match your run; look again at $where"; fi
}

acc_llama=$(first "$(cell Accuracy llama 3)") acc_lime=$(first "$(cell Accuracy lime 3)")
loss_llama=$(first "$(cell Accuracy llama 5)") loss_lime=$(first "$(cell Accuracy lime 5)")
par_llama=$(cell Cost llama 3) par_lime=$(cell Cost lime 3)
if [ -z "$acc_llama" ] || [ -z "$acc_lime" ] || [ -z "$par_llama" ] || [ -z "$par_lime" ]; then
    fail report_read "$report has no llama and lime rows in its Accuracy and Cost tables: run ./lime compare with --archs llama,lime"
    exit 1
fi
better=tie
awk -v a="$acc_lime" -v b="$acc_llama" 'BEGIN { exit !(a > b) }' && better=lime
awk -v a="$acc_lime" -v b="$acc_llama" 'BEGIN { exit !(a < b) }' && better=llama
lower=lime
awk -v a="$loss_lime" -v b="$loss_llama" 'BEGIN { exit !(a > b) }' && lower=llama

is_num() { [[ "$3" =~ ^[0-9.]+%?$ ]] && near "${3%\%}" "$1" "$2"; }  # want, tolerance, answer
is_word() { [ "$2" = "$1" ]; }
check llama_mean_accuracy "the Accuracy table of $report" is_num "$acc_llama" 0.051
check lime_mean_accuracy "the Accuracy table of $report" is_num "$acc_lime" 0.051
check better_model "the two means in the Accuracy table (llama, lime or tie)" is_word "$better"
check lower_test_loss "the test loss column of the Accuracy table (llama or lime)" is_word "$lower"
check router_parameters "the parameters column of the Cost table" is_word "$((par_lime - par_llama))"

# The seed-1 LIMe model's router heatmap, as ./lime analyze prints it.
model=$(ls "$run"/tier*/lime-seed1/model.safetensors 2>/dev/null | head -1)
if [ -z "$model" ] || ! "$LIME" analyze --load "$model" --out "$tmp" --device cpu --n 4 >"$tmp/analyze.txt" 2>&1; then
    fail heatmap_read "cannot analyze $run/tier*/lime-seed1/model.safetensors: $(tail -1 "$tmp/analyze.txt" 2>/dev/null)"
    exit 1
fi
last=$(grep -E '^  layer [0-9]+ .*own' "$tmp/analyze.txt" | tail -1)
from=$(sed -n 's/.*most from layer \([0-9]*\).*/\1/p' <<<"$last")
own=$(sed -n 's/.* own *\([0-9]*\)%.*/\1/p' <<<"$last")
check last_layer_leans_on "the last row of the router heatmap (./lime analyze --load $model)" is_word "$from"
check last_layer_own_share "the last row of the router heatmap (./lime analyze --load $model)" is_num "$own" 1.01
