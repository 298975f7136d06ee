#!/usr/bin/env bash
# tests/run.sh — runs every test suite of `make test` and adds up their
# results. Each suite prints PASS/FAIL/SKIP lines and its own count line;
# this script prints the total as its last line, "N passed, N failed, N skipped",
# and exits non-zero if anything failed.
cd "$(dirname "$0")/.." || exit 2
suites=(
    "bash tests/test_isa.sh"     # AVX2 and AVX-512 builds train the same bytes (first: its build is the longest wait)
    "build/test_cpu"             # the model, data and safetensors on the CPU
    "build/test_emu"             # the CUDA-on-CPU harness itself
    "build/test_gpu_emu"         # every GPU test, kernels running on the harness
    "bash tests/test_cli.sh"     # ./lime end to end: verify, bad input, resume
    "bash tests/test_flags.sh"   # every command's bad flags: exit 2, one line, nothing written
    "bash tests/test_faults.sh"  # kills mid-save, Ctrl-C, NaN guards, corrupt checkpoints
    "bash tests/test_group.sh"   # several runs in one process on the (emulated) GPU: the same bits, faults apart
    "bash tests/test_signals.sh" # SIGINT, SIGTERM, SIGPIPE at every phase of a run: a stop or the true end, then resume
    "bash tests/test_hostile.sh" # lying reference files and checkpoints, JSON parsed back, escaped messages
    "bash tests/test_docs.sh"    # README.md and docs/ name only what exists; nothing points outside
    "bash tests/test_layers.sh"  # support/ in layers: each file includes only what its layer may
    "bash tests/test_labs.sh"    # the labs: starters fail, the project passes, planted mistakes get their hint
)
# The suites share nothing but the built binaries, so JOBS of them (2 by
# default: this machine's cores) run at once, each into its own file; the
# results are printed in the order above.
jobs=${JOBS:-2}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "tests/run.sh: JOBS=$jobs is not a number of suites to run at once; use JOBS=1 or more"; exit 2; }
out_dir=$(mktemp -d)
set -m  # each suite in its own process group, so that an interrupted run stops the suites it started
trap 'for p in $(jobs -p); do kill -- -"$p" 2>/dev/null; done; rm -rf "$out_dir"' EXIT
trap 'exit 130' INT TERM
run_suite() {  # run_suite I: suite I's output into $out_dir/I.out, its status and seconds into I.status
    local suite=${suites[$1]} start=$SECONDS status
    $suite >"$out_dir/$1.out" 2>&1
    status=$?
    echo "$status $((SECONDS - start))" >"$out_dir/$1.status"
}
for i in "${!suites[@]}"; do
    bin=${suites[$i]#bash }
    [ -e "${bin%% *}" ] || continue
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_suite "$i" &
done
wait
passed=0; failed=0; skipped=0
for i in "${!suites[@]}"; do
    suite=${suites[$i]}
    bin=${suite#bash }
    if [ ! -e "${bin%% *}" ]; then
        echo "SKIP $suite: not built"
        skipped=$((skipped + 1))
        continue
    fi
    echo "== $suite"
    read -r status seconds <"$out_dir/$i.status" 2>/dev/null || { status=1; seconds=?; }
    out=$(cat "$out_dir/$i.out")
    echo "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed'
    line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
    p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
    f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
    s=$(echo "$line" | sed -n 's/.* \([0-9]*\) skipped.*/\1/p')
    if [ -z "$line" ]; then
        echo "FAIL $suite: ended without a result line (exit $status)"
        failed=$((failed + 1))
    else
        passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0})); skipped=$((skipped + ${s:-0}))
        if [ "$status" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
            echo "FAIL $suite: exit status $status"
            failed=$((failed + 1))
        fi
    fi
    echo "-- $suite: $line ($seconds s)"
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
