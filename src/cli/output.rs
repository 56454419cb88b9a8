//! Where the commands' output goes: stdout, which a reader may close early, and the files
//! they write on request (`--json`, `--csv`, `--plot`): atomically, so a reader never sees
//! half a file, and failing with the output exit code.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use kbench_core::atomic::write_atomic;
use serde::Serialize;

use super::error::{io_error, CliResult};
use super::exit;

/// Set once a write to stdout finds its reader gone.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Standard output for everything a command prints. A reader that stops early
/// (`kbench fidelity | head`) closes the pipe, which says it has seen enough, not that the
/// command failed: as ripgrep does, the rest of stdout is dropped and the exit stays 0 with
/// nothing said. Unlike ripgrep the command runs on, so the files it was asked for
/// (`--json`, `--plot`) are still written. Any other write error (a full disk behind `>`)
/// is still returned.
pub fn stdout() -> Stdout {
    Stdout(std::io::stdout().lock())
}

pub struct Stdout(std::io::StdoutLock<'static>);

/// Whether `e` says stdout's reader is gone; remembers it if so.
fn reader_gone(e: &std::io::Error) -> bool {
    let gone = e.kind() == std::io::ErrorKind::BrokenPipe;
    if gone {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
    gone
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if STDOUT_CLOSED.load(Ordering::Relaxed) {
            return Ok(buf.len());
        }
        match self.0.write(buf) {
            Err(e) if reader_gone(&e) => Ok(buf.len()),
            r => r,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if STDOUT_CLOSED.load(Ordering::Relaxed) {
            return Ok(());
        }
        match self.0.flush() {
            Err(e) if reader_gone(&e) => Ok(()),
            r => r,
        }
    }
}

/// `println!` through [`stdout()`] (`println!` itself panics on a closed pipe): `Err`
/// only for another failure, with the output exit code.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!($crate::cli::output::stdout(), $($arg)*)
            .map_err($crate::cli::output::stdout_error)
    }};
}
pub(crate) use outln;

/// A failure writing [`stdout()`], as every command reports it.
pub fn stdout_error(e: std::io::Error) -> super::error::CliError {
    io_error(exit::OUTPUT, "writing to stdout", e)
}

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
        if path.as_os_str() == "-" {
            return Err(super::error::CliError::new(
                exit::USAGE,
                "`-` names a file here, not stdout (stdout carries the command's own output): give the output a file name",
            ));
        }
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

/// A folder a command writes files into under names of its own (`calibrate --out-dir`):
/// refused before the work as [`check_output_paths`] refuses a file's missing folder.
pub fn check_output_dir(flag: &str, dir: &Path) -> CliResult<()> {
    let why = if !dir.exists() {
        "the directory does not exist"
    } else if !dir.is_dir() {
        "not a directory"
    } else {
        return Ok(());
    };
    Err(super::error::CliError::new(
        exit::OUTPUT,
        format!("{flag} {}: {why}", dir.display()),
    ))
}

/// `--plot` draws SVG, and only SVG: a name promising another format would hold SVG under
/// it, which a viewer trusting the name cannot open.
pub fn check_plot_path(path: Option<&std::path::PathBuf>) -> CliResult<()> {
    let Some(path) = path else {
        return Ok(());
    };
    let svg = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if svg {
        return Ok(());
    }
    Err(super::error::CliError::new(
        exit::USAGE,
        format!(
            "--plot {}: kbench draws SVG; name the file .svg (a browser opens it; `rsvg-convert` or Inkscape turn it into PNG or PDF)",
            path.display()
        ),
    ))
}
