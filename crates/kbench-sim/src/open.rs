//! The sim backend's one entry point: an experiment in, a simulator replaying the
//! experiment's acceptance trace out.

use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::backend::Backend;
use kbench_core::experiment::Experiment;
use kbench_core::trace::{self, TraceAcceptance};

use crate::error::SimError;
use crate::sim::SimBackend;

pub fn open(exp: &Experiment) -> Result<Box<dyn Backend>, SimError> {
    // The trace and the op tables are the two inputs worth milliseconds: read them on two
    // cores. Profiles and tables are checked first, so a bad profile is reported as such.
    std::thread::scope(|s| {
        let acceptance = s.spawn(|| acceptance_for(exp));
        let tables = crate::presets::resolve_profile(&exp.hardware)
            .and_then(|p| crate::presets::load_tables(&p));
        let acceptance = acceptance
            .join()
            .unwrap_or_else(|_| Err(SimError::Model("reading the trace panicked".into())));
        tables.map_err(|e| e.in_file(&exp.path))?;
        Ok(Box::new(SimBackend::new(exp, acceptance?)?) as Box<dyn Backend>)
    })
}

/// What a speculative simulation replays: the workload's trace, checked against the
/// experiment's speculative settings. `None` without speculation.
pub fn acceptance_for(exp: &Experiment) -> Result<Option<Arc<dyn AcceptanceModel>>, SimError> {
    if !exp.speculative.is_speculative() {
        return Ok(None);
    }
    if let Some(accept_length) = exp.accept_length {
        return Ok(Some(Arc::new(crate::acceptance::MeanAcceptance {
            seed: exp.file.seed,
            accept_length,
        })));
    }
    let path = exp.trace.as_ref().ok_or_else(|| SimError::NoTrace {
        experiment: exp.path.clone(),
    })?;
    if !path.exists() {
        return Err(SimError::TraceNotFound {
            experiment: exp.path.clone(),
            written: exp.file.workload.trace.clone().unwrap_or_default(),
            looked_at: std::path::absolute(path).unwrap_or_else(|_| path.clone()),
        });
    }
    let t = trace::read(path).map_err(SimError::TraceRead)?;
    let acceptance = TraceAcceptance::for_spec(Arc::new(t), exp.file.seed, &exp.speculative)
        .map_err(|source| SimError::TraceReplay {
            path: path.clone(),
            source,
        })?;
    Ok(Some(Arc::new(acceptance)))
}
