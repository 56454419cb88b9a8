//! The fidelity corpus: every case runs, and no prediction depends on a measured value.

use std::path::Path;

use kbench_core::experiment::load_experiment;
use kbench_sim::corpus::{corpus_files, load_corpus, Role};
use kbench_sim::fidelity::run_corpus;

fn shipped() -> Vec<kbench_sim::corpus::LoadedCorpus> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/validation");
    corpus_files(&dir)
        .unwrap()
        .iter()
        .map(|f| load_corpus(f).unwrap())
        .collect()
}

#[test]
fn predictions_never_read_the_measured_values() {
    let corpus = shipped();
    let before = run_corpus(&corpus);
    assert!(before.failed.is_empty(), "{:?}", before.failed);
    let mut perturbed = corpus.clone();
    for c in &mut perturbed {
        for case in &mut c.file.cases {
            for (i, p) in case.points.iter_mut().enumerate() {
                p.value *= 1.37 + 0.01 * i as f64;
            }
        }
    }
    let after = run_corpus(&perturbed);
    assert_eq!(before.points.len(), after.points.len());
    for (a, b) in before.points.iter().zip(&after.points) {
        assert_eq!(a.predicted, b.predicted, "{} {}", a.case, a.metric);
        assert_ne!(a.measured, b.measured);
    }
}

#[test]
fn at_least_a_third_of_the_points_and_of_the_speculative_points_are_check() {
    let corpus = shipped();
    let (mut check, mut all, mut spec_check, mut spec_all) = (0, 0, 0, 0);
    for c in &corpus {
        let dir = c.path.parent().unwrap();
        for case in &c.file.cases {
            let sets: Vec<String> = case.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let exp = load_experiment(&dir.join(&case.experiment), &sets)
                .unwrap()
                .remove(0)
                .experiment;
            let n = case.points.len();
            let is_check = case.role == Role::Check;
            all += n;
            check += if is_check { n } else { 0 };
            if exp.speculative.is_speculative() {
                spec_all += n;
                spec_check += if is_check { n } else { 0 };
            }
        }
    }
    assert!(3 * check >= all, "{check} of {all}");
    assert!(spec_all > 0);
    assert!(
        3 * spec_check >= spec_all,
        "{spec_check} of {spec_all} speculative"
    );
}

#[test]
fn bad_corpus_files_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let write = |text: &str| {
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).unwrap();
        load_corpus(&p).unwrap_err().to_string()
    };
    let source = "[source]\nname = \"s\"\nurl = \"u\"\ndescription = \"d\"\n";
    let case =
        "[[cases]]\nname = \"a\"\nexperiment = \"e.toml\"\nrole = \"check\"\nengine = \"x\"\n";
    for (text, want) in [
        (source.to_string(), "missing field `cases`"),
        (
            "[source]\nname = \"s\"\ndescription = \"d\"\n[[cases]]\nname = \"a\"\nexperiment = \"e\"\nrole = \"fit\"\nengine = \"x\"\npoints = []\n".to_string(),
            "needs `repository`",
        ),
        (format!("{source}{case}points = []\n"), "has no points"),
        (
            format!("{source}{case}[[cases.points]]\nmetric = \"tpot\"\nconcurrency = 1\nvalue = 1.0\n"),
            "unknown metric `tpot`",
        ),
        (
            format!("{source}{case}[[cases.points]]\nmetric = \"mean_tpot_ms\"\nvalue = 1.0\n"),
            "needs the concurrency",
        ),
        (
            format!("{source}{case}[[cases.points]]\nmetric = \"mean_tpot_ms\"\nconcurrency = 1\nvalue = -1.0\n"),
            "not a positive number",
        ),
        (
            format!("{source}{case}[[cases.points]]\nmetric = \"speedup\"\nconcurrency = 1\nvalue = 1.5\n"),
            "needs `baseline",
        ),
        (
            format!("{source}{case}baseline = \"a\"\n[[cases.points]]\nmetric = \"speedup\"\nvalue = 1.5\n"),
            "names itself",
        ),
        (
            format!("{source}{case}baseline = \"plain\"\n[[cases.points]]\nmetric = \"speedup\"\nvalue = 1.5\n"),
            "baseline `plain` is not a case of this file",
        ),
        (
            format!("{source}{case}[[cases.points]]\nmetric = \"mean_tpot_ms\"\nconcurrency = 1\nvalue = 1.0\nof = \"decode_throughput\"\n"),
            "is for `speedup` points",
        ),
        (
            format!("{source}{case}baseline = \"b\"\n[[cases.points]]\nmetric = \"speedup\"\nconcurrency = 1\nvalue = 1.5\nof = \"ttft\"\n"),
            "a speedup of `ttft`: use one of output_throughput, decode_throughput",
        ),
        (
            format!("{source}{case}baseline = \"b\"\n[[cases.points]]\nmetric = \"speedup\"\nvalue = 1.5\nof = \"decode_throughput\"\n"),
            "needs the concurrency",
        ),
    ] {
        let e = write(&text);
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn a_speedup_is_the_ratio_of_its_case_to_its_baseline() {
    let corpus = shipped();
    let report = run_corpus(&corpus);
    let of = |case: &str, metric: &str, c: Option<u32>| {
        report
            .points
            .iter()
            .find(|p| {
                p.source == "seed" && p.case == case && p.metric == metric && p.concurrency == c
            })
            .map(|p| p.predicted)
            .unwrap()
    };
    for case in ["topk4_v1", "topk1_v2"] {
        let at_c1 =
            of(case, "output_throughput", Some(1)) / of("baseline", "output_throughput", Some(1));
        assert!(
            (of(case, "speedup", Some(1)) - at_c1).abs() < 1e-12,
            "{case} C=1"
        );
        let at_sat = of(case, "saturation_output_throughput", None)
            / of("baseline", "saturation_output_throughput", None);
        assert!(
            (of(case, "speedup", None) - at_sat).abs() < 1e-12,
            "{case} saturation"
        );
    }
    assert!(report.summary["fit"].contains_key("speedup"));
}

#[test]
fn decode_throughput_is_the_streams_over_their_mean_tpot_and_its_speedup_divides_it() {
    let dir = tempfile::tempdir().unwrap();
    let exp = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/validation/experiments/kimi-k2.6-rtx-pro-6000-vllm-decode.toml");
    let text = format!(
        r#"[source]
name = "s"
url = "u"
description = "d"
[[cases]]
name = "plain"
experiment = "{exp}"
set = {{ "benchmark.concurrency" = [4], "workload.max_tokens" = 256 }}
role = "check"
engine = "vllm"
[[cases.points]]
metric = "decode_throughput"
concurrency = 4
value = 100.0
[[cases.points]]
metric = "mean_tpot_ms"
concurrency = 4
value = 10.0
[[cases]]
name = "eagle3"
experiment = "{exp}"
set = {{ "benchmark.concurrency" = [4], "workload.max_tokens" = 256, "speculative.method" = "eagle3", "speculative.num_speculative_tokens" = 3, "workload.accept_length" = 2.5 }}
role = "check"
engine = "vllm"
baseline = "plain"
[[cases.points]]
metric = "decode_throughput"
concurrency = 4
value = 150.0
[[cases.points]]
metric = "speedup"
concurrency = 4
value = 1.5
of = "decode_throughput"
"#,
        exp = exp.display()
    );
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    let report = run_corpus(&[load_corpus(&path).unwrap()]);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let of = |case: &str, metric: &str| {
        report
            .points
            .iter()
            .find(|p| p.case == case && p.metric == metric)
            .map(|p| p.predicted)
            .unwrap()
    };
    let decode = of("plain", "decode_throughput");
    assert!((decode - 4.0 * 1000.0 / of("plain", "mean_tpot_ms")).abs() < 1e-9);
    let speedup = of("eagle3", "decode_throughput") / decode;
    assert!((of("eagle3", "speedup") - speedup).abs() < 1e-12);
    assert!(
        speedup > 1.0,
        "a 2.5-token round beats plain decoding at C=4: {speedup}"
    );
}
