#!/usr/bin/env bash
# tests/test_cli.sh — ./lime end to end, as a user runs it: the reference
# vectors, a tiny training run with eval and sample, resume bit for bit, and
# bad input (each refused with one clear line and a non-zero exit, no crash).
cd "$(dirname "$0")/.." || exit 2
source tests/lib.sh

TINY="--layers 2 --dim 16 --heads 2 --ffn 32 --ops 2 --train-size 300 --test-size 20 --batch 16 --threads 2 --quiet"

# --- the reference vectors of docs/checkpoint.md
if out=$($LIME verify --quiet tests/golden/*.safetensors 2>&1) && echo "$out" | grep -q ", 0 failed"; then
    pass verify_golden_cpu
else
    fail verify_golden_cpu "$(echo "$out" | tail -5)"
fi
# The same vectors through lime.cu's plain loops alone (make lime-ref), and
# through the GPU kernels on the CUDA-on-CPU harness, in exact float32 (once:
# not again when the sanitizer suite reruns this file on its own build).
[ "$LIME" = ./lime ] && others=("./lime-ref verify" "./lime-emu verify --device gpu --tf32 0") || others=()
for run in "${others[@]}"; do
    name=verify_golden_$(echo "$run" | awk '{print $1}' | tr -d './' | tr - _)
    if [ ! -x "${run%% *}" ]; then fail "$name" "${run%% *} is not built (make test builds it)"; continue; fi
    if out=$($run --quiet tests/golden/*.safetensors 2>&1) && echo "$out" | grep -q ", 0 failed"; then pass "$name"
    else fail "$name" "$(echo "$out" | tail -5)"; fi
done

# --- data: one example per line, as the model sees it
out=$($LIME data --task arith --ops 3 --split train --n 5 2>&1)
lines=$(echo "$out" | grep -c '<eos>$')
if [ "$lines" -eq 5 ] && echo "$out" | head -1 | grep -q ' = '; then pass data_prints_examples; else fail data_prints_examples "$out"; fi

# --- a tiny run end to end
if $LIME train $TINY --arch lime --steps 30 --out "$tmp/run" >"$tmp/train.out" 2>&1 && [ -f "$tmp/run/model.safetensors" ]; then
    pass train_writes_model
else
    fail train_writes_model "$(tail -3 "$tmp/train.out")"
fi
if grep -q '"type": "train"' "$tmp/run/log.jsonl" 2>/dev/null && grep -q '"type": "done"' "$tmp/run/log.jsonl"; then
    pass train_writes_jsonl_log
else
    fail train_writes_jsonl_log "no train/done lines in log.jsonl"
fi
out=$($LIME eval --load "$tmp/run/model.safetensors" --json 2>&1)
if echo "$out" | grep -q '"accuracy": ' && echo "$out" | grep -q '"arch": "lime"'; then pass eval_json; else fail eval_json "$out"; fi
out=$($LIME sample --load "$tmp/run/model.safetensors" --prompt "3 + 4 * 2 =" --max-new 5 2>&1)
if [ $? -eq 0 ] && [ -n "$(echo "$out" | tail -1)" ]; then pass sample_prints_continuation; else fail sample_prints_continuation "$out"; fi

# --- export: a llama checkpoint as a transformers directory; the same files from a second export
files="config.json generation_config.json model.safetensors special_tokens_map.json tokenizer.json tokenizer_config.json"
if $LIME train $TINY --arch llama --steps 2 --out "$tmp/llama" >/dev/null 2>&1 &&
    $LIME export --load "$tmp/llama/model.safetensors" --out "$tmp/hf" >"$tmp/export.out" 2>&1 &&
    $LIME export --load "$tmp/llama/model.safetensors" --out "$tmp/hf2" >/dev/null 2>&1 &&
    [ "$(LC_ALL=C ls "$tmp/hf" | tr '\n' ' ')" == "$files " ] && diff -r "$tmp/hf" "$tmp/hf2" >/dev/null &&
    grep -q '"model_type": "llama"' "$tmp/hf/config.json" && [ -z "$(ls -d "$tmp"/hf.tmp-* 2>/dev/null)" ]; then
    pass export_writes_transformers_directory
else
    fail export_writes_transformers_directory "$(cat "$tmp/export.out"; ls "$tmp/hf" 2>&1)"
fi

# --- ProsQA (docs/tasks.md §2): generated training graphs, the real test file, exact-match scoring
if $LIME train --task prosqa --train-size 64 --test-size 2 --layers 1 --dim 16 --heads 2 --ffn 32 --batch 8 --steps 3 --threads 2 \
        --quiet --out "$tmp/prosqa" >"$tmp/prosqa.out" 2>&1 &&
    $LIME eval --load "$tmp/prosqa/model.safetensors" --json 2>&1 | grep -q '"task": "prosqa".*"n": 2'; then
    pass prosqa_trains_and_scores
else
    fail prosqa_trains_and_scores "$(tail -3 "$tmp/prosqa.out")"
fi

# --- compare and analyze: a tiny study end to end, its report and figures
# (with the frozen-router control: its own paired line, its config says so; every run analysed)
if $LIME compare --preset tiny --archs llama,lime,lime:frozen --out "$tmp/study" >"$tmp/study.out" 2>&1 &&
    grep -q "## Paired differences" "$tmp/study/report.md" && grep -q "^| lime:frozen − lime | 2 |" "$tmp/study/report.md" &&
    grep -q "^| attended | 1 |" "$tmp/study/report.md" && [ -s "$tmp/study/entropy_hidden_tier2.png" ] &&
    grep -q '"router_frozen": true' "$tmp/study/tier2/lime-frozen-seed1/log.jsonl" &&
    [ "$(grep -c -E '^(raw|routed|hidden)	[01]	' "$tmp/study/tier2/lime-seed2/entropy.tsv")" -eq 6 ] &&
    [ -s "$tmp/study/accuracy.png" ] && [ "$(head -c 4 "$tmp/study/accuracy.png" | tail -c 3)" == "PNG" ]; then
    pass compare_tiny_writes_report_and_figures
else
    fail compare_tiny_writes_report_and_figures "$(tail -3 "$tmp/study.out")"
fi
# --reuse: the finished, analysed runs of the same flags are read, not rerun (a report on fewer seeds)
if $LIME compare --preset tiny --archs llama,lime,lime:frozen --seeds 1 --reuse --out "$tmp/study" >"$tmp/reuse.out" 2>&1 &&
    grep -q "3 of 3 runs already done" "$tmp/reuse.out" && ! grep -q "^\[1/3\]" "$tmp/reuse.out" &&
    grep -q "^| tier 2 | lime:frozen | .* of 1 |" "$tmp/study/report.md"; then
    pass compare_reuse_reads_finished_runs
else
    fail compare_reuse_reads_finished_runs "$(tail -3 "$tmp/reuse.out")"
fi
# every task: ProsQA scored by exact match (here on the first 2 questions of the real test file:
# an untrained model's greedy answers run to the longest sequence, slow on all 500), text by
# validation loss and perplexity; 4 steps each, ProsQA's of 2 sequences (its steps of 16 took
# 5 s each under ASan)
head -c 3000 README.md > "$tmp/study_text.txt"
sed 's/}, {"question"/}\n{"question"/g' data/prosqa/prosqa_test.json | head -2 | sed '1s/^\[//' | paste -sd, |
    sed 's/^/[/; s/$/]/' > "$tmp/prosqa2.json"
if $LIME compare --preset tiny --seeds 1 --task prosqa --out "$tmp/study_prosqa" \
        --train-args "--prosqa-test $tmp/prosqa2.json --steps 4 --eval-every 4 --batch 2" >"$tmp/study_prosqa.out" 2>&1 &&
    grep -q '^| prosqa | lime |' "$tmp/study_prosqa/report.md" && grep -q '"task": "prosqa"' "$tmp/study_prosqa/prosqa/lime-seed1/log.jsonl" &&
    $LIME compare --preset tiny --seeds 1 --task text --train-args "--text-file $tmp/study_text.txt --steps 4 --eval-every 4" \
        --out "$tmp/study_text" >"$tmp/study_text.out" 2>&1 && grep -q "perplexity" "$tmp/study_text/report.md"; then
    pass compare_every_task
else
    fail compare_every_task "$(tail -3 "$tmp/study_prosqa.out" "$tmp/study_text.out" 2>&1)"
fi
if $LIME analyze --load "$tmp/run/model.safetensors" --out "$tmp/analysis" >"$tmp/analyze.out" 2>&1 &&
    grep -q "value entropy" "$tmp/analyze.out" && [ -s "$tmp/analysis/router_heatmap.png" ] && [ -s "$tmp/analysis/value_entropy.png" ] &&
    [ "$(grep -c -E '^(raw|routed|hidden)	' "$tmp/analysis/entropy.tsv")" -eq 6 ]; then  # 2 layers x 3 kinds
    pass analyze_writes_heatmap_and_entropy
else
    fail analyze_writes_heatmap_and_entropy "$(tail -3 "$tmp/analyze.out")"
fi

# compare's own help example: --train-args "--epochs N" replaces the preset's --steps
if $LIME compare --preset tiny --seeds 1 --archs lime --train-args "--epochs 1" --out "$tmp/epochs" >"$tmp/epochs.out" 2>&1 &&
    grep -q '"epochs": "1",.*"steps": "19"' "$tmp/epochs/tier2/lime-seed1/log.jsonl"; then  # 300 examples / batch 16
    pass compare_train_args_epochs_replace_steps
else
    fail compare_train_args_epochs_replace_steps "$(tail -3 "$tmp/epochs.out")"
fi

# --- the value-entropy regulariser: llama:ereg=L in compare, its log (ce and s2), its config, the report's
# scatter and table, its paired lines against llama and lime
if $LIME compare --preset tiny --archs llama,lime,llama:ereg=0.1 --out "$tmp/ereg" >"$tmp/ereg.out" 2>&1 &&
    grep -q "## Value entropy against accuracy" "$tmp/ereg/report.md" &&
    grep -q "^| llama:ereg=0.1 | 0.1 | 2 | [0-9]" "$tmp/ereg/report.md" &&
    grep -q "^| llama:ereg=0.1 − lime | 2 |" "$tmp/ereg/report.md" &&
    grep -q "^| llama:ereg=0.1 − llama | 2 |" "$tmp/ereg/report.md" &&
    [ "$(head -c 4 "$tmp/ereg/entropy_vs_accuracy_tier2.png" | tail -c 3)" == "PNG" ] &&
    grep -q '"entropy_reg": 0.1' "$tmp/ereg/tier2/llama-ereg=0.1-seed1/log.jsonl" &&
    grep -q '"type": "train".*"ce": [0-9.]*, "s2": [0-9.]*' "$tmp/ereg/tier2/llama-ereg=0.1-seed1/log.jsonl" &&
    ! grep -q '"s2"' "$tmp/ereg/tier2/llama-seed1/log.jsonl"; then
    pass compare_entropy_regulariser
else
    fail compare_entropy_regulariser "$(tail -3 "$tmp/ereg.out")"
fi
# --- router variants (paper Table 7) and separate key/value routers: train, the config they leave, analyze, compare
if $LIME train $TINY --router last-2 --router-kv separate --steps 5 --out "$tmp/variant" >"$tmp/variant.out" 2>&1 &&
    grep -q '"router": "last-2", "router_kv": "separate"' "$tmp/variant/log.jsonl" &&
    $LIME eval --load "$tmp/variant/model.safetensors" --json 2>&1 | grep -q '"model": "lime:last-2:separate"'; then
    pass train_router_variant
else
    fail train_router_variant "$(tail -3 "$tmp/variant.out")"
fi
if $LIME analyze --load "$tmp/variant/model.safetensors" --out "$tmp/variant_analysis" >"$tmp/variant_an.out" 2>&1 &&
    grep -q "lime:last-2:separate" "$tmp/variant_an.out" && [ -s "$tmp/variant_analysis/router_heatmap.png" ]; then
    pass analyze_router_variant
else
    fail analyze_router_variant "$(tail -3 "$tmp/variant_an.out")"
fi
if $LIME compare --preset tiny --seeds 1 --archs llama,lime:average,lime:first-1 --out "$tmp/variants" >"$tmp/variants.out" 2>&1 &&
    grep -q "| lime:average |" "$tmp/variants/report.md" && grep -q "| lime:first-1 |" "$tmp/variants/report.md" &&
    grep -q '"router": "average"' "$tmp/variants/tier2/lime-average-seed1/log.jsonl"; then
    pass compare_router_variants
else
    fail compare_router_variants "$(tail -3 "$tmp/variants.out")"
fi

# --- resume gives the same losses, bit for bit, as the uninterrupted run
$LIME train $TINY --steps 12 --log-every 1 --out "$tmp/full" >/dev/null 2>&1
$LIME train $TINY --steps 12 --log-every 1 --stop-after 5 --out "$tmp/part" >/dev/null 2>&1
$LIME train --resume "$tmp/part/checkpoint.safetensors" --quiet >/dev/null 2>&1
losses() { grep '"type": "train"' "$1" | sed 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/' | awk '$1 > 5'; }
a=$(losses "$tmp/full/log.jsonl"); b=$(losses "$tmp/part/log.jsonl")
if [ -n "$a" ] && [ "$a" == "$b" ] && [ "$(echo "$a" | wc -l)" -eq 7 ]; then
    pass resume_equals_uninterrupted
else
    fail resume_equals_uninterrupted "losses after step 5 differ: full [$a] resumed [$b]"
fi

# --- Hyper-Connections (--arch hc): train, eval, sample, analyze (its mixing weights' heatmap), resume bit for bit
HC="--arch hc --hc-rate 2"
if $LIME train $TINY $HC --steps 12 --log-every 1 --out "$tmp/hc" >"$tmp/hc.out" 2>&1 &&
    grep -q '"architecture": "hc", "hc_dynamic": true, "hc_rate": 2' "$tmp/hc/log.jsonl" &&
    $LIME eval --load "$tmp/hc/model.safetensors" --json 2>&1 | grep -q '"model": "hc:n2"' &&
    $LIME sample --load "$tmp/hc/model.safetensors" --prompt "3 + 4 * 2 =" --max-new 5 >/dev/null 2>&1; then
    pass hc_trains_evals_samples
else
    fail hc_trains_evals_samples "$(tail -3 "$tmp/hc.out")"
fi
if $LIME analyze --load "$tmp/hc/model.safetensors" --out "$tmp/hc_an" >"$tmp/hc_an.out" 2>&1 &&
    grep -q "hc static mixing weights" "$tmp/hc_an.out" && grep -q "^  layer 1 mlp " "$tmp/hc_an.out" &&
    [ -s "$tmp/hc_an/hc_heatmap.png" ] && grep -q "^hidden" "$tmp/hc_an/entropy.tsv" && [ ! -e "$tmp/hc_an/router_heatmap.png" ]; then
    pass analyze_hc_heatmap_and_entropy
else
    fail analyze_hc_heatmap_and_entropy "$(tail -3 "$tmp/hc_an.out")"
fi
$LIME train $TINY $HC --hc-dynamic 0 --steps 12 --log-every 1 --out "$tmp/hc_full" >/dev/null 2>&1
$LIME train $TINY $HC --hc-dynamic 0 --steps 12 --log-every 1 --stop-after 5 --out "$tmp/hc_part" >/dev/null 2>&1
$LIME train --resume "$tmp/hc_part/checkpoint.safetensors" --quiet >/dev/null 2>&1
a=$(losses "$tmp/hc_full/log.jsonl"); b=$(losses "$tmp/hc_part/log.jsonl")
if [ -n "$a" ] && [ "$a" == "$b" ] && [ "$(echo "$a" | wc -l)" -eq 7 ]; then
    pass hc_resume_equals_uninterrupted
else
    fail hc_resume_equals_uninterrupted "losses after step 5 differ: full [$a] resumed [$b]"
fi

# --- a checkpoint records the data files it was trained on: eval run from another directory
# finds the default ProsQA file (beside ./lime), and an edited text file gives one warning line
lime_abs=$(realpath "$LIME")
out=$(cd "$tmp" && "$lime_abs" eval --load "$tmp/prosqa/model.safetensors" --json 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -q '"task": "prosqa".*"n": 2'; then pass eval_prosqa_from_another_directory
else fail eval_prosqa_from_another_directory "$out"; fi
head -c 2000 README.md > "$tmp/data.txt"
$LIME train --task text --text-file "$tmp/data.txt" --seq-len 16 --layers 1 --dim 16 --heads 2 --ffn 32 --batch 8 \
    --steps 2 --threads 2 --quiet --out "$tmp/textrun" >/dev/null 2>&1
same=$($LIME eval --load "$tmp/textrun/model.safetensors" 2>&1 >/dev/null)
echo "one more line" >> "$tmp/data.txt"
changed=$($LIME eval --load "$tmp/textrun/model.safetensors" 2>&1 >/dev/null); status=$?
if [ $status -eq 0 ] && [ -z "$same" ] && [ "$(echo "$changed" | wc -l)" -eq 1 ] &&
    echo "$changed" | grep -q "lime eval: warning: --text-file .*data.txt differs from the file this model was trained and scored on"; then
    pass eval_warns_when_data_file_changed
else
    fail eval_warns_when_data_file_changed "exit $status; unchanged: [$same]; changed: [$changed]"
fi

# --- bad input: exit code 2, one line naming the problem, nothing written
bad() {  # name, expected word in the message, command...
    local name=$1 word=$2; shift 2
    local out status
    out=$("$@" 2>&1); status=$?
    if [ $status -eq 0 ] || [ $status -ge 128 ]; then fail "$name" "exit status $status: $out"; return; fi
    if ! echo "$out" | grep -qi -- "$word"; then fail "$name" "message lacks '$word': $out"; return; fi
    if [ "$(echo "$out" | wc -l)" -gt 2 ]; then fail "$name" "more than one line: $out"; return; fi
    pass "$name"
}
printf 'not a checkpoint at all\n' > "$tmp/text.safetensors"
head -c 3000 "$tmp/run/model.safetensors" > "$tmp/truncated.safetensors"
# no command: the usage on stderr, exit 2; asked for, on stdout, exit 0
out=$($LIME 2>/dev/null); status=$?; err=$($LIME 2>&1 >/dev/null)
if [ $status -eq 2 ] && [ -z "$out" ] && echo "$err" | grep -q "^usage: ./lime COMMAND"; then pass no_command_usage_on_stderr
else fail no_command_usage_on_stderr "exit $status, stdout [$out]"; fi
for ask in --help help; do
    if out=$($LIME $ask 2>/dev/null) && echo "$out" | grep -q "^usage: ./lime COMMAND"; then pass "usage_asked_${ask#--}_on_stdout"
    else fail "usage_asked_${ask#--}_on_stdout" "$out"; fi
done
bad bad_unknown_command     "unknown command"  $LIME frobnicate
bad bad_unknown_flag        "unknown flag"     $LIME train --frobnicate 3
bad bad_flag_not_integer    "not an integer"   $LIME train --batch abc
bad bad_flag_missing_value  "needs a value"    $LIME train --batch
bad bad_dim_not_divisible   "divisible"        $LIME train --dim 30 --heads 4 --out "$tmp/x"
bad bad_heads_not_divisible "divisible"        $LIME train --heads 4 --kv-heads 3 --out "$tmp/x"
bad bad_odd_head_size       "odd"              $LIME train --dim 12 --heads 4 --out "$tmp/x"
bad bad_modulus_not_prime   "not prime"        $LIME train --modulus 12 --out "$tmp/x"
bad bad_format              "chain|direct"     $LIME data --format both
bad bad_missing_checkpoint  "no such file"     $LIME eval --load "$tmp/nope.safetensors"
bad bad_not_a_checkpoint    "safetensors"      $LIME eval --load "$tmp/text.safetensors"
bad bad_truncated           "truncated"        $LIME eval --load "$tmp/truncated.safetensors"
bad bad_resume_other_arch   "different model"  $LIME train --resume "$tmp/part/checkpoint.safetensors" --arch llama
bad bad_unwritable_out      "cannot"           $LIME train $TINY --steps 2 --out /proc/lime-test
bad bad_sample_unknown_tok  "unknown"          $LIME sample --load "$tmp/run/model.safetensors" --prompt "3 + x ="
bad bad_verify_no_files     "needs reference"  $LIME verify
bad bad_text_without_file   "text-file"        $LIME train --task text --out "$tmp/x"
if [ -e "$tmp/x/model.safetensors" ]; then fail bad_input_wrote_nothing "a refused run wrote a model"; else pass bad_input_wrote_nothing; fi

# --- bench --json: one valid object; off a GPU its GPU numbers are null, with the reason, and
# MFU is against the CPU's FMA peak, a positive number of GFLOP/s it measured
out=$($LIME bench --json --device cpu --layers 1 --dim 8 --heads 2 --ffn 16 --vocab 11 --batch 2 --seq-len 4 \
      --steps 1 --threads 1 2>&1)
opens=$(echo "$out" | tr -cd '{' | wc -c); closes=$(echo "$out" | tr -cd '}' | wc -c)
quotes=$(echo "$out" | tr -cd '"' | wc -c)
num='-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?'
if [ "$(echo "$out" | wc -l)" -eq 1 ] && [ "$opens" -eq "$closes" ] && [ $((quotes % 2)) -eq 0 ] &&
    [ "$(echo "$out" | grep -oE "\"ms_per_step\": $num, \"tokens_per_s\": $num" | wc -l)" -eq 5 ] &&
    [ "$(echo "$out" | grep -oE "\"mfu\": $num, \"model_gb\": null, \"peak_device_gb\": null" | wc -l)" -eq 5 ] &&
    echo "$out" | grep -oE "\"cpu_peak_gflops\": $num" | awk '{ exit !($2 > 0) }' &&
    [ "$(echo "$out" | grep -oE "\"(lime|hc|resformer|denseformer)_over_llama\": $num" | wc -l)" -eq 4 ] &&
    echo "$out" | grep -q '"hc_model": "hc"' && echo "$out" | grep -q '"gpu_absent": "a CPU run'; then
    pass bench_json_on_the_cpu
else
    fail bench_json_on_the_cpu "$out"
fi

# --- bench --json: lime / llama beside its FLOP and byte ratios; with two layers the router
# (layer 1) adds FLOPs, and more bytes than FLOPs (it moves the buffer for few FLOPs a float)
out=$($LIME bench --json --device cpu --layers 2 --dim 8 --heads 2 --ffn 16 --vocab 11 --batch 2 --seq-len 4 \
      --steps 1 --threads 1 2>&1)
flops=$(echo "$out" | grep -oE "\"flops_lime_over_llama\": $num" | awk '{ print $2 }')
bytes=$(echo "$out" | grep -oE "\"bytes_lime_over_llama\": $num" | awk '{ print $2 }')
if [ -n "$flops" ] && [ -n "$bytes" ] && awk -v f="$flops" -v b="$bytes" 'BEGIN { exit !(f > 1 && b > f) }'; then
    pass bench_json_lime_cost_ratios
else
    fail bench_json_lime_cost_ratios "flops_lime_over_llama '$flops', bytes_lime_over_llama '$bytes' (want 1 < flops < bytes): $out"
fi

# --- bench: the peers beside llama, each with its FLOP and byte ratios (ResFormer's first
# layer keeps its values, DenseFormer its averages: a few more bytes, as many FLOPs); --models
# picks which run (llama always), and the text names each
out=$($LIME bench --json --device cpu --layers 2 --dim 8 --heads 2 --ffn 16 --vocab 11 --batch 2 --seq-len 4 \
      --steps 1 --threads 1 --models resformer,denseformer 2>&1)
text=$($LIME bench --device cpu --layers 2 --dim 8 --heads 2 --ffn 16 --vocab 11 --batch 2 --seq-len 4 \
      --steps 1 --threads 1 --models denseformer 2>&1)
ok=1
for m in resformer denseformer; do
    flops=$(echo "$out" | grep -oE "\"flops_${m}_over_llama\": $num" | awk '{ print $2 }')
    bytes=$(echo "$out" | grep -oE "\"bytes_${m}_over_llama\": $num" | awk '{ print $2 }')
    [ -n "$flops" ] && [ -n "$bytes" ] && awk -v f="$flops" -v b="$bytes" 'BEGIN { exit !(f >= 1 && b > 1) }' || ok=0
done
echo "$out" | grep -q '"lime"\|"hc"' && ok=0
echo "$text" | grep -q "^  denseformer / llama step time: " && ! echo "$text" | grep -q "^  resformer" || ok=0
if [ $ok -eq 1 ]; then pass bench_peers_cost_ratios; else fail bench_peers_cost_ratios "$out $text"; fi

# --- bench on a GPU (the harness): lime's router both ways, its kernels against cuBLAS
if [ "$LIME" = ./lime ] && [ -x ./lime-emu ]; then
    out=$(./lime-emu bench --json --device gpu --layers 2 --dim 8 --heads 2 --ffn 16 --vocab 11 --batch 2 --seq-len 4 \
          --steps 1 --models lime 2>&1)
    if echo "$out" | grep -qE "\"lime_router_cublas_ms_per_step\": $num, \"lime_router_kernels_over_cublas\": $num"; then
        pass bench_gpu_times_both_router_forms
    else fail bench_gpu_times_both_router_forms "$out"; fi
fi

# --- bench --entropy-reg: llama and lime also with the regulariser, each a ratio to itself without
out=$($LIME bench --json --device cpu --layers 1 --dim 8 --heads 2 --ffn 16 --vocab 11 --batch 2 --seq-len 4 \
      --steps 3 --threads 1 --entropy-reg 0.1 2>&1)
ok=1
for m in llama lime; do
    for key in ${m}_reg_ms_per_step ${m}_reg_over_plain; do
        echo "$out" | grep -qE "\"$key\": [0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?[,}]" || ok=0
    done
done
echo "$out" | grep -q '"entropy_reg": 0.1' || ok=0
if [ $ok -eq 1 ]; then pass bench_entropy_reg_times_pairs; else fail bench_entropy_reg_times_pairs "$out"; fi

# --- tests/run_gpu.sh: a probe that fails where nvidia-smi lists a GPU is a failure, not a skip
# (a fake nvidia-smi on the PATH; the harness build pretends to have no device)
if [ "$LIME" = ./lime ] && [ -x ./lime-emu ]; then
    mkdir -p "$tmp/smi_gpu" "$tmp/smi_none"
    printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-fake)"\n' > "$tmp/smi_gpu/nvidia-smi"
    printf '#!/bin/sh\necho "NVIDIA-SMI has failed: no driver"; exit 9\n' > "$tmp/smi_none/nvidia-smi"
    chmod +x "$tmp/smi_gpu/nvidia-smi" "$tmp/smi_none/nvidia-smi"
    out=$(PATH="$tmp/smi_gpu:$PATH" LIME=./lime-emu LIME_EMU_NO_DEVICE=1 bash tests/run_gpu.sh 2>&1); status=$?
    if [ $status -ne 0 ] && echo "$out" | grep -q "^FAIL gpu tests: nvidia-smi lists GPU 0: NVIDIA H200" &&
        echo "$out" | grep -q "no CUDA-capable device" && [ "$(echo "$out" | tail -1)" = "0 passed, 1 failed, 0 skipped" ]; then
        pass run_gpu_fails_when_a_listed_gpu_is_unusable
    else
        fail run_gpu_fails_when_a_listed_gpu_is_unusable "exit $status: $out"
    fi
    out=$(PATH="$tmp/smi_none:$PATH" LIME=./lime-emu LIME_EMU_NO_DEVICE=1 bash tests/run_gpu.sh 2>&1); status=$?
    if [ $status -eq 0 ] && echo "$out" | grep -q "^SKIP gpu tests: no CUDA device.*NVIDIA-SMI has failed" &&
        [ "$(echo "$out" | tail -1)" = "0 passed, 0 failed, 1 skipped" ]; then
        pass run_gpu_skips_without_a_gpu
    else
        fail run_gpu_skips_without_a_gpu "exit $status: $out"
    fi
fi

summary
