//! Turning library errors into one clear message and an exit code.

use std::fmt;

use kbench_core::experiment::ExperimentError;

use super::exit;

/// An error on its way out of the process: a message with its source chain, and the code.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    pub fn new(code: i32, message: impl Into<String>) -> CliError {
        CliError {
            code,
            message: message.into(),
        }
    }

    /// A library error with the code its kind maps to ([`exit::code_for`]).
    pub fn from_error(err: &(dyn std::error::Error + 'static)) -> CliError {
        CliError::from_chain(exit::code_for(err), err)
    }

    /// The error, then each source on its own line, as cargo-nextest prints chains.
    fn from_chain(code: i32, err: &(dyn std::error::Error + 'static)) -> CliError {
        let mut message = err.to_string();
        let mut source = err.source();
        while let Some(s) = source {
            message.push_str("\n  caused by: ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        CliError { code, message }
    }

    pub fn prefixed(mut self, what: impl fmt::Display) -> CliError {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

pub type CliResult<T> = Result<T, CliError>;

/// Experiment errors point into the file: line, column and the offending line.
pub fn spec_error(err: &ExperimentError) -> CliError {
    let mut e = CliError::from_error(err);
    if let Some(span) = err.span() {
        let gutter = span.line.to_string();
        let pad = " ".repeat(gutter.len());
        let caret_pad = " ".repeat(span.column.saturating_sub(1));
        let carets = "^".repeat(span.len.clamp(1, span.snippet.len().max(1)));
        e.message.push_str(&format!(
            "\n{pad} |\n{gutter} | {}\n{pad} | {caret_pad}{carets}",
            span.snippet
        ));
    }
    e
}

/// The CLI's own I/O (stdout, a report file): what it was doing, then the cause, as
/// [`CliError::from_error`] prints a library error's chain.
pub fn io_error(code: i32, what: impl fmt::Display, err: std::io::Error) -> CliError {
    CliError::new(code, format!("{what}\n  caused by: {err}"))
}
