// swiglu.cu: out[t, i] = silu(gu[t, i]) * gu[t, I + i]  (gate and up concatenated), bf16, f32 math.
// Grid (ceil(I / 256), T), block 256.
#include "kbench_common.cuh"

extern "C" __global__ void swiglu(const bf16* __restrict__ gu, int ld_in, bf16* __restrict__ out, int ld_out,
                                  int I) {
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= I) return;
    const bf16* r = gu + (size_t)t * ld_in;
    out[(size_t)t * ld_out + i] = f2bf(silu_f(bf2f(r[i])) * bf2f(r[I + i]));
}
