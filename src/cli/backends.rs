//! Which crate opens each backend: the CLI only dispatches on `[backend] kind` (or
//! `--backend`); each backend parses its own `[backend.NAME]` table.

use kbench_core::backend::Backend;
use kbench_core::experiment::Experiment;

use super::error::{CliError, CliResult};
use super::exit;

/// The backends this build knows, for messages.
pub const KNOWN: &str = "sim, engine, http";

pub fn make_backend(exp: &Experiment) -> CliResult<Box<dyn Backend>> {
    match exp.file.backend.kind.as_str() {
        "sim" => kbench_sim::open(exp).map_err(|e| CliError::from_error(&e)),
        "engine" => kbench_engine::open(exp).map_err(|e| CliError::from_error(&e)),
        "http" => kbench_http::open(exp).map_err(|e| CliError::from_error(&e)),
        other => Err(CliError::new(
            exit::INVALID_INPUT,
            format!(
                "{}{}: unknown backend `{other}` (known: {KNOWN})",
                exp.path.display(),
                kbench_core::experiment::locate(&exp.path, "backend.kind")
                    .map(|s| format!(":{}:{}", s.line, s.column))
                    .unwrap_or_default()
            ),
        )),
    }
}
