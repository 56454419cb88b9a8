//! `kbench calibrate-passes` over a GPU layer-stack profile: the report, the files it writes,
//! and bad input.

mod common;

use common::kbench;

/// A stack profile with every decode / verify pass of gpu-check.sh, `ms(tokens)` per pass.
fn stack_profile(hidden: u32, ms: impl Fn(u32) -> f64) -> String {
    let mut s = format!("[device]\nname = \"test device\"\ncompute_capability = \"9.0\"\n\n[stack]\nmodel = \"kimi-k2.5 slice\"\nlayers = 3\nhidden = {hidden}\nn_routed_experts = 384\ntop_k = 8\nmoe_intermediate = 2048\nheads = 64\nkv_lora_rank = 512\ncontext = 2048\npage_size = 64\nverify_tokens_per_request = 4\n");
    for (kind, q) in [("decode", 1u32), ("verify", 4)] {
        for b in [1u32, 2, 4, 8, 16, 32, 64] {
            s += &format!("\n[[pass]]\nkind = {kind:?}\nbatch = {b}\ntokens = {}\nms = {}\nms_per_layer = {}\ncuda_graph = true\n", b * q, ms(b * q), ms(b * q) / 3.0);
        }
    }
    s
}

#[test]
fn calibrate_passes_reports_and_writes_profile_and_json() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("profile.toml"),
        stack_profile(7168, |t| 1.5 + 0.02 * t as f64),
    )
    .unwrap();
    let args = [
        "calibrate-passes",
        "profile.toml",
        "--hardware",
        "h200",
        "--out",
        "h200-measured.toml",
        "--json",
        "passes.json",
    ];
    let (code, stdout, stderr) = kbench(dir.path(), &args);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("efficiency.in_model 1.0000 -> "),
        "{stdout}"
    );
    assert_eq!(stdout.lines().filter(|l| l.contains(" decode ")).count(), 7);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("passes.json")).unwrap())
            .unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 14);
    // The written profile is a working hardware profile.
    let (code, _, stderr) = kbench(
        dir.path(),
        &[
            "calibrate-passes",
            "profile.toml",
            "--hardware",
            "h200-measured.toml",
            "-q",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    // Same inputs, same bytes.
    let first = std::fs::read(dir.path().join("h200-measured.toml")).unwrap();
    let (code, again, _) = kbench(dir.path(), &args);
    assert_eq!(code, 0);
    assert_eq!(again, stdout);
    assert_eq!(
        std::fs::read(dir.path().join("h200-measured.toml")).unwrap(),
        first
    );
}

#[test]
fn calibrate_passes_refuses_another_architecture() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("profile.toml"),
        stack_profile(4096, |_| 1.0),
    )
    .unwrap();
    let (code, stdout, stderr) = kbench(dir.path(), &["calibrate-passes", "profile.toml"]);
    insta::assert_snapshot!(format!(
        "exit code: {code}\nstdout:\n{stdout}stderr:\n{stderr}"
    ));
}

#[test]
fn calibrate_passes_unwritable_output_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("profile.toml"),
        stack_profile(7168, |t| 1.5 + 0.02 * t as f64),
    )
    .unwrap();
    let (code, _, stderr) = kbench(
        dir.path(),
        &[
            "calibrate-passes",
            "profile.toml",
            "--out",
            "no/such/dir/out.toml",
            "-q",
        ],
    );
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("cannot write"), "{stderr}");
    assert!(!stderr.contains("panicked"));
}

#[test]
fn calibrate_passes_refuses_an_implausible_factor() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("profile.toml"),
        stack_profile(7168, |_| 100.0),
    )
    .unwrap();
    let (code, _, stderr) = kbench(
        dir.path(),
        &[
            "calibrate-passes",
            "profile.toml",
            "--out",
            "out.toml",
            "-q",
        ],
    );
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("efficiency.in_model would be"), "{stderr}");
    assert!(stderr.contains("out.toml not written"), "{stderr}");
    assert!(!dir.path().join("out.toml").exists());
    // the comparison is still shown: it is what explains the refusal
    let (code, stdout, _) = kbench(
        dir.path(),
        &["calibrate-passes", "profile.toml", "--out", "out.toml"],
    );
    assert_eq!(code, 3);
    assert_eq!(
        stdout.lines().filter(|l| l.contains(" decode ")).count(),
        7,
        "{stdout}"
    );
}

#[test]
fn calibrate_passes_unknown_hardware_lists_presets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("profile.toml"),
        stack_profile(7168, |_| 1.0),
    )
    .unwrap();
    let (code, _, stderr) = kbench(
        dir.path(),
        &["calibrate-passes", "profile.toml", "--hardware", "h100"],
    );
    assert_eq!(code, 3);
    assert!(
        stderr.contains("unknown hardware preset `h100`"),
        "{stderr}"
    );
    assert!(stderr.contains("h200"), "{stderr}");
}

/// The profile `kbench-gpu stack` writes on a GPU is exactly what `calibrate-passes` reads.
#[test]
fn kbench_gpu_stack_profile_is_read_by_calibrate_passes() {
    use kbench_gpucheck::bench::{stack_profile_toml, StackMeta, StackRow};
    let meta = StackMeta {
        device_name: "NVIDIA H200".into(),
        compute_capability: (9, 0),
        sm_count: 132,
        l2_bytes: 60 << 20,
        total_mem_bytes: 150_000_000_000,
        driver_cuda_version: 13000,
        driver: "580.00".into(),
        layers: 3,
        context: 2048,
        page_size: 64,
        verify_tokens_per_request: 4,
        dense_linears: "cublas".into(),
        dense_linears_note: "cuBLAS 13.0".into(),
        reps: 10,
    };
    let mut rows = vec![];
    for (kind, q) in [("decode", 1usize), ("verify", 4)] {
        for b in [1usize, 4, 16, 64] {
            rows.push(StackRow {
                kind,
                batch: b,
                tokens: b * q,
                ms: 1.2 + 0.03 * (b * q) as f64,
                graph: true,
                active_experts: 8,
            });
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("profile.toml"),
        stack_profile_toml(&meta, &rows),
    )
    .unwrap();
    let (code, stdout, stderr) = kbench(dir.path(), &["calibrate-passes", "profile.toml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("(NVIDIA H200), 3 Kimi-K2.5 layers, context 2048, dense linears cublas"),
        "{stdout}"
    );
    assert_eq!(stdout.lines().filter(|l| l.contains(" verify ")).count(), 4);
}
