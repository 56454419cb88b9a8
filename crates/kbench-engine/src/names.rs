//! The tensor names of a DeepSeek-V3 / Kimi-K2.5 target checkpoint (Hugging Face layout),
//! written once for the checkpoint writer (`init`), the CPU loader (`target`) and the GPU
//! loader (`cuda::weights`). Most functions name a module (a linear, a norm); [`weight`]
//! and [`Int4`] name its tensors.

/// `module.weight`: a BF16 linear's or a norm's tensor.
pub fn weight(module: &str) -> String {
    format!("{module}.weight")
}

/// compressed-tensors' three tensors of an INT4 linear (see `kbench_numerics::int4`).
pub struct Int4;

impl Int4 {
    pub fn packed(module: &str) -> String {
        format!("{module}.weight_packed")
    }
    pub fn scale(module: &str) -> String {
        format!("{module}.weight_scale")
    }
    pub fn shape(module: &str) -> String {
        format!("{module}.weight_shape")
    }
}

/// A checkpoint's names under its tensor prefix (`language_model.` in Kimi-K2.5's
/// multimodal checkpoint, empty in DeepSeek-V3's).
#[derive(Debug, Clone, Copy)]
pub struct TargetNames<'a> {
    prefix: &'a str,
}

impl<'a> TargetNames<'a> {
    pub fn new(prefix: &'a str) -> TargetNames<'a> {
        TargetNames { prefix }
    }
    /// The embedding's tensor (it is no linear: no module of its own is loaded).
    pub fn embed(&self) -> String {
        format!("{}model.embed_tokens.weight", self.prefix)
    }
    pub fn final_norm(&self) -> String {
        format!("{}model.norm", self.prefix)
    }
    pub fn lm_head(&self) -> String {
        format!("{}lm_head", self.prefix)
    }
    pub fn layer(&self, layer: usize) -> LayerNames {
        LayerNames {
            base: format!("{}model.layers.{layer}", self.prefix),
        }
    }
}

/// One decoder layer's modules.
#[derive(Debug, Clone)]
pub struct LayerNames {
    base: String,
}

impl LayerNames {
    pub fn input_norm(&self) -> String {
        format!("{}.input_layernorm", self.base)
    }
    pub fn post_attention_norm(&self) -> String {
        format!("{}.post_attention_layernorm", self.base)
    }
    fn attn(&self, module: &str) -> String {
        format!("{}.self_attn.{module}", self.base)
    }
    /// The low-rank query's down projection (with `q_lora_rank`).
    pub fn q_a(&self) -> String {
        self.attn("q_a_proj")
    }
    pub fn q_a_norm(&self) -> String {
        self.attn("q_a_layernorm")
    }
    pub fn q_b(&self) -> String {
        self.attn("q_b_proj")
    }
    /// The full-rank query (without `q_lora_rank`).
    pub fn q(&self) -> String {
        self.attn("q_proj")
    }
    pub fn kv_a(&self) -> String {
        self.attn("kv_a_proj_with_mqa")
    }
    pub fn kv_a_norm(&self) -> String {
        self.attn("kv_a_layernorm")
    }
    pub fn kv_b(&self) -> String {
        self.attn("kv_b_proj")
    }
    pub fn o(&self) -> String {
        self.attn("o_proj")
    }
    /// A dense layer's feed-forward.
    pub fn dense_mlp(&self) -> FfnNames {
        FfnNames {
            base: format!("{}.mlp", self.base),
        }
    }
    pub fn router(&self) -> String {
        format!("{}.mlp.gate", self.base)
    }
    /// The router's bias for `noaux_tc` routing (a tensor).
    pub fn router_bias(&self) -> String {
        format!("{}.mlp.gate.e_score_correction_bias", self.base)
    }
    pub fn expert(&self, expert: usize) -> FfnNames {
        FfnNames {
            base: format!("{}.mlp.experts.{expert}", self.base),
        }
    }
    pub fn shared_experts(&self) -> FfnNames {
        FfnNames {
            base: format!("{}.mlp.shared_experts", self.base),
        }
    }
}

/// A gated feed-forward's three projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    Gate,
    Up,
    Down,
}

impl Proj {
    fn module(self) -> &'static str {
        match self {
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }
}

/// A feed-forward's modules (a dense MLP, an expert, the shared experts).
#[derive(Debug, Clone)]
pub struct FfnNames {
    base: String,
}

impl FfnNames {
    /// The feed-forward itself (what errors name).
    pub fn base(&self) -> &str {
        &self.base
    }
    pub fn proj(&self, proj: Proj) -> String {
        format!("{}.{}", self.base, proj.module())
    }
    pub fn gate(&self) -> String {
        self.proj(Proj::Gate)
    }
    pub fn up(&self) -> String {
        self.proj(Proj::Up)
    }
    pub fn down(&self) -> String {
        self.proj(Proj::Down)
    }
}

/// An EAGLE-3 draft checkpoint's modules (SpecForge's / SGLang's `LlamaForCausalLMEagle3`
/// layout: one decoder layer, `midlayer`, whose attention takes the embedding and the fused
/// hidden state side by side).
pub mod draft {
    /// Fuses the captured target layers' hidden states.
    pub const FC: &str = "fc";
    pub const INPUT_NORM: &str = "midlayer.input_layernorm";
    pub const HIDDEN_NORM: &str = "midlayer.hidden_norm";
    pub const Q: &str = "midlayer.self_attn.q_proj";
    pub const K: &str = "midlayer.self_attn.k_proj";
    pub const V: &str = "midlayer.self_attn.v_proj";
    pub const O: &str = "midlayer.self_attn.o_proj";
    pub const POST_ATTENTION_NORM: &str = "midlayer.post_attention_layernorm";
    pub const GATE: &str = "midlayer.mlp.gate_proj";
    pub const UP: &str = "midlayer.mlp.up_proj";
    pub const DOWN: &str = "midlayer.mlp.down_proj";
    pub const FINAL_NORM: &str = "norm";
    pub const LM_HEAD: &str = "lm_head";
    /// Tensors: the draft vocabulary's offsets into the target's, and the target's mask of
    /// tokens the draft can propose.
    pub const D2T: &str = "d2t";
    pub const T2D: &str = "t2d";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names as Kimi-K2.5's `model.safetensors.index.json` spells them.
    #[test]
    fn names_match_the_hugging_face_layout() {
        let n = TargetNames::new("language_model.");
        let l = n.layer(3);
        assert_eq!(n.embed(), "language_model.model.embed_tokens.weight");
        assert_eq!(weight(&n.lm_head()), "language_model.lm_head.weight");
        assert_eq!(
            weight(&l.kv_a()),
            "language_model.model.layers.3.self_attn.kv_a_proj_with_mqa.weight"
        );
        assert_eq!(
            Int4::packed(&l.expert(17).down()),
            "language_model.model.layers.3.mlp.experts.17.down_proj.weight_packed"
        );
        assert_eq!(
            l.router_bias(),
            "language_model.model.layers.3.mlp.gate.e_score_correction_bias"
        );
        assert_eq!(
            weight(&l.shared_experts().gate()),
            "language_model.model.layers.3.mlp.shared_experts.gate_proj.weight"
        );
        assert_eq!(
            weight(&TargetNames::new("").layer(0).input_norm()),
            "model.layers.0.input_layernorm.weight"
        );
    }
}
