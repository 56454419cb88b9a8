//! Shared helpers for the tests that price a pass under an edited engine profile: the shipped
//! `vllm-8x-h200` with one section changed, a one-level experiment naming it, and the decode
//! step's breakdown.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_sim::{acceptance_for, PassBreakdown, SimBackend};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shipped `vllm-8x-h200` engine profile's text.
pub fn vllm_h200_profile() -> String {
    std::fs::read_to_string(root().join("experiments/engines/vllm-8x-h200.toml")).unwrap()
}

/// `text` with the section that starts at `header` (up to the next blank line) replaced by
/// `section`.
pub fn replace_section(text: &str, header: &str, section: &str) -> String {
    let start = text.find(header).unwrap();
    let end = start + text[start..].find("\n\n").unwrap();
    format!("{}{section}{}", &text[..start], &text[end..])
}

/// Writes `text` to `dir/name` and returns its path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `model` at TP8 under vLLM with the engine profile at `profile`, on the box `hardware` names
/// (a `[hardware]` line: `preset = "8x-h200"` or `profile = "..."`): one level of one client.
pub fn experiment(model: &str, hardware: &str, profile: &Path) -> Experiment {
    let text = format!(
        "name = \"t\"\nseed = 3\n[model]\npreset = \"{model}\"\n[hardware]\n{hardware}\n\
         [engine]\nname = \"vllm\"\nprofile = \"{}\"\n[server]\ntp_size = 8\n[workload]\nmax_tokens = 8\n\
         input_len = 1000\n[benchmark]\nconcurrency = [1]\nrequests_per_level = 3\nwarmup_requests = 0\n",
        profile.display()
    );
    load_experiment_str(&text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

/// The plain decode step of `bs` requests at context `ctx`, explained.
pub fn decode_step(e: &Experiment, bs: u32, ctx: f64) -> PassBreakdown {
    SimBackend::new(e, acceptance_for(e).unwrap())
        .unwrap()
        .explain_round(bs, ctx)
        .unwrap()
        .passes
        .remove(0)
}
