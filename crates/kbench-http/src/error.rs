//! What can stop the http backend. A single request's failure is not here: it is recorded
//! on the request (`RequestRecord::error`) and the level goes on.

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("[backend.http]: {0}")]
    Settings(String),
    /// The file cannot be launched by the engine whose command line was asked for.
    #[error("{0}")]
    LaunchLine(String),
    #[error("the server at {url} did not answer /health within {seconds} s (is it running? last: {last})")]
    NotReady {
        url: String,
        seconds: f64,
        last: String,
    },
    #[error("nothing listens at {url} (connection refused): start the server first, or give [backend.http.launch] for kbench to start it (docs/http.md)")]
    Refused { url: String },
    #[error("the server's speculative settings differ from the file's: {0} (set [backend.http] allow_mismatch = true to run anyway)")]
    Mismatch(String),
    #[error("the server at {url} does not serve the model `{model}`; it serves: {served} (set [backend.http] model to one of them, or leave it out for the first)")]
    UnknownModel {
        url: String,
        model: String,
        served: String,
    },
    #[error("{what} from {url}: {message}")]
    Server {
        what: String,
        url: String,
        message: String,
    },
    #[error("the server at {url} stopped answering mid-level: {failure}; /health: {health}")]
    Gone {
        url: String,
        failure: String,
        health: String,
    },
    #[error("the launched server exited ({status}); its log: {log}")]
    Exited { status: String, log: String },
    #[error("the trace {path}")]
    Trace {
        path: String,
        #[source]
        source: kbench_core::trace::TraceError,
    },
    #[error("starting the HTTP client runtime")]
    Runtime(#[source] std::io::Error),
}
