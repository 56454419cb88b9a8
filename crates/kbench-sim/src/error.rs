//! Every way the simulator can fail on bad input, each naming the file and what is wrong.
//! Nothing in kbench-sim panics on user input.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read {what} {path}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("hardware profile {origin}: {message}")]
    Profile { origin: String, message: String },
    #[error("engine profile {origin}: {message}")]
    EngineProfile { origin: String, message: String },
    #[error("{}unknown hardware preset `{name}` (known: {known})", at_prefix(.at))]
    UnknownPreset {
        name: String,
        known: String,
        /// `file:line:column` of the setting that names it, where it came from a file.
        at: Option<String>,
    },
    #[error("{}unknown engine preset `{name}` (known: {known})", at_prefix(.at))]
    UnknownEnginePreset {
        name: String,
        known: String,
        at: Option<String>,
    },
    #[error("op table {origin}:{line}: {message}")]
    OpTable {
        origin: String,
        line: usize,
        message: String,
    },
    #[error(
        "op table: no rows for operator `{op}` (needed for {why}; tables loaded from {origin})"
    )]
    MissingOp {
        op: String,
        why: String,
        origin: String,
    },
    #[error("cost model: {0}")]
    Model(String),
    /// The weights, or one request's KV cache, do not fit the GPUs at this tp_size and
    /// memory fraction.
    #[error("cost model: {0}")]
    DoesNotFit(String),
    #[error("GPU stack profile {path}: {message}")]
    StackProfile { path: PathBuf, message: String },
    #[error("measurement file {path}: {message}")]
    Measurements { path: PathBuf, message: String },
    #[error("experiment {path}")]
    Experiment {
        path: PathBuf,
        #[source]
        source: Box<kbench_core::experiment::ExperimentError>,
    },
    #[error("simulation of {experiment} failed")]
    Backend {
        experiment: String,
        #[source]
        source: Box<kbench_core::backend::BackendError>,
    },
    #[error("calibration: {0}")]
    Calibration(String),
    #[error("{experiment}: the sim backend replays an acceptance trace for speculative decoding: set [workload] trace = \"...\" (see traces/)")]
    NoTrace { experiment: PathBuf },
    /// The file names a trace that is not there; a copied experiment file most often meets
    /// this, its relative path now read from another folder.
    #[error("{experiment}: workload.trace `{written}` does not exist: looked for {looked_at} (a relative path is read from the experiment file's folder)")]
    TraceNotFound {
        experiment: PathBuf,
        written: String,
        looked_at: PathBuf,
    },
    /// The trace could not be read (the error names the file).
    #[error(transparent)]
    TraceRead(kbench_core::trace::TraceError),
    /// The trace cannot be replayed for the experiment's settings.
    #[error("trace {path} cannot be replayed for this experiment")]
    TraceReplay {
        path: PathBuf,
        #[source]
        source: kbench_core::trace::TraceError,
    },
}

fn at_prefix(at: &Option<String>) -> String {
    at.as_ref().map(|a| format!("{a}: ")).unwrap_or_default()
}

impl SimError {
    /// A preset name that does not exist, pointed at where the experiment file names it.
    pub(crate) fn in_file(self, path: &std::path::Path) -> SimError {
        let at = |key: &str| {
            kbench_core::experiment::locate(path, key)
                .map(|s| format!("{}:{}:{}", path.display(), s.line, s.column))
        };
        match self {
            SimError::UnknownPreset {
                name,
                known,
                at: None,
            } => SimError::UnknownPreset {
                at: at("hardware.preset"),
                name,
                known,
            },
            SimError::UnknownEnginePreset {
                name,
                known,
                at: None,
            } => SimError::UnknownEnginePreset {
                at: at("engine.preset"),
                name,
                known,
            },
            other => other,
        }
    }
}
