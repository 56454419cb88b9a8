// topk.cu: per-row top-k of f32 scores (drafting: the draft head's top-k; k = 1 is argmax).
// Order: larger value first, ties to the smaller index; NaN never selected.
// out_idx/out_val [rows, k]; out_prob (nullable) = softmax(row)[idx] over the whole row.
// k selection passes over the row (k is small: eagle_topk <= ~16). Grid rows, block 512.
#include "kbench_common.cuh"

extern "C" __global__ void topk_rows(const float* __restrict__ x, int ld, int V, int k, int* __restrict__ out_idx,
                                     float* __restrict__ out_val, float* __restrict__ out_prob) {
    __shared__ float rv[32];
    __shared__ int ri[32];
    __shared__ float red[32];
    const int row = blockIdx.x;
    const float* xr = x + (size_t)row * ld;
    float pv = KB_INF;
    int pi = -1;
    float mx = 0.0f, z = 1.0f;
    for (int j = 0; j < k; j++) {
        float bv = -KB_INF;
        int bi = -1;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float v = xr[i];
            const bool after = (v < pv) || (v == pv && i > pi);  // strictly after the previous pick
            if (after && kb_better(v, i, bv, bi)) { bv = v; bi = i; }
        }
        block_argmax(bv, bi, rv, ri);
        if (j == 0 && out_prob) {
            mx = bv;
            float s = 0.0f;
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                const float v = xr[i];
                if (v == v) s += expf(v - mx);
            }
            z = block_sum(s, red);
        }
        if (threadIdx.x == 0) {
            out_idx[(size_t)row * k + j] = bi;
            out_val[(size_t)row * k + j] = bv;
            if (out_prob) out_prob[(size_t)row * k + j] = bi >= 0 ? expf(bv - mx) / z : 0.0f;
        }
        pv = bv;
        pi = bi;
        if (bi < 0) pv = -KB_INF;
    }
}
