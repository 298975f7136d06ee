#!/usr/bin/env bash
# tests/test_flags.sh — every command refuses bad flags the same way: exit
# status 2, one line that names the problem (checked by a key word), no
# crash, and nothing written. Each row of the table below is one invocation,
# run from an empty directory that must still be empty afterwards (train's
# default --out is runs/model, relative to it).
cd "$(dirname "$0")/.." || exit 2
source tests/lib.sh
LIME=$(realpath "$LIME")  # the rows run from their own empty directories

# What the rows need: a short text, a trained model and its checkpoint.
head -c 3000 README.md > "$tmp/short.txt"
TINY="--layers 2 --dim 16 --heads 2 --ffn 32 --ops 2 --train-size 300 --test-size 20 --batch 16 --threads 1 --quiet"
$LIME train $TINY --steps 2 --out "$tmp/run" >/dev/null 2>&1
$LIME train $TINY --steps 2 --seed 2 --out "$tmp/run2" >/dev/null 2>&1   # another run, for train_resume_into_other_run
$LIME train $TINY --steps 2 --arch llama --out "$tmp/llama" >/dev/null 2>&1  # a model with no router
$LIME train $TINY --steps 2 --arch hc --hc-rate 2 --out "$tmp/hc" >/dev/null 2>&1  # Hyper-Connections
$LIME train $TINY --steps 2 --arch muddformer --mudd-ways kv --out "$tmp/mudd" >/dev/null 2>&1  # MUDD-KV
M=$tmp/run/model.safetensors
L=$tmp/llama/model.safetensors
C=$tmp/run/checkpoint.safetensors
HC=$tmp/hc/model.safetensors
MUDD=$tmp/mudd/model.safetensors
[ -f "$M" ] && [ -f "$C" ] && [ -f "$L" ] && [ -f "$HC" ] && [ -f "$MUDD" ] || { echo "FAIL flags_setup: could not train the tiny model"; echo "0 passed, 1 failed"; exit 1; }
T="--task text --text-file $tmp/short.txt"
A="--train-size 300 --test-size 20"     # a small arithmetic task: quick to generate
LONG_PROMPT="$(printf '1 + %.0s' $(seq 40))1 ="

mkdir "$tmp/cwd"
bad() {  # name, key word of the message (grep -i), then the arguments of ./lime
    local name=$1 word=$2; shift 2
    local out status
    out=$(cd "$tmp/cwd" && "$LIME" "$@" 2>&1); status=$?
    if [ $status -ne 2 ]; then fail "$name" "exit status $status, want 2: $out"
    elif [ "$(echo "$out" | wc -l)" -ne 1 ]; then fail "$name" "not one line: $out"
    elif ! echo "$out" | grep -qi -- "$word"; then fail "$name" "message lacks '$word': $out"
    elif [ -n "$(ls -A "$tmp/cwd")" ]; then fail "$name" "wrote $(ls -A "$tmp/cwd")"; rm -rf "${tmp:?}/cwd/"*
    else pass "$name"
    fi
}

# --- train: one flag out of range or malformed
bad train_batch_zero          "out of range"       train $A --batch 0
bad train_batch_huge          "out of range"       train $A --batch 100000000
bad train_batch_no_memory     "out of memory"      train $A --batch 1000000
# (the GPU's launch limits, 65535 sequences and the router's shared memory, refuse only GPU runs:
# tests/test_model.cpp's model_create_* tests; a CPU run of those shapes is made)
bad train_steps_zero          "out of range"       train $A --steps 0
bad train_steps_fraction      "not an integer"     train $A --steps 1.5
bad train_lr_negative         "out of range"       train $A --lr -1
bad train_lr_nan              "not a number"       train $A --lr nan
bad train_lr_huge             "out of range"       train $A --lr 1e30
bad train_grad_clip_negative  "out of range"       train $A --grad-clip -1
bad train_min_lr_ratio        "out of range"       train $A --min-lr-ratio 2
bad train_schedule            "linear|cosine"      train $A --schedule step
bad train_arch                "not a registered model" train $A --arch gpt
bad train_device              "auto|cpu|gpu"       train $A --device tpu
bad train_attention           "auto|matmul|flash"  train $A --attention paged
bad train_layers_zero         "out of range"       train $A --layers 0
bad train_threads_negative    "out of range"       train $A --threads -1
bad train_log_every_zero      "out of range"       train $A --log-every 0
bad train_eval_size_zero      "out of range"       train $A --eval-size 0
bad train_stop_after_negative "out of range"       train $A --stop-after -1
bad train_out_empty           "needs a directory"  train $A --out ""
bad train_switch_with_value   "takes no value"     train $A --skip-bad-steps=1
bad train_positional          "unexpected"         train $A 100
bad train_kv_heads            "divisible"          train $A --heads 4 --kv-heads 3
bad train_router_bogus        "not one of"         train $A --router bogus
bad train_router_last_zero    "J must be 1 .. 4"   train $A --router last-0
bad train_router_first_past_L "J must be 1 .. 2"   train $A --layers 2 --router first-3
bad train_router_on_llama     "for --arch lime"    train $A --arch llama --router average
bad train_router_kv_on_llama  "for --arch lime"    train $A --arch llama --router-kv separate
bad train_router_on_resformer "resformer has no router" train $A --arch resformer --router last-2
bad train_router_kv_on_denseformer "denseformer has no router" train $A --arch denseformer --router-kv separate
bad train_router_on_dca       "dca has no router" train $A --arch dca --router average
bad compare_dca_router_variant "dca takes no variant" compare --preset tiny --archs llama,dca:last-2
bad train_router_heads_on_llama "--router-heads is for --arch lime" train $A --arch llama --router-heads same
bad train_router_heads_average "--router average's weights are fixed" train $A --router average --router-heads same
# an ablation that selects every weight at the run's shape is lime itself (issue 61, class 4)
bad train_same_head_one_kv_head "--kv-heads 2 or more" train $A --router-heads same --kv-heads 1
bad train_last_J_every_layer  "last-2 (--router last-2) with 2 layers reads every layer" train $A --layers 2 --router last-2
bad train_first_J_every_layer "first-1 (--router first-1) with 3 layers reads every layer" train $A --layers 3 --router first-1
bad train_router_kv_bogus     "shared|separate"    train $A --router-kv both
bad train_hc_rate_zero        "out of range"       train $A --arch hc --hc-rate 0
bad train_hc_rate_negative    "out of range"       train $A --arch hc --hc-rate -2
bad train_hc_rate_past_16     "use 1 .. 16"        train $A --arch hc --hc-rate 17
bad train_hc_rate_on_llama    "for --arch hc"      train $A --arch llama --hc-rate 2
bad train_hc_dynamic_on_lime  "for --arch hc"      train $A --arch lime --hc-dynamic 0
bad train_hc_dynamic_bogus    "0|1"                train $A --arch hc --hc-dynamic yes
bad train_router_on_hc        "hc has no router"   train $A --arch hc --router average
bad train_mudd_ways_on_llama  "for --arch muddformer" train $A --arch llama --mudd-ways kv
bad train_mudd_ways_bogus     "qkvr|kv"            train $A --arch muddformer --mudd-ways qkv
bad train_router_on_muddformer "muddformer has no router" train $A --arch muddformer --router average
bad train_router_kv_on_mudd_kv "muddformer has no router" train $A --arch muddformer --mudd-ways kv --router-kv separate
bad train_resume_mudd_kv_as_qkvr "different model" train --resume "$tmp/mudd/checkpoint.safetensors" --arch muddformer --mudd-ways qkvr --out "$tmp/cwd/x"
bad compare_mudd_ways_in_train_args "use --archs muddformer:kv" compare --preset tiny --archs llama,muddformer --train-args "--mudd-ways kv"
bad compare_mudd_kv_router    "use --archs lime:VARIANT" compare --preset tiny --archs llama,muddformer:kv --train-args "--router average"
bad compare_archs_mudd_bogus  "muddformer:kv"      compare --preset tiny --archs llama,muddformer:n2
bad export_muddformer         "muddformer checkpoint (MUDDFormer" export --load "$MUDD" --out hf
bad train_resume_other_hc_rate "different model"   train --resume "$tmp/hc/checkpoint.safetensors" --arch hc --hc-rate 3 --out "$tmp/cwd/x"
# a resumed run's typed shape flag is named, never one the checkpoint brought (hc's --hc-rate)
bad train_resume_hc_as_lime   "than --arch lime describes; drop --arch" train --resume "$tmp/hc/checkpoint.safetensors" --arch lime --out "$tmp/cwd/x"
bad train_resume_lime_as_hc   "its --arch lime) than --arch hc" train --resume "$C" --arch hc --out "$tmp/cwd/x"
# --- train: flags that do not go together
bad train_warmup_past_steps   "warmup"             train $A --steps 10 --warmup 100
bad train_steps_and_epochs    "one of them"        train $A --steps 10 --epochs 2
bad train_epochs_overflow     "more than a run may take" train --train-size 65536 --batch 1 --epochs 65536
bad train_out_holds_run       "resume it with"     train $A --out "$tmp/run"
bad train_seq_len_on_arith    "is for --task text" train $A --seq-len 64
bad train_ops_on_text         "is for --task arith" train $T --ops 3
bad train_val_frac_zero       "val-frac 0"         train $T --val-frac 0
bad train_val_frac_high       "out of range"       train $T --val-frac 0.95
bad train_seq_len_vs_file     "fewer than"         train $T --seq-len 2000
bad train_text_file_missing   "cannot open"        train --task text --text-file "$tmp/nope.txt"
bad train_resume_missing      "no such file"       train --resume "$tmp/nope.safetensors"
bad train_resume_final_model  "resuming needs"     train --resume "$M" --out "$tmp/cwd/x"
bad train_resume_other_shape  "different model"    train --resume "$C" --dim 32 --out "$tmp/cwd/x"
bad train_resume_other_task   "keeps its task"     train --resume "$C" --ops 3 --out "$tmp/cwd/x"
bad train_resume_steps_below  "below step 2"       train --resume "$C" --steps 1 --out "$tmp/cwd/x"
bad train_resume_into_other_run "another checkpoint" train --resume "$C" --out "$tmp/run2"
bad train_resume_other_seed   "keeps the seed"     train --resume "$C" --seed 2 --out "$tmp/cwd/x"
# --- train: what the first save would refuse is refused at the start, nothing written
cp "$tmp/short.txt" "$tmp/t"$'\xff'".txt"
bad train_out_not_utf8        "not UTF-8"          train $A --steps 2 --out $'r\xff'
bad train_text_file_not_utf8  "not UTF-8"          train --task text --text-file "$tmp/t"$'\xff'".txt" --seq-len 8 --steps 2 --out r
long=$(printf 'a%.0s' $(seq 250))
bad train_out_too_long        "choose a shorter --out" train $A --steps 2 --out "$(printf "$long/%.0s" $(seq 16))$(printf 'b%.0s' $(seq 54))"
mkdir -p "$tmp/dirck/checkpoint.safetensors"
bad train_out_name_is_a_dir   "where a run writes its own file" train $A --steps 2 --out "$tmp/dirck" --force
printf '#!/bin/sh\nulimit -n 4; exec "%s" "$@"\n' "$LIME" > "$tmp/lime_n4"; chmod +x "$tmp/lime_n4"
# (not under the sanitizers: with 4 descriptors ASan's log_path reports spin, the run never ends)
case "$LIME" in *asan*) echo "SKIP train_few_descriptors: ASan needs descriptors of its own" ;;
*) LIME=$tmp/lime_n4 bad train_few_descriptors "file descriptors" train $A --steps 2 --out "$tmp/n4" ;; esac
# a data file changed under a run: resuming it is refused, its checkpoint kept
cp "$tmp/short.txt" "$tmp/chg.txt"
$LIME train --task text --text-file "$tmp/chg.txt" --seq-len 8 --layers 1 --dim 16 --heads 2 --ffn 16 --batch 4 --steps 4 \
    --stop-after 1 --threads 1 --quiet --out "$tmp/chg" >/dev/null 2>&1
echo "one more line" >> "$tmp/chg.txt"
bad train_resume_changed_data "restore it to go on" train --resume "$tmp/chg/checkpoint.safetensors"
# --- sample
bad sample_no_prompt          "needs --prompt"     sample --load "$M"
bad sample_empty_prompt       "empty"              sample --load "$M" --prompt ""
bad sample_long_prompt        "at most"            sample --load "$M" --prompt "$LONG_PROMPT"
bad sample_temperature_neg    "out of range"       sample --load "$M" --prompt "1 =" --temperature -1
bad sample_temperature_inf    "not a number"       sample --load "$M" --prompt "1 =" --temperature inf
bad sample_max_new_zero       "out of range"       sample --load "$M" --prompt "1 =" --max-new 0
bad sample_prompt_eos         "special token"      sample --load "$M" --prompt "3 + 4 <eos>"
# --- eval
bad eval_no_load              "needs --load"       eval
bad eval_n_negative           "out of range"       eval --load "$M" --n -1
bad eval_batch_zero           "out of range"       eval --load "$M" --batch 0
bad eval_reference_file       "no \"checksum\""    eval --load "$PWD/tests/golden/lime_tiny.safetensors"
bad sample_reference_file     "no \"checksum\""    sample --load "$PWD/tests/golden/lime_tiny.safetensors" --prompt "1 ="
bad train_resume_reference    "no \"checksum\""    train --resume "$PWD/tests/golden/lime_tiny.safetensors" --out "$tmp/cwd/x"
# --- data
bad data_n_negative           "out of range"       data $A --n -1
bad data_split                "train|test"         data $A --split valid
bad data_modulus_not_prime    "not prime"          data $A --modulus 12
bad data_ops_zero             "out of range"       data $A --ops 0
bad data_text_without_file    "text-file"          data --task text
bad data_format_on_text       "is for --task arith" data $T --format chain
# --- verify, bench
bad verify_tf32               "out of range"       verify --tf32 2 "$PWD/tests/golden/lime_tiny.safetensors"
bad verify_tf32_on_the_cpu    "--tf32 1 is for the GPU" verify --tf32 1 "$PWD/tests/golden/lime_tiny.safetensors"
bad verify_tf32_device_cpu    "add --device gpu"   verify --device cpu --tf32 1 "$PWD/tests/golden/llama_tiny.safetensors"
bad bench_steps_zero          "out of range"       bench --steps 0
bad bench_attention           "auto|matmul|flash"  bench --attention 1 --steps 1
bad bench_no_memory           "out of memory"      bench --batch 1000000 --steps 1
bad bench_models_unknown       "not a model bench times" bench --models lime,gpt --steps 1
bad bench_models_twice        "listed twice"       bench --models hc,hc --steps 1
bad bench_router_last_zero    "J must be"          bench --router last-0 --steps 1
bad bench_params_no_memory    "lower --dim"        bench --layers 1 --dim 65536 --heads 2 --ffn 35000 --batch 1 --seq-len 1 --steps 1
bad bench_vocab_no_memory     "--vocab"            bench --vocab 16777216 --dim 4096 --heads 2 --batch 1 --seq-len 1 --steps 1
# --- compare
bad compare_archs_variant     "the models are llama, lime" compare --preset tiny --archs llama,lime:last-x
bad compare_archs_llama_variant "llama takes no variant" compare --preset tiny --archs llama:average,lime
bad compare_tiers_repeated    "tier 2 twice"       compare --preset tiny --tiers 2,2
bad compare_archs_repeated    "lime twice"         compare --preset tiny --archs lime,llama,lime:static
bad compare_tiers_empty       "tiers is empty"     compare --preset tiny --tiers ""
bad compare_archs_empty       "archs is empty"     compare --preset tiny --archs ""
bad compare_seeds_empty       "not an integer"     compare --preset tiny --seeds ""
bad compare_variant_past_L    "J must be 1 .. 2"   compare --preset tiny --archs llama,lime:last-3
bad compare_resformer_variant "resformer takes no variant" compare --preset tiny --archs llama,resformer:same-head
bad compare_denseformer_variant "denseformer takes no variant" compare --preset tiny --archs llama,denseformer:n2
bad compare_variant_layers    "J must be 1 .. 1"   compare --preset tiny --archs llama,lime:first-2 --train-args "--layers 1"
bad compare_same_head_one_kv_head "'lime:same-head' at the runs' 2 layers and 1 kv head:" compare --preset tiny --archs lime,lime:same-head --train-args "--kv-heads 1"
bad compare_first_J_every_layer "'lime:first-1' at the runs' 2 layers" compare --preset tiny --archs llama,lime:first-1
bad compare_steps_and_epochs  "one of them"        compare --preset tiny --train-args "--steps 5 --epochs 2"
# --- export (a llama checkpoint only; --out relative: a refused export leaves no directory behind)
cp "$L" "$tmp/damaged.safetensors"
printf '\x7f' | dd of="$tmp/damaged.safetensors" bs=1 seek=$(($(stat -c %s "$L") - 4)) conv=notrunc 2>/dev/null
bad export_no_load            "needs --load"       export --out hf
bad export_no_out             "needs --out"        export --load "$L"
bad export_lime               "lime checkpoint (LIMe"      export --load "$M" --out hf
bad export_missing            "cannot open"        export --load "$tmp/nope.safetensors" --out hf
bad export_damaged            "checksum does not match" export --load "$tmp/damaged.safetensors" --out hf
bad export_no_vocabulary      "no vocabulary"      export --load "$PWD/tests/golden/llama_tiny.safetensors" --out hf
bad export_out_not_empty      "add --force"        export --load "$L" --out "$tmp/run"
bad export_out_is_a_file      "not a directory"    export --load "$L" --out "$M"
bad export_force_over_a_run   "written by ./lime train" export --load "$L" --out "$tmp/run" --force
bad compare_archs_unknown     "is not a model: the models are llama, lime, hc" compare --preset tiny --archs llama,gpt
bad compare_archs_hc_n0       "hc-rate 0"          compare --preset tiny --archs llama,hc:n0
bad compare_archs_hc_n17      "hc-rate 17"         compare --preset tiny --archs llama,hc:n17
bad compare_archs_hc_bogus    "hc:nN"              compare --preset tiny --archs llama,hc:fast
bad compare_archs_hc_repeated "hc twice"           compare --preset tiny --archs llama,hc,hc:n4:dynamic
bad export_hc                 "hc checkpoint (Hyper-Connections"        export --load "$HC" --out hf
bad analyze_routed_hc         "no router"          analyze --load "$HC" --values routed --out out
bad compare_archs_frozen_llama "llama takes no variant"      compare --preset tiny --archs llama:frozen,lime
bad compare_ereg_no_number    ":ereg=LAMBDA"       compare --preset tiny --archs llama,llama:ereg=
bad compare_ereg_bad_number   ":ereg=LAMBDA"       compare --preset tiny --archs llama,llama:ereg=0.1x
bad compare_ereg_negative     ":ereg=LAMBDA"       compare --preset tiny --archs llama,lime:frozen:ereg=-1
bad compare_ereg_nan          ":ereg=LAMBDA"       compare --preset tiny --archs llama,llama:ereg=nan
bad compare_ereg_twice        "twice"              compare --preset tiny --archs llama:ereg=0.1,llama:ereg=0.10
bad train_entropy_reg_negative "out of range"      train $A --entropy-reg -0.5
bad train_curve_and_eval_every "drop --eval-every" train $A --curve 25 --eval-every 5
bad train_curve_negative      "out of range"       train $A --curve -1
bad train_entropy_reg_nan     "not a number"       train $A --entropy-reg nan
bad train_entropy_reg_inf     "not a number"       train $A --entropy-reg inf
bad train_entropy_reg_empty   "not a number"       train $A --entropy-reg ""
bad compare_tiers_not_arith   "is for --task arith" compare --preset tiny --task prosqa --tiers 2
bad compare_flag_other_task   "another task"       compare --preset tiny --task prosqa --train-args "--modulus 7"
bad compare_text_needs_file   "text-file"          compare --preset tiny --task text
bad compare_alpha_zero        "must be positive"   compare --preset tiny --alpha 0
# learning speed: the threshold lies above chance (1/11 = 9.09%) and at most 100%; --lr-grid's rates are
# positive, finite and each given once, its tuning seeds never evaluation seeds; all before any run
bad compare_threshold_chance  "above chance"       compare --preset tiny --threshold 9
bad compare_threshold_over    "above chance"       compare --preset tiny --threshold 100.5
bad compare_threshold_word    "above chance"       compare --preset tiny --threshold half
bad compare_threshold_nan     "above chance"       compare --preset tiny --threshold nan
bad compare_threshold_text    "has not"            compare --preset tiny --task text --threshold 50 --train-args "--text-file README.md"
bad compare_lr_grid_zero      "not a learning rate" compare --preset tiny --lr-grid 0,1e-3
bad compare_lr_grid_negative  "not a learning rate" compare --preset tiny --lr-grid 1e-3,-2e-3
bad compare_lr_grid_inf       "not a learning rate" compare --preset tiny --lr-grid 1e-3,inf
bad compare_lr_grid_nan       "not a learning rate" compare --preset tiny --lr-grid nan
bad compare_lr_grid_repeated  "twice"              compare --preset tiny --lr-grid 1e-3,2e-3,0.001
bad compare_lr_grid_hole      "empty rate"         compare --preset tiny --lr-grid 1e-3,,2e-3
bad compare_lr_grid_and_lr    "drop one"           compare --preset tiny --lr-grid 1e-3,2e-3 --train-args "--lr 1e-3"
bad compare_tuning_overlap    "evaluation seed"    compare --preset tiny --lr-grid 1e-3,2e-3 --tuning-seeds 101,2
bad compare_tuning_overlap_seeds "evaluation seed" compare --preset tiny --seeds 120 --lr-grid 1e-3,2e-3
bad compare_tuning_repeated   "twice"              compare --preset tiny --lr-grid 1e-3,2e-3 --tuning-seeds 101,101
bad compare_tuning_no_grid    "is for --lr-grid"   compare --preset tiny --tuning-seeds 101
bad compare_train_args_layers "--train-args: --layers" compare --preset tiny --train-args "--layers abc"
bad compare_train_args_stop_after "--train-args gives --stop-after" compare --preset tiny --train-args "--stop-after 3"
bad compare_train_args_resume "--train-args gives --resume" compare --preset tiny --train-args "--resume $C"
bad compare_train_args_seed   "compare sets it"    compare --preset tiny --train-args "--seed 3"
# the flags compare sets per model, refused with the --archs spelling that gives them (no run started)
bad compare_train_args_entropy_reg "archs llama:ereg=0.5" compare --preset tiny --train-args "--steps 30 --entropy-reg 0.5"
bad compare_train_args_hc_rate "archs llama,hc:n2"  compare --preset tiny --train-args "--hc-rate 2"
bad compare_train_args_hc_dynamic "archs hc:static" compare --preset tiny --train-args "--hc-dynamic=0"
# --train-args: each word a flag of ./lime train with its value, split as the shell would
bad compare_train_args_unknown "not a flag of ./lime train" compare --preset tiny --train-args "--frobnicate 3"
bad compare_train_args_no_value "--lr needs a value" compare --preset tiny --train-args "--steps 3 --lr"
bad compare_train_args_twice  "--lr twice"         compare --preset tiny --train-args "--lr 1e-3 --lr 2e-3"
bad compare_train_args_loose_word "'notes.txt' is not a flag" compare --preset tiny --train-args "--lr 1e-3 notes.txt"
bad compare_train_args_open_quote "is never closed" compare --preset tiny --task text --train-args "--text-file 'my notes.txt"
bad compare_train_args_switch_value "takes no value" compare --preset tiny --train-args "--skip-bad-steps=1"
# a lambda that is 0, or that float32 loses, names no regularised model
bad compare_ereg_zero         "is the plain model: write llama" compare --preset tiny --archs llama:ereg=0,lime
bad compare_ereg_float32_zero "0 in float32"       compare --preset tiny --archs llama:ereg=1e-46,lime
bad train_entropy_reg_float32_zero "0 in float32"  train $A --entropy-reg 1e-46
bad bench_entropy_reg_float32_zero "0 in float32"  bench --entropy-reg 1e-46 --steps 1
# --- analyze
bad analyze_alpha_zero        "must be positive"   analyze --load "$M" --alpha 0 --out out
bad analyze_values            "raw|routed|both"    analyze --load "$M" --values all --out out
bad analyze_routed_no_router  "no router"          analyze --load "$tmp/llama/model.safetensors" --values routed --out out
bad train_router_weights_llama "for --arch lime"   train $A --arch llama --router-weights frozen
# --- user text echoed in a message stays on one line, control characters escaped
bad flag_value_newline        "not an integer"     train $A --batch $'1\n2'
bad flag_value_escape         'gp\\x1bt'           train $A --arch $'gp\x1bt'
bad file_name_newline         'nope\\n.txt'        train --task text --text-file "$tmp/nope"$'\n'.txt

# A model too big for the memory there is: refused at once, before anything is
# allocated, naming flags that shrink its parameters, not the batch.
start=$(date +%s%N)
out=$(cd "$tmp/cwd" && "$LIME" bench --layers 16 --dim 10240 --heads 2 --ffn 35000 --batch 1 --seq-len 1 --steps 1 2>&1)
status=$?
ms=$((($(date +%s%N) - start) / 1000000))
check bench_too_big_refused_at_once
expect "exit $status, want 2" [ $status -eq 2 ]
expect "it does not say out of memory and to lower --dim" has "$out" "out of memory: .*; lower .*--dim"
expect "it names --batch, which does not shrink the parameters" not has "$out" -- "--batch"
expect "refused after $ms ms, want within 1 s" [ $ms -lt 1000 ]
verdict "$out"

# --- inputs that are not regular files, or that ask for too much: refused at once, one line.
# Run under a timeout (10 s: a FIFO used to block forever, /dev/zero to read until memory ran out,
# --train-size 10000000 to give up after 8 minutes).
printf '#!/bin/sh\nexec timeout 10 "%s" "$@"\n' "$LIME" > "$tmp/lime_t"; chmod +x "$tmp/lime_t"
mkfifo "$tmp/fifo"
echo '[]' > "$tmp/empty.json"
# ProsQA items: Tom -> c1 -> ... -> cN (the answer cN), Bob -> zhoolpus (the other choice)
prosqa_item() {  # N: the path's length
    local words=() w on vo co
    for on in b br ch d f g gr gw h j k l n; do for vo in e i o u oo; do for co in m r l; do words+=("$on$vo${co}pus"); done; done; done
    local n=$1 q="Tom is a ${words[0]}." steps="\"Tom is a ${words[0]}.\"" edges="[0, 1]" syms="\"Tom\""
    for ((w = 1; w < n; w++)); do
        q+=" Every ${words[w-1]} is a ${words[w]}."; steps+=", \"Every ${words[w-1]} is a ${words[w]}.\""; edges+=", [$w, $((w + 1))]"
    done
    for ((w = 0; w < n; w++)); do syms+=", \"${words[w]}\""; done
    printf '{"question": "%s Bob is a zhoolpus. Is Tom a %s or zhoolpus?", "answer": "Tom is a %s.", "steps": [%s], ' \
        "$q" "${words[n-1]}" "${words[n-1]}" "$steps"
    printf '"edges": [%s, [%d, %d]], "idx_to_symbol": [%s, "Bob", "zhoolpus"], "root": 0, "target": %d, "neg_target": %d}' \
        "$edges" $((n + 1)) $((n + 2)) "$syms" "$n" $((n + 2))
}
echo "[$(prosqa_item 1)]" > "$tmp/pq.json"
echo "[$(prosqa_item 1), $(prosqa_item 2 | sed 's/"target": 2/"target": 4/')]" > "$tmp/pq_bad.json"
$LIME train --task prosqa --prosqa-test "$tmp/pq.json" --train-size 8 --layers 1 --dim 16 --heads 2 --ffn 32 --batch 8 \
    --steps 1 --threads 1 --quiet --out "$tmp/pq" >/dev/null 2>&1 || echo "FAIL flags_setup_prosqa: could not train on $tmp/pq.json"
# the test file gains an item longer than any the model was trained on: eval must not run past its T
echo "[$(prosqa_item 1), $(prosqa_item 120)]" > "$tmp/pq.json"
LIME=$tmp/lime_t bad data_text_file_directory  "is a directory"     data --task text --text-file "$tmp"
LIME=$tmp/lime_t bad data_text_file_dev_zero   "character device"   data --task text --text-file /dev/zero
LIME=$tmp/lime_t bad train_text_file_fifo      "FIFO"               train --task text --text-file "$tmp/fifo"
LIME=$tmp/lime_t bad train_resume_fifo         "FIFO"               train --resume "$tmp/fifo"
LIME=$tmp/lime_t bad eval_load_directory       "is a directory"     eval --load "$tmp"
LIME=$tmp/lime_t bad data_prosqa_empty_list    "empty list"         data --task prosqa --prosqa-test "$tmp/empty.json"
LIME=$tmp/lime_t bad data_prosqa_bad_item      "item 1: the root does not reach" data --task prosqa --prosqa-test "$tmp/pq_bad.json"
LIME=$tmp/lime_t bad eval_prosqa_longer_than_T "longer than"        eval --load "$tmp/pq/model.safetensors"
LIME=$tmp/lime_t bad data_train_size_too_many  "distinct questions" data --train-size 10000000
LIME=$tmp/lime_t bad train_train_size_too_many "distinct questions" train --ops 1 --train-size 1000
LIME=$tmp/lime_t bad train_prosqa_size_too_many "out of range"      train --task prosqa --train-size 2000000
LIME=$tmp/lime_t bad train_threads_too_many    "cores"              train $A --threads 1024
# --- files whose sizes would take far more memory than they hold (ulimit -v: an allocation
# that slips past the checks would end in std::bad_alloc, exit 134): one line each
printf '#!/bin/sh\nulimit -v 1500000; exec timeout 20 "%s" "$@"\n' "$LIME" > "$tmp/lime_v"; chmod +x "$tmp/lime_v"
le64() { local n=$1 i; for i in 0 1 2 3 4 5 6 7; do printf "\\$(printf %03o $(( (n >> (8 * i)) & 255 )))"; done; }
{ le64 30000003; printf '['; yes '0,' | tr -d '\n' | head -c 30000000; printf '0]'; } > "$tmp/zeros.safetensors"
# (not under the sanitizers: ASan's shadow memory does not fit the ulimit -v this row sets)
case "$LIME" in *asan*) echo "SKIP eval_header_of_zeros: ASan cannot run under its ulimit -v" ;;
*) LIME=$tmp/lime_v bad eval_header_of_zeros      "more than 4194304 values" eval --load "$tmp/zeros.safetensors" ;; esac
rm -f "$tmp/zeros.safetensors"
# a ProsQA file with a non-UTF-8 name, and one whose words are not ASCII (UTF-8, whole words)
echo "[$(prosqa_item 1)]" > "$tmp/pq"$'\xff'".json"
LIME=$tmp/lime_t bad train_prosqa_test_not_utf8 "not UTF-8"       train --task prosqa --prosqa-test "$tmp/pq"$'\xff'".json" --train-size 8 --steps 1 --out r
echo "[$(prosqa_item 2 | sed 's/Tom/Tém/g')]" > "$tmp/pq_e.json"
out=$("$LIME" train --task prosqa --prosqa-test "$tmp/pq_e.json" --train-size 8 --layers 1 --dim 16 --heads 2 --ffn 32 --batch 8 \
      --steps 2 --threads 1 --quiet --out "$tmp/pq_e" 2>&1) && "$LIME" eval --load "$tmp/pq_e/model.safetensors" >/dev/null 2>&1
status=$?
if [ $status -eq 0 ]; then pass prosqa_non_ascii_words_train; else fail prosqa_non_ascii_words_train "exit $status: $out"; fi

# Every help text that lists models names every registered model: the rows of
# support/study/registry.cuh, read from the source (not from a help text).
models=$(sed -n '/model_registry() {/,/^}/s/^        {"\([a-z][a-z0-9_-]*\)", ".*/\1/p' support/study/registry.cuh)
[ "$(echo "$models" | wc -l)" -ge 5 ] || fail help_texts_name_every_model "read $(echo "$models" | wc -w) models from registry.cuh"
for cmd in "" train eval bench compare export; do
    help=$($LIME $cmd --help 2>&1)
    missing=""
    for m in $models; do grep -qw -- "$m" <<<"$help" || missing+=" $m"; done
    if [ -z "$missing" ]; then pass "help_names_every_model_${cmd:-main}"
    else fail "help_names_every_model_${cmd:-main}" "./lime $cmd --help does not name:$missing"; fi
done
# An unknown model anywhere: one line listing the registered models, from the registry.
bad train_arch_lists_models   "the models: llama, lime, hc, resformer, denseformer" train $A --arch gpt
bad bench_models_lists_models "list some of lime,hc,resformer,denseformer" bench --models gpt --steps 1

summary
