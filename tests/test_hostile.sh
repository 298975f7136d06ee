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
got=$($JSON file <<<"$out"); status=$?
check eval_json_quotes_and_braces_in_a_path
expect "its \"file\" does not parse back" [ $status -eq 0 ]
expect "its \"file\" reads back as $got" [ "$got" = "$(printf '"%s"' "$tmp/a\\\"b{c}/m.safetensors")" ]
expect "its ops' accuracy does not parse back" $JSON ops accuracy <<<"$out" >/dev/null
verdict "$out"
cp "$M" "$tmp/second.safetensors"
out=$($LIME eval --load "$weird/m.safetensors" --load "$tmp/second.safetensors" --json --n 2 2>&1)
if $JSON "$weird/m.safetensors>accuracy" "$tmp/second.safetensors>accuracy" <<<"$out" >/dev/null
then pass eval_json_of_two_checkpoints_parses; else fail eval_json_of_two_checkpoints_parses "$out"; fi
expect_line eval_same_file_twice_refused 2 "given twice" $LIME eval --load "$M" --load "$M" --json
check log_jsonl_every_line_parses
expect "a line does not parse" $JSON --lines <"$tmp/run/log.jsonl" >/dev/null
expect "the last line's type is not \"done\"" [ "$($JSON --lines type <"$tmp/run/log.jsonl")" = '"done"' ]
verdict "$($JSON --lines <"$tmp/run/log.jsonl" 2>&1 | tail -2)"
# a row longer than 511 bytes (a long path) keeps its accuracy
deep=$tmp/$(printf 'd%.0s' $(seq 200))/$(printf 'e%.0s' $(seq 200))/$(printf 'f%.0s' $(seq 150))
mkdir -p "$deep" && cp "$M" "$deep/model.safetensors"
expect_line eval_long_row_not_cut 0 "test loss" $LIME eval --load "$deep/model.safetensors" --n 2
# --format direct has no chains: no "valid chains 0.00%"
$LIME train $TINY --ops 2 --format direct --steps 2 --out "$tmp/direct" >/dev/null 2>&1
out=$($LIME eval --load "$tmp/direct/model.safetensors" --n 2 2>&1)
check eval_direct_model_has_no_valid_chains
expect "it does not say 'valid chains n/a'" has "$out" "valid chains n/a"
expect "it says 'valid chains 0.00%'" not has "$out" "valid chains *0.00%"
expect "eval --json has a valid_chains" not $JSON valid_chains <<<"$($LIME eval --load "$tmp/direct/model.safetensors" --n 2 --json)"
verdict "$out"
# the ETA counts the evaluations still to come: before the first is timed it says so
out=$($LIME train --layers 1 --dim 8 --heads 1 --ffn 8 --ops 1 --train-size 100 --test-size 20 --batch 4 --threads 1 \
      --steps 4 --log-every 1 --eval-every 2 --out "$tmp/eta" 2>&1)
check eta_counts_the_evaluations
expect "step 1's ETA does not add '+ evaluation'" has "$out" "^step 1/4 .*ETA .* + evaluation"
expect "step 3's ETA is not a plain time" has "$out" "^step 3/4 .*ETA [0-9hms]*$"
verdict "$(grep '^step' <<<"$out")"

# --- round five (issue 61), class 3: a router variant's fixed entries are checked at load. A plain
# lime run's file relabelled (its config alone) as each variant is refused, naming the router
# tensor and its first entry off the variant's value; the variant's own runs load.
TINY4=${TINY/--layers 2/--layers 4}  # where first-1 leaves a layer out
$LIME train $TINY4 --ops 2 --steps 2 --out "$tmp/plain4" >/dev/null 2>&1
relabel() {  # relabel NAME SED-EXPRESSION PLAIN-RUN SHAPE: that run's twin, its config edited by the expression
    local config
    config=$(sed -n 's/.*"config": \({[^}]*}\).*/\1/p' "$3/log.jsonl" | head -1)
    env "LIME_TEST_SAVE_META=config=$(sed "$2" <<<"$config")" $LIME train $4 --ops 2 --steps 2 \
        --out "$tmp/relabel_$1" >/dev/null 2>&1
}
for v in "same-head|s/\"router_kv\": \"shared\"/&, \"router_heads\": \"same\"/|--router-heads same|" \
         "average|s/\"router\": \"static\"/\"router\": \"average\"/|--router average|" \
         "last-1|s/\"router\": \"static\"/\"router\": \"last-1\"/|--router last-1|" \
         "first-1|s/\"router\": \"static\"/\"router\": \"first-1\"/|--router first-1|4" \
         "frozen|s/\"router_kv\": \"shared\"/&, \"router_frozen\": true/|--router-weights frozen|"; do
    IFS='|' read -r name expr flags layers <<<"$v"
    plain=$tmp/run shape=$TINY; [ "$layers" = 4 ] && plain=$tmp/plain4 shape=$TINY4
    relabel "$name" "$expr" "$plain" "$shape"
    expect_line "eval_refuses_lime_relabelled_$name" 2 "router.weight\[[0-9]*\]\[[0-9]*\] is .*, not " \
        $LIME eval --load "$tmp/relabel_$name/model.safetensors" --n 2
    $LIME train $shape --ops 2 --steps 2 $flags --out "$tmp/variant_$name" >/dev/null 2>&1
    expect_line "eval_loads_a_${name}_run" 0 "test loss" $LIME eval --load "$tmp/variant_$name/model.safetensors" --n 2
done
# a frozen run with separate key and value routers resumes (its fixed values: model_init's, from its seed)
$LIME train $TINY --ops 2 --steps 4 --stop-after 2 --router-weights frozen --router-kv separate --seed 5 \
    --out "$tmp/frozen_kv" >/dev/null 2>&1
expect_line resume_of_a_frozen_separate_run 0 "done" $LIME train --resume "$tmp/frozen_kv/checkpoint.safetensors"

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
check arith_bound_is_consistent
expect "no bound named" [ -n "$bound" ]
expect "the bound it names, $bound, is refused" $LIME data --ops 2 --train-size $((bound - 500)) --test-size 500 --n 1 >"$tmp/bound.out" 2>&1
verdict "$(tail -1 "$tmp/bound.out")"
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


# --- round four (issue 47): compare touches only its own runs and reports only numbers it computed
CMP="--preset tiny --seeds 1 --jobs 2"
# a run directory that is a symlink (here to another run) is refused, the run it points to untouched
$LIME train $TINY --ops 2 --steps 3 --seed 9 --out "$tmp/victim" >/dev/null 2>&1
before=$(md5sum <"$tmp/victim/model.safetensors")
mkdir -p "$tmp/c1/tier2" && ln -s "$tmp/victim" "$tmp/c1/tier2/lime-seed1"
expect_line compare_symlinked_run_dir_refused 2 "lime-seed1 is a symbolic link" $LIME compare $CMP --out "$tmp/c1"
if [ "$(md5sum <"$tmp/victim/model.safetensors")" != "$before" ]; then fail compare_symlink_target_untouched "the model it points to was replaced"
elif ! grep -q '"seed": "9"' "$tmp/victim/log.jsonl"; then fail compare_symlink_target_untouched "its log was rewritten"
elif [ -e "$tmp/c1/tier2/llama-seed1" ]; then fail compare_symlink_target_untouched "a run started before the refusal"
else pass compare_symlink_target_untouched; fi
# and a directory above the run (--out/tier2) that is a symlink: the runs would land outside --out
mkdir -p "$tmp/c1b" "$tmp/elsewhere" && ln -s "$tmp/elsewhere" "$tmp/c1b/tier2"
expect_line compare_symlinked_tier_dir_refused 2 "tier2 is a symbolic link" $LIME compare $CMP --out "$tmp/c1b"

# --reuse reads a run only when every train flag is the new call's, both ways, defaults explicit
$LIME compare $CMP --train-args "--steps 30 --lr 0.05" --out "$tmp/c2" >/dev/null 2>&1
models=$(cat "$tmp"/c2/tier2/*/model.safetensors | md5sum)
expect_line compare_reuse_other_flags_refused 2 "trained with --lr 0.05, this call gives --lr 1e-3 (train's default)" \
    $LIME compare $CMP --reuse --out "$tmp/c2"
expect_line compare_reuse_same_flags_other_spelling 0 "2 of 2 runs already done" \
    $LIME compare $CMP --reuse --train-args "--lr 5e-2 --steps 30" --out "$tmp/c2"
$LIME compare $CMP --train-args "--steps 30 --lr 1e-3" --out "$tmp/c2d" >/dev/null 2>&1
expect_line compare_reuse_default_given_or_not 0 "2 of 2 runs already done" $LIME compare $CMP --reuse --out "$tmp/c2d"
expect_line compare_reuse_other_length_refused 2 "trained with --steps 30, this call gives --epochs 1" \
    $LIME compare $CMP --reuse --train-args "--epochs 1 --lr 0.05" --out "$tmp/c2"
# another --alpha: the runs' training is read, their analysis made again
out=$($LIME compare $CMP --reuse --train-args "--steps 30 --lr 0.05" --alpha 1 --out "$tmp/c2" 2>&1); status=$?
if [ $status -ne 0 ]; then fail compare_reuse_other_alpha_analyses_again "exit $status: $(tail -2 <<<"$out")"
elif ! grep -q "2 of 2 runs already done in .*; 2 analysed again (for --alpha 1, or an older analysis)" <<<"$out"; then
    fail compare_reuse_other_alpha_analyses_again "no line saying so: $(head -2 <<<"$out")"
elif [ "$(cut -f5 "$tmp/c2/tier2/lime-seed1/entropy.tsv" | sort -u | head -1)" != 1 ]; then
    fail compare_reuse_other_alpha_analyses_again "entropy.tsv holds alpha $(cut -f5 "$tmp/c2/tier2/lime-seed1/entropy.tsv" | sort -u | tr '\n' ' ')"
elif [ "$(cat "$tmp"/c2/tier2/*/model.safetensors | md5sum)" != "$models" ]; then
    fail compare_reuse_other_alpha_analyses_again "a run was trained again"
else pass compare_reuse_other_alpha_analyses_again; fi

# every number read back is checked: the file and the value named, nothing reported
$LIME compare $CMP --out "$tmp/c3" >/dev/null 2>&1
log=$tmp/c3/tier2/llama-seed1/log.jsonl tsv=$tmp/c3/tier2/llama-seed1/entropy.tsv
cp "$log" "$tmp/log.keep" && cp "$tsv" "$tmp/tsv.keep"
tamper() {  # name, word, file, sed script: the tampered file refused by --reuse, then restored
    sed -i "$4" "$3"
    expect_line "$1" 2 "$2" $LIME compare $CMP --reuse --out "$tmp/c3"
    cp "$tmp/log.keep" "$log" && cp "$tmp/tsv.keep" "$tsv"
}
tamper compare_reuse_accuracy_750_refused 'log.jsonl line [0-9]*: "accuracy" 7.5 is not a number in \[0, 1\]' "$log" \
    's/\("type": "done".*"accuracy": \)[0-9.e-]*/\17.5/'
check compare_report_kept_its_own_numbers
expect "report.md has no row for llama" grep -q "| tier 2 | llama |" "$tmp/c3/report.md"
expect "report.md took the tampered accuracy (750)" not grep -q "| tier 2 | llama | 750" "$tmp/c3/report.md"
verdict "$(grep "| tier 2 | llama |" "$tmp/c3/report.md")"
tamper compare_reuse_negative_loss_refused '"val_loss" -3 is not' "$log" 's/\("type": "done".*"val_loss": \)[0-9.e-]*/\1-3/'
tamper compare_reuse_done_not_the_final_evaluation_refused "the done line's numbers are not the final evaluation's" \
    "$log" 's/\("type": "done".*"val_loss": \)[0-9.e-]*/\11.5/'
tamper compare_reuse_negative_entropy_refused 'entropy.tsv line 2: entropy -1' "$tsv" '2s/^raw\t0\t[0-9.]*/raw\t0\t-1/'
tamper compare_reuse_huge_entropy_refused 'entropy 1e+300' "$tsv" '2s/^raw\t0\t[0-9.]*/raw\t0\t1e300/'
tamper compare_reuse_layer_past_model_refused 'layer 7 is not one of the model' "$tsv" '2s/^raw\t0\t/raw\t7\t/'

# a path with a space in --train-args, quoted as in the shell; the report says the command shell-quoted
head -c 3000 README.md >"$tmp/my notes.txt"
out=$($LIME compare $CMP --task text --train-args "--text-file '$tmp/my notes.txt' --seq-len 16" --out "$tmp/c16" 2>&1)
status=$?
if [ $status -ne 0 ]; then fail compare_train_args_quoted_path "exit $status: $(tail -2 <<<"$out")"
elif ! grep -qF -- "--text-file '$tmp/my notes.txt' --seq-len 16" "$tmp/c16/report.md"; then
    fail compare_train_args_quoted_path "the report's command lacks the quoted path: $(grep -o 'with `./lime train [^`]*`' "$tmp/c16/report.md")"
else pass compare_train_args_quoted_path; fi

# a train.out compare cannot write (a symlink planted there): that run fails saying so, before it starts
mkdir -p "$tmp/c13/tier2/lime-seed1" && ln -s /dev/null "$tmp/c13/tier2/lime-seed1/train.out"
out=$($LIME compare $CMP --out "$tmp/c13" 2>&1); status=$?
if [ $status -ne 2 ]; then fail compare_train_out_unwritable_said "exit $status: $(tail -1 <<<"$out")"
elif ! grep -q "tier 2 lime  seed 1: FAILED in .*: cannot write .*lime-seed1/train.out" <<<"$out"; then
    fail compare_train_out_unwritable_said "no progress line naming train.out: $(grep FAILED <<<"$out")"
elif ! tail -1 <<<"$out" | grep -q "1 of 2 runs failed; the first, tier 2 lime  seed 1: cannot write"; then
    fail compare_train_out_unwritable_said "last line: $(tail -1 <<<"$out")"
else pass compare_train_out_unwritable_said; fi

# bench holds llama and its peers at once (every registered model): their sum is asked of the memory there is (each
# fits alone in 90% of it; LIME_TEST_MEMINFO: a machine with that much MemAvailable)
BENCH="bench --layers 1 --dim 64 --heads 2 --ffn 64 --vocab 512 --seq-len 64 --batch 64 --steps 1 --threads 1"
echo "MemAvailable:       1 kB" >"$tmp/meminfo"
need=$(LIME_TEST_MEMINFO=$tmp/meminfo $LIME $BENCH 2>&1 | sed -n 's/.*models held at once need \([0-9.e+-]*\) GB.*/\1/p')
if [ -z "$need" ]; then fail bench_models_held_together_checked "no sum named: $(LIME_TEST_MEMINFO=$tmp/meminfo $LIME $BENCH 2>&1 | tail -1)"
else
    echo "MemAvailable: $(awk -v n="$need" 'BEGIN { printf "%d", n * 0.9 * 1e9 / 1024 }') kB" >"$tmp/meminfo"
    expect_line bench_models_held_together_checked 2 "the [0-9][0-9]* models held at once need .*; lower --" \
        env LIME_TEST_MEMINFO="$tmp/meminfo" $LIME $BENCH
fi

# --- round four: the small ones
# paths with control characters, escaped on every line that prints them
expect_line compare_done_line_escapes_path 0 'c\\x1b\\x1b/report.md' $LIME compare $CMP --out "$tmp/c${ESC}${ESC}"
expect_line compare_reuse_line_escapes_path 0 'runs already done in .*c\\x1b\\x1b' $LIME compare $CMP --reuse --out "$tmp/c${ESC}${ESC}"
expect_line stop_after_line_escapes_path 0 'e20\\x1b\[31m/checkpoint' $LIME train $TINY --ops 2 --steps 2 --stop-after 1 --out "$tmp/e20${ESC}[31m"
$LIME train $TINY --ops 2 --arch hc --hc-rate 2 --steps 2 --out "$tmp/hc" >/dev/null 2>&1
expect_line analyze_hc_wrote_line_escaped 0 'hc\\x1b/hc_heatmap.png' $LIME analyze --load "$tmp/hc/model.safetensors" --n 2 --out "$tmp/hc${ESC}"
# data and sample: a text's NUL and control bytes printed escaped, one line per example
printf 'ab\0cd\033[31m\r\nxx%.0s' $(seq 300) >"$tmp/nul.txt"
out=$($LIME data --task text --text-file "$tmp/nul.txt" --seq-len 16 --n 2 2>&1)
if [ "$(wc -l <<<"$out")" -ne 2 ]; then fail data_prints_nul_escaped "$(wc -l <<<"$out") lines for 2 examples: $(od -c <<<"$out" | head -3)"
elif ! grep -q 'ab\\x00cd\\x1b\[31m\\r\\n' <<<"$out"; then fail data_prints_nul_escaped "not escaped: $(head -1 <<<"$out" | od -c | head -2)"
else pass data_prints_nul_escaped; fi
head -c 3000 /dev/zero | tr '\0' '\033' >"$tmp/esc.txt"  # a text of ESC bytes: the model learns to continue with ESC
$LIME train --task text --text-file "$tmp/esc.txt" --seq-len 16 --layers 1 --dim 16 --heads 2 --ffn 16 --batch 8 \
    --threads 1 --steps 60 --lr 1e-2 --quiet --out "$tmp/esctext" >/dev/null 2>&1
expect_line sample_prints_bytes_escaped 0 '^\\x1b\\x1b' $LIME sample --load "$tmp/esctext/model.safetensors" --prompt "$ESC$ESC" --max-new 4
# verify: a file it cannot check is counted apart from the checks
expect_line verify_counts_files_apart 1 "verify: [1-9][0-9]* checks, 0 failed; 1 file could not be checked" \
    $LIME verify --quiet README.md tests/golden/llama_tiny.safetensors
# export: the directory's mode follows the umask, as mkdir's
$LIME train $TINY --ops 2 --arch llama --steps 2 --out "$tmp/l23" >/dev/null 2>&1
for mask in 022 077; do
    rm -rf "$tmp/l23-hf"
    (umask $mask && $LIME export --load "$tmp/l23/model.safetensors" --out "$tmp/l23-hf" >/dev/null 2>&1)
    want=$([ $mask = 022 ] && echo drwxr-xr-x || echo drwx------)
    got=$(stat -c %A "$tmp/l23-hf" 2>&1)
    if [ "$got" = "$want" ]; then pass "export_dir_mode_umask_$mask"; else fail "export_dir_mode_umask_$mask" "$got, want $want"; fi
done
# a checkpoint's config error names the config key, not a flag
spoiled "$tmp/c24" "LIME_TEST_SAVE_META=config=${cfg/\"num_hidden_layers\": 2/\"num_hidden_layers\": 0}"
expect_line config_error_names_the_key 2 'config "num_hidden_layers" 0 must be at least 1' $LIME eval --load "$tmp/c24/model.safetensors"
# eval: one file given twice by other paths (./ and a symlink) is refused
ln -s "$M" "$tmp/link.safetensors"
expect_line eval_same_file_by_dot_path_refused 2 "given twice" $LIME eval --load "$M" --load "$(dirname "$M")/./$(basename "$M")"
expect_line eval_same_file_by_symlink_refused 2 "given twice" $LIME eval --load "$M" --load "$tmp/link.safetensors"

# the export's tokenizer splits words as the trainer does, non-ASCII letters
# included: checked with the tokenizers package where it is installed
# (LIME_TOKENIZERS_PYTHON names a Python that has it, else python3)
py=${LIME_TOKENIZERS_PYTHON:-python3}
if ! "$py" -c "import tokenizers" 2>/dev/null; then
    echo "SKIP export_tokenizer_keeps_non_ascii_words: no Python with the tokenizers package ($py; set LIME_TOKENIZERS_PYTHON)"
else
    # tests/data/prosqa_nonascii.json: one item whose people are Tém and Zoë
    $LIME train --task prosqa --prosqa-test tests/data/prosqa_nonascii.json --train-size 8 --arch llama --layers 1 \
        --dim 16 --heads 2 --ffn 32 --batch 8 --steps 2 --threads 1 --quiet --out "$tmp/pqn" >/dev/null 2>&1 &&
        $LIME export --load "$tmp/pqn/model.safetensors" --out "$tmp/pqn-hf" >/dev/null 2>&1
    text="Tém is a bempus. Zoë is a zhoolpus."
    want=$("$py" - "$tmp/pqn-hf/tokenizer.json" "$text" 2>&1 <<'PY'
import sys
from tokenizers import Tokenizer
print(" ".join(Tokenizer.from_file(sys.argv[1]).encode(sys.argv[2]).tokens))
PY
    )
    if [ "$want" = "Tém is a bempus . Zoë is a zhoolpus ." ]; then pass export_tokenizer_keeps_non_ascii_words
    else fail export_tokenizer_keeps_non_ascii_words "tokenizers split '$text' as '$want'"; fi
fi

summary
