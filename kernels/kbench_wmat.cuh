// kbench_wmat.cuh: weight-stationary tensor-core matmul core, Y[t, n] = sum_k X[t, k] * W[n, k].
//
// A warp owns RW m16 tiles of output features (16 rows of W each); tokens are the mma's N
// dimension, 8*NT tokens per pass, staged through shared memory WM_KC columns at a time.
// Each thread loads its A fragments straight from global memory, so weights are read once,
// coalesced (a quad of threads reads one 16 B (int4) or 64 B (bf16) run of a row per 32-k group).
// The reduction index k is permuted identically on the A and B sides (a sum does not care):
//   int4: thread t of a quad holds packed word t of a group (k = 8t..8t+7); dequantized as
//         pairs (k0,k4),(k1,k5),(k2,k6),(k3,k7); the staged X block is permuted the same way.
//   bf16: thread t holds W[row][8t..8t+7] as 4 words (k0,k1),(k2,k3),...; X staged unpermuted.
// int4 groups (32 k) are accumulated exactly (integers in bf16) and scaled in f32 per group.
#pragma once
#include "kbench_common.cuh"

#define WM_KC 512
#define WM_XSTRIDE (WM_KC + 8)  // staged row stride in bf16 (260 words, = 4 mod 32)
#define WM_WARPS 4
#define WM_THREADS (WM_WARPS * 32)

template <bool INT4, int NT>
__device__ __forceinline__ void wm_stage_x(bf16* xs, const bf16* const* xrow, int k0, int kc) {
    const int pieces = kc >> 3;
    for (int p = threadIdx.x; p < NT * 8 * pieces; p += blockDim.x) {
        const int tk = p / pieces, q = p - tk * pieces;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        const bf16* src = xrow[tk];
        if (src != nullptr) v = *reinterpret_cast<const uint4*>(src + k0 + q * 8);
        if (INT4) {
            uint4 o;
            o.x = __byte_perm(v.x, v.z, 0x5410);  // (x0, x4)
            o.y = __byte_perm(v.x, v.z, 0x7632);  // (x1, x5)
            o.z = __byte_perm(v.y, v.w, 0x5410);  // (x2, x6)
            o.w = __byte_perm(v.y, v.w, 0x7632);  // (x3, x7)
            v = o;
        }
        *reinterpret_cast<uint4*>(xs + tk * WM_XSTRIDE + q * 8) = v;
    }
}

// packed word (8 nibbles, stored value = q + 8) -> 4 bf16x2 (q_i, q_{i+4}), exact.
__device__ __forceinline__ void wm_deq(u32 w, u32* p) {
    const __nv_bfloat162 off = __floats2bfloat162_rn(136.0f, 136.0f);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 v = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;  // bf16 128 + nibble
        __nv_bfloat162 b = *reinterpret_cast<__nv_bfloat162*>(&v);
        b = __hsub2(b, off);
        p[i] = *reinterpret_cast<u32*>(&b);
    }
}

// One pass: acc[r][j] += W[rows of m-tile r] . X[tokens of n-tile j] over k in [kbeg, kend).
// wrow[r][h]: row pointer of row (m-tile r, half h: +0 / +8 of the quad-group row); for int4 a
// u32 pointer to the packed row and srow its scale row; for bf16 a bf16 pointer (srow unused).
// Must be called by every thread of the block (contains __syncthreads).
template <bool INT4, int RW, int NT>
__device__ __forceinline__ void wm_pass(bf16* xs, const bf16* const* xrow, const void* const (&wrow)[RW][2],
                                        const bf16* const (&srow)[RW][2], int kbeg, int kend,
                                        float (&acc)[RW][NT][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    constexpr int UNR = INT4 ? (NT >= 4 ? 4 : 8) : 2;  // groups loaded ahead (bytes in flight per warp)
    for (int k0 = kbeg; k0 < kend; k0 += WM_KC) {
        const int kc = min(WM_KC, kend - k0);
        __syncthreads();
        wm_stage_x<INT4, NT>(xs, xrow, k0, kc);
        __syncthreads();
        const int ng = kc >> 5;
        for (int gi = 0; gi < ng; gi += UNR) {
            u32 wq[UNR][RW][2];
            uint4 wb[INT4 ? 1 : UNR][RW][2];
            float sc[INT4 ? UNR : 1][RW][2];
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int kg = (k0 >> 5) + gi + u;
                const bool ok = gi + u < ng;
#pragma unroll
                for (int r = 0; r < RW; r++) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (INT4) {
                            const u32* wp = reinterpret_cast<const u32*>(wrow[r][h]);
                            wq[u][r][h] = ok ? __ldg(wp + kg * 4 + t) : 0u;
                            sc[INT4 ? u : 0][r][h] = ok ? bf2f(srow[r][h][kg]) : 0.0f;
                        } else {
                            const bf16* wp = reinterpret_cast<const bf16*>(wrow[r][h]);
                            wb[INT4 ? 0 : u][r][h] =
                                ok ? __ldg(reinterpret_cast<const uint4*>(wp + kg * 32 + 8 * t))
                                   : make_uint4(0u, 0u, 0u, 0u);
                        }
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                if (gi + u < ng) {
                    const bf16* xg = xs + (gi + u) * 32 + 8 * t;
                    uint2 bfr[2][NT];  // B fragments of this group, shared by the RW m-tiles
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
                            bfr[s][j] = *reinterpret_cast<const uint2*>(xg + (j * 8 + g) * WM_XSTRIDE + 4 * s);
#pragma unroll
                    for (int r = 0; r < RW; r++) {
                        u32 alo[4], ahi[4];
                        if (INT4) {
                            wm_deq(wq[u][r][0], alo);
                            wm_deq(wq[u][r][1], ahi);
                        } else {
                            const uint4 l = wb[INT4 ? 0 : u][r][0], hh = wb[INT4 ? 0 : u][r][1];
                            alo[0] = l.x; alo[1] = l.y; alo[2] = l.z; alo[3] = l.w;
                            ahi[0] = hh.x; ahi[1] = hh.y; ahi[2] = hh.z; ahi[3] = hh.w;
                        }
                        float tmp[NT][4];
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int q = 0; q < 4; q++) tmp[j][q] = 0.0f;
#pragma unroll
                        for (int s = 0; s < 2; s++) {
                            const u32 a[4] = {alo[2 * s], ahi[2 * s], alo[2 * s + 1], ahi[2 * s + 1]};
#pragma unroll
                            for (int j = 0; j < NT; j++) {
                                if (INT4) mma_bf16_16816(tmp[j], a, bfr[s][j].x, bfr[s][j].y);
                                else mma_bf16_16816(acc[r][j], a, bfr[s][j].x, bfr[s][j].y);
                            }
                        }
                        if (INT4) {
                            const float s0 = sc[INT4 ? u : 0][r][0], s1 = sc[INT4 ? u : 0][r][1];
#pragma unroll
                            for (int j = 0; j < NT; j++) {
                                acc[r][j][0] = fmaf(tmp[j][0], s0, acc[r][j][0]);
                                acc[r][j][1] = fmaf(tmp[j][1], s0, acc[r][j][1]);
                                acc[r][j][2] = fmaf(tmp[j][2], s1, acc[r][j][2]);
                                acc[r][j][3] = fmaf(tmp[j][3], s1, acc[r][j][3]);
                            }
                        }
                    }
                }
            }
        }
    }
}

template <int RW, int NT>
__device__ __forceinline__ void wm_zero(float (&acc)[RW][NT][4]) {
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[r][j][q] = 0.0f;
}
