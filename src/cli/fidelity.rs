//! `kbench fidelity [CORPUS.toml ...]`: the corpus on the simulator, errors per point and
//! per role and metric.

use std::io::Write;
use std::path::PathBuf;

use kbench_sim::corpus::{corpus_files, load_corpus};
use kbench_sim::fidelity::run_corpus;

use super::args::FidelityArgs;
use super::error::{io_error, CliError, CliResult};
use super::exit;
use super::output::write_file;
use super::render;

/// Where the shipped corpus lives, relative to the project root.
const CORPUS_DIR: &str = "data/validation";

/// The files given, or the shipped corpus when none are.
pub(super) fn corpus_paths(files: &[PathBuf]) -> CliResult<Vec<PathBuf>> {
    if !files.is_empty() {
        return Ok(files.to_vec());
    }
    corpus_files(std::path::Path::new(CORPUS_DIR)).map_err(|e| {
        CliError::from_error(&e).prefixed(format!(
            "no corpus files given and none found in {CORPUS_DIR}/ (run from the project root, or name them)"
        ))
    })
}

pub fn run(args: FidelityArgs) -> CliResult<()> {
    super::output::check_output_paths([&args.json, &args.plot].into_iter().flatten())?;
    super::output::check_plot_path(args.plot.as_ref())?;
    let sim_error = |e: kbench_sim::SimError| CliError::from_error(&e);
    let files = corpus_paths(&args.files)?;
    let corpora = files
        .iter()
        .map(|f| load_corpus(f).map_err(sim_error))
        .collect::<CliResult<Vec<_>>>()?;
    let report = run_corpus(&corpora);
    let mut out = super::output::stdout();
    render::fidelity::write_fidelity(&mut out, &report)
        .map_err(|e| io_error(exit::OUTPUT, "writing to stdout", e))?;
    out.flush().ok();
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::new(exit::OUTPUT, format!("serializing the report: {e}")))?;
        text.push('\n');
        write_file(path, text.as_bytes())?;
    }
    if let Some(path) = &args.plot {
        write_file(path, render::parity::parity_svg(&report)?.as_bytes())?;
    }
    Ok(())
}
