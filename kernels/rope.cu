// rope.cu: rotary embedding in place on bf16 rows, with YaRN (DeepSeek-V3 / Kimi-K2 rope_scaling).
// The host computes inv_freq[rot_dim/2] (YaRN-blended) and mscale; the kernel rotates
//   interleaved (GPT-J, SGLang's is_neox_style=False for DeepSeek): pairs (2i, 2i+1)
//   neox: pairs (i, i + rot_dim/2)
// by angle pos[t] * inv_freq[i], cos/sin multiplied by mscale.
// x[t * ld_tok + h * ld_head + offset + ...], t < T, h < heads. Grid T, block 128.
#include "kbench_common.cuh"

extern "C" __global__ void rope_yarn(bf16* __restrict__ x, int heads, int ld_tok, int ld_head, int offset,
                                     int rot_dim, const int* __restrict__ pos, const float* __restrict__ inv_freq,
                                     float mscale, int interleaved) {
    const int tok = blockIdx.x;
    const int half = rot_dim / 2;
    const float p = (float)pos[tok];
    for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        bf16* base = x + (size_t)tok * ld_tok + (size_t)h * ld_head + offset;
        const int i0 = interleaved ? 2 * i : i;
        const int i1 = interleaved ? 2 * i + 1 : i + half;
        float sn, cs;
        sincosf(p * inv_freq[i], &sn, &cs);
        cs *= mscale;
        sn *= mscale;
        const float a = bf2f(base[i0]), b = bf2f(base[i1]);
        base[i0] = f2bf(a * cs - b * sn);
        base[i1] = f2bf(b * cs + a * sn);
    }
}
