#!/usr/bin/env bash
# tests/test_group.sh — ./lime train-group, compare's way of training several
# runs on one GPU in one process (compare --device gpu --jobs N), on the
# CUDA-on-CPU harness (./lime-emu): the same bits as the runs one at a time,
# a fault in one run ends that run alone, and a run that cannot start starts
# none. Tiny models, a few steps: the harness runs kernels ~1000x slower.
cd "$(dirname "$0")/.." || exit 2
LIME=${LIME:-./lime-emu}
source tests/lib.sh
if [ ! -x "$LIME" ]; then
    fail testing_build "$LIME is not built (make emu): the group runs on its emulated GPU"
    summary; exit
fi
export LIME_EMU_QUIET=1

TINY="--device gpu --layers 2 --dim 16 --heads 2 --ffn 32 --ops 1 --train-size 200 --test-size 4 --batch 4 --eval-every 1000"
THREE="$TINY --steps 3"

# A model file's tensors: the bytes after its header (the header records --out, which differs).
tensors() {
    local n
    n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
    tail -c +$((9 + n)) "$1"
}
same_tensors() { cmp -s <(tensors "$1") <(tensors "$2"); }
quietly() { "$@" >/dev/null 2>&1; }

# Three architectures in one group, each against the same run alone.
check group_same_bits_as_runs_alone
mkdir -p "$tmp/g/lime" "$tmp/g/llama" "$tmp/g/hc"
(exec 5>"$tmp/g/lime/train.out" 6>"$tmp/g/llama/train.out" 7>"$tmp/g/hc/train.out"
 $LIME train-group --run 5 $THREE --arch lime --out "$tmp/g/lime" --run 6 $THREE --arch llama --seed 2 \
     --out "$tmp/g/llama" --run 7 $THREE --arch hc --out "$tmp/g/hc")
status=$?
expect "train-group exits 0 (it exited $status)" test $status -eq 0
for a in lime llama hc; do
    seed=1; [ $a = llama ] && seed=2
    expect "$a alone trains" quietly $LIME train $THREE --arch $a --seed $seed --out "$tmp/alone/$a"
    expect "$a's model: the same tensors in the group as alone" same_tensors "$tmp/g/$a/model.safetensors" \
        "$tmp/alone/$a/model.safetensors"
    expect "$a's train.out ends with its done line" has "$(tail -1 "$tmp/g/$a/train.out")" "^done: $a"
done
verdict

# compare --device gpu --jobs 3: four runs as a group of three and one of
# one, each run's files as from ./lime train; the same models as --jobs 1.
check compare_jobs_3_same_models_as_jobs_1
for j in 1 3; do
    expect "compare --jobs $j finishes" quietly $LIME compare --preset tiny --device gpu --jobs $j --archs llama,lime \
        --train-args "--steps 2 --test-size 2" --out "$tmp/c$j"
done
expect "compare --jobs 3 wrote its report" test -s "$tmp/c3/report.md"
expect "its cost table says a grouped run's time is its group's" grep -q "is the pace of its group" "$tmp/c3/report.md"
expect "--jobs 1's says nothing of groups" not grep -q "is the pace of its group" "$tmp/c1/report.md"
for m in "$tmp"/c1/tier2/*/model.safetensors; do
    run=$(basename "$(dirname "$m")")
    expect "$run: the same tensors with --jobs 3 as with --jobs 1" same_tensors "$m" "$tmp/c3/tier2/$run/model.safetensors"
    expect "$run: analysed" test -s "$tmp/c3/tier2/$run/entropy.tsv"
done
verdict

# A NaN at step 2 (the testing build's hook, in every run): the 3-step run
# stops with its message; the 1-step run has ended before; the run that
# skips bad steps goes on. Each as ./lime train would: the others unharmed.
check group_fault_ends_one_run
mkdir -p "$tmp/f/nan" "$tmp/f/short" "$tmp/f/skip"
(exec 5>"$tmp/f/nan/train.out" 6>"$tmp/f/short/train.out" 7>"$tmp/f/skip/train.out"
 LIME_TEST_NAN_STEP=2 $LIME train-group --run 5 $THREE --out "$tmp/f/nan" --run 6 $TINY --steps 1 \
     --out "$tmp/f/short" --run 7 $THREE --skip-bad-steps --out "$tmp/f/skip")
status=$?
expect "train-group exits 1, the failed run's status (it exited $status)" test $status -eq 1
expect "the NaN run says so" has "$(cat "$tmp/f/nan/train.out")" "step 2: the loss is NaN"
expect "the NaN run wrote no model" not test -e "$tmp/f/nan/model.safetensors"
expect "the 1-step run finished" test -e "$tmp/f/short/model.safetensors"
expect "the skipping run skipped step 2" has "$(cat "$tmp/f/skip/train.out")" "step 2/3 skipped"
expect "the skipping run finished" test -e "$tmp/f/skip/model.safetensors"
verdict

# Ctrl-C: every running run of the group finishes its step, saves its
# checkpoint and says how to resume; the group exits 130.
check group_sigint_saves_every_run
mkdir -p "$tmp/s/a" "$tmp/s/b"
LONG="$TINY --steps 1000000 --log-every 1 --save-every 1000000"
(exec 5>"$tmp/s/a/train.out" 6>"$tmp/s/b/train.out"
 exec $LIME train-group --run 5 $LONG --out "$tmp/s/a" --run 6 $LONG --arch llama --out "$tmp/s/b") &
pid=$!
for _ in $(seq 300); do grep -q '"step":2' "$tmp/s/b/log.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -INT $pid; wait $pid; status=$?
expect "train-group exits 130 (it exited $status)" test $status -eq 130
for r in a b; do
    expect "run $r saved a checkpoint" test -s "$tmp/s/$r/checkpoint.safetensors"
    expect "run $r says how to resume" has "$(cat "$tmp/s/$r/train.out")" "continue with ./lime train --resume"
done
verdict "$(tail -n 1 "$tmp/s/b/train.out")"

# A run that cannot start (an unknown flag; a directory another process
# holds) is named in its own train.out, and none of the group starts.
check group_bad_run_starts_none
mkdir -p "$tmp/b/ok" "$tmp/b/bad"
(exec 5>"$tmp/b/ok/train.out" 6>"$tmp/b/bad/train.out"
 $LIME train-group --run 5 $THREE --out "$tmp/b/ok" --run 6 $THREE --no-such-flag 1 --out "$tmp/b/bad")
status=$?
expect "train-group exits 2 (it exited $status)" test $status -eq 2
expect "the bad run names its flag" has "$(cat "$tmp/b/bad/train.out")" "no-such-flag"
expect "the good run says it was not started, and why" has "$(cat "$tmp/b/ok/train.out")" "not started: another run"
expect "the good run wrote nothing" not test -e "$tmp/b/ok/log.jsonl"
verdict

check group_locked_directory_starts_none
mkdir -p "$tmp/l/ok" "$tmp/l/held"
(exec 8>"$tmp/l/held/train.lock"; flock 8
 exec 5>"$tmp/l/ok/train.out" 6>"$tmp/l/held/train.out"
 $LIME train-group --run 5 $THREE --out "$tmp/l/ok" --run 6 $THREE --out "$tmp/l/held")
status=$?
expect "train-group exits 2 (it exited $status)" test $status -eq 2
expect "the held run says its directory is in use" has "$(cat "$tmp/l/held/train.out")" "in use by another"
expect "the other run wrote nothing" not test -e "$tmp/l/ok/log.jsonl"
verdict

# --help among a run's flags is refused as any flag a run cannot take: exit 2, none started
check group_help_in_a_run_starts_none
mkdir -p "$tmp/h/a" "$tmp/h/b"
(exec 5>"$tmp/h/a/train.out" 6>"$tmp/h/b/train.out"
 $LIME train-group --run 5 $THREE --out "$tmp/h/a" --run 6 $THREE --out "$tmp/h/b" --help)
status=$?
expect "train-group exits 2 (it exited $status)" test $status -eq 2
expect "the run with --help says it is not a run's flag" has "$(cat "$tmp/h/b/train.out")" \
    "error: --help is not a flag a run of train-group takes"
expect "the other run says it was not started" has "$(cat "$tmp/h/a/train.out")" "not started: another run"
expect "no run wrote a log" not test -e "$tmp/h/a/log.jsonl"
verdict "$(tail -1 "$tmp/h/b/train.out")"

# Two runs given one --out: refused as such, naming both runs (not "another ./lime train", the group itself)
check group_one_out_for_two_runs_names_them
mkdir -p "$tmp/o/a"
(exec 5>"$tmp/o/a/train.out" 6>"$tmp/o/train2.out"
 $LIME train-group --run 5 $THREE --out "$tmp/o/a" --run 6 $THREE --out "$tmp/o/a/")
status=$?
expect "train-group exits 2 (it exited $status)" test $status -eq 2
expect "the second run does not name both runs" has "$(cat "$tmp/o/train2.out")" \
    "is given to two runs of this group (runs 1 and 2); give each its own --out"
expect "no run wrote a log" not test -e "$tmp/o/a/log.jsonl"
verdict "$(tail -1 "$tmp/o/train2.out")"

# More runs than the (emulated, 24 GB) GPU holds at once: refused with the
# number that fits, before any model is made; with --fit they would take turns.
check group_beyond_memory_says_how_many_fit
BIG="--device gpu --layers 24 --dim 2048 --heads 16 --ffn 2048 --ops 1 --train-size 200 --test-size 4 --batch 4 --steps 1"
mkdir -p "$tmp/m/a" "$tmp/m/b" "$tmp/m/c"
(exec 5>"$tmp/m/a/train.out" 6>"$tmp/m/b/train.out" 7>"$tmp/m/c/train.out"
 $LIME train-group --run 5 $BIG --out "$tmp/m/a" --run 6 $BIG --out "$tmp/m/b" --run 7 $BIG --out "$tmp/m/c")
status=$?
expect "train-group exits 2 (it exited $status)" test $status -eq 2
expect "each run says how many fit" has "$(cat "$tmp/m/c/train.out")" "fit at once; use --jobs [12]"
expect "no run wrote a log" not test -e "$tmp/m/a/log.jsonl"
verdict "$(tail -1 "$tmp/m/c/train.out")"

# The same from compare: one line with the number that fits, exit status 2.
check compare_jobs_beyond_memory_one_line
out=$($LIME compare --preset tiny --device gpu --jobs 3 --archs llama --seeds 3 \
    --train-args "--layers 24 --dim 2048 --heads 16 --ffn 2048 --batch 4" --out "$tmp/cm" 2>&1)
status=$?
expect "compare exits 2 (it exited $status)" test $status -eq 2
expect "its last line says how many fit" has "$(tail -1 <<<"$out")" "^lime compare: error: --jobs 3: the 3 runs need .* GB together, .* GB is free: 2 fit at once; use --jobs 2$"
verdict "$(tail -1 <<<"$out")"

# --- GPU memory, counted and worded (issue 61, classes 6, 12, 13, 14). A text model whose
# activations outgrow the emulated GPU's memory, refused before anything is allocated.
head -c 200000 /dev/urandom | base64 >"$tmp/big.txt"
HUGE="--device gpu --task text --text-file $tmp/big.txt --layers 8 --dim 1024 --heads 8 --ffn 4096 --seq-len 1024 --batch 32 --steps 1 --threads 1"
check gpu_memory_same_figure_alone_and_in_a_group
alone=$($LIME train $HUGE --out "$tmp/h1" 2>&1 | tail -1)
mkdir -p "$tmp/h2"
(exec 5>"$tmp/h2/train.out"; $LIME train-group --run 5 $HUGE --out "$tmp/h2" >/dev/null 2>&1)
grouped=$(tail -1 "$tmp/h2/train.out")
a=$(sed -n 's/.*needs \([0-9.]*\) GB.*/\1/p' <<<"$alone"); g=$(sed -n 's/.*needs* \([0-9.]*\) GB.*/\1/p' <<<"$grouped")
expect "no figure alone: $alone" test -n "$a"
expect "the group counts $g GB, the run alone $a GB" test "$a" = "$g"
verdict "$alone | $grouped"

check gpu_memory_none_fits_gives_the_runs_own_fix
expect "the group's run does not say what to lower" has "$grouped" "lower --seq-len"
expect "the group's run names a --jobs" not has "$grouped" "jobs"
out=$($LIME compare --preset tiny --device gpu --archs llama --seeds 2 --task text \
    --train-args "--text-file $tmp/big.txt --layers 8 --dim 1024 --heads 8 --ffn 4096 --seq-len 1024 --batch 32 --steps 1" \
    --out "$tmp/hc" 2>&1)
status=$?
expect "compare exits 2 (it exited $status)" test $status -eq 2
expect "compare names a --jobs never given" not has "$(tail -1 <<<"$out")" "jobs"
expect "compare does not say what to lower" has "$(tail -1 <<<"$out")" "lower --seq-len"
verdict "$(tail -1 <<<"$out")"

check gpu_allocation_failure_says_what_failed
out=$( (ulimit -v 3000000; $LIME train --device gpu --task text --text-file "$tmp/big.txt" --seq-len 1000 --dim 64 \
    --heads 16 --layers 2 --batch 32 --steps 1 --threads 1 --out "$tmp/au" 2>&1) | tail -1)
expect "it does not say the allocation failed" has "$out" "cudaMalloc of .* GB failed"
expect "it advises shrinking a model that fits" not has "$out" "lower --"
verdict "$out"

check gpu_matmul_refusal_names_flash
out=$($LIME train --device gpu --task text --text-file "$tmp/big.txt" --seq-len 4096 --batch 64 --layers 2 --dim 64 \
    --heads 16 --steps 1 --attention matmul --out "$tmp/mm" 2>&1 | tail -1)
expect "it does not name --attention flash" has "$out" "use --attention flash"
expect "it wrote a log" not test -e "$tmp/mm/log.jsonl"
verdict "$out"

summary
