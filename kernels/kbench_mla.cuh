// kbench_mla.cuh: MLA attention over the latent KV cache in the absorbed form (DeepSeek-V3 / Kimi-K2).
//
// Per request b, query row rr (= qi * H + h: query token qi, head h) and cache token s:
//   score = (q_lat[rr] . ckv[s] + q_rope[rr] . k_rope[s]) * softmax_scale      (576-dim dot)
//   out_lat[rr] = sum_s softmax(score)[s] * ckv[s]                              (512 dims)
// q bf16 [B, R, 576] (R = q_len * H), cache bf16 [pages, page_size, 576] (ckv 512 | k_rope 64),
// block_table int32 [B, max_pages], prefix_len int32 [B]: cache tokens before the query tokens;
// the query tokens themselves are cache tokens prefix .. prefix + q_len - 1 (stored beforehand).
// Visibility: token s < prefix always; s = prefix + j iff bit j of mask[b, qi] (u64), or, with
// mask == null, iff j <= qi (causal chain; decode is q_len = 1).
// Flash-decoding: grid (B, ceil(R / 64), splits); each block computes 64 rows over one split of
// the request's tokens with mma.sync (S = Q K^T: 64 x BT x 576; O += P V: 64 x 512 x BT), online
// softmax in the log2 domain, and writes unnormalised partials o_part [B, splits, R, 512] f32 and
// ml [B, splits, R, 2] (running max, sum); mla_combine merges the splits (fixed order).
// Block: 256 threads = 8 warps; warp w owns rows (w & 3) * 16 .. +16 and dims (w >> 2) * 256 .. +256.
// Dynamic shared memory: (64 + STAGES * BT) * 584 * 2 bytes (BT 32, STAGES 2: 149,504 B).
#pragma once
#include "kbench_common.cuh"

#define MLA_D 576
#define MLA_DV 512
#define MLA_STR 584  // padded smem row (292 words, = 4 mod 32)
#define MLA_ROWS 64

template <int BT, int STAGES, bool MASKED>
__device__ __forceinline__ void mla_attn_body(const bf16* __restrict__ q, const bf16* __restrict__ cache,
                                              const int* __restrict__ block_table, int max_pages,
                                              const int* __restrict__ prefix_len, const u64* __restrict__ mask,
                                              int q_len, int H, int page_size, float scale_log2,
                                              float* __restrict__ o_part, float* __restrict__ ml) {
    extern __shared__ __align__(16) unsigned char mla_sh[];
    bf16* Qs = reinterpret_cast<bf16*>(mla_sh);
    bf16* KVs = Qs + MLA_ROWS * MLA_STR;
    const int b = blockIdx.x, chunk = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int R = q_len * H;
    const int row0 = chunk * MLA_ROWS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int mt = warp & 3, dh = warp >> 2;
    const int prefix = prefix_len[b];
    const int kv_len = prefix + q_len;
    // this split's token range (multiples of BT)
    const int per = ((kv_len + splits - 1) / splits + BT - 1) / BT * BT;
    const int t_beg = min(kv_len, split * per), t_end = min(kv_len, t_beg + per);
    const int ntiles = (t_end - t_beg + BT - 1) / BT;
    const bf16* qb = q + (size_t)b * R * MLA_D;
    const int* bt = block_table + (size_t)b * max_pages;

    // Q rows -> smem (zero rows past R)
    for (int p = tid; p < MLA_ROWS * (MLA_D / 8); p += blockDim.x) {
        const int r = p / (MLA_D / 8), c = p % (MLA_D / 8);
        const bool ok = row0 + r < R;
        cp_async16(Qs + r * MLA_STR + c * 8, ok ? (const void*)(qb + (size_t)(row0 + r) * MLA_D + c * 8) : (const void*)q, ok);
    }
    cp_async_commit();

    auto load_tile = [&](int stage, int tile) {
        bf16* dst = KVs + stage * BT * MLA_STR;
        const int ts = t_beg + tile * BT;
        for (int p = tid; p < BT * (MLA_D / 8); p += blockDim.x) {
            const int r = p / (MLA_D / 8), c = p % (MLA_D / 8);
            const int tok = ts + r;
            const bool ok = tok < t_end;
            const bf16* src = cache;
            if (ok) {
                const int page = bt[tok / page_size];
                src = cache + ((size_t)page * page_size + tok % page_size) * MLA_D + c * 8;
            }
            cp_async16(dst + r * MLA_STR + c * 8, src, ok);
        }
    };

    // per-thread rows: g and g + 8 of m-tile mt
    const int rA = row0 + mt * 16 + g, rB = rA + 8;
    const int qiA = rA / H, qiB = rB / H;
    u64 mA = 0, mB = 0;
    if (MASKED) {
        if (rA < R) mA = mask[(size_t)b * q_len + qiA];
        if (rB < R) mB = mask[(size_t)b * q_len + qiB];
    }

    float o[32][4];
#pragma unroll
    for (int i = 0; i < 32; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float mxA = -KB_INF, mxB = -KB_INF, lA = 0.0f, lB = 0.0f;

    if (STAGES > 1) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < ntiles) load_tile(s, s);
            cp_async_commit();
        }
    }
    for (int it = 0; it < ntiles; it++) {
        if (STAGES > 1) {
            cp_async_wait<(STAGES > 1 ? STAGES - 2 : 0)>();
            __syncthreads();
            if (it + STAGES - 1 < ntiles) load_tile((it + STAGES - 1) % STAGES, it + STAGES - 1);
            cp_async_commit();
        } else {
            __syncthreads();
            load_tile(0, it);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
        }
        const bf16* kv = KVs + (it % STAGES) * BT * MLA_STR;
        const int ts = t_beg + it * BT;

        // S = Q K^T for this warp's 16 rows x BT tokens
        float s[BT / 8][4];
#pragma unroll
        for (int j = 0; j < BT / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        const bf16* qa = Qs + (mt * 16 + g) * MLA_STR + 2 * t;
#pragma unroll 4
        for (int kk = 0; kk < MLA_D / 16; kk++) {
            u32 a[4];
            a[0] = *reinterpret_cast<const u32*>(qa + kk * 16);
            a[1] = *reinterpret_cast<const u32*>(qa + 8 * MLA_STR + kk * 16);
            a[2] = *reinterpret_cast<const u32*>(qa + kk * 16 + 8);
            a[3] = *reinterpret_cast<const u32*>(qa + 8 * MLA_STR + kk * 16 + 8);
#pragma unroll
            for (int j = 0; j < BT / 8; j++) {
                const bf16* kb = kv + (j * 8 + g) * MLA_STR + kk * 16 + 2 * t;
                mma_bf16_16816(s[j], a, *reinterpret_cast<const u32*>(kb), *reinterpret_cast<const u32*>(kb + 8));
            }
        }
        // mask, scale, online softmax (rows A = g, B = g + 8; a row spans the 4 threads of a quad)
        float tmA = -KB_INF, tmB = -KB_INF;
#pragma unroll
        for (int j = 0; j < BT / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int tok = ts + j * 8 + 2 * t + e;
                bool vA = tok < t_end && rA < R, vB = tok < t_end && rB < R;
                if (tok >= prefix) {
                    const int jj = tok - prefix;
                    if (MASKED) {
                        vA = vA && ((mA >> jj) & 1ull);
                        vB = vB && ((mB >> jj) & 1ull);
                    } else {
                        vA = vA && jj <= qiA;
                        vB = vB && jj <= qiB;
                    }
                }
                s[j][e] = vA ? s[j][e] * scale_log2 : -KB_INF;
                s[j][2 + e] = vB ? s[j][2 + e] * scale_log2 : -KB_INF;
                tmA = fmaxf(tmA, s[j][e]);
                tmB = fmaxf(tmB, s[j][2 + e]);
            }
        tmA = fmaxf(tmA, __shfl_xor_sync(0xffffffffu, tmA, 1));
        tmA = fmaxf(tmA, __shfl_xor_sync(0xffffffffu, tmA, 2));
        tmB = fmaxf(tmB, __shfl_xor_sync(0xffffffffu, tmB, 1));
        tmB = fmaxf(tmB, __shfl_xor_sync(0xffffffffu, tmB, 2));
        const float nA = fmaxf(mxA, tmA), nB = fmaxf(mxB, tmB);
        const float uA = nA == -KB_INF ? 0.0f : nA, uB = nB == -KB_INF ? 0.0f : nB;
        const float alA = exp2f(mxA - uA), alB = exp2f(mxB - uB);
        mxA = nA;
        mxB = nB;
        lA *= alA;
        lB *= alB;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            o[i][0] *= alA; o[i][1] *= alA;
            o[i][2] *= alB; o[i][3] *= alB;
        }
        u32 pa[BT / 16][4];
#pragma unroll
        for (int j = 0; j < BT / 8; j++) {
            const float p0 = exp2f(s[j][0] - uA), p1 = exp2f(s[j][1] - uA);
            const float p2 = exp2f(s[j][2] - uB), p3 = exp2f(s[j][3] - uB);
            lA += p0 + p1;
            lB += p2 + p3;
            pa[j >> 1][(j & 1) * 2 + 0] = pack_bf2(p0, p1);
            pa[j >> 1][(j & 1) * 2 + 1] = pack_bf2(p2, p3);
        }
        // O += P V  (V = ckv, the first 512 dims of each cache row)
#pragma unroll
        for (int ks = 0; ks < BT / 16; ks++) {
            const int mi = lane >> 3, rr = lane & 7;
            const bf16* vb = kv + (ks * 16 + (mi & 1) * 8 + rr) * MLA_STR + dh * 256 + (mi >> 1) * 8;
#pragma unroll
            for (int np = 0; np < 16; np++) {
                u32 bfr[4];
                ldmatrix_x4_trans(bfr, vb + np * 16);
                mma_bf16_16816(o[2 * np], pa[ks], bfr[0], bfr[1]);
                mma_bf16_16816(o[2 * np + 1], pa[ks], bfr[2], bfr[3]);
            }
        }
    }
    cp_async_wait<0>();
    lA += __shfl_xor_sync(0xffffffffu, lA, 1);
    lA += __shfl_xor_sync(0xffffffffu, lA, 2);
    lB += __shfl_xor_sync(0xffffffffu, lB, 1);
    lB += __shfl_xor_sync(0xffffffffu, lB, 2);
    const size_t base = ((size_t)b * splits + split) * R;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int d = dh * 256 + i * 8 + 2 * t;
        if (rA < R) {
            float* op = o_part + (base + rA) * MLA_DV + d;
            op[0] = o[i][0];
            op[1] = o[i][1];
        }
        if (rB < R) {
            float* op = o_part + (base + rB) * MLA_DV + d;
            op[0] = o[i][2];
            op[1] = o[i][3];
        }
    }
    if (dh == 0 && t == 0) {
        if (rA < R) { ml[(base + rA) * 2] = mxA; ml[(base + rA) * 2 + 1] = lA; }
        if (rB < R) { ml[(base + rB) * 2] = mxB; ml[(base + rB) * 2 + 1] = lB; }
    }
}

#define MLA_ARGS                                                                                       \
    const bf16 *__restrict__ q, const bf16 *__restrict__ cache, const int *__restrict__ block_table,     \
        int max_pages, const int *__restrict__ prefix_len, const u64 *__restrict__ mask, int q_len, int H, \
        int page_size, float scale_log2, float *__restrict__ o_part, float *__restrict__ ml
#define MLA_PASS q, cache, block_table, max_pages, prefix_len, mask, q_len, H, page_size, scale_log2, o_part, ml

// out[b, rr, :] = sum_s w_s o_part[b, s, rr, :] / sum_s w_s l_s, w_s = 2^(m_s - max m). Grid (B, R),
// block 128 (4 dims each). Rows that see no token get zeros.
__device__ __forceinline__ void mla_combine_body(const float* __restrict__ o_part, const float* __restrict__ ml,
                                                 int splits, int R, bf16* __restrict__ out, int ld_out) {
    const int b = blockIdx.x, rr = blockIdx.y;
    float M = -KB_INF;
    for (int s = 0; s < splits; s++) M = fmaxf(M, ml[(((size_t)b * splits + s) * R + rr) * 2]);
    float den = 0.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < splits; s++) {
        const size_t i = ((size_t)b * splits + s) * R + rr;
        const float m = ml[i * 2];
        const float w = (m == -KB_INF) ? 0.0f : exp2f(m - M);
        den += w * ml[i * 2 + 1];
        if (w != 0.0f) {
#pragma unroll
            for (int c = 0; c < 4; c++) acc[c] += w * o_part[i * MLA_DV + threadIdx.x * 4 + c];
        }
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    bf16* op = out + ((size_t)b * R + rr) * ld_out + threadIdx.x * 4;
#pragma unroll
    for (int c = 0; c < 4; c++) op[c] = f2bf(acc[c] * inv);
}
