//! `launch.kernel_gap_us`: GPU time at each kernel boundary of a pass, which an operator's own
//! price (one kernel measured alone) leaves out; and what it does to MiniMax-M3's decode step,
//! whose uncompiled forward replays every small operator as a kernel of its own.

mod support;

use std::path::{Path, PathBuf};

use kbench_core::experiment::{load_experiment, Experiment};
use kbench_sim::{acceptance_for, SimBackend};
use support::{decode_step, experiment, root, vllm_h200_profile, write};

/// vllm-8x-h200 with `launch.kernel_gap_us` set to `gap`, written to `dir`.
fn profile_with_gap(dir: &Path, gap: f64) -> PathBuf {
    let text = vllm_h200_profile().replacen(
        "[host.decode_step_us]",
        &format!(
            "[launch.kernel_gap_us]\nvalue = {gap}\nsource = \"prior\"\nref = \"test\"\n\n[host.decode_step_us]"
        ),
        1,
    );
    write(dir, &format!("gap-{gap}.toml"), &text)
}

fn kimi(profile: &Path) -> Experiment {
    experiment("kimi-k2.5", "preset = \"8x-h200\"", profile)
}

#[test]
fn each_kernel_boundary_adds_the_profiles_gap_to_the_pass() {
    let dir = tempfile::tempdir().unwrap();
    let without = decode_step(&kimi(&profile_with_gap(dir.path(), 0.0)), 1, 1536.0);
    let with = decode_step(&kimi(&profile_with_gap(dir.path(), 2.0)), 1, 1536.0);
    assert!(!without.gpu_us.contains_key("kernel_gaps"));
    let gaps = with.gpu_us["kernel_gaps"];
    assert!(with.operators > 500, "{} operators", with.operators);
    assert!((gaps - 2.0 * with.operators as f64).abs() < 1e-9, "{gaps}");
    assert!(
        (with.gpu_total_us - without.gpu_total_us - gaps).abs() < 1e-6,
        "{} - {} != {gaps}",
        with.gpu_total_us,
        without.gpu_total_us
    );
}

/// InferenceX's MiniMax-M3 plain 1k1k sweeps at C=1 (mean TPOT, ms): the step measures
/// nearly the same on every box, and TP4 is the slower one (see hardware_scaling.rs for the
/// source).
const M3_C1_TPOT_MS: &[(&str, u32, f64)] = &[("8x-h200", 8, 6.79), ("8x-h200", 4, 7.15)];

fn m3_step_ms(hardware: &str, tp: u32) -> f64 {
    let set = [
        format!("hardware.preset=\"{hardware}\""),
        format!("server.tp_size={tp}"),
    ];
    let path = root().join("data/validation/experiments/minimax-m3-vllm.toml");
    let e = load_experiment(&path, &set).unwrap().remove(0).experiment;
    let b = SimBackend::new(&e, acceptance_for(&e).unwrap()).unwrap();
    b.explain_round(1, 1536.0).unwrap().total_us / 1e3
}

#[test]
fn m3s_decode_step_is_slower_at_tp4_than_at_tp8_as_measured() {
    let steps: Vec<f64> = M3_C1_TPOT_MS
        .iter()
        .map(|&(hw, tp, _)| m3_step_ms(hw, tp))
        .collect();
    assert!(
        steps[1] > steps[0],
        "TP4 {} ms, TP8 {} ms",
        steps[1],
        steps[0]
    );
    for (&(hw, tp, measured), &step) in M3_C1_TPOT_MS.iter().zip(&steps) {
        let error = step / measured - 1.0;
        assert!(
            error.abs() < 0.06,
            "{hw} TP{tp}: step {step:.2} ms against a measured TPOT of {measured} ms ({:+.1}%)",
            error * 100.0
        );
    }
}
