//! The config.json files a generated model is written with, in the real checkpoints'
//! layout, and the draft architecture they describe.

use super::*;

use serde_json::{json, Value};

use kbench_core::arch::{DraftArch, ModelArch};

/// The target's config.json: Kimi-K2.5's wrapper around a DeepSeek-V3 text config, with
/// compressed-tensors INT4 routed experts, in `dims`.
pub(super) fn config_json(d: &Dims, seed: u64, quality: f32) -> Value {
    let text = json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "vocab_size": d.vocab,
        "hidden_size": d.hidden,
        "intermediate_size": d.inter,
        "moe_intermediate_size": d.moe_inter,
        "num_hidden_layers": d.layers,
        "num_nextn_predict_layers": 0,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.heads,
        "n_shared_experts": d.shared_experts,
        "n_routed_experts": d.experts,
        "routed_scaling_factor": 2.827,
        "kv_lora_rank": d.kv_lora_rank,
        "q_lora_rank": d.q_lora_rank,
        "qk_rope_head_dim": d.rope,
        "v_head_dim": d.v_head,
        "qk_nope_head_dim": d.nope,
        "topk_method": "noaux_tc",
        "n_group": d.n_group,
        "topk_group": d.topk_group,
        "num_experts_per_tok": d.experts_per_tok,
        "moe_layer_freq": 1,
        "first_k_dense_replace": d.first_k_dense,
        "norm_topk_prob": true,
        "scoring_func": "sigmoid",
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0
        },
        "attention_bias": false,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "quantization_config": {
            "config_groups": {"group_0": {
                "input_activations": null, "output_activations": null, "targets": ["Linear"],
                "weights": {"actorder": null, "block_structure": null, "dynamic": false,
                    "group_size": 32, "num_bits": 4, "observer": "minmax", "observer_kwargs": {},
                    "strategy": "group", "symmetric": true, "type": "int"}
            }},
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            "kv_cache_scheme": null,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed"
        }
    });
    json!({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "tie_word_embeddings": false,
        "kbench_generated": {"seed": seed, "draft_quality": quality},
    })
}

/// The draft as the loader reads its config (what [`Gen::draft_config_json`] writes).
pub(super) fn draft_arch(d: &Dims, target: &ModelArch) -> DraftArch {
    DraftArch {
        name: "draft".into(),
        hidden_size: d.hidden as u32,
        num_heads: d.draft_heads as u32,
        num_kv_heads: d.draft_kv_heads as u32,
        head_dim: d.draft_head_dim as u32,
        intermediate_size: d.draft_inter as u32,
        draft_vocab_size: d.draft_vocab as u32,
        target_vocab_size: d.vocab as u32,
        capture_layers: d.capture_layers().iter().map(|&l| l as u32).collect(),
        rms_norm_eps: 1e-5,
        rope_theta: target.rope_theta,
        mla: None,
    }
}

impl Gen {
    pub(super) fn config_json(&self) -> Value {
        config_json(&self.d, self.seed, self.quality)
    }

    pub(super) fn draft_config_json(&self) -> Value {
        let d = &self.d;
        json!({
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": d.hidden,
            "num_attention_heads": d.draft_heads,
            "num_key_value_heads": d.draft_kv_heads,
            "head_dim": d.draft_head_dim,
            "intermediate_size": d.draft_inter,
            "num_hidden_layers": 1,
            "vocab_size": d.vocab,
            "draft_vocab_size": d.draft_vocab,
            "rms_norm_eps": 1e-5,
            "rope_theta": 50000.0,
            "max_position_embeddings": 262144,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": d.capture_layers(),
                "use_aux_hidden_state": true
            },
            "kbench_generated": {"seed": self.seed, "draft_quality": self.quality},
        })
    }
}
