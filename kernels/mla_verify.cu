// mla_verify.cu: tree-masked MLA attention for target verification: several query tokens per
// request (the draft tree), each seeing the whole prefix plus the tree tokens its u64 mask row
// selects (itself and its ancestors). Combine with mla_combine (mla_decode.cu). See kbench_mla.cuh.
#include "kbench_mla.cuh"

extern "C" __global__ void __launch_bounds__(256, 1) mla_verify_bt32(MLA_ARGS) {
    mla_attn_body<32, 2, true>(MLA_PASS);
}
extern "C" __global__ void __launch_bounds__(256, 1) mla_verify_bt16(MLA_ARGS) {
    mla_attn_body<16, 1, true>(MLA_PASS);
}
