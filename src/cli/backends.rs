//! Which library does the work of each backend.

use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::backend::Backend;
use kbench_core::spec::Experiment;
use kbench_core::trace::{self, TraceAcceptance};

use super::error::{CliError, CliResult};
use super::exit;

pub fn make_backend(exp: &Experiment) -> CliResult<Box<dyn Backend>> {
    match exp.file.backend.kind.as_str() {
        "sim" => {
            let acceptance = acceptance_for(exp)?;
            let sim = kbench_sim::SimBackend::new(exp, acceptance)
                .map_err(|e| CliError::from_chain(exit::INVALID_INPUT, &e))?;
            Ok(Box::new(sim))
        }
        "engine" => super::engine::make_engine_backend(exp),
        other => Err(CliError::new(
            exit::INVALID_INPUT,
            format!(
                "{}: unknown backend `{other}` (known: sim, engine)",
                exp.path.display()
            ),
        )),
    }
}

/// The acceptance source a speculative simulation replays: the workload's trace.
pub fn acceptance_for(exp: &Experiment) -> CliResult<Option<Arc<dyn AcceptanceModel>>> {
    if !exp.spec.is_speculative() {
        return Ok(None);
    }
    let path = exp.trace.as_ref().ok_or_else(|| {
        CliError::new(
            exit::INVALID_INPUT,
            format!(
                "{}: the sim backend replays an acceptance trace for speculative decoding: set [workload] trace = \"...\" (see traces/)",
                exp.path.display()
            ),
        )
    })?;
    let t = trace::read(path).map_err(|e| CliError::from_chain(exit::INVALID_INPUT, &e))?;
    let acceptance =
        TraceAcceptance::for_spec(Arc::new(t), exp.file.seed, &exp.spec).map_err(|e| {
            CliError::from_chain(exit::INVALID_INPUT, &e).prefixed(format!("{}", path.display()))
        })?;
    Ok(Some(Arc::new(acceptance)))
}
