//! Simulator speed: the whole experiments/topk1_v2.toml sweep (7 levels x 64 requests x
//! 200 tokens). Targets (issue 2): under 50 ms per sweep on one core, and simulated time
//! over wall time above 10,000x. The ratio is printed once before measuring.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use kbench_core::acceptance::AcceptanceModel;
use kbench_core::experiment::load_experiment;
use kbench_core::harness::{run_levels, LoadPlan, NoProgress};
use kbench_core::trace::{self, TraceAcceptance};
use kbench_sim::SimBackend;

fn sweep(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exp = load_experiment(&root.join("experiments/topk1_v2.toml"), &[])
        .expect("experiment loads")
        .remove(0)
        .experiment;
    let t = trace::read(exp.trace.as_ref().expect("the file names a trace")).expect("trace reads");
    let acceptance: Arc<dyn AcceptanceModel> =
        Arc::new(TraceAcceptance::for_spec(Arc::new(t), exp.file.seed, &exp.speculative).unwrap());
    let plan = LoadPlan::from_experiment(&exp);
    let run_with = |plan: &LoadPlan| {
        let mut backend = SimBackend::new(&exp, Some(acceptance.clone())).unwrap();
        run_levels(&mut backend, plan, &mut NoProgress).unwrap()
    };
    let run = || run_with(&plan);

    // the virtual time a level spans is read from its records, kept for this one run
    let started = Instant::now();
    let levels = run_with(&plan.clone().keeping_records());
    let wall = started.elapsed().as_secs_f64();
    // Every level starts at virtual time 0; warm-up counts, it was simulated too.
    let simulated: f64 = levels
        .iter()
        .map(|l| l.records.iter().map(|r| r.finished_ns()).max().unwrap_or(0) as f64 / 1e9)
        .sum();
    eprintln!(
        "topk1_v2 sweep: {simulated:.1} s of virtual time in {:.2} ms wall: {:.0}x real time",
        wall * 1e3,
        simulated / wall
    );

    c.bench_function("sim/topk1_v2_sweep_7x64x200", |b| b.iter(run));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = sweep
}
criterion_main!(benches);
