// int4_matmul.cu: W4A16 matmul, Y[m, n] = sum_k X[m, k] * W[n, k] with
//   W[n, k] = (nibble(n, k) - 8) * S[n, k / 32]   (compressed-tensors pack-quantized, group 32)
// X bf16 [M, ldx]; Wq int32 [N, K/8] (8 nibbles per word along k, low nibble first);
// S bf16 [N, K/32]; Y bf16 or f32 [M, ldy]. f32 accumulation on tensor cores (mma.sync bf16).
// Decode (M <= 8) and verify (M up to 512, passes of 8*NT tokens) share one kernel family.
// Grid: x = ceil(N / 128) row blocks, y = k-splits (y > 1 writes f32 partials to ws[y][M][N],
// summed in a fixed order by w4a16_splitk_reduce). Block: 128 threads. K % 64 == 0.
#include "kbench_wmat.cuh"

template <int NT>
__device__ __forceinline__ void w4_body(const bf16* __restrict__ X, int ldx, const u32* __restrict__ Wq,
                                        const bf16* __restrict__ S, void* Y, int ldy, int y_f32,
                                        float* __restrict__ ws, int M, int N, int K, int chunks_per_split) {
    __shared__ __align__(16) bf16 xs[NT * 8 * WM_XSTRIDE];
    __shared__ const bf16* xrow[NT * 8];
    constexpr int RW = 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rowbase = (blockIdx.x * WM_WARPS + warp) * (RW * 16);
    const void* wrow[RW][2];
    const bf16* srow[RW][2];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = min(rowbase + r * 16 + h * 8 + g, N - 1);
            wrow[r][h] = Wq + (size_t)n * (K / 8);
            srow[r][h] = S + (size_t)n * (K / 32);
        }
    const int kbeg = blockIdx.y * chunks_per_split * WM_KC;
    const int kend = min(K, kbeg + chunks_per_split * WM_KC);
    for (int m0 = 0; m0 < M; m0 += NT * 8) {
        if (threadIdx.x < NT * 8)
            xrow[threadIdx.x] = (m0 + (int)threadIdx.x < M) ? X + (size_t)(m0 + threadIdx.x) * ldx : nullptr;
        float acc[RW][NT][4];
        wm_zero<RW, NT>(acc);
        wm_pass<true, RW, NT>(xs, xrow, wrow, srow, kbeg, kend, acc);
#pragma unroll
        for (int r = 0; r < RW; r++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int n = rowbase + r * 16 + g + (q >= 2 ? 8 : 0);
                    const int m = m0 + j * 8 + 2 * t + (q & 1);
                    if (n < N && m < M) {
                        const float v = acc[r][j][q];
                        if (gridDim.y > 1) ws[((size_t)blockIdx.y * M + m) * N + n] = v;
                        else if (y_f32) reinterpret_cast<float*>(Y)[(size_t)m * ldy + n] = v;
                        else reinterpret_cast<bf16*>(Y)[(size_t)m * ldy + n] = f2bf(v);
                    }
                }
    }
}

#define W4_ARGS                                                                                      \
    const bf16 *__restrict__ X, int ldx, const u32 *__restrict__ Wq, const bf16 *__restrict__ S, void *Y, \
        int ldy, int y_f32, float *__restrict__ ws, int M, int N, int K, int chunks_per_split
#define W4_PASS X, ldx, Wq, S, Y, ldy, y_f32, ws, M, N, K, chunks_per_split

extern "C" __global__ void __launch_bounds__(128) w4a16_matmul_nt1(W4_ARGS) { w4_body<1>(W4_PASS); }
extern "C" __global__ void __launch_bounds__(128) w4a16_matmul_nt2(W4_ARGS) { w4_body<2>(W4_PASS); }
extern "C" __global__ void __launch_bounds__(128) w4a16_matmul_nt4(W4_ARGS) { w4_body<4>(W4_PASS); }

// Y[m, n] = sum_s ws[s][m][n], in order s = 0, 1, ... (deterministic).
extern "C" __global__ void w4a16_splitk_reduce(const float* __restrict__ ws, int splits, int M, int N, void* Y,
                                                int ldy, int y_f32) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * N) return;
    const int m = (int)(i / N), n = (int)(i % N);
    float v = 0.0f;
    for (int s = 0; s < splits; s++) v += ws[(size_t)s * M * N + i];
    if (y_f32) reinterpret_cast<float*>(Y)[(size_t)m * ldy + n] = v;
    else reinterpret_cast<bf16*>(Y)[(size_t)m * ldy + n] = f2bf(v);
}
