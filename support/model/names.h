// support/model/names.h — the model on the command line: the names of
// architectures, routers, attention kernels and whole models (parsed in
// support/model/names.cpp, also from checkpoints' configs), and the device and
// ModelSettings a command's flags choose (--device, --attention, --tf32,
// --graph). The flags themselves are support/lib/cli.h's.
#pragma once
#include <string>
#include <vector>

#include "support/lib/cli.h"
#include "support/model/lime.h"
#include "support/model/models.h"

// config_check (support/model/lime.h) names a bad field by its flag ("--layers 0
// must be at least 1"); config_check_file by its key in a checkpoint's config
// ("config \"num_hidden_layers\" 0 must be at least 1"), for config_from_json.
std::string config_check_file(const Config& c);
// "" when lambda is a value-entropy regulariser's lambda: 0 (off), or a normal
// float32 number up to 1e6; else why not, to follow the flag or key's name.
std::string entropy_reg_check(double lambda);

// Names on the command line and in checkpoints, parsed (support/model/names.cpp).
bool arch_parse(const std::string& s, Arch* out);  // a registered model's name (support/model/models.h)
bool router_parse(const std::string& s, Config* c);              // "static", "average", "last-J", "first-J"
bool attention_parse(const std::string& s, Attention* out);      // "auto", "matmul", "flash"
// A model as compare names it: "llama", "lime", "lime:last-2", "lime:average:separate"
// (lime, then its router when not static, then ":separate" for --router-kv separate),
// "hc", "hc:n2", "hc:static", "hc:n2:static" (Hyper-Connections: the rate when not 4, static when not dynamic).
std::string model_name(const Config& c);
// "" unless one of c's router restrictions selects every weight at c's shape, so that the
// "ablation" is lime itself: same-head with one kv head (no other head to mix), last-J or
// first-J whose window holds every layer (router_sources). Else the restriction and the
// shape that would make it one, e.g. "same-head with 1 kv head is lime itself (...): ...".
std::string ablation_vacuous(const Config& c);
// sets arch, the router fields, hc's rate and dynamic and entropy_reg: "lime:last-2",
// "hc:n2:static", "llama:ereg=0.1", "lime:frozen:ereg=0.5"
bool model_parse(const std::string& s, Config* c);
// Whether attention reads a mixture of values, not the layer's own (LIMe's routed,
// ResFormer's value residual): analyze's and compare's "routed" entropy.
inline bool mixes_values(const Config& c) {
    const StudyHooks* h = study_hooks(c);
    return c.arch == ARCH_LIME || (h && h->mixes_values && c.L > 1 && h->mixes_values(c, c.L - 1));
}

// The flags that shape a model (--arch, --layers, --dim, ... --entropy-reg), train's and bench's
// (support/model/names.cpp).
extern const std::vector<FlagSpec> SHAPE_FLAGS;
// The model's shape from the shape flags (V and T come from the task or --vocab, --seq-len).
// one_model: the flags shape one model (train); bench shapes three from them, so
// its --hc-rate and --hc-dynamic go to its hc beside a lime.
Config shape_from_args(Args& a, bool one_model = true);
// The value shape flag --FLAG has in a model of config c ("none" for one it
// has no part for: --router of a llama), "" for a flag that is not a shape
// flag: train --resume checks the shape flags typed against the checkpoint.
std::string shape_flag_value(const Config& c, const std::string& flag);

inline Device pick_device(Args& a) {
    std::string d = a.choice("device", {"auto", "cpu", "gpu"});
    std::string why;
    bool ok = d != "cpu" && gpu_available(&why);
    if (d == "gpu" && !ok) die(a.cmd, "--device gpu: " + why);
    if (!ok && a.values.count("precision") && a.str("precision") == "bf16")
        die(a.cmd, std::string("--precision bf16 is for the GPU") +
                       (d == "auto" ? ", and --device auto found none" : "") +
                       "; the CPU trains in float32: use --precision float32 (the default)");
    return ok ? DEVICE_GPU : DEVICE_CPU;
}

// --attention: how the GPU runs attention (ModelSettings in support/model/lime.h).
#define ATTENTION_FLAG \
    {"attention", "auto", "gpu: matmul (products around a stored T x T softmax, fast), flash (memory O(T), slower) or auto (matmul when it fits)"}
// --precision: the operands of the GPU's dense products and attention's (support/model/products.cuh).
#define PRECISION_FLAG                                                                                       \
    {"precision", "float32",                                                                                 \
     "gpu: float32 (TF32 with --tf32 1) or bf16 (the dense and attention products' operands rounded to bf16, " \
     "float32 sums)"}
// Where the memory the host can give is read. In testing builds
// (LIME_TESTING: ./lime-emu) LIME_TEST_MEMINFO=FILE reads FILE instead, a
// machine with that much MemAvailable (tests/test_hostile.sh, bench); never in ./lime.
inline const char* meminfo_path() {
#ifdef LIME_TESTING
    if (const char* f = getenv("LIME_TEST_MEMINFO")) return f;
#endif
    return "/proc/meminfo";
}

// The settings a model is created with, from the flags this command has
// (--attention, --tf32, --graph; the others keep their defaults), and the
// memory the host can give, so that model_create refuses what would not fit.
inline ModelSettings model_settings(Args& a) {
    ModelSettings s;
    if (a.values.count("tf32")) s.tf32 = a.integer("tf32", 0, 1) == 1;
    if (a.values.count("attention")) attention_parse(a.choice("attention", {"auto", "matmul", "flash"}), &s.attention);
    if (a.values.count("graph")) s.graph = a.integer("graph", 0, 1) == 1;
    if (a.values.count("precision"))
        s.precision = a.choice("precision", {"float32", "bf16"}) == "bf16" ? PRECISION_BF16 : PRECISION_FLOAT32;
    s.host_bytes = memory_available(meminfo_path());
    // the flags that size the model in this command, for an out-of-memory line (SizeFlags)
    bool shaped = a.cmd == "train" || a.cmd == "bench";  // the others load a checkpoint's shape
    if (!shaped) s.flags.layers = s.flags.dim = s.flags.ffn = "";
    if (a.cmd != "bench") s.flags.vocab = "";  // the task's
    if (a.cmd != "bench" && !(a.cmd == "train" && a.str("task") == "text")) s.flags.seq_len = "";
    if (!shaped && a.cmd != "eval") s.flags.batch = a.cmd == "analyze" ? "--n" : "";  // analyze's batch: its --n sequences
    return s;
}

// Train's flags (support/model/names.cpp): the shape, the task (TASK_FLAGS) and
// the run, with their defaults; compare checks its --train-args against them.
extern const std::vector<FlagSpec> TASK_FLAGS;
std::vector<FlagSpec> train_flags();
// nullptr when --flag may be given with --task task (not a task's flag, or this
// task's), else the task it belongs to: "--ops is for --task arith".
const char* task_owning_flag(const std::string& flag, const std::string& task);
