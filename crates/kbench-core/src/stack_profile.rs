//! The GPU layer-stack profile: what `kbench-gpu stack` measures on a GPU (scripts/gpu-check.sh
//! writes it as `profile.toml`) and `kbench calibrate-passes` fits the cost model to. One
//! type for the writer and the reader, so the two cannot drift apart. Keys the reader does
//! not need are optional, so that profiles from older writers still read.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackProfile {
    pub device: StackDevice,
    pub stack: StackInfo,
    #[serde(default)]
    pub pass: Vec<StackPass>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackDevice {
    pub name: String,
    /// `major.minor`.
    #[serde(default)]
    pub compute_capability: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_mem_bytes: Option<u64>,
    /// The driver's CUDA version as the driver API reports it (13000 for 13.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_cuda_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackInfo {
    pub model: String,
    pub layers: u32,
    pub hidden: u32,
    pub n_routed_experts: u32,
    pub top_k: u32,
    pub moe_intermediate: u32,
    pub heads: u32,
    pub kv_lora_rank: u32,
    pub context: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u32>,
    pub verify_tokens_per_request: u32,
    /// How the stack's weights were made (random: the times do not depend on their values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
    /// `cublas` or `own`: which kernels ran the dense BF16 projections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense_linears: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackPass {
    /// `decode` or `verify`.
    pub kind: String,
    pub batch: u32,
    pub tokens: u32,
    /// The whole pass (all `layers`); the per-layer time is derived from it.
    pub ms: f64,
    /// Informational: `ms / layers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms_per_layer: Option<f64>,
    pub cuda_graph: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_experts_last_layer: Option<i64>,
}

impl StackProfile {
    /// The profile as TOML, after `comment` (each of its lines written as a `#` comment).
    pub fn to_toml(&self, comment: &str) -> String {
        let mut out: String = comment.lines().map(|l| format!("# {l}\n")).collect();
        // every field is a plain number, string or bool: serialising cannot fail
        out.push_str(&toml::to_string(self).unwrap_or_default());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_reads_back_as_written_and_old_ones_still_read() {
        let p = StackProfile {
            device: StackDevice {
                name: "NVIDIA H200".into(),
                compute_capability: "9.0".into(),
                sm_count: Some(132),
                l2_bytes: None,
                total_mem_bytes: None,
                driver_cuda_version: Some(13000),
                driver: None,
            },
            stack: StackInfo {
                model: "kimi-k2.5 slice".into(),
                layers: 3,
                hidden: 7168,
                n_routed_experts: 384,
                top_k: 8,
                moe_intermediate: 2048,
                heads: 64,
                kv_lora_rank: 512,
                context: 2048,
                page_size: Some(64),
                verify_tokens_per_request: 4,
                weights: None,
                dense_linears: Some("cublas".into()),
            },
            pass: vec![StackPass {
                kind: "decode".into(),
                batch: 1,
                tokens: 1,
                ms: 1.23456,
                ms_per_layer: Some(0.41152),
                cuda_graph: true,
                active_experts_last_layer: Some(8),
            }],
        };
        let text = p.to_toml("measured\non a GPU");
        assert!(text.starts_with("# measured\n# on a GPU\n"), "{text}");
        assert_eq!(toml::from_str::<StackProfile>(&text).unwrap(), p);
        let minimal = "[device]\nname = \"x\"\n[stack]\nmodel = \"m\"\nlayers = 1\nhidden = 1\nn_routed_experts = 1\ntop_k = 1\nmoe_intermediate = 1\nheads = 1\nkv_lora_rank = 1\ncontext = 1\nverify_tokens_per_request = 4\nunknown_key = 3\n";
        let read: StackProfile = toml::from_str(minimal).unwrap();
        assert!(read.pass.is_empty() && read.stack.dense_linears.is_none());
    }
}
