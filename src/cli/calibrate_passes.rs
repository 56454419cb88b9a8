//! `kbench calibrate-passes`: a GPU's measured per-pass layer times (scripts/gpu-check.sh's
//! profile.toml) beside the cost model's, and `efficiency.in_model` fitted to them.

use std::io::Write;
use std::path::Path;

use kbench_sim::passes::{calibrate_passes, write_calibrated_profile};
use kbench_sim::presets::preset;
use kbench_sim::{HardwareProfile, SimError};

use super::args::CalibratePassesArgs;
use super::error::{CliError, CliResult};
use super::output::write_json;

pub fn run(a: CalibratePassesArgs) -> CliResult<()> {
    super::output::check_output_paths([&a.out, &a.json].into_iter().flatten())?;
    let sim_error = |e: SimError| CliError::from_error(&e);
    // A path names a profile file; anything else a shipped preset (`h200`).
    let base = if Path::new(&a.hardware).exists() || a.hardware.ends_with(".toml") {
        HardwareProfile::from_file(Path::new(&a.hardware))
    } else {
        preset(&a.hardware)
    }
    .map_err(sim_error)?;
    let mut report = calibrate_passes(&a.measured, &base).map_err(sim_error)?;
    // The comparison is shown and saved whether or not the profile can be written, so a fit
    // the profile refuses still leaves the table that explains why.
    if !a.quiet {
        write!(super::output::stdout(), "{report}").map_err(super::output::stdout_error)?;
    }
    let written = match &a.out {
        Some(out) => write_calibrated_profile(&mut report, &base, out),
        None => Ok(()),
    };
    if let Some(path) = &a.json {
        write_json(path, &report)?;
    }
    written.map_err(sim_error)?;
    if let (Some(out), false) = (&report.out_profile, a.quiet) {
        super::output::outln!("  wrote {out}")?;
    }
    Ok(())
}
