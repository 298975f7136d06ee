#!/usr/bin/env bash
# tests/sass_per_mma.sh OBJECT — the tensor-core flash kernels' SASS instructions per mma, from
# `cuobjdump -sass OBJECT` (make nvcc-check runs it on build/lime.o). For each kernel and
# architecture: its main loop, the backward branch's range that holds the most HMMA
# instructions (the smallest such range: the loop over the streamed tiles), its instructions,
# its HMMAs and their ratio, the instructions an mma costs around it (loads, conversions,
# softmax, shuffles, address arithmetic). Static counts: a loop's instructions once each.
# Head dims 64 and 128 (the configs'), or every one with SASS_ALL=1. Without cuobjdump (it
# ships with the CUDA Toolkit; nvdisasm beside it) it says so and passes.
obj=${1:?usage: tests/sass_per_mma.sh build/lime.o}
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump 2>/dev/null)}
if [ -z "$CUOBJDUMP" ] && [ -n "$NVCC" ]; then
    CUOBJDUMP=$(dirname "$(readlink -f "$NVCC")")/cuobjdump
    [ -x "$CUOBJDUMP" ] || CUOBJDUMP=
fi
[ -n "$CUOBJDUMP" ] || { echo "sass_per_mma: no cuobjdump on the PATH (the CUDA Toolkit's): no SASS counts"; exit 0; }
sass=$("$CUOBJDUMP" -sass "$obj" 2>&1) || { echo "sass_per_mma: cuobjdump failed: $(echo "$sass" | tail -1)"; exit 1; }
echo "$sass" | awk '
function hex(s,   i, c, v) { v = 0; s = tolower(s); sub(/^0x/, "", s)
    for (i = 1; i <= length(s); i++) { c = index("0123456789abcdef", substr(s, i, 1)) - 1; v = v * 16 + c }
    return v }
function report(   i, j, best, bh, bn, h, n) {
    if (fn !~ /flash_tc/ || lines == 0) return
    bh = 0; bn = 0
    for (j = 1; j <= loops; j++) {  # loop j: instructions from lo[j] to hi[j]
        h = 0; n = 0
        for (i = 1; i <= lines; i++) if (at[i] >= lo[j] && at[i] <= hi[j]) { n++; if (mma[i]) h++ }
        if (h > bh || (h == bh && h > 0 && n < bn)) { bh = h; bn = n }
    }
    name = fn; sub(/^_Z[0-9]+/, "", name); sub(/ILi/, " HD ", name); sub(/ELb0E.*/, " tf32", name); sub(/ELb1E.*/, " bf16", name)
    if (bh) printf "sass %s %s: main loop %d instructions, %d mma, %.1f an mma\n", arch, name, bn, bh, bn / bh
}
/code for sm_/ { report(); lines = 0; loops = 0; fn = ""; arch = $3 }
/Function : / { report(); fn = $3; lines = 0; loops = 0; next }
/^ +\/\*[0-9a-f]+\*\/ +[A-Z@]/ {
    a = $1; gsub(/[\/*]/, "", a); lines++; at[lines] = hex(a); mma[lines] = ($0 ~ / HMMA/)
    if (match($0, /BRA (`\()?0x[0-9a-f]+/)) {
        t = substr($0, RSTART, RLENGTH); sub(/.*0x/, "", t)
        if (hex(t) < at[lines]) { loops++; lo[loops] = hex(t); hi[loops] = at[lines] }
    }
}
END { report() }' | sort -k2,2 -k3,3 -k5,5n | if [ "${SASS_ALL:-0}" = 1 ]; then cat; else grep -E ' HD (64|128) '; fi
