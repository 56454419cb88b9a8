//! `[collectives] all_reduce = "custom"`: an engine's own IPC all-reduce below its size cap
//! for the group, priced from the op tables' measured custom all-reduce, and NCCL's table
//! above the cap (vLLM's CudaCommunicator.all_reduce order; CUSTOM_ALL_REDUCE_MAX_SIZES).

mod support;

use std::path::{Path, PathBuf};

use kbench_core::experiment::{load_experiment, Experiment};
use kbench_sim::engine_profile::EngineProfile;
use kbench_sim::{acceptance_for, SimBackend};
use support::{decode_step, experiment, replace_section, root, vllm_h200_profile, write};

/// vllm-8x-h200 with its collectives section replaced by `collectives`, written to `dir`.
fn profile_with(dir: &Path, collectives: &str) -> PathBuf {
    let text = replace_section(&vllm_h200_profile(), "[collectives]", collectives);
    write(dir, "engine.toml", &text)
}

fn kimi(hardware: &str, profile: &Path) -> Experiment {
    on("kimi-k2.5", hardware, profile)
}

fn on(model: &str, hardware: &str, profile: &Path) -> Experiment {
    experiment(model, &format!("preset = \"{hardware}\""), profile)
}

/// The decode step's all-reduce time at `bs` and where it was priced from.
fn all_reduce(e: &Experiment, bs: u32) -> (f64, &'static str) {
    let p = decode_step(e, bs, 1000.0);
    (p.gpu_us["all_reduce"], p.sources["all_reduce"])
}

const NCCL: &str = "[collectives]\nall_reduce = \"table\"\nref = \"NCCL\"";
const CUSTOM: &str =
    "[collectives]\nall_reduce = \"custom\"\ncustom_max_bytes = { \"8\" = 262144 }\nref = \"vLLM\"";

#[test]
fn below_the_cap_the_custom_table_prices_the_all_reduce_and_above_it_nccl() {
    let dir = tempfile::tempdir().unwrap();
    let nccl = kimi("8x-h200", &profile_with(dir.path(), NCCL));
    let (nccl_small, _) = all_reduce(&nccl, 1);
    let (nccl_large, _) = all_reduce(&nccl, 32);
    let custom = kimi("8x-h200", &profile_with(dir.path(), CUSTOM));
    let (custom_small, source) = all_reduce(&custom, 1);
    assert_eq!(source, "table");
    // H200, 8 GPUs, 7,168 BF16 values: the custom all-reduce measures 3.6-3.7 us where
    // NCCL measures 17-17.4 us (data/optables/h200_sxm/nccl.csv)
    let ratio = custom_small / nccl_small;
    assert!(
        (0.15..0.3).contains(&ratio),
        "custom / NCCL at one token: {ratio}"
    );
    // 32 tokens x 7,168 x 2 bytes = 458,752 bytes: past the 256 KiB cap, NCCL's price
    let (custom_large, _) = all_reduce(&custom, 32);
    assert!(
        (custom_large - nccl_large).abs() < 1e-9,
        "{custom_large} {nccl_large}"
    );
}

#[test]
fn a_group_size_without_a_cap_runs_nccl_and_a_moved_table_moves_the_custom_rows_too() {
    let dir = tempfile::tempdir().unwrap();
    let only_tp4 =
        "[collectives]\nall_reduce = \"custom\"\ncustom_max_bytes = { \"4\" = 8388608 }\nref = \"x\"";
    let (uncapped, _) = all_reduce(&kimi("8x-h200", &profile_with(dir.path(), only_tp4)), 1);
    let (nccl, _) = all_reduce(&kimi("8x-h200", &profile_with(dir.path(), NCCL)), 1);
    assert!((uncapped - nccl).abs() < 1e-9, "{uncapped} {nccl}");
    // 8x H100 prices on H200's tables, moved by the link terms (Kimi does not fit 8x H100)
    let llama = |collectives| {
        on(
            "llama-3.1-8b",
            "8x-h100",
            &profile_with(dir.path(), collectives),
        )
    };
    let (h100, source) = all_reduce(&llama(CUSTOM), 1);
    let (h100_nccl, _) = all_reduce(&llama(NCCL), 1);
    assert_eq!(source, "table, moved to this GPU / precision");
    assert!(h100 < 0.3 * h100_nccl, "{h100} {h100_nccl}");
}

#[test]
fn a_custom_all_reduce_without_its_caps_or_caps_without_it_are_refused_by_name() {
    let shipped = vllm_h200_profile();
    let with = |collectives: &str| {
        let text = replace_section(&shipped, "[collectives]", collectives);
        EngineProfile::from_toml_str(&text, "p.toml")
            .and_then(|p| p.validate().map(|()| p))
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let e = with("[collectives]\nall_reduce = \"custom\"\nref = \"x\"");
    assert!(e.contains("needs custom_max_bytes"), "{e}");
    let e = with(
        "[collectives]\nall_reduce = \"table\"\ncustom_max_bytes = { \"8\" = 1 }\nref = \"x\"",
    );
    assert!(e.contains("only with all_reduce = \"custom\""), "{e}");
    let e = with(
        "[collectives]\nall_reduce = \"custom\"\ncustom_max_bytes = { \"one\" = 1 }\nref = \"x\"",
    );
    assert!(e.contains("key `one`"), "{e}");
    let e = with(
        "[collectives]\nall_reduce = \"custom\"\ncustom_max_bytes = { \"08\" = 1 }\nref = \"x\"",
    );
    assert!(e.contains("key `08`"), "{e}");
    let e = with("[collectives]\nall_reduce = \"custom\"\ncustom_max_bytes = { \"8\" = 1 }\nlatency_us = { value = 5.0, source = \"prior\", ref = \"x\" }\nref = \"x\"");
    assert!(e.contains("read only with all_reduce = \"link\""), "{e}");
    let e = with(
        "[collectives]\nall_reduce = \"custom\"\ncustom_max_bytes = { \"8\" = -1.0 }\nref = \"x\"",
    );
    assert!(e.contains("not a positive number of bytes"), "{e}");
}

#[test]
fn a_deployment_that_turns_the_custom_all_reduce_off_is_priced_with_nccl() {
    // vllm-minimax-m3-h200 runs vLLM's custom all-reduce below its caps
    let m3 = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let path = root().join("data/validation/experiments/minimax-m3-vllm.toml");
        load_experiment(&path, &sets).unwrap().remove(0).experiment
    };
    let (on, _) = all_reduce(&m3(&[]), 1);
    let (off, source) = all_reduce(&m3(&["server.custom_all_reduce=false"]), 1);
    assert_eq!(source, "table");
    assert!(off > 3.0 * on, "off {off} us, on {on} us");
}

#[test]
fn tables_without_the_custom_kernel_refuse_to_price_it_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // H200's tables less their custom all-reduce rows, as a box measured with NCCL alone
    let tables = dir.path().join("tables");
    std::fs::create_dir(&tables).unwrap();
    for entry in std::fs::read_dir(root().join("data/optables/h200_sxm")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let kept: String = text
            .lines()
            .filter(|l| !l.starts_with("custom_all_reduce/"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(tables.join(path.file_name().unwrap()), kept).unwrap();
    }
    let hardware = std::fs::read_to_string(root().join("experiments/hardware/8x-h200.toml"))
        .unwrap()
        .replace("system = \"h200_sxm\"", "dir = \"tables\"");
    let hardware_path = write(dir.path(), "box.toml", &hardware);
    let e = experiment(
        "kimi-k2.5",
        &format!("profile = \"{}\"", hardware_path.display()),
        &profile_with(dir.path(), CUSTOM),
    );
    let error = SimBackend::new(&e, acceptance_for(&e).unwrap())
        .and_then(|b| b.explain_round(1, 1000.0))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(error.contains("custom_all_reduce/half"), "{error}");
    assert!(error.contains("custom_all_reduce = false"), "{error}");
}
