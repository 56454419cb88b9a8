//! Properties of the simulator: conservation, determinism, monotonicity in acceptance,
//! v2 never slower than v1. Small workloads and modest case counts keep them fast in debug.

use std::path::Path;
use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::backend::RequestRecord;
use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_core::harness::{run_levels, LevelResult, NoProgress};
use kbench_sim::acceptance::{ConstantAcceptance, DepthRateAcceptance};
use kbench_sim::predict::load_plan;
use kbench_sim::SimBackend;
use proptest::prelude::*;

fn experiment(spec: &str, levels: &str, max_tokens: u32, input_len: u32) -> Experiment {
    let draft = if spec.contains("EAGLE3") {
        "[draft]\npreset = \"kimi-k2.5-eagle3\"\n"
    } else {
        ""
    };
    let text = format!(
        "name = \"t\"\nseed = 7\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-rtx-pro-6000-server\"\n\
         [server]\ntp_size = 8\n{draft}[speculative]\n{spec}\n[workload]\nmax_tokens = {max_tokens}\ninput_len = {input_len}\n\
         [benchmark]\nconcurrency = {levels}\nrequests_per_level = 6\nwarmup_requests = 1\n"
    );
    load_experiment_str(&text, Path::new("test.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

fn run(exp: &Experiment, acc: Arc<dyn AcceptanceModel>) -> Vec<LevelResult> {
    let mut b = SimBackend::new(exp, Some(acc)).unwrap();
    run_levels(&mut b, &load_plan(exp).keeping_records(), &mut NoProgress).unwrap()
}

fn records(levels: &[LevelResult]) -> Vec<RequestRecord> {
    levels.iter().flat_map(|l| l.records.clone()).collect()
}

const CHAIN_V1: &str =
    "algorithm = \"EAGLE3\"\nnum_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\nspec_v2 = false";
const CHAIN_V2: &str =
    "algorithm = \"EAGLE3\"\nnum_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\nspec_v2 = true";
const TREE_V1: &str = "algorithm = \"EAGLE3\"\nnum_steps = 3\neagle_topk = 4\nnum_draft_tokens = 8";

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn tokens_are_conserved(max_tokens in 1u32..40, input_len in 1u32..600, seed in 0u64..1000, which in 0usize..4) {
        let spec = ["algorithm = \"none\"", CHAIN_V1, CHAIN_V2, TREE_V1][which];
        let exp = experiment(spec, "[1, 3, 8]", max_tokens, input_len);
        let levels = run(&exp, Arc::new(DepthRateAcceptance::kimi_chat(seed)));
        for r in records(&levels) {
            prop_assert_eq!(r.output_tokens(), max_tokens);
            prop_assert!(r.token_times_ns.windows(2).all(|w| w[0] <= w[1]));
            prop_assert!(r.token_times_ns[0] > r.submitted_ns);
            if exp.speculative.is_speculative() {
                prop_assert_eq!(r.round_commits.iter().sum::<u32>(), max_tokens - 1);
                prop_assert!(r.round_commits.iter().all(|&c| c >= 1 && c <= exp.speculative.shape.num_steps + 1));
            } else {
                prop_assert!(r.round_commits.is_empty());
            }
        }
    }

    #[test]
    fn higher_acceptance_never_predicts_lower_throughput(accept in 1u32..3, input_len in 16u32..600) {
        let exp = experiment(TREE_V1, "[1, 4, 16]", 60, input_len);
        let lo = run(&exp, Arc::new(ConstantAcceptance(accept)));
        let hi = run(&exp, Arc::new(ConstantAcceptance(accept + 1)));
        for (a, b) in lo.iter().zip(&hi) {
            prop_assert!(b.metrics.output_throughput >= a.metrics.output_throughput,
                "C={}: accept {} -> {:.2}, accept {} -> {:.2}", a.concurrency, accept,
                a.metrics.output_throughput, accept + 1, b.metrics.output_throughput);
        }
    }

    #[test]
    fn v2_is_never_slower_than_v1(seed in 0u64..1000, input_len in 16u32..600) {
        let acc: Arc<dyn AcceptanceModel> = Arc::new(DepthRateAcceptance::kimi_chat(seed));
        let v1 = run(&experiment(CHAIN_V1, "[1, 4, 16, 64]", 50, input_len), Arc::clone(&acc));
        let v2 = run(&experiment(CHAIN_V2, "[1, 4, 16, 64]", 50, input_len), acc);
        for (a, b) in v1.iter().zip(&v2) {
            prop_assert!(b.metrics.output_throughput >= a.metrics.output_throughput * (1.0 - 1e-12),
                "C={}: v1 {:.2} > v2 {:.2}", a.concurrency, a.metrics.output_throughput, b.metrics.output_throughput);
        }
    }
}

#[test]
fn two_runs_are_identical() {
    let exp = experiment(TREE_V1, "[1, 5, 12]", 40, 300);
    let a = run(&exp, Arc::new(DepthRateAcceptance::kimi_chat(3)));
    let b = run(&exp, Arc::new(DepthRateAcceptance::kimi_chat(3)));
    assert_eq!(records(&a), records(&b));
    let (ma, mb): (Vec<_>, Vec<_>) = (
        a.iter().map(|l| &l.metrics).collect(),
        b.iter().map(|l| &l.metrics).collect(),
    );
    assert_eq!(ma, mb);
}

#[test]
fn speculation_without_acceptance_is_an_error() {
    let exp = experiment(CHAIN_V2, "[1]", 10, 10);
    let e = SimBackend::new(&exp, None)
        .err()
        .expect("needs acceptance")
        .to_string();
    assert!(e.contains("acceptance"), "{e}");
}

#[test]
fn bad_profile_names_file_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, "name = \"x\"\n[gpu]\nname = \"g\"\ncount = 1\n").unwrap();
    let e = kbench_sim::HardwareProfile::from_file(&p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.toml"), "{e}");
    let missing = kbench_sim::HardwareProfile::from_file(&dir.path().join("none.toml"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("none.toml"), "{missing}");
}

#[test]
fn breakdown_sums_to_round_time() {
    let exp = experiment(TREE_V1, "[1]", 10, 512);
    let b = SimBackend::new(&exp, Some(Arc::new(ConstantAcceptance(2)))).unwrap();
    for bs in [1, 8, 48] {
        let r = b.explain_round(bs, 600.0).unwrap();
        let ns = b.cost_model().round_ns(bs, 600.0, Some(b.spec())).unwrap() as f64;
        assert!(
            (r.total_us * 1e3 - ns).abs() <= 1.0,
            "{} vs {}",
            r.total_us * 1e3,
            ns
        );
        for p in &r.passes {
            let items: f64 = p.gpu_us.values().sum();
            assert!(
                (items - p.gpu_total_us).abs() < 1e-6 * p.gpu_total_us.max(1.0),
                "{items} vs {}",
                p.gpu_total_us
            );
        }
    }
}

/// Advancing to deadlines serves what running to completions serves: the same records, and
/// chunk events that retell each record's token times.
#[test]
fn sim_advance_to_matches_run_until_completion() {
    use kbench_core::backend::{Backend, Request};
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/topk1_v2.toml");
    let exp = kbench_core::experiment::load_experiment(&root, &[])
        .unwrap()
        .remove(0)
        .experiment;
    let t = kbench_core::trace::read(exp.trace.as_ref().unwrap()).unwrap();
    let acc = std::sync::Arc::new(
        kbench_core::trace::TraceAcceptance::for_spec(
            std::sync::Arc::new(t),
            exp.file.seed,
            &exp.speculative,
        )
        .unwrap(),
    );
    let requests: Vec<Request> = (0..6)
        .map(|id| Request {
            id,
            input_len: 64 + 8 * id as u32,
            max_tokens: 30 + id as u32,
            warmup: false,
            ..Request::default()
        })
        .collect();
    let mut a = kbench_sim::SimBackend::new(&exp, Some(acc.clone())).unwrap();
    let mut s = a.start_level(8).unwrap();
    for r in &requests {
        s.submit(r.clone()).unwrap();
    }
    let mut want = Vec::new();
    while want.len() < requests.len() {
        want.extend(s.run_until_completion().unwrap());
    }
    drop(s);
    let mut b = kbench_sim::SimBackend::new(&exp, Some(acc)).unwrap();
    let mut s = b.start_level(8).unwrap();
    s.record_chunks();
    // idle: the clock moves to the deadline
    assert!(s.advance_to(5_000).unwrap().is_empty());
    assert_eq!(s.now_ns(), 5_000);
    for r in &requests {
        s.submit(r.clone()).unwrap();
    }
    let mut got = Vec::new();
    let mut deadline = 5_000;
    while got.len() < requests.len() {
        deadline += 10_000_000;
        got.extend(s.advance_to(deadline).unwrap());
        assert!(deadline < 1_000_000_000_000, "never finished");
    }
    let chunks = s.take_chunks();
    want.sort_by_key(|r| r.id);
    got.sort_by_key(|r| r.id);
    for (w, g) in want.iter().zip(&got) {
        // the same schedule, shifted by the 5 us the second session idled first
        assert_eq!(w.round_commits, g.round_commits);
        let shifted: Vec<u64> = w.token_times_ns.iter().map(|t| t + 5_000).collect();
        assert_eq!(shifted, g.token_times_ns);
        let mut times = Vec::new();
        for c in chunks.iter().filter(|c| c.id == g.id) {
            times.extend(std::iter::repeat_n(c.visible_ns, c.tokens as usize));
        }
        assert_eq!(times, g.token_times_ns);
    }
    assert!(!s.cancel(0), "finished requests are gone");
}

fn rate_experiment(rates: &str, cap: Option<u32>, burstiness: f64) -> Experiment {
    let cap = cap
        .map(|c| format!("max_concurrency = {c}\n"))
        .unwrap_or_default();
    let text = format!(
        "name = \"t\"\nseed = 7\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-rtx-pro-6000-server\"\n\
         [server]\ntp_size = 8\n[draft]\npreset = \"kimi-k2.5-eagle3\"\n[speculative]\nalgorithm = \"EAGLE3\"\nnum_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\n\
         [workload]\nmax_tokens = 40\ninput_len = 64\n\
         [benchmark]\nrequest_rate = {rates}\nburstiness = {burstiness}\n{cap}requests_per_level = 40\nwarmup_requests = 2\n"
    );
    load_experiment_str(&text, Path::new("test.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Open-loop levels: every request finishes once, the cap is never passed, a request is
    /// never timed from before it arrived, and the same inputs give the same bytes.
    #[test]
    fn rate_levels_finish_everything_within_the_cap(
        rate in 0.5f64..40.0,
        cap in proptest::option::of(1u32..24),
        burstiness in 0.25f64..4.0,
    ) {
        let exp = rate_experiment(&format!("[{rate}, inf]"), cap, burstiness);
        let acc: Arc<dyn AcceptanceModel> = Arc::new(DepthRateAcceptance::kimi_chat(7));
        let levels = run(&exp, acc.clone());
        prop_assert_eq!(levels.len(), 2);
        for l in &levels {
            let m = &l.metrics;
            prop_assert_eq!(m.completed, 40);
            prop_assert!(m.request_rate.is_some());
            let peak = m.max_concurrent_requests.unwrap();
            prop_assert!(peak >= 1 && peak <= cap.unwrap_or(u32::MAX), "peak {}", peak);
            let mut ids: Vec<u64> = l.records.iter().map(|r| r.id).collect();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), 42);
            for r in &l.records {
                prop_assert!(r.token_times_ns[0] >= r.submitted_ns);
            }
            if cap.is_none() {
                prop_assert_eq!(m.p99_queue_delay_ms, Some(0.0));
            }
        }
        let again = run(&exp, acc);
        prop_assert_eq!(records(&levels), records(&again));
    }
}

#[test]
fn a_higher_rate_never_lowers_the_wait_for_a_capped_client() {
    let exp = rate_experiment("[1, 4, 16, inf]", Some(4), 1.0);
    let levels = run(&exp, Arc::new(DepthRateAcceptance::kimi_chat(7)));
    let waits: Vec<f64> = levels
        .iter()
        .map(|l| l.metrics.mean_queue_delay_ms.unwrap())
        .collect();
    assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
    assert!(waits[3] > waits[0]);
}
