//! Process exit codes, one per kind of failure, so scripts can tell them apart.

/// Also when stdout's reader stopped early (`| head`): a closed pipe is not a failure
/// (`output::stdout`).
pub const OK: i32 = 0;
/// Something failed that has no more specific code.
pub const FAILURE: i32 = 1;
/// The command line itself was wrong (clap's own code).
pub const USAGE: i32 = 2;
/// An input file (experiment, trace, model, profile, measurement) is missing or invalid.
pub const INVALID_INPUT: i32 = 3;
/// The backend failed while serving.
pub const BACKEND: i32 = 4;
/// An output file could not be written.
pub const OUTPUT: i32 = 5;
/// A check the command runs did not pass (`kernels check` found a kernel that does not
/// compile; `search` ranked no candidate).
pub const CHECK_FAILED: i32 = 6;
/// Ctrl-C stopped the run (128 + SIGINT, as shells report it); finished levels were written.
pub const INTERRUPTED: i32 = 130;

/// The exit code of a library error: the first error of its chain whose kind decides
/// (a wrapper such as "the simulator" leaves it to its source). The one place a kind of
/// failure becomes a code, as cargo-nextest derives its process exit code once.
pub fn code_for(err: &(dyn std::error::Error + 'static)) -> i32 {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(code) = own_code(e) {
            return code;
        }
        next = e.source();
    }
    FAILURE
}

/// `None`: the error's source decides. A transparent wrapper (whose `source()` skips the
/// error it wraps) asks the wrapped error itself.
fn own_code(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    use kbench_core::backend::BackendError;
    use kbench_core::trace::TraceError;
    use kbench_engine::EngineError;
    use kbench_http::error::HttpError;
    use kbench_search::SearchError;
    use kbench_serve::ServeError;
    use kbench_sim::SimError;
    if let Some(e) = e.downcast_ref::<BackendError>() {
        return Some(match e {
            BackendError::Interrupted => INTERRUPTED,
            _ => BACKEND,
        });
    }
    if let Some(e) = e.downcast_ref::<SearchError>() {
        return match e {
            SearchError::Spec(e) => Some(code_for(e)),
            SearchError::Sim(e) => Some(code_for(e)),
            SearchError::Interrupted { .. } => Some(INTERRUPTED),
            SearchError::Write { .. } => Some(OUTPUT),
            _ => Some(INVALID_INPUT),
        };
    }
    if let Some(e) = e.downcast_ref::<SimError>() {
        return match e {
            SimError::TraceRead(e) => Some(code_for(e)),
            SimError::Write { .. } => Some(OUTPUT),
            // a boxed source reads as the box, which no downcast to the error matches
            SimError::Backend { source, .. } => Some(code_for(source.as_ref())),
            _ => Some(INVALID_INPUT),
        };
    }
    if let Some(e) = e.downcast_ref::<TraceError>() {
        return Some(match e {
            TraceError::Write { .. } => OUTPUT,
            _ => INVALID_INPUT,
        });
    }
    if let Some(e) = e.downcast_ref::<EngineError>() {
        return match e {
            EngineError::Trace(e) => Some(code_for(e)),
            EngineError::Write { .. } => Some(OUTPUT),
            // the engine failed while running, not on what it was given
            EngineError::DeviceUnavailable { .. }
            | EngineError::Cuda(_)
            | EngineError::Tree(_)
            | EngineError::Verify(_) => Some(BACKEND),
            _ => Some(INVALID_INPUT),
        };
    }
    if e.downcast_ref::<kbench_cuda::CudaError>().is_some() {
        return Some(BACKEND);
    }
    if let Some(e) = e.downcast_ref::<HttpError>() {
        return match e {
            HttpError::Trace { .. } => None,
            HttpError::Settings(_) | HttpError::LaunchLine(_) | HttpError::Mismatch(_) => {
                Some(INVALID_INPUT)
            }
            _ => Some(BACKEND),
        };
    }
    if let Some(e) = e.downcast_ref::<ServeError>() {
        return match e {
            ServeError::Engine(_) | ServeError::Sim(_) => None,
            ServeError::Config(_) => Some(INVALID_INPUT),
            ServeError::Worker(_) => Some(BACKEND),
            ServeError::Io(..) => Some(FAILURE),
        };
    }
    if let Some(
        kbench_core::experiment::ExperimentError::Flag { .. }
        | kbench_core::experiment::ExperimentError::Override { .. },
    ) = e.downcast_ref::<kbench_core::experiment::ExperimentError>()
    {
        return Some(USAGE);
    }
    let invalid_input = e.is::<kbench_core::experiment::ExperimentError>()
        || e.is::<kbench_core::arch::ArchError>()
        || e.is::<kbench_core::lengths::LengthFileError>()
        || e.is::<kbench_core::compare::ReportReadError>()
        || e.is::<kbench_core::tree::TreeError>()
        || e.is::<kbench_core::verify::VerifyError>();
    invalid_input.then_some(INVALID_INPUT)
}

/// The codes above as `kbench --help` lists them; kept beside them so the two agree.
pub const HELP: &str = "Exit codes:
  0    success
  1    a failure with no more specific code
  2    the command line is wrong
  3    an input (experiment, trace, model, profile, corpus) is missing or invalid
  4    the backend failed while serving (a server that died, an engine error, every
       request of a level failed)
  5    an output file could not be written
  6    a check did not pass (kernels check; a search that ranks nothing)
  130  interrupted (Ctrl-C); the levels that finished were written";

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied")
    }

    /// Each kind decides its code wherever it sits in the chain; wrappers defer to it.
    #[test]
    fn kinds_map_to_their_codes() {
        use kbench_core::backend::BackendError;
        use kbench_core::trace::TraceError;
        use kbench_sim::SimError;
        let path = std::path::PathBuf::from("x");
        let backend = |e: BackendError| SimError::Backend {
            experiment: "e".into(),
            source: Box::new(e),
        };
        let cases: Vec<(Box<dyn std::error::Error>, i32)> = vec![
            (Box::new(io()), FAILURE),
            (
                Box::new(SimError::Write {
                    path: path.clone(),
                    source: io(),
                }),
                OUTPUT,
            ),
            (
                Box::new(SimError::TraceRead(TraceError::Read {
                    path: path.clone(),
                    source: io(),
                })),
                INVALID_INPUT,
            ),
            (
                Box::new(SimError::TraceRead(TraceError::Write {
                    path: path.clone(),
                    source: io(),
                })),
                OUTPUT,
            ),
            (Box::new(backend(BackendError::Interrupted)), INTERRUPTED),
            (
                Box::new(kbench_search::SearchError::Sim(backend(BackendError::msg(
                    "sim", "stalled",
                )))),
                BACKEND,
            ),
            (
                Box::new(kbench_engine::EngineError::DeviceUnavailable {
                    device: "cuda:3".into(),
                    why: "no such GPU",
                    found: 1,
                }),
                BACKEND,
            ),
            (
                Box::new(kbench_engine::EngineError::Write {
                    path: path.clone(),
                    source: io(),
                }),
                OUTPUT,
            ),
            (
                Box::new(kbench_engine::EngineError::Io {
                    path: path.clone(),
                    source: io(),
                }),
                INVALID_INPUT,
            ),
            (Box::new(kbench_cuda::CudaError::NoDriver), BACKEND),
            (
                Box::new(kbench_engine::EngineError::Cuda(
                    kbench_cuda::CudaError::NoDriver,
                )),
                BACKEND,
            ),
            (
                Box::new(kbench_http::error::HttpError::Settings("url".into())),
                INVALID_INPUT,
            ),
            (
                Box::new(kbench_http::error::HttpError::Exited {
                    status: "1".into(),
                    log: String::new(),
                }),
                BACKEND,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(code_for(e.as_ref()), code, "{e}");
        }
    }

    #[test]
    fn the_help_lists_every_code() {
        for code in [
            OK,
            FAILURE,
            USAGE,
            INVALID_INPUT,
            BACKEND,
            OUTPUT,
            CHECK_FAILED,
            INTERRUPTED,
        ] {
            let line = format!("\n  {code:<4} ");
            assert!(HELP.contains(&line), "{code} missing from the help");
        }
    }
}
