//! `kbench calibrate` over a corpus: it recovers a known engine term from points the model
//! itself produced, never reads `check` points, writes profiles atomically, and refuses
//! what it cannot fit with one message.

mod common;

use std::path::Path;

use common::{kbench, repo_root};

/// An engine profile with one free term, the front end's cost per streamed chunk.
fn engine_profile(frontend_us: f64) -> String {
    let generic = std::fs::read_to_string(repo_root().join("experiments/engines/sglang.toml"))
        .unwrap()
        .replace("name = \"sglang\"", "name = \"test-engine\"");
    let generic = generic
        .lines()
        .map(|l| {
            if l.starts_with("frontend_per_chunk_us") {
                format!("frontend_per_chunk_us = {{ value = {frontend_us}, source = \"prior\", ref = \"test\" }}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    format!(
        "{generic}\n\n[[free]]\nparam = \"host.frontend_per_chunk_us\"\nprior = 300.0\nmin = 0.0\nmax = 5000.0\nprior_weight = 0.0\n"
    )
}

const EXPERIMENT: &str = r#"name = "cal"
seed = 1

[model]
preset = "kimi-k2.5"

[hardware]
preset = "8x-rtx-pro-6000-server"

[engine]
name = "sglang"
profile = "engine.toml"

[server]
tp_size = 8

[workload]
max_tokens = 32
input_len = 64

[benchmark]
concurrency = [1, 48]
requests_per_level = 48
"#;

/// A corpus of one source: the fit case's two points and a check case's point.
fn corpus(fit_c1: f64, fit_sat: f64, check_c48: f64) -> String {
    format!(
        r#"[source]
name = "synthetic"
url = "https://example.invalid/made-by-the-model"
description = "points the model produced at a known front-end cost"

[[cases]]
name = "fit"
experiment = "exp.toml"
role = "fit"
engine = "sglang"
[[cases.points]]
metric = "output_throughput"
concurrency = 1
value = {fit_c1}
[[cases.points]]
metric = "saturation_output_throughput"
value = {fit_sat}

[[cases]]
name = "held"
experiment = "exp.toml"
role = "check"
engine = "sglang"
[[cases.points]]
metric = "output_throughput"
concurrency = 48
value = {check_c48}
"#
    )
}

fn predictions(dir: &Path) -> Vec<f64> {
    let (code, _, stderr) = kbench(dir, &["fidelity", "corpus.toml", "--json", "f.json"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("f.json")).unwrap()).unwrap();
    v["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["predicted"].as_f64().unwrap())
        .collect()
}

fn fitted(dir: &Path, args: &[&str]) -> f64 {
    let mut all = vec!["calibrate", "corpus.toml", "--json", "cal.json", "-q"];
    all.extend_from_slice(args);
    let (code, _, stderr) = kbench(dir, &all);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cal.json")).unwrap()).unwrap();
    v["fits"][0]["params"][0]["fitted"].as_f64().unwrap()
}

#[test]
fn calibrate_recovers_a_known_term_and_writes_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("exp.toml"), EXPERIMENT).unwrap();
    // the "measurements": what the model predicts with a front end of 2000 us per chunk
    std::fs::write(d.join("engine.toml"), engine_profile(2000.0)).unwrap();
    std::fs::write(d.join("corpus.toml"), corpus(1.0, 1.0, 1.0)).unwrap();
    let truth = predictions(d);
    assert_eq!(truth.len(), 3);
    // the same points with the profile back at its prior: the saturation point moves
    std::fs::write(d.join("engine.toml"), engine_profile(300.0)).unwrap();
    assert!(
        predictions(d)[1] > truth[1] * 1.2,
        "the front end must bind at C=48 for the test to mean something"
    );
    std::fs::write(d.join("corpus.toml"), corpus(truth[0], truth[1], truth[2])).unwrap();
    std::fs::create_dir(d.join("out")).unwrap();
    let x = fitted(d, &["--out-dir", "out"]);
    assert!((x / 2000.0 - 1.0).abs() < 0.03, "fitted {x}, truth 2000");

    // the written profile carries the fit, and it predicts the held-out check point
    let written = std::fs::read_to_string(d.join("out/test-engine.toml")).unwrap();
    assert!(written.contains("source = \"fitted\""), "{written}");
    assert!(written.contains("[calibration]"), "{written}");
    std::fs::copy(d.join("out/test-engine.toml"), d.join("engine.toml")).unwrap();
    let after = predictions(d);
    for (a, t) in after.iter().zip(&truth) {
        assert!((a / t - 1.0).abs() < 0.02, "{a} vs {t}");
    }

    // a check point's value is never read: changing it changes nothing in the fit
    std::fs::write(d.join("engine.toml"), engine_profile(300.0)).unwrap();
    std::fs::write(
        d.join("corpus.toml"),
        corpus(truth[0], truth[1], truth[2] * 3.0),
    )
    .unwrap();
    assert_eq!(fitted(d, &[]), x);
}

#[test]
fn calibrate_refuses_one_configuration_measured_again_as_many() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("exp.toml"), EXPERIMENT).unwrap();
    let two_free = format!(
        "{}\n[[free]]\nparam = \"host.decode_step_us\"\nprior = 100.0\nmin = 0.0\nmax = 5000.0\n",
        engine_profile(300.0)
    );
    std::fs::write(d.join("engine.toml"), two_free).unwrap();
    // the fit case three times over: six points, two independent measurements
    let fit_case = corpus(80.0, 700.0, 700.0);
    let (head, cases) = fit_case.split_at(fit_case.find("[[cases]]").unwrap());
    let fit = &cases[..cases.find("\n[[cases]]\nname = \"held\"").unwrap()];
    let repeated = format!(
        "{head}{fit}\n{}\n{}\n",
        fit.replace("name = \"fit\"", "name = \"fit-again\""),
        fit.replace("name = \"fit\"", "name = \"fit-thrice\"")
    );
    std::fs::write(d.join("corpus.toml"), repeated).unwrap();
    let (code, _, stderr) = kbench(d, &["calibrate", "corpus.toml", "-q"]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("6 fit points are 2 independent measurements (1 configuration(s)"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn calibrate_refuses_what_it_cannot_fit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("exp.toml"), EXPERIMENT).unwrap();
    std::fs::write(d.join("engine.toml"), engine_profile(300.0)).unwrap();
    std::fs::write(d.join("corpus.toml"), corpus(80.0, 700.0, 700.0)).unwrap();
    let mut messages = Vec::new();

    let (code, _, stderr) = kbench(d, &["calibrate", "corpus.toml", "--profile", "nope"]);
    assert_ne!(code, 0);
    messages.push(stderr);

    let (code, _, stderr) = kbench(d, &["calibrate", "corpus.toml", "--out-dir", "exp.toml"]);
    assert_ne!(code, 0);
    messages.push(stderr);

    let only_check = corpus(80.0, 700.0, 700.0).replace("role = \"fit\"", "role = \"check\"");
    std::fs::write(d.join("check.toml"), only_check).unwrap();
    let (code, _, stderr) = kbench(d, &["calibrate", "check.toml"]);
    assert_ne!(code, 0);
    messages.push(stderr);

    // one free parameter too many
    let five = format!(
        "{}{}",
        engine_profile(300.0),
        [
            "host.spec_round_us",
            "host.v2_sync_us",
            "host.decode_step_us",
            "host.spec_per_request_us"
        ]
        .iter()
        .map(|p| format!("\n[[free]]\nparam = \"{p}\"\nprior = 1.0\nmin = 0.0\nmax = 5000.0\n"))
        .collect::<String>()
    );
    std::fs::write(d.join("engine.toml"), five).unwrap();
    let (code, _, stderr) = kbench(d, &["calibrate", "corpus.toml"]);
    assert_ne!(code, 0);
    messages.push(stderr);

    // a hardware profile of the old format, with the engine's terms in it
    let old = format!(
        "{}\n[host]\ndecode_step_us = {{ value = 1.0, source = \"prior\", ref = \"x\" }}\n",
        std::fs::read_to_string(repo_root().join("experiments/hardware/h200.toml")).unwrap()
    );
    std::fs::write(d.join("old.toml"), old).unwrap();
    std::fs::write(
        d.join("exp.toml"),
        EXPERIMENT
            .replace(
                "preset = \"8x-rtx-pro-6000-server\"",
                "profile = \"old.toml\"",
            )
            .replace("tp_size = 8", "tp_size = 1"),
    )
    .unwrap();
    let (code, _, stderr) = kbench(d, &["experiment", "exp.toml"]);
    assert_ne!(code, 0);
    messages.push(stderr);

    // an engine profile for another engine than the experiment runs
    std::fs::write(d.join("exp.toml"), EXPERIMENT).unwrap();
    std::fs::write(
        d.join("engine.toml"),
        engine_profile(300.0).replace("engine = \"sglang\"", "engine = \"vllm\""),
    )
    .unwrap();
    let (code, _, stderr) = kbench(d, &["experiment", "exp.toml"]);
    assert_ne!(code, 0);
    messages.push(stderr);

    for m in &messages {
        assert!(!m.contains("panicked"), "{m}");
        assert_eq!(m.trim().lines().count(), 1, "one line each: {m}");
    }
    let joined = messages.join("").replace(d.to_str().unwrap(), "<tmp>");
    insta::assert_snapshot!(joined);
}
