//! `kbench calibrate`: fit a hardware profile's free parameters to measurements, replaying
//! each experiment's own acceptance trace.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::spec::{load_experiment, Experiment};
use kbench_sim::acceptance::ConstantAcceptance;
use kbench_sim::calibrate::{read_measurements, run_with};

use super::args::CalibrateArgs;
use super::error::{spec_error, CliError, CliResult};
use super::exit;
use super::output::write_json;

pub fn run(a: CalibrateArgs) -> CliResult<()> {
    // Load every experiment and its trace up front so a bad input fails before the fit,
    // with the same messages `kbench experiment` gives.
    let m = read_measurements(&a.measurements)
        .map_err(|e| CliError::from_chain(exit::INVALID_INPUT, &e))?;
    let dir = a
        .measurements
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let mut acceptance: BTreeMap<PathBuf, Arc<dyn AcceptanceModel>> = BTreeMap::new();
    for p in &m.points {
        let path = dir.join(&p.experiment);
        if acceptance.contains_key(&path) {
            continue;
        }
        let exp = load_experiment(&path, &[])
            .map_err(|e| spec_error(&e))?
            .remove(0)
            .experiment;
        if let Some(acc) = kbench_sim::acceptance_for(&exp)
            .map_err(|e| CliError::from_chain(exit::INVALID_INPUT, &e))?
        {
            acceptance.insert(path, acc);
        }
    }
    let lookup = |exp: &Experiment| -> Arc<dyn AcceptanceModel> {
        acceptance
            .get(&exp.path)
            .cloned()
            // Plain decoding never asks; the constant keeps the signature total.
            .unwrap_or_else(|| Arc::new(ConstantAcceptance(1)))
    };
    let quiet = a.quiet;
    let mut progress = |line: &str| {
        if !quiet {
            eprintln!("{line}");
        }
    };
    let report = run_with(&a.measurements, &a.base, &a.out, &lookup, &mut progress)
        .map_err(|e| CliError::from_chain(exit::INVALID_INPUT, &e))?;
    if !a.quiet {
        print!("{report}");
    }
    if let Some(path) = &a.json {
        write_json(path, &report)?;
    }
    Ok(())
}
