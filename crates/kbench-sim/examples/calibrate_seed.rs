//! The calibration `kbench calibrate` runs, without the CLI: acceptance from each
//! experiment's trace when it exists (as the CLI does), else the synthetic chat model.
//! `cargo run --release -p kbench-sim --example calibrate_seed -- MEAS BASE OUT`
use std::path::Path;
use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::spec::Experiment;
use kbench_core::trace::{self, TraceAcceptance};

fn acceptance(exp: &Experiment) -> Arc<dyn AcceptanceModel> {
    if let Some(path) = exp.trace.as_ref().filter(|p| p.exists()) {
        if let Ok(t) = trace::read(path) {
            if let Ok(a) = TraceAcceptance::for_spec(Arc::new(t), exp.file.seed, &exp.spec) {
                return Arc::new(a);
            }
        }
    }
    kbench_sim::predict::default_acceptance(exp)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let (m, b, o) = (
        a.first()
            .map(String::as_str)
            .unwrap_or("experiments/calibration/seed.toml"),
        a.get(1)
            .map(String::as_str)
            .unwrap_or("experiments/hardware/8x-rtx-pro-6000-server.base.toml"),
        a.get(2)
            .map(String::as_str)
            .unwrap_or("experiments/hardware/8x-rtx-pro-6000-server.toml"),
    );
    let report = kbench_sim::calibrate::run_with(
        Path::new(m),
        Path::new(b),
        Path::new(o),
        &acceptance,
        &mut |s| eprintln!("{s}"),
    )?;
    println!("{report}");
    Ok(())
}
