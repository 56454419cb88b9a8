//! Every size a generated model has, and the presets.

use serde::Serialize;

use crate::error::{EngineError, Result};

/// Every size a generated model has.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dims {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_head: usize,
    pub experts: usize,
    pub experts_per_tok: usize,
    pub shared_experts: usize,
    pub moe_inter: usize,
    pub inter: usize,
    pub vocab: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub first_k_dense: usize,
    pub draft_heads: usize,
    pub draft_kv_heads: usize,
    pub draft_head_dim: usize,
    pub draft_inter: usize,
    pub draft_vocab: usize,
    /// Relative size of what the target's layers add to the embedding.
    pub layer_gain: f32,
    /// Std of the target's logits (peakedness).
    pub logit_scale: f32,
}

impl Dims {
    pub fn tiny() -> Dims {
        Dims {
            hidden: 64,
            layers: 4,
            heads: 4,
            q_lora_rank: Some(32),
            kv_lora_rank: 32,
            nope: 16,
            rope: 8,
            v_head: 16,
            experts: 8,
            experts_per_tok: 2,
            shared_experts: 1,
            moe_inter: 32,
            inter: 96,
            vocab: 256,
            n_group: 2,
            topk_group: 1,
            first_k_dense: 1,
            draft_heads: 4,
            draft_kv_heads: 4,
            draft_head_dim: 16,
            draft_inter: 96,
            draft_vocab: 192,
            layer_gain: 0.04,
            logit_scale: 4.0,
        }
    }

    /// The smallest model kbench-cuda's tuned kernels take (hidden and moe_intermediate
    /// multiples of 64, grouped noaux_tc routing): the tuned CUDA path's test model.
    pub fn tuned_small() -> Dims {
        let mut d = Dims::tiny();
        d.hidden = 128;
        d.moe_inter = 64;
        d.inter = 128;
        d.q_lora_rank = Some(64);
        d.heads = 2;
        d.nope = 32;
        d.v_head = 32;
        d.experts = 16;
        d.experts_per_tok = 4;
        d.n_group = 4;
        d.topk_group = 2;
        d.layers = 4;
        d
    }

    pub fn kimi_slice(layers: usize) -> Dims {
        Dims {
            hidden: 7168,
            layers,
            heads: 64,
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            nope: 128,
            rope: 64,
            v_head: 128,
            experts: 384,
            experts_per_tok: 8,
            shared_experts: 1,
            moe_inter: 2048,
            inter: 18432,
            vocab: 163840,
            n_group: 1,
            topk_group: 1,
            first_k_dense: 1,
            draft_heads: 64,
            draft_kv_heads: 64,
            draft_head_dim: 128,
            draft_inter: 18432,
            draft_vocab: 32000,
            layer_gain: 0.04,
            logit_scale: 4.0,
        }
    }

    /// Target layers whose outputs the draft captures (SGLang's rule, clamped).
    pub fn capture_layers(&self) -> Vec<usize> {
        let n = self.layers;
        vec![1.min(n - 1), (n / 2).saturating_sub(1), n.saturating_sub(4)]
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::Invalid(m));
        if self.layers == 0 || self.hidden % 32 != 0 || self.moe_inter % 32 != 0 {
            return bad(format!(
                "hidden ({}) and moe_inter ({}) must be multiples of 32, layers >= 1",
                self.hidden, self.moe_inter
            ));
        }
        if self.experts % self.n_group != 0
            || self.topk_group > self.n_group
            || self.experts_per_tok > self.experts
        {
            return bad("router groups do not fit the experts".into());
        }
        if self.draft_vocab > self.vocab
            || self.draft_kv_heads == 0
            || self.draft_heads % self.draft_kv_heads != 0
        {
            return bad("draft vocabulary or heads do not fit".into());
        }
        if self.rope % 2 != 0 || self.draft_head_dim % 2 != 0 {
            return bad("rope dims must be even".into());
        }
        Ok(())
    }
}
