//! Prints the round or prefill breakdown of one experiment:
//! `cargo run --release -p kbench-sim --example explain -- FILE BATCH CONTEXT [key=value ...]`
//! (a decode round over BATCH requests at mean context CONTEXT), or
//! `... -- FILE prefill REQUESTS PROMPT_TOKENS [key=value ...]` (one unchunked prefill pass).

use std::path::Path;

use kbench_core::experiment::load_experiment;
use kbench_sim::SimBackend;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: explain FILE BATCH CONTEXT [key=value ...] | FILE prefill REQUESTS PROMPT_TOKENS [key=value ...]";
    let [file, mode, rest @ ..] = args.as_slice() else {
        return Err(usage.into());
    };
    let prefill = mode == "prefill";
    let (first, second, sets) = match (prefill, rest) {
        (true, [reqs, len, sets @ ..]) => (reqs, len, sets),
        (false, [context, sets @ ..]) => (mode, context, sets),
        _ => return Err(usage.into()),
    };
    let exp = load_experiment(Path::new(file), sets)?.remove(0).experiment;
    let acceptance = kbench_sim::predict::default_acceptance(&exp);
    let backend = SimBackend::new(&exp, Some(acceptance))?;
    let breakdown = if prefill {
        backend.explain_prefill(first.parse()?, second.parse()?)?
    } else {
        backend.explain_round(first.parse()?, second.parse()?)?
    };
    print!("{breakdown}");
    Ok(())
}
