//! The engine as a kbench backend: the harness drives it like any other.

use kbench_core::backend::Backend;
use kbench_core::experiment::load_experiment;
use kbench_core::harness::{run_levels, LoadPlan, NoProgress};
use kbench_engine::{ensure_tiny_model, EngineBackend};

/// An EAGLE-3 (3, 1, 4) experiment on the tiny model under `models/tiny`, with `benchmark`
/// as its `[benchmark]` table.
fn tiny_experiment(name: &str, benchmark: &str) -> String {
    format!(
        r#"
name = "{name}"
seed = 7
[model]
config = "models/tiny/config.json"
[hardware]
preset = "h200"
[server]
tp_size = 1
[draft]
config = "models/tiny/draft/config.json"
[speculative]
algorithm = "EAGLE3"
num_steps = 3
eagle_topk = 1
num_draft_tokens = 4
[workload]
max_tokens = 12
input_len = 16
[benchmark]
{benchmark}
[backend]
kind = "engine"
[backend.engine]
model_dir = "models/tiny"
"#
    )
}

#[test]
fn engine_backend_serves_an_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("models/tiny");
    assert!(ensure_tiny_model(&model_dir).unwrap());
    assert!(!ensure_tiny_model(&model_dir).unwrap());
    let exp_text = tiny_experiment(
        "engine_test",
        "concurrency = [1, 3]\nrequests_per_level = 4\nwarmup_requests = 1",
    );
    let path = dir.path().join("exp.toml");
    std::fs::write(&path, exp_text).unwrap();
    let variants = load_experiment(&path, &[]).unwrap();
    let exp = &variants[0].experiment;
    let mut backend = EngineBackend::new(exp).unwrap();
    assert_eq!(backend.name(), "engine");
    assert!(backend.describe().contains("EAGLE-3 (3, 1, 4)"));
    let plan = LoadPlan::from_experiment(exp).keeping_records();
    let levels = run_levels(&mut backend, &plan, &mut NoProgress).unwrap();
    assert_eq!(levels.len(), 2);
    let mut by_id = std::collections::BTreeMap::new();
    for l in &levels {
        assert_eq!(l.records.len(), 5);
        for r in &l.records {
            assert_eq!(r.token_times_ns.len(), 12);
            assert!(r.token_times_ns.windows(2).all(|w| w[0] <= w[1]));
            assert!(r.token_times_ns[0] >= r.submitted_ns);
            assert_eq!(r.round_commits.iter().sum::<u32>(), 11);
            by_id.insert(r.id, r.round_commits.clone());
        }
    }
    // Same request ids at another run give the same rounds (real, deterministic tokens).
    let levels2 = run_levels(&mut backend, &plan, &mut NoProgress).unwrap();
    for l in &levels2 {
        for r in &l.records {
            assert_eq!(by_id[&r.id], r.round_commits);
        }
    }
}

/// experiments/engine_tiny.toml as shipped, with the tiny model where it expects it.
#[test]
fn shipped_engine_tiny_experiment_runs() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("experiments")).unwrap();
    let path = root.path().join("experiments/engine_tiny.toml");
    std::fs::write(&path, include_str!("../../../experiments/engine_tiny.toml")).unwrap();
    ensure_tiny_model(&root.path().join("target/models/tiny")).unwrap();
    let variants = load_experiment(&path, &[]).unwrap();
    let exp = &variants[0].experiment;
    assert_eq!(exp.file.backend.kind, "engine");
    let mut backend = EngineBackend::new(exp).unwrap();
    let plan = LoadPlan::from_experiment(exp).keeping_records();
    let levels = run_levels(&mut backend, &plan, &mut NoProgress).unwrap();
    for l in &levels {
        assert!(l.records.iter().all(|r| r.token_times_ns.len() == 32));
        let (sum, n) = l
            .records
            .iter()
            .filter(|r| !r.warmup)
            .fold((0u32, 0usize), |(s, n), r| {
                (
                    s + r.round_commits.iter().sum::<u32>(),
                    n + r.round_commits.len(),
                )
            });
        let al = sum as f64 / n as f64;
        assert!(al > 1.5 && al <= 4.0, "accept length {al}");
    }
}

/// The deadline side of the seam: `advance_to` runs forwards until the wall clock passes the
/// deadline (sleeping when idle), chunk events add up to each request's tokens, and a
/// cancelled request leaves the batch.
#[test]
fn engine_session_advances_to_deadlines_and_cancels() {
    use kbench_core::backend::Request;
    use kbench_core::experiment::VerifyMethod;
    use kbench_engine::SpeculativeSettings;
    let dir = tempfile::tempdir().unwrap();
    ensure_tiny_model(dir.path()).unwrap();
    let model = kbench_engine::Model::load(
        dir.path(),
        Some(&dir.path().join("draft")),
        kbench_engine::Device::Cpu,
    )
    .unwrap();
    let spec = SpeculativeSettings::new(3, 1, 4, VerifyMethod::Greedy).unwrap();
    let mut backend = EngineBackend::from_model(model, Some(spec), false, 8, 0.0, 1);
    let mut session = backend.start_level(4).unwrap();
    session.record_chunks();
    // idle: the clock reaches the deadline
    let start = session.now_ns();
    assert!(session.advance_to(start + 20_000_000).unwrap().is_empty());
    assert!(session.now_ns() >= start + 20_000_000);
    for id in 0..3 {
        session
            .submit(Request {
                id,
                input_len: 8,
                max_tokens: 24,
                warmup: false,
                ..Request::default()
            })
            .unwrap();
    }
    assert!(session.cancel(2));
    assert!(!session.cancel(99));
    let mut done = Vec::new();
    let deadline = session.now_ns() + 60_000_000_000;
    while done.len() < 2 {
        let now = session.now_ns();
        done.extend(session.advance_to(now + 1_000_000).unwrap());
        assert!(session.now_ns() < deadline, "requests never finished");
    }
    let chunks = session.take_chunks();
    assert!(
        chunks.iter().all(|c| c.id != 2),
        "the cancelled request was served"
    );
    for r in &done {
        let mine: Vec<_> = chunks.iter().filter(|c| c.id == r.id).collect();
        assert_eq!(mine.iter().map(|c| c.tokens).sum::<u32>(), 24);
        assert!(!mine[0].spec_round && mine[1..].iter().all(|c| c.spec_round));
        assert_eq!(mine.len() - 1, r.round_commits.len());
        assert!(mine.last().unwrap().finished && mine.iter().filter(|c| c.finished).count() == 1);
        assert_eq!(mine.last().unwrap().visible_ns, r.finished_ns());
    }
    assert!(session.take_chunks().is_empty());
}

#[test]
fn engine_backend_runs_request_rate_levels() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ensure_tiny_model(&dir.path().join("models/tiny")).unwrap());
    let exp_text = tiny_experiment(
        "engine_rate_test",
        "request_rate = [50.0, inf]\nmax_concurrency = 2\nrequests_per_level = 6\nwarmup_requests = 1",
    );
    let path = dir.path().join("exp.toml");
    std::fs::write(&path, exp_text).unwrap();
    let exp = &load_experiment(&path, &[]).unwrap()[0].experiment;
    let mut backend = EngineBackend::new(exp).unwrap();
    let levels = run_levels(
        &mut backend,
        &LoadPlan::from_experiment(exp).keeping_records(),
        &mut NoProgress,
    )
    .unwrap();
    assert_eq!(levels.len(), 2);
    for l in &levels {
        let m = &l.metrics;
        assert_eq!(m.completed, 6);
        assert_eq!(m.concurrency, 2);
        assert!(m.max_concurrent_requests.unwrap() <= 2);
        assert!(l.records.iter().all(|r| r.token_times_ns.len() == 12));
    }
    // all at once behind a cap of 2: the later requests wait at the client
    let inf = &levels[1].metrics;
    assert_eq!(inf.request_rate, Some(f64::INFINITY));
    assert!(inf.p99_queue_delay_ms.unwrap() > 0.0);
}

#[test]
fn engine_backend_draws_the_workloads_lengths_and_stops_as_at_eos() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ensure_tiny_model(&dir.path().join("models/tiny")).unwrap());
    let exp_text = tiny_experiment(
        "engine_lengths_test",
        "request_rate = [40.0]\nrequests_per_level = 6\nwarmup_requests = 0",
    )
    .replace(
        "max_tokens = 12\ninput_len = 16",
        "max_tokens = 12\ninput_len_range = [4, 20]\noutput_len_range = [2, 9]\nignore_eos = false\nshared_prefix_len = 3",
    );
    let path = dir.path().join("exp.toml");
    std::fs::write(&path, exp_text).unwrap();
    let exp = &load_experiment(&path, &[]).unwrap()[0].experiment;
    let plan = LoadPlan::from_experiment(exp).keeping_records();
    let mut backend = EngineBackend::new(exp).unwrap();
    let levels = run_levels(&mut backend, &plan, &mut NoProgress).unwrap();
    let l = &levels[0];
    assert_eq!(l.metrics.completed, 6);
    for r in &l.records {
        let want = plan.workload.request(plan.seed, r.id);
        assert_eq!(r.input_len, want.input_len);
        assert_eq!(r.requested_tokens, 12);
        assert_eq!(Some(r.output_tokens()), want.stop_at);
    }
    assert_eq!(l.metrics.requested_output_tokens, Some(6 * 12));
    // every request's prompt starts with the same three tokens
    let prompts: Vec<Vec<u32>> = l
        .records
        .iter()
        .map(|r| {
            let req = kbench_core::harness::make_request(
                &plan,
                0x8000_0000,
                (r.id & 0x7fff_ffff) as u32,
                false,
            );
            backend.prompt_for(plan.seed, &req)
        })
        .collect();
    assert!(prompts.windows(2).all(|w| w[0][..3] == w[1][..3]));
}

/// The engine's draft is an EAGLE-3 head: an experiment that drafts otherwise (SGLang's
/// NEXTN, vLLM's mtp or n-gram) is refused by name before any checkpoint is read.
#[test]
fn the_engine_refuses_drafts_that_are_not_an_eagle3_head() {
    let dir = tempfile::tempdir().unwrap();
    for (engine, speculative, name) in [
        (
            "",
            "algorithm = \"NEXTN\"\nnum_steps = 1\neagle_topk = 1\nnum_draft_tokens = 2",
            "NEXTN",
        ),
        (
            "[engine]\nname = \"vllm\"\n",
            "method = \"mtp\"\nnum_speculative_tokens = 1",
            "mtp",
        ),
    ] {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "name = \"t\"\n[model]\npreset = \"deepseek-v3\"\n[hardware]\npreset = \"8x-h200\"\n\
                 {engine}[server]\ntp_size = 8\n[speculative]\n{speculative}\n[workload]\n\
                 accept_length = 1.8\nmax_tokens = 8\ninput_len = 8\n[benchmark]\nconcurrency = [1]\n\
                 requests_per_level = 1\n[backend]\nkind = \"engine\"\n"
            ),
        )
        .unwrap();
        let exp = &load_experiment(&path, &[]).unwrap()[0].experiment;
        let e = kbench_engine::open(exp).err().expect("refused").to_string();
        assert!(
            e.contains("EAGLE-3 head only") && e.contains(&format!("`{name}`")),
            "{e}"
        );
    }
}
