//! `kbench calibrate [CORPUS.toml ...]`: fit the engine profiles the corpus's `fit` cases run
//! on, replaying each experiment's own acceptance trace.

use std::io::Write;
use std::path::PathBuf;

use kbench_sim::corpus::load_corpus;

use super::args::CalibrateArgs;
use super::error::{CliError, CliResult};
use super::fidelity::corpus_paths;
use super::output::write_json;

pub fn run(a: CalibrateArgs) -> CliResult<()> {
    super::output::check_output_paths(&a.json)?;
    if let Some(dir) = &a.out_dir {
        super::output::check_output_dir("--out-dir", dir)?;
    }
    let sim_error = |e: kbench_sim::SimError| CliError::from_error(&e);
    let files: Vec<PathBuf> = corpus_paths(&a.files)?;
    let corpora = files
        .iter()
        .map(|f| load_corpus(f).map_err(sim_error))
        .collect::<CliResult<Vec<_>>>()?;
    let quiet = a.quiet;
    let mut progress = |line: &str| {
        if !quiet {
            eprintln!("{line}");
        }
    };
    let report =
        kbench_sim::calibrate::run(&corpora, &a.profiles, a.out_dir.as_deref(), &mut progress)
            .map_err(sim_error)?;
    if !a.quiet {
        write!(super::output::stdout(), "{report}").map_err(super::output::stdout_error)?;
    }
    if let Some(path) = &a.json {
        write_json(path, &report)?;
    }
    Ok(())
}
