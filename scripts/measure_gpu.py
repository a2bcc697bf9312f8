"""Measure the reference curves of configs/reference/<gpu>.yaml on a real NVIDIA GPU.

Each benchmark is the CUDA twin of the archsim kernel it is compared with (archsim/micro.py), so a
curve compares the same kernel shape on the model and on the chip:

- chase: one thread follows a random cycle of 8-byte pointers, one per 128-byte line, over a
  footprint (micro latency: warm-up pass, then timed loads, cycles from clock64).
- stream: grid-stride 16-byte loads, four independent loads per thread per iteration, blocks of at
  most 8 warps filling `occupancy` of every SM's warp slots (micro bandwidth); against footprint
  and against occupancy. Bytes moved over kernel time.
- shared_chase, ffma_latency: dependent chains timed with clock64.
- stream_ilp: stream reads with 1, 2 or 4 loads in flight per thread, against occupancy (at 8, ptxas
  holds the kernel to 32 registers for full occupancy and keeps only 4-5 in flight).
- loaded_latency: a pointer chase beside a stream of rising occupancy (latency under load).
- launch: empty kernels of rising grid size (launch overhead and block dispatch rate).
- stream_kinds_occupancy: write and copy twins (4 chunks in flight a thread) against occupancy.
- one_sm_stream: stream_ilp on one SM alone, 1 to 32 warps (the misses one SM keeps in flight).
- l2_half_map: which L2 half each 32 B / 128 B / 1 KiB of memory lives in, from DRAM-miss latency.
- mma_rate: mma.sync m16n8k16 (f16 in, f32 accumulators) a warp issues back to back, against warps an SM and
  independent accumulator chains a warp (the tensor pipe's rate and latency as mma.sync sees them).
- mma_mix: mma.sync with FFMA or ldmatrix.x4 beside it in the same warp (what else a sub-core issues in the
  shadow of its mma), 1 and 2 warps a sub-core.
- mma_mix2: mma.sync with a bar.sync or cp.async (L2-resident source) every 8 mma, 4 warps a block (one a
  sub-core): the GEMM main loop's other costs, one at a time.
- smem_mix: cp.async fills into shared memory (from L1 with .ca, from L2 with .cg) beside ldmatrix.x4
  reads, alone and together: whether fills take the shared-memory array's cycles.
- l2_share: L2-resident reads by groups of 1 to all SMs sharing one window, in step or spread over it (whether
  the L2 serves a line many SMs read at once faster than distinct lines, as smem_mix and mma_mix2 suggest); and
  cold, in step, after the windows were pushed out of the L2 (how it takes many SMs missing on one line).
- gemm_twin: archsim's own tensor-core GEMM kernel in CUDA (mma.sync, 128 x 128 x 64 tiles, 4 stages of
  cp.async, ldmatrix, grouped raster), checked against a float32 product, timed beside cuBLAS.
- gemm_parts: gemm_twin's main loop with its copies, fragment loads, mma or barrier left out, on 1 block, one
  wave and 4096^3, each block's loop timed by clock64 (where a k tile's cycles go).
- gemm (torch.matmul, cuBLAS), attention (scaled_dot_product_attention, flash), gemv (decode).

Needs CuPy and PyTorch with a GPU. Writes JSON (one object per benchmark) to the path given, after
every benchmark, so a run cut short keeps what it measured.

    python scripts/measure_gpu.py OUT.json [--quick] [--only=NAME,...] [--occupancy-mib=MIB,...]
"""

from __future__ import annotations

import json
import math
import sys
import time
import traceback

import numpy as np

SRC = r"""
extern "C" __global__ void chase(unsigned long long start, long long warm, long long loads, long long* out)
{
    unsigned long long p = start;
    for (long long i = 0; i < warm; ++i) asm volatile("ld.global.u64 %0, [%0];" : "+l"(p));
    long long t0 = clock64();
    for (long long i = 0; i < loads; ++i) asm volatile("ld.global.u64 %0, [%0];" : "+l"(p));
    long long t1 = clock64();
    out[0] = t1 - t0;
    out[1] = (long long)p;
}

extern "C" __global__ void stream_read(const float4* __restrict__ b, long long chunks, float* out)
{
    long long S = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.f;
    for (; i < chunks; i += 4 * S) {
        float4 v0 = b[i], v1 = b[i + S], v2 = b[i + 2 * S], v3 = b[i + 3 * S];
        acc += v0.x + v0.y + v0.z + v0.w + v1.x + v1.y + v1.z + v1.w
             + v2.x + v2.y + v2.z + v2.w + v3.x + v3.y + v3.z + v3.w;
    }
    if (acc == 1234.5f) out[0] = acc;
}

extern "C" __global__ void stream_write(float4* __restrict__ a, long long chunks)
{
    long long S = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float4 v = make_float4(1.f, 1.f, 1.f, 1.f);
    for (; i < chunks; i += 4 * S) { a[i] = v; a[i + S] = v; a[i + 2 * S] = v; a[i + 3 * S] = v; }
}

extern "C" __global__ void stream_copy(float4* __restrict__ a, const float4* __restrict__ b, long long chunks)
{
    long long S = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < chunks; i += 4 * S) {
        float4 v0 = b[i], v1 = b[i + S], v2 = b[i + 2 * S], v3 = b[i + 3 * S];
        a[i] = v0; a[i + S] = v1; a[i + 2 * S] = v2; a[i + 3 * S] = v3;
    }
}

extern "C" __global__ void empty_kernel(float* out) { if (threadIdx.x == 9999) out[0] = 1.f; }

// archsim's l2_bandwidth probe (micro.l2_bandwidth): block b owns rows b, b + B, ... (a row is one
// 16-byte chunk per thread); iteration k reads four rows of block (b + k*P) mod B, so the L1 never
// holds them. No grid barrier here: many iterations make the warm-up and the skew negligible.
extern "C" __global__ void l2_stream(const float4* __restrict__ buf, long long iters, int per_core, int nrows,
                                     float* out)
{
    long long B = gridDim.x, T = blockDim.x;
    long long row = T;                        // float4 per row
    long long blk = blockIdx.x, r = 0;
    float acc = 0.f;
    for (long long k = 0; k < iters; ++k) {
        blk += per_core;
        if (blk >= B) blk -= B;
        const float4* p = buf + (r * B + blk) * row + threadIdx.x;
        float4 a = p[0], b = p[B * row], c = p[2 * B * row], d = p[3 * B * row];
        acc += a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w + c.x + c.y + c.z + c.w + d.x + d.y + d.z + d.w;
        r = (r + 4) & (nrows - 1);
    }
    if (acc == 1234.5f) out[0] = acc;
}

extern "C" __global__ void shared_chase(long long loads, long long* out)
{
    __shared__ unsigned int s[256];
    unsigned int sb = (unsigned int)__cvta_generic_to_shared(s);
    for (int i = 0; i < 256; ++i) s[i] = sb + ((i + 1) % 256) * 4;   // absolute shared addresses
    __syncthreads();
    unsigned int p = sb;
    asm volatile("ld.shared.u32 %0, [%0];" : "+r"(p));
    long long t0 = clock64();
    for (long long i = 0; i < loads; ++i) asm volatile("ld.shared.u32 %0, [%0];" : "+r"(p));
    long long t1 = clock64();
    out[0] = t1 - t0;
    out[1] = (long long)p;
}

extern "C" __global__ void ffma_chain(float a, float b, long long n, long long* out, float* sink)
{
    float x = a;
    long long t0 = clock64();
    for (long long i = 0; i < n; ++i) {
        x = fmaf(x, b, a); x = fmaf(x, b, a); x = fmaf(x, b, a); x = fmaf(x, b, a);
        x = fmaf(x, b, a); x = fmaf(x, b, a); x = fmaf(x, b, a); x = fmaf(x, b, a);
    }
    long long t1 = clock64();
    out[0] = t1 - t0;
    sink[0] = x;
}
// Streams with U loads in flight per thread: '#pragma unroll 1' stops the compiler from unrolling the loop further
// (the plain stream_read above is unrolled 4x by NVVM, so its loads in flight are ptxas's choice). At U = 8 ptxas
// keeps the kernel at 32 registers and issues the second four loads as the first four are summed.
#define STREAM_ILP(U) \
extern "C" __global__ void stream_ilp##U(const float4* __restrict__ b, long long chunks, float* out) \
{ \
    long long S = (long long)gridDim.x * blockDim.x; \
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; \
    float acc = 0.f; \
    _Pragma("unroll 1") for (; i < chunks; i += U * S) { \
        float4 v[U]; \
        _Pragma("unroll") for (int u = 0; u < U; ++u) v[u] = b[i + u * S]; \
        _Pragma("unroll") for (int u = 0; u < U; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w; \
    } \
    if (acc == 1234.5f) out[0] = acc; \
}
STREAM_ILP(1)
STREAM_ILP(2)
STREAM_ILP(4)
STREAM_ILP(8)

// Loaded latency: block 0's thread 0 follows a pointer chase while every other block streams (4 loads in flight
// per thread, as stream_ilp4) until the chase is done. Latency under load against the bandwidth beside it.
extern "C" __global__ void loaded_chase(unsigned long long start, long long warm, long long loads, long long* out,
                                        const float4* __restrict__ b, long long chunks, volatile int* stop,
                                        unsigned long long* iters, float* sink)
{
    if (blockIdx.x == 0) {
        if (threadIdx.x != 0) return;
        unsigned long long p = start;
        for (long long i = 0; i < warm; ++i) asm volatile("ld.global.u64 %0, [%0];" : "+l"(p));
        unsigned long long g0, g1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
        long long t0 = clock64();
        for (long long i = 0; i < loads; ++i) asm volatile("ld.global.u64 %0, [%0];" : "+l"(p));
        long long t1 = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
        out[0] = t1 - t0;
        out[1] = (long long)p;
        out[2] = (long long)(g1 - g0);
        __threadfence();
        *stop = 1;
        return;
    }
    long long S = (long long)(gridDim.x - 1) * blockDim.x;
    long long i0 = (long long)(blockIdx.x - 1) * blockDim.x + threadIdx.x, i = i0;
    unsigned long long n = 0;
    float acc = 0.f;
    _Pragma("unroll 1") while (true) {
        _Pragma("unroll 1") for (int r = 0; r < 8; ++r) {
            float4 v0 = b[i], v1 = b[i + S], v2 = b[i + 2 * S], v3 = b[i + 3 * S];
            acc += v0.x + v0.y + v0.z + v0.w + v1.x + v1.y + v1.z + v1.w
                 + v2.x + v2.y + v2.z + v2.w + v3.x + v3.y + v3.z + v3.w;
            i += 4 * S;
            if (i >= chunks) i = i0;
        }
        n += 8;
        if (*stop) break;
    }
    atomicAdd(iters, n);
    if (acc == 1234.5f) sink[0] = acc;
}
// Which L2 half each piece of memory lives in, as one SM sees it: after an L2 flush, thread 0 of the block on SM
// `sm` loads pieces `gran` bytes apart over its own region one at a time, and times each (a DRAM miss through the
// near half or through the far one). A first load to the same 2 MiB page takes the TLB miss out.
extern "C" __global__ void half_probe(const char* base, long long region, long long gran, int n, int want_sm,
                                      long long* out, int* claim)
{
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    if (threadIdx.x != 0 || (int)sm != want_sm || atomicCAS(claim, 0, 1) != 0) return;   // one block of that SM
    const char* r = base + (long long)want_sm * region;
    unsigned int w;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(w) : "l"(r + (1536 << 10)));
    unsigned int acc = w;
    for (int k = 0; k < n; ++k) {
        unsigned int v;
        long long t0 = clock64();
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(r + k * gran + ((acc & 1) << 2)));
        acc += v;
        asm volatile("add.u32 %0, %0, %1;" : "+r"(acc) : "r"(v));
        long long t1 = clock64();
        out[k] = t1 - t0;
    }
    if (acc == 12345u) out[n] = acc;
}
// Streams from one SM with several blocks: every block not on SM `want_sm` leaves at once; the blocks on it
// number themselves (rank) and stream 4 loads in flight a thread, grid-stride over `nranks` blocks. `ranks`
// counts the blocks that took part (the caller checks it is nranks).
extern "C" __global__ void sm_stream(const float4* __restrict__ b, long long chunks, int want_sm, int nranks,
                                     int* ranks, float* sink)
{
    __shared__ int rank;
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    if ((int)sm != want_sm) return;
    if (threadIdx.x == 0) rank = atomicAdd(ranks, 1);
    __syncthreads();
    if (rank >= nranks) return;
    long long S = (long long)nranks * blockDim.x;
    long long i = (long long)rank * blockDim.x + threadIdx.x;
    float acc = 0.f;
    _Pragma("unroll 1") for (; i < chunks; i += 4 * S) {
        float4 v0 = b[i], v1 = b[i + S], v2 = b[i + 2 * S], v3 = b[i + 3 * S];
        acc += v0.x + v0.y + v0.z + v0.w + v1.x + v1.y + v1.z + v1.w
             + v2.x + v2.y + v2.z + v2.w + v3.x + v3.y + v3.z + v3.w;
    }
    if (acc == 1234.5f) sink[0] = acc;
}
// Write and copy twins of micro bandwidth's kernels: 4 chunks a thread per iteration, the loop not unrolled further.
extern "C" __global__ void stream_write_ilp4(float4* __restrict__ a, long long chunks)
{
    long long S = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float4 v = make_float4(1.f, 1.f, 1.f, 1.f);
    _Pragma("unroll 1") for (; i < chunks; i += 4 * S) { a[i] = v; a[i + S] = v; a[i + 2 * S] = v; a[i + 3 * S] = v; }
}

extern "C" __global__ void stream_copy_ilp4(float4* __restrict__ a, const float4* __restrict__ b, long long chunks)
{
    long long S = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    _Pragma("unroll 1") for (; i < chunks; i += 4 * S) {
        float4 v0 = b[i], v1 = b[i + S], v2 = b[i + 2 * S], v3 = b[i + 3 * S];
        a[i] = v0; a[i + S] = v1; a[i + 2 * S] = v2; a[i + 3 * S] = v3;
    }
}
"""

MMA_MIX_SRC = r"""
// What else a warp issues beside its mma.sync: each iteration runs 4 independent m16n8k16 mma (one a chain),
// NF independent FFMA after each mma, and NL ldmatrix.x4 (conflict-free, from shared memory, into registers not
// read until the end) spread over the 4; the loop is unrolled twice so an ldmatrix's registers are rewritten 8
// mma later. One block an SM, thread 0 times it with clock64.
template <int NF, int NL>
__device__ __forceinline__ void mix_half(float (&acc)[4][4], float (&f)[8], unsigned (&l)[4][4], unsigned a0,
                                         unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1,
                                         unsigned saddr, float x, float y)
{
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#pragma unroll
        for (int j = 0; j < NF; ++j)
            asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(f[(c * NF + j) & 7]) : "f"(x), "f"(y));
        if (c < NL)
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(l[c][0]), "=r"(l[c][1]), "=r"(l[c][2]), "=r"(l[c][3]) : "r"(saddr + c * 512));
    }
}

template <int NF, int NL>
__device__ __forceinline__ void mix(long long iters, float* sink, long long* cycles)
{
    __shared__ __align__(128) unsigned char buf[4096];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) ((unsigned*)buf)[i] = i;
    unsigned a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u, b0 = a0 ^ 0x3c003c00u, b1 = a0 | 0x3c00u;
    unsigned saddr = (unsigned)__cvta_generic_to_shared(buf) + (threadIdx.x & 31) * 16;
    float acc[4][4] = {}, f[8] = {}, x = 1.0f + threadIdx.x * 1e-7f, y = 1e-7f;
    unsigned l0[4][4] = {}, l1[4][4] = {};
    __syncthreads();
    long long t0 = clock64();
    for (long long i = 0; i < iters; ++i) {
        mix_half<NF, NL>(acc, f, l0, a0, a1, a2, a3, b0, b1, saddr, x, y);
        mix_half<NF, NL>(acc, f, l1, a0, a1, a2, a3, b0, b1, saddr + 2048, x, y);
    }
    __syncthreads();
    long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < 4; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3] + (float)(l0[c][0] ^ l1[c][3]);
#pragma unroll
    for (int j = 0; j < 8; ++j) s += f[j];
    if (s == 1234.5f) sink[0] = s;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
#define MIX(NF, NL) extern "C" __global__ void mix_f##NF##_l##NL(long long it, float* s, long long* c) { mix<NF, NL>(it, s, c); }
MIX(0, 0) MIX(1, 0) MIX(2, 0) MIX(4, 0) MIX(8, 0) MIX(0, 1) MIX(0, 2) MIX(0, 4) MIX(2, 1)
"""

MMA_MIX2_SRC = r"""
// mma.sync with a barrier or cp.async beside it: each round a warp runs 8 mma (4 independent chains, twice),
// then BAR bar.sync and NC cp.async.cg 16-B copies from an L2-resident 4 MiB window into shared memory (a
// commit group a round, at most 6 in flight). One block an SM; thread 0 times it with clock64.
template <int BAR, int NC>
__device__ __forceinline__ void mix2(const float4* __restrict__ src, long long iters, float* sink, long long* cycles)
{
    __shared__ __align__(128) unsigned char ring[16384];
    const unsigned rbase = (unsigned)__cvta_generic_to_shared(ring);
    unsigned a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u, b0 = a0 ^ 0x3c003c00u, b1 = a0 | 0x3c00u;
    float acc[4][4] = {};
    long long off = threadIdx.x;
    unsigned wpos = threadIdx.x * 16;
    __syncthreads();
    long long t0 = clock64();
    for (long long i = 0; i < iters; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#pragma unroll
        for (int b = 0; b < BAR; ++b) __syncthreads();
        if (NC > 0) {
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                             :: "r"(rbase + (wpos & 16383)), "l"(src + (off & 262143)));
                off += blockDim.x;
                wpos += blockDim.x * 16;
            }
            asm volatile("cp.async.commit_group;");
            asm volatile("cp.async.wait_group 6;");
        }
    }
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < 4; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    if (s == 1234.5f) sink[0] = s;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
#define MIX2(BAR, NC) extern "C" __global__ void mix2_b##BAR##_c##NC(const float4* s, long long it, float* k, long long* c) \
    { mix2<BAR, NC>(s, it, k, c); }
MIX2(0, 0) MIX2(1, 0) MIX2(0, 1) MIX2(0, 2) MIX2(1, 1)
"""

SMEM_MIX_SRC = r"""
// Shared-memory traffic of cp.async fills beside ldmatrix: each warp runs `iters` rounds of NC cp.async
// (16 B a lane, 512 B a warp) from global memory into a ring of shared memory and NL ldmatrix.x4 (512 B a warp)
// from another region; a commit group a round, at most 6 in flight. CA: cp.async.ca from a 16 KiB window of
// the block's own (L1-resident after the first round); else .cg from a 4 MiB window (L2-resident). One block
// an SM; thread 0 times it with clock64.
template <int NC, int NL, bool CA>
__device__ __forceinline__ void smem_mix(const float4* __restrict__ src, long long iters, unsigned* sink,
                                         long long* cycles)
{
    extern __shared__ __align__(128) unsigned char sm[];
    const unsigned base = (unsigned)__cvta_generic_to_shared(sm);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned ring = base + 8192, ring_bytes = 32768;
    const long long window = CA ? 1024 : 262144;          // float4 chunks: 16 KiB or 4 MiB
    const float4* s = src + (CA ? (long long)blockIdx.x * 1024 : 0);
    unsigned acc = 0;
    long long off = (long long)warp * 32 + lane;
    unsigned wpos = (unsigned)(warp * 512 + lane * 16);
    __syncthreads();
    long long t0 = clock64();
    for (long long i = 0; i < iters; ++i) {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const float4* g = s + (off % window);
            unsigned d = ring + (wpos % ring_bytes);
            if (CA)
                asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" :: "r"(d), "l"(g));
            else
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(g));
            off += nw * 32;
            wpos += nw * 512;
        }
        asm volatile("cp.async.commit_group;");
        unsigned l[NL > 0 ? NL : 1][4];
#pragma unroll
        for (int c = 0; c < NL; ++c)
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(l[c][0]), "=r"(l[c][1]), "=r"(l[c][2]), "=r"(l[c][3])
                         : "r"(base + ((c * 4 + warp) & 15) * 512 + lane * 16));
#pragma unroll
        for (int c = 0; c < NL; ++c) acc ^= l[c][0] ^ l[c][1] ^ l[c][2] ^ l[c][3];
        asm volatile("cp.async.wait_group 6;");
    }
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    long long t1 = clock64();
    if (acc == 0x12345678u) sink[0] = acc;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
#define SMIX(NC, NL, CA, NAME) extern "C" __global__ void NAME(const float4* s, long long it, unsigned* k, long long* c) \
    { smem_mix<NC, NL, CA>(s, it, k, c); }
SMIX(0, 4, false, smix_l4)
SMIX(4, 0, true, smix_ca4)
SMIX(4, 0, false, smix_cg4)
SMIX(4, 4, true, smix_ca4_l4)
SMIX(4, 4, false, smix_cg4_l4)
SMIX(2, 4, true, smix_ca2_l4)
SMIX(1, 4, false, smix_cg1_l4)
"""

L2_SHARE_SRC = r"""
// How the L2 serves lines that several SMs read: one block an SM, blocks in groups of `group` consecutive
// ones read the same L2-resident window of window16 16-byte chunks (a power of two), 4 ld.global.cg of 16 B
// a thread in flight an iteration. stagger 0: a group's blocks walk the window in step (the same lines at
// the same time); 1: each starts window/group further on (the same lines, at other times). Thread 0 times
// its block with clock64.
extern "C" __global__ void l2_share(const uint4* __restrict__ buf, long long window16, int group, int stagger,
                                    long long iters, unsigned* sink, long long* cycles)
{
    const long long base = (long long)(blockIdx.x / group) * window16;
    const long long mask = window16 - 1;
    long long pos = threadIdx.x + (stagger ? (long long)(blockIdx.x % group) * (window16 / group) : 0);
    unsigned acc = 0;
    __syncthreads();
    long long t0 = clock64();
    for (long long i = 0; i < iters; ++i) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = __ldcg(buf + base + ((pos + u * blockDim.x) & mask));
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        pos += 4 * blockDim.x;
    }
    __syncthreads();
    long long t1 = clock64();
    if (acc == 0x12345678u) sink[0] = acc;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
"""

GEMM_TWIN_SRC = r"""
// The twin of archsim's tensor-core GEMM (archsim/workloads/emit/gemm_gpu.py): C[M,N] (f32) = A[M,K] @ B[K,N]
// (fp16, row-major). Block tile 128 x 128, k tile 64 halves (128-byte rows), 4 warps in a 2 x 2 grid of 64 x 64
// warp tiles, a 4-stage cp.async.cg pipeline with one bar.sync per k tile, shared rows of 16-byte chunks XOR-
// swizzled (chunk c of row r at c ^ (r % 8)), A fragments by ldmatrix.x4, B (k-major) by ldmatrix.x4.trans,
// mma.sync.m16n8k16 f32 accumulators, blocks in grouped raster order (group, raster_n as archsim's _raster).
// M, N multiples of 128 and K of 64.
#define TW_BM 128
#define TW_BN 128
#define TW_BK 64
#ifndef TW_S
#define TW_S 4
#endif
#define TW_STAGE_BYTES 32768

__device__ __forceinline__ void tw_cp16(unsigned dst, const void* src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src));
}

// this block's C tile origin in grouped raster order: groups of `group` tile rows sweep the tile columns
__device__ __forceinline__ void tw_origin(int group, int raster_n, int& m0, int& n0)
{
    long long Q = gridDim.x, R = gridDim.y;
    long long b = (long long)blockIdx.y * Q + blockIdx.x;
    long long rows = raster_n ? Q : R, cols = raster_n ? R : Q;
    long long per = (long long)group * cols, g = b / per;
    b -= g * per;
    long long row0 = g * group, nr = rows - row0 < group ? rows - row0 : group;
    long long trow = row0 + b % nr, tcol = b / nr;
    m0 = (int)(raster_n ? tcol : trow) * TW_BM;
    n0 = (int)(raster_n ? trow : tcol) * TW_BN;
}

__device__ __forceinline__ void tw_zero(float (&acc)[4][8][4])
{
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// the warp's 64 x 64 f32 accumulators into C, two adjacent columns a store
__device__ __forceinline__ void tw_store(float* C, int N, int m0, int n0, int lane, int wm, int wn,
                                         const float (&acc)[4][8][4])
{
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) {
            int r = m0 + wm * 64 + mi * 16 + (lane >> 2), c = n0 + wn * 64 + ni * 8 + (lane & 3) * 2;
            *(float2*)(C + (size_t)r * N + c) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
            *(float2*)(C + (size_t)(r + 8) * N + c) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
        }
}

// The emitter's epilogue (gemm_gpu._staged_store): the warps' accumulators into shared memory (8-byte writes,
// rows padded to 544 bytes: conflict free), a barrier, then each thread stores 16-byte chunks tid % 32 of rows
// tid / 32 + 4 i: whole 512-byte rows a warp instruction.
__device__ __forceinline__ void tw_store_staged(float* C, int N, int m0, int n0, unsigned sm0, int tid, int lane,
                                                int wm, int wn, const float (&acc)[4][8][4])
{
    const int RS = TW_BN * 4 + 32;
    __syncthreads();
    const unsigned corner = sm0 + (wm * 64 + (lane >> 2)) * RS + (wn * 64 + 2 * (lane & 3)) * 4;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int ni = 0; ni < 8; ++ni)
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};"
                             :: "r"(corner + (16 * mi + 8 * h) * RS + 32 * ni), "f"(acc[mi][ni][2 * h]),
                                "f"(acc[mi][ni][2 * h + 1]));
    __syncthreads();
    const int row0 = tid >> 5, chunk = tid & 31;
    float4* dst = (float4*)(C + (size_t)(m0 + row0) * N + n0 + chunk * 4);
#pragma unroll 4
    for (int i = 0; i < TW_BM / 4; ++i) {
        float4 v;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(sm0 + (row0 + 4 * i) * RS + chunk * 16));
        *dst = v;
        dst += (size_t)N;     // 4 rows of C (a row is N / 4 float4)
    }
}

// one 16-byte copy of tile kt's chunk q (0..2047: A's 1024, then B's 1024) into the stage at sbase
__device__ __forceinline__ void tw_copy(unsigned sbase, const unsigned short* A, const unsigned short* B,
                                        int m0, int n0, int kt, int N, int K, int q)
{
    if (q < 1024) {
        int r = q >> 3, c = q & 7;
        tw_cp16(sbase + r * 128 + ((c ^ (r & 7)) << 4), A + (size_t)(m0 + r) * K + (size_t)kt * TW_BK + c * 8);
    } else {
        q -= 1024;
        int r = q >> 4, c = q & 15;
        tw_cp16(sbase + 16384 + r * 256 + ((c ^ (r & 7)) << 4), B + (size_t)(kt * TW_BK + r) * N + n0 + c * 8);
    }
}

// The main loop's copies, addressed once as the emitter does (its per-copy pointer registers): copy i < 8 of a
// thread is A row (tid / 8 + 16 i), chunk tid % 8, at ga + 16 K i (+ 64 a k tile), shared offset oa + 2048 i; copy
// 8 + j is B row (tid / 16 + 8 j), chunk tid % 16, at gb + 8 N j (+ 64 N a k tile), offset ob + 2048 j (rows 8 or 16
// apart keep their XOR swizzle). tw_copy computes the same addresses from scratch, copy by copy.
struct TwCopies {
    const unsigned short* ga;
    const unsigned short* gb;
    size_t sa, sb, kb;
    unsigned oa, ob;
};

__device__ __forceinline__ TwCopies tw_copies(const unsigned short* A, const unsigned short* B, int m0, int n0,
                                              int N, int K, int tid)
{
    TwCopies t;
    const int ra = tid >> 3, ca = tid & 7, rb = tid >> 4, cb = tid & 15;
    t.ga = A + (size_t)(m0 + ra) * K + ca * 8;
    t.gb = B + (size_t)rb * N + n0 + cb * 8;
    t.sa = (size_t)16 * K;
    t.sb = (size_t)8 * N;
    t.kb = (size_t)64 * N;
    t.oa = ra * 128 + ((ca ^ (ra & 7)) << 4);
    t.ob = 16384 + rb * 256 + ((cb ^ (rb & 7)) << 4);
    return t;
}

// copy i of the k tile whose A and B rows start at pa and pb, into the stage at sbase
__device__ __forceinline__ void tw_copy_at(unsigned sbase, const TwCopies& t, const unsigned short* pa,
                                           const unsigned short* pb, int i)
{
    if (i < 8) tw_cp16(sbase + t.oa + i * 2048, pa + i * t.sa);
    else tw_cp16(sbase + t.ob + (i - 8) * 2048, pb + (i - 8) * t.sb);
}

// all 2048 chunks of tile kt, 16 a thread
__device__ __forceinline__ void tw_load(unsigned sbase, const unsigned short* A, const unsigned short* B,
                                        int m0, int n0, int kt, int N, int K, int tid)
{
#pragma unroll
    for (int i = 0; i < 16; ++i) tw_copy(sbase, A, B, m0, n0, kt, N, K, tid + i * 128);
}

// the pipeline's prologue: tiles 0 .. S-2 into stages 0 .. S-2, a commit group each (empty past KT)
__device__ __forceinline__ void tw_prologue(unsigned sm0, const unsigned short* A, const unsigned short* B,
                                            int m0, int n0, int KT, int N, int K, int tid)
{
#pragma unroll
    for (int s = 0; s < TW_S - 1; ++s) {
        if (s < KT) tw_load(sm0 + s * TW_STAGE_BYTES, A, B, m0, n0, s, N, K, tid);
        asm volatile("cp.async.commit_group;");
    }
}

// the A and B fragments of k-step ks of the stage at sA (B's half 16 KiB above)
__device__ __forceinline__ void tw_frags(unsigned sA, int ks, int lane, int wm, int wn, unsigned (&a)[4][4],
                                         unsigned (&bf)[8][2])
{
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        int r = wm * 64 + mi * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a[mi][0]), "=r"(a[mi][1]), "=r"(a[mi][2]), "=r"(a[mi][3])
                     : "r"(sA + r * 128 + ((c ^ (r & 7)) << 4)));
    }
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
        int r = ks * 16 + (lane & 15), c = wn * 8 + nj * 2 + (lane >> 4);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(bf[2 * nj][0]), "=r"(bf[2 * nj][1]), "=r"(bf[2 * nj + 1][0]), "=r"(bf[2 * nj + 1][1])
                     : "r"(sA + 16384 + r * 256 + ((c ^ (r & 7)) << 4)));
    }
}

__device__ __forceinline__ void tw_mma(float (&acc)[4][8][4], const unsigned (&a)[4][4], const unsigned (&bf)[8][2])
{
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
            asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                "{%0,%1,%2,%3};"
                : "+f"(acc[mi][ni][0]), "+f"(acc[mi][ni][1]), "+f"(acc[mi][ni][2]), "+f"(acc[mi][ni][3])
                : "r"(a[mi][0]), "r"(a[mi][1]), "r"(a[mi][2]), "r"(a[mi][3]), "r"(bf[ni][0]), "r"(bf[ni][1]));
}

// CUTLASS's multistage order, as the emitter: fragments double buffered in registers (k-step s runs its mma
// beside the ldmatrix of k-step s+1); tile kt+S-1's copies spread over k-steps 0-2 and committed after k-step
// 2; the barrier before k-step 3, after which tile kt+1's first fragments load beside k-step 3's mma.
// The main loop's copies use the addresses tw_copies sets up once, as the emitter's pointer registers do.
// -DTW_SLOW_COPY computes each copy's addresses from scratch (tw_copy: 20-30 integer instructions a copy in nvcc's
// code, which at one warp a sub-core cost about as much as the mma). gemm_parts builds it with parts of the main loop left out (TW_NO_COPY, TW_NO_LDM, TW_NO_MMA, TW_NO_BAR: the
// copies, the fragment loads, the mma, the barrier) and times each block's main loop into cycles[2 b] (its SM
// in cycles[2 b + 1]); the fragments then come from the stages once, before the loop, and C is not the product.
extern "C" __global__ void __launch_bounds__(128) gemm_twin(const unsigned short* __restrict__ A,
    const unsigned short* __restrict__ B, float* __restrict__ C, int M, int N, int K, int group, int raster_n,
    long long* cycles)
{
    extern __shared__ __align__(128) unsigned char tw_smem[];
    long long c_in = 0, ns_in = 0;
    if (cycles && threadIdx.x == 0) {
        c_in = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns_in));
    }
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(tw_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    int m0, n0;
    tw_origin(group, raster_n, m0, n0);
    float acc[4][8][4];
    tw_zero(acc);

    const int KT = K / TW_BK;
    tw_prologue(sm0, A, B, m0, n0, KT, N, K, tid);
    asm volatile("cp.async.wait_group %0;" :: "n"(TW_S - 2));
    __syncthreads();
    unsigned fa[2][4][4], fb[2][8][2];
    int rs = 0, ws = TW_S - 1;
    tw_frags(sm0, 0, lane, wm, wn, fa[0], fb[0]);
    const TwCopies cps = tw_copies(A, B, m0, n0, N, K, tid);
    const unsigned short* pa = cps.ga + (size_t)(TW_S - 1) * TW_BK;     // tile S-1, the loop's first copies
    const unsigned short* pb = cps.gb + (size_t)(TW_S - 1) * cps.kb;
#ifdef TW_NO_LDM
    tw_frags(sm0, 1, lane, wm, wn, fa[1], fb[1]);
#endif
    __syncthreads();
    const long long t0 = clock64();
    for (int kt = 0; kt < KT; ++kt) {
        const bool more = kt + TW_S - 1 < KT;
        const unsigned wbase = sm0 + ws * TW_STAGE_BYTES;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            if (ks == 3) {
                asm volatile("cp.async.wait_group %0;" :: "n"(TW_S - 2));
#ifndef TW_NO_BAR
                __syncthreads();
#endif
                ws = rs;
                rs = rs + 1 == TW_S ? 0 : rs + 1;
#ifndef TW_NO_LDM
                tw_frags(sm0 + rs * TW_STAGE_BYTES, 0, lane, wm, wn, fa[0], fb[0]);
#endif
            } else {
#ifndef TW_NO_LDM
                tw_frags(sm0 + rs * TW_STAGE_BYTES, ks + 1, lane, wm, wn, fa[(ks + 1) & 1], fb[(ks + 1) & 1]);
#endif
#ifndef TW_NO_COPY
                if (more)
#pragma unroll
                    for (int i = ks * 16 / 3; i < (ks + 1) * 16 / 3; ++i)
#ifdef TW_SLOW_COPY
                        tw_copy(wbase, A, B, m0, n0, kt + TW_S - 1, N, K, tid + i * 128);
#else
                        tw_copy_at(wbase, cps, pa, pb, i);
#endif
#endif
                if (ks == 2) asm volatile("cp.async.commit_group;");
            }
#ifndef TW_NO_MMA
            tw_mma(acc, fa[ks & 1], fb[ks & 1]);
#endif
        }
        pa += TW_BK;
        pb += cps.kb;
    }
    const long long t1 = clock64();
    asm volatile("cp.async.wait_group 0;");
#ifdef TW_NO_MMA
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[0][j][0] += __uint_as_float(fa[0][j & 3][0] ^ fb[1][j][1]);
#endif
#ifdef TW_DIRECT_STORE
    tw_store(C, N, m0, n0, lane, wm, wn, acc);
#else
    tw_store_staged(C, N, m0, n0, sm0, tid, lane, wm, wn, acc);
#endif
    if (cycles && tid == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        long long ns_out;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns_out));
        const long long b = (long long)blockIdx.y * gridDim.x + blockIdx.x;
        cycles[6 * b] = t1 - t0;
        cycles[6 * b + 1] = smid;
        cycles[6 * b + 2] = clock64() - c_in;     // the block's cycles and nanoseconds: the SM clock it ran at
        cycles[6 * b + 3] = ns_out - ns_in;
        cycles[6 * b + 4] = ns_in;                // the launch's span, first block in to last block out
        cycles[6 * b + 5] = ns_out;
    }
}

// The same kernel with each k-step's fragments loaded right before its mma and the tile's copies at the top of
// the iteration (load, then compute): the instruction order is left to nvcc and ptxas.
extern "C" __global__ void __launch_bounds__(128) gemm_twin_simple(const unsigned short* __restrict__ A,
    const unsigned short* __restrict__ B, float* __restrict__ C, int M, int N, int K, int group, int raster_n)
{
    extern __shared__ __align__(128) unsigned char tw_smem[];
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(tw_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    int m0, n0;
    tw_origin(group, raster_n, m0, n0);
    float acc[4][8][4];
    tw_zero(acc);

    const int KT = K / TW_BK;
    tw_prologue(sm0, A, B, m0, n0, KT, N, K, tid);
    for (int kt = 0; kt < KT; ++kt) {
        asm volatile("cp.async.wait_group %0;" :: "n"(TW_S - 2));
        __syncthreads();
        int nt = kt + TW_S - 1;
        if (nt < KT) tw_load(sm0 + (nt % TW_S) * TW_STAGE_BYTES, A, B, m0, n0, nt, N, K, tid);
        asm volatile("cp.async.commit_group;");
        const unsigned sA = sm0 + (kt % TW_S) * TW_STAGE_BYTES;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            unsigned a[4][4], bf[8][2];
            tw_frags(sA, ks, lane, wm, wn, a, bf);
            tw_mma(acc, a, bf);
        }
    }
    asm volatile("cp.async.wait_group 0;");
    tw_store(C, N, m0, n0, lane, wm, wn, acc);
}
"""

MMA_RATE_SRC = r"""
// mma.sync issue rate: each warp runs `iters` rounds of CH independent mma (CH accumulator chains), f32
// accumulators: KIND 0 m16n8k16 f16, 1 m16n8k16 bf16, 2 m16n8k8 tf32 (1024 FMA an instruction); one block an SM;
// thread 0 times the block with clock64 between two barriers.
template <int KIND>
__device__ __forceinline__ void mma_one(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                        unsigned b0, unsigned b1)
{
    if constexpr (KIND == 0)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else if constexpr (KIND == 1)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int CH, int KIND>
__device__ __forceinline__ void mma_rounds(long long iters, float* sink, long long* cycles)
{
    // operands: finite values of the dtype (their bits do not change the rate)
    unsigned a0, a1, a2, a3, b0, b1;
    if constexpr (KIND == 2) {
        a0 = threadIdx.x | 0x3f800000u, a1 = a0 + 3u, a2 = a0 + 5u, a3 = a0 + 7u, b0 = a0 + 9u, b1 = a0 + 11u;
    } else {
        const unsigned one = KIND == 0 ? 0x3c00u : 0x3f80u;
        a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u, b0 = a0 ^ (one << 16 | one), b1 = a0 | one;
    }
    float acc[CH][4];
#pragma unroll
    for (int c = 0; c < CH; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
    __syncthreads();
    long long t0 = clock64();
    for (long long i = 0; i < iters; ++i) {
#pragma unroll
        for (int c = 0; c < CH; ++c) mma_one<KIND>(acc[c], a0, a1, a2, a3, b0, b1);
    }
    __syncthreads();
    long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    if (s == 1234.5f) sink[0] = s;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
extern "C" __global__ void mma_rate_bf16(long long iters, float* sink, long long* cycles) { mma_rounds<8, 1>(iters, sink, cycles); }
extern "C" __global__ void mma_rate_tf32(long long iters, float* sink, long long* cycles) { mma_rounds<8, 2>(iters, sink, cycles); }
extern "C" __global__ void mma_rate1(long long iters, float* sink, long long* cycles) { mma_rounds<1, 0>(iters, sink, cycles); }
extern "C" __global__ void mma_rate2(long long iters, float* sink, long long* cycles) { mma_rounds<2, 0>(iters, sink, cycles); }
extern "C" __global__ void mma_rate4(long long iters, float* sink, long long* cycles) { mma_rounds<4, 0>(iters, sink, cycles); }
extern "C" __global__ void mma_rate8(long long iters, float* sink, long long* cycles) { mma_rounds<8, 0>(iters, sink, cycles); }
"""

QUICK = "--quick" in sys.argv
ONLY = [a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--only=")]
ONLY = ONLY[0] if ONLY else None
OCC_MIB = [[float(v) for v in a.split("=", 1)[1].split(",")] for a in sys.argv if a.startswith("--occupancy-mib=")]
OCC_MIB = OCC_MIB[0] if OCC_MIB else [1024.0]
RESULTS: dict = {"schema": "archsim.measured/1", "benchmarks": {}}


def save(path: str) -> None:
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1)


def bench(name: str, path: str):
    def wrap(fn):
        if ONLY is not None and name not in ONLY and name not in ("sm_clock", "sm_clock_end"):
            return fn
        t0 = time.time()
        try:
            RESULTS["benchmarks"][name] = fn()
        except Exception:  # keep going: one broken benchmark must not lose the others
            RESULTS["benchmarks"][name] = {"error": traceback.format_exc()}
            print(traceback.format_exc(), flush=True)
        RESULTS["benchmarks"].setdefault(name, {})
        if isinstance(RESULTS["benchmarks"][name], dict):
            RESULTS["benchmarks"][name]["wall_s"] = round(time.time() - t0, 2)
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
        save(path)
        return fn
    return wrap


def main(path: str) -> None:
    import cupy as cp
    import torch

    mod = cp.RawModule(code=SRC)
    K = {n: mod.get_function(n) for n in ("chase", "stream_read", "stream_write", "stream_copy", "empty_kernel",
                                         "shared_chase", "ffma_chain", "l2_stream",
                                         "stream_ilp1", "stream_ilp2", "stream_ilp4", "stream_ilp8", "loaded_chase",
                                         "half_probe", "sm_stream", "stream_write_ilp4", "stream_copy_ilp4")}
    dev = cp.cuda.Device(0)
    props = cp.cuda.runtime.getDeviceProperties(0)
    sms = props["multiProcessorCount"]
    warp_slots = props["maxThreadsPerMultiProcessor"] // 32
    RESULTS["device"] = {"name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
                         "sms": sms, "l2_bytes": props["l2CacheSize"], "warp_slots": warp_slots,
                         "clock_khz": props.get("clockRate"), "mem_clock_khz": props.get("memoryClockRate"),
                         "mem_bus_bits": props.get("memoryBusWidth"), "torch": torch.__version__,
                         "cupy": cp.__version__, "cc": f"{props['major']}.{props['minor']}"}
    save(path)
    out64 = cp.zeros(2, cp.int64)
    sinkf = cp.zeros(4, cp.float32)

    def sm_clock_mhz() -> float:
        """The SM clock while busy: clock64 cycles of a spinning FFMA chain over its event time."""
        n = 1 << 20
        K["ffma_chain"]((1,), (1,), (np.float32(1.0), np.float32(0.5), np.int64(1000), out64, sinkf))
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        K["ffma_chain"]((1,), (1,), (np.float32(1.0), np.float32(0.5), np.int64(n), out64, sinkf))
        e1.record()
        e1.synchronize()
        ms = cp.cuda.get_elapsed_time(e0, e1)
        return float(out64[0].get()) / (ms * 1e-3) / 1e6

    def chase_table(nbytes: int):
        """(table, its address): one random cycle of 8-byte pointers, one per 128-byte line of nbytes."""
        n = nbytes // 128
        tbl = cp.zeros(nbytes // 8, cp.uint64)
        base = tbl.data.ptr
        perm = cp.random.permutation(n).astype(cp.int64)
        nxt = cp.empty(n, cp.int64)
        nxt[perm] = cp.roll(perm, -1)
        tbl[cp.arange(n, dtype=cp.int64) * 16] = (base + nxt * 128).astype(cp.uint64)
        return tbl, base

    @bench("sm_clock", path)
    def _():
        return {"mhz": [round(sm_clock_mhz(), 1) for _ in range(3)]}

    @bench("ffma_latency", path)
    def _():
        n = 4096
        K["ffma_chain"]((1,), (1,), (np.float32(1.0), np.float32(0.5), np.int64(n), out64, sinkf))
        cp.cuda.runtime.deviceSynchronize()
        return {"cycles_per_ffma": float(out64[0].get()) / (8 * n)}

    @bench("shared_chase", path)
    def _():
        loads = 4096
        K["shared_chase"]((1,), (1,), (np.int64(loads), out64))
        cp.cuda.runtime.deviceSynchronize()
        return {"cycles_per_load": float(out64[0].get()) / loads}

    @bench("chase", path)
    def _():
        kib = [16, 32, 64, 96, 128, 160, 192, 224, 256, 384, 512, 1024, 2048, 4096, 8192, 16384, 24576, 32768,
               40960, 49152, 65536, 98304, 131072, 262144, 524288, 1048576]
        if QUICK:
            kib = kib[::4]
        loads = 4096
        pts = []
        for k in kib:
            nbytes = k * 1024
            n = nbytes // 128
            tbl, base = chase_table(nbytes)
            warm = min(n, 1 << 20)
            K["chase"]((1,), (1,), (np.uint64(base), np.int64(warm), np.int64(loads), out64))
            cp.cuda.runtime.deviceSynchronize()
            pts.append([k, float(out64[0].get()) / loads])
            print(f"  chase {k} KiB: {pts[-1][1]:.1f}", flush=True)
            del tbl
        return {"x": "footprint_kib", "y": "cycles", "stride_bytes": 128, "loads": loads, "points": pts}

    big = cp.zeros((4 << 30) // 4, cp.float32)       # 4 GiB, reused by every stream
    big2 = cp.zeros((1 << 30) // 4, cp.float32)
    flush = cp.zeros((512 << 20) // 4, cp.float32)

    def launch_of(occupancy: float):
        warps = max(1, int(round(occupancy * warp_slots)))
        per_block = min(warps, 8)
        while warps % per_block:
            per_block -= 1
        return sms * (warps // per_block), per_block * 32

    def flush_l2():
        """Read 512 MiB: nothing of what came before stays in the L2."""
        K["stream_read"]((sms * 8,), (256,), (flush, np.int64(flush.size // 4 // (sms * 8 * 256 * 4)
                                                               * sms * 8 * 256 * 4), sinkf))

    def time_stream(kind: str, mib: float, occupancy: float, reps: int, cold: bool, unroll: int = 0):
        """unroll 0: the stream_<kind> kernel; else stream_ilp<unroll> (reads)."""
        blocks, threads = launch_of(occupancy)
        per_iter = blocks * threads * (unroll or 4)
        per_chunk = {"read": 16, "write": 16, "copy": 32}[kind]
        chunks = max(int(mib * 2**20) // per_chunk // per_iter, 1) * per_iter
        if unroll:
            kind = f"ilp{unroll}"
        if kind == "read" or unroll:
            args = (big, np.int64(chunks), sinkf)
        elif kind == "write":
            args = (big, np.int64(chunks))
        else:
            args = (big, big2, np.int64(chunks))
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        if cold:
            flush_l2()
            e0.record()
            K["stream_" + kind]((blocks,), (threads,), args)
            e1.record()
            e1.synchronize()
            return chunks * per_chunk / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e9, 1
        K["stream_" + kind]((blocks,), (threads,), args)
        e0.record()
        for _ in range(reps):
            K["stream_" + kind]((blocks,), (threads,), args)
        e1.record()
        e1.synchronize()
        ms = cp.cuda.get_elapsed_time(e0, e1) / reps
        e0.record()
        for _ in range(reps):
            K["empty_kernel"]((blocks,), (threads,), (sinkf,))
        e1.record()
        e1.synchronize()
        ms_empty = cp.cuda.get_elapsed_time(e0, e1) / reps
        return chunks * per_chunk / (ms * 1e-3) / 1e9, ms_empty / ms

    @bench("stream_footprint", path)
    def _():
        mibs = [8, 16, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096]
        if QUICK:
            mibs = [64, 1024]
        pts = []
        for m in mibs:
            reps = max(3, min(200, int(2048 // m)))
            warm, ovh = time_stream("read", m, 1.0, reps, False)
            cold, _ = time_stream("read", m, 1.0, 1, True)
            pts.append([m, round(warm, 1), round(cold, 1), round(ovh, 4)])
            print(f"  stream {m} MiB: warm {warm:.0f} cold {cold:.0f} GB/s", flush=True)
        return {"x": "footprint_mib", "y": "GB/s", "columns": ["footprint_mib", "back_to_back_gbps",
                                                                "after_flush_gbps", "empty_launch_share"],
                "kind": "read", "occupancy": 1.0, "points": pts}

    @bench("stream_occupancy", path)
    def _():
        warps = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
        if QUICK:
            warps = [4, 64]
        pts = []
        for w in warps:
            occ = w / warp_slots
            row = [w, round(occ, 4)]
            for mib in OCC_MIB:
                g, _ = time_stream("read", mib, occ, 5, False)
                c, _ = time_stream("read", mib, occ, 1, True)
                row += [round(g, 1), round(c, 1)]
            pts.append(row)
            print(f"  stream {w} warps/SM: {row[2:]} GB/s", flush=True)
        return {"x": "warps_per_sm", "y": "GB/s",
                "columns": ["warps_per_sm", "occupancy"] + [f"{m:g}_mib_{t}_gbps" for m in OCC_MIB
                                                            for t in ("back_to_back", "after_flush")],
                "kind": "read", "footprint_mib": OCC_MIB, "points": pts}

    @bench("stream_kinds", path)
    def _():
        return {k: round(time_stream(k, 1024, 1.0, 5, False)[0], 1) for k in ("read", "write", "copy")}

    @bench("l2_bandwidth", path)
    def _():
        threads = 1024
        per_core = max(1, min(warp_slots * 32 // threads, 32))
        blocks = sms * per_core
        row = threads * 16
        out = []
        for nrows in (4, 8, 16):            # 17, 35, 69 MB on 132 SMs: inside the L2, at it, beyond it
            buf = cp.random.random(nrows * blocks * row // 4, dtype=cp.float32)   # not zeros: no compression
            iters = 4000 // nrows * 4
            K["l2_stream"]((blocks,), (threads,), (buf, np.int64(iters), np.int32(per_core), np.int32(nrows), sinkf))
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            K["l2_stream"]((blocks,), (threads,), (buf, np.int64(iters), np.int32(per_core), np.int32(nrows), sinkf))
            e1.record()
            e1.synchronize()
            ms = cp.cuda.get_elapsed_time(e0, e1)
            clk = sm_clock_mhz()
            gbps = blocks * iters * 4 * row / (ms * 1e-3) / 1e9
            out.append({"footprint_mib": round(nrows * blocks * row / 2**20, 2), "gbps": round(gbps, 1),
                        "sm_mhz_after": round(clk), "bytes_per_clk": round(gbps * 1e3 / clk, 1)})
            print(f"  l2 {out[-1]}", flush=True)
            del buf
        return {"kernel": "archsim micro.l2_bandwidth shape, 1024-thread blocks", "points": out}

    @bench("stream_ilp_footprint", path)
    def _():
        pts = []
        for mib in (256, 512, 1024, 2048, 4096):
            runs = [time_stream("read", mib, 1.0, 1, True, unroll=4)[0] for _ in range(3)]
            pts.append([mib, round(float(np.median(runs)), 1)])
            print(f"  stream_ilp4 {mib} MiB: {pts[-1][1]} GB/s", flush=True)
        return {"x": "footprint_mib", "y": "GB/s", "kernel": "stream_ilp4", "occupancy": 1.0, "after_flush": True,
                "of": "median of 3", "points": pts}

    @bench("one_sm_stream", path)
    def _():
        """One block on one SM (the rest of the chip idle): the bytes one SM keeps in flight."""
        pts = []
        for w in (1, 2, 4, 8, 16, 24, 32):
            row = [w]
            for u in (1, 4):
                threads = 32 * w
                chunks = max((32 << 20) // 16 // (threads * u), 1) * threads * u
                runs = []
                for _ in range(3):
                    flush_l2()
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    K[f"stream_ilp{u}"]((1,), (threads,), (big, np.int64(chunks), sinkf))
                    e1.record()
                    e1.synchronize()
                    runs.append(chunks * 16 / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e9)
                row.append(round(float(np.median(runs)), 2))
            pts.append(row)
            print(f"  one_sm_stream {w} warps: {row[1:]} GB/s", flush=True)
        multi = []
        for nblk, threads in ((2, 512), (2, 768), (2, 1024)):
            chunks = (32 << 20) // 16 // (nblk * threads * 4) * nblk * threads * 4
            runs = []
            for _ in range(3):
                ranks = cp.zeros(1, cp.int32)
                flush_l2()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record()
                K["sm_stream"]((sms * nblk,), (threads,), (big, np.int64(chunks), np.int32(0), np.int32(nblk), ranks,
                                                           sinkf))
                e1.record()
                e1.synchronize()
                took = int(ranks.get()[0])
                runs.append(chunks * 16 / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e9 if took >= nblk else -took)
            multi.append([nblk * threads // 32, nblk, round(float(np.median(runs)), 2)])
            print(f"  one_sm_stream {multi[-1]}", flush=True)
        warm = []                                  # the same from the L2: 8 MiB read once before the timed read
        for nblk, threads in ((1, 256), (1, 512), (1, 1024), (2, 768), (2, 1024)):
            chunks = (8 << 20) // 16 // (nblk * threads * 4) * nblk * threads * 4
            runs = []
            for _ in range(3):
                got = []
                for _ in range(2):
                    ranks = cp.zeros(1, cp.int32)
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    K["sm_stream"]((sms * nblk,), (threads,), (big, np.int64(chunks), np.int32(0), np.int32(nblk),
                                                               ranks, sinkf))
                    e1.record()
                    e1.synchronize()
                    got.append(chunks * 16 / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e9
                               if int(ranks.get()[0]) >= nblk else -1.0)
                runs.append(got[1])
            warm.append([nblk * threads // 32, nblk, round(float(np.median(runs)), 2)])
            print(f"  one_sm_stream from L2 {warm[-1]}", flush=True)
        return {"columns": ["warps", "ilp1_gbps", "ilp4_gbps"], "kernel": "stream_ilp<U>, one block of 32 x warps"
                " threads (one SM), 32 MiB after an L2 flush, median of 3", "points": pts,
                "blocks": {"columns": ["warps", "blocks", "ilp4_gbps"], "kernel": "sm_stream: the blocks that land on"
                           " SM 0 stream (the others leave), 32 MiB after an L2 flush, median of 3 (a negative value:"
                           " fewer blocks than asked landed there)", "points": multi},
                "from_l2": {"columns": ["warps", "blocks", "ilp4_gbps"], "kernel": "sm_stream over 8 MiB read once"
                            " just before (L2 hits), median of 3", "points": warm}}

    @bench("stream_kinds_occupancy", path)
    def _():
        """Write and copy twins (4 chunks in flight a thread) against occupancy, 1 GiB moved after an L2 flush
        (the L2's dirty lines at the end, ~50 MB, are not waited for: ~5 % of the bytes)."""
        pts = []
        for w in (1, 2, 4, 8, 16, 32, 64):
            blocks, threads = launch_of(w / warp_slots)
            per_iter = blocks * threads * 4
            row = [w]
            for kind, per_chunk in (("write", 16), ("copy", 32)):
                chunks = (1 << 30) // per_chunk // per_iter * per_iter
                args = (big, np.int64(chunks)) if kind == "write" else (big, big2, np.int64(chunks))
                runs = []
                for _ in range(3):
                    flush_l2()
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    K[f"stream_{kind}_ilp4"]((blocks,), (threads,), args)
                    e1.record()
                    e1.synchronize()
                    runs.append(chunks * per_chunk / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e9)
                row.append(round(float(np.median(runs)), 1))
            pts.append(row)
            print(f"  write / copy {w} warps/SM: {row[1:]} GB/s", flush=True)
        return {"columns": ["warps_per_sm", "write_gbps", "copy_gbps"], "footprint_bytes_moved": 1 << 30,
                "kernel": "stream_write_ilp4 / stream_copy_ilp4 (copy counts bytes read + written)", "points": pts}

    @bench("stream_ilp", path)
    def _():
        pts = []
        for w in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64):
            row = [w]
            for u in (1, 2, 4, 8):
                runs = [time_stream("read", 256, w / warp_slots, 1, True, unroll=u)[0] for _ in range(3)]
                row.append(round(float(np.median(runs)), 1))
            pts.append(row)
            print(f"  stream_ilp {w} warps/SM: {row[1:]} GB/s", flush=True)
        return {"x": "warps_per_sm", "y": "GB/s", "columns": ["warps_per_sm", "ilp1", "ilp2", "ilp4", "ilp8"],
                "kernel": "stream_ilp<U>: U 16-byte loads per thread per iteration, loop not unrolled further",
                "footprint_mib": 256, "after_flush": True, "of": "median of 3", "points": pts}

    def loaded(nbytes: int, stream_bytes: int = 1 << 30):
        """A chase over its own nbytes beside streams of rising occupancy over stream_bytes (not L1-resident)."""
        tbl, base = chase_table(nbytes)
        out4 = cp.zeros(4, cp.int64)
        stop = cp.zeros(1, cp.int32)
        iters = cp.zeros(1, cp.uint64)
        pts = []
        for w in (0, 1, 2, 4, 8, 16, 32, 48):
            if w:
                sblocks, threads = launch_of(w / warp_slots)
            else:
                sblocks, threads = 0, 32
            S = max(sblocks * threads, 1)
            chunks = max((stream_bytes // 16) // (4 * S), 1) * 4 * S
            stop.fill(0)
            iters.fill(0)
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            K["loaded_chase"]((1 + sblocks,), (threads,), (np.uint64(base), np.int64(65536), np.int64(4096), out4,
                                                           big, np.int64(chunks), stop, iters, sinkf))
            e1.record()
            e1.synchronize()
            ms = cp.cuda.get_elapsed_time(e0, e1)
            gbps = float(iters[0].get()) * 64 / (ms * 1e-3) / 1e9
            o = out4.get()
            pts.append([w, round(gbps, 1), round(float(o[0]) / 4096, 1), round(float(o[2]) / 4096, 1)])
            print(f"  loaded_latency {nbytes >> 20} MiB beside {stream_bytes >> 20} MiB, {w} warps/SM: {pts[-1][1:]}", flush=True)
        del tbl
        return {"chase_bytes": nbytes, "stream_bytes": stream_bytes, "columns": ["stream_warps_per_sm", "stream_gbps", "chase_cycles", "chase_ns"],
                "kernel": "loaded_chase: block 0 thread 0 chases a random cycle over chase_bytes (128-byte stride, 65536 warm-up"
                          " loads, 4096 timed) while the other blocks stream stream_bytes (4 x 16-byte loads per thread per"
                          " iteration) until it is done", "points": pts}


    @bench("l2_half_map", path)
    def _():
        res = {}
        region = 4 << 20
        for gran, n in ((32, 512), (128, 1024), (1024, 512)):
            for want in (0, 1, 2, 3, 66, 67):
                lat = cp.zeros(n + 1, cp.int64)
                claim = cp.zeros(1, cp.int32)
                flush_l2()
                K["half_probe"]((sms * 4,), (32,), (big, np.int64(region), np.int64(gran), np.int32(n),
                                                    np.int32(want), lat, claim))
                cp.cuda.runtime.deviceSynchronize()
                res[f"sm{want}_gran{gran}"] = [int(x) for x in lat.get()[:n]]
                v = np.array(res[f"sm{want}_gran{gran}"])
                print(f"  half_probe sm {want} gran {gran}: median {np.median(v):.0f}, "
                      f"{''.join('F' if x > np.median(v) + 100 else '.' for x in v[:96])}", flush=True)
        return {"kernel": "half_probe: thread 0 of the block on SM sm times dependent single 4-byte ld.global.cg"
                          " loads gran bytes apart over its own 4 MiB region after an L2 flush (DRAM misses)",
                "cycles": res}

    @bench("loaded_latency", path)
    def _():
        return loaded(256 << 20)

    del big, big2, flush
    cp.get_default_memory_pool().free_all_blocks()

    @bench("launch", path)
    def _():
        pts = []
        for threads in (128, 1024):
            for g in (1, 132, 264, 528, 1056, 2112, 4224, 8448, 16896, 33792, 67584, 135168):
                if threads == 1024 and g > 16896:
                    continue
                args = (sinkf,)
                for _ in range(3):
                    K["empty_kernel"]((g,), (threads,), args)
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                reps = 200
                e0.record()
                for _ in range(reps):
                    K["empty_kernel"]((g,), (threads,), args)
                e1.record()
                e1.synchronize()
                b2b = cp.cuda.get_elapsed_time(e0, e1) / reps * 1e3
                one = []
                for _ in range(20):
                    cp.cuda.runtime.deviceSynchronize()
                    e0.record()
                    K["empty_kernel"]((g,), (threads,), args)
                    e1.record()
                    e1.synchronize()
                    one.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
                pts.append([threads, g, round(b2b, 2), round(float(np.median(one)), 2)])
                print(f"  launch {threads} x {g}: back-to-back {b2b:.2f} us, alone {pts[-1][3]} us", flush=True)
        return {"columns": ["threads_per_block", "blocks", "back_to_back_us", "alone_us"],
                "kernel": "empty_kernel (one predicated store), CUDA events", "points": pts}

    def cuda_ms(fn, warm=3, reps=10):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(reps):
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        return float(np.median(ts))

    @bench("mma_rate", path)
    def _():
        mod = cp.RawModule(code=MMA_RATE_SRC, options=("--std=c++17",))
        cyc = cp.zeros(sms, cp.int64)
        iters = 4096
        pts = []
        for chains in (1, 2, 4, 8):
            fn = mod.get_function(f"mma_rate{chains}")
            for warps in (1, 2, 4, 8, 16, 32):
                fn((sms,), (32 * warps,), (np.int64(64), sinkf, cyc))
                fn((sms,), (32 * warps,), (np.int64(iters), sinkf, cyc))
                c = float(np.median(cyc.get()))
                fma = warps * iters * chains * 2048 / c
                pts.append([chains, warps, round(c), round(fma, 1)])
                print(f"  mma_rate chains {chains} warps {warps}: {fma:.0f} FMA/clk/SM", flush=True)
        other = []
        for name, fma_each in (("bf16", 2048), ("tf32", 1024)):
            fn = mod.get_function(f"mma_rate_{name}")
            for warps in (1, 4, 8, 16):
                fn((sms,), (32 * warps,), (np.int64(64), sinkf, cyc))
                fn((sms,), (32 * warps,), (np.int64(iters), sinkf, cyc))
                c = float(np.median(cyc.get()))
                other.append([name, 8, warps, round(c), round(warps * iters * 8 * fma_each / c, 1)])
                print(f"  mma_rate {name} chains 8 warps {warps}: {other[-1][-1]:.0f} FMA/clk/SM", flush=True)
        return {"columns": ["chains_per_warp", "warps_per_sm", "cycles", "fma_per_clk_per_sm"],
                "kernel": "mma.sync.m16n8k16.f32.f16.f16.f32, one block an SM", "iters": iters, "points": pts,
                "other_dtypes": {"columns": ["dtype", "chains_per_warp", "warps_per_sm", "cycles", "fma_per_clk_per_sm"],
                                 "kernels": "mma.sync.m16n8k16 bf16 / m16n8k8 tf32, f32 accumulators",
                                 "points": other}}

    @bench("mma_mix", path)
    def _():
        mod = cp.RawModule(code=MMA_MIX_SRC, options=("--std=c++17",))
        cyc = cp.zeros(sms, cp.int64)
        iters = 2048
        pts = []
        for nf, nl in ((0, 0), (1, 0), (2, 0), (4, 0), (8, 0), (0, 1), (0, 2), (0, 4), (2, 1)):
            fn = mod.get_function(f"mix_f{nf}_l{nl}")
            for warps in (4, 8):
                fn((sms,), (32 * warps,), (np.int64(16), sinkf, cyc))
                fn((sms,), (32 * warps,), (np.int64(iters), sinkf, cyc))
                c = float(np.median(cyc.get()))
                per = c / (iters * 8 * warps // 4)
                pts.append([nf, nl, warps, round(c), round(per, 3)])
                print(f"  mma_mix ffma/mma {nf} ldmatrix/4 mma {nl} warps {warps}: {per:.2f} cycles an mma a sub-core",
                      flush=True)
        return {"columns": ["ffma_per_mma", "ldmatrix_x4_per_4_mma", "warps_per_sm", "cycles",
                            "cycles_per_mma_per_subcore"],
                "kernel": "mix_f*_l*: 4 independent mma.sync m16n8k16 chains a warp, FFMA / ldmatrix.x4 between",
                "iters": iters, "points": pts}

    @bench("mma_mix2", path)
    def _():
        mod = cp.RawModule(code=MMA_MIX2_SRC, options=("--std=c++17",))
        cyc = cp.zeros(sms, cp.int64)
        src = cp.zeros(262144 * 4, cp.float32)
        iters = 2048
        pts = []
        for bar, nc in ((0, 0), (1, 0), (0, 1), (0, 2), (1, 1)):
            fn = mod.get_function(f"mix2_b{bar}_c{nc}")
            for warps in (4, 8):
                fn((sms,), (32 * warps,), (src, np.int64(16), sinkf, cyc))
                fn((sms,), (32 * warps,), (src, np.int64(iters), sinkf, cyc))
                c = float(np.median(cyc.get()))
                per = c / (iters * 8 * warps // 4)
                pts.append([bar, nc, warps, round(c), round(per, 3)])
                print(f"  mma_mix2 bar.sync {bar} cp.async {nc} a round of 8 mma, warps {warps}: {per:.2f} cycles an "
                      f"mma a sub-core", flush=True)
        return {"columns": ["bar_sync_per_8_mma", "cp_async_per_8_mma", "warps_per_sm", "cycles",
                            "cycles_per_mma_per_subcore"],
                "kernel": "mix2_b*_c*: 8 mma.sync (4 chains) a round, then bar.sync / cp.async.cg 16 B + commit + "
                          "wait_group 6", "iters": iters, "points": pts}

    @bench("smem_mix", path)
    def _():
        mod = cp.RawModule(code=SMEM_MIX_SRC, options=("--std=c++17",))
        cyc = cp.zeros(sms, cp.int64)
        src = cp.zeros(max(sms * 1024, 262144) * 4, cp.float32)
        sink = cp.zeros(4, cp.uint32)
        iters = 2048
        pts = []
        for name, nc, nl in (("smix_l4", 0, 4), ("smix_ca4", 4, 0), ("smix_cg4", 4, 0), ("smix_ca4_l4", 4, 4),
                             ("smix_cg4_l4", 4, 4), ("smix_ca2_l4", 2, 4), ("smix_cg1_l4", 1, 4)):
            fn = mod.get_function(name)
            for warps in (8, 16):
                fn((sms,), (32 * warps,), (src, np.int64(64), sink, cyc), shared_mem=40960)
                fn((sms,), (32 * warps,), (src, np.int64(iters), sink, cyc), shared_mem=40960)
                c = float(np.median(cyc.get()))
                cp_b, ld_b = warps * iters * nc * 512 / c, warps * iters * nl * 512 / c
                pts.append([name, warps, round(c), round(cp_b, 1), round(ld_b, 1)])
                print(f"  smem_mix {name} warps {warps}: cp.async {cp_b:.1f} + ldmatrix {ld_b:.1f} = "
                      f"{cp_b + ld_b:.1f} B/clk/SM", flush=True)
        return {"columns": ["kernel", "warps_per_sm", "cycles", "cp_async_bytes_per_clk", "ldmatrix_bytes_per_clk"],
                "kernel": "smem_mix: NC cp.async (.ca from a 16 KiB L1-resident window / .cg from 4 MiB in L2) and "
                          "NL ldmatrix.x4 a round, one block an SM", "iters": iters, "points": pts}

    @bench("l2_share", path)
    def _():
        kern = cp.RawKernel(L2_SHARE_SRC, "l2_share")
        cyc = cp.zeros(sms, cp.int64)
        sink = cp.zeros(4, cp.uint32)
        window = 1 << 13                          # 16-byte chunks: 128 KiB a window
        buf = cp.zeros(sms * window * 4, cp.float32)
        iters = 1024

        def timed(args, warps, its, before):
            """[cycles, B/clk/SM, B/clk] of one launch of `its` iterations, after before() (the
            median over the blocks' own clock64 times)."""
            kern((sms,), (32 * warps,), args + (np.int64(1 if before else 64), sink, cyc))
            if before:
                before()
            kern((sms,), (32 * warps,), args + (np.int64(its), sink, cyc))
            c = float(np.median(cyc.get()))
            per_sm = warps * 32 * 64 * its / c
            return [round(c), round(per_sm, 1), round(per_sm * sms)]

        pts = []
        for group in (1, 2, 4, 8, 33, sms):
            for stagger in (0, 1):
                for warps in (8, 16):       # the 64-iteration launch first brings the windows into the L2
                    args = (buf, np.int64(window), np.int32(group), np.int32(stagger))
                    pts.append([group, stagger, warps] + timed(args, warps, iters, None))
                    print(f"  l2_share group {group} stagger {stagger} warps {warps}: {pts[-1][-2]} B/clk/SM, "
                          f"{pts[-1][-1]} B/clk", flush=True)
        # cold: 1 MiB windows read once, in step, after 256 MiB of other reads pushed them out of the L2:
        # how the L2 takes many SMs missing on the same line at once (its MSHR merging)
        cold = []
        big_window = 1 << 16
        cbuf = cp.zeros(sms * big_window * 4, cp.float32)
        scrub = cp.ones((256 << 20) // 4, cp.float32)
        for group in (1, 2, 4, 8, 33, sms):
            for warps in (8, 16):
                args = (cbuf, np.int64(big_window), np.int32(group), np.int32(0))
                cold.append([group, warps] + timed(args, warps, big_window // (4 * 32 * warps),
                                                   lambda: float(scrub.sum())))
                print(f"  l2_share cold group {group} warps {warps}: {cold[-1][-2]} B/clk/SM, {cold[-1][-1]} B/clk",
                      flush=True)
        del cbuf, scrub
        return {"columns": ["sms_per_window", "stagger", "warps_per_sm", "cycles", "bytes_per_clk_per_sm",
                            "bytes_per_clk"],
                "kernel": "l2_share: one block an SM, groups of SMs read one 128 KiB L2-resident window each, in "
                          "step (stagger 0) or spread over it (1); 4 ld.global.cg of 16 B a thread in flight",
                "iters": iters, "points": pts,
                "cold": {"columns": ["sms_per_window", "warps_per_sm", "cycles", "bytes_per_clk_per_sm",
                                     "bytes_per_clk"],
                         "kernel": "the same, 1 MiB windows read once in step after 256 MiB of other reads (every "
                                   "first read of a line misses, with the rest of its group right behind)",
                         "points": cold}}

    def twin_blocks(cyc):
        """gemm_twin's per-block record of its last launch (rows of 6, see the kernel) and the SM
        clock its blocks ran at: their cycles over their globaltimer nanoseconds, in MHz."""
        rows = cyc.get().reshape(-1, 6)
        return rows, 1e3 * rows[:, 2].sum() / max(1, rows[:, 3].sum())

    def twin_raster(tm: int, tn: int, cores: int) -> tuple[int, int]:
        """(group, raster_n) as archsim's gemm_gpu._raster over `cores` resident blocks."""
        root = math.sqrt(cores)
        rows, cols = sorted((tm, tn))
        group = rows if rows <= 2 * root else -(-rows // max(1, round(rows / root)))
        return group, int(tn < tm)

    @bench("gemm_twin", path)
    def _():
        kern = cp.RawKernel(GEMM_TWIN_SRC, "gemm_twin")
        kern.max_dynamic_shared_size_bytes = 131072

        kern_simple = cp.RawKernel(GEMM_TWIN_SRC, "gemm_twin_simple")
        kern_simple.max_dynamic_shared_size_bytes = 131072
        kern3 = cp.RawKernel(GEMM_TWIN_SRC, "gemm_twin", options=("-DTW_S=3",))
        kern3.max_dynamic_shared_size_bytes = 98304
        kern_direct = cp.RawKernel(GEMM_TWIN_SRC, "gemm_twin", options=("-DTW_DIRECT_STORE",))
        kern_direct.max_dynamic_shared_size_bytes = 131072

        def launch(a, b, c, m, n, k, fn=kern, smem=131072, per_sm=1, cyc=None):
            group, raster_n = twin_raster(m // 128, n // 128, per_sm * sms)
            extra = ((np.uint64(0) if cyc is None else cyc),) if fn is not kern_simple else ()
            fn((n // 128, m // 128), (128,), (a, b, c, np.int32(m), np.int32(n), np.int32(k), np.int32(group),
                                             np.int32(raster_n)) + extra, shared_mem=smem)

        m, n, k = 256, 384, 192
        a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
        b = cp.random.standard_normal((k, n), dtype=cp.float32).astype(cp.float16)
        c = cp.zeros((m, n), cp.float32)
        launch(a, b, c, m, n, k)
        c3, cs = cp.zeros((m, n), cp.float32), cp.zeros((m, n), cp.float32)
        launch(a, b, c3, m, n, k, kern3, 98304, 2)
        launch(a, b, cs, m, n, k, kern_simple)
        cd = cp.zeros((m, n), cp.float32)
        launch(a, b, cd, m, n, k, kern_direct)
        ref = a.astype(cp.float32) @ b.astype(cp.float32)
        err = max(float(cp.abs(out - ref).max() / cp.abs(ref).max()) for out in (c, c3, cs, cd))
        print(f"  gemm_twin {m}x{n}x{k}: max error / max |C| = {err:.2e}", flush=True)
        if not err < 1e-3:
            raise RuntimeError(f"gemm_twin is wrong: relative error {err}")
        shapes = [(1024, 2304, 768), (1024, 768, 3072), (1024, 3072, 768), (1024, 1024, 1024), (2048, 2048, 2048),
                  (4096, 4096, 4096), (2048, 12288, 12288), (8192, 8192, 8192)]
        if QUICK:
            shapes = shapes[:2]
        pts = []
        for m, n, k in shapes:
            a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
            b = cp.random.standard_normal((k, n), dtype=cp.float32).astype(cp.float16)
            c = cp.zeros((m, n), cp.float32)
            ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
            flops = 2 * m * n * k
            inner = max(1, int(2e9 * 1000 / flops))   # back-to-back launches, about 2 ms at 1 PFLOP/s
            cyc = cp.zeros(6 * (m // 128) * (n // 128), cp.int64)
            ms_twin = cuda_ms(lambda: [launch(a, b, c, m, n, k, cyc=cyc) for _ in range(inner)], reps=5) / inner
            rows, clk_during = twin_blocks(cyc)            # the last timed launch's blocks
            span_cycles = (rows[:, 5].max() - rows[:, 4].min()) * clk_during / 1e3
            clk_twin = sm_clock_mhz()
            ms_cublas = cuda_ms(lambda: [torch.matmul(ta, tb) for _ in range(inner)], reps=5) / inner
            clk_cublas = sm_clock_mhz()
            ms_simple = cuda_ms(lambda: [launch(a, b, c, m, n, k, kern_simple) for _ in range(inner)], reps=5) / inner
            ms_s3 = cuda_ms(lambda: [launch(a, b, c, m, n, k, kern3, 98304, 2) for _ in range(inner)], reps=5) / inner
            ms_direct = cuda_ms(lambda: [launch(a, b, c, m, n, k, kern_direct) for _ in range(inner)], reps=5) / inner
            pts.append([m, n, k, round(flops / (ms_twin * 1e-3) / 1e12, 1), round(clk_twin),
                        round(flops / (ms_cublas * 1e-3) / 1e12, 1), round(clk_cublas),
                        round(flops / (ms_s3 * 1e-3) / 1e12, 1), round(flops / (ms_simple * 1e-3) / 1e12, 1),
                        round(clk_during), round(flops / (ms_twin * 1e-3) / 1e12 * 1980 / clk_during, 1),
                        round(float(span_cycles)), round(flops / (ms_direct * 1e-3) / 1e12, 1)])
            print(f"  gemm_twin {m}x{n}x{k}: twin {pts[-1][3]} TFLOP/s at {clk_twin:.0f} MHz, cuBLAS {pts[-1][5]} at "
                  f"{clk_cublas:.0f} MHz, twin with 3 stages (2 blocks an SM) {pts[-1][7]}, "
                  f"simple twin {pts[-1][8]}; the twin's blocks ran at {clk_during:.0f} MHz ({pts[-1][10]} at 1980), "
                  f"first block in to last out {pts[-1][11]} cycles; storing C without staging {pts[-1][12]}",
                  flush=True)
            del a, b, c, ta, tb
        return {"columns": ["m", "n", "k", "twin_tflops", "twin_sm_mhz_after", "cublas_tflops", "cublas_sm_mhz_after",
                            "twin_3_stages_tflops", "twin_simple_tflops", "twin_sm_mhz_during",
                            "twin_tflops_at_1980_mhz", "twin_span_cycles", "twin_direct_store_tflops"],
                "dtype": "fp16 in, f32 out (twin), fp16 out (cuBLAS)", "layout": "A[m,k] @ B[k,n]",
                "kernel": "gemm_twin: archsim's mma.sync GEMM (128x128x64, 4 stages, 4 warps, grouped raster, copies "
                          "addressed once as the emitter's pointer registers, C staged in shared memory as "
                          "the emitter's epilogue)",
                "max_rel_error": err, "points": pts}

    @bench("gemm_parts", path)
    def _():
        """Where the twin's k-tile cycles go: its main loop with parts left out, timed by each block's clock64,
        on 1 block, one wave (a block on every SM) and 4096^3 (7.8 waves). No variant leaves the mma out while
        keeping ldmatrix: ptxas drops ldmatrix whose registers nothing reads."""
        variants = {"full": (), "slow_copy": ("TW_SLOW_COPY",), "no_copy": ("TW_NO_COPY",), "no_ldm": ("TW_NO_LDM",),
                    "no_bar": ("TW_NO_BAR",), "mma_only": ("TW_NO_COPY", "TW_NO_LDM", "TW_NO_BAR"),
                    "copy_only": ("TW_NO_LDM", "TW_NO_MMA"), "mma_ldm": ("TW_NO_COPY", "TW_NO_BAR"),
                    "slow_copy_only": ("TW_SLOW_COPY", "TW_NO_LDM", "TW_NO_MMA")}
        tiles = (12, 11) if sms == 132 else (sms, 1)
        grids = [("1 block", 128, 128, 8192), ("one wave", 128 * tiles[1], 128 * tiles[0], 8192),
                 ("4096^3", 4096, 4096, 4096)]
        pts = []
        for gname, m, n, k in grids:
            a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
            b = cp.random.standard_normal((k, n), dtype=cp.float32).astype(cp.float16)
            c = cp.zeros((m, n), cp.float32)
            blocks = (m // 128) * (n // 128)
            cyc = cp.zeros(6 * blocks, cp.int64)
            group, raster_n = twin_raster(m // 128, n // 128, sms)
            for vname, flags in variants.items():
                fn = cp.RawKernel(GEMM_TWIN_SRC, "gemm_twin", options=tuple(f"-D{f}" for f in flags))
                fn.max_dynamic_shared_size_bytes = 131072
                args = (a, b, c, np.int32(m), np.int32(n), np.int32(k), np.int32(group), np.int32(raster_n))
                run = lambda: fn((n // 128, m // 128), (128,), args + (cyc,), shared_mem=131072)
                ms = cuda_ms(run, warm=2, reps=5)
                rows, mhz = twin_blocks(cyc)
                per_block = rows[:, 0] / (k // 64)
                pts.append([gname, vname, m, n, k, round(ms * 1e3, 1), round(mhz),
                            round(float(np.median(per_block)), 1), round(float(per_block.min()), 1),
                            round(float(per_block.max()), 1), round(2 * m * n * k / (ms * 1e-3) / 1e12, 1)])
                print(f"  gemm_parts {gname} {vname}: {pts[-1][7]} cycles a k-tile (min {pts[-1][8]}, max "
                      f"{pts[-1][9]}), {pts[-1][5]} us, {pts[-1][10]} TFLOP/s-equivalent at {mhz:.0f} MHz", flush=True)
            del a, b, c
        return {"columns": ["grid", "variant", "m", "n", "k", "kernel_us", "sm_mhz_during", "cycles_per_ktile_median",
                            "cycles_per_ktile_min", "cycles_per_ktile_max", "tflops_equivalent"],
                "kernel": "gemm_twin's main loop with parts left out (-DTW_NO_COPY / LDM / MMA / BAR), each block's "
                          "loop timed by clock64, cycles over its k tiles", "variants": variants, "points": pts}

    @bench("gemm", path)
    def _():
        shapes = [(s, s, s) for s in (512, 1024, 2048, 4096, 8192, 16384)]
        shapes += [(2048, 36864, 12288), (2048, 12288, 12288), (2048, 49152, 12288), (2048, 12288, 49152),
                   (2048, 43008, 14336), (2048, 14336, 14336), (2048, 57344, 14336), (2048, 14336, 57344)]
        if QUICK:
            shapes = shapes[:3]
        pts = []
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(k, n, device="cuda", dtype=torch.float16)
            ms = cuda_ms(lambda: torch.matmul(a, b), reps=5 if m * n * k > 2**40 else 10)
            clk = sm_clock_mhz()
            pts.append([m, n, k, round(2 * m * n * k / (ms * 1e-3) / 1e12, 1), round(clk)])
            print(f"  gemm {m}x{n}x{k}: {pts[-1][3]} TFLOP/s at {clk:.0f} MHz", flush=True)
            del a, b
        return {"columns": ["m", "n", "k", "tflops", "sm_mhz_after"], "dtype": "fp16", "layout": "A[m,k] @ B[k,n]",
                "points": pts}

    @bench("attention", path)
    def _():
        import torch.nn.functional as F
        pts = []
        seqs = [512, 1024, 2048, 4096, 8192, 16384]
        if QUICK:
            seqs = seqs[:2]
        for d in (64, 128):
            for s in seqs:
                batch = max(1, 16384 // s)
                heads = 16
                q, k, v = (torch.randn(batch, heads, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                    ms = cuda_ms(lambda: F.scaled_dot_product_attention(q, k, v))
                flops = 4 * batch * heads * s * s * d
                pts.append([d, s, batch, heads, round(flops / (ms * 1e-3) / 1e12, 1)])
                print(f"  attention d{d} s{s}: {pts[-1][-1]} TFLOP/s", flush=True)
                del q, k, v
        return {"columns": ["head_dim", "seq", "batch", "heads", "tflops"], "dtype": "fp16", "causal": False,
                "backend": "flash (torch sdpa)", "points": pts}

    @bench("gemv", path)
    def _():
        pts = []
        for k, n in [(4096, 4096), (8192, 8192), (12288, 12288), (12288, 36864), (12288, 49152), (49152, 12288)]:
            x = torch.randn(1, k, device="cuda", dtype=torch.float16)
            w = torch.randn(k, n, device="cuda", dtype=torch.float16)
            ms = cuda_ms(lambda: torch.matmul(x, w), reps=20)
            pts.append([k, n, round(2 * k * n / (ms * 1e-3) / 1e9, 1)])
            print(f"  gemv {k}x{n}: {pts[-1][-1]} GB/s", flush=True)
            del x, w
        return {"columns": ["k", "n", "weight_gbps"], "dtype": "fp16", "layout": "x[1,k] @ W[k,n]", "points": pts}

    @bench("sm_clock_end", path)
    def _():
        return {"mhz": [round(sm_clock_mhz(), 1) for _ in range(3)]}


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__)
        sys.exit(2)
    main(sys.argv[1])
