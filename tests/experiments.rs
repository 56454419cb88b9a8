//! Every simulator experiment in experiments/ runs and its report is pinned: the table a
//! user sees and the JSON a notebook reads. Also: same inputs, same bytes, on any thread.

mod common;

use std::path::PathBuf;

use kbench::cli::experiment::run_file;
use kbench::cli::render::table;
use kbench_core::report::Report;

fn sim_experiments() -> Vec<PathBuf> {
    let dir = common::repo_root().join("experiments");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            !text.contains("kind = \"engine\"") && !text.contains("kind = \"http\"")
        })
        .collect();
    files.sort();
    files
}

fn relative(p: &std::path::Path) -> String {
    p.strip_prefix(common::repo_root())
        .unwrap()
        .display()
        .to_string()
}

fn rendered(reports: &[Report]) -> String {
    let mut out = Vec::new();
    for r in reports {
        table::write_report(&mut out, r, false).unwrap();
    }
    if reports.len() > 1 {
        table::write_sweep_summary(&mut out, reports).unwrap();
    }
    String::from_utf8(out).unwrap()
}

fn json(reports: &[Report]) -> String {
    serde_json::to_string_pretty(reports).unwrap()
}

#[test]
fn every_sim_experiment_report_is_pinned() {
    let files = sim_experiments();
    assert!(files.len() >= 6, "experiments/ lost files: {files:?}");
    for file in files {
        let reports = run_file(&file, &[], true)
            .unwrap_or_else(|e| panic!("{}: {}", file.display(), e.message));
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        // Paths inside reports are relative to the repo so snapshots hold on any checkout.
        let root = format!("{}/", common::repo_root().display());
        insta::assert_snapshot!(
            format!("{name}_table"),
            rendered(&reports).replace(&root, "")
        );
        insta::assert_snapshot!(format!("{name}_json"), json(&reports).replace(&root, ""));
        let _ = relative(&file);
    }
}

#[test]
fn two_runs_are_byte_identical() {
    let file = common::repo_root().join("experiments/topk4_v1.toml");
    let a = json(&run_file(&file, &[], true).unwrap());
    let b = json(&run_file(&file, &[], true).unwrap());
    assert_eq!(a, b);
}

#[test]
fn one_thread_and_several_give_the_same_bytes() {
    let file = common::repo_root().join("experiments/tree_vs_chain.toml");
    let sequential = json(&run_file(&file, &[], true).unwrap());
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let f = file.clone();
            std::thread::spawn(move || json(&run_file(&f, &[], true).unwrap()))
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), sequential);
    }
}

#[test]
fn command_line_overrides_reach_the_run() {
    let file = common::repo_root().join("experiments/topk1_v2.toml");
    let reports = run_file(
        &file,
        &[
            "benchmark.concurrency=[2]".into(),
            "benchmark.requests_per_level=3".into(),
        ],
        true,
    )
    .unwrap();
    assert_eq!(reports[0].levels.len(), 1);
    assert_eq!(reports[0].levels[0].concurrency, 2);
    assert_eq!(reports[0].levels[0].completed, 3);
}
