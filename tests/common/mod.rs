//! Shared helpers for the CLI's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the built `kbench` binary in `dir`; returns (exit code, stdout, stderr).
pub fn kbench(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("the kbench binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A minimal valid experiment (sim backend, no speculation) to derive bad inputs from.
pub const BASE: &str = r#"name = "t"
seed = 1

[model]
preset = "kimi-k2.5"

[hardware]
preset = "8x-rtx-pro-6000-server"

[server]
tp_size = 8

[workload]
max_tokens = 16
input_len = 32

[benchmark]
concurrency = [1, 2]
requests_per_level = 4
"#;

pub const SPEC: &str = r#"name = "t"
seed = 1

[model]
preset = "kimi-k2.5"

[draft]
preset = "kimi-k2.5-eagle3"

[hardware]
preset = "8x-rtx-pro-6000-server"

[server]
tp_size = 8

[speculative]
algorithm = "EAGLE3"
num_steps = 2
eagle_topk = 1
num_draft_tokens = 3
spec_v2 = true

[workload]
trace = "trace.kbt"
max_tokens = 16
input_len = 32

[benchmark]
concurrency = [1, 2]
requests_per_level = 4
"#;
