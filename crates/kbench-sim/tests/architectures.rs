//! The architectures the public speculative data needs: MiniMax-M3, its sparse attention
//! priced within the window where it is exactly dense and past it; DeepSeek-V4, refused by
//! name with the reason.

use std::path::Path;

use kbench_core::arch::{ArchError, DraftArch, ModelArch};
use kbench_core::experiment::load_experiment;
use kbench_sim::memory::weight_footprint;
use kbench_sim::SimBackend;

fn minimax(set: &[&str]) -> kbench_core::experiment::Experiment {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/validation/experiments/minimax-m3-vllm.toml");
    let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
    load_experiment(&path, &set).unwrap().remove(0).experiment
}

#[test]
fn minimax_m3_weights_match_the_released_checkpoint() {
    // MiniMax-M3-MXFP8: 443,776,005,285 bytes in 31 shards, vision tower included
    // (docs/research/models.md); the text model is most of it
    let m = ModelArch::preset("minimax-m3").unwrap();
    let f = weight_footprint(&m, None, 8);
    let total_gb = f.total_bytes / 1e9;
    assert!(total_gb > 400.0 && total_gb < 444.0, "{total_gb:.1} GB");
}

/// What a MiniMax-M3 EAGLE-3 head's checkpoint holds beyond what serving loads: its own copy
/// of the embedding, which vLLM replaces with the target's, and the three per-capture
/// RMSNorms before the fc.
fn m3_head_checkpoint_bytes(draft: &DraftArch) -> f64 {
    let m = ModelArch::preset("minimax-m3").unwrap();
    let served = weight_footprint(&m, Some(draft), 1).total_bytes
        - weight_footprint(&m, None, 1).total_bytes;
    let h = draft.hidden_size as f64;
    served + draft.target_vocab_size as f64 * h * 2.0 + 3.0 * h * 2.0
}

#[test]
fn minimax_m3_eagle3_shapes_match_the_published_checkpoints() {
    let mha = DraftArch::preset("minimax-m3-eagle3").unwrap();
    // Inferact/MiniMax-M3-EAGLE3-GQA@96692486: 6,149,993,396 bytes in one safetensors file,
    // the same config but 4 KV heads; a file's JSON header is a few KB
    let gqa = DraftArch {
        num_kv_heads: 4,
        ..mha.clone()
    };
    let header = 6_149_993_396.0 - m3_head_checkpoint_bytes(&gqa);
    assert!((0.0..16_384.0).contains(&header), "header {header} bytes");
    // head_dim 96 (hidden / heads) would miss it by tens of MB
    let narrow = DraftArch {
        head_dim: 96,
        ..gqa
    };
    assert!(6_149_993_396.0 - m3_head_checkpoint_bytes(&narrow) > 50e6);
    // and the MHA head is the "6.5 GB bf16" its users report
    let gb = m3_head_checkpoint_bytes(&mha) / 1e9;
    assert!((6.45..6.55).contains(&gb), "{gb:.3} GB");
}

/// Past MSA's window an experiment runs (it was refused before the window was priced), and
/// one request decodes after an 8k prompt about as fast as after a 1k one, as InferenceX
/// measured (7.21 against 7.15 ms plain at C=1 on 8x H200 TP4); the sparse layers' reads
/// themselves are checked in sparse_attention.rs.
#[test]
fn minimax_m3_past_its_dense_window_decodes_at_its_window() {
    let tpot = |set: &[&str]| {
        let mut set = set.to_vec();
        set.extend([
            "benchmark.concurrency=[1]",
            "benchmark.requests_per_level=2",
        ]);
        let e = minimax(&set);
        let mut b = SimBackend::new(&e, None).unwrap();
        let (levels, _) = kbench_sim::predict::run(&e, &mut b).unwrap();
        levels[0].metrics.mean_tpot_ms
    };
    let short = tpot(&[]);
    // InferenceX's 8k1k runs pass --max-model-len 9472 and a 16,384-token budget
    let long = tpot(&[
        "workload.input_len=8192",
        "server.max_model_len=9472",
        "engine.max_num_batched_tokens=16384",
    ]);
    assert!(
        long >= short && long < short * 1.05,
        "{short:.2} ms after 1k prompts, {long:.2} ms after 8k"
    );
}

#[test]
fn deepseek_v4_is_refused_by_name() {
    for name in ["deepseek-v4-pro", "deepseek-v4-flash"] {
        let err = ModelArch::preset(name).unwrap_err();
        assert!(matches!(err, ArchError::NotModelled { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("compressed attention") && msg.contains("mHC"),
            "{msg}"
        );
    }
    let cfg = serde_json::json!({"model_type": "deepseek_v4", "hidden_size": 7168});
    let err = ModelArch::from_config_value(&cfg, Path::new("dsv4/config.json")).unwrap_err();
    assert!(matches!(err, ArchError::NotModelled { .. }), "{err}");
}
