#!/usr/bin/env bash
# tests/test_docs.sh — the guides cannot rot: every function, type and file
# that README.md or docs/*.md names in backticks exists in the code, and
# nothing in the repository points outside it (to the contract folder beside a
# developer's checkout, which a user who clones it does not have).
cd "$(dirname "$0")/.." || exit 2
source tests/lib.sh
code="lime.cu train.cpp support data labs"

# The names a document cites: backticked spans outside fenced code blocks.
cited() { awk '/^```/ { fenced = !fenced; next } !fenced' "$1" | grep -o '`[^`]*`' | tr -d '`'; }

# An identifier is there when the code has it as a whole word (name_* : as a prefix).
has_identifier() {
    local name=$1
    if [[ $name == *_\* ]]; then grep -rqE "\b${name%\*}[a-z0-9_]*\(" $code; else grep -rqw -- "$name" $code; fi
}

check_document() {
    local doc=$1 missing=()
    while IFS= read -r span; do
        # repository files: support/..., tests/..., data/..., docs/..., or a top-level source file
        if [[ $span =~ ^(support|tests|data|docs|labs)/[^[:space:]]*$ || $span =~ ^[a-z_]+\.(cu|cpp|h|cuh|md|sh)$ ]]; then
            compgen -G "$span" >/dev/null || missing+=("$span")
            continue
        fi
        # identifiers: snake_case names, Type::member, and every name(...) inside code
        local names=()
        [[ $span =~ ^[a-z][a-z0-9]*(_[a-z0-9]+)+(_\*)?$ ]] && names+=("$span")
        [[ $span =~ ^[A-Z][A-Za-z]+::[A-Za-z_]+$ ]] && names+=("${span%%::*}" "${span##*::}")
        while read -r call; do [ -n "$call" ] && names+=("$call"); done < <(echo "$span" | grep -oE '\b[a-z_][a-z0-9_]*\(' | tr -d '(' | grep -vE '^(if|for|while|sizeof|make)$')
        for name in "${names[@]}"; do has_identifier "$name" || missing+=("$name"); done
    done < <(cited "$doc")
    if [ ${#missing[@]} -eq 0 ]; then pass "names_in_${doc//\//_}_exist"
    else fail "names_in_${doc//\//_}_exist" "$doc cites what the code does not have: ${missing[*]}"; fi
}

check_document README.md

# README's hop chain from train_loop to the router's products is what runs:
# in each `a` → `b` of that paragraph, a's body (from its definition to the
# next closing brace in column 0) calls b.
body_of() {
    awk -v f="$1" '!inside && $0 ~ "^[A-Za-z].*[ *&]" f "\\(" && $0 !~ ";[[:space:]]*$" { inside = 1 }
                   inside { print } inside && /^}/ { inside = 0 }' lime.cu train.cpp support/*/*.cpp support/*/*.cuh
}
hops=$(sed -n '/^From the training loop into the router/,/^$/p' README.md | grep -oE '`[A-Za-z_]+`( → `[A-Za-z_]+`)+' |
    tr -d '`' | awk -F' → ' '{ for (i = 1; i < NF; i++) print $i, $(i + 1) }')
broken=()
while read -r from to; do
    [ -n "$from" ] || continue
    body_of "$from" | grep -qE "\b$to\(" || broken+=("$from→$to")
done <<<"$hops"
if [ -z "$hops" ]; then fail readme_hop_chain_is_what_runs "README has no hop chain (\"From the training loop into the router ...\")"
elif [ ${#broken[@]} -eq 0 ]; then pass readme_hop_chain_is_what_runs
else fail readme_hop_chain_is_what_runs "README's hop chain names calls the code does not make (fix README or the chain): ${broken[*]}"; fi
for doc in docs/*.md labs/README.md labs/*/README.md; do check_document "$doc"; done

# Sections cited by title are there: README's "The method in five paragraphs" (in labs/ and
# docs/) is a heading of README.md, and `docs/gpu.md`, "No GPU: ..." (in README.md, docs/ and
# labs/) a heading or a bold paragraph's title in that document. A title matches a heading that
# starts with it, backticks ignored. A citation may wrap across lines (comment markers dropped).
citing_files=$(find docs labs -type f \( -name '*.md' -o -name '*.cpp' -o -name '*.h' -o -name '*.txt' \) | sort)
flat() { sed -E 's#^[[:space:]]*(//|\#)[[:space:]]?##' "$1" | tr '\n' ' ' | tr -s ' '; }
titles_of() {  # DOC: its headings and bold paragraph titles, one a line, without backticks
    sed -nE 's/^#+ +(.*)/\1/p; s/^\*\*([^*]+)\*\*.*/\1/p' "$1" | tr -d '`'
}
has_title() {  # DOC TITLE [headings-only]
    local title=${2//\`/} line
    while IFS= read -r line; do
        [[ $line == "$title" || $line == "$title"[[:space:]:.,\(]* ]] && return 0
    done < <(if [ -n "$3" ]; then sed -nE 's/^#+ +(.*)/\1/p' "$1" | tr -d '`'; else titles_of "$1"; fi)
    return 1
}
missing_sections=0
for f in $citing_files; do
    while IFS= read -r title; do
        [ -n "$title" ] || continue
        has_title README.md "$title" headings && continue
        fail readme_sections_cited_exist "$f cites README's \"$title\", which is not a heading of README.md"
        missing_sections=$((missing_sections + 1))
    done < <(flat "$f" | grep -oE "(^|[^/[:alnum:]_.-])README(['’]s)?,? \(?\"[^\"]+\"" | sed -E 's/.*"([^"]+)"$/\1/')
done
[ $missing_sections -eq 0 ] && pass readme_sections_cited_exist
missing_sections=0
for f in README.md $citing_files; do
    while IFS=$'\t' read -r doc title; do
        [ -n "$title" ] || continue
        { [ -f "$doc" ] && has_title "$doc" "$title"; } && continue
        fail doc_sections_cited_exist "$f cites $doc \"$title\", which is not a heading or bold title there"
        missing_sections=$((missing_sections + 1))
    done < <(flat "$f" | grep -oE "docs/[a-z_]+\.md\`?,? \(?\"[^\"]+\"" |
                 sed -E 's/^(docs\/[a-z_]+\.md)[^"]*"([^"]+)"$/\1\t\2/')
done
[ $missing_sections -eq 0 ] && pass doc_sections_cited_exist

# README's gdb session steps as printed: ./lime-ref (-O0 -g, the plain loops on one
# thread) stops in router_forward with its arguments, and `next` walks its lines.
if ! command -v gdb >/dev/null 2>&1; then
    echo "SKIP readme_gdb_session_steps: gdb is not installed (apt-get install gdb)"
elif [ ! -x ./lime-ref ]; then
    echo "SKIP readme_gdb_session_steps: ./lime-ref is not built (make lime-ref)"
else
    check readme_gdb_session_steps
    out=$(gdb -batch -ex 'break router_forward' -ex run -ex 'p l' -ex next -ex next -ex 'info locals' -ex kill \
              --args ./lime-ref train --ops 2 --train-size 200 --epochs 1 --out "$tmp/gdb_run" --force 2>&1)
    expect "the breakpoint in router_forward was not hit" has "$out" -E '^Breakpoint 1, router_forward \(.*l=1, '
    expect "p l printed no value" has "$out" -E '^\$1 = 1$'
    expect "a variable is <optimized out>" not has "$out" 'optimized out'
    expect "next did not step to router_forward's next lines" has "$out" -E '^[0-9]+[[:space:]]+size_t row = '
    expect "info locals lacks cols" has "$out" -E '^cols = [0-9]+$'
    verdict "$(echo "$out" | tail -3 | tr '\n' ' ')"
fi

# The repository stands alone: no text file points at that folder or its contract files.
# (The patterns are written so that this file does not match itself.)
outside=$(git ls-files 2>/dev/null | grep -vE '\.(safetensors|png|json|txt|csv)$' | xargs grep -lE '[.][.]/shared|SPEC[.]md|TASKS[.]md' 2>/dev/null)
if [ -z "$outside" ]; then pass repository_stands_alone; else fail repository_stands_alone "these point outside the repository: $outside"; fi

summary
