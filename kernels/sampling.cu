// sampling.cu: per-row sampling from f32 logits with temperature, top-k, top-p and a given uniform u.
// temperature <= 0: argmax (ties -> smallest index). Otherwise, with p_i = exp((x_i - max) / T):
//   top-k (0 < k < V): keep x_i >= the k-th largest value (ties at the threshold all kept);
//   top-p (p < 1): keep the largest values whose probability mass (over the kept set) reaches p:
//     the largest threshold tau with sum_{x_i >= tau} p_i >= p * sum p_i;
//   then the first index (vocabulary order) whose cumulative kept mass exceeds u * kept mass.
// Thresholds by bisection on order-preserving 32-bit keys (exact for top-k). Sums are block
// reductions in a fixed order: deterministic. Grid rows, block 1024.
#include "kbench_common.cuh"

__device__ __forceinline__ u32 ord_key(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

extern "C" __global__ void __launch_bounds__(1024) sample_rows(const float* __restrict__ logits, int ld, int V,
                                                               const float* __restrict__ temperature,
                                                               const int* __restrict__ top_k,
                                                               const float* __restrict__ top_p,
                                                               const float* __restrict__ uniform,
                                                               int* __restrict__ out) {
    __shared__ float red[32];
    __shared__ float rv[32];
    __shared__ int ri[32];
    __shared__ float scan[1024];
    __shared__ int found;
    const int row = blockIdx.x;
    const float* x = logits + (size_t)row * ld;
    const float T = temperature[row];
    float bv = -KB_INF;
    int bi = -1;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (kb_better(x[i], i, bv, bi)) { bv = x[i]; bi = i; }
    block_argmax(bv, bi, rv, ri);
    if (!(T > 0.0f)) {
        if (threadIdx.x == 0) out[row] = bi;
        return;
    }
    const float mx = bv, invT = 1.0f / T;
    const int k = top_k[row];
    u32 kmin = 0;
    if (k > 0 && k < V) {
        u32 cand = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const u32 tr = cand | (1u << bit);
            float c = 0.0f;
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                if (x[i] == x[i] && ord_key(x[i]) >= tr) c += 1.0f;
            if (block_sum(c, red) >= (float)k) cand = tr;
        }
        kmin = cand;
    }
    float z = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (x[i] == x[i] && ord_key(x[i]) >= kmin) z += expf((x[i] - mx) * invT);
    z = block_sum(z, red);
    const float p = top_p[row];
    u32 pmin = kmin;
    if (p < 1.0f) {
        u32 cand = 0;
        const float target = p * z;
        for (int bit = 31; bit >= 0; bit--) {
            const u32 tr = cand | (1u << bit);
            const u32 th = max(tr, kmin);
            float s = 0.0f;
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                if (x[i] == x[i] && ord_key(x[i]) >= th) s += expf((x[i] - mx) * invT);
            if (block_sum(s, red) >= target) cand = tr;
        }
        pmin = max(cand, kmin);
    }
    // contiguous chunk per thread, exclusive scan of chunk sums, then locate u * total
    const int chunk = (V + blockDim.x - 1) / blockDim.x;
    const int lo = threadIdx.x * chunk, hi = min(V, lo + chunk);
    float s = 0.0f;
    for (int i = lo; i < hi; i++)
        if (x[i] == x[i] && ord_key(x[i]) >= pmin) s += expf((x[i] - mx) * invT);
    scan[threadIdx.x] = s;
    if (threadIdx.x == 0) found = -1;
    __syncthreads();
    if (threadIdx.x == 0) {  // serial exclusive scan over 1024 partial sums (fixed order)
        float run = 0.0f;
        for (int i = 0; i < (int)blockDim.x; i++) { const float v = scan[i]; scan[i] = run; run += v; }
        red[0] = run;
    }
    __syncthreads();
    const float total = red[0];
    const float target = uniform[row] * total;
    float run = scan[threadIdx.x];
    if (s > 0.0f && target >= run && target < run + s) {
        for (int i = lo; i < hi; i++) {
            if (x[i] == x[i] && ord_key(x[i]) >= pmin) {
                run += expf((x[i] - mx) * invT);
                if (target < run) { atomicMax(&found, i); break; }
            }
        }
        if (found < 0) atomicMax(&found, -1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int r = found;
        if (r < 0) {  // u * total at or past the end by rounding: last kept token
            for (int i = V - 1; i >= 0; i--)
                if (x[i] == x[i] && ord_key(x[i]) >= pmin) { r = i; break; }
        }
        out[row] = r;
    }
}
