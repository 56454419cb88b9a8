//! Kernel sources, embedded so the binary runs from any directory.

/// One `.cu` translation unit (compiled on its own by NVRTC).
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    pub name: &'static str,
    pub source: &'static str,
}

macro_rules! kfile {
    ($name:literal) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../kernels/", $name)),
        }
    };
}

/// In-memory headers handed to NVRTC (the `.cu` files `#include "..."` them).
pub const HEADERS: &[(&str, &str)] = &[
    (
        "kbench_common.cuh",
        include_str!("../../../kernels/kbench_common.cuh"),
    ),
    (
        "kbench_wmat.cuh",
        include_str!("../../../kernels/kbench_wmat.cuh"),
    ),
    (
        "kbench_mla.cuh",
        include_str!("../../../kernels/kbench_mla.cuh"),
    ),
];

pub const INT4_MATMUL: KernelFile = kfile!("int4_matmul.cu");
pub const BF16_MATMUL: KernelFile = kfile!("bf16_matmul.cu");
pub const FUSED_MOE: KernelFile = kfile!("fused_moe.cu");
pub const MLA_DECODE: KernelFile = kfile!("mla_decode.cu");
pub const MLA_VERIFY: KernelFile = kfile!("mla_verify.cu");
pub const RMSNORM: KernelFile = kfile!("rmsnorm.cu");
pub const ROPE: KernelFile = kfile!("rope.cu");
pub const SWIGLU: KernelFile = kfile!("swiglu.cu");
pub const EMBEDDING: KernelFile = kfile!("embedding.cu");
pub const TOPK: KernelFile = kfile!("topk.cu");
pub const TREE_VERIFY: KernelFile = kfile!("tree_verify.cu");
pub const SAMPLING: KernelFile = kfile!("sampling.cu");

/// Every kernel file, in a stable order.
pub const ALL: &[KernelFile] = &[
    INT4_MATMUL,
    BF16_MATMUL,
    FUSED_MOE,
    MLA_DECODE,
    MLA_VERIFY,
    RMSNORM,
    ROPE,
    SWIGLU,
    EMBEDDING,
    TOPK,
    TREE_VERIFY,
    SAMPLING,
];
