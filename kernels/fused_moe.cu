// fused_moe.cu: DeepSeek-V3 / Kimi-K2 routed experts with INT4 (group-32) weights.
//   1. moe_route:   sigmoid(logits) + e_score_correction_bias, grouped top-k (n_group/topk_group),
//                   weights = sigmoid scores of the chosen experts, optionally renormalised,
//                   times routed_scaling_factor.                       ids/wts [T, top_k]
//   2. moe_align:   tokens grouped by expert: offsets [E+1], sorted pair list (pair = t*top_k + j),
//                   list of active experts and their count (device side: graph-capturable).
//   3. moe_gate_up: per active expert, grouped INT4 matmul of its tokens with [gate; up] (W13
//                   [E, 2I, H/8], S13 [E, 2I, H/32]) fused with SwiGLU -> act [P, I] bf16.
//   4. moe_down:    per active expert, act rows x W2 [E, H, I/8] -> down [P, H] f32.
//   5. moe_combine: y[t] = sum_j wts[t, j] * down[t*top_k + j] (+ shared[t]) -> bf16, fixed order.
// Grids of 3 and 4: y = min(E, P) expert slots; slots >= num_active exit at once.
#include "kbench_wmat.cuh"

// One warp per token. Dynamic shared memory: (blockDim.x / 32) * E floats.
extern "C" __global__ void moe_route(const float* __restrict__ logits, const float* __restrict__ bias, int T,
                                     int E, int top_k, int n_group, int topk_group, int renorm, float scaling,
                                     int* __restrict__ ids, float* __restrict__ wts) {
    extern __shared__ float route_sh[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tok = blockIdx.x * (blockDim.x >> 5) + warp;
    if (tok >= T) return;  // warp-uniform; no block barriers below
    float* ch = route_sh + warp * E;
    const float* lg = logits + (size_t)tok * E;
    for (int e = lane; e < E; e += 32) {
        const float s = 1.0f / (1.0f + expf(-lg[e]));
        ch[e] = s + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    if (n_group > 1) {
        const int gs = E / n_group;
        u64 keep = 0;
        for (int sel = 0; sel < topk_group; sel++) {
            float bv = -KB_INF;
            int bi = -1;
            for (int gi = lane; gi < n_group; gi += 32) {
                if ((keep >> gi) & 1ull) continue;
                float a = -KB_INF, b = -KB_INF;  // top-2 of the group
                for (int e = gi * gs; e < (gi + 1) * gs; e++) {
                    const float v = ch[e];
                    if (v > a) { b = a; a = v; } else if (v > b) { b = v; }
                }
                const float sc = (gs >= 2) ? a + b : a;
                if (kb_better(sc, gi, bv, bi)) { bv = sc; bi = gi; }
            }
            warp_argmax(bv, bi);
            if (bi >= 0) keep |= 1ull << bi;
        }
        for (int e = lane; e < E; e += 32)
            if (!((keep >> (e / gs)) & 1ull)) ch[e] = -KB_INF;
        __syncwarp();
    }
    float sum = 0.0f;
    for (int j = 0; j < top_k; j++) {
        float bv = -KB_INF;
        int bi = -1;
        for (int e = lane; e < E; e += 32)
            if (kb_better(ch[e], e, bv, bi)) { bv = ch[e]; bi = e; }
        warp_argmax(bv, bi);
        if (bi < 0) bi = 0;  // fewer selectable experts than top_k (misconfiguration): stay in range
        const float w = 1.0f / (1.0f + expf(-lg[bi]));
        sum += w;
        __syncwarp();
        if (lane == 0) {
            ids[(size_t)tok * top_k + j] = bi;
            wts[(size_t)tok * top_k + j] = w;
            ch[bi] = -KB_INF;
        }
        __syncwarp();
    }
    if (lane == 0) {
        const float f = renorm ? scaling / (sum + 1e-20f) : scaling;
        for (int j = 0; j < top_k; j++) wts[(size_t)tok * top_k + j] *= f;
    }
}

// Single block (1024 threads). Dynamic shared memory: 2 * E ints.
extern "C" __global__ void moe_align(const int* __restrict__ ids, int P, int E, int* __restrict__ offsets,
                                     int* __restrict__ sorted_pairs, int* __restrict__ active,
                                     int* __restrict__ num_active) {
    extern __shared__ int align_sh[];
    int* cnt = align_sh;
    int* cur = align_sh + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0, na = 0;
        for (int e = 0; e < E; e++) {
            offsets[e] = run;
            cur[e] = run;
            if (cnt[e] > 0) active[na++] = e;
            run += cnt[e];
        }
        offsets[E] = run;
        *num_active = na;
    }
    __syncthreads();
    // order inside an expert is not fixed, but every pair is computed independently of the others
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < E) sorted_pairs[atomicAdd(&cur[e], 1)] = p;
    }
}

// act[pair, j] = silu(x . gate_j) * (x . up_j), x = X[pair / top_k]. Warp: gate rows j0..j0+15
// (m-tile 0) and up rows I+j0.. (m-tile 1); block: 64 consecutive j. Grid (ceil(I/64), slots).
template <int NT>
__device__ __forceinline__ void moe_gate_up_body(const bf16* __restrict__ X, int ldx, const u32* __restrict__ W13,
                                                 const bf16* __restrict__ S13, const int* __restrict__ offsets,
                                                 const int* __restrict__ sorted_pairs,
                                                 const int* __restrict__ active, const int* __restrict__ num_active,
                                                 bf16* __restrict__ act, int I, int H, int top_k) {
    __shared__ __align__(16) bf16 xs[NT * 8 * WM_XSTRIDE];
    __shared__ const bf16* xrow[NT * 8];
    const int slot = blockIdx.y;
    if (slot >= *num_active) return;  // block-uniform
    const int e = active[slot];
    const int beg = offsets[e], end = offsets[e + 1];
    const u32* We = W13 + (size_t)e * 2 * I * (H / 8);
    const bf16* Se = S13 + (size_t)e * 2 * I * (H / 32);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j0 = (blockIdx.x * WM_WARPS + warp) * 16;
    const void* wrow[2][2];
    const bf16* srow[2][2];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = r * I + min(j0 + h * 8 + g, I - 1);
            wrow[r][h] = We + (size_t)row * (H / 8);
            srow[r][h] = Se + (size_t)row * (H / 32);
        }
    for (int p0 = beg; p0 < end; p0 += NT * 8) {
        if (threadIdx.x < NT * 8) {
            const int p = p0 + threadIdx.x;
            xrow[threadIdx.x] = p < end ? X + (size_t)(sorted_pairs[p] / top_k) * ldx : nullptr;
        }
        float acc[2][NT][4];
        wm_zero<2, NT>(acc);
        wm_pass<true, 2, NT>(xs, xrow, wrow, srow, 0, H, acc);
#pragma unroll
        for (int jt = 0; jt < NT; jt++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int j = j0 + g + (q >= 2 ? 8 : 0);
                const int p = p0 + jt * 8 + 2 * t + (q & 1);
                if (j < I && p < end) {
                    const int pair = sorted_pairs[p];
                    act[(size_t)pair * I + j] = f2bf(silu_f(acc[0][jt][q]) * acc[1][jt][q]);
                }
            }
    }
}

// down[pair, n] = act[pair] . W2[e][n]. Grid (ceil(H/128), slots).
template <int NT>
__device__ __forceinline__ void moe_down_body(const bf16* __restrict__ act, const u32* __restrict__ W2,
                                              const bf16* __restrict__ S2, const int* __restrict__ offsets,
                                              const int* __restrict__ sorted_pairs, const int* __restrict__ active,
                                              const int* __restrict__ num_active, float* __restrict__ down, int I,
                                              int H) {
    __shared__ __align__(16) bf16 xs[NT * 8 * WM_XSTRIDE];
    __shared__ const bf16* xrow[NT * 8];
    const int slot = blockIdx.y;
    if (slot >= *num_active) return;
    const int e = active[slot];
    const int beg = offsets[e], end = offsets[e + 1];
    const u32* We = W2 + (size_t)e * H * (I / 8);
    const bf16* Se = S2 + (size_t)e * H * (I / 32);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rowbase = (blockIdx.x * WM_WARPS + warp) * 32;
    const void* wrow[2][2];
    const bf16* srow[2][2];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = min(rowbase + r * 16 + h * 8 + g, H - 1);
            wrow[r][h] = We + (size_t)n * (I / 8);
            srow[r][h] = Se + (size_t)n * (I / 32);
        }
    for (int p0 = beg; p0 < end; p0 += NT * 8) {
        if (threadIdx.x < NT * 8) {
            const int p = p0 + threadIdx.x;
            xrow[threadIdx.x] = p < end ? act + (size_t)sorted_pairs[p] * I : nullptr;
        }
        float acc[2][NT][4];
        wm_zero<2, NT>(acc);
        wm_pass<true, 2, NT>(xs, xrow, wrow, srow, 0, I, acc);
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int jt = 0; jt < NT; jt++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int n = rowbase + r * 16 + g + (q >= 2 ? 8 : 0);
                    const int p = p0 + jt * 8 + 2 * t + (q & 1);
                    if (n < H && p < end) down[(size_t)sorted_pairs[p] * H + n] = acc[r][jt][q];
                }
    }
}

#define GU_ARGS                                                                                            \
    const bf16 *__restrict__ X, int ldx, const u32 *__restrict__ W13, const bf16 *__restrict__ S13,          \
        const int *__restrict__ offsets, const int *__restrict__ sorted_pairs, const int *__restrict__ active, \
        const int *__restrict__ num_active, bf16 *__restrict__ act, int I, int H, int top_k
#define GU_PASS X, ldx, W13, S13, offsets, sorted_pairs, active, num_active, act, I, H, top_k
#define DN_ARGS                                                                                           \
    const bf16 *__restrict__ act, const u32 *__restrict__ W2, const bf16 *__restrict__ S2,                  \
        const int *__restrict__ offsets, const int *__restrict__ sorted_pairs, const int *__restrict__ active, \
        const int *__restrict__ num_active, float *__restrict__ down, int I, int H
#define DN_PASS act, W2, S2, offsets, sorted_pairs, active, num_active, down, I, H

extern "C" __global__ void __launch_bounds__(128) moe_gate_up_nt1(GU_ARGS) { moe_gate_up_body<1>(GU_PASS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_nt2(GU_ARGS) { moe_gate_up_body<2>(GU_PASS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_nt4(GU_ARGS) { moe_gate_up_body<4>(GU_PASS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_nt1(DN_ARGS) { moe_down_body<1>(DN_PASS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_nt2(DN_ARGS) { moe_down_body<2>(DN_PASS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_nt4(DN_ARGS) { moe_down_body<4>(DN_PASS); }

// One block per token; H % 2 == 0. shared may be null.
extern "C" __global__ void moe_combine(const float* __restrict__ down, const float* __restrict__ wts,
                                       const bf16* __restrict__ shared, int ld_shared, int top_k, int H,
                                       bf16* __restrict__ out, int ld_out) {
    const int tok = blockIdx.x;
    for (int n = threadIdx.x; n < H; n += blockDim.x) {
        float v = shared ? bf2f(shared[(size_t)tok * ld_shared + n]) : 0.0f;
        for (int j = 0; j < top_k; j++) {
            const size_t pair = (size_t)tok * top_k + j;
            v = fmaf(wts[pair], down[pair * H + n], v);
        }
        out[(size_t)tok * ld_out + n] = f2bf(v);
    }
}
