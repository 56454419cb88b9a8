//! Prints the sim's predictions for the seed's three experiments next to nothing but the
//! predictions themselves, with a round breakdown at C=1 and at the saturation level.
//! `cargo run --release -p kbench-sim --example seed_table [--explain] [profile.toml]`

use std::path::Path;
use std::time::Instant;

use kbench_core::spec::load_experiment;
use kbench_sim::predict::{default_acceptance, run};
use kbench_sim::presets::load_tables;
use kbench_sim::{HardwareProfile, SimBackend};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let explain = args.iter().any(|a| a == "--explain");
    let profile_path = args.iter().find(|a| a.ends_with(".toml"));
    for name in ["baseline", "topk4_v1", "topk1_v2", "topk1_v1"] {
        let path = format!("experiments/{name}.toml");
        let sets: Vec<String> = std::env::var("KB_SET").ok().map(|v| v.split(';').map(String::from).collect()).unwrap_or_default();
        let exp = load_experiment(Path::new(&path), &sets)?.remove(0).experiment;
        let mut backend = match profile_path {
            Some(p) => {
                let prof = HardwareProfile::from_file(Path::new(p))?;
                let tables = load_tables(&prof)?;
                SimBackend::with_profile(&exp, prof, tables, Some(default_acceptance(&exp)))?
            }
            None => SimBackend::new(&exp, Some(default_acceptance(&exp)))?,
        };
        let t0 = Instant::now();
        let (_, pred) = run(&exp, &mut backend)?;
        let dt = t0.elapsed();
        println!(
            "{name:10} C=1 {:8.1}  sat {:8.1}  levels {:?}  accept {:?}  ({:.1} ms)",
            pred.at(1).unwrap_or(0.0),
            pred.saturation_output_throughput,
            pred.output_throughput.iter().map(|x| (x.0, (x.1 * 10.0).round() / 10.0)).collect::<Vec<_>>(),
            pred.accept_length.iter().filter_map(|x| x.1.map(|a| (a * 100.0).round() / 100.0)).collect::<Vec<_>>(),
            dt.as_secs_f64() * 1e3
        );
        if explain {
            println!("{}", backend.explain_prefill(1, 512)?);
            for bs in [1u32, 48, 64] {
                println!("{}", backend.explain_round(bs, 612.0)?);
            }
            for f in backend.flagged_queries() {
                println!("  flagged: {f}");
            }
        }
    }
    Ok(())
}
