#!/usr/bin/env bash
# tests/run_asan.sh — `make test-asan`: the CPU tests and the command-line
# suites, on binaries built with AddressSanitizer and UndefinedBehaviorSanitizer
# (build/test_cpu_asan, build/lime-asan). Sanitizer reports go to files, so a
# report in a command whose output a test discards is still seen: any report
# fails the run, whatever the suites say.
cd "$(dirname "$0")/.." || exit 2
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# allocator_may_return_null: a too-large calloc returns NULL, as without ASan,
# so the "out of memory" refusals (tests/test_flags.sh) are tested too.
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:allocator_may_return_null=1:exitcode=99"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
export LIME=build/lime-asan
# Two groups side by side, about equal in time (test_cli alone takes about as
# long as the other four): the suites share nothing but the sanitizer log folder.
run_group() {  # run_group LOG SUITE...: each suite's FAIL/SKIP lines and summary into LOG, then "status N"
    local log=$1 failed=0; shift
    for suite in "$@"; do
        local start out status
        start=$(date +%s)
        out=$($suite 2>&1); status=$?
        echo "$out" | grep -E '^(FAIL|SKIP)' >> "$log"
        echo "-- $suite: $(echo "$out" | tail -1) ($(( $(date +%s) - start )) s)" >> "$log"
        [ $status -eq 0 ] || failed=$((failed + 1))
    done
    echo "status $failed" >> "$log"
}
run_group "$logs/group1" "bash tests/test_cli.sh" &
run_group "$logs/group2" build/test_cpu_asan "bash tests/test_flags.sh" "bash tests/test_faults.sh" "bash tests/test_hostile.sh"
wait
failed=0
for g in "$logs/group1" "$logs/group2"; do
    grep -v '^status ' "$g"
    failed=$((failed + $(sed -n 's/^status //p' "$g")))
done
# (a too-large allocation leaves a one-line WARNING file: not a report)
reports=$(grep -l -E 'ERROR|runtime error|SUMMARY' "$logs"/asan* "$logs"/ubsan* 2>/dev/null)
if [ -n "$reports" ]; then
    echo "FAIL sanitizer reports:"
    for f in $reports; do echo "== $f"; head -40 "$f"; done
    failed=$((failed + 1))
else
    echo "PASS no sanitizer reports (ASan, UBSan, LeakSanitizer)"
fi
[ $failed -eq 0 ] && echo "test-asan: 0 failed" || echo "test-asan: $failed failed"
[ $failed -eq 0 ]
