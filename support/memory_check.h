// support/memory_check.h — the memory a model needs, asked before anything is
// allocated, and the fix for one that does not fit: the command's own size
// flags that would shrink it most. lime.cu includes it before model_create (it
// uses lime.cu's acts_carve and param_count).

// The memory a model of shape c at batch B needs, in bytes: its parameters,
// gradients and AdamW moments (4 floats each), then on the host the CPU's
// activations and products' scratch or the GPU's host copy of the logits, on
// the device its activations (acts_carve). In double: a batch can be too big
// for size_t (acts_carve(B) <= B * acts_carve(1), so that is asked first).
static double memory_needed(const Config& c, int B, Device dev, bool on_device, bool flash = false) {
    Acts probe;
    double state = 16.0 * param_count(c), acts;
    if (dev == DEVICE_GPU && !on_device) acts = (double)B * c.T * c.V;
    else if ((acts = (double)B * acts_carve(&probe, c, 1, nullptr, dev, flash)) < 1e18)
        acts = (double)acts_carve(&probe, c, B, nullptr, dev, flash);
    return state + 4 * acts;
}

// The fix for a model that needs need(c, B) bytes, more than there is: the
// command's size flags (SizeFlags) whose halving saves the most: those that
// save at least half as much as the best of all sizes does; where none does, a
// machine with more memory.
template <class Need> static std::string memory_fix(const Config& c, int B, const SizeFlags& f, Need need) {
    const std::string* flags[] = {&f.layers, &f.dim, &f.ffn, &f.vocab, &f.batch, &f.seq_len};
    double all = need(c, B), best = 0;
    std::vector<std::pair<double, std::string>> named;  // (bytes halving it saves, flag)
    for (int k = 0; k < 6; k++) {
        Config h = c;
        int hb = B, *size[] = {&h.L, &h.d, &h.F, &h.V, &hb, &h.T};
        if (*size[k] < 2) continue;
        *size[k] /= 2;
        h.hd = std::max(1, h.d / h.H);
        double saved = all - need(h, hb);
        best = std::max(best, saved);
        if (!flags[k]->empty()) named.push_back({saved, *flags[k]});
    }
    std::stable_sort(named.begin(), named.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<std::string> fix;
    for (auto& [saved, flag] : named)
        if (best > 0 && saved >= best / 2) fix.push_back(flag);
    if (fix.empty()) return "it needs a machine with more memory";
    std::string s = "lower " + fix[0];
    for (size_t i = 1; i < fix.size(); i++) s += (i + 1 == fix.size() ? " or " : ", ") + fix[i];
    return s;
}
