//! Simulator speed on a realistic workload (issue 10): 12,000 requests with ShareGPT-shaped
//! lengths (data/lengths/sharegpt-shaped.toml) arriving at 20 requests/s, a 10-minute
//! arrival window, on Kimi-K2.5 over 8x H200 without speculation (max_running_requests
//! 1024, so the server nearly keeps up). Target: under 1 s per run. The virtual time it
//! covers is printed once before measuring.

use std::path::Path;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use kbench_core::experiment::load_experiment;
use kbench_core::harness::{run_levels, LoadPlan, NoProgress};
use kbench_sim::SimBackend;

fn chat_at_20_per_second(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sets: Vec<String> = [
        "hardware.preset=\"8x-h200\"",
        "speculative.algorithm=\"none\"",
        "server.max_running_requests=1024",
        "benchmark.concurrency=[]",
        "benchmark.request_rate=[20.0]",
        "benchmark.requests_per_level=12000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let exp = load_experiment(&root.join("experiments/chat_lengths.toml"), &sets)
        .expect("experiment loads")
        .remove(0)
        .experiment;
    let plan = LoadPlan::from_experiment(&exp);
    let run_with = |plan: &LoadPlan| {
        let mut backend = SimBackend::new(&exp, None).unwrap();
        run_levels(&mut backend, plan, &mut NoProgress).unwrap()
    };
    let run = || run_with(&plan);

    // the virtual time the level spans is read from its records, kept for this one run
    let started = Instant::now();
    let levels = run_with(&plan.clone().keeping_records());
    let wall = started.elapsed().as_secs_f64();
    let m = &levels[0].metrics;
    let simulated = levels[0]
        .records
        .iter()
        .map(|r| r.finished_ns())
        .max()
        .unwrap_or(0) as f64
        / 1e9;
    eprintln!(
        "chat lengths at 20 req/s: {} requests, {} output tokens, {simulated:.0} s of virtual time in {:.0} ms wall ({:.0}x real time)",
        m.completed,
        m.total_output_tokens,
        wall * 1e3,
        simulated / wall
    );

    c.bench_function("sim/chat_lengths_20rps_12000", |b| b.iter(run));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = chat_at_20_per_second
}
criterion_main!(benches);
