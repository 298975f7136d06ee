#!/usr/bin/env bash
# tests/check_spills.sh REPORT — reads ptxas's resource report (nvcc
# --resource-usage, as `make nvcc-check` writes it to build/ptxas.txt) and
# fails when a kernel listed below spills registers to local memory (spill
# stores or loads above 0) for any GPU architecture, or is missing from the
# report (so the check cannot pass by reading nothing). A spill turns a
# register access into a memory access in the innermost loop: these kernels
# were written to fit in the 255 registers a thread may have.
report=${1:?usage: tests/check_spills.sh build/ptxas.txt}
SPILL_FREE=(
    flash_attention_forward_kernel flash_attention_backward_kv_kernel flash_attention_backward_q_kernel
    flash_tc_forward_kernel flash_tc_backward_q_kernel flash_tc_backward_kv_kernel
    kv_transpose_kernel
    embedding_backward_kernel rmsnorm_backward_kernel crossentropy_forward_kernel grad_norm_kernel qkv_scatter_kernel
    split_sum_kernel
    hc_weights_forward_kernel hc_weights_dx_kernel hc_weights_partial_kernel hc_weights_reduce_kernel
    hc_width_forward_kernel hc_width_backward_dx_kernel hc_width_backward_da_kernel
    hc_depth_forward_kernel hc_depth_backward_dy_kernel hc_depth_backward_db_kernel hc_sum_kernel hc_expand_kernel
    ereg_center_kernel ereg_stat_kernel ereg_backward_kernel ereg_loss_kernel
)
[ -r "$report" ] || { echo "check_spills: cannot read $report"; exit 1; }
# One line per compiled kernel and architecture: "name arch stores loads".
rows=$(awk '
    /Compiling entry function/ { split($0, q, "'"'"'"); name = q[2]; arch = q[4] }
    /bytes spill stores/ && name != "" {
        for (i = 1; i <= NF; i++) { if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "stores,") st = $i
                                    if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "loads") ld = $i }
        print name, arch, st, ld; name = ""
    }' "$report")
status=0 checked=0
for kernel in "${SPILL_FREE[@]}"; do
    mine=$(echo "$rows" | grep -E "^_Z[0-9]+${kernel}[^a-z_]" || true)
    if [ -z "$mine" ]; then echo "FAIL $kernel: not in $report"; status=1; continue; fi
    while read -r name arch st ld; do
        checked=$((checked + 1))
        if [ "${st:-0}" != 0 ] || [ "${ld:-0}" != 0 ]; then
            echo "FAIL $kernel ($name, $arch): $st bytes spill stores, $ld bytes spill loads"; status=1
        fi
    done <<< "$mine"
done
[ $status = 0 ] && echo "nvcc: no register spills in the ${#SPILL_FREE[@]} spill-free kernels ($checked compiled versions)"
exit $status
