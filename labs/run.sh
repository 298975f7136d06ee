#!/usr/bin/env bash
# labs/run.sh N [FILE] — lab N's checks (`make labN [FILE=...]` runs it).
# Builds the lab's worker: compiles FILE, the student's (default
# labs/labN/mine.cpp, copied from the starter the first time), renames its
# lab functions lab_student_NAME and links it with the lab's checker,
# labs/transcript.cpp recording their calls, and lime.cu compiled once in lab
# mode (Makefile: LAB_FLAGS, LAB_OBJ). Then the judge, built once without any
# student code, runs each check: the worker computes it, the judge replays
# the worker's transcript and alone prints PASS or FAIL (labs/check.h, "Who
# decides"). FILE=project checks lime.cu's own functions (what
# tests/test_labs.sh does) with the project's checker. One PASS or FAIL line
# per check, a FAIL with a hint; the last line is "labN: P passed, F failed".
# Lab 5 (an experiment) has no code: FILE is the answers file.
cd "$(dirname "$0")/.." || exit 2
n=$1 file=$2
: "${CXX:=g++}"
export OMP_NUM_THREADS=1  # the checks' shapes are tiny; and the judge must compute as the worker did
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
# A FIFO or a device would hang the compiler (or the reader) waiting for data: a regular file only.
if [ "$file" != project ] && { [ ! -e "$file" ] || [ ! -r "$file" ]; }; then
    fail file_exists "$file cannot be read; fix: make lab$n FILE=path/to/your/file"
    summary
elif [ "$file" != project ] && [ ! -f "$file" ]; then
    fail file_exists "$file is not a regular file (a FIFO, a device or a directory); fix: make lab$n FILE=path/to/your/file"
    summary
fi

if [ "$n" = 5 ]; then  # the experiment: the answers against the student's own run
    out=$(bash labs/lab5/check.sh "$file" "${RUN:-runs/lab5}" 2>&1 | head -c 1000000)
    echo "$out"
    passed=$(grep -c '^PASS ' <<<"$out") failed=$(grep -c '^FAIL ' <<<"$out")
    summary
fi

: "${LAB_FLAGS:?labs/run.sh: run it through make: make lab$n}"
limit=${LAB_TIMEOUT:-60}
built=build/lab/lab$n
# Only lab 3 (a kernel) needs the harness's header (as the Makefile's lab_emu says).
flags=$LAB_FLAGS
[ "$n" = 3 ] || flags="$LAB_FLAGS -ULIME_EMU"
dir=build/lab/lab$n/$(tr -c 'A-Za-z0-9\n' _ <<<"$file")
mkdir -p "$dir"
if [ "$file" = project ]; then
    judge=$built/checker-project worker=""  # (its names hold a "-": no FILE's directory, made of [A-Za-z0-9_], is one)
else
    # compiled with a time limit and no input: a file that #includes a FIFO or /dev/stdin ends too
    timeout -k 5 "$limit" $CXX $flags -x c++ -c "$file" -o "$dir/student.o" </dev/null 2>"$dir/errors"
    status=$?
    if [ $status -eq 124 ] || [ $status -eq 137 ]; then
        fail compiles "fix $file: it did not compile within $limit s (does it #include a device or a FIFO?)"
        summary
    elif [ $status -ne 0 ]; then
        grep -m1 -A2 'error' "$dir/errors"
        fail compiles "fix $file: it does not compile (the compiler's first error is above)"
        summary
    fi
    for f in $needs; do
        nm -C "$dir/student.o" | grep -q " T ${f}" || { fail defines "$file does not define ${f%(}(), the lab's function"; summary; }
    done
    # Another lab's function would replace the project's in the worker alone: the judge would compute otherwise.
    for f in router_forward\( router_backward\( router_forward_gpu\( adamw_numbers\( adamw\( clip_scale\(; do
        [[ " $needs " == *" $f "* ]] && continue
        nm -C "$dir/student.o" | grep -q " T ${f}" || continue
        fail defines "$file also defines ${f%(}(), another lab's function; lab $n checks $(sed 's/(/()/g' <<<"$needs"): remove it"
        summary
    done
    # The lab's functions, as lime.cu makes them weak (LAB_SWAPPABLE), renamed lab_student_NAME:
    # labs/transcript.cpp calls them. One of the lab's name but another signature is another function.
    renames=()
    for sym in $(nm build/lab/lime.o | awk '$2 == "W" { print $3 }'); do
        name=$(c++filt "$sym")
        for f in $needs; do
            [[ $name == "$f"* ]] || continue
            if ! nm "$dir/student.o" | grep -q " T $sym\$"; then
                fail signature "${f%(}() in $file has another signature than the starter's (labs/lab.h): copy its first lines"
                summary
            fi
            renames+=(--redefine-sym "$sym=lab_student_${f%(}")
        done
    done
    if ! objcopy "${renames[@]}" "$dir/student.o" "$dir/student_lab.o" 2>"$dir/errors" ||
        ! $CXX $LAB_FLAGS "$built/check.o" "$built/record.o" "$dir/student_lab.o" $LAB_OBJ -o "$dir/worker" 2>"$dir/errors"; then
        grep -m1 'error\|multiple definition\|undefined' "$dir/errors"
        fail links "fix $file: it does not link with lime.cu (the linker's first error is above)"
        summary
    fi
    judge=$built/checker-judge worker=$dir/worker
fi

# Why a process ended, from its exit status: a signal by name, or the status.
ended() {
    if [ "$1" -gt 128 ]; then echo "it was killed by signal $(( $1 - 128 )) (SIG$(kill -l $(( $1 - 128 )) 2>/dev/null))"
    else echo "exit status $1"; fi
}
# The judge's verdicts go to a file, read once it has ended: bash waits for
# the judge alone, never for a pipe some process the student's code left
# might hold. What that code printed (the judge's stderr) is shown apart.
verdicts=$dir/verdicts printed=$dir/printed
settings=()
[ -n "$worker" ] && settings+=("LIME_LAB_WORKER=$worker")
[ "$n" = 3 ] && settings+=(LIME_EMU_QUIET=1)  # every thread and block order of the harness, quietly
env "${settings[@]}" "$judge" >"$verdicts" 2>"$printed" </dev/null
status=$?
if [ -s "$printed" ]; then
    echo "lab$n: your code printed (first lines):"
    head -c 100000 "$printed" | head -5 | cut -c1-200 | sed 's/^/  | /'
    grep -a -m1 '^(your code printed' "$printed"
fi
out=$(head -c 1000000 "$verdicts")
grep -a -E '^(PASS|FAIL) ' <<<"$out"
passed=$(grep -a -c '^PASS ' <<<"$out") failed=$(grep -a -c '^FAIL ' <<<"$out")
# The judge's own count, its last line, must be what its lines say.
read -r p f <<<"$(tail -1 <<<"$out" | sed -n 's/^checks: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p')"
if [ "$p" != "$passed" ] || [ "$f" != "$failed" ]; then
    fail checker "the verdict lines ($passed PASS, $failed FAIL) are not the judge's count (${p:-none}, ${f:-none}), $(ended "$status")"
elif [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    fail checker "the checker itself ended badly: $(ended "$status")"
fi
summary
