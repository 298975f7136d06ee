#!/usr/bin/env bash
# labs/run.sh N [FILE] — lab N's checks (`make labN [FILE=...]` runs it).
# Builds the lab: compiles FILE, the student's (default labs/labN/mine.cpp,
# copied from the starter the first time), and links it with lime.cu compiled
# once in lab mode (Makefile: LAB_FLAGS), where it replaces the project's
# function; FILE=project links none, so lime.cu's own functions are checked
# (what tests/test_labs.sh does). Then runs the lab's checks: one PASS or FAIL
# line each, a FAIL with a hint; the last line is "labN: P passed, F failed".
# Lab 5 (an experiment) has no code: FILE is the answers file.
cd "$(dirname "$0")/.." || exit 2
n=$1 file=$2
: "${CXX:=g++}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # the checks' shapes are tiny: threads would only wait
passed=0 failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
summary() { echo "lab$n: $passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

if [[ ! "$n" =~ ^[0-9]+$ ]] || [ ! -f "labs/lab$n/README.md" ]; then
    echo "make lab$n: there is no such lab; the labs (labs/README.md):"
    for d in labs/lab[0-9]*/; do echo "  make ${d:5:-1}  $(head -1 "$d/README.md" | sed 's/^# *//')"; done
    exit 2
fi
# What each lab's file must define (else the project's own function would be checked).
case $n in
    1) needs="router_forward(" ;;
    2) needs="router_backward(" ;;
    3) needs="router_forward_gpu( lab_router_kernel(" ;;
    4) needs="adamw_numbers( adamw( clip_scale(" ;;
    *) needs="" ;;
esac
starter=$(ls labs/lab$n/starter.* 2>/dev/null | head -1)
if [ -z "$file" ]; then
    file=labs/lab$n/mine.${starter##*.}
    if [ ! -e "$file" ]; then
        cp "$starter" "$file" && echo "lab$n: copied $starter to $file: write your answer there, then make lab$n again"
    fi
fi
[ "$file" = project ] && echo "lab$n: checking the project's own functions" || echo "lab$n: checking $file"
if [ "$file" != project ] && [ ! -r "$file" ]; then
    fail file_exists "$file cannot be read; fix: make lab$n FILE=path/to/your/file"
    summary
fi

if [ "$n" = 5 ]; then  # the experiment: the answers against the student's own run
    out=$(bash labs/lab5/check.sh "$file" "${RUN:-runs/lab5}" 2>&1)
    echo "$out"
    passed=$(grep -c '^PASS ' <<<"$out") failed=$(grep -c '^FAIL ' <<<"$out")
    summary
fi

: "${LAB_FLAGS:?labs/run.sh: run it through make: make lab$n}"
# Only lab 3 (a kernel) needs the harness's header (as in the Makefile's LAB_CHECKS).
flags=$LAB_FLAGS
[ "$n" = 3 ] || flags="$LAB_FLAGS -ULIME_EMU"
dir=build/lab/lab$n/$(tr -c 'A-Za-z0-9\n' _ <<<"$file")
mkdir -p "$dir"
objs=()
if [ "$file" != project ]; then
    if ! $CXX $flags -x c++ -c "$file" -o "$dir/student.o" 2>"$dir/errors"; then
        grep -m1 -A2 'error' "$dir/errors"
        fail compiles "fix $file: it does not compile (the compiler's first error is above)"
        summary
    fi
    for f in $needs; do
        nm -C "$dir/student.o" | grep -q " T ${f}" || { fail defines "$file does not define ${f%(}(), the lab's function"; summary; }
    done
    objs=("$dir/student.o")
fi
for prog in check lime; do
    main=build/lab/lab$n/check.o
    [ $prog = lime ] && main=$LAB_MAIN
    if ! $CXX $LAB_FLAGS "$main" "${objs[@]}" $LAB_OBJ -o "$dir/$prog" 2>"$dir/errors"; then
        grep -m1 'error\|multiple definition\|undefined' "$dir/errors"
        fail links "fix $file: it does not link with lime.cu (the linker's first error is above)"
        summary
    fi
done

# A function of the lab's name but another signature is an overload: lime.cu's own (weak) one
# would still be the one linked in.
if [ "$file" != project ]; then
    for f in $needs; do
        nm -C "$dir/check" | grep -q " [Ww] ${f}" || continue
        fail signature "${f%(}() in $file has another signature than the starter's (labs/lab.h): copy its first lines"
        summary
    done
fi

# Why a process ended, from its exit status: a signal by name, the time limit, or the status.
ended() {
    if [ "$1" -eq 124 ]; then echo "it did not finish within ${LAB_TIMEOUT:-60} s and was stopped (an endless loop?)"
    elif [ "$1" -gt 128 ]; then echo "it was killed by signal $(( $1 - 128 )) (SIG$(kill -l $(( $1 - 128 )) 2>/dev/null))"
    else echo "exit status $1"; fi
}
# The checker runs each check's code in a child and alone prints the verdicts
# (labs/check.h): only its stdout is read for them, and its exit status must
# agree. What your code printed (sent to stderr) is shown apart, a few lines.
checks() {
    local out status printed=$dir/printed
    out=$("$@" 2>"$printed")
    status=$?
    if [ -s "$printed" ]; then
        echo "lab$n: your code printed (first lines):"
        head -5 "$printed" | cut -c1-200 | sed 's/^/  | /'
    fi
    grep -E '^(PASS|FAIL) ' <<<"$out"
    passed=$((passed + $(grep -c '^PASS ' <<<"$out"))) failed=$((failed + $(grep -c '^FAIL ' <<<"$out")))
    if [ "$status" -ne 0 ] && ! grep -q '^FAIL ' <<<"$out"; then
        fail checker "the checker itself ended badly: $(ended "$status")"
    fi
}
# The whole model, your function in it, against the reference vectors (docs/checkpoint.md):
# passed only when ./lime verify exits 0 and its own last line says no check failed.
verify() {
    local out status
    out=$(timeout -k 5 "$((${LAB_TIMEOUT:-60} * 4))" "$dir/lime" verify --quiet "$@" 2>&1)
    status=$?
    if [ "$status" -eq 0 ] && tail -1 <<<"$out" | grep -qE '^verify: [1-9][0-9]* checks, 0 failed$'; then
        pass reference_vectors
    elif [ "$status" -ne 0 ] && [ "$status" -ne 1 ]; then
        fail reference_vectors "./lime verify with your function: $(ended "$status")"
    else
        local why; why=$(grep -m1 -i 'fail\|error' <<<"$out")
        fail reference_vectors "./lime verify with your function: ${why:-it ended without its summary line (an exit() in your code?)}"
    fi
}
if [ "$n" = 3 ]; then
    checks env LIME_EMU_QUIET=1 "$dir/check"  # every thread and block order of the harness
    verify --device gpu --tf32 0 tests/golden/lime_gqa.safetensors
else
    checks "$dir/check"
    verify tests/golden/*.safetensors
fi
summary
