// support/model/flash_attention.cuh — flash-style attention (Dao et al. 2022):
// lime.cu's attention_forward/backward without storing the (B, H, T, T)
// probabilities, for sequences long enough that those would not
// fit (`--attention flash`, or `auto` when the matrix products' version does
// not fit in GPU memory). Keys and values stream through shared memory a tile
// at a time; each row (a query, or a key in the backward) belongs to SPLIT
// neighbouring threads of a warp, each holding W = HD / SPLIT of its floats
// (elements part, part + SPLIT, ...) and keeping, for a query, the running
// maximum mx, the running sum l and the unnormalised output (the online
// softmax). Forward keeps only lse = mx + log l per row, and backward
// recomputes the probabilities tile by tile:
//   p[t][u] = exp(s - lse[t]),  s = scale * q_t . k_u,  u <= t
//   D[t]    = dout_t . out_t              (= sum_u p dp: the softmax backward's dot)
//   dp = dout_t . v_u,   ds = p (dp - D[t])
//   dv_u += p dout_t,    dk_u += scale ds q_t    (one row per key: queries t >= u, the group's heads)
//   dq_t  = scale sum_u ds k_u                   (one row per query)
// No atomics: every output float is one thread's sum in a fixed order; a dot
// product is four partial sums per thread, then an xor butterfly over the row's
// threads, which leaves the same bits in each. Rows are padded to HD (8, 16, 32,
// 64 or 128) with zeros. Splitting a row keeps the registers a thread needs
// under the 255 it may have: no spills (`make nvcc-check` reads ptxas's report).
// This is the simple form of the algorithm (scalar FMAs, no tensor cores):
// it trades the batched products' speed for O(T) memory.
//
// lime.cu's attention dispatchers call it on the GPU; read lime.cu's
// matrix-product attention first. (FLASH_MAX_HD, the widest head it handles,
// is in support/model/lime.h: gpu_create checks it first.)
#pragma once
#include "support/model/device.cuh"
#ifdef LIME_GPU
template <int HD>
struct Flash {
    static constexpr int TILE = HD >= 128 ? 32 : 64;     // rows per tile
    static constexpr int SPLIT = HD >= 64 ? HD / 32 : 1;  // threads per row
    static constexpr int W = HD / SPLIT;                 // floats of a row per thread
    static constexpr int THREADS = TILE * SPLIT;         // per block
};

// tile (TILE, HD) = rows t0 .. t0+TILE-1 of head `head` of x (B, T, nh, hd); zeros past T and past hd.
// The keys and values (R, B, T, hd), head-major, are read as x (R*B, T, 1, hd): entry r*B + b, head 0.
template <int HD>
__device__ void flash_load_rows(float* tile, const float* x, int b, int t0, int T, int nh, int head, int hd) {
    for (int e = threadIdx.x; e < Flash<HD>::TILE * HD; e += blockDim.x) {
        int j = e / HD, i = e % HD, t = t0 + j;
        tile[e] = t < T && i < hd ? x[(((size_t)b * T + t) * nh + head) * hd + i] : 0.0f;
    }
}
// row (W) = this thread's floats (part, part + SPLIT, ...) of x's row t of head `head`, zero padded.
template <int HD>
__device__ void flash_load_row(float* row, const float* x, int b, int t, int T, int nh, int head, int hd, int part) {
    constexpr int SPLIT = Flash<HD>::SPLIT;
    for (int i = 0; i < Flash<HD>::W; i++) {
        int e = i * SPLIT + part;
        row[i] = t < T && e < hd ? x[(((size_t)b * T + t) * nh + head) * hd + e] : 0.0f;
    }
}
// a (W, this thread's floats) . a shared row (HD), summed over the row's SPLIT threads.
template <int HD>
__device__ float flash_dot(const float* a, const float* row, int part) {
    constexpr int SPLIT = Flash<HD>::SPLIT, W = Flash<HD>::W;
    float s[4] = {};
    for (int i = 0; i < W; i++) s[i % 4] += a[i] * row[i * SPLIT + part];
    float sum = (s[0] + s[1]) + (s[2] + s[3]);
    unsigned lanes = ((1u << SPLIT) - 1) << (threadIdx.x % 32 / SPLIT * SPLIT);  // the row's threads
    for (int o = 1; o < SPLIT; o *= 2) sum += __shfl_xor_sync(lanes, sum, o);
    return sum;
}

// grid (T / TILE, H, B), THREADS threads; row = query t. lse (B, H, T).
template <int HD>
__global__ void flash_attention_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                                               int T, int H, int R, int hd, float scale) {
    constexpr int TILE = Flash<HD>::TILE, SPLIT = Flash<HD>::SPLIT, W = Flash<HD>::W;
    DYNAMIC_SHARED(float, smem);
    float *ks = smem, *vs = smem + TILE * HD;  // (TILE, HD) each
    int part = threadIdx.x % SPLIT, t = blockIdx.x * TILE + threadIdx.x / SPLIT, h = blockIdx.y, b = blockIdx.z;
    int r = h / (H / R);
    float qt[W], acc[W];
    flash_load_row<HD>(qt, q, b, t, T, H, h, hd, part);
    for (int i = 0; i < W; i++) acc[i] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
    int end = min(T, (int)(blockIdx.x + 1) * TILE);  // the block's last query sees keys u < end
    for (int u0 = 0; u0 < end; u0 += TILE) {
        __syncthreads();  // everyone is done with the previous tile
        flash_load_rows<HD>(ks, k, r * gridDim.z + b, u0, T, 1, 0, hd);  // k (R, B, T, hd)
        flash_load_rows<HD>(vs, v, r * gridDim.z + b, u0, T, 1, 0, hd);
        __syncthreads();
        int n = t < T ? min(TILE, t - u0 + 1) : 0;  // this tile's keys u <= t
        for (int j = 0; j < n; j++) {
            float s = scale * flash_dot<HD>(qt, ks + j * HD, part);
            if (s > mx) {  // a new maximum: rescale what is summed so far
                float c = expf(mx - s);
                l *= c;
                for (int i = 0; i < W; i++) acc[i] *= c;
                mx = s;
            }
            float p = expf(s - mx);
            l += p;
            for (int i = 0; i < W; i++) acc[i] += p * vs[j * HD + i * SPLIT + part];
        }
    }
    if (t >= T) return;
    float* o = out + (((size_t)b * T + t) * H + h) * hd;
    for (int i = 0; i < W; i++)
        if (i * SPLIT + part < hd) o[i * SPLIT + part] = acc[i] / l;
    if (part == 0) lse[((size_t)b * H + h) * T + t] = mx + logf(l);
}

// D (B, H, T) = the dot of dout and out, per row.
__global__ void flash_rowdot_kernel(float* D, const float* dout, const float* out, int B, int T, int H, int hd) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (B, H, T)
    if (idx >= (size_t)B * H * T) return;
    int t = idx % T, h = (idx / T) % H;
    size_t b = idx / ((size_t)T * H), row = ((b * T + t) * H + h) * hd;
    float s = 0.0f;
    for (int i = 0; i < hd; i++) s += dout[row + i] * out[row + i];
    D[idx] = s;
}

// grid (T / TILE, R, B), THREADS threads; row = key u of kv head r. Writes dk; dv too, or adds into it (add_dv).
template <int HD>
__global__ void flash_attention_backward_kv_kernel(float* dk, float* dv, const float* dout, const float* q,
                                                   const float* k, const float* v, const float* lse, const float* D,
                                                   int T, int H, int R, int hd, float scale, int add_dv) {
    constexpr int TILE = Flash<HD>::TILE, SPLIT = Flash<HD>::SPLIT, W = Flash<HD>::W;
    DYNAMIC_SHARED(float, smem);
    float *qs = smem, *dos = smem + TILE * HD, *lses = smem + 2 * TILE * HD,
          *Ds = lses + TILE;  // (TILE, HD) x2, (TILE) x2
    int part = threadIdx.x % SPLIT, u = blockIdx.x * TILE + threadIdx.x / SPLIT, r = blockIdx.y, b = blockIdx.z;
    int n_rep = H / R;
    float ku[W], vu[W], dku[W], dvu[W];
    flash_load_row<HD>(ku, k, r * gridDim.z + b, u, T, 1, 0, hd, part);  // k (R, B, T, hd)
    flash_load_row<HD>(vu, v, r * gridDim.z + b, u, T, 1, 0, hd, part);
    for (int i = 0; i < W; i++) dku[i] = dvu[i] = 0.0f;
    for (int g = 0; g < n_rep; g++) {
        int h = r * n_rep + g;
        for (int t0 = blockIdx.x * TILE; t0 < T;
             t0 += TILE) {  // queries before the block's first key see none of its keys
            __syncthreads();
            flash_load_rows<HD>(qs, q, b, t0, T, H, h, hd);
            flash_load_rows<HD>(dos, dout, b, t0, T, H, h, hd);
            for (int j = threadIdx.x; j < TILE; j += blockDim.x) {
                size_t row = ((size_t)b * H + h) * T + t0 + j;
                lses[j] = t0 + j < T ? lse[row] : 0.0f;
                Ds[j] = t0 + j < T ? D[row] : 0.0f;
            }
            __syncthreads();
            if (u >= T) continue;
            int n = min(TILE, T - t0);
            for (int j = max(0, u - t0); j < n; j++) {  // queries t = t0 + j >= u
                const float *qj = qs + j * HD, *dj = dos + j * HD;
                float p = expf(scale * flash_dot<HD>(ku, qj, part) - lses[j]);
                float ds = p * (flash_dot<HD>(vu, dj, part) - Ds[j]);
                for (int i = 0; i < W; i++) {
                    dvu[i] += p * dj[i * SPLIT + part];
                    dku[i] += scale * ds * qj[i * SPLIT + part];
                }
            }
        }
    }
    if (u >= T) return;
    size_t row = (((size_t)r * gridDim.z + b) * T + u) * hd;  // dk, dv (R, B, T, hd)
    for (int i = 0; i < W; i++)
        if (int e = i * SPLIT + part; e < hd) dk[row + e] = dku[i], dv[row + e] = (add_dv ? dv[row + e] : 0.0f) + dvu[i];
}

// grid (T / TILE, H, B), THREADS threads; row = query t. Writes dq.
template <int HD>
__global__ void flash_attention_backward_q_kernel(float* dq, const float* dout, const float* q, const float* k,
                                                  const float* v, const float* lse, const float* D, int T, int H, int R,
                                                  int hd, float scale) {
    constexpr int TILE = Flash<HD>::TILE, SPLIT = Flash<HD>::SPLIT, W = Flash<HD>::W;
    DYNAMIC_SHARED(float, smem);
    float *ks = smem, *vs = smem + TILE * HD;
    int part = threadIdx.x % SPLIT, t = blockIdx.x * TILE + threadIdx.x / SPLIT, h = blockIdx.y, b = blockIdx.z;
    int r = h / (H / R);
    float qt[W], dot[W], dqt[W];
    flash_load_row<HD>(qt, q, b, t, T, H, h, hd, part);
    flash_load_row<HD>(dot, dout, b, t, T, H, h, hd, part);
    for (int i = 0; i < W; i++) dqt[i] = 0.0f;
    size_t row = ((size_t)b * H + h) * T + t;
    float lse_t = t < T ? lse[row] : 0.0f, D_t = t < T ? D[row] : 0.0f;
    int end = min(T, (int)(blockIdx.x + 1) * TILE);
    for (int u0 = 0; u0 < end; u0 += TILE) {
        __syncthreads();
        flash_load_rows<HD>(ks, k, r * gridDim.z + b, u0, T, 1, 0, hd);  // k (R, B, T, hd)
        flash_load_rows<HD>(vs, v, r * gridDim.z + b, u0, T, 1, 0, hd);
        __syncthreads();
        int n = t < T ? min(TILE, t - u0 + 1) : 0;
        for (int j = 0; j < n; j++) {
            const float* kj = ks + j * HD;
            float p = expf(scale * flash_dot<HD>(qt, kj, part) - lse_t);
            float ds = p * (flash_dot<HD>(dot, vs + j * HD, part) - D_t);
            for (int i = 0; i < W; i++) dqt[i] += ds * kj[i * SPLIT + part];
        }
    }
    if (t >= T) return;
    float* out = dq + (((size_t)b * T + t) * H + h) * hd;
    for (int i = 0; i < W; i++)
        if (int e = i * SPLIT + part; e < hd) out[e] = scale * dqt[i];
}

// Calls f(w) with w the compile-time row width HD for hd <= FLASH_MAX_HD.
template <class F>
static void with_flash_width(int hd, F f) {
    if (hd <= 8) f(std::integral_constant<int, 8>());
    else if (hd <= 16) f(std::integral_constant<int, 16>());
    else if (hd <= 32) f(std::integral_constant<int, 32>());
    else if (hd <= 64) f(std::integral_constant<int, 64>());
    else f(std::integral_constant<int, 128>());
}

// lse (B, H, T): what backward needs of the probabilities.
static void flash_attention_forward_gpu(float* out, float* lse, const float* q, const float* k, const float* v, int B,
                                        int T, int H, int R, int hd, cudaStream_t stream) {
    float scale = 1.0f / sqrtf((float)hd);
    with_flash_width(hd, [&](auto w) {
        constexpr int HD = decltype(w)::value, TILE = Flash<HD>::TILE, THREADS = Flash<HD>::THREADS;
        LAUNCH(flash_attention_forward_kernel<HD>, dim3(ceil_div(T, TILE), H, B), THREADS,
               2 * TILE * HD * sizeof(float), stream)
        (out, lse, q, k, v, T, H, R, hd, scale);
    });
    launchCheck();
}

// dq and dk are written, dv too or added to (add_dv), as op_attention_backward's. scratch: B*H*T floats (D).
static void flash_attention_backward_gpu(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                         const float* q, const float* k, const float* v, const float* lse, int B, int T,
                                         int H, int R, int hd, bool add_dv, float* scratch, cudaStream_t stream) {
    float scale = 1.0f / sqrtf((float)hd), *D = scratch;
    LAUNCH(flash_rowdot_kernel, ceil_div((size_t)B * H * T, 256), 256, 0, stream)(D, dout, out, B, T, H, hd);
    launchCheck();
    with_flash_width(hd, [&](auto w) {
        constexpr int HD = decltype(w)::value, TILE = Flash<HD>::TILE, THREADS = Flash<HD>::THREADS;
        LAUNCH(flash_attention_backward_kv_kernel<HD>, dim3(ceil_div(T, TILE), R, B), THREADS,
               (2 * TILE * HD + 2 * TILE) * sizeof(float), stream)
        (dk, dv, dout, q, k, v, lse, D, T, H, R, hd, scale, add_dv);
        LAUNCH(flash_attention_backward_q_kernel<HD>, dim3(ceil_div(T, TILE), H, B), THREADS,
               2 * TILE * HD * sizeof(float), stream)
        (dq, dout, q, k, v, lse, D, T, H, R, hd, scale);
    });
    launchCheck();
}
#endif  // LIME_GPU
