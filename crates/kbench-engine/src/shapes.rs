//! The shape of every checkpoint tensor, derived from the model's config once, for the
//! checkpoint writer (`init`), the CPU loaders (`target`, `draft`) and the GPU loader
//! (`cuda::weights`): a writer and a loader that read one definition cannot disagree.
//!
//! Matrices are `[out, in]`, as PyTorch's `nn.Linear` stores them (one row per output).

use kbench_core::arch::{DraftArch, ModelArch};

use crate::error::{EngineError, Result};
use crate::names::Proj;

/// A linear's `[out, in]`.
pub type Matrix = [usize; 2];

/// A gated feed-forward (dense MLP, routed expert, shared experts): gate and up are
/// `[inter, hidden]`, down is `[hidden, inter]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FfnShape {
    pub inter: usize,
    pub hidden: usize,
}

impl FfnShape {
    pub fn proj(&self, proj: Proj) -> Matrix {
        match proj {
            Proj::Gate | Proj::Up => [self.inter, self.hidden],
            Proj::Down => [self.hidden, self.inter],
        }
    }
}

/// compressed-tensors' INT4 tensors of an `[out, in]` linear: eight 4-bit values per
/// `int32` word along the input, one BF16 scale per `group` inputs.
pub fn int4_packed(m: Matrix) -> Matrix {
    [m[0], m[1] / 8]
}

pub fn int4_scales(m: Matrix, group: usize) -> Matrix {
    [m[0], m[1] / group]
}

/// A DeepSeek-V3 / Kimi-K2.5 target's tensors (MLA attention, MoE feed-forward).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetShapes {
    pub hidden: usize,
    pub vocab: usize,
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_head: usize,
    pub kv_lora_rank: usize,
    pub q_lora_rank: Option<usize>,
    pub dense: FfnShape,
    /// Present when the config has MoE layers.
    pub moe: Option<MoeShapes>,
    /// compressed-tensors' group size of the INT4 experts (32 where the config has none).
    pub group: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShapes {
    pub experts: usize,
    pub expert: FfnShape,
    /// `None` without shared experts.
    pub shared: Option<FfnShape>,
}

impl TargetShapes {
    pub fn new(arch: &ModelArch) -> Result<TargetShapes> {
        let mla = arch
            .mla
            .as_ref()
            .ok_or_else(|| EngineError::Unsupported("MLA dims missing".into()))?;
        let hidden = arch.hidden_size as usize;
        let moe = arch.moe.as_ref().map(|m| {
            let inter = m.moe_intermediate_size as usize;
            MoeShapes {
                experts: m.n_routed_experts as usize,
                expert: FfnShape { inter, hidden },
                shared: (m.n_shared_experts > 0).then(|| FfnShape {
                    inter: inter * m.n_shared_experts as usize,
                    hidden,
                }),
            }
        });
        Ok(TargetShapes {
            hidden,
            vocab: arch.vocab_size as usize,
            heads: arch.num_heads as usize,
            nope: mla.qk_nope_head_dim as usize,
            rope: mla.qk_rope_head_dim as usize,
            v_head: mla.v_head_dim as usize,
            kv_lora_rank: mla.kv_lora_rank as usize,
            q_lora_rank: mla.q_lora_rank.map(|r| r as usize),
            dense: FfnShape {
                inter: arch.intermediate_size as usize,
                hidden,
            },
            moe,
            group: arch
                .quant
                .as_ref()
                .map(|q| q.group_size as usize)
                .unwrap_or(32),
        })
    }

    /// The MoE dims, or the error a MoE layer without them gets.
    pub fn moe(&self) -> Result<MoeShapes> {
        self.moe
            .ok_or_else(|| EngineError::Unsupported("MoE dims missing".into()))
    }

    pub fn embed(&self) -> Matrix {
        [self.vocab, self.hidden]
    }
    pub fn lm_head(&self) -> Matrix {
        [self.vocab, self.hidden]
    }
    /// One head's query: the no-RoPE part, then the RoPE part.
    pub fn qk_head(&self) -> usize {
        self.nope + self.rope
    }
    /// With `q_lora_rank`: `q_a_proj` and `q_b_proj`.
    pub fn q_low_rank(&self) -> Option<(Matrix, Matrix)> {
        self.q_lora_rank
            .map(|r| ([r, self.hidden], [self.heads * self.qk_head(), r]))
    }
    /// Without `q_lora_rank`: `q_proj`.
    pub fn q_full(&self) -> Matrix {
        [self.heads * self.qk_head(), self.hidden]
    }
    /// The latent KV and the shared RoPE key.
    pub fn kv_a(&self) -> Matrix {
        [self.kv_lora_rank + self.rope, self.hidden]
    }
    /// Per head, W_UK (`nope` rows) then W_UV (`v_head` rows).
    pub fn kv_b(&self) -> Matrix {
        [self.heads * (self.nope + self.v_head), self.kv_lora_rank]
    }
    pub fn o(&self) -> Matrix {
        [self.hidden, self.heads * self.v_head]
    }
}

impl MoeShapes {
    pub fn router(&self) -> Matrix {
        [self.experts, self.expert.hidden]
    }
}

/// An EAGLE-3 draft head's tensors (one decoder layer whose attention reads the embedding
/// and the fused hidden state side by side, so q/k/v take `2 * hidden` inputs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftShapes {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: FfnShape,
    pub draft_vocab: usize,
    pub target_vocab: usize,
    pub captured_layers: usize,
}

impl DraftShapes {
    /// Errors where the query heads do not group over the KV heads.
    pub fn new(arch: &DraftArch) -> Result<DraftShapes> {
        if arch.mla.is_some() {
            return Err(EngineError::Unsupported(format!(
                "draft `{}` has latent attention (Eagle3DeepseekV2ForCausalLM): this engine runs the llama-style EAGLE-3 head only; the sim backend prices the MLA head",
                arch.name
            )));
        }
        let hidden = arch.hidden_size as usize;
        let (heads, kv_heads) = (arch.num_heads as usize, arch.num_kv_heads as usize);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(EngineError::ConfigMismatch(format!(
                "draft: {heads} heads do not group over {kv_heads} KV heads"
            )));
        }
        Ok(DraftShapes {
            hidden,
            heads,
            kv_heads,
            head_dim: arch.head_dim as usize,
            ffn: FfnShape {
                inter: arch.intermediate_size as usize,
                hidden,
            },
            draft_vocab: arch.draft_vocab_size as usize,
            target_vocab: arch.target_vocab_size as usize,
            captured_layers: arch.capture_layers.len(),
        })
    }

    /// Fuses the captured layers' hidden states into one.
    pub fn fc(&self) -> Matrix {
        [self.hidden, self.captured_layers * self.hidden]
    }
    pub fn q(&self) -> Matrix {
        [self.heads * self.head_dim, 2 * self.hidden]
    }
    pub fn kv(&self) -> Matrix {
        [self.kv_heads * self.head_dim, 2 * self.hidden]
    }
    pub fn o(&self) -> Matrix {
        [self.hidden, self.heads * self.head_dim]
    }
    pub fn lm_head(&self) -> Matrix {
        [self.draft_vocab, self.hidden]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mla_draft_head_is_refused_by_name() {
        let arch = DraftArch::preset("kimi-k2.5-eagle3-mla").unwrap();
        let e = DraftShapes::new(&arch).err().unwrap().to_string();
        assert!(
            e.contains("latent attention") && e.contains("sim backend"),
            "{e}"
        );
        assert!(DraftShapes::new(&DraftArch::preset("kimi-k2.5-eagle3").unwrap()).is_ok());
    }

    /// Kimi-K2.5's tensors as its `model.safetensors.index.json` and safetensors headers
    /// list them (layer 1, expert 0).
    #[test]
    fn kimi_k25_shapes_match_the_published_checkpoint() {
        let arch = ModelArch::preset("kimi-k2.5").unwrap();
        let s = TargetShapes::new(&arch).unwrap();
        assert_eq!(s.embed(), [163840, 7168]);
        assert_eq!(s.q_low_rank(), Some(([1536, 7168], [64 * 192, 1536])));
        assert_eq!(s.kv_a(), [576, 7168]);
        assert_eq!(s.kv_b(), [64 * 256, 512]);
        assert_eq!(s.o(), [7168, 64 * 128]);
        let moe = s.moe().unwrap();
        assert_eq!(moe.router(), [384, 7168]);
        assert_eq!(moe.expert.proj(Proj::Gate), [2048, 7168]);
        assert_eq!(moe.expert.proj(Proj::Down), [7168, 2048]);
        assert_eq!(int4_packed(moe.expert.proj(Proj::Down)), [7168, 256]);
        assert_eq!(
            int4_scales(moe.expert.proj(Proj::Down), s.group),
            [7168, 64]
        );
        assert_eq!(moe.shared.unwrap().proj(Proj::Up), [2048, 7168]);
        assert_eq!(s.dense.proj(Proj::Gate), [18432, 7168]);
    }
}
