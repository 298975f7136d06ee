# tests/learning_speed.awk — the report's learning-speed numbers recomputed from the runs' logs alone,
# for tests/test_cli.sh: awk -v threshold=0.5 -v a=lime -v b=llama -f tests/learning_speed.awk DIR/tier2/*/log.jsonl
# A run learns at its first eval line whose accuracy reaches the threshold, else it is censored
# at its last eval line's step. Prints, as the report does: per model (a, then b) its Kaplan-Meier rows
# "KM model step at_risk learned S se", and "MEDIAN model median lo hi"; then "PAIR a_first ties
# b_first p" for a against b (by seed: a censored run is later than any that learned).
function num(line, key,    m) {
    if (!match(line, "\"" key "\": [-+0-9.eE]+")) return "";
    m = substr(line, RSTART, RLENGTH); sub(/.*: /, "", m); return m + 0
}
FNR == 1 { n = split(FILENAME, parts, "/"); run = parts[n - 1]; model = run; sub(/-seed[0-9]+$/, "", model)
           seed = run; sub(/.*-seed/, "", seed); models[model] = 1; learned[run] = 0 }
/"type": "eval"/ && /"accuracy"/ {
    step = num($0, "step"); acc = num($0, "accuracy")
    if (!learned[run]) { time[run] = step; if (acc >= threshold) learned[run] = 1 }
    runs[model, seed] = run; seeds[seed] = 1
}
function km(m,    i, j, t, n_t, times, at, ev, s, gw, se, med, lo, hi, r, k) {
    n_t = 0
    for (k in runs) { split(k, r, SUBSEP); if (r[1] != m || !learned[runs[k]]) continue
        t = time[runs[k]]; if (!(t in seen_t)) { seen_t[t] = 1; times[++n_t] = t } }
    for (i = 1; i <= n_t; i++) for (j = i + 1; j <= n_t; j++) if (times[j] < times[i]) { t = times[i]; times[i] = times[j]; times[j] = t }
    s = 1; gw = 0; med = lo = hi = "inf"
    for (i = 1; i <= n_t; i++) {
        at = ev = 0
        for (k in runs) { split(k, r, SUBSEP); if (r[1] != m) continue
            if (time[runs[k]] >= times[i]) at++; if (learned[runs[k]] && time[runs[k]] == times[i]) ev++ }
        s *= 1 - ev / at; if (at > ev) gw += ev / (at * (at - ev)); se = s > 0 ? s * sqrt(gw) : 0
        printf "KM %s %d %d %d %.4f %.4f\n", m, times[i], at, ev, s, se
        if (s <= 0.5 && med == "inf") med = times[i]
        if (s - 1.959963984540054 * se <= 0.5 && lo == "inf") lo = times[i]
        if (s + 1.959963984540054 * se <= 0.5 && hi == "inf") hi = times[i]
    }
    delete seen_t
    print "MEDIAN", m, med, lo, hi
}
END {
    km(a); km(b)
    for (sd in seeds) {
        if (!((a, sd) in runs) || !((b, sd) in runs)) continue
        ta = learned[runs[a, sd]] ? time[runs[a, sd]] : 1e300; tb = learned[runs[b, sd]] ? time[runs[b, sd]] : 1e300
        if (ta < tb) af++; else if (tb < ta) bf++; else ti++
    }
    n = af + bf; k = af < bf ? af : bf; p = 0; c = 1
    for (i = 0; i <= k; i++) { p += c / 2 ^ n; c = c * (n - i) / (i + 1) }
    p = n ? 2 * p : 1; if (p > 1) p = 1
    printf "PAIR %d %d %d %.3g\n", af, ti, bf, p
}
