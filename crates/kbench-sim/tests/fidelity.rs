//! The fidelity corpus: every case runs, and no prediction depends on a measured value.

use std::path::Path;

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
fn at_least_a_third_of_the_points_are_check() {
    let corpus = shipped();
    let (mut check, mut all) = (0, 0);
    for c in &corpus {
        for case in &c.file.cases {
            all += case.points.len();
            if case.role == Role::Check {
                check += case.points.len();
            }
        }
    }
    assert!(3 * check >= all, "{check} of {all}");
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
