//! What can stop a search before it ranks anything.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The experiment file itself (read, parse, a key `--set` cannot reach).
    #[error(transparent)]
    Spec(#[from] kbench_core::experiment::ExperimentError),
    #[error("{path}: no [search] table: declare the space under [search.space] (or give --space KEY=VALUES)")]
    NoSearch { path: PathBuf },
    /// The [search] table or a search flag is wrong.
    #[error("{path}: [search] {what}: {message}")]
    Settings {
        path: PathBuf,
        what: String,
        message: String,
    },
    #[error("{path}: the search space is empty: {why}")]
    EmptySpace { path: PathBuf, why: String },
    #[error("{path}: the search space has {count} candidates, more than the limit of {limit}; narrow [search.space] or raise it with --max-candidates {count}")]
    TooLarge {
        path: PathBuf,
        count: u128,
        limit: usize,
    },
    #[error("{path}: {what} on `{metric}`, a metric no report has{}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_else(|| " (see docs/report.md)".into()))]
    UnknownMetric {
        path: PathBuf,
        /// `the objective` or `an SLO`.
        what: &'static str,
        metric: String,
        suggestion: Option<String>,
    },
    /// Loading a candidate's trace failed before any candidate could run.
    #[error(transparent)]
    Sim(#[from] kbench_sim::SimError),
    #[error("interrupted after {done} of {total} candidates")]
    Interrupted { done: usize, total: usize },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
