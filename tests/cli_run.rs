//! The binary end to end: outputs written atomically, flags honoured, help pinned.

mod common;

use common::{kbench, repo_root};

#[test]
fn help_is_pinned() {
    let (code, stdout, _) = kbench(&repo_root(), &["--help"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(stdout);
}

#[test]
fn experiment_help_is_pinned() {
    let (code, stdout, _) = kbench(&repo_root(), &["experiment", "--help"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(stdout);
}

#[test]
fn serve_help_is_pinned() {
    let (code, stdout, _) = kbench(&repo_root(), &["serve", "--help"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(stdout);
}

#[test]
fn writes_json_csv_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let csv = dir.path().join("r.csv");
    let svg = dir.path().join("r.svg");
    let exp = repo_root().join("experiments/topk1_v2.toml");
    let (code, stdout, stderr) = kbench(
        &repo_root(),
        &[
            "experiment",
            exp.to_str().unwrap(),
            "--concurrency",
            "1",
            "4",
            "--num-requests",
            "8",
            "--json",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("saturation"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let levels = report["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for key in [
        "concurrency",
        "completed",
        "duration_s",
        "output_throughput",
        "accept_length",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "p99_tpot_ms",
        "median_itl_ms",
        "p99_itl_ms",
    ] {
        assert!(levels[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(levels[0]["completed"], 8);
    // a terminal of 100 columns holds the report; --wide gives the columns it leaves out
    let widest = stdout.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest <= 100, "{widest} columns: {stdout}");
    assert!(
        !stdout.contains("ITL p50 ") && stdout.contains("--wide"),
        "{stdout}"
    );
    let (code, wide, stderr) = kbench(
        &repo_root(),
        &[
            "experiment",
            exp.to_str().unwrap(),
            "--concurrency",
            "1",
            "--num-requests",
            "4",
            "--wide",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(wide.contains("ITL p50") && wide.contains("dur s"), "{wide}");
    // what the run assumed is printed, not only kept in the JSON
    let assumed = report["experiment"]["assumptions"][0].as_str().unwrap();
    let first_words: String = assumed
        .split_whitespace()
        .take(4)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        stdout.contains(&format!(
            "== assumed (where the experiment's source is silent)\n   - {first_words}"
        )),
        "{stdout}"
    );
    assert!(report["reference"]["points"][0]["error_pct"].is_number());
    assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 3);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    // the reference's measurement is labelled with its value and the prediction's error
    let point = &report["reference"]["points"][0];
    let measured = point["reference"].as_f64().unwrap();
    // three significant figures, as the plot labels values
    let measured = if measured >= 100.0 {
        format!("{measured:.0}")
    } else {
        format!("{measured:.1}")
    };
    let label = format!("{measured} ({:+.1}%)", point["error_pct"].as_f64().unwrap());
    assert!(plot.contains(&label), "{label}: {plot}");
    // No temporary files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn quiet_prints_nothing() {
    let exp = repo_root().join("experiments/baseline.toml");
    let (code, stdout, stderr) = kbench(
        &repo_root(),
        &[
            "experiment",
            exp.to_str().unwrap(),
            "--quiet",
            "--concurrency",
            "1",
            "--num-requests",
            "2",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "");
}

#[test]
fn unwritable_output_fails_cleanly() {
    let exp = repo_root().join("experiments/baseline.toml");
    let (code, _, stderr) = kbench(
        &repo_root(),
        &[
            "experiment",
            exp.to_str().unwrap(),
            "--quiet",
            "--concurrency",
            "1",
            "--num-requests",
            "2",
            "--json",
            "/nonexistent-dir/r.json",
        ],
    );
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("/nonexistent-dir/r.json"));
}

#[test]
fn compare_sets_reports_side_by_side_and_plots_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = common::repo_root();
    let file = root.join("experiments/topk1_v2.toml");
    let file = file.to_str().unwrap();
    for (name, v2) in [("v2.json", "true"), ("v1.json", "false")] {
        let (code, _, stderr) = kbench(
            dir.path(),
            &[
                "experiment",
                file,
                "-q",
                "--concurrency",
                "1",
                "--concurrency",
                "8",
                "--set",
                &format!("speculative.spec_v2={v2}"),
                "--json",
                name,
            ],
        );
        assert_eq!(code, 0, "{stderr}");
    }
    let (code, stdout, stderr) = kbench(
        dir.path(),
        &["compare", "v2.json", "v1.json", "--plot", "cmp.svg"],
    );
    assert_eq!(code, 0, "{stderr}");
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.path().join(f)).unwrap()).unwrap()
    };
    let (a, b) = (read("v2.json"), read("v1.json"));
    // the C=8 output-throughput row: both values and the difference from the first
    let (ta, tb) = (
        a["levels"][1]["output_throughput"].as_f64().unwrap(),
        b["levels"][1]["output_throughput"].as_f64().unwrap(),
    );
    let want = format!("{:+.1}%", (tb - ta) / ta * 100.0);
    let block = stdout.split("-- output_throughput").nth(1).unwrap();
    let row = block
        .lines()
        .find(|l| l.trim_start().starts_with("8 "))
        .unwrap();
    assert!(
        row.contains(&format!("{ta:.1}"))
            && row.contains(&format!("{tb:.1}"))
            && row.contains(&want),
        "{row} (want {ta:.1}, {tb:.1}, {want})"
    );
    assert!(stdout.contains("#1 v2.json: topk1_v2 (sim)"), "{stdout}");
    // what the runs assumed is printed with the comparison, once
    let assumed = stdout.split("== assumed").nth(1).unwrap_or_default();
    let first = a["experiment"]["assumptions"][0].as_str().unwrap();
    let words: String = first
        .split_whitespace()
        .take(6)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(assumed.contains(&words), "{words}: {stdout}");
    assert_eq!(stdout.matches("== assumed").count(), 1, "{stdout}");
    let svg = std::fs::read_to_string(dir.path().join("cmp.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("#2 topk1_v2 (sim)"),
        "{svg}"
    );
    // one line per report in its own colour, drawn once in each of the four panels (the
    // latencies' p50; their p99 is dashed and thinner) and once in the legend
    for colour in ["#1F77B4", "#D62728"] {
        let line = format!(r#"stroke="{colour}" stroke-width="2" points"#);
        assert_eq!(svg.matches(&line).count(), 5, "{colour}: {svg}");
    }
    for panel in [
        "output throughput against load",
        "throughput per GPU against interactivity",
        "TTFT p50 and p99 against load",
        "TPOT p50 and p99 against load",
    ] {
        assert!(svg.contains(panel), "{panel}: {svg}");
    }

    // anything that is not a report: one message naming the file, exit code 3
    std::fs::write(dir.path().join("other.json"), "{\"levels\": []}").unwrap();
    let (code, _, stderr) = kbench(dir.path(), &["compare", "v2.json", "other.json"]);
    assert_eq!(code, 3);
    insta::assert_snapshot!("compare_not_a_report", stderr);
    let (code, _, stderr) = kbench(dir.path(), &["compare", "v2.json", "missing.json"]);
    assert_eq!(code, 3);
    assert!(
        stderr.starts_with("error: reading missing.json\n  caused by: "),
        "{stderr}"
    );
}
