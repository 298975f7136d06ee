#!/usr/bin/env bash
# tests/test_labs.sh — the classroom labs (labs/) cannot rot. Each of labs 1-4
# is built twice: with its untouched starter every lab must FAIL and say why,
# with the project's own functions (FILE=project) it must PASS. Each planted
# file in tests/labs/labN/ must end as its "// expect:" line says: a mistake
# FAILs with the hint that names it, a correct answer passes (and with a
# "// passes: N" line, exactly N checks pass). Then bad input
# (a file that does not compile, one that defines nothing, a lab that does not
# exist) and lab 5 on a tiny experiment, with answers this suite reads from
# that run's own files. The lab builds run two at a time.
cd "$(dirname "$0")/.." || exit 2
source tests/lib.sh

# name lab file: `make labN FILE=file` into $tmp/name.out, in the background;
# its exit status into $tmp/name.status (124: the lab did not end within 300 s).
runs=()
export LAB_TEST_PIDFILE=$tmp/helpers.pids  # tests/labs/lab1/escaped_helper.cpp's helpers write their pids here
start() {
    while [ "$(jobs -r | wc -l)" -ge 2 ]; do wait -n; done
    local limit; limit=$(sed -n 's|^// timeout: *||p' "$3" 2>/dev/null | head -1)  # a planted endless loop's limit
    (LAB_TIMEOUT=${limit:-60} timeout -k 5 300 make -s --no-print-directory "lab$2" FILE="$3" >"$tmp/$1.out" 2>&1
     echo $? >"$tmp/$1.status") &
    runs+=("$1 $2 $3")
}
make -s --no-print-directory lab-deps >"$tmp/deps.out" 2>&1 || { cat "$tmp/deps.out"; fail lab_deps "the lab build failed"; summary; exit; }
# The lab's own files, which no submission may change (labs/README.md, "The
# boundary"): compared after every lab has run, and restored if one did.
lab_own=(labs/run.sh labs/check.h labs/lab.h labs/transcript.cpp build/lab/lab1/checker-judge build/lab/lab3/checker-judge)
sha256sum "${lab_own[@]}" >"$tmp/own.sha"
cp labs/run.sh "$tmp/run.sh.kept"
[ "$(id -u)" = 0 ] && chmod o+x "$tmp" && touch "$LAB_TEST_PIDFILE" && chmod o+w "$LAB_TEST_PIDFILE"  # the worker runs as nobody
alone=()  # a file marked "// alone" attacks the lab's files: it runs by itself, after the others
for n in 1 2 3 4; do
    start "lab${n}_starter" $n labs/lab$n/starter.cpp
    start "lab${n}_project" $n project
    for f in tests/labs/lab$n/*.cpp; do
        if grep -q '^// alone$' "$f"; then alone+=("$n $f"); continue; fi
        start "lab${n}_$(basename "$f" .cpp)" $n "$f"
    done
done
printf 'void router_forward( {\n' >"$tmp/broken.cpp"
start lab1_does_not_compile 1 "$tmp/broken.cpp"
printf '// nothing yet\n' >"$tmp/empty.cpp"
start lab1_defines_nothing 1 "$tmp/empty.cpp"
sed "s/int l, int N, int R, int hd) {/long l, int N, int R, int hd) {/" tests/labs/lab1/correct.cpp >"$tmp/other.cpp"
start lab1_other_signature 1 "$tmp/other.cpp"
wait
for a in "${alone[@]}"; do
    read -r n f <<<"$a"
    start "lab${n}_$(basename "$f" .cpp)" $n "$f"
    wait
done

# The counts on the last line, "labN: P passed, F failed".
counts() { grep -E "^lab[0-9]+: [0-9]+ passed" "$tmp/$1.out" | tail -1 | sed -n 's/^lab[0-9]*: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p'; }
for run in "${runs[@]}"; do
    read -r name n file <<<"$run"
    read -r p f <<<"$(counts "$name")"
    out=$tmp/$name.out
    if [ "$(cat "$tmp/$name.status")" = 124 ]; then fail "$name" "the lab did not end within 300 s"; continue; fi
    if [ -z "$p" ]; then fail "$name" "no summary line: $(tail -2 "$out" | tr '\n' ' ')"; continue; fi
    case $name in
    *_starter)
        if [ "$f" -gt 0 ] && [ "$p" -eq 0 ] && grep -q '^FAIL .*hint:' "$out"; then pass "$name"
        else fail "$name" "the untouched starter should fail every check with a hint: $(tail -1 "$out")"; fi ;;
    *_project)
        if [ "$f" -eq 0 ] && [ "$p" -gt 0 ]; then pass "$name"
        else fail "$name" "lime.cu's own functions should pass: $(grep -m1 '^FAIL' "$out")"; fi ;;
    lab1_does_not_compile)
        if [ "$f" -eq 1 ] && grep -q 'error' "$out" && grep -q "^FAIL compiles: fix $file: it does not compile" "$out"
        then pass "$name"; else fail "$name" "expected the compiler's first error and the file to fix: $(head -3 "$out")"; fi ;;
    lab1_defines_nothing)
        if [ "$f" -eq 1 ] && grep -q "does not define router_forward()" "$out"; then pass "$name"
        else fail "$name" "expected: does not define router_forward(): $(tail -2 "$out" | head -1)"; fi ;;
    lab1_other_signature)
        if [ "$f" -eq 1 ] && grep -q "^FAIL signature: router_forward() in" "$out"; then pass "$name"
        else fail "$name" "expected: another signature than the starter's: $(tail -2 "$out" | head -1)"; fi ;;
    *)
        expect=$(sed -n 's|^// expect: *||p' "$file" | head -1)
        passes=$(sed -n 's|^// passes: *||p' "$file" | head -1)  # a forged verdict: no PASS may count
        if [ -n "$passes" ] && [ "$p" != "$passes" ]; then fail "$name" "$p checks passed, want $passes"; continue; fi
        found=""  # "A || B": either (the worker runs as nobody under root, as the user otherwise)
        while read -r e; do grep '^FAIL' "$out" | grep -qF "$e" && found=1; done <<<"${expect// || /$'\n'}"
        if [ "$expect" = PASS ]; then
            [ "$f" -eq 0 ] && pass "$name" || fail "$name" "a correct answer should pass: $(grep -m1 '^FAIL' "$out")"
        elif [ "$f" -gt 0 ] && [ -n "$found" ]; then pass "$name"
        else fail "$name" "expected a FAIL whose hint says \"$expect\": $(grep -m1 '^FAIL' "$out")"; fi ;;
    esac
done

# No submission changed the lab's own files (rewrites_lab_files.cpp tried);
# a changed labs/run.sh is put back, so that no later lab is rigged.
if changed=$(sha256sum --quiet -c "$tmp/own.sha" 2>&1); then pass lab_own_files_unchanged
else
    fail lab_own_files_unchanged "a submission changed them: $(echo $changed)"
    cmp -s labs/run.sh "$tmp/run.sh.kept" || cp "$tmp/run.sh.kept" labs/run.sh
fi

# What the student's code prints is kept up to 4 MiB (an endless print stays
# bounded) and the summary line still comes; a helper it leaves is ended.
printed=build/lab/lab1/$(tr -c 'A-Za-z0-9\n' _ <<<tests/labs/lab1/endless_print.cpp)/printed
size=$(stat -c %s "$printed" 2>/dev/null || echo missing)
if [ "$size" = missing ]; then fail lab_print_is_capped "no $printed"
elif [ "$size" -gt $((4 * 1024 * 1024 + 1000)) ]; then fail lab_print_is_capped "$printed holds $size bytes, over 4 MiB"
elif ! grep -q '^(your code printed [0-9]* bytes in all' "$tmp/lab1_endless_print.out"; then
    fail lab_print_is_capped "no line saying how much was printed and dropped: $(tail -3 "$tmp/lab1_endless_print.out" | cut -c1-100)"
else pass lab_print_is_capped; fi
alive=""
for pid in $(cat "$LAB_TEST_PIDFILE" 2>/dev/null); do kill -0 "$pid" 2>/dev/null && alive+=" $pid"; done
if [ ! -s "$LAB_TEST_PIDFILE" ]; then fail lab_leftover_helper_is_ended "escaped_helper.cpp's helpers wrote no pid to $LAB_TEST_PIDFILE"
elif [ -n "$alive" ]; then fail lab_leftover_helper_is_ended "helpers still running after the lab ended:$alive"; kill -9 $alive
else pass lab_leftover_helper_is_ended; fi

# A judge that is stopped (SIGSTOP; here from outside, as a worker running as
# the same user can) keeps no time limit: labs/run.sh ends it, and the lab
# fails within seconds, not never.
descendants() { local k; for k in $(ps -o pid= --ppid "$1"); do echo "$k"; descendants "$k"; done; }
(LAB_TIMEOUT=60 timeout -k 5 120 make -s --no-print-directory lab1 FILE=tests/labs/lab1/endless_loop.cpp \
    >"$tmp/stopped.out" 2>&1; echo $? >"$tmp/stopped.status") &
lab=$! judge=""
for _ in $(seq 600); do
    for k in $(descendants "$lab"); do [ "$(cat "/proc/$k/comm" 2>/dev/null)" = checker-judge ] && judge=$k; done
    [ -n "$judge" ] && break
    sleep 0.1
done
started=$SECONDS
[ -n "$judge" ] && sleep 1 && kill -STOP "$judge"
wait "$lab"
if [ -z "$judge" ]; then fail lab_stopped_judge_is_ended "no judge (checker-judge) ran: $(tail -2 "$tmp/stopped.out")"
elif [ "$(cat "$tmp/stopped.status")" = 124 ]; then kill -KILL "$judge" 2>/dev/null; fail lab_stopped_judge_is_ended "the lab waited for the stopped judge until timeout ended it"
elif ! grep -q '^FAIL checker: the judge was stopped' "$tmp/stopped.out" || ! grep -q '^lab1: 0 passed, 1 failed$' "$tmp/stopped.out"; then
    fail lab_stopped_judge_is_ended "expected the judge's stop named and the summary: $(tail -2 "$tmp/stopped.out" | tr '\n' ' ')"
elif [ $((SECONDS - started)) -gt 20 ]; then fail lab_stopped_judge_is_ended "it took $((SECONDS - started)) s"
else pass lab_stopped_judge_is_ended; fi

# A FILE that is not a regular file (a FIFO would hold the compiler for ever): one line, at once.
mkfifo "$tmp/fifo.cpp"
out=$(timeout 20 make -s --no-print-directory lab1 FILE="$tmp/fifo.cpp" 2>&1); status=$?
if [ $status -eq 124 ]; then fail lab_file_fifo_refused "make lab1 FILE=a FIFO hung"
elif ! grep -q "^FAIL file_exists: $tmp/fifo.cpp is not a regular file" <<<"$out"; then fail lab_file_fifo_refused "$(head -3 <<<"$out")"
elif ! grep -q '^lab1: 0 passed, 1 failed$' <<<"$out"; then fail lab_file_fifo_refused "no summary line: $(tail -2 <<<"$out")"
else pass lab_file_fifo_refused; fi

if out=$(make -s --no-print-directory lab9 2>&1); then fail no_such_lab "make lab9 succeeded"
elif grep -q 'no such lab' <<<"$out" && grep -q 'make lab5' <<<"$out"; then pass no_such_lab
else fail no_such_lab "expected the list of labs: $(head -2 <<<"$out")"; fi

# make labN FILE=... takes the path as a file name, never as shell text.
if out=$(make -s --no-print-directory lab1 FILE="$tmp/none;touch $tmp/pwned" 2>&1) || [ -e "$tmp/pwned" ]; then
    fail lab_file_is_not_a_command "make lab1 FILE='a;b' ran b or passed: $(tail -1 <<<"$out")"
elif grep -q "^FAIL file_exists: $tmp/none;touch $tmp/pwned cannot be read" <<<"$out"; then pass lab_file_is_not_a_command
else fail lab_file_is_not_a_command "expected file_exists to name the whole path: $(head -2 <<<"$out")"; fi

# Lab 5's checker reads the report as data: a cell written as shell arithmetic is not a number, never run.
mkdir -p "$tmp/crafted"
printf '%s\n' "## Accuracy" "| 2 | llama | 50.0 | x | 2.5 |" "| 2 | lime | 60.0 | x | 2.4 |" "## Cost" \
    "| 2 | llama | a[\$(touch $tmp/pwned5)] |" "| 2 | lime | 1000 |" >"$tmp/crafted/report.md"
out=$(RUN=$tmp/crafted LIME=$LIME bash labs/run.sh 5 labs/lab5/starter.txt 2>&1)
if [ -e "$tmp/pwned5" ]; then fail lab5_report_is_never_run "the report's cell ran a command"
elif grep -q '^FAIL report_read' <<<"$out" && tail -1 <<<"$out" | grep -q '0 passed, 1 failed$'; then pass lab5_report_is_never_run
else fail lab5_report_is_never_run "expected report_read to fail: $(tail -2 <<<"$out")"; fi

# Lab 5 on a tiny experiment; the answers come from the runs' own logs and the
# heatmap's numbers, not from the report the check reads.
run5=$tmp/run5
if ! $LIME compare --preset tiny --seeds 2 --device cpu --out "$run5" >"$tmp/compare.out" 2>&1; then
    fail lab5_experiment "$LIME compare --preset tiny failed: $(tail -1 "$tmp/compare.out")"
else
    mean() { cat "$run5"/tier*/"$1"-seed*/log.jsonl | sed -n "s/.*\"type\": \"done\".*\"$2\": \([-0-9.e]*\).*/\1/p" |
             awk -v k="$3" '{s += $1; n++} END {printf "%.*f\n", k, 100 * s / n}'; }
    acc_llama=$(mean llama accuracy 1) acc_lime=$(mean lime accuracy 1)
    loss_llama=$(mean llama val_loss 6) loss_lime=$(mean lime val_loss 6)
    $LIME analyze --load "$run5"/tier2/lime-seed1/model.safetensors --out "$tmp" --device cpu --n 4 >"$tmp/an.out" 2>&1
    routers=$(sed -n 's/^parameters: [0-9]* (routers \([0-9]*\),.*/\1/p' "$tmp/an.out")
    row=$(grep -E '^  layer [0-9]+ ' "$tmp/an.out" | grep own | tail -1 | sed 's/own.*//')
    from=$(awk '{best = -1; for (i = 3; i < NF; i++) if ($i > best) {best = $i; at = i - 3}; print at}' <<<"$row")
    own=$(awk '{printf "%.0f\n", 100 * $NF}' <<<"$row")
    better=$(awk -v a="$acc_lime" -v b="$acc_llama" 'BEGIN { print (a > b ? "lime" : a < b ? "llama" : "tie") }')
    lower=$(awk -v a="$loss_lime" -v b="$loss_llama" 'BEGIN { print (a < b ? "lime" : "llama") }')
    printf '%s\n' "llama_mean_accuracy: $acc_llama" "lime_mean_accuracy: $acc_lime" "better_model: $better" \
        "lower_test_loss: $lower" "router_parameters: $routers" "last_layer_leans_on: $from" \
        "last_layer_own_share: $own%" >"$tmp/answers.txt"
    lab5() { RUN=$run5 LIME=$LIME bash labs/run.sh 5 "$1" 2>&1; }
    out=$(lab5 "$tmp/answers.txt")
    tail -1 <<<"$out" | grep -q '^lab5: 7 passed, 0 failed$' && pass lab5_own_answers ||
        fail lab5_own_answers "answers read from the run should pass: $(grep -m1 '^FAIL' <<<"$out")"
    out=$(lab5 labs/lab5/starter.txt)
    tail -1 <<<"$out" | grep -q '^lab5: 0 passed, 7 failed$' && pass lab5_starter ||
        fail lab5_starter "the empty answers should fail: $(tail -1 <<<"$out")"
    other=$([ "$lower" = lime ] && echo llama || echo lime)
    sed "s/^lower_test_loss: .*/lower_test_loss: $other/" "$tmp/answers.txt" >"$tmp/wrong.txt"
    out=$(lab5 "$tmp/wrong.txt")
    grep -q '^FAIL lower_test_loss: your answer' <<<"$out" && tail -1 <<<"$out" | grep -q '1 failed$' &&
        pass lab5_wrong_answer || fail lab5_wrong_answer "a wrong answer should fail: $(tail -1 <<<"$out")"
    # a UTF-8 byte order mark (a Windows editor's) before the first answer is not part of it
    { printf '\xef\xbb\xbf'; cat "$tmp/answers.txt"; } >"$tmp/bom.txt"
    out=$(lab5 "$tmp/bom.txt")
    tail -1 <<<"$out" | grep -q '^lab5: 7 passed, 0 failed$' && pass lab5_answers_with_bom ||
        fail lab5_answers_with_bom "the answers after a BOM should pass: $(grep -m1 '^FAIL' <<<"$out")"
    # a report that is not a regular file, or over 16 MiB, is named as such (a FIFO hung the lab)
    mkdir -p "$tmp/fiforun" && cp -r "$run5"/tier* "$tmp/fiforun/" && mkfifo "$tmp/fiforun/report.md"
    out=$(RUN=$tmp/fiforun LIME=$LIME timeout 60 bash labs/run.sh 5 "$tmp/answers.txt" 2>&1); status=$?
    if [ $status -eq 124 ]; then fail lab5_report_fifo_refused "a FIFO report.md hung the lab"
    elif grep -q "^FAIL run_found: the report $tmp/fiforun/report.md is not a regular file" <<<"$out"; then pass lab5_report_fifo_refused
    else fail lab5_report_fifo_refused "$(grep -m1 '^FAIL' <<<"$out")"; fi
    cp -r "$run5" "$tmp/bigrun" && head -c 17000000 /dev/zero | tr '\0' ' ' >>"$tmp/bigrun/report.md"
    out=$(RUN=$tmp/bigrun LIME=$LIME bash labs/run.sh 5 "$tmp/answers.txt" 2>&1)
    if grep -q "^FAIL run_found: the report $tmp/bigrun/report.md is over 16 MiB" <<<"$out"; then pass lab5_report_over_16_mib
    else fail lab5_report_over_16_mib "$(grep -m1 '^FAIL' <<<"$out")"; fi
fi
summary
