//! Files the commands write on request (`--json`, `--csv`, `--plot`): atomically, so a reader
//! never sees half a file, and failing with the output exit code.

use std::path::Path;

use kbench_core::atomic::write_atomic;
use serde::Serialize;

use super::error::{io_error, CliResult};
use super::exit;

pub fn write_file(path: &Path, bytes: &[u8]) -> CliResult<()> {
    write_atomic(path, bytes)
        .map_err(|e| io_error(exit::OUTPUT, format!("writing {}", path.display()), e))
}

/// Pretty JSON with a trailing newline.
pub fn write_json(path: &Path, value: &impl Serialize) -> CliResult<()> {
    let text = serde_json::to_string_pretty(value).expect("reports serialize");
    write_file(path, format!("{text}\n").as_bytes())
}
