//! The largest forward each engine replays from a CUDA graph, where the file is silent:
//! SGLang's `cuda_graph_max_bs` counts requests and grows with the GPU's memory and the TP
//! size (`_handle_gpu_memory_settings`); vLLM's `max_cudagraph_capture_size` counts tokens,
//! twice `max_num_seqs` uniform decodes of `1 + K` tokens, at most 512 (1,024 on compute
//! capability 10.x) and the token budget (`_set_cudagraph_sizes`). A speculative vLLM batch
//! therefore leaves its graphs at a quarter of the requests a plain one does with K = 3.

use std::path::{Path, PathBuf};

use kbench_core::backend::{Backend, CudaGraphBound};
use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_core::report::build_report;
use kbench_sim::cost::{CostModel, PassKind};
use kbench_sim::optable::OpTables;
use kbench_sim::presets::{resolve_engine_profile, resolve_profile};
use kbench_sim::profile::HardwareProfile;
use kbench_sim::sglang_defaults::cuda_graph_max_bs;
use kbench_sim::vllm_defaults::cudagraph_capture_size;
use kbench_sim::SimBackend;

fn trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/ngram-illustrative.synth.kbt")
}

/// Llama-3.1-8B on the H100 box under `engine` (its name, then any `[engine]` lines), with
/// `server` and `spec` lines added.
fn llama(engine: &str, tp: u32, server: &str, spec: &str) -> Experiment {
    let trace = if spec.is_empty() {
        String::new()
    } else {
        format!("trace = {:?}\n", trace().display().to_string())
    };
    let text = format!(
        "name = \"t\"\nseed = 5\n[model]\npreset = \"llama-3.1-8b\"\n[hardware]\npreset = \"8x-h100\"\n\
         [engine]\nname = {engine}\n[server]\ntp_size = {tp}\n{server}\n{spec}\n\
         [workload]\nmax_tokens = 8\ninput_len = 64\n{trace}\
         [benchmark]\nconcurrency = [1]\nrequests_per_level = 1\n"
    );
    load_experiment_str(&text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

const VLLM: &str = "\"vllm\"";
const SGLANG: &str = "\"sglang\"";
const NGRAM_K3: &str = "[speculative]\nmethod = \"ngram\"\nnum_speculative_tokens = 3";

fn h100() -> HardwareProfile {
    resolve_profile(&llama(VLLM, 1, "", "").hardware).unwrap()
}

fn resized(memory_gib: f64, compute_capability: f64) -> HardwareProfile {
    let mut p = h100();
    p.gpu.memory_gib.value = memory_gib;
    p.gpu.compute_capability.as_mut().unwrap().value = compute_capability;
    p
}

#[test]
fn sglang_graphs_more_requests_on_larger_gpus_and_wider_tp() {
    // (GiB, bound at tp 1, bound at tp 8), as server_args.py tabulates them
    let cases = [
        (16.0, 8, 8),
        (24.0, 24, 80),
        (40.0, 32, 160),
        (79.2, 256, 512),
        (95.0, 256, 512),
        (139.8, 256, 512),
        (178.4, 512, 512),
    ];
    for (gib, narrow, wide) in cases {
        let p = resized(gib, 9.0);
        assert_eq!(
            cuda_graph_max_bs(&llama(SGLANG, 1, "", ""), &p),
            narrow,
            "{gib} tp1"
        );
        assert_eq!(
            cuda_graph_max_bs(&llama(SGLANG, 8, "", ""), &p),
            wide,
            "{gib} tp8"
        );
    }
    let set = llama(SGLANG, 8, "cuda_graph_max_bs = 96", "");
    assert_eq!(cuda_graph_max_bs(&set, &h100()), 96);
    // a value off the runner's batch-size grid falls to the step below it, on the plain grid
    // (every 8 to 256) and on the speculative one (every 4 from 40 to 64)
    let off_grid = llama(SGLANG, 8, "cuda_graph_max_bs = 100", "");
    assert_eq!(cuda_graph_max_bs(&off_grid, &h100()), 96);
    let eagle3 = "[draft]\npreset = \"llama-3.1-8b-eagle3\"\n[speculative]\nalgorithm = \"EAGLE3\"\nnum_steps = 3\neagle_topk = 1\nnum_draft_tokens = 4";
    let at_62 =
        |spec: &str| cuda_graph_max_bs(&llama(SGLANG, 8, "cuda_graph_max_bs = 62", spec), &h100());
    assert_eq!(at_62(""), 56);
    assert_eq!(at_62(eagle3), 60);
    // --disable-cuda-graph graphs nothing
    let none = llama(SGLANG, 8, "cuda_graph_max_bs = 0", "");
    assert_eq!(cuda_graph_max_bs(&none, &h100()), 0);
}

#[test]
fn sglang_reserves_memory_for_the_graphs_it_would_capture() {
    let h100 = h100();
    let fraction = |server: &str| {
        let e = llama(SGLANG, 8, server, "");
        kbench_sim::kv::default_mem_fraction_static(&e, &h100, Some(8192))
    };
    // 2 MiB a graphed request: 32 requests fewer than the default of 512 free 960 MiB, but
    // the reserve never falls below 10 GiB on a GPU over 60 GiB
    let default = fraction("");
    assert!(fraction("cuda_graph_max_bs = 32") >= default);
    // --disable-cuda-graph keeps the default's reserve, as SGLang's memory settings do
    assert_eq!(fraction("cuda_graph_max_bs = 0"), default);
    // a larger bound than the default reserves more
    assert!(fraction("cuda_graph_max_bs = 4096") < default);
}

#[test]
fn vllm_bounds_tokens_by_its_sequences_drafts_gpu_and_budget() {
    let h100 = h100();
    // 1,024 sequences by default on an 80 GB GPU: 2,048 tokens, capped at 512
    assert_eq!(cudagraph_capture_size(&llama(VLLM, 1, "", ""), &h100), 512);
    // twice the sequences, each 1 + K tokens wide with speculation
    let four = "max_running_requests = 4";
    assert_eq!(cudagraph_capture_size(&llama(VLLM, 1, four, ""), &h100), 8);
    assert_eq!(
        cudagraph_capture_size(&llama(VLLM, 1, four, NGRAM_K3), &h100),
        32
    );
    // 1,024 on data-center Blackwell (vllm#49390), not on the RTX PRO 6000's 12.0
    let b200 = resized(178.4, 10.0);
    assert_eq!(cudagraph_capture_size(&llama(VLLM, 1, "", ""), &b200), 1024);
    let rtx = resized(94.97, 12.0);
    assert_eq!(cudagraph_capture_size(&llama(VLLM, 1, "", ""), &rtx), 512);
    // never past the token budget
    let budget = llama("\"vllm\"\nmax_num_batched_tokens = 300", 1, "", "");
    assert_eq!(cudagraph_capture_size(&budget, &h100), 300);
    // the budget binds before twice the sequences do: vLLM captures the budget itself
    let narrow_budget = llama(
        "\"vllm\"\nmax_num_batched_tokens = 150",
        1,
        "max_running_requests = 100",
        "",
    );
    assert_eq!(cudagraph_capture_size(&narrow_budget, &h100), 150);
    // with speculation every size is a whole number of uniform decodes: K = 2 gives 504
    // (168 requests of 3 tokens), not 512
    let ngram_k2 = "[speculative]\nmethod = \"ngram\"\nnum_speculative_tokens = 2";
    assert_eq!(
        cudagraph_capture_size(&llama(VLLM, 1, "", ngram_k2), &h100),
        504
    );
    assert_eq!(
        cudagraph_capture_size(&llama(VLLM, 1, "", NGRAM_K3), &h100),
        512
    );
}

#[test]
fn an_explicit_vllm_size_falls_to_the_capture_grid() {
    let h100 = h100();
    let size = |n: u32| {
        let server = format!("cuda_graph_max_bs = {n}");
        cudagraph_capture_size(&llama(VLLM, 1, &server, ""), &h100)
    };
    // 1, 2, 4, then every 8 below 256 and every 16 from 256 (vllm#54933)
    assert_eq!(size(3), 2);
    assert_eq!(size(12), 8);
    assert_eq!(size(256), 256);
    assert_eq!(size(300), 288);
    assert_eq!(size(512), 512);
    // 0 is `cudagraph_mode: NONE`: nothing is graphed
    assert_eq!(size(0), 0);
    // the budget itself is captured off the grid
    let at_budget = llama(
        "\"vllm\"\nmax_num_batched_tokens = 300",
        1,
        "cuda_graph_max_bs = 4096",
        "",
    );
    assert_eq!(cudagraph_capture_size(&at_budget, &h100), 300);
}

fn pass_is_graphed(cost: &CostModel, kind: PassKind, tokens: u32, requests: u32) -> bool {
    cost.explain_pass(kind, tokens, requests, 512.0)
        .unwrap()
        .graph
}

#[test]
fn a_vllm_verify_leaves_its_graphs_by_tokens_and_an_sglang_one_by_requests() {
    let exp = llama(VLLM, 1, "", "");
    let profile = h100();
    let engine = resolve_engine_profile(&exp, &profile).unwrap();
    let tables: Option<OpTables> = None;
    let cost = |bound| {
        CostModel::new(
            profile.clone(),
            engine.clone(),
            tables.clone(),
            exp.model.clone(),
            None,
            1,
            160,
        )
        .unwrap()
        .with_graph_bound(bound)
    };
    let vllm = cost(CudaGraphBound::Tokens(512));
    // 128 requests verifying 3 drafts each are 512 tokens; one more request is past the graphs
    assert!(pass_is_graphed(&vllm, PassKind::TargetVerify, 512, 128));
    assert!(!pass_is_graphed(&vllm, PassKind::TargetVerify, 516, 129));
    assert!(pass_is_graphed(&vllm, PassKind::TargetDecode, 500, 500));
    let sglang = cost(CudaGraphBound::Requests(160));
    assert!(pass_is_graphed(&sglang, PassKind::TargetVerify, 640, 160));
    assert!(!pass_is_graphed(&sglang, PassKind::TargetDecode, 161, 161));
    // a prefill is never graphed
    assert!(!pass_is_graphed(&vllm, PassKind::TargetPrefill, 64, 1));
}

#[test]
fn the_simulator_and_its_report_use_the_engines_own_bound() {
    let vllm = llama(VLLM, 1, "", "");
    let backend = SimBackend::new(&vllm, None).unwrap();
    assert_eq!(
        backend.cuda_graph_bound(),
        Some(CudaGraphBound::Tokens(512))
    );
    let report = build_report(&vllm, None, &backend, &[]);
    assert_eq!(report.experiment.cuda_graph_max_bs, 512);
    assert_eq!(report.experiment.cuda_graph_unit.as_deref(), Some("tokens"));

    let sglang = llama(SGLANG, 8, "", "");
    let backend = SimBackend::new(&sglang, None).unwrap();
    assert_eq!(
        backend.cuda_graph_bound(),
        Some(CudaGraphBound::Requests(512))
    );
    let report = build_report(&sglang, None, &backend, &[]);
    assert_eq!(report.experiment.cuda_graph_max_bs, 512);
    assert_eq!(report.experiment.cuda_graph_unit, None);
    // the file's own value is what both engines get
    let set = llama(SGLANG, 8, "cuda_graph_max_bs = 24", "");
    let backend = SimBackend::new(&set, None).unwrap();
    assert_eq!(
        backend.cuda_graph_bound(),
        Some(CudaGraphBound::Requests(24))
    );
}

#[test]
fn vllm_refuses_a_capture_size_below_one_speculative_decode() {
    use kbench_sim::engine_profile::ModelRunner;
    use kbench_sim::vllm_defaults::check_capture_size;
    let with = |size: u32| llama(VLLM, 1, &format!("cuda_graph_max_bs = {size}"), NGRAM_K3);
    let p = h100();
    // V1's runner rounds every size up to whole 4-token decodes: 2 leaves none
    let err = check_capture_size(&with(2), &p, ModelRunner::V1).unwrap_err();
    assert!(
        err.to_string()
            .contains("No valid cudagraph sizes after rounding to multiple of 4"),
        "{err}"
    );
    assert!(SimBackend::new(&with(2), kbench_sim::acceptance_for(&with(2)).unwrap()).is_err());
    for ok in [4, 0] {
        check_capture_size(&with(ok), &p, ModelRunner::V1).unwrap();
    }
    // Model Runner V2 sizes its graphs without that rounding; a plain file has nothing to round
    check_capture_size(&with(2), &p, ModelRunner::V2).unwrap();
    let plain = llama(VLLM, 1, "cuda_graph_max_bs = 2", "");
    check_capture_size(&plain, &p, ModelRunner::V1).unwrap();
}
