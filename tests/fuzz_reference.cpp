// tests/fuzz_reference.cpp — libFuzzer target for ./lime verify's reader of
// reference-vector files (docs/checkpoint.md), which have no checksum: every
// byte of one is hostile. Built and run by `make fuzz`; seeds in
// tests/fuzz_corpus/reference/ (the golden files and damaged copies).
//
// Each input is written to a file and verified as `./lime verify FILE` does
// (verify_file: the config, read_ref_batch's sizes against the model's, the
// AdamW metadata, model_create, model_load, then the forward, backward and
// three AdamW steps of verify_model). Besides "no crash, no sanitizer report",
// a promise is checked: a file read_ref_batch accepts has a batch the model
// can index (1 <= T <= the config's max_position_embeddings, every token id
// in the vocabulary). support/commands/verify.cpp is included, as
// tests/test_model.cpp includes lime.cu, to reach its static functions.
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "support/commands/verify.cpp"

static void require(bool ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "fuzz_reference: broken promise: %s\n", what);
        __builtin_trap();
    }
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    if (!freopen("/dev/null", "w", stdout)) return 1;  // verify's report lines
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/fuzz_reference." +
                                    std::to_string(getpid()) + ".safetensors";
    FILE* f = fopen(path.c_str(), "wb");
    require(f != nullptr, "cannot write the temporary file");
    fwrite(data, 1, size, f);
    fclose(f);
    Config c;
    if (!checkpoint_read_config(path, &c, nullptr).empty()) return 0;
    // small models only: a fuzzed config may ask for any size (the real command checks the memory first)
    if (param_count(c) > 100000 || c.T > 64 || c.L > 8 || c.H > 16 || c.V > 4096) return 0;
    SafeTensors st;
    if (st_read(path, &st).empty()) {
        RefBatch rb;
        if (read_ref_batch(st, path, c, &rb).empty()) {
            require(rb.B >= 1 && rb.T >= 1 && rb.T <= c.T, "read_ref_batch accepted a batch past the model's positions");
            for (size_t i = 0; i < rb.tokens.size(); i++)
                require(rb.tokens[i] >= 0 && rb.tokens[i] < c.V && rb.targets[i] >= 0 && rb.targets[i] < c.V,
                        "read_ref_batch accepted a token id outside the vocabulary");
        }
    }
    Verifier v;
    v.quiet = true;
    verify_file(path, DEVICE_CPU, ModelSettings(), &v);
    return 0;
}
