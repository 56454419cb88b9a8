// tree_verify.cu: greedy verification of a draft tree. Per request b, nodes 0..N-1 in an order that
// keeps parents before children, node 0 the root (the last committed token); parent[b, 0] = -1.
// target[b, i] = the target's argmax at node i (its prediction for the token after node i).
// Walk from the root: among the children of the current node (increasing index) accept the first
// whose token equals target[cur]; stop when none does. Outputs (unused entries -1):
//   accept_len[b] = accepted draft tokens + 1 (the bonus token), in 1..=depth+1;
//   accept_nodes[b, 0..accept_len-1) = accepted node indices; out_tokens[b, 0..accept_len) =
//   accepted tokens then the bonus token target[last accepted node]. One thread per request.
#include "kbench_common.cuh"

extern "C" __global__ void tree_verify_greedy(const int* __restrict__ cand, const int* __restrict__ parent,
                                              const int* __restrict__ target, int B, int N,
                                              int* __restrict__ accept_len, int* __restrict__ accept_nodes,
                                              int* __restrict__ out_tokens) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const int* c = cand + (size_t)b * N;
    const int* par = parent + (size_t)b * N;
    const int* tg = target + (size_t)b * N;
    int* an = accept_nodes + (size_t)b * N;
    int* ot = out_tokens + (size_t)b * N;
    for (int i = 0; i < N; i++) { an[i] = -1; ot[i] = -1; }
    int cur = 0, n = 0;
    while (true) {
        const int want = tg[cur];
        int next = -1;
        for (int i = cur + 1; i < N; i++)
            if (par[i] == cur && c[i] == want) { next = i; break; }
        if (next < 0) break;
        an[n] = next;
        ot[n] = c[next];
        n++;
        cur = next;
    }
    ot[n] = tg[cur];
    accept_len[b] = n + 1;
}
