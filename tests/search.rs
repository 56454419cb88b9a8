//! `kbench search`: the shipped search is pinned and rediscovers the seed's result; the
//! answer is the same bytes on one thread or many; every candidate's report is what
//! `kbench experiment` gives on its emitted file; bad input gets one clear message.

mod common;

use std::path::{Path, PathBuf};

use kbench::cli::experiment::run_file;
use kbench::cli::render::search::write_search;
use kbench_search::report::{build, SearchReport};
use kbench_search::{evaluate, prepare, Evaluated, Prepared, SearchFlags};

use common::kbench;

fn search(
    path: &Path,
    flags: &SearchFlags,
    threads: usize,
) -> (Prepared, Vec<Evaluated>, SearchReport) {
    let p = prepare(path, &[], flags).unwrap();
    let e = evaluate(&p, threads, &|_, _| {}).unwrap();
    let r = build(&p, &e).unwrap();
    (p, e, r)
}

fn rendered(r: &SearchReport, top: usize) -> String {
    let mut out = Vec::new();
    write_search(&mut out, r, top, false).unwrap();
    String::from_utf8(out).unwrap()
}

fn search_kimi() -> PathBuf {
    common::repo_root().join("experiments/search_kimi.toml")
}

#[test]
fn search_kimi_rediscovers_the_seeds_result() {
    let (p, _, r) = search(&search_kimi(), &SearchFlags::default(), 0);
    insta::assert_snapshot!("search_kimi", rendered(&r, p.settings.top));
    let plain = r.candidates[r.baseline.expect("plain decoding is in the space")]
        .objective
        .unwrap();
    let best = &r.candidates[r.ranked[0]];
    let cfg = best.config.as_ref().unwrap();
    // the seed: a chain with the overlap scheduler at least matches plain decoding at
    // saturation...
    assert!(cfg.eagle_topk == 1 && cfg.spec_v2, "{}", best.label);
    assert!(
        best.objective.unwrap() >= plain,
        "{} vs plain {plain}",
        best.label
    );
    // ...while the 4-wide tree with v1 is far below it
    let tree = r
        .candidates
        .iter()
        .filter(|c| {
            c.config
                .as_ref()
                .is_some_and(|x| x.eagle_topk == 4 && !x.spec_v2)
        })
        .filter_map(|c| c.objective)
        .fold(0.0f64, f64::max);
    assert!(
        tree > 0.0 && tree < 0.6 * plain,
        "best 4-wide v1 tree {tree}, plain {plain}"
    );
    // the seed's own tree (3, 4, 8) with v1
    let seed_tree = r
        .candidates
        .iter()
        .find(|c| c.label == "EAGLE3 3/4/8 v1")
        .and_then(|c| c.objective)
        .unwrap();
    assert!(plain / seed_tree > 2.0, "plain {plain} / tree {seed_tree}");
}

#[test]
fn search_kimi_under_a_latency_slo_is_pinned() {
    let flags = SearchFlags {
        slo: vec!["p99_tpot_ms <= 60".into()],
        top: Some(5),
        ..SearchFlags::default()
    };
    let (_, _, r) = search(&search_kimi(), &flags, 0);
    insta::assert_snapshot!("search_kimi_slo", rendered(&r, 5));
    for &i in &r.ranked {
        assert!(r.candidates[i].at.as_ref().unwrap().p99_tpot_ms <= 60.0);
    }
}

#[test]
fn from_the_seeds_tree_it_says_to_turn_speculation_off() {
    // the seed's first configuration, (3, 4, 8) with v1, against plain decoding alone
    let dir = tempfile::tempdir().unwrap();
    let text = search_kimi_up_to("[search.space]").replace(
        "num_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\nspec_v2 = true",
        "num_steps = 3\neagle_topk = 4\nnum_draft_tokens = 8\nspec_v2 = false",
    );
    let path = dir.path().join("seed_tree.toml");
    std::fs::write(
        &path,
        format!("{text}[search.space]\n\"speculative.algorithm\" = [\"none\", \"EAGLE3\"]\n"),
    )
    .unwrap();
    let (_, _, r) = search(&path, &SearchFlags::default(), 0);
    let own = &r.candidates[r
        .file_configuration
        .expect("the file's configuration is a candidate")];
    assert_eq!((own.label.as_str(), own.rank), ("EAGLE3 3/4/8 v1", Some(2)));
    let out = rendered(&r, 10);
    let gain = plain_gain(&out).unwrap_or_else(|| panic!("no advice in:\n{out}"));
    // the seed measured plain decoding 2.4x above this tree
    assert!((100.0..200.0).contains(&gain), "{gain}% in:\n{out}");
}

/// The gain in `instead, #1 changes EAGLE3 3/4/8 v1 to plain: +N% over the file's`.
fn plain_gain(out: &str) -> Option<f64> {
    let line = out
        .lines()
        .find(|l| l.contains("instead, #1 changes EAGLE3 3/4/8 v1 to plain: "))?;
    let pct = line.split(": ").nth(1)?.split('%').next()?;
    pct.parse().ok()
}

/// experiments/search_kimi.toml up to `marker`, its trace named by an absolute path so the
/// text can be written anywhere.
fn search_kimi_up_to(marker: &str) -> String {
    let text = std::fs::read_to_string(search_kimi()).unwrap();
    text[..text.find(marker).unwrap()].replace(
        "../traces/",
        &format!("{}/traces/", common::repo_root().display()),
    )
}

/// A space small enough to run twice and to emit every candidate of.
fn small_flags() -> SearchFlags {
    SearchFlags {
        space: vec![
            "speculative.num_steps=1..2".into(),
            "speculative.eagle_topk=[1, 2]".into(),
            "speculative.num_draft_tokens=auto".into(),
            "speculative.spec_v2=[false, true]".into(),
            "server.max_running_requests=[16, 48]".into(),
        ],
        ..SearchFlags::default()
    }
}

fn small_base(dir: &Path) -> PathBuf {
    // the space is the test's: only what the flags declare
    let text = search_kimi_up_to("[search]")
        .replace(
            "concurrency = [1, 2, 4, 8, 16, 32, 64]",
            "concurrency = [1, 16]",
        )
        .replace("requests_per_level = 64", "requests_per_level = 16")
        .replace("max_tokens = 200", "max_tokens = 48");
    let path = dir.join("base.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_answer_is_the_same_bytes_on_one_thread_or_two() {
    let dir = tempfile::tempdir().unwrap();
    let base = small_base(dir.path());
    let (_, _, one) = search(&base, &small_flags(), 1);
    let (_, _, two) = search(&base, &small_flags(), 2);
    let json = |r: &SearchReport| serde_json::to_string(r).unwrap();
    assert_eq!(json(&one), json(&two));
    assert_eq!((one.candidates_total, one.ran), (34, 22));
}

#[test]
fn every_candidates_report_is_what_its_emitted_file_gives() {
    let dir = tempfile::tempdir().unwrap();
    let base = small_base(dir.path());
    let (p, e, _) = search(&base, &small_flags(), 0);
    let out = dir.path().join("emitted");
    std::fs::create_dir(&out).unwrap();
    let mut checked = 0;
    for (i, ev) in e.iter().enumerate() {
        let Some(run) = ev.run() else { continue };
        let file = out.join(format!("c{i}.toml"));
        let text = kbench_search::emit::emitted_text(&p, &ev.candidate, &file, "test").unwrap();
        std::fs::write(&file, text).unwrap();
        let reports = run_file(&file, &[], true).unwrap();
        assert_eq!(reports.len(), 1);
        let json = |v: &dyn erased::Json| v.json();
        assert_eq!(
            json(&reports[0].levels),
            json(&run.report.levels),
            "candidate {i} ({:?})",
            ev.candidate.overrides
        );
        assert_eq!(reports[0].warnings, run.report.warnings);
        assert_eq!(
            reports[0].experiment.speculative.num_steps,
            run.report.experiment.speculative.num_steps
        );
        checked += 1;
    }
    assert_eq!(checked, 22);
}

mod erased {
    pub trait Json {
        fn json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string(self).unwrap()
        }
    }
}

#[test]
fn emit_writes_a_file_sglang_args_can_launch() {
    let dir = tempfile::tempdir().unwrap();
    let base = small_base(dir.path());
    let (code, stdout, stderr) = kbench(
        dir.path(),
        &[
            "search",
            base.to_str().unwrap(),
            "--space",
            "speculative.num_steps=1..3",
            "--space",
            "speculative.num_draft_tokens=auto",
            "--emit",
            "best.toml",
            "--json",
            "search.json",
            "--csv",
            "search.csv",
            "--plot",
            "frontier.svg",
            "-q",
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    let (code, line, stderr) = kbench(dir.path(), &["sglang-args", "best.toml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(line.contains("--speculative-num-steps"), "{line}");
    let csv = std::fs::read_to_string(dir.path().join("search.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    let svg = std::fs::read_to_string(dir.path().join("frontier.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("chosen:"), "{svg}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("search.json")).unwrap())
            .unwrap();
    assert_eq!(json["candidates"].as_array().unwrap().len(), 4);
}

fn failing(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let base = small_base(dir.path());
    let mut all = vec![
        "search",
        base.to_str().unwrap(),
        "--space",
        "speculative.num_steps=1..2",
    ];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = kbench(dir.path(), &all);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(code, 0, "{stdout}");
    let stderr = stderr.replace(base.to_str().unwrap(), "base.toml");
    format!("exit code: {code}\n{stderr}")
}

#[test]
fn bad_input_gets_one_clear_message() {
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("empty list", vec!["--space", "speculative.eagle_topk=[]"]),
        (
            "contradictory range",
            vec!["--space", "speculative.num_steps={ min = 5, max = 1 }"],
        ),
        (
            "over the limit",
            vec![
                "--space",
                "speculative.num_steps=1..50",
                "--max-candidates",
                "10",
            ],
        ),
        ("unknown SLO metric", vec!["--slo", "p99_tpot <= 50"]),
        ("malformed SLO", vec!["--slo", "p99_tpot_ms about 50"]),
        ("unknown objective", vec!["--objective", "throughput"]),
        (
            "unknown key",
            vec!["--space", "speculative.num_stepz=[1, 2]"],
        ),
        (
            "value of the wrong type",
            vec!["--space", "speculative.num_steps=[\"two\"]"],
        ),
        (
            "auto elsewhere",
            vec!["--space", "speculative.num_steps=auto"],
        ),
        ("a level not run", vec!["--at", "48"]),
        ("fixed and varied", vec!["--set", "speculative.num_steps=2"]),
        (
            "no candidate meets the SLO",
            vec!["--slo", "p99_tpot_ms <= 1"],
        ),
    ];
    let mut out = String::new();
    for (what, args) in cases {
        out.push_str(&format!(
            "== {what}: {}\n{}\n",
            args.join(" "),
            failing(&args)
        ));
    }
    insta::assert_snapshot!(out);
}

#[test]
fn a_file_without_a_search_or_with_a_sweep_is_refused() {
    let root = common::repo_root();
    let (code, _, stderr) = kbench(&root, &["search", "experiments/topk1_v2.toml"]);
    assert_eq!(code, 3);
    assert!(stderr.contains("no [search] table"), "{stderr}");
    let (code, _, stderr) = kbench(
        &root,
        &[
            "search",
            "experiments/spec_vs_plain.toml",
            "--space",
            "speculative.num_steps=1..2",
        ],
    );
    assert_eq!(code, 3);
    assert!(stderr.contains("[sweep]"), "{stderr}");
}
