//! `kbench sglang-args` and `kbench vllm-args`: the launch line carries every server
//! setting the simulator uses, in the engine's own flag names, and is printed only for a
//! deployment that would start.

mod common;

use common::{kbench, repo_root};

fn args_of(command: &str, file: &str, extra: &[&str]) -> (i32, String, String) {
    let mut a = vec![command, file];
    a.extend_from_slice(extra);
    let out = kbench(&repo_root(), &a);
    assert!(!out.2.contains("panicked"), "{}", out.2);
    out
}

fn sets(pairs: &[&'static str]) -> Vec<&'static str> {
    pairs.iter().flat_map(|p| ["--set", *p]).collect()
}

#[test]
fn sglang_args_carries_the_kv_pool_and_prefill_settings() {
    let extra = sets(&[
        "server.mem_fraction_static=0.85",
        "server.max_total_tokens=200000",
        "server.kv_cache_dtype=\"fp8_e4m3\"",
        "server.chunked_prefill_size=4096",
        "server.max_prefill_tokens=8192",
        "server.prefix_caching=false",
        "server.max_model_len=65536",
    ]);
    let (code, out, err) = args_of("sglang-args", "experiments/topk1_v2.toml", &extra);
    assert_eq!(code, 0, "{err}");
    for flag in [
        "--mem-fraction-static 0.85",
        "--max-total-tokens 200000",
        "--kv-cache-dtype fp8_e4m3",
        "--chunked-prefill-size 4096",
        "--max-prefill-tokens 8192",
        "--context-length 65536",
        "--disable-radix-cache",
        // Kimi's tokenizer is code in its repository
        "--trust-remote-code",
    ] {
        assert!(out.contains(flag), "{flag} missing: {out}");
    }
    // unset settings are left to SGLang's defaults, not restated
    let (_, plain, _) = args_of("sglang-args", "experiments/topk1_v2.toml", &[]);
    for flag in [
        "--mem-fraction-static",
        "--chunked-prefill-size",
        "--disable-radix-cache",
    ] {
        assert!(!plain.contains(flag), "{flag} present: {plain}");
    }
}

#[test]
fn no_cuda_graphs_is_said_in_each_engines_words() {
    let extra = sets(&["server.cuda_graph_max_bs=0"]);
    let (_, sglang, _) = args_of("sglang-args", "experiments/topk1_v2.toml", &extra);
    assert!(sglang.contains("--disable-cuda-graph"), "{sglang}");
    assert!(!sglang.contains("--cuda-graph-max-bs"), "{sglang}");
    let mut extra = vec!["--variant", "eagle3-k3"];
    extra.extend(sets(&["server.cuda_graph_max_bs=0"]));
    let (_, vllm, _) = args_of("vllm-args", "experiments/vllm_eagle3.toml", &extra);
    assert!(
        vllm.contains(r#"--compilation-config '{"cudagraph_mode":"NONE"}'"#),
        "{vllm}"
    );
    assert!(!vllm.contains("--max-cudagraph-capture-size"), "{vllm}");
}

#[test]
fn tuning_speculation_with_set_leaves_a_sweeps_plain_variant_plain() {
    let mut extra = vec!["--variant", "eagle3-k3"];
    extra.extend(sets(&["speculative.num_speculative_tokens=5"]));
    let (code, out, err) = args_of("vllm-args", "experiments/vllm_eagle3.toml", &extra);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("# variant").count(), 1, "{out}");
    assert!(out.contains(r#""num_speculative_tokens":5"#), "{out}");
    // every variant: the speculating ones take the flag, the plain ones stay plain
    let extra = sets(&["speculative.num_speculative_tokens=5"]);
    let (code, out, err) = args_of("vllm-args", "experiments/vllm_eagle3.toml", &extra);
    assert_eq!(code, 0, "{err}");
    let plain = out
        .split("# variant ")
        .find(|v| v.starts_with("plain\n"))
        .expect("the plain variant");
    assert!(!plain.contains("--speculative-config"), "{plain}");
    assert_eq!(
        out.matches(r#""num_speculative_tokens":5"#).count(),
        3,
        "{out}"
    );
    // naming the algorithm on the command line turns every variant's speculation on
    let extra = sets(&[
        "speculative.algorithm=\"EAGLE3\"",
        "speculative.num_steps=3",
        "speculative.eagle_topk=1",
        "speculative.num_draft_tokens=4",
    ]);
    let (code, out, err) = args_of("sglang-args", "experiments/spec_vs_plain.toml", &extra);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("# variant").count(), 3, "{out}");
    assert_eq!(out.matches("--speculative-num-steps 3").count(), 3, "{out}");
}

#[test]
fn a_deployment_that_would_not_start_prints_no_line() {
    // Kimi-K2.5 does not fit 4 RTX PRO 6000s
    let (code, out, err) = args_of(
        "sglang-args",
        "experiments/topk1_v2.toml",
        &sets(&["server.tp_size=4"]),
    );
    assert_eq!(code, 3, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("does not fit"), "{err}");
    // one variant that cannot launch: nothing of the others is printed either
    let (code, out, err) = args_of(
        "vllm-args",
        "experiments/vllm_eagle3.toml",
        &sets(&["hardware.preset=\"no-such-gpu\""]),
    );
    assert_eq!(code, 3, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("unknown hardware preset `no-such-gpu`"),
        "{err}"
    );
    // vLLM refuses to start when one request of max_model_len (Kimi's 262,144 by default)
    // does not fit its KV cache: in BF16 at 0.9 on the RTX PRO 6000 box it does not
    let mut extra = vec!["--variant", "eagle3-k3"];
    extra.extend(sets(&[
        "server.mem_fraction_static=0.9",
        "server.kv_cache_dtype=\"bf16\"",
    ]));
    let (code, out, err) = args_of("vllm-args", "experiments/vllm_eagle3.toml", &extra);
    assert_eq!(code, 3, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("vLLM would not start") && err.contains("server.max_model_len"),
        "{err}"
    );
    extra.extend(sets(&["server.max_model_len=32768"]));
    let (code, out, err) = args_of("vllm-args", "experiments/vllm_eagle3.toml", &extra);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--max-model-len 32768"), "{out}");
    assert!(out.contains("--gpu-memory-utilization 0.9"), "{out}");
}

#[test]
fn the_other_engines_file_is_refused_without_a_settings_prefix() {
    let (code, out, err) = args_of("sglang-args", "experiments/vllm_eagle3.toml", &[]);
    assert_eq!(code, 3, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("`kbench vllm-args` prints its launch line"),
        "{err}"
    );
    assert!(!err.contains("[backend.http]"), "{err}");
}

#[test]
fn an_engine_experiment_creates_its_model_before_its_launch_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny.toml");
    let text = std::fs::read_to_string(repo_root().join("experiments/engine_tiny.toml"))
        .unwrap()
        .replace("../target/models/tiny", "model");
    std::fs::write(&file, text).unwrap();
    let (code, out, err) = kbench(dir.path(), &["sglang-args", "tiny.toml"]);
    assert_eq!(code, 0, "{err}");
    assert!(dir.path().join("model/config.json").is_file(), "{err}");
    assert!(out.contains("--speculative-draft-model-path"), "{out}");
}

/// `kbench validate` checks a launch line without running it: a file that launches a
/// 1T-parameter server is not loaded onto eight GPUs only to be stopped.
#[test]
fn validate_checks_the_launch_line_without_starting_the_server() {
    let file = "experiments/http_tiny.toml";
    let extra = sets(&["backend.http.launch.command=[\"kbench-no-such-server\"]"]);
    let (code, out, err) = args_of("validate", file, &extra);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ok: "), "{out}");
    // what the launch line needs is still checked
    let extra = sets(&["backend.http.launch.command=[]"]);
    let (code, _, err) = args_of("validate", file, &extra);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("`command` is empty"), "{err}");
}

/// A sweep whose base file is plain and whose variant turns speculation on: a speculative
/// `--set` tunes the variant and leaves the base plain.
#[test]
fn a_plain_base_stays_plain_under_a_speculative_set() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo_root().join("experiments/baseline.toml")).unwrap();
    let sweep = r#"
[sweep]
[[sweep.variants]]
name = "base"
set = {}

[[sweep.variants]]
name = "chain"
set = { "speculative.algorithm" = "EAGLE3", "speculative.num_steps" = 2, "speculative.eagle_topk" = 1, "speculative.num_draft_tokens" = 3, "draft.preset" = "kimi-k2.5-eagle3" }
"#;
    std::fs::write(dir.path().join("sweep.toml"), format!("{text}{sweep}")).unwrap();
    let file = dir.path().join("sweep.toml");
    let (code, out, err) = args_of(
        "sglang-args",
        file.to_str().unwrap(),
        &sets(&["speculative.num_steps=3", "speculative.num_draft_tokens=4"]),
    );
    assert_eq!(code, 0, "{err}");
    let base = out.split("# variant chain").next().unwrap();
    assert!(!base.contains("--speculative"), "{out}");
    assert!(out.contains("--speculative-num-steps 3"), "{out}");
}

/// A line for the other engine meets that engine's start-up rules, and keys it has no flag
/// for are named rather than dropped in silence.
#[test]
fn a_line_for_the_other_engine_meets_that_engines_rules() {
    // an SGLang file (no [engine]) asked for its vLLM line: vLLM's 0.9 and Kimi's
    // 262,144-token default context do not fit the RTX PRO 6000 box
    let (code, out, err) = args_of("vllm-args", "experiments/baseline.toml", &[]);
    assert_eq!(code, 3, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("vLLM would not start"), "{err}");
    let extra = sets(&["server.max_model_len=4096", "server.max_total_tokens=10000"]);
    let (code, out, err) = args_of("vllm-args", "experiments/baseline.toml", &extra);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--max-model-len 4096"), "{out}");
    assert!(!out.contains("10000"), "{out}");
    assert!(
        err.contains("note: server.max_total_tokens is SGLang's"),
        "{err}"
    );
    // SGLang caps what it admits: the same file's own line needs no max_model_len
    let (code, _, err) = args_of("sglang-args", "experiments/baseline.toml", &[]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn turning_the_custom_all_reduce_off_is_said_in_both_engines_flag() {
    let extra = sets(&["server.custom_all_reduce=false"]);
    let (code, sglang, err) = args_of("sglang-args", "experiments/topk1_v2.toml", &extra);
    assert_eq!(code, 0, "{err}");
    assert!(sglang.contains("--disable-custom-all-reduce"), "{sglang}");
    let mut extra = vec!["--variant", "eagle3-k3"];
    extra.extend(sets(&["server.custom_all_reduce=false"]));
    let (code, vllm, err) = args_of("vllm-args", "experiments/vllm_eagle3.toml", &extra);
    assert_eq!(code, 0, "{err}");
    assert!(vllm.contains("--disable-custom-all-reduce"), "{vllm}");
    // on, as both engines default, it is not restated
    let (_, plain, _) = args_of("sglang-args", "experiments/topk1_v2.toml", &[]);
    assert!(!plain.contains("--disable-custom-all-reduce"), "{plain}");
}

/// A plain file launches on either engine, and the line says when the file's prediction is
/// the other engine's, and what a graph bound means there.
#[test]
fn a_line_for_the_other_engine_says_whose_prediction_the_file_holds() {
    let (code, out, err) = args_of(
        "vllm-args",
        "experiments/baseline.toml",
        &sets(&["server.max_model_len=4096"]),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("vllm serve "), "{out}");
    assert!(
        err.contains("the file predicts SGLang's serving")
            && err.contains("--set engine.name=vllm"),
        "{err}"
    );
    let (code, out, err) = args_of(
        "sglang-args",
        "experiments/vllm_eagle3.toml",
        &["--variant", "plain"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--cuda-graph-max-bs 512"), "{out}");
    assert!(err.contains("the file predicts vLLM's serving"), "{err}");
    assert!(err.contains("counts tokens under vLLM"), "{err}");
    // the file's own engine: no note
    let (_, _, err) = args_of(
        "vllm-args",
        "experiments/vllm_eagle3.toml",
        &["--variant", "plain"],
    );
    assert!(!err.contains("predicts"), "{err}");
}
