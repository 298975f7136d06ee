#!/usr/bin/env bash
# tests/run_fuzz.sh SECONDS TARGET... — runs each libFuzzer target (built by
# `make fuzz`) for SECONDS from its seed corpus tests/fuzz_corpus/NAME/
# (read only: new inputs go to a scratch directory, not into the repository).
# A crash, a hang (-timeout), a leak or a sanitizer report fails the target;
# its input is kept in build/fuzz-artifacts/ with the command to replay it.
# Prints one summary line per target (runs, execs/s, coverage) and exits
# non-zero if any target failed.
cd "$(dirname "$0")/.." || exit 2
seconds=${1:-60}; shift
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p build/fuzz-artifacts
status=0
for bin in "$@"; do
    name=${bin##*/fuzz_}
    mkdir -p "$scratch/$name"
    log=build/fuzz-artifacts/$name.log
    TMPDIR=$scratch "$bin" "$scratch/$name" "tests/fuzz_corpus/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=8192 -print_final_stats=1 -artifact_prefix=build/fuzz-artifacts/"$name"- >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
    if [ $rc -eq 0 ]; then
        echo "PASS fuzz_$name: ${runs:-?} runs in ${seconds} s, ${speed:-?} execs/s, $cov, corpus $(ls "$scratch/$name" | wc -l) new inputs"
    else
        status=1
        echo "FAIL fuzz_$name: exit $rc after ${runs:-?} runs; $(grep -m1 -E 'ERROR|runtime error|broken promise|Test unit written' "$log")"
        echo "     log: $log; replay: $bin build/fuzz-artifacts/$name-<file>"
    fi
done
exit $status
