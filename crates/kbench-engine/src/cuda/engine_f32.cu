// kbench-engine CUDA path: the "exact" kernels. f32 activations over BF16 / INT4
// (compressed-tensors, group-wise, +8 offset) weights, any dimensions, the same algebra as
// the CPU reference (crates/kbench-engine/src/{linalg,target,draft}.rs) up to summation order.
// Every kernel reads its per-token metadata from device memory, so one launch sequence per
// token count can be captured in a CUDA graph and replayed for any batch composition.
//
// Compiled by NVRTC at run time (kbench-cuda's nvrtc.rs); only cuda_bf16.h is not needed here.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 f2bf(float x) {
    u32 b = __float_as_uint(x);
    if (x != x) return (u16)((b >> 16) | 0x40);
    u32 r = 0x7fff + ((b >> 16) & 1);
    return (u16)((b + r) >> 16);
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum / max for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = 0.f;
    for (int i = 0; i < nw; i++) r += sh[i];
    return r;
}
__device__ float block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = NEG_INF;
    for (int i = 0; i < nw; i++) r = fmaxf(r, sh[i]);
    return r;
}

// ---------------------------------------------------------------------------------------
// Linear layers: y[m, n] (+)= sum_k x[m, k] W[n, k]. One warp per (n, m); grid (ceil(N/4), M).
extern "C" __global__ void lin_bf16(const float* x, int ldx, const u16* w, float* y, int ldy,
                                    int M, int N, int K, int accum) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * 4 + warp, m = blockIdx.y;
    if (n >= N || m >= M) return;
    const u16* wr = w + (size_t)n * K;
    const float* xr = x + (size_t)m * ldx;
    float s = 0.f;
    for (int k = lane; k < K; k += 32) s = fmaf(bf2f(wr[k]), xr[k], s);
    s = warp_sum(s);
    if (lane == 0) {
        float* o = y + (size_t)m * ldy + n;
        *o = accum ? *o + s : s;
    }
}

__device__ __forceinline__ float int4_row_dot(const u32* wq, const u16* sc, int group, const float* xr, int K, int lane) {
    float s = 0.f;
    for (int wi = lane; wi < K / 8; wi += 32) {
        u32 word = wq[wi];
        float scale = bf2f(sc[(wi * 8) / group]);
        const float* xx = xr + wi * 8;
        float g = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) g = fmaf((float)((int)((word >> (4 * j)) & 0xFu) - 8), xx[j], g);
        s = fmaf(scale, g, s);
    }
    return warp_sum(s);
}

// Routed experts: pair p (token p / xdiv, slot p % k) runs expert ids[p] - e0 of this rank's
// stacked weights (eloc experts of [N, K]); pairs of other ranks' experts give 0.
extern "C" __global__ void moe_lin(const float* x, int ldx, int xdiv, const int* ids, int e0, int eloc, int is_int4,
                                   const void* w, const u16* sc, int group, float* y, int ldy, int P, int N, int K) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * 4 + warp, p = blockIdx.y;
    if (n >= N || p >= P) return;
    int e = ids[p] - e0;
    float s = 0.f;
    if (e >= 0 && e < eloc) {
        const float* xr = x + (size_t)(p / xdiv) * ldx;
        if (is_int4) {
            const u32* wq = (const u32*)w + ((size_t)e * N + n) * (K / 8);
            const u16* ss = sc + ((size_t)e * N + n) * (K / group);
            s = int4_row_dot(wq, ss, group, xr, K, lane);
        } else {
            const u16* wr = (const u16*)w + ((size_t)e * N + n) * K;
            for (int k = lane; k < K; k += 32) s = fmaf(bf2f(wr[k]), xr[k], s);
            s = warp_sum(s);
        }
    }
    if (lane == 0) y[(size_t)p * ldy + n] = s;
}

// ---------------------------------------------------------------------------------------
// Elementwise.
extern "C" __global__ void silu_mul(const float* g, const float* u, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float a = g[i];
        out[i] = a / (1.0f + expf(-a)) * u[i];
    }
}
extern "C" __global__ void add_f32(float* dst, const float* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = dst[i] + src[i];
}
extern "C" __global__ void f32_to_bf16(const float* src, u16* dst, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f2bf(src[i]);
}
extern "C" __global__ void add_bf16_to_f32(float* dst, const u16* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = dst[i] + bf2f(src[i]);
}
// The tuned path's SwiGLU: f32 gate / up from the matmuls, bf16 out as the down matmul's input.
extern "C" __global__ void silu_mul_bf16(const float* g, const float* u, u16* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float a = g[i];
        out[i] = f2bf(a / (1.0f + expf(-a)) * u[i]);
    }
}
// Tensor parallelism for kbench-cuda's fused MoE, which indexes its weights by expert id: pair
// p's global id becomes its index among this rank's experts [e0, e0 + eloc), or -1 (skipped by
// moe_align) for another rank's expert. A skipped pair is never written by moe_down, so its
// down row still holds an earlier layer's values: zeroing it and its weight makes its term in
// moe_combine exactly 0 (a stale Inf times 0 would be NaN). One block per pair.
extern "C" __global__ void moe_local_ids(int* ids, float* wts, float* down, int P, int H, int e0, int eloc) {
    int p = blockIdx.x;
    if (p >= P) return;
    int e = ids[p] - e0;
    bool local = e >= 0 && e < eloc;
    __syncthreads();  // every thread has read ids[p] before thread 0 rewrites it
    if (!local)
        for (int c = threadIdx.x; c < H; c += blockDim.x) down[(size_t)p * H + c] = 0.f;
    if (threadIdx.x == 0) {
        ids[p] = local ? e : -1;
        if (!local) wts[p] = 0.f;
    }
}
// dst[r, :] = src[idx[r], :]
extern "C" __global__ void gather_rows(const float* src, int lds, const int* idx, float* dst, int ldd, int cols) {
    int r = blockIdx.x;
    const float* s = src + (size_t)idx[r] * lds;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[(size_t)r * ldd + c] = s[c];
}
// out[t, :] = table[ids[t], :] as f32 (zeros outside [0, V)).
extern "C" __global__ void embed_f32(const int* ids, const u16* table, int V, int D, float* out, int ldo) {
    int t = blockIdx.x;
    int id = ids[t];
    for (int c = threadIdx.x; c < D; c += blockDim.x)
        out[(size_t)t * ldo + c] = (id >= 0 && id < V) ? bf2f(table[(size_t)id * D + c]) : 0.f;
}

// RMSNorm (the CPU's: mean of squares, 1/sqrt(ms + eps), x * inv * w); in place allowed.
extern "C" __global__ void rmsnorm_f32(const float* x, int ldx, const float* w, float* y, int ldy, int D, float eps) {
    __shared__ float sh[32];
    const float* xr = x + (size_t)blockIdx.x * ldx;
    float* yr = y + (size_t)blockIdx.x * ldy;
    float ss = 0.f;
    for (int c = threadIdx.x; c < D; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, sh) / (float)D;
    float inv = 1.0f / sqrtf(ss + eps);
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) yr[c] = xr[c] * inv * w[c];
}

// Rotary embedding in place on `heads` vectors of token t at x + t*ld_tok + h*ld_head + offset,
// cos/sin [T, dim/2] from the host (the CPU's own tables).
extern "C" __global__ void rope_f32(float* x, int heads, int ld_tok, int ld_head, int offset, int dim,
                                    const float* cosb, const float* sinb, int interleaved) {
    int t = blockIdx.x, half = dim / 2;
    const float* c = cosb + (size_t)t * half;
    const float* s = sinb + (size_t)t * half;
    for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        float* v = x + (size_t)t * ld_tok + (size_t)h * ld_head + offset;
        int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c[i] - x1 * s[i];
        v[b] = x1 * c[i] + x0 * s[i];
    }
}

// ---------------------------------------------------------------------------------------
// MLA, absorbed form. q [T, H, nope+rd] (this rank's H heads); kvb bf16 [H*(nope+vd), rank]
// (W_UK rows then W_UV rows per head). qcat [T, H, rank+rd] = (W_UK^T q_nope, q_rope).
extern "C" __global__ void mla_absorb_q(const float* q, const u16* kvb, float* qcat, int H, int nope, int rd, int vd, int rank) {
    int t = blockIdx.x, h = blockIdx.y;
    const float* qh = q + ((size_t)t * H + h) * (nope + rd);
    float* o = qcat + ((size_t)t * H + h) * (rank + rd);
    const u16* wk = kvb + (size_t)h * (nope + vd) * rank;
    for (int r = threadIdx.x; r < rank; r += blockDim.x) {
        float s = 0.f;
        for (int d = 0; d < nope; d++) s = fmaf(qh[d], bf2f(wk[(size_t)d * rank + r]), s);
        o[r] = s;
    }
    for (int d = threadIdx.x; d < rd; d += blockDim.x) o[rank + d] = qh[nope + d];
}
// out [T, H*vd]: out[t, h, d] = sum_r W_UV[h][d, r] olat[t, h, r].
extern "C" __global__ void mla_absorb_v(const float* olat, const u16* kvb, float* out, int H, int nope, int vd, int rank) {
    int t = blockIdx.x, h = blockIdx.y;
    const float* ol = olat + ((size_t)t * H + h) * rank;
    const u16* wv = kvb + ((size_t)h * (nope + vd) + nope) * rank;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int d = warp; d < vd; d += nw) {
        float s = 0.f;
        for (int r = lane; r < rank; r += 32) s = fmaf(bf2f(wv[(size_t)d * rank + r]), ol[r], s);
        s = warp_sum(s);
        if (lane == 0) out[(size_t)t * H * vd + (size_t)h * vd + d] = s;
    }
}

// ---------------------------------------------------------------------------------------
// Attention over (cache rows, extra pool rows, own pass rows) for query token t, head h.
// meta i32 [T, 8]: 0 cache base row, 1 cache length, 2 first own row of the segment,
// 3 own index in the segment, 4 mode (0 causal, 1 tree mask), 5 extra count,
// 6 offset into `extras`, 7 segment length. mask u64 [T]: tree ancestors (bit i = own row i).
// K rows: row r of a source at base + r*ld + kh*khs; V likewise (MLA: V = K's first dv floats).
// One block per (t, h); scores [T*H, max_keys] scratch.
extern "C" __global__ void attention_f32(const float* q, int ldq_tok, int ldq_head, int dk, int H, int group,
                                         const float* ck, const float* cv, int ldc,
                                         const float* pk, const float* pv, int ldp,
                                         const float* ok, const float* ov, int ldo,
                                         int khs, int dv, const int* meta, const u64* mask, const int* extras,
                                         float scale, float* scores, int max_keys, float* out, int ldout_tok, int ldout_head) {
    __shared__ float sh[32];
    int t = blockIdx.x, h = blockIdx.y;
    const int* m = meta + (size_t)t * 8;
    int cbase = m[0], clen = m[1], own0 = m[2], local = m[3], tree = m[4], nex = m[5], exoff = m[6], seglen = m[7];
    int nown = tree ? seglen : local + 1;
    int n = clen + nex + nown;
    if (n > max_keys) n = max_keys;
    u64 bits = mask[t];
    int kh = h / group;
    const float* qh = q + (size_t)t * ldq_tok + (size_t)h * ldq_head;
    float* sc = scores + ((size_t)t * H + h) * max_keys;
    float mx = NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float* kr;
        bool ok_key = true;
        if (j < clen) kr = ck + (size_t)(cbase + j) * ldc;
        else if (j < clen + nex) kr = pk + (size_t)extras[exoff + j - clen] * ldp;
        else {
            int i = j - clen - nex;
            kr = ok + (size_t)(own0 + i) * ldo;
            if (tree) ok_key = (i < 64) && ((bits >> i) & 1ull);
        }
        float s = NEG_INF;
        if (ok_key) {
            kr += (size_t)kh * khs;
            float d = 0.f;
            for (int c = 0; c < dk; c++) d = fmaf(qh[c], kr[c], d);
            s = d * scale;
        }
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, sh);
    float sum = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float e = (sc[j] == NEG_INF) ? 0.f : expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, sh);
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) sc[j] = sc[j] / sum;
    __syncthreads();
    float* o = out + (size_t)t * ldout_tok + (size_t)h * ldout_head;
    for (int d = threadIdx.x; d < dv; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < n; j++) {
            float p = sc[j];
            if (p == 0.f) continue;
            const float* vr;
            if (j < clen) vr = cv + (size_t)(cbase + j) * ldc;
            else if (j < clen + nex) vr = pv + (size_t)extras[exoff + j - clen] * ldp;
            else vr = ov + (size_t)(own0 + j - clen - nex) * ldo;
            acc = fmaf(p, vr[(size_t)kh * khs + d], acc);
        }
        o[d] = acc;
    }
}

// ---------------------------------------------------------------------------------------
// MoE router (the CPU's route(): sigmoid or softmax scores, + e_score_correction_bias for the
// choice, grouped top-k (group score = top-2 sum with a bias, else max), top-k with ties to the
// lower index, weights from the unbiased scores, renormalised, x routed_scaling_factor).
// One thread per token; work [T, 2E] floats.
extern "C" __global__ void moe_route_f32(const float* logits, const float* bias, int T, int E, int K, int ng, int tkg,
                                         int sigmoid, int norm, float rs, float* work, int* ids, float* wts) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float* lg = logits + (size_t)t * E;
    float* sc = work + (size_t)t * 2 * E;
    float* ch = sc + E;
    if (sigmoid) {
        for (int e = 0; e < E; e++) sc[e] = 1.0f / (1.0f + expf(-lg[e]));
    } else {
        float mx = NEG_INF;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, lg[e]);
        float s = 0.f;
        for (int e = 0; e < E; e++) { sc[e] = expf(lg[e] - mx); s += sc[e]; }
        for (int e = 0; e < E; e++) sc[e] = sc[e] / s;
    }
    for (int e = 0; e < E; e++) ch[e] = bias ? sc[e] + bias[e] : sc[e];
    if (ng > 1) {
        int per = E / ng;
        u64 keep = 0;  // ng <= 64
        for (int pick = 0; pick < tkg; pick++) {
            int best = -1;
            float bv = 0.f;
            for (int g = 0; g < ng; g++) {
                if ((keep >> g) & 1ull) continue;
                float gs;
                const float* grp = ch + g * per;
                if (bias) {
                    int i1 = 0;
                    for (int i = 1; i < per; i++) if (grp[i] > grp[i1]) i1 = i;
                    int i2 = -1;
                    for (int i = 0; i < per; i++) if (i != i1 && (i2 < 0 || grp[i] > grp[i2])) i2 = i;
                    gs = 0.f + grp[i1];
                    if (i2 >= 0) gs = gs + grp[i2];
                } else {
                    gs = NEG_INF;
                    for (int i = 0; i < per; i++) gs = fmaxf(gs, grp[i]);
                }
                if (best < 0 || gs > bv) { best = g; bv = gs; }
            }
            if (best >= 0) keep |= 1ull << best;
        }
        for (int g = 0; g < ng; g++)
            if (!((keep >> g) & 1ull))
                for (int i = 0; i < per; i++) ch[g * per + i] = NEG_INF;
    }
    int* id = ids + (size_t)t * K;
    float* wt = wts + (size_t)t * K;
    for (int pick = 0; pick < K; pick++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool used = false;
            for (int q = 0; q < pick; q++) used |= (id[q] == e);
            if (used) continue;
            if (best < 0 || ch[e] > ch[best]) best = e;
        }
        id[pick] = best;
        wt[pick] = sc[best];
    }
    if (K > 1 && norm) {
        float s = 0.f;
        for (int q = 0; q < K; q++) s += wt[q];
        s += 1e-20f;
        for (int q = 0; q < K; q++) wt[q] = wt[q] / s;
    }
    for (int q = 0; q < K; q++) wt[q] = wt[q] * rs;
}

// out[t, c] = sum over slots (in order) of wts[t, slot] * y[t*K + slot, c].
extern "C" __global__ void moe_combine_f32(const float* y, const float* wts, float* out, int K, int Hd) {
    int t = blockIdx.x;
    for (int c = threadIdx.x; c < Hd; c += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < K; s++) o = o + wts[(size_t)t * K + s] * y[((size_t)t * K + s) * Hd + c];
        out[(size_t)t * Hd + c] = o;
    }
}
