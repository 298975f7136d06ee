#!/usr/bin/env bash
# labs/lab5/check.sh ANSWERS RUN — lab 5's checks (labs/run.sh runs it): each
# answer in ANSWERS against the student's own experiment in RUN (the --out of
# ./lime compare): RUN/report.md's tables, and ./lime analyze of the seed-1
# LIMe model there. A wrong answer gets a FAIL that says where to look, never
# the value. One PASS or FAIL line per answer.
# The reading and grading is labs/lab5/check.cpp's (build/lab/lab5/check,
# built by make lab5): this script only finds the files and runs ./lime
# analyze. Nothing read from the answers or the report is run or evaluated.
answers=$1 run=$2 LIME=${LIME:-./lime} CHECK=${LAB5_CHECK:-build/lab/lab5/check}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -x "$CHECK" ]; then echo "FAIL checker: $CHECK is not built; run make lab5"; exit 1; fi
model=$(ls "$run"/tier*/lime-seed1/model.safetensors 2>/dev/null | head -1)
status=1
if [ -n "$model" ] && [ -f "$run/report.md" ]; then
    "$LIME" analyze --load "$model" --out "$tmp" --device cpu --n 4 >"$tmp/analyze.txt" 2>&1
    status=$?
fi
"$CHECK" "$answers" "$run/report.md" "$tmp/analyze.txt" "$status" "${model:-$run/tier*/lime-seed1/model.safetensors}"
