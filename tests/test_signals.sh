#!/usr/bin/env bash
# tests/test_signals.sh — a stop is a stop, at every point of a run. SIGINT,
# SIGTERM and SIGPIPE at each phase of a short run (a step, a checkpoint's
# save, a periodic evaluation, the last step, its save, the final evaluation,
# the model's save), on the CPU and on the (emulated) GPU, and SIGINT to a
# train-group: each time the run either finishes with the numbers of the same
# run left alone (its done line, its model's tensors), or exits 128 + the
# signal with the --resume line, "interrupted" as its log's last line and no
# done line; --resume then finishes it with the run left alone's tensors and
# done line. compare --reuse never takes a run without a true done line.
#
# The testing build's hook (./lime-emu; tests/test_faults.sh has the others)
# raises a signal at a named phase, on cue:
#   LIME_TEST_SIGNAL_AT=PHASE:N:SIG  train.cpp raises SIG at PHASE of step N
#                                    (step, save, eval or model)
# A signal raised there always lands before the done line, so such a run must
# stop. ./lime has no hooks: it gets real signals (a closed pipe in its last
# step, SIGINT and SIGTERM at a random moment), and ./lime-emu real ones during
# a save made slow (LIME_TEST_SLOW_SAVE).
cd "$(dirname "$0")/.." || exit 2
source tests/lib.sh
EMU=${EMU:-./lime-emu}
if [ ! -x "$EMU" ] || [ ! -x "$LIME" ]; then
    fail built "$LIME and $EMU are not both built (make lime emu): the hooks are only in the testing build"
    summary; exit
fi
export LIME_EMU_QUIET=1

# 3 steps: step 2 saves and evaluates (periodic), step 3 is the last
RUN="--layers 2 --dim 16 --heads 2 --ffn 32 --ops 1 --train-size 200 --test-size 4 --batch 4 --threads 1 --steps 3"
RUN="$RUN --save-every 2 --eval-every 2 --eval-size 2"
# one save only, the last step's: for a real signal while it is written
LAST="--layers 2 --dim 16 --heads 2 --ffn 32 --ops 1 --train-size 200 --test-size 4 --batch 4 --threads 1 --steps 3"
LAST="$LAST --save-every 1000 --eval-every 1000"

quietly() { "$@" >/dev/null 2>&1; }
# A model file's tensors: the bytes after its header (the header records --out, which differs).
tensors() {
    local n
    n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
    tail -c +$((9 + n)) "$1"
}
same_tensors() { [ -s "$1" ] && cmp -s <(tensors "$1") <(tensors "$2"); }
# The done line's numbers (not its seconds); one line per done line.
done_numbers() { grep '"type": "done"' "$1/log.jsonl" 2>/dev/null | sed 's/.*\("val_loss".*\)}/\1/'; }
# Waits (up to 20 s) until a file matching the glob exists.
wait_glob() { for _ in $(seq 2000); do compgen -G "$1" >/dev/null && return 0; sleep 0.01; done; return 1; }

# The conditions (expect) on the run in DIR, ended with STATUS after signal SIG,
# its output in DIR.out: finished as the run left alone in REF, or (only where
# MAY_FINISH is 1) stopped as a stop should, then resumed by BIN to REF's end.
# Sets how: what the run did.
stop_is_a_stop() {  # BIN DIR STATUS SIG REF MAY_FINISH
    local bin=$1 dir=$2 status=$3 sig=$4 ref=$5 may_finish=$6 want
    want=$((128 + $(kill -l "$sig")))
    if [ "$status" -eq 0 ] && [ "$may_finish" = 1 ]; then
        how="$sig: finished"
    else
        how="$sig: exit $status$(grep -o ' at step [0-9]*' "$dir.out" | tail -1)"
        expect "$sig: exit $status, want $want" [ "$status" -eq "$want" ]
        expect "$sig: its output does not say how to --resume" grep -q -- "--resume $dir/checkpoint.safetensors" "$dir.out"
        expect "$sig: log.jsonl's last line is not \"interrupted\"" has "$(tail -1 "$dir/log.jsonl")" '"type": "interrupted"'
        expect "$sig: log.jsonl has a done line" not grep -q '"type": "done"' "$dir/log.jsonl"
        expect "$sig: train --resume does not finish it" quietly "$bin" train --resume "$dir/checkpoint.safetensors"
    fi
    expect "$sig: its done line [$(done_numbers "$dir")] is not the run's left alone [$(done_numbers "$ref")]" \
        [ "$(done_numbers "$dir")" = "$(done_numbers "$ref")" ]
    expect "$sig: its model's tensors are not the run's left alone" \
        same_tensors "$dir/model.safetensors" "$ref/model.safetensors"
}

# --- the hook at every phase, each signal, on the CPU and on the emulated GPU
phase_name() {
    case $1 in
        step:2) echo a_step ;;                 save:2) echo a_checkpoint_save ;;
        eval:2) echo a_periodic_evaluation ;;  step:3) echo the_last_step ;;
        save:3) echo the_last_save ;;          eval:3) echo the_final_evaluation ;;
        model:3) echo the_model_save ;;
    esac
}
for device in cpu gpu; do
    ref=$tmp/$device-alone
    quietly $EMU train $RUN --device $device --out "$ref"
    for phase in step:2 save:2 eval:2 step:3 save:3 eval:3 model:3; do
        check "${device}_$(phase_name $phase)"
        hows=""
        for sig in INT TERM PIPE; do
            dir=$tmp/$device-${phase/:/-}-$sig
            LIME_TEST_SIGNAL_AT=$phase:$sig $EMU train $RUN --device $device --out "$dir" >"$dir.out" 2>&1
            stop_is_a_stop "$EMU" "$dir" $? $sig "$ref" 0
            hows="$hows; $how"
        done
        verdict "${hows#; }"
    done
done

# --- the hook in the last step of a run cut by --stop-after: a stop, not "stopped after"
check cpu_the_stop_after_step
dir=$tmp/cpu-stop-after
LIME_TEST_SIGNAL_AT=step:2:TERM $EMU train $RUN --device cpu --stop-after 2 --out "$dir" >"$dir.out" 2>&1
stop_is_a_stop "$EMU" "$dir" $? TERM "$tmp/cpu-alone" 0
verdict "$how"

# --- ./lime | head -n 2: the reader is gone after step 1's line; step 10's line
# (the last step, after the loop read the stop flag) raises SIGPIPE
ref=$tmp/lime-alone
quietly $LIME train ${LAST/--steps 3/--steps 10} --log-every 10 --out "$ref"
check lime_sigpipe_in_the_last_step
dir=$tmp/lime-pipe
$LIME train ${LAST/--steps 3/--steps 10} --log-every 10 --out "$dir" 2>"$dir.out" | head -n 2 >/dev/null
stop_is_a_stop "$LIME" "$dir" "${PIPESTATUS[0]}" PIPE "$ref" 1
verdict "$how"

# --- ./lime: SIGINT and SIGTERM at a random moment of a run of 300 steps (during a step,
# its line or a save, or after: either way a stop or the true end)
LONG="${LAST/--steps 3/--steps 300}"; LONG=${LONG/--save-every 1000/--save-every 7}
ref=$tmp/lime-long-alone
quietly $LIME train $LONG --out "$ref"
for sig in INT TERM; do
    check "lime_sig${sig,,}_at_a_random_moment"
    dir=$tmp/lime-long-$sig
    $LIME train $LONG --out "$dir" >"$dir.out" 2>&1 &
    pid=$!
    wait_glob "$dir/log.jsonl"; sleep "0.$(printf '%02d' $((RANDOM % 30)))"
    kill -$sig $pid 2>/dev/null; wait $pid
    stop_is_a_stop "$LIME" "$dir" $? $sig "$ref" 1
    verdict "$how"
done

# --- ./lime-emu: a real signal while the last step's checkpoint, or the model, is being
# written (LIME_TEST_SLOW_SAVE: 20 ms a tensor), on the CPU and on the emulated GPU
for device in cpu gpu; do
    ref=$tmp/last-$device-alone
    quietly $EMU train $LAST --device $device --out "$ref"
    for at in checkpoint:TERM model:INT; do
        sig=${at#*:}
        check "${device}_real_sig${sig,,}_while_the_${at%:*}_is_written"
        dir=$tmp/last-$device-${at%:*}
        LIME_TEST_SLOW_SAVE=20000 $EMU train $LAST --device $device --out "$dir" >"$dir.out" 2>&1 &
        pid=$!
        expect "its ${at%:*} save never began" wait_glob "$dir/${at%:*}.safetensors.tmp-*"
        kill -$sig $pid; wait $pid
        stop_is_a_stop "$EMU" "$dir" $? $sig "$ref" 0
        verdict "$how"
    done
done

# --- train-group: SIGINT (the hook) in one run's final evaluation stops every run of
# the group (the other at its next step); each then resumes to its end alone
check group_sigint_in_one_runs_final_evaluation
G="--device gpu ${LAST/--steps 3/}"
mkdir -p "$tmp/g/a" "$tmp/g/b"
(exec 5>"$tmp/g/a.out" 6>"$tmp/g/b.out"
 LIME_TEST_SIGNAL_AT=eval:2:INT exec $EMU train-group --run 5 $G --steps 2 --out "$tmp/g/a" \
     --run 6 $G --steps 4 --arch llama --out "$tmp/g/b")
status=$?
expect "train-group exits $status, want 130" [ $status -eq 130 ]
hows=""
for r in a:2 b:4; do
    steps=${r#*:}; arch=lime; [ ${r%:*} = b ] && arch=llama
    quietly $EMU train $G --steps $steps --arch $arch --out "$tmp/g/${r%:*}-alone"
    stop_is_a_stop "$EMU" "$tmp/g/${r%:*}" 130 INT "$tmp/g/${r%:*}-alone" 0
    hows="$hows; run ${r%:*}: $how"
done
verdict "${hows#; }"

# ... and a real SIGINT to the group while its first run's last checkpoint is written
check group_real_sigint_in_a_runs_last_save
mkdir -p "$tmp/gs/a" "$tmp/gs/b"
(exec 5>"$tmp/gs/a.out" 6>"$tmp/gs/b.out"
 LIME_TEST_SLOW_SAVE=20000 exec $EMU train-group --run 5 $G --steps 2 --out "$tmp/gs/a" \
     --run 6 $G --steps 4 --arch llama --out "$tmp/gs/b") &
pid=$!
expect "run a's save never began" wait_glob "$tmp/gs/a/checkpoint.safetensors.tmp-*"
kill -INT $pid; wait $pid; status=$?
expect "train-group exits $status, want 130" [ $status -eq 130 ]
hows=""
for r in a b; do
    stop_is_a_stop "$EMU" "$tmp/gs/$r" 130 INT "$tmp/g/$r-alone" 0
    hows="$hows; run $r: $how"
done
verdict "${hows#; }"

# --- compare --reuse reads a run as finished only by a done line right after its final
# evaluation's line: not the done line of a cut-short evaluation (val loss 0, no eval
# line: what an older ./lime wrote), nor one followed by more lines (the run went on)
CMP=(--preset tiny --seeds 1 --archs llama --train-args "--steps 2" --out "$tmp/cmp")
quietly env LIME_EMU_NO_DEVICE=1 $EMU compare "${CMP[@]}"
log=$tmp/cmp/tier2/llama-seed1/log.jsonl
cp "$log" "$tmp/cmp.log"
for forged in cut_short went_on; do
    check "compare_reuse_refuses_a_${forged}_done_line"
    if [ $forged = cut_short ]; then
        grep -v '"type": "eval", "step": 2,' "$tmp/cmp.log" |
            sed '/"type": "done"/s/"val_loss": .*}/"val_loss": 0, "accuracy": 0}/' >"$log"
    else
        { cat "$tmp/cmp.log"; echo '{"type": "interrupted", "step": 2, "signal": 2}'; } >"$log"
    fi
    expect "the log was not forged" not cmp -s "$log" "$tmp/cmp.log"
    out=$(env LIME_EMU_NO_DEVICE=1 $EMU compare "${CMP[@]}" --reuse 2>&1); status=$?
    expect "compare --reuse exits $status" [ $status -eq 0 ]
    expect "it took the run as done" has "$out" "0 of 1 runs already done"
    expect "it did not train the run again" cmp -s <(done_numbers "$tmp/cmp/tier2/llama-seed1") \
        <(grep '"type": "done"' "$tmp/cmp.log" | sed 's/.*\("val_loss".*\)}/\1/')
    verdict "$(grep 'already done' <<<"$out")"
done

summary
