//! Per-pass calibration: the fit recovers a known factor, the per-layer prediction does not
//! depend on how many layers were measured, and bad stack profiles are named clearly.

use std::path::Path;

use kbench_sim::passes::{
    calibrate_passes, read_stack_profile, write_calibrated_profile, PassCalibration,
};
use kbench_sim::presets::preset;
use kbench_sim::{HardwareProfile, Provenance, SimError};

const BATCHES: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

/// A stack profile in the layout `kbench-gpu stack` writes (the root crate's tests check that
/// writer's real output parses too).
fn stack_text(hidden: u32, layers: u32, rows: &[(&str, u32, u32, f64)]) -> String {
    let mut s = format!(
        "[device]\nname = \"test device\"\ncompute_capability = \"9.0\"\n\n[stack]\nmodel = \"kimi-k2.5 slice\"\nlayers = {layers}\nhidden = {hidden}\nn_routed_experts = 384\ntop_k = 8\nmoe_intermediate = 2048\nheads = 64\nkv_lora_rank = 512\ncontext = 2048\npage_size = 64\nverify_tokens_per_request = 4\ndense_linears = \"cublas\"\n"
    );
    for (kind, batch, tokens, ms) in rows {
        s += &format!(
            "\n[[pass]]\nkind = {kind:?}\nbatch = {batch}\ntokens = {tokens}\nms = {ms}\nms_per_layer = {}\ncuda_graph = true\nactive_experts_last_layer = 100\n",
            ms / layers as f64
        );
    }
    s
}

fn all_rows(ms: impl Fn(usize) -> f64) -> Vec<(&'static str, u32, u32, f64)> {
    let mut v = vec![];
    for (kind, q) in [("decode", 1), ("verify", 4)] {
        for b in BATCHES {
            let i = v.len();
            v.push((kind, b, b * q, ms(i)));
        }
    }
    v
}

fn run(dir: &Path, text: &str, out: Option<&Path>) -> Result<PassCalibration, SimError> {
    let path = dir.join("profile.toml");
    std::fs::write(&path, text).unwrap();
    let base = preset("h200").unwrap();
    let mut r = calibrate_passes(&path, &base)?;
    if let Some(out) = out {
        write_calibrated_profile(&mut r, &base, out)?;
    }
    Ok(r)
}

#[test]
fn fit_recovers_a_known_factor_and_writes_a_loadable_profile() {
    let dir = tempfile::tempdir().unwrap();
    let layers = 3;
    let probe = run(
        dir.path(),
        &stack_text(7168, layers, &all_rows(|_| 1.0)),
        None,
    )
    .unwrap();
    // "Measured" = the model's own prediction x 1.3, with +-4% alternating noise.
    let measured = all_rows(|i| {
        let noise = if i % 2 == 0 { 1.04 } else { 0.96 };
        probe.rows[i].predicted_us_per_layer * layers as f64 / 1000.0 * 1.3 * noise
    });
    let out = dir.path().join("h200-calibrated.toml");
    let r = run(dir.path(), &stack_text(7168, layers, &measured), Some(&out)).unwrap();
    assert!(
        (r.in_model_after / 1.3 - 1.0).abs() < 0.01,
        "fitted {}",
        r.in_model_after
    );
    assert!(r.rms_error_before > 0.2, "before {}", r.rms_error_before);
    assert!(r.rms_error_after < 0.05, "after {}", r.rms_error_after);
    assert!(r.loo_rms_error < 0.06, "loo {}", r.loo_rms_error);
    for row in &r.rows {
        assert!(row.calibrated_error.abs() < 0.05, "{row:?}");
        assert!(!row.predicted_breakdown_us.is_empty());
        // Layers only: the logits head and embedding are not part of what the stack runs.
        assert!(!row.predicted_breakdown_us.contains_key("lm_head"));
        assert!(!row.predicted_breakdown_us.contains_key("embedding"));
        assert!(row
            .predicted_breakdown_us
            .contains_key("moe.routed_experts"));
    }
    let p = HardwareProfile::from_file(&out).unwrap();
    assert_eq!(p.efficiency.in_model.value, r.in_model_after);
    assert_eq!(p.efficiency.in_model.source, Provenance::Fitted);
    assert!(p.calibration.is_some());
    assert!(!dir.path().join("h200-calibrated.toml.tmp").exists());
}

#[test]
fn per_layer_prediction_does_not_depend_on_the_layer_count() {
    let dir = tempfile::tempdir().unwrap();
    let a = run(dir.path(), &stack_text(7168, 2, &all_rows(|_| 1.0)), None).unwrap();
    let b = run(dir.path(), &stack_text(7168, 4, &all_rows(|_| 1.0)), None).unwrap();
    for (x, y) in a.rows.iter().zip(&b.rows) {
        let rel = x.predicted_us_per_layer / y.predicted_us_per_layer - 1.0;
        assert!(rel.abs() < 1e-9, "{x:?} vs {y:?}");
    }
    // More tokens per decode pass never cost less per layer.
    for w in a.rows[..BATCHES.len()].windows(2) {
        assert!(w[1].predicted_us_per_layer >= w[0].predicted_us_per_layer);
    }
}

fn error_of(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let e = run(dir.path(), text, None).unwrap_err();
    let mut s = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(x) = src {
        s += &format!(" / {x}");
        src = x.source();
    }
    s
}

#[test]
fn another_architecture_is_refused() {
    let e = error_of(&stack_text(4096, 3, &all_rows(|_| 1.0)));
    assert!(e.contains("hidden = 4096, but Kimi-K2.5 has 7168"), "{e}");
}

#[test]
fn inconsistent_passes_are_named() {
    let mut rows = all_rows(|_| 1.0);
    rows[8].2 = 7;
    let e = error_of(&stack_text(7168, 3, &rows));
    assert!(
        e.contains("pass 9: 7 tokens for batch 2 of `verify` (expected 8)"),
        "{e}"
    );

    let mut rows = all_rows(|_| 1.0);
    rows[0].0 = "prefill";
    let e = error_of(&stack_text(7168, 3, &rows));
    assert!(e.contains("pass 1: kind `prefill`"), "{e}");

    let rows = all_rows(|i| if i == 3 { -1.0 } else { 1.0 });
    let e = error_of(&stack_text(7168, 3, &rows));
    assert!(e.contains("pass 4: ms = -1 is not a positive time"), "{e}");

    let e = error_of(&stack_text(7168, 3, &all_rows(|_| 1.0)[..1]));
    assert!(e.contains("at least 2"), "{e}");

    let e = error_of("[device]\nname = 3\n");
    assert!(e.contains("profile.toml"), "{e}");
}

#[test]
fn missing_file_is_named() {
    let e = read_stack_profile(Path::new("/nonexistent/profile.toml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/profile.toml"), "{e}");
}
