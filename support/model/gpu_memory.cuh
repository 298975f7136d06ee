// support/model/gpu_memory.cuh — the GPU's side of a model: the device, its
// memory (three cudaMallocs, carved like the host's), the stream, the cuBLAS
// handle, and the staging of each step's batch and numbers through pinned
// memory. lime.cu's GPU build includes it at its end; the kernels sit beside
// their CPU ops in lime.cu, and GpuState is defined there.

bool gpu_available(std::string* why) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n < 1) {
        cudaGetLastError();  // clear it: asking is not a failure
        *why = std::string("no CUDA device found (cudaGetDeviceCount: ") +
               (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + "); use --device cpu";
        return false;
    }
    return true;
}

const char* model_attention_name(const Model* model) {
    return !model->gpu ? "cpu" : model->gpu->acts.flash ? "flash" : "matmul";
}

// The handle's math mode: TF32 tensor cores, or plain float32 (ModelSettings::tf32, read before each step).
static void gpu_apply_math(GpuState* G, bool tf32) {
    if (G->tf32 == tf32) return;
    cublasCheck(cublasSetMathMode(G->blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    G->tf32 = tf32;
}

bool gpu_info(GpuInfo* info) {
    std::string why;
    if (!gpu_available(&why)) return false;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    info->name = prop.name;
    info->major = prop.major;
    info->minor = prop.minor;
    cudaCheck(cudaMemGetInfo(&info->free_bytes, &info->total_bytes));
    return true;
}

size_t model_device_bytes(const Model* model) { return model->gpu ? model->gpu->device_bytes : 0; }

// cuBLAS's workspace, ours so that graph capture allocates nothing (32 MiB: NVIDIA's advice for Hopper).
static const size_t CUBLAS_WORKSPACE_BYTES = 32u << 20;

// The line for a model the device cannot hold, with the flags that would shrink it (memory_fix).
static std::string gpu_out_of_memory(const Model* model, bool flash, size_t need, size_t free_bytes) {
    char buf[200];
    snprintf(buf, sizeof buf, "needs %.2f GB of GPU memory, the device has %.2f GB free; ", need / 1e9,
             free_bytes / 1e9);
    return buf + memory_fix(model->c, model->B, model->settings.flags, [&](const Config& h, int hb) {
               return memory_needed(h, hb, DEVICE_GPU, true, flash);
           });
}

// Where each piece of an allocation starts: pieces one after another, 256-byte aligned.
static size_t place(size_t* off, size_t bytes) {
    size_t at = *off;
    *off += (bytes + 255) & ~(size_t)255;
    return at;
}

// The small allocation: the gradient norm's partial sums, the update's
// numbers, the metrics and cuBLAS's workspace. With base == nullptr it only measures.
static size_t gpu_carve_small(GpuState* G, char* base, size_t n_params) {
    size_t bytes = 0;
    size_t at_partial = place(&bytes, grad_norm_blocks(n_params) * sizeof(double)),
           at_numbers = place(&bytes, sizeof(AdamWNumbers));
    size_t at_metrics = place(&bytes, sizeof(Metrics)), at_workspace = place(&bytes, CUBLAS_WORKSPACE_BYTES);
    if (!base) return bytes;
    G->norm_partial = (double*)(base + at_partial);
    G->numbers = (AdamWNumbers*)(base + at_numbers);
    G->metrics = (Metrics*)(base + at_metrics);
    cudaCheck(cudaStreamCreateWithFlags(&G->stream, cudaStreamNonBlocking));
    cublasCheck(cublasCreate(&G->blas));
    cublasCheck(cublasSetStream(G->blas, G->stream));
    // after cublasSetStream (which resets it): cuBLAS then allocates nothing while a graph is captured
    cublasCheck(cublasSetWorkspace(G->blas, base + at_workspace, CUBLAS_WORKSPACE_BYTES));
    return bytes;
}

// Pinned staging: per slot tokens, targets, mask, valid (B*T each) and the update's numbers; then the metrics.
static void gpu_make_staging(GpuState* G, size_t BT) {
    size_t bytes = 0, at_slot[2][5];
    for (auto& s : at_slot) {
        s[0] = place(&bytes, BT * sizeof(int));
        s[1] = place(&bytes, BT * sizeof(int));
        s[2] = place(&bytes, BT * sizeof(float));
        s[3] = place(&bytes, sizeof(AdamWNumbers));
        s[4] = place(&bytes, BT * sizeof(float));
    }
    size_t at_metrics_host = place(&bytes, sizeof(Metrics));
    cudaCheck(cudaMallocHost(&G->pinned, bytes));
    char* pinned = (char*)G->pinned;
    for (int k = 0; k < 2; k++) {
        GpuState::Slot& s = G->slot[k];
        s.tokens = (int*)(pinned + at_slot[k][0]);
        s.targets = (int*)(pinned + at_slot[k][1]);
        s.mask = (float*)(pinned + at_slot[k][2]);
        s.numbers = (AdamWNumbers*)(pinned + at_slot[k][3]);
        s.valid = (float*)(pinned + at_slot[k][4]);
        cudaCheck(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    }
    G->metrics_host = (Metrics*)(pinned + at_metrics_host);
}

// The parameter array as runs of tensors that share an AdamW group.
static std::vector<AdamWRun> adamw_runs(const std::vector<TensorSpec>& specs) {
    std::vector<AdamWRun> runs;
    for (const TensorSpec& t : specs) {
        if (!runs.empty() && runs.back().group == t.group) runs.back().numel += t.numel;
        else runs.push_back({t.offset, t.numel, t.group});
    }
    return runs;
}

// cudaMalloc that answers false (and clears the error) when the memory is not there.
static bool device_alloc(void** p, size_t bytes) {
    if (cudaMalloc(p, bytes) == cudaSuccess) return true;
    cudaGetLastError();
    *p = nullptr;
    return false;
}

// The host arrays (params, grads, adam_m, adam_v: 4 * n_params floats) to and from the device's, in one copy.
static void gpu_to_device(Model* model) {
    cudaCheck(cudaMemcpyAsync(model->gpu->mem, model->params, 4 * model->n_params * sizeof(float),
                              cudaMemcpyHostToDevice, model->gpu->stream));
    cudaCheck(cudaStreamSynchronize(model->gpu->stream));
}
static void gpu_to_host(Model* model) {
    cudaCheck(cudaMemcpyAsync(model->params, model->gpu->mem, 4 * model->n_params * sizeof(float),
                              cudaMemcpyDeviceToHost, model->gpu->stream));
    cudaCheck(cudaStreamSynchronize(model->gpu->stream));
}

// Device memory (three cudaMallocs), pinned staging (one cudaMallocHost), the
// stream, the cuBLAS handle; then the host's parameters copied over. Sizes
// first, so that too big a model is refused with a message, not an abort.
static std::string gpu_create(Model* model) {
    std::string why;
    if (!gpu_available(&why)) return why;
    const Config& c = model->c;
    Attention attention = model->settings.attention;
    GpuState* G = model->gpu = new GpuState();
    size_t n = model->n_params;
    if (attention == ATTENTION_FLASH && c.hd > FLASH_MAX_HD)
        return "--attention flash handles head dims up to " + std::to_string(FLASH_MAX_HD) + ", this model has " +
               std::to_string(c.hd) + "; use --attention matmul";
    bool flash = attention == ATTENTION_FLASH;
    size_t acts_floats = acts_carve(&G->acts, c, model->B, nullptr, DEVICE_GPU, flash),
           small_bytes = gpu_carve_small(G, nullptr, n);
    size_t fixed_bytes = 4 * n * sizeof(float) + small_bytes, need = fixed_bytes + acts_floats * sizeof(float);
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaSetDevice(0));
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (need > free_bytes && attention == ATTENTION_AUTO &&
        c.hd <= FLASH_MAX_HD) {  // the (T, T) probabilities do not fit: flash
        flash = true;
        acts_floats = acts_carve(&G->acts, c, model->B, nullptr, DEVICE_GPU, flash);
        need = fixed_bytes + acts_floats * sizeof(float);
    }
    if (need > free_bytes || !device_alloc((void**)&G->mem, 4 * n * sizeof(float)) ||
        !device_alloc((void**)&G->acts.mem, acts_floats * sizeof(float)) || !device_alloc(&G->small, small_bytes))
        return gpu_out_of_memory(model, flash, need, free_bytes);
    G->device_bytes = need;
    G->p = params_carve(c, G->mem);
    G->g = params_carve(c, G->mem + n);
    acts_carve(&G->acts, c, model->B, G->acts.mem, DEVICE_GPU, flash);
    gpu_carve_small(G, (char*)G->small, n);
    G->tf32 = model->settings.tf32;
    cublasCheck(cublasSetMathMode(G->blas, G->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    gpu_make_staging(G, (size_t)model->B * c.T);
    G->runs = adamw_runs(model->specs);
    // (every copy on the model's stream: it does not wait for the legacy stream; gpu_to_device below waits)
    cudaCheck(cudaMemsetAsync(G->metrics, 0, sizeof(Metrics), G->stream));
    // the RoPE tables, computed on the host as the CPU path's
    std::vector<float> cos_t((size_t)c.T * c.hd / 2), sin_t((size_t)c.T * c.hd / 2);
    rope_tables(cos_t.data(), sin_t.data(), c.T, c.hd, c.rope_theta);
    cudaCheck(cudaMemcpyAsync(G->acts.rope_cos, cos_t.data(), cos_t.size() * sizeof(float), cudaMemcpyHostToDevice,
                              G->stream));
    cudaCheck(cudaMemcpyAsync(G->acts.rope_sin, sin_t.data(), sin_t.size() * sizeof(float), cudaMemcpyHostToDevice,
                              G->stream));
    gpu_to_device(model);
    return "";
}

static void gpu_free(Model* model) {
    GpuState* G = model->gpu;
    if (G->stream) cudaCheck(cudaStreamSynchronize(G->stream));
    for (auto& kv : G->graphs)
        if (kv.second) cudaCheck(cudaGraphExecDestroy(kv.second));  // nullptr: that shape ran eagerly only
    for (auto& s : G->slot)
        if (s.copied) cudaCheck(cudaEventDestroy(s.copied));
    if (G->blas) cublasCheck(cublasDestroy(G->blas));
    if (G->stream) cudaCheck(cudaStreamDestroy(G->stream));
    cudaCheck(cudaFreeHost(G->pinned));
    cudaCheck(cudaFree(G->small));
    cudaCheck(cudaFree(G->acts.mem));
    cudaCheck(cudaFree(G->mem));
    delete G;
    model->gpu = nullptr;
}

// Host arrays -> pinned slot -> device, queued on the stream. The slot used
// two calls ago is reused: waiting for its copies to finish is the only
// waiting here, and it lets the host run up to two steps ahead of the device.
static void gpu_stage(Model* model, const int* tokens, const int* targets, const float* mask, const float* valid,
                      int N, const AdamWNumbers* numbers) {
    GpuState* G = model->gpu;
    gpu_apply_math(G, model->settings.tf32);
    GpuState::Slot& s = G->slot[G->next_slot];
    G->next_slot ^= 1;
    cudaCheck(cudaEventSynchronize(s.copied));
    Acts& A = G->acts;
    auto up = [&](void* dst, void* pinned, const void* src, size_t bytes) {
        if (pinned != src) memcpy(pinned, src, bytes);
        cudaCheck(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, G->stream));
    };
    if (tokens) up(A.tokens, s.tokens, tokens, N * sizeof(int));
    if (targets) up(A.targets, s.targets, targets, N * sizeof(int));
    if (mask) up(A.mask, s.mask, mask, N * sizeof(float));
    if (tokens && model->ereg_on && !valid) std::fill(s.valid, s.valid + N, 1.0f);  // the regulariser's: all valid
    if (tokens && model->ereg_on) up(A.valid, s.valid, valid ? valid : s.valid, N * sizeof(float));
    if (numbers) up(G->numbers, s.numbers, numbers, sizeof(AdamWNumbers));
    cudaCheck(cudaEventRecord(s.copied, G->stream));
}

// Waits for the device, then reads the loss and the gradient norm.
static void gpu_read_metrics(Model* model) {
    GpuState* G = model->gpu;
    cudaCheck(cudaMemcpyAsync(G->metrics_host, G->metrics, sizeof(Metrics), cudaMemcpyDeviceToHost, G->stream));
    cudaCheck(cudaStreamSynchronize(G->stream));
    model->last_loss = G->metrics_host->loss;
    model->last_ce = model->ereg_on ? G->metrics_host->ce : model->last_loss;
    model->last_s2 = model->ereg_on ? G->metrics_host->s2 : 0.0f;
    model->last_norm = G->metrics_host->norm;
}
