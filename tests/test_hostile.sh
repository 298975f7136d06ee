#!/usr/bin/env bash
# tests/test_hostile.sh — a crafted file or a careless hand (issue 18's
# classes 1, 11 and 12): a reference file whose sizes lie, a checkpoint whose
# settings or config lie under a valid checksum, output that must stay
# machine-readable (every JSON line parsed back by build/json_check, which
# uses the program's own reader) and messages that must stay one honest
# line. Runs ./lime-emu (its test hook LIME_TEST_SAVE_META writes the lies)
# unless the caller names another testing build (tests/run_asan.sh).
cd "$(dirname "$0")/.." || exit 2
LIME=${LIME:-./lime-emu}
export LIME_EMU_NO_DEVICE=1  # the emulated GPU would be slow; these are host-side checks
source tests/lib.sh
JSON=build/json_check
for need in "$LIME" "$JSON"; do
    if [ ! -x "$need" ]; then fail built "$need is not built (make test builds it)"; summary; exit; fi
done
TINY="--layers 2 --dim 16 --heads 2 --ffn 32 --train-size 300 --test-size 20 --batch 16 --threads 1 --quiet"
ESC=$(printf '\033')

# expect_line NAME STATUS WORD COMMAND...: exit STATUS, WORD in the output, no raw control character.
expect_line() {
    local name=$1 want=$2 word=$3 out status; shift 3
    out=$("$@" 2>&1); status=$?
    if [ "$status" -ne "$want" ]; then fail "$name" "exit $status, want $want: $(tail -2 <<<"$out")"
    elif ! grep -q -- "$word" <<<"$out"; then fail "$name" "no '$word' in: $(tail -2 <<<"$out")"
    elif LC_ALL=C grep -q '[[:cntrl:]]' <<<"$(tr -d '\n' <<<"$out")"; then fail "$name" "a raw control character in: $out"
    else pass "$name"; fi
}

# --- class 1: a reference file's sizes, checked before anything is indexed
# (max_position_embeddings below the batch's T ran crossentropy past its rows: SIGSEGV)
sed 's/"max_position_embeddings\\": 5/"max_position_embeddings\\": 2/' tests/golden/lime_tiny.safetensors >"$tmp/pos2.safetensors"
expect_line verify_batch_longer_than_the_model 1 "max_position_embeddings" $LIME verify "$tmp/pos2.safetensors"
# batch.tokens read as another dtype of the same byte count
sed 's/"batch.tokens":{"dtype":"I32"/"batch.tokens":{"dtype":"F32"/' tests/golden/lime_tiny.safetensors >"$tmp/f32.safetensors"
expect_line verify_batch_of_another_dtype 1 "FAIL" $LIME verify "$tmp/f32.safetensors"
# a lie in the AdamW metadata: not a finite number
sed 's/"lr":"0.01"/"lr":"1e99"/' tests/golden/lime_tiny.safetensors >"$tmp/lr.safetensors"
expect_line verify_metadata_not_finite 1 "not a finite number" $LIME verify "$tmp/lr.safetensors"

# --- a trained model and the lies its checkpoint can carry under a valid checksum
if ! $LIME train $TINY --ops 2 --steps 3 --out "$tmp/run" >"$tmp/train.out" 2>&1; then
    fail setup "tiny run failed: $(tail -2 "$tmp/train.out")"; summary; exit
fi
M=$tmp/run/model.safetensors
spoiled() {  # spoiled DIR VAR=VALUE: a tiny run whose files carry that lie
    env "$2" $LIME train $TINY --ops 2 --steps 2 --out "$1" >/dev/null 2>&1
}
spoiled "$tmp/ops" 'LIME_TEST_SAVE_META=task={"task": "arith", "ops": "3abc", "modulus": "11", "format": "chain", "train-size": "300", "test-size": "20", "data-seed": "1"}'
expect_line eval_refuses_ops_3abc 2 '"ops"' $LIME eval --load "$tmp/ops/model.safetensors" --json
cfg=$(sed -n 's/.*"config": \({[^}]*}\).*/\1/p' "$tmp/run/log.jsonl" | head -1)
spoiled "$tmp/eps" "LIME_TEST_SAVE_META=config=${cfg/\"rms_norm_eps\": 9.99999997e-07/\"rms_norm_eps\": 1e39}"
expect_line eval_refuses_rms_norm_eps_1e39 2 "rms_norm_eps" $LIME eval --load "$tmp/eps/model.safetensors"

# --- class 11: machine-readable output is valid JSON, parsed back
weird="$tmp/a\"b{c}"
mkdir -p "$weird" && cp "$M" "$weird/m.safetensors"
out=$($LIME eval --load "$weird/m.safetensors" --json --n 2 2>&1)
if got=$($JSON file <<<"$out") && [ "$got" = "$(printf '"%s"' "$tmp/a\\\"b{c}/m.safetensors")" ] && $JSON ops accuracy <<<"$out" >/dev/null
then pass eval_json_quotes_and_braces_in_a_path; else fail eval_json_quotes_and_braces_in_a_path "$out / $got"; fi
cp "$M" "$tmp/second.safetensors"
out=$($LIME eval --load "$weird/m.safetensors" --load "$tmp/second.safetensors" --json --n 2 2>&1)
if $JSON "$weird/m.safetensors>accuracy" "$tmp/second.safetensors>accuracy" <<<"$out" >/dev/null
then pass eval_json_of_two_checkpoints_parses; else fail eval_json_of_two_checkpoints_parses "$out"; fi
expect_line eval_same_file_twice_refused 2 "given twice" $LIME eval --load "$M" --load "$M" --json
if $JSON --lines <"$tmp/run/log.jsonl" >/dev/null && [ "$($JSON --lines type <"$tmp/run/log.jsonl")" = '"done"' ]
then pass log_jsonl_every_line_parses; else fail log_jsonl_every_line_parses "$($JSON --lines <"$tmp/run/log.jsonl")"; fi
# a row longer than 511 bytes (a long path) keeps its accuracy
deep=$tmp/$(printf 'd%.0s' $(seq 200))/$(printf 'e%.0s' $(seq 200))/$(printf 'f%.0s' $(seq 150))
mkdir -p "$deep" && cp "$M" "$deep/model.safetensors"
expect_line eval_long_row_not_cut 0 "test loss" $LIME eval --load "$deep/model.safetensors" --n 2
# --format direct has no chains: no "valid chains 0.00%"
$LIME train $TINY --ops 2 --format direct --steps 2 --out "$tmp/direct" >/dev/null 2>&1
out=$($LIME eval --load "$tmp/direct/model.safetensors" --n 2 2>&1)
if grep -q "valid chains n/a" <<<"$out" && ! grep -q "valid chains *0.00%" <<<"$out" &&
    ! $LIME eval --load "$tmp/direct/model.safetensors" --n 2 --json | $JSON valid_chains >/dev/null
then pass eval_direct_model_has_no_valid_chains; else fail eval_direct_model_has_no_valid_chains "$out"; fi
# the ETA counts the evaluations still to come: before the first is timed it says so
out=$($LIME train --layers 1 --dim 8 --heads 1 --ffn 8 --ops 1 --train-size 100 --test-size 20 --batch 4 --threads 1 \
      --steps 4 --log-every 1 --eval-every 2 --out "$tmp/eta" 2>&1)
if grep -q "^step 1/4 .*ETA .* + evaluation" <<<"$out" && grep -q "^step 3/4 .*ETA [0-9hms]*$" <<<"$out"
then pass eta_counts_the_evaluations; else fail eta_counts_the_evaluations "$(grep '^step' <<<"$out")"; fi

# --- class 12: messages
expect_line flag_given_twice_refused 2 "given twice" $LIME train $TINY --ops 1 --steps 3 --steps 4 --out "$tmp/twice"
expect_line bench_arch_refused 2 "--arch" $LIME bench --arch llama --steps 1 --layers 1 --dim 8 --heads 1 --ffn 8 \
    --batch 2 --seq-len 4
expect_line compare_two_router_variants_refused 2 "lime:last-2:first-1" timeout 20 $LIME compare --archs llama,lime:last-2:first-1 --out "$tmp/cmp"
expect_line sample_counts_words_from_1 2 "word 3 " $LIME sample --load "$M" --prompt "1 + zz ="
# the GPU's launch limits are not refused for a CPU run
expect_line eval_batch_65536_on_the_cpu 0 "accuracy" $LIME eval --load "$M" --batch 65536 --device cpu --n 2
# one bound for how many questions a task can have: the one it names is accepted
bound=$($LIME data --ops 2 --train-size 100000 2>&1 | sed -n 's/.*ask for at most \([0-9]*\) in all.*/\1/p')
if [ -n "$bound" ] && $LIME data --ops 2 --train-size $((bound - 500)) --test-size 500 --n 1 >/dev/null 2>&1
then pass arith_bound_is_consistent; else fail arith_bound_is_consistent "asked for $bound: $($LIME data --ops 2 --train-size $((bound - 500)) --test-size 500 --n 1 2>&1)"; fi
# control characters in a path reach the terminal escaped
esc_out="$tmp/x${ESC}[31my"
expect_line train_done_line_escaped 0 'x\\x1b\[31my' $LIME train $TINY --ops 2 --steps 2 --out "$esc_out"
cp "$M" "$tmp/m${ESC}.safetensors"
expect_line eval_row_escaped 0 'm\\x1b.safetensors' $LIME eval --load "$tmp/m${ESC}.safetensors" --n 2
expect_line verify_path_escaped 1 'pos2\\x1b' bash -c "cp '$tmp/pos2.safetensors' '$tmp/pos2${ESC}.st' && $LIME verify '$tmp/pos2${ESC}.st'"
expect_line analyze_header_escaped 0 'm\\x1b.safetensors' $LIME analyze --load "$tmp/m${ESC}.safetensors" --n 2 --device cpu --out "$tmp/an"
# the changed-data warning, on stderr: the text file's name escaped
txt="$tmp/t${ESC}.txt"
head -c 2000 README.md >"$txt"
$LIME train --task text --text-file "$txt" --seq-len 16 --layers 1 --dim 8 --heads 1 --ffn 8 --batch 4 --threads 1 \
    --steps 2 --quiet --out "$tmp/text" >/dev/null 2>&1
echo "changed" >>"$txt"
expect_line changed_data_warning_escaped 0 't\\x1b.txt' $LIME eval --load "$tmp/text/model.safetensors" --n 2

summary
