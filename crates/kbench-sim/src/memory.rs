//! Whether a model's weights fit the GPUs an experiment names: a configuration SGLang could
//! not load must not get a throughput prediction.
//!
//! Weights per GPU follow SGLang's sharding at tensor-parallel size tp: attention heads
//! (q_b / kv_b / o_proj), the MLP and shared-expert intermediate, the routed experts and the
//! vocabulary (embedding, lm_head) are split over the ranks; the low-rank q_a / kv_a
//! projections, norms and the router are replicated. Routed experts take the checkpoint's
//! quantized bytes per weight (INT4 group-32: 0.5 + 2/32), everything else BF16. The EAGLE-3
//! draft is counted with the same sharding.

use std::borrow::Cow;

use kbench_core::arch::{ArchFamily, DraftArch, ModelArch};
use kbench_core::experiment::{Algorithm, SpeculativeConfig};
use serde::Serialize;

use crate::error::SimError;
use crate::profile::HardwareProfile;

/// The share of a GPU's memory SGLang gives weights plus the KV pool (`mem_fraction_static`
/// is about 0.88 to 0.9 on large GPUs); the rest holds activations, CUDA graphs and NCCL.
pub const STATIC_FRACTION: f64 = 0.9;

const BF16: f64 = 2.0;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WeightFootprint {
    /// The whole checkpoint (target + draft), bytes.
    pub total_bytes: f64,
    /// The target's routed experts, bytes (all ranks).
    pub routed_expert_bytes: f64,
    /// What one tensor-parallel rank holds, bytes.
    pub per_gpu_bytes: f64,
}

/// The target as a run loads it: drafting with MTP (vLLM's `mtp`, SGLang's NEXTN) also
/// loads the checkpoint's MTP layers, each one more decoder layer (MLA and MoE for DeepSeek)
/// with a KV cache of its own; `mtp_projection_bytes` adds what sits beside that layer.
pub fn as_loaded<'a>(model: &'a ModelArch, spec: &SpeculativeConfig) -> Cow<'a, ModelArch> {
    if spec.is_speculative() && spec.algorithm == Algorithm::Mtp && model.mtp_layers > 0 {
        let mut loaded = model.clone();
        loaded.num_layers += model.mtp_layers;
        Cow::Owned(loaded)
    } else {
        Cow::Borrowed(model)
    }
}

/// What each loaded MTP layer holds beside its decoder layer, on every rank: `eh_proj`
/// (2h -> h over [embedding; hidden], BF16 in the checkpoints and a plain replicated linear
/// in vLLM's deepseek_mtp.py and SGLang's deepseek_nextn.py) and the `enorm`, `hnorm` and
/// head norms: about 0.2 GB for DeepSeek-V3. Its embedding and head are the target's.
pub fn mtp_projection_bytes(model: &ModelArch, spec: &SpeculativeConfig) -> f64 {
    if !(spec.is_speculative() && spec.algorithm == Algorithm::Mtp) {
        return 0.0;
    }
    let h = model.hidden_size as f64;
    model.mtp_layers as f64 * (2.0 * h * h + 3.0 * h) * BF16
}

/// The weights as a run loads them (`as_loaded`, and the MTP layers' projections).
pub fn loaded_weight_footprint(
    model: &ModelArch,
    spec: &SpeculativeConfig,
    draft: Option<&DraftArch>,
    tp: u32,
) -> WeightFootprint {
    let mut f = weight_footprint(&as_loaded(model, spec), draft, tp);
    let extra = mtp_projection_bytes(model, spec);
    f.total_bytes += extra;
    f.per_gpu_bytes += extra;
    f
}

/// Bytes of weights, in all and per rank at `tp`.
pub fn weight_footprint(model: &ModelArch, draft: Option<&DraftArch>, tp: u32) -> WeightFootprint {
    let tp = tp.max(1) as f64;
    let h = model.hidden_size as f64;
    let layers = model.num_layers as f64;
    let moe_layers = model.num_moe_layers() as f64;
    let dense_layers = layers - moe_layers;
    let heads = model.num_heads as f64;
    // (replicated, sharded) bytes
    let mut rep = 0.0;
    let mut shard = 0.0;

    // the linear layers outside the routed experts: BF16 unless every one is quantized
    let dw = model.dense_bytes_per_weight();
    match (&model.family, &model.mla) {
        (ArchFamily::MlaMoe, Some(m)) => {
            let qk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
            let latent = (m.kv_lora_rank + m.qk_rope_head_dim) as f64;
            let kv_lora = m.kv_lora_rank as f64;
            match m.q_lora_rank {
                Some(q) => {
                    let q = q as f64;
                    rep += layers * h * q * dw + layers * q * BF16;
                    shard += layers * q * heads * qk * dw;
                }
                None => shard += layers * h * heads * qk * dw,
            }
            rep += layers * h * latent * dw + layers * kv_lora * BF16;
            shard += layers * kv_lora * heads * (m.qk_nope_head_dim + m.v_head_dim) as f64 * dw;
            shard += layers * heads * m.v_head_dim as f64 * h * dw;
        }
        _ => {
            let hd = model.head_dim as f64;
            let kv = model.num_kv_heads as f64;
            shard += layers * h * (heads + 2.0 * kv) * hd * dw;
            shard += layers * heads * hd * h * dw;
        }
    }
    rep += layers * 2.0 * h * BF16; // the two RMSNorms of every layer
    shard += dense_layers * 3.0 * h * model.intermediate_size as f64 * dw;
    let mut routed = 0.0;
    if let Some(moe) = &model.moe {
        let inter = moe.moe_intermediate_size as f64;
        let bpw = model
            .quant
            .as_ref()
            .map(|q| q.bytes_per_weight())
            .unwrap_or(BF16);
        routed = moe_layers * moe.n_routed_experts as f64 * 3.0 * h * inter * bpw;
        shard += routed;
        shard += moe_layers * moe.n_shared_experts as f64 * 3.0 * h * inter * dw;
        rep += moe_layers * moe.n_routed_experts as f64 * (h + 1.0) * BF16; // router + bias
    }
    let vocab = model.vocab_size as f64;
    let heads_of_vocab = if model.tie_word_embeddings { 1.0 } else { 2.0 };
    shard += heads_of_vocab * vocab * h * BF16;
    rep += h * BF16;

    if let Some(d) = draft {
        let dh = d.hidden_size as f64;
        let hd = d.head_dim as f64;
        let dheads = d.num_heads as f64;
        rep += 3.0 * dh * dh * BF16; // fc over the three captured hidden states
        match &d.mla {
            // vLLM's DeepseekV2MLAAttention with input_size 2 x hidden (deepseek_eagle3.py)
            Some(m) => {
                let qk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
                let latent = (m.kv_lora_rank + m.qk_rope_head_dim) as f64;
                let q = m.q_lora_rank.map_or(0.0, f64::from);
                rep += 2.0 * dh * (q + latent) * BF16;
                shard += if q > 0.0 { q } else { 2.0 * dh } * dheads * qk * BF16;
                shard += m.kv_lora_rank as f64
                    * dheads
                    * (m.qk_nope_head_dim + m.v_head_dim) as f64
                    * BF16;
                shard += dheads * m.v_head_dim as f64 * dh * BF16;
            }
            None => {
                shard += 2.0 * dh * (dheads + 2.0 * d.num_kv_heads as f64) * hd * BF16;
                shard += dheads * hd * dh * BF16;
            }
        }
        shard += 3.0 * dh * d.intermediate_size as f64 * BF16;
        shard += d.draft_vocab_size as f64 * dh * BF16;
        rep += 4.0 * dh * BF16;
    }
    WeightFootprint {
        total_bytes: rep + shard,
        routed_expert_bytes: routed,
        per_gpu_bytes: rep + shard / tp,
    }
}

/// `Ok` with the footprint when one rank's weights fit `STATIC_FRACTION` of a GPU's memory;
/// else the error says how much is needed and what would fit.
pub fn check_weights_fit(
    profile: &HardwareProfile,
    model: &ModelArch,
    spec: &SpeculativeConfig,
    draft: Option<&DraftArch>,
    tp: u32,
) -> Result<WeightFootprint, SimError> {
    let f = loaded_weight_footprint(model, spec, draft, tp);
    let gpu_bytes = profile.gpu.memory_gib.value * (1u64 << 30) as f64;
    let budget = gpu_bytes * STATIC_FRACTION;
    if f.per_gpu_bytes > budget {
        let min_tp = (1..=profile.gpu.count)
            .filter(|t| model.num_heads % t == 0)
            .find(|&t| loaded_weight_footprint(model, spec, draft, t).per_gpu_bytes <= budget);
        let hint = match min_tp {
            Some(t) => format!("it fits at tp_size {t}"),
            None => format!(
                "it fits at no tp_size up to the profile's {} GPU(s): use a profile with more or larger GPUs",
                profile.gpu.count
            ),
        };
        return Err(SimError::DoesNotFit(format!(
            "{} does not fit: its weights take {:.1} GB, {:.1} GB per GPU at tp_size {tp}, more than {:.0}% of one {}'s {:.1} GiB ({:.1} GB); {hint}",
            model.name,
            f.total_bytes / 1e9,
            f.per_gpu_bytes / 1e9,
            STATIC_FRACTION * 100.0,
            profile.gpu.name,
            profile.gpu.memory_gib.value,
            budget / 1e9,
        )));
    }
    Ok(f)
}
