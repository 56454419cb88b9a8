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

/// Every output a command was asked for can be written where it was asked: checked before
/// the work, so a long run never ends on "no such directory", and one bad path never
/// leaves the others written.
pub fn check_output_paths<'a>(
    paths: impl IntoIterator<Item = &'a std::path::PathBuf>,
) -> CliResult<()> {
    for path in paths {
        let unwritable = |why: String| {
            super::error::CliError::new(
                exit::OUTPUT,
                format!("cannot write {}: {why}", path.display()),
            )
        };
        if path.is_dir() {
            return Err(unwritable("it is a directory".into()));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if dir.exists() && !dir.is_dir() {
            return Err(unwritable(format!("{} is not a directory", dir.display())));
        }
        if !dir.is_dir() {
            return Err(unwritable(format!(
                "the directory {} does not exist",
                dir.display()
            )));
        }
    }
    Ok(())
}
