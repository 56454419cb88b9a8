//! Which crate opens each backend: the CLI only dispatches on `[backend] kind` (or
//! `--backend`); each backend parses its own `[backend.NAME]` table.

use kbench_core::backend::Backend;
use kbench_core::experiment::Experiment;

use super::error::{CliError, CliResult};
use super::exit;

/// The backends this build knows, for messages.
pub const KNOWN: &str = "sim, engine, http";

/// What `kbench validate` runs: every backend is opened, except that the http backend's
/// settings and launch line are checked without starting or reaching a server.
pub fn check_backend(exp: &Experiment) -> CliResult<()> {
    match exp.file.backend.kind.as_str() {
        "http" => kbench_http::check(exp).map_err(|e| CliError::from_error(&e)),
        _ => make_backend(exp).map(drop),
    }
}

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
