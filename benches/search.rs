//! `kbench search` speed (issue 11). Targets, on the 2-core machine:
//! - 1,000 candidates x 7 concurrency levels x 64 requests x 200 tokens in under 10 s;
//! - `kbench experiment experiments/topk1_v2.toml` as a process: under 10 ms of its own
//!   beyond the sweep it simulates, and at least 10,000x faster than the time it models.
//!
//! Before measuring, each prints what it covers once (candidates run, virtual time).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use kbench_core::acceptance::AcceptanceModel;
use kbench_core::experiment::load_experiment;
use kbench_core::harness::{run_levels, LoadPlan, NoProgress};
use kbench_core::trace::{self, TraceAcceptance};
use kbench_search::{evaluate, prepare, SearchFlags};
use kbench_sim::SimBackend;

/// The shipped search widened to 1,026 candidates that all run: chains and trees of 1-8
/// steps, 1-8 wide, every draft-token count SGLang accepts, v1 (v2 needs chains), at two
/// batch caps, and plain decoding at both.
fn thousand_candidates_flags() -> SearchFlags {
    SearchFlags {
        space: vec![
            "speculative.num_steps=1..8".into(),
            "speculative.eagle_topk=[1, 2, 4, 8]".into(),
            "speculative.spec_v2=false".into(),
            "server.max_running_requests=[32, 48]".into(),
        ],
        ..SearchFlags::default()
    }
}

fn search(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("experiments/search_kimi.toml");
    let flags = thousand_candidates_flags();
    let run = || {
        let p = prepare(&file, &[], &flags).expect("the search prepares");
        let e = evaluate(&p, 0, &|_, _| {}).expect("the search runs");
        kbench_search::report::build(&p, &e).expect("the search reports")
    };
    let started = Instant::now();
    let r = run();
    eprintln!(
        "search: {} candidates ({} ran) x 7 levels x 64 requests x 200 tokens on {} threads in {:.2} s",
        r.candidates_total,
        r.ran,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        started.elapsed().as_secs_f64()
    );
    c.bench_function("search/1026_candidates_7x64x200", |b| b.iter(run));
}

fn process(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("experiments/topk1_v2.toml");
    let exp = load_experiment(&file, &[])
        .expect("experiment loads")
        .remove(0)
        .experiment;
    let t = trace::read(exp.trace.as_ref().expect("the file names a trace")).expect("trace reads");
    let t = Arc::new(t);
    let plan = LoadPlan::from_experiment(&exp);
    // A fresh replay each time, as the process has: a warm one would skip the replays the
    // process does and count them as its overhead.
    let sweep_with = |plan: &LoadPlan| {
        let acceptance: Arc<dyn AcceptanceModel> = Arc::new(
            TraceAcceptance::for_spec(Arc::clone(&t), exp.file.seed, &exp.speculative).unwrap(),
        );
        let mut backend = SimBackend::new(&exp, Some(acceptance)).unwrap();
        run_levels(&mut backend, plan, &mut NoProgress).unwrap()
    };
    // timed as the process runs it, without records
    let sweep = || sweep_with(&plan);
    let spawn = || {
        let status = Command::new(env!("CARGO_BIN_EXE_kbench"))
            .args(["experiment", "-q"])
            .arg(&file)
            .status()
            .expect("kbench runs");
        assert!(status.success());
    };
    // the virtual time each level spans, warm-up included, is read from its records
    let levels = sweep_with(&plan.clone().keeping_records());
    let simulated: f64 = levels
        .iter()
        .map(|l| l.records.iter().map(|r| r.finished_ns()).max().unwrap_or(0) as f64 / 1e9)
        .sum();
    // best of several, in one run, so the two are compared on the same machine state
    let best = |f: &dyn Fn()| {
        (0..15)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .min()
            .unwrap_or(Duration::ZERO)
    };
    let in_process = best(&|| {
        sweep();
    });
    let whole = best(&spawn);
    eprintln!(
        "topk1_v2: {simulated:.1} s of virtual time; the sweep in-process {:.1} ms, the process {:.1} ms: {:.1} ms of its own, {:.0}x real time",
        in_process.as_secs_f64() * 1e3,
        whole.as_secs_f64() * 1e3,
        (whole.as_secs_f64() - in_process.as_secs_f64()) * 1e3,
        simulated / whole.as_secs_f64()
    );
    c.bench_function("process/kbench_experiment_topk1_v2", |b| b.iter(spawn));
    c.bench_function("process/topk1_v2_sweep_in_process", |b| b.iter(sweep));
}

criterion_group! {
    name = search_benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(60));
    targets = search
}
criterion_group! {
    name = process_benches;
    config = Criterion::default().sample_size(20);
    targets = process
}
criterion_main!(search_benches, process_benches);
