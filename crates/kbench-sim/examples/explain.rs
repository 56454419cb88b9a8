//! Prints the round and prefill breakdowns of one experiment at a batch and context:
//! `cargo run --release -p kbench-sim --example explain -- FILE BATCH CONTEXT [key=value ...]`

use std::path::Path;

use kbench_core::experiment::load_experiment;
use kbench_sim::SimBackend;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [file, batch, context, sets @ ..] = args.as_slice() else {
        return Err("usage: explain FILE BATCH CONTEXT [key=value ...]".into());
    };
    let exp = load_experiment(Path::new(file), sets)?.remove(0).experiment;
    let acceptance = kbench_sim::predict::default_acceptance(&exp);
    let backend = SimBackend::new(&exp, Some(acceptance))?;
    print!(
        "{}",
        backend.explain_round(batch.parse()?, context.parse()?)?
    );
    Ok(())
}
