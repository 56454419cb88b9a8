//! Prints the KV pool one experiment sizes, with what was taken off before it:
//! `cargo run --release -p kbench-sim --example pool -- FILE [key=value ...]`.

use std::path::Path;

use kbench_core::experiment::load_experiment;
use kbench_sim::SimBackend;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [file, sets @ ..] = args.as_slice() else {
        return Err("usage: pool FILE [key=value ...]".into());
    };
    let exp = load_experiment(Path::new(file), sets)?.remove(0).experiment;
    let acceptance = kbench_sim::predict::default_acceptance(&exp);
    let backend = SimBackend::new(&exp, Some(acceptance))?;
    let pool = backend.kv_pool();
    println!("{}", pool.describe());
    println!(
        "GPU {:.2} GB x {} = {:.2} GB; weights {:.2} GB; profile-run sampler {:.2} GB; MoE workspace {:.2} GB; pool {:.2} GB",
        pool.gpu_bytes / 1e9,
        pool.mem_fraction_static,
        pool.gpu_bytes * pool.mem_fraction_static / 1e9,
        pool.weight_bytes / 1e9,
        pool.sampler_profile_bytes / 1e9,
        pool.moe_workspace_bytes / 1e9,
        pool.pool_bytes / 1e9
    );
    Ok(())
}
