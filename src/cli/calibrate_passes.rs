//! `kbench calibrate-passes`: a GPU's measured per-pass layer times (scripts/gpu-check.sh's
//! profile.toml) beside the cost model's, and `efficiency.in_model` fitted to them.

use std::path::Path;

use kbench_core::atomic::write_atomic;
use kbench_sim::passes::calibrate_passes;
use kbench_sim::presets::preset;
use kbench_sim::{HardwareProfile, SimError};

use super::args::CalibratePassesArgs;
use super::error::{io_error, CliError, CliResult};
use super::exit;

pub fn run(a: CalibratePassesArgs) -> CliResult<()> {
    let invalid = |e: SimError| CliError::from_chain(exit::INVALID_INPUT, &e);
    // A path names a profile file; anything else a shipped preset (`h200`).
    let base = if Path::new(&a.hardware).exists() || a.hardware.ends_with(".toml") {
        HardwareProfile::from_file(Path::new(&a.hardware))
    } else {
        preset(&a.hardware)
    }
    .map_err(invalid)?;
    let report = calibrate_passes(&a.measured, &base, a.out.as_deref()).map_err(|e| match e {
        SimError::Write { .. } => CliError::from_chain(exit::OUTPUT, &e),
        e => invalid(e),
    })?;
    if !a.quiet {
        print!("{report}");
    }
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&report).expect("report serializes");
        write_atomic(path, format!("{text}\n").as_bytes())
            .map_err(|e| io_error(exit::OUTPUT, format!("writing {}", path.display()), e))?;
    }
    Ok(())
}
