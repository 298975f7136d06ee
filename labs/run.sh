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
# The boundary between the student's code and the verdict: labs/README.md,
# "The boundary".
#
# The whole script is one { ... } block, read and parsed to its end before
# any of it runs: a change to this file while it runs (from a student's code)
# changes nothing in this run, and the check after the judge undoes it.
{
cd "$(dirname "$0")/.." || exit 2
umask 022  # what the lab writes, the worker (another user) can read and not write
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
    # (at least 60 s: a short LAB_TIMEOUT, for an endless loop, is no compiler's limit on a busy machine)
    compile=$(( limit > 60 ? limit : 60 ))
    timeout -k 5 "$compile" $CXX $flags -x c++ -c "$file" -o "$dir/student.o" </dev/null 2>"$dir/errors"
    status=$?
    if [ $status -eq 124 ] || [ $status -eq 137 ]; then
        fail compiles "fix $file: it did not compile within $compile s (does it #include a device or a FIFO?)"
        summary
    elif [ $status -ne 0 ]; then
        grep -m1 -A2 'error' "$dir/errors"
        fail compiles "fix $file: it does not compile (the compiler's first error is above)"
        summary
    fi
    for f in $needs; do
        nm -C "$dir/student.o" | grep -q " T ${f}" || { fail defines "$file does not define ${f%(}(), the lab's function"; summary; }
    done
    # The judge's reference (labs/check.h) and the project's own functions (lime.cu) are not the
    # student's to call: the file includes no header of this repository but labs/lab.h (and what that
    # includes), and calls no function that lime.cu or the tests' objects define.
    timeout -k 5 "$compile" $CXX $flags -x c++ -E -H "$file" -o /dev/null </dev/null 2>"$dir/includes"
    here=$(pwd -P)/ top=""
    while IFS= read -r line; do
        [[ $line =~ ^(\.+)\ (.*)$ ]] || continue
        header=$(realpath -m -- "${BASH_REMATCH[2]}")
        [ ${#BASH_REMATCH[1]} -eq 1 ] && top=$header  # what the file itself includes
        [[ $header == "$here"* ]] || continue
        [ "$top" = "${here}labs/lab.h" ] && continue
        fail includes "$file includes ${header#"$here"}: a lab file may include labs/lab.h and the standard headers only (labs/check.h is the judge's, its reference the answer): remove it"
        summary
    done <"$dir/includes"
    nm -g --defined-only $LAB_OBJ 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u >"$dir/project_symbols"
    called=$(nm -u "$dir/student.o" | awk '{ print $2 }' | sort -u | comm -12 - "$dir/project_symbols" | head -1)
    if [ -n "$called" ]; then
        fail own_code "$file calls $(c++filt "$called"), which lime.cu or the tests define (the project's own code): write the lab's function without it"
        summary
    fi
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
# The worker's user. As root (CI, a grader's account made for it) the worker
# runs as nobody (65534), which can neither write the lab's files nor signal
# the judge or its parents; else it runs as the user who runs the lab.
if [ -n "$worker" ] && [ "$(id -u)" = 0 ]; then
    if ! command -v setpriv >/dev/null; then
        echo "lab$n: the worker runs as root, unconfined: setpriv (util-linux) is missing"
    elif ! setpriv --reuid=65534 --regid=65534 --clear-groups -- test -x "$worker" -a -r tests/golden -a -x tests/golden; then
        echo "lab$n: the worker runs as root, unconfined: the user nobody (65534) cannot run $worker or read tests/golden; fix: chmod o+rx on the checkout's folders"
    else
        settings+=(LIME_LAB_WORKER_UID=65534)
    fi
elif [ -n "$worker" ]; then
    echo "lab$n: the worker runs as you, unconfined (labs/README.md, \"The boundary\": grade others' files as root)"
fi
# The lab's own files (its scripts, its sources, this lab's judge and what
# it is linked from, the reference vectors): the student's code must not change
# them; they are checked again after the judge.
lab_files() {
    { find labs support tests/golden -maxdepth 2 -type f ! -path 'labs/lab*/mine.*'
      find "$built" -maxdepth 1 -type f
      printf '%s\n' lime.cu Makefile $LAB_OBJ; } 2>/dev/null | sort -u | xargs -d '\n' sha256sum 2>/dev/null
}
before=$(lab_files) script=$(cat labs/run.sh)
env "${settings[@]}" "$judge" >"$verdicts" 2>"$printed" </dev/null &
judge_pid=$!
# The time limit is the judge's; a judge that is stopped (SIGSTOP, from the
# worker it started when that runs as the same user) keeps none: it is
# killed, with its worker (which dies with it), and the lab fails.
stopped=""
while :; do
    stat="" && read -r stat 2>/dev/null <"/proc/$judge_pid/stat"
    state=${stat##*) } && state=${state:0:1}  # after the name, in parentheses, which may hold anything
    case $state in
        T) stopped=$state; kill -KILL "$judge_pid"; break ;;
        Z|X|"") break ;;
    esac
    sleep 0.1
done
wait "$judge_pid" 2>/dev/null  # (a killed judge: no "Killed" line from bash)
status=$?
after=$(lab_files)
if [ "$after" != "$before" ]; then
    changed=$(diff <(echo "$before") <(echo "$after") | sed -n 's/^[<>] [0-9a-f]*  //p' | sort -u)
    undone=""
    if [ "$script" != "$(cat labs/run.sh 2>/dev/null)" ]; then
        printf '%s\n' "$script" >labs/run.sh && undone+="labs/run.sh is put back; "
    fi
    if grep -q '^build/' <<<"$changed"; then  # the next make labN builds them again
        grep '^build/' <<<"$changed" | xargs -d '\n' rm -f -- && undone+="the build files are removed, for make to build again; "
    fi
    fail checker "your code changed the lab's own files while it ran, so there is no verdict: $(tr '\n' ' ' <<<"$changed")(${undone}restore any other with git checkout)"
    summary
fi
if [ -n "$stopped" ]; then
    fail checker "the judge was stopped (a SIGSTOP from your code?) and was ended: a lab's code must not signal other processes"
    summary
fi
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
exit 2  # (summary exits; never reached)
}
