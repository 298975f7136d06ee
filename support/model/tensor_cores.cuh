// support/model/tensor_cores.cuh — the tensor cores and the asynchronous
// copies, as the tensor-core kernels (support/model/flash_attention_tc.cuh) use them:
//   to_tf32(x)                      x rounded to TF32 (cvt.rna.tf32.f32: 10 mantissa bits,
//                                   to nearest, ties away from zero), as an mma operand's bits
//   pack_bf16(lo, hi)               two floats rounded to bf16 (to nearest even), lo in the low half
//   mma_m16n8k8_tf32(d, a, b, c)    d (16 x 8) = a (16 x 8) b (8 x 8) + c, TF32 operands, float sums
//   mma_m16n8k16_bf16(d, a, b, c)   d (16 x 8) = a (16 x 16) b (16 x 8) + c, bf16 operands, float sums
//   copy_async_16(dst, src, inside) 16 bytes from global to shared memory by cp.async (not through
//                                   registers; lands by __pipeline_wait_prior), or 16 zeros when !inside;
//   copy_async_4(dst, src, inside)  the same, 4 bytes
//   round_tf32_16(p)                4 floats of shared memory rounded to TF32 in place (to_tf32's
//                                   bits), one 16-byte load and one 16-byte store
//
// An mma is one instruction for the whole warp: each of its 32 lanes gives its
// fragment of a, b and c and gets its fragment of d. Which elements a lane
// holds is the PTX manual's table ("Matrix Fragments for mma.m16n8k8" and
// "... m16n8k16"); with g = lane / 4 (its group) and t = lane % 4 (its place in the group):
//   m16n8k8, .tf32    a: A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]       b: B[t][g], B[t+4][g]
//   m16n8k16, .bf16   a: A[g][2t..2t+1], A[g+8][2t..2t+1], A[g][2t+8..2t+9], A[g+8][2t+8..2t+9]
//                     b: B[2t..2t+1][g], B[2t+8..2t+9][g]            (two bf16 a register, the first low)
//   c and d           C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
// So a group of 4 lanes holds two rows of the result, each lane two neighbouring columns.
//
// Under nvcc these are inline PTX (sm_80 and later); on the harness
// (LIME_EMU) they call its emulation of the same instructions
// (support/harness/cuda_on_cpu.h, section 4), which the harness's tests check
// against plain products. cp.async is CUDA's own API (cuda_pipeline_primitives.h).
#pragma once
#include "support/model/device.cuh"
#ifdef LIME_GPU
#ifndef LIME_EMU
#include <cuda_bf16.h>
#include <cuda_pipeline_primitives.h>
#endif

__device__ __forceinline__ unsigned to_tf32(float x) {
#ifdef LIME_EMU
    return emu::cvt_rna_tf32_f32(x);
#else
    unsigned bits;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));
    return bits;
#endif
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16(lo)) |
           (unsigned)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16;
}

// d may be c (accumulate in place): the instruction reads every c before it writes d.
__device__ __forceinline__ void mma_m16n8k8_tf32(float d[4], const unsigned a[4], const unsigned b[2],
                                                 const float c[4]) {
#ifdef LIME_EMU
    emu::mma_sync_m16n8k8_tf32(d, a, b, c);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
#endif
}

__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2],
                                                  const float c[4]) {
#ifdef LIME_EMU
    emu::mma_sync_m16n8k16_bf16(d, a, b, c);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
#endif
}

// dst in shared memory and src in global memory, both aligned to the size. When
// !inside, src is not read (any aligned device address will do) and dst gets zeros.
// (Each branch passes constants: __pipeline_memcpy_async's switch on them folds away.)
__device__ __forceinline__ void copy_async_16(float* dst, const float* src, bool inside) {
    if (inside) __pipeline_memcpy_async(dst, src, 16);
    else __pipeline_memcpy_async(dst, src, 16, 16);
}
__device__ __forceinline__ void copy_async_4(float* dst, const float* src, bool inside) {
    if (inside) __pipeline_memcpy_async(dst, src, 4);
    else __pipeline_memcpy_async(dst, src, 4, 4);
}

// p 16-byte aligned, in shared memory. Under the harness a vector of g++'s, not a float4: g++ moves a float4
// field by field (four 4-byte accesses, which its bank counter would count as such), a
// vector in one 16-byte access, as nvcc's float4 (LDS.128 and STS.128).
__device__ __forceinline__ void round_tf32_16(float* p) {
#ifdef LIME_EMU
    typedef float Floats4 __attribute__((vector_size(16)));
    Floats4 v = *reinterpret_cast<Floats4*>(p);
    for (int e = 0; e < 4; e++) v[e] = __uint_as_float(to_tf32(v[e]));
    *reinterpret_cast<Floats4*>(p) = v;
#else
    float4 v = *reinterpret_cast<float4*>(p);
    v.x = __uint_as_float(to_tf32(v.x)), v.y = __uint_as_float(to_tf32(v.y));
    v.z = __uint_as_float(to_tf32(v.z)), v.w = __uint_as_float(to_tf32(v.w));
    *reinterpret_cast<float4*>(p) = v;
#endif
}
#endif  // LIME_GPU
