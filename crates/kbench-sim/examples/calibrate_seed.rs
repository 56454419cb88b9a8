//! Runs the calibration the CLI's `kbench calibrate` wraps (until the lead wires it):
//! `cargo run --release -p kbench-sim --example calibrate_seed -- MEAS BASE OUT`
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let (m, b, o) = (
        a.first().map(String::as_str).unwrap_or("experiments/calibration/seed.toml"),
        a.get(1).map(String::as_str).unwrap_or("experiments/hardware/8x-rtx-pro-6000-server.base.toml"),
        a.get(2).map(String::as_str).unwrap_or("experiments/hardware/8x-rtx-pro-6000-server.toml"),
    );
    let report = kbench_sim::calibrate::run(Path::new(m), Path::new(b), Path::new(o), &mut |s| eprintln!("{s}"))?;
    println!("{report}");
    Ok(())
}
