#!/usr/bin/env bash
# tests/test_layers.sh — support/ is in layers, and the #include lines keep to them:
#   support/lib/       a library: includes nothing of the project but support/lib/ itself
#   support/harness/   CUDA on the CPU: nothing of the project but itself
#   support/model/     the model's own parts: support/lib/ and support/model/
#   support/study/     the study's other models and instruments: lib, model, harness and study
#   support/commands/  the commands beyond train/eval/sample/data: lib, model, data/ and commands
#   data/              the tasks: support/lib/ and data/ only
#   lime.cu            the model: lib, model, the harness and the study
# (train.cpp, tests/ and labs/ may include any of them.) Every header of
# support/ compiles on its own, in the CPU build and with the harness: it
# includes what it uses (a name lime.cu defines later is not there), and no
# header declares a function lime.cu defines. Also: no type name is
# defined by two files (they would share one destructor at link time). A file that breaks its
# layer's rule fails with one line naming the file, the include and the rule;
# the checker also runs on a planted breach, so that it cannot pass by reading nothing.
cd "$(dirname "$0")/.." || exit 2
source tests/lib.sh

# One table: the layer a file belongs to, as "PREFIXES|RULE": the prefixes its
# quoted includes may start with, and the rule in words ("any|" outside the layers).
layer() {
    case $1 in
        support/lib/*)      echo "support/lib/|the library layer includes nothing of the project (support/lib/ only)" ;;
        support/harness/*)  echo "support/harness/|the harness includes nothing of the project" ;;
        support/model/*)    echo "support/lib/ support/model/ support/harness/|the model's parts include support/lib/, support/model/ and support/harness/ only" ;;
        support/study/*)    echo "support/lib/ support/model/ support/harness/ support/study/|the study's models include support/lib/, support/model/, support/harness/ and support/study/ only" ;;
        support/commands/*) echo "support/lib/ support/model/ support/commands/ data/|the commands include support/lib/, support/model/, data/ and support/commands/ only" ;;
        data/*)             echo "support/lib/ data/|data/ includes support/lib/ and data/ only" ;;
        lime.cu)            echo "support/lib/ support/model/ support/harness/ support/study/|lime.cu includes support/lib/, support/model/, support/harness/ and support/study/ only" ;;
        *)                  echo "any|" ;;
    esac
}

# Prints one line per breach under directory $1 (a checkout); nothing when every include keeps its rule.
breaches() {
    local root=$1 f inc entry prefixes ok p
    (cd "$root" && find support data lime.cu -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | sort) |
    while read -r f; do
        entry=$(layer "$f"); prefixes=${entry%%|*}
        [ "$prefixes" = any ] && continue
        sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$root/$f" | while read -r inc; do
            ok=no
            for p in $prefixes; do [[ $inc == "$p"* ]] && ok=yes; done
            # a file beside this one, included by its bare name, is in the same folder
            [[ $inc != */* && -e "$root/$(dirname "$f")/$inc" ]] && ok=yes
            [ $ok = yes ] || echo "$f includes \"$inc\": ${entry#*|}"
        done
    done
}

# Every folder of support/ is one of the layers, with its README.
for dir in support/*/; do
    dir=${dir%/}
    case $dir in support/lib|support/harness|support/model|support/study|support/commands) ;;
        *) fail "support_folders_are_layers" "$dir is not a layer this test knows (lib, harness, model, study, commands): add its rule to tests/test_layers.sh"; continue ;;
    esac
    if [ -s "$dir/README.md" ]; then pass "${dir//\//_}_has_a_readme"; else fail "${dir//\//_}_has_a_readme" "$dir/README.md is missing or empty"; fi
done
loose=$(find support -maxdepth 1 -type f | sort | tr '\n' ' ')
if [ -z "$loose" ]; then pass support_files_are_in_layer_folders; else fail support_files_are_in_layer_folders "files outside the layer folders: $loose"; fi

found=$(breaches .)
if [ -z "$found" ]; then pass includes_keep_to_their_layers
else fail includes_keep_to_their_layers "$(echo "$found" | head -1)$( [ "$(echo "$found" | wc -l)" -gt 1 ] && echo " (and $(($(echo "$found" | wc -l) - 1)) more: bash tests/test_layers.sh)")"
    echo "$found" | tail -n +2 | sed 's/^/    /'
fi

# The checker itself, on a copy with a planted breach: a library file that includes the model.
plant=$tmp/planted  # lib.sh's scratch directory, removed on exit
mkdir -p "$plant/support/lib" "$plant/support/model" "$plant/data"
printf '#include <string>\n#include "support/lib/ok.h"\n' > "$plant/support/lib/ok.h"
printf '#include "support/model/lime.h"\n' > "$plant/support/lib/bad.h"
printf '#include "support/lib/ok.h"\n#include "support/commands/commands.h"\n' > "$plant/data/task.cpp"
got=$(breaches "$plant")
want='data/task.cpp includes "support/commands/commands.h": data/ includes support/lib/ and data/ only
support/lib/bad.h includes "support/model/lime.h": the library layer includes nothing of the project (support/lib/ only)'
if [ "$got" = "$want" ]; then pass checker_finds_a_planted_breach
else fail checker_finds_a_planted_breach "on a planted breach it printed: ${got:-nothing}"; fi

# Every header stands alone: compiled by itself (the CPU build, then with the
# harness, -DLIME_EMU) it needs nothing its includes do not provide. Prints one
# line per header that does not: the file and the first name or include it lacks.
not_standalone() {
    local root=$1 h defs err what
    (cd "$root" && find support -type f \( -name '*.h' -o -name '*.cuh' \) | sort) | while read -r h; do
        for defs in "" "-DLIME_EMU"; do
            err=$(cd "$root" && LC_ALL=C ${CXX:-g++} -std=c++17 -fsyntax-only -fopenmp -I. $defs -x c++ "$h" 2>&1) && continue
            what=$(grep -m1 -oE "'[A-Za-z_][A-Za-z_0-9:]*' (was not declared|has not been declared|does not name a type|is not a member)|[A-Za-z_./]+\.(h|cuh): No such file" <<<"$err")
            echo "$h${defs:+ ($defs)} uses ${what:-what its includes do not provide: $(grep -m1 'error' <<<"$err")}"
            break
        done
    done
}
found=$(not_standalone .)
if [ -z "$found" ]; then pass headers_compile_on_their_own
else fail headers_compile_on_their_own "$(echo "$found" | head -1)$( [ "$(echo "$found" | wc -l)" -gt 1 ] && echo " (and $(($(echo "$found" | wc -l) - 1)) more)")"
    echo "$found" | tail -n +2 | sed 's/^/    /'
fi
# ... and the check on a planted header that uses what lime.cu defines, without a declaration.
mkdir -p "$plant/support/model"
printf '#pragma once\nstruct Model;\ninline void step(Model* m) { forward_pass(m, 1, 1, true); }\n' > "$plant/support/model/uses_later.h"
got=$(not_standalone "$plant" | grep uses_later)
if [[ $got == "support/model/uses_later.h uses 'forward_pass' was not declared"* ]]; then pass checker_finds_a_planted_header_that_needs_lime_cu
else fail checker_finds_a_planted_header_that_needs_lime_cu "on a planted header it printed: ${got:-nothing}"; fi
rm -f "$plant/support/model/uses_later.h"

# No header declares lime.cu's own (static) functions: a declaration would let a
# header call back up into the file that includes it. (support/model/lime.h
# declares lime.cu's public calls: that is the interface, not a call back up.)
# Prints "FILE declares NAME, which lime.cu defines" per breach.
declares_lime_cu() {
    local root=$1 names
    names=$(grep -oE '^[A-Za-z][A-Za-z_0-9 :<>,*&]*[ *&]([a-z_][a-z0-9_]*)\(' "$root/lime.cu" | grep -oE '[a-z_][a-z0-9_]*\($' | tr -d '(' | sort -u)
    [ -n "$names" ] || return 0
    (cd "$root" && find support -type f \( -name '*.h' -o -name '*.cuh' \)) | sort | while read -r h; do
        grep -oE "^(static|template).*[ *&]($(echo $names | tr ' ' '|'))\([^{]*\);" "$root/$h" | grep -oE '[a-z_][a-z0-9_]*\(' | head -1 |
            while read -r n; do echo "$h declares ${n%(}, which lime.cu defines"; done
    done
}
found=$(declares_lime_cu .)
if [ -z "$found" ]; then pass no_header_declares_what_lime_cu_defines
else fail no_header_declares_what_lime_cu_defines "$(echo "$found" | head -1)"; fi
printf 'static void forward_pass(int B);\n' > "$plant/lime.cu"
printf '#pragma once\nstatic void forward_pass(int B);\n' > "$plant/support/model/calls_up.h"
got=$(declares_lime_cu "$plant")
if [ "$got" = "support/model/calls_up.h declares forward_pass, which lime.cu defines" ]; then pass checker_finds_a_planted_declaration
else fail checker_finds_a_planted_declaration "on a planted declaration it printed: ${got:-nothing}"; fi
rm -f "$plant/lime.cu" "$plant/support/model/calls_up.h"

# One type name, one definition. Two files that each define `struct Run` link
# into one program with one of the two destructors (the linker keeps one weak
# copy of an inline member), so one file's objects are freed by the other's
# code: build/test_gpu_native freed tests/test_gpu.cpp's runs with
# support/commands/compare.cpp's destructor and crashed on its first real GPU.
# Prints "NAME: FILE FILE ..." for every name a top-level struct or class of two files has.
twice_defined() {
    (cd "$1" && find support data tests labs lime.cu train.cpp -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null |
        sort | xargs grep -HE '^(struct|class) [A-Za-z_][A-Za-z_0-9]* *(\{|:|final)' 2>/dev/null) |
        sed -E 's/^([^:]+):(struct|class) ([A-Za-z_0-9]+).*/\3 \1/' | sort -u |
        awk '{ files[$1] = files[$1] " " $2; n[$1]++ } END { for (k in n) if (n[k] > 1) print k ":" files[k] }' | sort
}
found=$(twice_defined .)
if [ -z "$found" ]; then pass a_type_name_is_defined_once
else fail a_type_name_is_defined_once "types of one name defined in two files (rename one): $(echo "$found" | tr '\n' ';')"; fi
mkdir -p "$plant/support/commands" "$plant/tests"
printf 'struct Run {\n    int seed;\n};\n' > "$plant/support/commands/compare.cpp"
printf 'struct Run {\n    float loss;\n};\nstruct Other : Run {};\n' > "$plant/tests/test_gpu.cpp"
got=$(twice_defined "$plant")
if [ "$got" = "Run: support/commands/compare.cpp tests/test_gpu.cpp" ]; then pass checker_finds_a_planted_twice_defined_type
else fail checker_finds_a_planted_twice_defined_type "on a planted pair it printed: ${got:-nothing}"; fi

summary
