# tests/lib.sh — what the shell suites share, sourced after they cd to the
# repository root: the program under test, a scratch directory removed on
# exit, and the PASS/FAIL counters with the summary line tests/run.sh reads.
LIME=${LIME:-./lime}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0; failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
# A test of several conditions that names the one that failed:
#   check NAME                    begins the test NAME
#   expect WHAT COMMAND [ARG...]  COMMAND must succeed; it runs only while every
#                                 condition before it held (its ARGs are expanded anyway)
#   verdict [DETAIL]              PASS NAME, or FAIL NAME: the first WHAT that failed; DETAIL
# with two helpers for conditions: `has TEXT [GREP OPTION...] PATTERN` (TEXT has a
# line that matches) and `not COMMAND...` (COMMAND fails).
check() { check_name=$1; check_failed=""; }
expect() {
    local what=$1; shift
    [ -z "$check_failed" ] || return 0
    "$@" || check_failed=$what
}
verdict() {
    if [ -z "$check_failed" ]; then pass "$check_name"; else fail "$check_name" "$check_failed${1:+; $1}"; fi
}
has() { local text=$1; shift; grep -q "$@" <<<"$text"; }
not() { ! "$@"; }
# The last line of every suite; its exit status is the suite's.
summary() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
