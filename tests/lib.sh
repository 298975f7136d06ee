# tests/lib.sh — what the shell suites share, sourced after they cd to the
# repository root: the program under test, a scratch directory removed on
# exit, and the PASS/FAIL counters with the summary line tests/run.sh reads.
LIME=${LIME:-./lime}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0; failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
# The last line of every suite; its exit status is the suite's.
summary() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
