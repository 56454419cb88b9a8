// mla_decode.cu: MLA decode attention (one query token per request, absorbed form) over the
// paged latent cache, flash-decoding splits + combine, and the cache store. See kbench_mla.cuh.
#include "kbench_mla.cuh"

extern "C" __global__ void __launch_bounds__(256, 1) mla_decode_bt32(MLA_ARGS) {
    mla_attn_body<32, 2, false>(MLA_PASS);
}
// smaller shared-memory footprint (93,440 B) for GPUs with < 150 KB per block (e.g. sm_120)
extern "C" __global__ void __launch_bounds__(256, 1) mla_decode_bt16(MLA_ARGS) {
    mla_attn_body<16, 1, false>(MLA_PASS);
}
extern "C" __global__ void __launch_bounds__(128) mla_combine(const float* __restrict__ o_part,
                                                                const float* __restrict__ ml, int splits, int R,
                                                                bf16* __restrict__ out, int ld_out) {
    mla_combine_body(o_part, ml, splits, R, out, ld_out);
}
// cache[slot[i]] = kv[i] (576 bf16 per row: normalised ckv | roped k_pe). Grid rows, block 72.
extern "C" __global__ void mla_kv_store(const bf16* __restrict__ kv, int ld_kv, const int* __restrict__ slots,
                                        bf16* __restrict__ cache) {
    const int i = blockIdx.x;
    const uint4* src = reinterpret_cast<const uint4*>(kv + (size_t)i * ld_kv);
    uint4* dst = reinterpret_cast<uint4*>(cache + (size_t)slots[i] * MLA_D);
    for (int c = threadIdx.x; c < MLA_D / 8; c += blockDim.x) dst[c] = src[c];
}
