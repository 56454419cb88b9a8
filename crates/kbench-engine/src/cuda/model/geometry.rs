//! The dimensions a GPU pass is laid out by: the target's (global, not per rank) and the
//! draft's.

use kbench_cuda::ops::MoeConfig;

use crate::cuda::ops::Route;

/// Target dimensions (global, not per rank).
#[derive(Debug, Clone)]
pub(crate) struct Geo {
    pub h: usize,
    pub layers: usize,
    pub heads: usize,
    pub nope: usize,
    pub rd: usize,
    pub vd: usize,
    pub kv_lora_rank: usize,
    pub q_lora: Option<usize>,
    pub vocab: usize,
    pub eps: f32,
    pub scale: f32,
    pub experts: usize,
    pub top_k: usize,
    pub moe_inter: usize,
    pub route: Option<Route>,
    /// Tuned kernels (bf16 activations into kbench-cuda's matmuls and fused MoE).
    pub tuned: bool,
    /// Tuned dense BF16 linears through cuBLAS when it loads.
    pub cublas: bool,
    /// kbench-cuda's router configuration over all experts (tuned MoE layers).
    pub moe_cfg: Option<MoeConfig>,
    pub capture: Vec<usize>,
    pub world: usize,
    pub max_batch: usize,
    pub max_ctx: usize,
    pub max_tokens: usize,
}

impl Geo {
    pub fn width(&self) -> usize {
        self.kv_lora_rank + self.rd
    }
    pub fn qd(&self) -> usize {
        self.nope + self.rd
    }
    pub fn hl(&self) -> usize {
        self.heads / self.world
    }
}

/// Draft geometry.
#[derive(Debug, Clone)]
pub(crate) struct DGeo {
    pub h: usize,
    pub ncap: usize,
    pub nh: usize,
    pub nkv: usize,
    pub hd: usize,
    pub inter: usize,
    pub dv: usize,
    pub eps: f32,
    pub max_cands: usize,
    pub max_extra: usize,
}

impl DGeo {
    pub(crate) fn kvw(&self) -> usize {
        self.nkv * self.hd
    }
}
