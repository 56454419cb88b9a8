//! The experiment file as written on disk (TOML). Every table rejects unknown keys so a
//! typo is an error, not a silently ignored setting.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub seed: u64,
    /// What the file assumes where its source is silent, shown in the report.
    #[serde(default)]
    pub assumptions: Vec<String>,
    pub model: ModelSection,
    #[serde(default)]
    pub draft: Option<DraftSection>,
    pub hardware: HardwareSection,
    pub server: ServerSection,
    #[serde(default)]
    pub speculative: SpeculativeSection,
    pub workload: WorkloadSection,
    pub benchmark: BenchmarkSection,
    #[serde(default)]
    pub backend: BackendSection,
    #[serde(default)]
    pub reference: Option<ReferenceSection>,
    /// A declared sweep: each variant is this experiment with some keys overridden.
    #[serde(default)]
    pub sweep: Option<SweepSection>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A preset name (`kimi-k2.5`, `deepseek-v3`, `llama-3.1-8b`).
    #[serde(default)]
    pub preset: Option<String>,
    /// A HF `config.json`, relative to the experiment file.
    #[serde(default)]
    pub config: Option<String>,
    /// If `config` does not exist yet, kbench creates the model there (`kbench model init`).
    #[serde(default)]
    pub init: Option<ModelInitSection>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInitSection {
    /// `tiny` or `kimi-slice`.
    pub preset: String,
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "default_draft_quality")]
    pub draft_quality: f32,
    #[serde(default)]
    pub layers: Option<u32>,
}

fn default_draft_quality() -> f32 {
    0.8
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftSection {
    #[serde(default)]
    pub preset: Option<String>,
    #[serde(default)]
    pub config: Option<String>,
    #[serde(default)]
    pub hidden_size: Option<u32>,
    #[serde(default)]
    pub num_heads: Option<u32>,
    #[serde(default)]
    pub num_kv_heads: Option<u32>,
    #[serde(default)]
    pub intermediate_size: Option<u32>,
    #[serde(default)]
    pub draft_vocab_size: Option<u32>,
    #[serde(default)]
    pub capture_layers: Option<Vec<u32>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareSection {
    #[serde(default)]
    pub preset: Option<String>,
    /// A hardware profile TOML, relative to the experiment file.
    #[serde(default)]
    pub profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub tp_size: u32,
    #[serde(default)]
    pub max_running_requests: Option<u32>,
    #[serde(default)]
    pub cuda_graph_max_bs: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Algorithm {
    #[default]
    #[serde(rename = "none", alias = "NONE")]
    None,
    #[serde(rename = "EAGLE3", alias = "eagle3")]
    Eagle3,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeSection {
    #[serde(default)]
    pub algorithm: Algorithm,
    #[serde(default)]
    pub num_steps: Option<u32>,
    #[serde(default)]
    pub eagle_topk: Option<u32>,
    #[serde(default)]
    pub num_draft_tokens: Option<u32>,
    /// SGLANG_ENABLE_SPEC_V2: the overlap scheduler.
    #[serde(default)]
    pub spec_v2: bool,
    /// Turn speculation off for a round whose batch exceeds this (the seed's fork has such
    /// a switch; upstream SGLang does not). Reported as non-upstream.
    #[serde(default)]
    pub disable_batch_threshold: Option<u32>,
    /// Allow settings SGLang rejects (e.g. v2 with trees) for what-if studies.
    #[serde(default)]
    pub allow_unsupported: bool,
    /// `greedy` (default), `target_only` (SGLang's tree sampling) or `exact` (lossless).
    #[serde(default)]
    pub verify: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSection {
    /// Acceptance trace (sim backend), relative to the experiment file.
    #[serde(default)]
    pub trace: Option<String>,
    pub max_tokens: u32,
    /// Prompt length in tokens; a fixed value...
    #[serde(default)]
    pub input_len: Option<u32>,
    /// ...or an inclusive range, sampled per request from the experiment seed.
    #[serde(default)]
    pub input_len_range: Option<[u32; 2]>,
    #[serde(default)]
    pub temperature: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchmarkSection {
    pub concurrency: Vec<i64>,
    pub requests_per_level: i64,
    #[serde(default)]
    pub warmup_requests: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    /// `sim` (default) or `engine`.
    #[serde(default = "default_backend")]
    pub kind: String,
    /// Engine backend: target model directory (config.json, safetensors, tokenizer.json).
    #[serde(default)]
    pub model_dir: Option<String>,
    /// Engine backend: EAGLE-3 draft directory (default: model_dir/draft).
    #[serde(default)]
    pub draft_dir: Option<String>,
    /// Engine backend: `cpu` or `cuda`.
    #[serde(default)]
    pub device: Option<String>,
    /// Engine backend on CUDA: which kernels run the target, `auto` (default: the tuned bf16
    /// kernels when the model's dimensions fit them), `exact` (f32, token-equal to the CPU)
    /// or `tuned`.
    #[serde(default)]
    pub kernels: Option<String>,
}

fn default_backend() -> String {
    "sim".into()
}

impl Default for BackendSection {
    fn default() -> Self {
        BackendSection {
            kind: default_backend(),
            model_dir: None,
            draft_dir: None,
            device: None,
            kernels: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceSection {
    pub source: String,
    #[serde(default)]
    pub note: Option<String>,
    #[serde(default)]
    pub points: Vec<ReferencePoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferencePoint {
    /// `output_throughput` at a concurrency, or `saturation_output_throughput`.
    pub metric: String,
    #[serde(default)]
    pub concurrency: Option<u32>,
    pub value: f64,
    #[serde(default)]
    pub approximate: bool,
    #[serde(default)]
    pub label: Option<String>,
    /// Sweep variant this point belongs to (sweep files only).
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSection {
    pub variants: Vec<SweepVariant>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepVariant {
    pub name: String,
    /// Dotted keys to override, as with `--set`.
    pub set: BTreeMap<String, toml::Value>,
}
