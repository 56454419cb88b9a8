//! The architectures the public speculative data needs: MiniMax-M3 is priced within the
//! context where its sparse attention is exactly dense and refused past it; DeepSeek-V4 is
//! refused by name with the reason.

use std::path::Path;

use kbench_core::arch::{ArchError, ModelArch};
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

#[test]
fn minimax_m3_past_its_dense_window_is_refused() {
    let e = minimax(&["workload.input_len=8192"]);
    let err = SimBackend::new(&e, None)
        .err()
        .expect("8k prompts are refused");
    let msg = err.to_string();
    assert!(msg.contains("MSA") && msg.contains("2048"), "{msg}");
    let e = minimax(&["benchmark.concurrency=[1]"]);
    assert!(SimBackend::new(&e, None).is_ok());
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
