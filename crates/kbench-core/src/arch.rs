//! Model architectures: the target (llama-family dense, or DeepSeek-V3 / Kimi-K2 MoE with
//! MLA) and the EAGLE-3 draft head, read from a Hugging Face `config.json` or a preset.
//!
//! One parser serves the cost model (which needs shapes) and the engine (which also needs
//! RoPE scaling, norms and router settings), so the two can never disagree about a model.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    #[error("cannot read model config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("model config {path} is not valid JSON")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("model config {path}: field `{field}` is missing or not a {expected}")]
    Field {
        path: PathBuf,
        field: String,
        expected: &'static str,
    },
    #[error("model config {path}: model_type `{model_type}` is not supported (supported: llama, mistral, qwen2, deepseek_v3, kimi_k2, kimi_k25)")]
    UnsupportedModelType { path: PathBuf, model_type: String },
    #[error("{name} is not modelled: {why}")]
    NotModelled { name: String, why: String },
    #[error("unknown model preset `{name}` (known: {known})")]
    UnknownPreset { name: String, known: String },
    #[error("unknown draft preset `{name}` (known: {known})")]
    UnknownDraftPreset { name: String, known: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArchFamily {
    /// Llama-style: GQA attention, dense SwiGLU MLP.
    Dense,
    /// DeepSeek-V3 / Kimi-K2: MLA attention, sigmoid-routed MoE with shared experts.
    MlaMoe,
    /// GQA attention with a routed-expert MoE after dense first layers (MiniMax-M3).
    GqaMoe,
}

/// Attention that reads only some of the context's blocks (MiniMax-M3's MSA): each query
/// attends to its top-k blocks, its local block among them, so below `dense_up_to_tokens` of
/// context every block is selected and the layer is exactly full attention, and past it a
/// query reads `dense_up_to_tokens` of its context. The blocks are
/// chosen by an indexer that runs in every sparse layer whatever the context: its query and
/// key heads score each `block_size`-token block, and a top-k kernel keeps the best.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SparseAttention {
    pub name: String,
    pub dense_up_to_tokens: u32,
    /// How many of the model's layers are sparse (the rest attend densely).
    pub layers: u32,
    /// Index query heads over the whole model (split over TP like the KV heads, at least one
    /// per rank); the index key is one head, on every rank.
    pub index_heads: u32,
    pub index_head_dim: u32,
    /// Tokens per scored block (one KV page).
    pub block_size: u32,
    /// Blocks each query keeps.
    pub topk_blocks: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlaDims {
    /// None means q is projected directly (no low-rank path), as in DeepSeek-V2-Lite.
    pub q_lora_rank: Option<u32>,
    pub kv_lora_rank: u32,
    pub qk_nope_head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub v_head_dim: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeDims {
    pub n_routed_experts: u32,
    pub num_experts_per_tok: u32,
    pub n_shared_experts: u32,
    pub moe_intermediate_size: u32,
    pub first_k_dense_replace: u32,
    pub moe_layer_freq: u32,
    pub scoring_func: String,
    pub topk_method: String,
    pub n_group: u32,
    pub topk_group: u32,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantInfo {
    /// e.g. `compressed-tensors`.
    pub method: String,
    pub num_bits: u32,
    pub group_size: u32,
    pub symmetric: bool,
    /// Only the routed experts are quantized (Kimi-K2.5's `ignore` list keeps the rest BF16).
    pub routed_experts_only: bool,
    /// Bytes of one scale: 2 for BF16 group scales (compressed-tensors INT4), 1 for the
    /// E8M0 / FP8 scales of MXFP8, MXFP4 and NVFP4, 4 for FP8 block scales.
    #[serde(default = "bf16_scale")]
    pub scale_bytes: f64,
    /// How the GEMMs run: weights dequantized to BF16 math (W4A16 Marlin), the weight
    /// format's own tensor-core rate (FP8, FP4 with dynamic activation quantization), or,
    /// for a microscaling format, whichever of the two the GPU allows.
    #[serde(default)]
    pub math: QuantMath,
}

fn bf16_scale() -> f64 {
    2.0
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantMath {
    /// Weight-only: dequantized in the kernel, BF16 tensor cores.
    #[default]
    WeightOnly,
    /// Activations quantized too: the tensor cores of the weights' precision.
    Native,
    /// A microscaling format (MXFP8: FP8 values, one E8M0 scale per 32 weights): native
    /// block-scaled tensor-core math where the GPU has it (compute capability 10.0 and up),
    /// otherwise weights dequantized in a Marlin kernel to BF16 math. That is vLLM's rule:
    /// `select_mxfp8_linear_backend` (quantization/utils/mxfp8_utils.py) picks FlashInfer's
    /// CUTLASS `mm_mxfp8` at `has_device_capability(100)` and Marlin's W8A16 below, and the
    /// MXFP8 MoE oracle's DeepGEMM path declares the 1x32 scheme Blackwell-only, leaving
    /// Marlin on Hopper.
    BlockScaled,
}

impl QuantInfo {
    /// Bytes per weight including the scales: 0.5 + 2/32 for INT4 group-32 with BF16
    /// scales, 1 + 1/32 for MXFP8, 0.5 + 1/16 for NVFP4.
    pub fn bytes_per_weight(&self) -> f64 {
        self.num_bits as f64 / 8.0 + self.scale_bytes / self.group_size.max(1) as f64
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// `yarn`, `linear`, `dynamic`, `llama3` ...
    pub kind: String,
    pub factor: f64,
    pub original_max_position_embeddings: Option<u64>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
}

impl RopeScaling {
    /// What the shared rotary formula takes, with HF's defaults for keys a config leaves out.
    /// Dynamic and llama3 scaling rotate as unscaled at the positions kbench reaches (far
    /// below the original context).
    pub fn scaling(&self) -> kbench_numerics::rope::Scaling {
        use kbench_numerics::rope::{Scaling, Yarn};
        match self.kind.as_str() {
            "yarn" | "deepseek_yarn" => Scaling::Yarn(Yarn {
                factor: self.factor,
                original_max_position: self.original_max_position_embeddings.unwrap_or(4096) as f64,
                beta_fast: self.beta_fast.unwrap_or(32.0),
                beta_slow: self.beta_slow.unwrap_or(1.0),
                mscale: self.mscale.unwrap_or(1.0),
                mscale_all_dim: self.mscale_all_dim.unwrap_or(0.0),
            }),
            "linear" => Scaling::Linear {
                factor: self.factor,
            },
            _ => Scaling::None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelArch {
    pub name: String,
    pub family: ArchFamily,
    pub model_type: String,
    pub hidden_size: u32,
    pub num_layers: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    /// Dense attention head dim (Dense family); for MLA see `mla`.
    pub head_dim: u32,
    pub vocab_size: u32,
    /// Dense MLP intermediate size (all layers of a Dense model; the first-k layers of MoE).
    pub intermediate_size: u32,
    pub mla: Option<MlaDims>,
    pub moe: Option<MoeDims>,
    pub quant: Option<QuantInfo>,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: u64,
    pub tie_word_embeddings: bool,
    /// Prefix of text tensors in the checkpoint (`language_model.` for Kimi-K2.5's wrapper).
    pub tensor_prefix: String,
    /// Multi-token-prediction layers shipped with the checkpoint
    /// (`num_nextn_predict_layers`): what vLLM's `mtp` method drafts with.
    #[serde(default)]
    pub mtp_layers: u32,
    #[serde(default)]
    pub sparse_attention: Option<SparseAttention>,
}

impl ModelArch {
    /// Bytes per weight of the GEMMs outside the routed experts (attention, dense MLP, shared
    /// experts): BF16 unless the checkpoint quantizes every linear layer.
    pub fn dense_bytes_per_weight(&self) -> f64 {
        match &self.quant {
            Some(q) if !q.routed_experts_only => q.bytes_per_weight(),
            _ => 2.0,
        }
    }

    /// The quantization of the linear layers outside the routed experts, if any.
    pub fn dense_quant(&self) -> Option<&QuantInfo> {
        self.quant.as_ref().filter(|q| !q.routed_experts_only)
    }

    pub fn is_moe_layer(&self, layer: u32) -> bool {
        match &self.moe {
            Some(m) => layer >= m.first_k_dense_replace && layer % m.moe_layer_freq.max(1) == 0,
            None => false,
        }
    }

    pub fn num_moe_layers(&self) -> u32 {
        (0..self.num_layers)
            .filter(|&l| self.is_moe_layer(l))
            .count() as u32
    }

    /// Bytes of KV cache per token per layer in BF16: MLA keeps the latent (kv_lora_rank +
    /// rope dims), MHA/GQA keeps K and V for every KV head.
    pub fn kv_bytes_per_token_per_layer(&self) -> u64 {
        match &self.mla {
            Some(m) => 2 * (m.kv_lora_rank + m.qk_rope_head_dim) as u64,
            None => 2 * 2 * (self.num_kv_heads * self.head_dim) as u64,
        }
    }

    /// Layers whose input EAGLE-3 captures (SGLang: [2, N//2, N-3]); the captured hidden
    /// states are the outputs of the layer before each.
    pub fn eagle3_capture_layer_outputs(&self) -> [u32; 3] {
        let n = self.num_layers;
        [1, (n / 2).saturating_sub(1), n.saturating_sub(4)]
    }

    pub fn preset(name: &str) -> Result<ModelArch, ArchError> {
        match name {
            "kimi-k2.5" | "kimi-k2.5-int4" => Ok(kimi_k25()),
            "deepseek-v3" => {
                let mut a = kimi_k25();
                a.name = "deepseek-v3".into();
                a.model_type = "deepseek_v3".into();
                a.num_heads = 128;
                a.num_kv_heads = 128;
                a.vocab_size = 129280;
                a.num_layers = 61;
                a.tensor_prefix = String::new();
                // deepseek-ai/DeepSeek-V3 config.json: num_nextn_predict_layers = 1
                a.mtp_layers = 1;
                let moe = a.moe.as_mut().expect("kimi preset is MoE");
                moe.n_routed_experts = 256;
                moe.first_k_dense_replace = 3;
                moe.n_group = 8;
                moe.topk_group = 4;
                moe.routed_scaling_factor = 2.5;
                // config.json quantization_config: quant_method fp8, fmt e4m3, dynamic
                // activations, weight_block_size [128, 128] (float32 scales, one per block)
                a.quant = Some(QuantInfo {
                    method: "fp8".into(),
                    num_bits: 8,
                    group_size: 128 * 128,
                    symmetric: true,
                    routed_experts_only: false,
                    scale_bytes: 4.0,
                    math: QuantMath::Native,
                });
                Ok(a)
            }
            "llama-3.1-8b" => Ok(ModelArch {
                name: "llama-3.1-8b".into(),
                family: ArchFamily::Dense,
                model_type: "llama".into(),
                hidden_size: 4096,
                num_layers: 32,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 128,
                vocab_size: 128256,
                intermediate_size: 14336,
                mla: None,
                moe: None,
                quant: None,
                rms_norm_eps: 1e-5,
                rope_theta: 500000.0,
                rope_scaling: Some(RopeScaling {
                    kind: "llama3".into(),
                    factor: 8.0,
                    original_max_position_embeddings: Some(8192),
                    beta_fast: None,
                    beta_slow: None,
                    mscale: None,
                    mscale_all_dim: None,
                    low_freq_factor: Some(1.0),
                    high_freq_factor: Some(4.0),
                }),
                max_position_embeddings: 131072,
                tie_word_embeddings: false,
                tensor_prefix: String::new(),
                mtp_layers: 0,
                sparse_attention: None,
            }),
            "minimax-m3" => Ok(minimax_m3()),
            "deepseek-v4-pro" | "deepseek-v4-flash" => Err(ArchError::NotModelled {
                name: name.into(),
                why: DEEPSEEK_V4_REFUSAL.into(),
            }),
            other => Err(ArchError::UnknownPreset {
                name: other.into(),
                known: MODEL_PRESETS.join(", "),
            }),
        }
    }

    /// Reads a HF `config.json`: llama-family, deepseek_v3, kimi_k2, or the kimi_k25 wrapper
    /// whose text backbone sits in `text_config`.
    pub fn from_config_file(path: &Path) -> Result<ModelArch, ArchError> {
        let text = crate::input::read_text(path).map_err(|source| ArchError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|source| ArchError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_config_value(&value, path)
    }

    pub fn from_config_value(root: &Value, path: &Path) -> Result<ModelArch, ArchError> {
        let outer_type = root.get("model_type").and_then(Value::as_str).unwrap_or("");
        let (cfg, prefix) = if outer_type == "kimi_k25" {
            let text = root.get("text_config").ok_or_else(|| ArchError::Field {
                path: path.into(),
                field: "text_config".into(),
                expected: "object",
            })?;
            (text, "language_model.")
        } else {
            (root, "")
        };
        let f = Fields { v: cfg, path };
        let model_type = f.str_or("model_type", outer_type).to_string();
        let family = match model_type.as_str() {
            "deepseek_v3" | "deepseek_v2" | "kimi_k2" => ArchFamily::MlaMoe,
            "llama" | "mistral" | "qwen2" => ArchFamily::Dense,
            "deepseek_v4" => {
                return Err(ArchError::NotModelled {
                    name: format!("{} (model_type deepseek_v4)", path.display()),
                    why: DEEPSEEK_V4_REFUSAL.into(),
                })
            }
            other => {
                return Err(ArchError::UnsupportedModelType {
                    path: path.into(),
                    model_type: other.into(),
                })
            }
        };
        let hidden_size = f.u32("hidden_size")?;
        let num_heads = f.u32("num_attention_heads")?;
        let num_kv_heads = f.u32_or("num_key_value_heads", num_heads);
        let head_dim = f.u32_or("head_dim", hidden_size / num_heads.max(1));
        let (mla, moe) = if family == ArchFamily::MlaMoe {
            let mla = MlaDims {
                q_lora_rank: f.opt_u32("q_lora_rank"),
                kv_lora_rank: f.u32("kv_lora_rank")?,
                qk_nope_head_dim: f.u32("qk_nope_head_dim")?,
                qk_rope_head_dim: f.u32("qk_rope_head_dim")?,
                v_head_dim: f.u32("v_head_dim")?,
            };
            let moe = MoeDims {
                n_routed_experts: f.u32("n_routed_experts")?,
                num_experts_per_tok: f.u32("num_experts_per_tok")?,
                n_shared_experts: f.u32_or("n_shared_experts", 0),
                moe_intermediate_size: f.u32("moe_intermediate_size")?,
                first_k_dense_replace: f.u32_or("first_k_dense_replace", 0),
                moe_layer_freq: f.u32_or("moe_layer_freq", 1),
                scoring_func: f.str_or("scoring_func", "softmax").into(),
                topk_method: f.str_or("topk_method", "greedy").into(),
                n_group: f.u32_or("n_group", 1),
                topk_group: f.u32_or("topk_group", 1),
                norm_topk_prob: cfg
                    .get("norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                routed_scaling_factor: f.f64_or("routed_scaling_factor", 1.0),
            };
            (Some(mla), Some(moe))
        } else {
            (None, None)
        };
        let quant = cfg
            .get("quantization_config")
            .or_else(|| root.get("quantization_config"))
            .and_then(parse_quant);
        let rope_scaling = cfg.get("rope_scaling").and_then(parse_rope_scaling);
        Ok(ModelArch {
            name: path
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| model_type.clone()),
            family,
            model_type,
            hidden_size,
            num_layers: f.u32("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: f.u32("vocab_size")?,
            intermediate_size: f.u32("intermediate_size")?,
            mla,
            moe,
            quant,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6),
            rope_theta: f.f64_or("rope_theta", 10000.0),
            rope_scaling,
            max_position_embeddings: f.opt_u32("max_position_embeddings").unwrap_or(4096) as u64,
            tie_word_embeddings: cfg
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            tensor_prefix: prefix.into(),
            mtp_layers: f.u32_or("num_nextn_predict_layers", 0),
            sparse_attention: None,
        })
    }
}

pub const MODEL_PRESETS: &[&str] = &["kimi-k2.5", "deepseek-v3", "llama-3.1-8b", "minimax-m3"];

/// Why DeepSeek-V4 has no preset: its attention and residual stream are new kinds the cost
/// model has no operators for, and a price from the nearest known kind would be a guess.
const DEEPSEEK_V4_REFUSAL: &str = "DeepSeek-V4's attention is hybrid compressed attention (CSA with a lightning indexer over 4x-compressed KV, HCA over 128x-compressed KV, a 128-token sliding window; config `compress_ratios`) with a single 512-dim shared KV head and grouped output projection, and its residual stream uses mHC hyper-connections (hc_mult 4): kbench prices MLA and GQA attention only (docs/research/models.md)";

/// MiniMaxAI/MiniMax-M3-MXFP8 `text_config` (config.json of the released checkpoint, read
/// in docs/research/models.md): GQA 64/4 x 128, dense MLP in layers 0-2, then 128 routed
/// experts top-4 plus one shared expert, every linear layer MXFP8 (1x32 E8M0 scales) except
/// the embedding, lm_head and routers; MSA sparse attention in layers 3-59.
fn minimax_m3() -> ModelArch {
    ModelArch {
        name: "minimax-m3".into(),
        family: ArchFamily::GqaMoe,
        model_type: "minimax_m3".into(),
        hidden_size: 6144,
        num_layers: 60,
        num_heads: 64,
        num_kv_heads: 4,
        head_dim: 128,
        vocab_size: 200064,
        // dense_intermediate_size: the MLP of the three dense layers
        intermediate_size: 12288,
        mla: None,
        moe: Some(MoeDims {
            n_routed_experts: 128,
            num_experts_per_tok: 4,
            n_shared_experts: 1,
            moe_intermediate_size: 3072,
            first_k_dense_replace: 3,
            moe_layer_freq: 1,
            scoring_func: "sigmoid".into(),
            topk_method: "noaux_tc".into(),
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 2.0,
        }),
        quant: Some(QuantInfo {
            method: "mxfp8".into(),
            num_bits: 8,
            group_size: 32,
            symmetric: true,
            routed_experts_only: false,
            scale_bytes: 1.0,
            math: QuantMath::BlockScaled,
        }),
        rms_norm_eps: 1e-6,
        rope_theta: 5_000_000.0,
        rope_scaling: None,
        max_position_embeddings: 1_048_576,
        tie_word_embeddings: false,
        tensor_prefix: "language_model.".into(),
        // num_mtp_modules 1 in the config, but the checkpoint ships no mtp.* tensors
        mtp_layers: 0,
        // sparse_topk_blocks 16 x sparse_block_size 128, the local block among them (vLLM
        // forces it into the top-k); layers 3-59
        // (sparse_attention_freq [0,0,0, 1 x 57]); sparse_num_index_heads 4, sparse_index_dim
        // 128 (index_q_proj [512, 6144], index_k_proj [128, 6144] in the checkpoint)
        sparse_attention: Some(SparseAttention {
            name: "MSA (MiniMax sparse attention)".into(),
            dense_up_to_tokens: 16 * 128,
            layers: 57,
            index_heads: 4,
            index_head_dim: 128,
            block_size: 128,
            topk_blocks: 16,
        }),
    }
}
pub const DRAFT_PRESETS: &[&str] = &[
    "kimi-k2.5-eagle3",
    "kimi-k2.5-eagle3-mla",
    "llama-3.1-8b-eagle3",
    "minimax-m3-eagle3",
];

fn kimi_k25() -> ModelArch {
    ModelArch {
        name: "kimi-k2.5".into(),
        family: ArchFamily::MlaMoe,
        model_type: "kimi_k2".into(),
        hidden_size: 7168,
        num_layers: 61,
        num_heads: 64,
        num_kv_heads: 64,
        head_dim: 128,
        vocab_size: 163840,
        intermediate_size: 18432,
        mla: Some(MlaDims {
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
        }),
        moe: Some(MoeDims {
            n_routed_experts: 384,
            num_experts_per_tok: 8,
            n_shared_experts: 1,
            moe_intermediate_size: 2048,
            first_k_dense_replace: 1,
            moe_layer_freq: 1,
            scoring_func: "sigmoid".into(),
            topk_method: "noaux_tc".into(),
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 2.827,
        }),
        quant: Some(QuantInfo {
            method: "compressed-tensors".into(),
            num_bits: 4,
            group_size: 32,
            symmetric: true,
            routed_experts_only: true,
            scale_bytes: 2.0,
            math: QuantMath::WeightOnly,
        }),
        rms_norm_eps: 1e-5,
        rope_theta: 50000.0,
        rope_scaling: Some(RopeScaling {
            kind: "yarn".into(),
            factor: 64.0,
            original_max_position_embeddings: Some(4096),
            beta_fast: Some(32.0),
            beta_slow: Some(1.0),
            mscale: Some(1.0),
            mscale_all_dim: Some(1.0),
            low_freq_factor: None,
            high_freq_factor: None,
        }),
        max_position_embeddings: 262144,
        tie_word_embeddings: false,
        tensor_prefix: "language_model.".into(),
        // moonshotai/Kimi-K2.5 config.json: num_nextn_predict_layers = 0 (no MTP weights)
        mtp_layers: 0,
        sparse_attention: None,
    }
}

/// EAGLE-3 draft head: one decoder layer over concat(embedding, fc(hidden)), llama-style
/// (MHA/GQA attention) or, with `mla`, DeepSeek-style latent attention and a dense MLP
/// (vLLM's `Eagle3DeepseekV2ForCausalLM`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftArch {
    pub name: String,
    pub hidden_size: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub intermediate_size: u32,
    pub draft_vocab_size: u32,
    pub target_vocab_size: u32,
    /// Target layers whose outputs are captured (Kimi-K2.5: 1, 29, 57).
    pub capture_layers: Vec<u32>,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// Latent attention (`kv_lora_rank` in the config): its q/kv projections take the
    /// 2 x hidden concatenation, its KV cache is the latent.
    #[serde(default)]
    pub mla: Option<MlaDims>,
}

impl DraftArch {
    pub fn preset(name: &str) -> Result<DraftArch, ArchError> {
        match name {
            "kimi-k2.5-eagle3" => Ok(DraftArch {
                name: name.into(),
                hidden_size: 7168,
                num_heads: 64,
                num_kv_heads: 64,
                head_dim: 128,
                intermediate_size: 18432,
                draft_vocab_size: 32000,
                target_vocab_size: 163840,
                capture_layers: vec![1, 29, 57],
                rms_norm_eps: 1e-5,
                rope_theta: 50000.0,
                mla: None,
            }),
            // lightseekorg/kimi-k2.5-eagle3-mla (and its K2.6 successors), trained with
            // TorchSpec: its draft config (configs/draft_models/kimi_k25_eagle3_mla.json in
            // TorchSpec forks; the K3 head's kimi_k3_eagle3_mla.json has the same dims)
            // keeps Kimi's MLA shape, a dense 18432 MLP and the full 163840 vocabulary.
            "kimi-k2.5-eagle3-mla" => Ok(DraftArch {
                name: name.into(),
                hidden_size: 7168,
                num_heads: 64,
                num_kv_heads: 64,
                head_dim: 128,
                intermediate_size: 18432,
                draft_vocab_size: 163840,
                target_vocab_size: 163840,
                capture_layers: vec![1, 29, 57],
                rms_norm_eps: 1e-5,
                rope_theta: 50000.0,
                mla: Some(MlaDims {
                    q_lora_rank: Some(1536),
                    kv_lora_rank: 512,
                    qk_nope_head_dim: 128,
                    qk_rope_head_dim: 64,
                    v_head_dim: 128,
                }),
            }),
            "llama-3.1-8b-eagle3" => Ok(DraftArch {
                name: name.into(),
                hidden_size: 4096,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 128,
                intermediate_size: 14336,
                draft_vocab_size: 32000,
                target_vocab_size: 128256,
                capture_layers: vec![1, 15, 28],
                rms_norm_eps: 1e-5,
                rope_theta: 500000.0,
                mla: None,
            }),
            // Inferact/MiniMax-M3-EAGLE3, the head InferenceX's MiniMax-M3 EAGLE-3 arms ran.
            // Its config.json is not in the index; each field has another source
            // (docs/research/models.md, "MiniMax-M3 EAGLE-3 draft"): a LlamaForCausalLMEagle3
            // layer with hidden 6144, 64 heads, MLP 18432 and the full 200064 vocabulary, read
            // from two work logs of people who loaded it; MHA (64 KV heads) from InferenceX's
            // recipe, which pins it to FLASH_ATTN because it is not GQA. head_dim 128 is
            // arithmetic: the GQA twin, identical but for 4 KV heads, is 6,149,993,396 bytes,
            // exactly these shapes in BF16 plus a 9 KB header; head_dim 96 would be 81 MB less.
            "minimax-m3-eagle3" => Ok(DraftArch {
                name: name.into(),
                hidden_size: 6144,
                num_heads: 64,
                num_kv_heads: 64,
                head_dim: 128,
                intermediate_size: 18432,
                draft_vocab_size: 200064,
                target_vocab_size: 200064,
                // vLLM's default for a 60-layer target, (2, N/2, N-3)
                capture_layers: vec![2, 30, 57],
                rms_norm_eps: 1e-6,
                rope_theta: 5_000_000.0,
                mla: None,
            }),
            other => Err(ArchError::UnknownDraftPreset {
                name: other.into(),
                known: DRAFT_PRESETS.join(", "),
            }),
        }
    }

    /// Reads an EAGLE-3 draft `config.json` (LlamaForCausalLMEagle3 style).
    pub fn from_config_file(path: &Path, target: &ModelArch) -> Result<DraftArch, ArchError> {
        let text = crate::input::read_text(path).map_err(|source| ArchError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|source| ArchError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let f = Fields { v: &v, path };
        let hidden_size = f.u32("hidden_size")?;
        let num_heads = f.u32("num_attention_heads")?;
        let capture_layers = v
            .pointer("/eagle_config/eagle_aux_hidden_state_layer_ids")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_else(|| target.eagle3_capture_layer_outputs().to_vec());
        Ok(DraftArch {
            name: path
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "draft".into()),
            hidden_size,
            num_heads,
            num_kv_heads: f.u32_or("num_key_value_heads", num_heads),
            head_dim: f.u32_or("head_dim", hidden_size / num_heads.max(1)),
            intermediate_size: f.u32("intermediate_size")?,
            draft_vocab_size: f.u32_or("draft_vocab_size", f.u32("vocab_size")?),
            target_vocab_size: f.u32_or("vocab_size", target.vocab_size),
            capture_layers,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6),
            rope_theta: f.f64_or("rope_theta", target.rope_theta),
            mla: match f.opt_u32("kv_lora_rank") {
                None => None,
                Some(kv_lora_rank) => Some(MlaDims {
                    q_lora_rank: f.opt_u32("q_lora_rank"),
                    kv_lora_rank,
                    qk_nope_head_dim: f.u32("qk_nope_head_dim")?,
                    qk_rope_head_dim: f.u32("qk_rope_head_dim")?,
                    v_head_dim: f.u32("v_head_dim")?,
                }),
            },
        })
    }

    /// KV bytes per token (BF16) of the draft's single layer: K and V per KV head, or the
    /// latent and its RoPE key.
    pub fn kv_bytes_per_token(&self) -> u64 {
        match &self.mla {
            Some(m) => 2 * (m.kv_lora_rank + m.qk_rope_head_dim) as u64,
            None => 2 * 2 * (self.num_kv_heads * self.head_dim) as u64,
        }
    }
}

struct Fields<'a> {
    v: &'a Value,
    path: &'a Path,
}

impl Fields<'_> {
    fn u32(&self, k: &str) -> Result<u32, ArchError> {
        self.opt_u32(k).ok_or_else(|| ArchError::Field {
            path: self.path.into(),
            field: k.into(),
            expected: "non-negative integer",
        })
    }
    fn opt_u32(&self, k: &str) -> Option<u32> {
        self.v.get(k).and_then(Value::as_u64).map(|x| x as u32)
    }
    fn u32_or(&self, k: &str, d: u32) -> u32 {
        self.opt_u32(k).unwrap_or(d)
    }
    fn f64_or(&self, k: &str, d: f64) -> f64 {
        self.v.get(k).and_then(Value::as_f64).unwrap_or(d)
    }
    fn str_or<'b>(&'b self, k: &str, d: &'b str) -> &'b str {
        self.v.get(k).and_then(Value::as_str).unwrap_or(d)
    }
}

fn parse_quant(q: &Value) -> Option<QuantInfo> {
    let method = q.get("quant_method")?.as_str()?.to_string();
    // FP8 checkpoints quantize every linear layer and run FP8 GEMMs: DeepSeek's fp32
    // scale per weight_block_size block, MXFP8's E8M0 scale per 32 weights.
    let block = q
        .get("weight_block_size")
        .and_then(Value::as_array)
        .map(|b| b.iter().filter_map(Value::as_u64).product::<u64>() as u32);
    let native = |group_size: u32, scale_bytes: f64| QuantInfo {
        method: method.clone(),
        num_bits: 8,
        group_size,
        symmetric: true,
        routed_experts_only: false,
        scale_bytes,
        math: QuantMath::Native,
    };
    match method.as_str() {
        "fp8" => return Some(native(block.unwrap_or(128 * 128), 4.0)),
        "mxfp8" => {
            return Some(QuantInfo {
                math: QuantMath::BlockScaled,
                ..native(block.unwrap_or(32), 1.0)
            })
        }
        _ => {}
    }
    // compressed-tensors nests the weight scheme under config_groups.<group>.weights.
    let weights = q
        .get("config_groups")
        .and_then(Value::as_object)
        .and_then(|groups| groups.values().next())
        .and_then(|g| g.get("weights"))
        .unwrap_or(q);
    let num_bits = weights.get("num_bits").and_then(Value::as_u64).unwrap_or(4) as u32;
    let group_size = weights
        .get("group_size")
        .and_then(Value::as_u64)
        .unwrap_or(32) as u32;
    let symmetric = weights
        .get("symmetric")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let routed_experts_only = q
        .get("ignore")
        .and_then(Value::as_array)
        .map(|a| !a.is_empty())
        .unwrap_or(false);
    Some(QuantInfo {
        method,
        num_bits,
        group_size,
        symmetric,
        routed_experts_only,
        scale_bytes: 2.0,
        math: QuantMath::WeightOnly,
    })
}

fn parse_rope_scaling(r: &Value) -> Option<RopeScaling> {
    if r.is_null() {
        return None;
    }
    let kind = r
        .get("type")
        .or_else(|| r.get("rope_type"))
        .and_then(Value::as_str)?
        .to_string();
    let num = |k: &str| r.get(k).and_then(Value::as_f64);
    Some(RopeScaling {
        kind,
        factor: num("factor").unwrap_or(1.0),
        original_max_position_embeddings: r
            .get("original_max_position_embeddings")
            .and_then(Value::as_u64),
        beta_fast: num("beta_fast"),
        beta_slow: num("beta_slow"),
        mscale: num("mscale"),
        mscale_all_dim: num("mscale_all_dim"),
        low_freq_factor: num("low_freq_factor"),
        high_freq_factor: num("high_freq_factor"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mla_draft_config_reads_as_the_mla_preset() {
        // the TorchSpec draft config's fields (Eagle3DeepseekV2ForCausalLM)
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"architectures": ["Eagle3DeepseekV2ForCausalLM"], "hidden_size": 7168,
                "intermediate_size": 18432, "num_hidden_layers": 1, "num_attention_heads": 64,
                "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
                "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                "rms_norm_eps": 1e-05, "vocab_size": 163840, "draft_vocab_size": 163840,
                "rope_theta": 50000.0,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}}"#,
        )
        .unwrap();
        let target = ModelArch::preset("kimi-k2.5").unwrap();
        let read = DraftArch::from_config_file(&path, &target).unwrap();
        let preset = DraftArch::preset("kimi-k2.5-eagle3-mla").unwrap();
        assert_eq!(read.mla, preset.mla);
        assert_eq!(
            (
                read.intermediate_size,
                read.draft_vocab_size,
                read.capture_layers.clone()
            ),
            (18432, 163840, vec![1, 29, 57])
        );
        // the latent and its RoPE key in bf16, where the MHA head holds K and V of 64 heads
        assert_eq!(preset.kv_bytes_per_token(), 1152);
        assert_eq!(
            DraftArch::preset("kimi-k2.5-eagle3")
                .unwrap()
                .kv_bytes_per_token(),
            32768
        );
    }

    #[test]
    fn kimi_capture_layers_match_sglang() {
        let k = ModelArch::preset("kimi-k2.5").unwrap();
        assert_eq!(k.eagle3_capture_layer_outputs(), [1, 29, 57]);
        assert_eq!(k.num_moe_layers(), 60);
        // 61 layers x 576 dims x 2 bytes = 70,272 bytes per token.
        assert_eq!(k.kv_bytes_per_token_per_layer() * 61, 70_272);
    }

    #[test]
    fn reads_kimi_k25_wrapper() {
        let cfg = serde_json::json!({
            "model_type": "kimi_k25",
            "text_config": {
                "model_type": "kimi_k2", "hidden_size": 64, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
                "intermediate_size": 128, "q_lora_rank": 32, "kv_lora_rank": 16,
                "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
                "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": true,
                "routed_scaling_factor": 2.827,
                "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
                "quantization_config": {"quant_method": "compressed-tensors",
                    "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32, "symmetric": true}}},
                    "ignore": ["lm_head"]}
            }
        });
        let a = ModelArch::from_config_value(&cfg, Path::new("m/config.json")).unwrap();
        assert_eq!(a.family, ArchFamily::MlaMoe);
        assert_eq!(a.tensor_prefix, "language_model.");
        assert_eq!(a.quant.as_ref().unwrap().group_size, 32);
        assert!((a.quant.unwrap().bytes_per_weight() - 0.5625).abs() < 1e-12);
        assert_eq!(a.rope_scaling.unwrap().kind, "yarn");
    }
}
