//! Bad input: one clear message, a non-zero exit, never a panic. Messages are pinned.

mod common;

use common::{kbench, BASE, SPEC};

fn run_file(contents: &str, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("exp.toml"), contents).unwrap();
    let mut args = vec!["validate", "exp.toml"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = kbench(dir.path(), &args);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    format!("exit code: {code}\nstdout:\n{stdout}stderr:\n{stderr}")
}

#[test]
fn malformed_toml_points_at_line_and_column() {
    let bad = BASE.replace("tp_size = 8", "tp_size = = 8");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

#[test]
fn unknown_key_suggests_the_right_one() {
    let bad = SPEC.replace("num_steps = 2", "num_step = 2");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

#[test]
fn unknown_key_from_set_suggests_the_right_one() {
    insta::assert_snapshot!(run_file(SPEC, &["--set", "speculative.eagle_top_k=1"]));
}

#[test]
fn chain_with_wrong_draft_token_count_names_sglang_rule() {
    let bad = SPEC.replace("num_draft_tokens = 3", "num_draft_tokens = 5");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

#[test]
fn spec_v2_with_tree_names_sglang_rule() {
    let bad = SPEC
        .replace("eagle_topk = 1", "eagle_topk = 4")
        .replace("num_draft_tokens = 3", "num_draft_tokens = 8");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

#[test]
fn too_many_draft_tokens_names_sglang_rule() {
    let bad = SPEC
        .replace("eagle_topk = 1", "eagle_topk = 2")
        .replace("num_draft_tokens = 3", "num_draft_tokens = 9")
        .replace("spec_v2 = true", "spec_v2 = false");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

#[test]
fn partial_speculative_settings_name_sglang_rule() {
    let bad = SPEC
        .replace("num_draft_tokens = 3\n", "")
        .replace("eagle_topk = 1\n", "eagle_topk = 2\n");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

/// SGLang's NGRAM used to be serde's "unknown variant"; it is named, with the n-gram
/// kbench does simulate.
#[test]
fn sglang_ngram_is_named_as_not_simulated_with_the_one_that_is() {
    let bad = SPEC
        .replace("algorithm = \"EAGLE3\"", "algorithm = \"NGRAM\"")
        .replace(
            "num_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\nspec_v2 = true\n",
            "",
        );
    let out = run_file(&bad, &[]);
    assert!(
        out.contains("SGLang's NGRAM is not simulated yet")
            && out.contains("method = \"ngram\"")
            && !out.contains("unknown variant"),
        "{out}"
    );
    assert!(!out.starts_with("exit code: 0"), "{out}");
}

#[test]
fn zero_concurrency_is_rejected() {
    let bad = BASE.replace("concurrency = [1, 2]", "concurrency = [0, 2]");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

#[test]
fn negative_requests_are_rejected() {
    let bad = BASE.replace("requests_per_level = 4", "requests_per_level = -3");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

#[test]
fn missing_experiment_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = kbench(dir.path(), &["experiment", "nope.toml"]);
    insta::assert_snapshot!(format!("exit code: {code}\nstderr:\n{stderr}"));
}

#[test]
fn bad_set_syntax_is_explained() {
    insta::assert_snapshot!(run_file(BASE, &["--set", "speculative.num_steps"]));
}

#[test]
fn unknown_model_preset_lists_the_known_ones() {
    let bad = BASE.replace("preset = \"kimi-k2.5\"", "preset = \"kimi-k3\"");
    insta::assert_snapshot!(run_file(&bad, &[]));
}

fn run_with_trace(trace_bytes: Option<Vec<u8>>) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("exp.toml"), SPEC).unwrap();
    if let Some(bytes) = trace_bytes {
        std::fs::write(dir.path().join("trace.kbt"), bytes).unwrap();
    }
    let (code, stdout, stderr) = kbench(
        dir.path(),
        &["experiment", "exp.toml", "--json", "out.json"],
    );
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(
        !dir.path().join("out.json").exists(),
        "a failed run left a report"
    );
    // a missing trace is named where it was looked for, which is the temporary folder as the
    // process resolved it (a symlinked TMPDIR reads as its target there)
    let real = dir.path().canonicalize().unwrap();
    let stderr = stderr
        .replace(real.to_str().unwrap(), "[DIR]")
        .replace(dir.path().to_str().unwrap(), "[DIR]");
    format!("exit code: {code}\nstdout:\n{stdout}stderr:\n{stderr}")
}

fn shipped_trace() -> Vec<u8> {
    std::fs::read(common::repo_root().join("traces/kimi-k2.5-eagle3-chat.synth.kbt")).unwrap()
}

#[test]
fn missing_trace_is_named() {
    insta::assert_snapshot!(run_with_trace(None));
}

#[test]
fn truncated_trace_says_where() {
    let mut bytes = shipped_trace();
    bytes.truncate(bytes.len() / 3);
    insta::assert_snapshot!(run_with_trace(Some(bytes)));
}

#[test]
fn corrupt_trace_fails_its_checksum() {
    let mut bytes = shipped_trace();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    insta::assert_snapshot!(run_with_trace(Some(bytes)));
}

#[test]
fn not_a_trace_is_recognised() {
    insta::assert_snapshot!(run_with_trace(Some(b"name,value\n1,2\n".to_vec())));
}

#[test]
fn trace_too_shallow_for_the_config_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = kbench(
        dir.path(),
        &[
            "trace",
            "synth",
            "--accept",
            "0.7,0.6",
            "--sequences",
            "2",
            "--positions",
            "32",
            "--out",
            "t.kbt",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let exp = SPEC
        .replace("trace.kbt", "t.kbt")
        .replace("num_steps = 2", "num_steps = 3")
        .replace("num_draft_tokens = 3", "num_draft_tokens = 4");
    std::fs::write(dir.path().join("exp.toml"), exp).unwrap();
    let (code, _, stderr) = kbench(dir.path(), &["experiment", "exp.toml"]);
    insta::assert_snapshot!(format!("exit code: {code}\nstderr:\n{stderr}"));
}

/// `engine_tiny.toml` with its model created in a fresh directory, run with `sets`.
fn run_engine_tiny(sets: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(common::repo_root().join("experiments/engine_tiny.toml"))
        .unwrap()
        .replace("../target/models/tiny", "tiny");
    std::fs::write(dir.path().join("exp.toml"), text).unwrap();
    let mut args = vec!["experiment", "exp.toml", "-q"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let (code, _, stderr) = kbench(dir.path(), &args);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    format!("exit code: {code}\nstderr:\n{stderr}")
}

#[test]
fn unknown_engine_kernels_are_named() {
    insta::assert_snapshot!(run_engine_tiny(&["backend.engine.kernels=\"fast\""]));
}

#[test]
fn tuned_kernels_on_a_model_they_do_not_fit_name_the_dimension() {
    // Checked before any device is opened, so this holds on machines without a GPU too.
    insta::assert_snapshot!(run_engine_tiny(&[
        "backend.engine.device=\"cuda\"",
        "backend.engine.kernels=\"tuned\""
    ]));
}

#[test]
fn weights_that_do_not_fit_the_gpus_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("exp.toml"),
        BASE.replace("tp_size = 8", "tp_size = 2"),
    )
    .unwrap();
    let (code, stdout, stderr) = kbench(dir.path(), &["experiment", "exp.toml", "-q"]);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    insta::assert_snapshot!(format!(
        "exit code: {code}\nstdout:\n{stdout}stderr:\n{stderr}"
    ));
}

#[test]
fn bad_request_rates_are_named() {
    let mut out = String::new();
    for (label, sets) in [
        ("negative rate", vec!["benchmark.request_rate=[-1.0]"]),
        ("nan rate", vec!["benchmark.request_rate=[nan]"]),
        (
            "zero burstiness",
            vec!["benchmark.request_rate=[2.0]", "benchmark.burstiness=0.0"],
        ),
        (
            "zero cap",
            vec![
                "benchmark.request_rate=[2.0]",
                "benchmark.max_concurrency=0",
            ],
        ),
        ("no levels", vec!["benchmark.concurrency=[]"]),
    ] {
        let mut args = Vec::new();
        for s in &sets {
            args.push("--set");
            args.push(s);
        }
        out.push_str(&format!("## {label}\n{}\n", run_file(SPEC, &args)));
    }
    insta::assert_snapshot!(out);
}

#[test]
fn levels_listed_twice_and_a_cap_with_nothing_to_cap_are_refused() {
    let mut out = String::new();
    for (label, set) in [
        ("concurrency twice", "benchmark.concurrency=[1, 4, 1]"),
        ("rate twice", "benchmark.request_rate=[2.0, 2.0]"),
        ("cap without rates", "benchmark.max_concurrency=4"),
    ] {
        out.push_str(&format!(
            "## {label}\n{}\n",
            run_file(SPEC, &["--set", set])
        ));
    }
    insta::assert_snapshot!(out);
}

/// What a sweep variant's own `set` breaks is told with the variant's name and where it is.
#[test]
fn a_variant_that_breaks_the_file_is_named() {
    let sweep = |variants: &str| format!("{SPEC}\n[sweep]\n{variants}");
    let mut out = String::new();
    for (label, variants) in [
        (
            "unknown key",
            "[[sweep.variants]]\nname = \"deep\"\nset = { \"speculative.num_stesp\" = 3 }\n",
        ),
        (
            "wrong type",
            "[[sweep.variants]]\nname = \"deep\"\nset = { \"speculative.num_steps\" = \"three\" }\n",
        ),
        (
            "set before name, another variant's value like its name",
            "[[sweep.variants]]\nname = \"a\"\nset = { \"workload.max_tokens\" = 64 }\n\
             [[sweep.variants]]\nset = { \"server.tp_sise\" = 8 }\nname = \"b\"\n",
        ),
        (
            "an engine key with no [engine]",
            "[[sweep.variants]]\nname = \"v\"\nset = { \"engine.max_num_batched_tokens\" = 4096 }\n",
        ),
        (
            "one name twice",
            "[[sweep.variants]]\nname = \"a\"\nset = {}\n[[sweep.variants]]\nname = \"a\"\nset = {}\n",
        ),
    ] {
        out.push_str(&format!("## {label}\n{}\n", run_file(&sweep(variants), &[])));
    }
    insta::assert_snapshot!(out);
}

/// A file beside the experiment, then `validate` (or `experiment` when `run`).
fn run_with_files(base: &str, files: &[(&str, &str)], command: &str, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("exp.toml"), base).unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let mut args = vec![command, "exp.toml", "-q"];
    if command == "validate" {
        args.pop();
    }
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = kbench(dir.path(), &args);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    format!("exit code: {code}\nstdout:\n{stdout}stderr:\n{stderr}")
}

#[test]
fn bad_workloads_are_named() {
    let lengths = ["--set", "workload.lengths=\"lengths.toml\""];
    let no_input_len = SPEC.replace("input_len = 32\n", "");
    assert_ne!(no_input_len, SPEC);
    let mut out = String::new();
    for (label, files, sets) in [
        (
            "empty length file",
            vec![("lengths.toml", "")],
            lengths.to_vec(),
        ),
        (
            "malformed length file",
            vec![(
                "lengths.toml",
                "name = \"x\"\nsource = \"s\"\n[[input]]\nrange = [1,\n",
            )],
            lengths.to_vec(),
        ),
        (
            "length file without lengths",
            vec![("lengths.toml", "name = \"x\"\nsource = \"s\"\n")],
            lengths.to_vec(),
        ),
        ("missing length file", vec![], lengths.to_vec()),
        (
            "context beyond the model's maximum",
            vec![],
            vec!["--set", "workload.context_len=300000"],
        ),
        (
            "range ratio above 1",
            vec![],
            vec!["--set", "workload.range_ratio=1.5"],
        ),
        (
            "output range from zero",
            vec![],
            vec!["--set", "workload.output_len_range=[0, 10]"],
        ),
        (
            "unknown KV dtype",
            vec![],
            vec!["--set", "server.kv_cache_dtype=\"int3\""],
        ),
        (
            "memory fraction above 1",
            vec![],
            vec!["--set", "server.mem_fraction_static=1.5"],
        ),
    ] {
        out.push_str(&format!(
            "## {label}\n{}\n",
            run_with_files(
                if sets == lengths { &no_input_len } else { SPEC },
                &files,
                "validate",
                &sets
            )
        ));
    }
    insta::assert_snapshot!(out);
}

#[test]
fn a_request_the_kv_cache_cannot_hold_is_refused_with_the_numbers() {
    insta::assert_snapshot!(run_with_files(
        BASE,
        &[],
        "experiment",
        &["--set", "workload.context_len=200000"]
    ));
}

#[test]
fn a_misspelled_table_is_named_at_the_top_level() {
    let bad = BASE.replacen("[benchmark]", "[benchmarks]", 1);
    assert_ne!(bad, BASE);
    insta::assert_snapshot!(run_file(&bad, &[]));
}

#[test]
fn a_missing_experiment_file_names_the_one_a_character_away() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("topk1_v2.toml"), BASE).unwrap();
    let (code, _, stderr) = kbench(dir.path(), &["validate", "topk1-v2.toml"]);
    let (_, _, far) = kbench(dir.path(), &["validate", "quite-another-name.toml"]);
    insta::assert_snapshot!(format!(
        "exit code: {code}\nstderr:\n{stderr}far from every file:\n{far}"
    ));
}

/// A setting from the command line that breaks a valid file is blamed on its flag, as the
/// user typed it, and exits as a usage error (2).
#[test]
fn flags_are_blamed_as_flags() {
    let cases: &[&[&str]] = &[
        &["--concurrency", "0"],
        &["--concurrency", "4", "0"],
        &["--backend", "gpu"],
        &["--set", "speculative.num_steps=three"],
        &["--set", "benchmark.requests_per_level=0"],
        &["--max-tokens", "0"],
        &["--requests-per-level", "0"],
        &["--backend", "sim", "--server-url", "http://127.0.0.1:1"],
    ];
    let mut out = String::new();
    for flags in cases {
        out.push_str(&format!(
            "$ kbench experiment exp.toml {}\n",
            flags.join(" ")
        ));
        out.push_str(&run_with_files(BASE, &[], "experiment", flags));
        out.push('\n');
    }
    insta::assert_snapshot!(out);
}

/// A preset that does not exist is pointed at in the file, with the ones that do.
#[test]
fn misspelled_presets_name_their_file_and_line() {
    let mut out = String::new();
    for (what, bad) in [
        ("model", BASE.replace("\"kimi-k2.5\"", "\"kimi-k2.6x\"")),
        (
            "hardware",
            BASE.replace("\"8x-rtx-pro-6000-server\"", "\"8x-rtx-pro-600-server\""),
        ),
        (
            "engine",
            format!("{BASE}\n[engine]\nname = \"sglang\"\npreset = \"sglang-8x-rtx\"\n"),
        ),
        ("backend", format!("{BASE}\n[backend]\nkind = \"gpu\"\n")),
    ] {
        out.push_str(&format!("-- {what}\n{}\n", run_file(&bad, &[])));
    }
    insta::assert_snapshot!(out);
}

#[test]
fn too_many_warmup_requests_are_not_called_negative() {
    let out = run_file(BASE, &["--set", "benchmark.warmup_requests=4294967296"]);
    assert!(!out.contains("negative"), "{out}");
    assert!(out.contains("more than one level can count"), "{out}");
    assert!(out.starts_with("exit code: 2"), "{out}");
    let out = run_file(BASE, &["--set", "benchmark.warmup_requests=-1"]);
    assert!(out.contains("is negative"), "{out}");
}

/// A vLLM file on the RTX PRO 6000 box, with a context vLLM can start with there.
fn vllm_spec(method_lines: &str) -> String {
    SPEC.replace("tp_size = 8\n", "tp_size = 8\nmax_model_len = 4096\n").replace(
        "[speculative]\nalgorithm = \"EAGLE3\"\nnum_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\nspec_v2 = true\n",
        &format!("[engine]\nname = \"vllm\"\n\n[speculative]\n{method_lines}\n"),
    )
}

fn refused(out: &str, wanted: &[&str]) {
    assert!(!out.starts_with("exit code: 0"), "{out}");
    for w in wanted {
        assert!(out.contains(w), "`{w}` missing: {out}");
    }
}

/// An engine kbench does not know is reported as that, before any engine's speculative
/// rules are applied to the file.
#[test]
fn an_unknown_engine_is_named_before_speculative_rules() {
    let bad = vllm_spec("method = \"eagle3\"\nnum_speculative_tokens = 3")
        .replace("name = \"vllm\"", "name = \"vlm\"");
    let out = run_file(&bad, &[]);
    refused(&out, &["unknown engine `vlm`", "use sglang or vllm"]);
    assert!(!out.contains("set name"), "{out}");
}

/// vLLM's `eagle` feeds its head one hidden state; the heads kbench reads take three.
#[test]
fn vllm_eagle_with_an_eagle3_head_is_refused() {
    let bad = vllm_spec("method = \"eagle\"\nnum_speculative_tokens = 3");
    refused(
        &run_file(&bad, &[]),
        &[
            "EAGLE-1",
            "`kimi-k2.5-eagle3` is an EAGLE-3 head",
            "method = \"eagle3\"",
        ],
    );
}

/// A trace replays the drafter it was made for.
#[test]
fn a_trace_of_another_drafter_is_refused() {
    let traces = common::repo_root().join("traces");
    let ngram = traces.join("ngram-illustrative.synth.kbt");
    let eagle3 = traces.join("kimi-k2.5-eagle3-chat.synth.kbt");
    let with_trace = |text: &str, trace: &std::path::Path| {
        text.replace(
            "trace = \"trace.kbt\"",
            &format!(
                "trace = {}",
                toml::Value::String(trace.display().to_string())
            ),
        )
    };
    let eagle_on_ngram = with_trace(
        &vllm_spec("method = \"eagle3\"\nnum_speculative_tokens = 3"),
        &ngram,
    );
    refused(
        &run_file(&eagle_on_ngram, &[]),
        &["n-gram prompt lookup's", "eagle3"],
    );
    let sglang_on_ngram = with_trace(SPEC, &ngram);
    refused(
        &run_file(&sglang_on_ngram, &[]),
        &["n-gram prompt lookup's"],
    );
    // the converse is not judged: a trace's draft is free text
    let ngram_on_eagle = with_trace(
        &vllm_spec("method = \"ngram\"\nnum_speculative_tokens = 3"),
        &eagle3,
    );
    let out = run_file(&ngram_on_eagle, &[]);
    assert!(out.starts_with("exit code: 0"), "{out}");
    // each with its own kind of trace runs
    let fine = with_trace(
        &vllm_spec("method = \"ngram\"\nnum_speculative_tokens = 3"),
        &ngram,
    );
    let out = run_file(&fine, &[]);
    assert!(out.starts_with("exit code: 0"), "{out}");
}

#[test]
fn an_engine_key_without_an_engine_section_asks_for_its_name() {
    let out = run_file(BASE, &["--set", "engine.max_num_batched_tokens=4096"]);
    refused(&out, &["[engine] has no `name`", "engine.name = \"vllm\""]);
    assert!(!out.contains("missing field"), "{out}");
}

#[test]
fn counts_past_what_a_level_can_count_are_refused_with_the_limit() {
    let out = run_file(
        &BASE.replace("concurrency = [1, 2]", "concurrency = [99999999999]"),
        &[],
    );
    refused(
        &out,
        &["more streams than a level counts (at most 4294967295)"],
    );
    assert!(!out.contains("not a positive count"), "{out}");
    let out = run_file(
        &BASE.replace("requests_per_level = 4", "requests_per_level = 99999999999"),
        &[],
    );
    refused(&out, &["more requests than a level counts"]);
}

/// Flags are checked as the file's own keys are, and outputs before the run: a negative
/// level reads as a level, not as an unknown flag, and a report that cannot be written
/// stops the run before it starts, leaving no file behind.
#[test]
fn experiment_flags_and_outputs_are_checked_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("exp.toml"), BASE).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["experiment", "exp.toml"];
        args.extend_from_slice(extra);
        let (code, _, stderr) = kbench(dir.path(), &args);
        assert!(!stderr.contains("panicked"), "{stderr}");
        (code, stderr)
    };
    let (code, err) = run(&["--concurrency", "-1"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("concurrency -1 is not a positive count"),
        "{err}"
    );
    let (code, err) = run(&["--max-tokens", "5000000000"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("more output tokens than a request can ask"),
        "{err}"
    );
    let (code, err) = run(&["--request-rate", "nan"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--request-rate nan: a number of requests per second above 0"),
        "{err}"
    );
    let (code, err) = run(&["--csv", "out.csv", "--json", "missing/report.json"]);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("cannot write missing/report.json: the directory missing does not exist"),
        "{err}"
    );
    assert!(!dir.path().join("out.csv").exists());
    let (code, err) = run(&["--json", "."]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("it is a directory"), "{err}");
    // a recording, minutes long, is not made only to find nowhere to write it
    let (code, _, err) = kbench(
        dir.path(),
        &[
            "trace",
            "record",
            "--model",
            "no-such-model",
            "-o",
            "missing/t.kbt",
        ],
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("cannot write missing/t.kbt"), "{err}");
}

/// A rate so low that a level's arrivals would span past what integer nanoseconds hold is
/// refused, never an overflow in the simulator's clock.
#[test]
fn a_rate_too_low_for_the_virtual_clock_is_refused() {
    let bad = BASE.replace(
        "concurrency = [1, 2]",
        "concurrency = []\nrequest_rate = [1e-300]",
    );
    let out = run_file(&bad, &[]);
    refused(&out, &["request_rate 1e-300", "virtual clock"]);
    assert!(!out.contains("panicked"), "{out}");
}
