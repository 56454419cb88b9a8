// embedding.cu: out[t] = table[ids[t]] (bf16 rows, D % 8 == 0); ids out of [0, V) give zeros.
// Grid T, block 128.
#include "kbench_common.cuh"

extern "C" __global__ void embedding_gather(const int* __restrict__ ids, const bf16* __restrict__ table, int V,
                                            int D, bf16* __restrict__ out, int ld_out) {
    const int t = blockIdx.x;
    const int id = ids[t];
    uint4* dst = reinterpret_cast<uint4*>(out + (size_t)t * ld_out);
    const bool ok = id >= 0 && id < V;
    const uint4* src = reinterpret_cast<const uint4*>(table + (size_t)(ok ? id : 0) * D);
    for (int c = threadIdx.x; c < D / 8; c += blockDim.x) dst[c] = ok ? src[c] : make_uint4(0u, 0u, 0u, 0u);
}
