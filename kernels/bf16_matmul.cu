// bf16_matmul.cu: BF16 weights (attention projections, shared expert, router, lm_head, the
// absorbed MLA batched matmuls): Y[z][m, n] = sum_k X[z][m, k] * W[z][n, k], f32 accumulate.
// X bf16 [M, ldx] (+ z * sxz), W bf16 [N, ldw] (+ z * swz), Y bf16/f32 [M, ldy] (+ z * syz).
// Same weight-stationary tensor-core scheme as int4_matmul.cu (kbench_wmat.cuh).
// Grid: x = ceil(N / 128), y = k-splits (partials to ws[y][z][M][N]), z = batch. K % 32 == 0,
// ldx, ldw, sxz, swz multiples of 8 (16-byte rows).
#include "kbench_wmat.cuh"

template <int NT>
__device__ __forceinline__ void b16_body(const bf16* __restrict__ X, int ldx, long long sxz,
                                         const bf16* __restrict__ W, int ldw, long long swz, void* Y, int ldy,
                                         long long syz, int y_f32, float* __restrict__ ws, int M, int N, int K,
                                         int chunks_per_split) {
    __shared__ __align__(16) bf16 xs[NT * 8 * WM_XSTRIDE];
    __shared__ const bf16* xrow[NT * 8];
    constexpr int RW = 2;
    const int z = blockIdx.z;
    X += (size_t)z * sxz;
    W += (size_t)z * swz;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rowbase = (blockIdx.x * WM_WARPS + warp) * (RW * 16);
    const void* wrow[RW][2];
    const bf16* srow[RW][2];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = min(rowbase + r * 16 + h * 8 + g, N - 1);
            wrow[r][h] = W + (size_t)n * ldw;
            srow[r][h] = nullptr;
        }
    const int kbeg = blockIdx.y * chunks_per_split * WM_KC;
    const int kend = min(K, kbeg + chunks_per_split * WM_KC);
    for (int m0 = 0; m0 < M; m0 += NT * 8) {
        if (threadIdx.x < NT * 8)
            xrow[threadIdx.x] = (m0 + (int)threadIdx.x < M) ? X + (size_t)(m0 + threadIdx.x) * ldx : nullptr;
        float acc[RW][NT][4];
        wm_zero<RW, NT>(acc);
        wm_pass<false, RW, NT>(xs, xrow, wrow, srow, kbeg, kend, acc);
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
                        if (gridDim.y > 1)
                            ws[(((size_t)blockIdx.y * gridDim.z + z) * M + m) * N + n] = v;
                        else if (y_f32)
                            reinterpret_cast<float*>(Y)[(size_t)z * syz + (size_t)m * ldy + n] = v;
                        else
                            reinterpret_cast<bf16*>(Y)[(size_t)z * syz + (size_t)m * ldy + n] = f2bf(v);
                    }
                }
    }
}

#define B16_ARGS                                                                                        \
    const bf16 *__restrict__ X, int ldx, long long sxz, const bf16 *__restrict__ W, int ldw, long long swz, \
        void *Y, int ldy, long long syz, int y_f32, float *__restrict__ ws, int M, int N, int K,            \
        int chunks_per_split
#define B16_PASS X, ldx, sxz, W, ldw, swz, Y, ldy, syz, y_f32, ws, M, N, K, chunks_per_split

extern "C" __global__ void __launch_bounds__(128) bf16_matmul_nt1(B16_ARGS) { b16_body<1>(B16_PASS); }
extern "C" __global__ void __launch_bounds__(128) bf16_matmul_nt2(B16_ARGS) { b16_body<2>(B16_PASS); }
extern "C" __global__ void __launch_bounds__(128) bf16_matmul_nt4(B16_ARGS) { b16_body<4>(B16_PASS); }

// Y[z][m, n] = sum_s ws[s][z][m][n] (fixed order). Grid-stride over Z*M*N.
extern "C" __global__ void bf16_splitk_reduce(const float* __restrict__ ws, int splits, int Z, int M, int N,
                                               void* Y, int ldy, long long syz, int y_f32) {
    const size_t total = (size_t)Z * M * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int z = (int)(i / ((size_t)M * N));
        const size_t rem = i % ((size_t)M * N);
        const int m = (int)(rem / N), n = (int)(rem % N);
        float v = 0.0f;
        for (int s = 0; s < splits; s++) v += ws[(size_t)s * total + i];
        const size_t o = (size_t)z * syz + (size_t)m * ldy + n;
        if (y_f32) reinterpret_cast<float*>(Y)[o] = v;
        else reinterpret_cast<bf16*>(Y)[o] = f2bf(v);
    }
}
