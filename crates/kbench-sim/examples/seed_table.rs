//! Prints the sim's predictions for the seed's three experiments next to nothing but the
//! predictions themselves, with a round breakdown at C=1 and at the saturation level.
//! `cargo run --release -p kbench-sim --example seed_table [--explain] [hardware-profile.toml]`

use std::path::Path;
use std::time::Instant;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::experiment::load_experiment;
use kbench_core::experiment::Experiment;
use kbench_core::trace::{self, TraceAcceptance};
use kbench_sim::predict::{default_acceptance, run};
use std::sync::Arc;

/// The experiment's trace when it exists (as the CLI does), else the synthetic chat model.
fn acceptance(exp: &Experiment) -> Arc<dyn AcceptanceModel> {
    if let Some(path) = exp.trace.as_ref().filter(|p| p.exists()) {
        if let Ok(t) = trace::read(path) {
            if let Ok(a) = TraceAcceptance::for_spec(Arc::new(t), exp.file.seed, &exp.speculative) {
                return Arc::new(a);
            }
        }
    }
    default_acceptance(exp)
}
use kbench_sim::presets::{load_tables, resolve_engine_profile};
use kbench_sim::{HardwareProfile, SimBackend};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let explain = args.iter().any(|a| a == "--explain");
    let profile_path = args.iter().find(|a| a.ends_with(".toml"));
    for name in ["baseline", "topk4_v1", "topk1_v2", "topk1_v1"] {
        let path = format!("experiments/{name}.toml");
        let sets: Vec<String> = std::env::var("KB_SET")
            .ok()
            .map(|v| v.split(';').map(String::from).collect())
            .unwrap_or_default();
        let exp = load_experiment(Path::new(&path), &sets)?
            .remove(0)
            .experiment;
        let mut backend = match profile_path {
            Some(p) => {
                let prof = HardwareProfile::from_file(Path::new(p))?;
                let tables = load_tables(&prof)?;
                let engine = resolve_engine_profile(&exp, &prof)?;
                SimBackend::with_profiles(&exp, prof, engine, tables, Some(acceptance(&exp)))?
            }
            None => SimBackend::new(&exp, Some(acceptance(&exp)))?,
        };
        // Best of 5 (the machine is shared); a fresh backend each time, as a user would get.
        let mut dt = std::time::Duration::MAX;
        for _ in 0..4 {
            let mut b = SimBackend::new(&exp, Some(acceptance(&exp)))?;
            let t0 = Instant::now();
            run(&exp, &mut b)?;
            dt = dt.min(t0.elapsed());
        }
        let t0 = Instant::now();
        let (_, pred) = run(&exp, &mut backend)?;
        let dt = dt.min(t0.elapsed());
        println!(
            "{name:10} C=1 {:8.1}  sat {:8.1}  levels {:?}  accept {:?}  ({:.1} ms)",
            pred.at(1).unwrap_or(0.0),
            pred.saturation_output_throughput,
            pred.output_throughput
                .iter()
                .map(|x| (x.0, (x.1 * 10.0).round() / 10.0))
                .collect::<Vec<_>>(),
            pred.accept_length
                .iter()
                .filter_map(|x| x.1.map(|a| (a * 100.0).round() / 100.0))
                .collect::<Vec<_>>(),
            dt.as_secs_f64() * 1e3
        );
        if explain {
            // Mean context over a 200-token request: the prompt plus ~100 output tokens.
            let isl = exp.input_len.0;
            let ctx = isl as f64 + 100.0;
            for reqs in [1u32, 64] {
                println!("{}", backend.explain_prefill(reqs, isl)?);
            }
            for bs in [1u32, 48, 64] {
                println!("{}", backend.explain_round(bs, ctx)?);
            }
            for f in backend.flagged_queries() {
                println!("  flagged: {f}");
            }
        }
    }
    Ok(())
}
