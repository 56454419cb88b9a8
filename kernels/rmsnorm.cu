// rmsnorm.cu: y = x * rsqrt(mean(x^2) + eps) * w, bf16 in/out, f32 math; one block per row.
// With res_in: h = bf16(x + res_in) is written to res_out (the residual stream) and normalised.
// D % 8 == 0, rows 16-byte aligned. Block: 256 threads.
#include "kbench_common.cuh"

extern "C" __global__ void rmsnorm(const bf16* x, int ldx, const bf16* res_in,
                                   bf16* res_out, int ldr, const bf16* __restrict__ w,
                                   bf16* __restrict__ y, int ldy, int D, float eps) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)row * ldx);
    const uint4* rr = res_in ? reinterpret_cast<const uint4*>(res_in + (size_t)row * ldr) : nullptr;
    uint4* ro = res_out ? reinterpret_cast<uint4*>(res_out + (size_t)row * ldr) : nullptr;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < D / 8; c += blockDim.x) {
        uint4 v = xr[c];
        if (rr) {
            const uint4 r = rr[c];
            u32* pv = reinterpret_cast<u32*>(&v);
            const u32* pr = reinterpret_cast<const u32*>(&r);
#pragma unroll
            for (int i = 0; i < 4; i++) pv[i] = pack_bf2(bf_lo(pv[i]) + bf_lo(pr[i]), bf_hi(pv[i]) + bf_hi(pr[i]));
            if (ro) ro[c] = v;
        }
        const u32* pv = reinterpret_cast<const u32*>(&v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float a = bf_lo(pv[i]), b = bf_hi(pv[i]);
            ss += a * a + b * b;
        }
    }
    const float tot = block_sum(ss, red);
    const float inv = rsqrtf(tot / (float)D + eps);
    const uint4* wr = reinterpret_cast<const uint4*>(w);
    uint4* yr = reinterpret_cast<uint4*>(y + (size_t)row * ldy);
    for (int c = threadIdx.x; c < D / 8; c += blockDim.x) {
        uint4 v;
        if (rr && ro) {
            v = ro[c];  // written above by this same thread (safe when res_out aliases x or res_in)
        } else {
            v = xr[c];
            if (rr) {
                const uint4 r = rr[c];
                u32* pv = reinterpret_cast<u32*>(&v);
                const u32* pr = reinterpret_cast<const u32*>(&r);
#pragma unroll
                for (int i = 0; i < 4; i++)
                    pv[i] = pack_bf2(bf_lo(pv[i]) + bf_lo(pr[i]), bf_hi(pv[i]) + bf_hi(pr[i]));
            }
        }
        const uint4 ww = wr[c];
        const u32* pv = reinterpret_cast<const u32*>(&v);
        const u32* pw = reinterpret_cast<const u32*>(&ww);
        uint4 o;
        u32* po = reinterpret_cast<u32*>(&o);
#pragma unroll
        for (int i = 0; i < 4; i++)
            po[i] = pack_bf2(bf_lo(pv[i]) * inv * bf_lo(pw[i]), bf_hi(pv[i]) * inv * bf_hi(pw[i]));
        yr[c] = o;
    }
}
