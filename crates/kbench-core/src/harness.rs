//! Levels, warm-up and closed-loop clients, written once for every backend.

use rand::RngExt;

use crate::backend::{Backend, BackendError, Request, RequestRecord};
use crate::metrics::{level_metrics, LevelMetrics};
use crate::seed::rng_for;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPlan {
    pub seed: u64,
    pub concurrency: Vec<u32>,
    pub requests_per_level: u32,
    pub warmup_requests: u32,
    pub max_tokens: u32,
    /// Inclusive prompt-length range.
    pub input_len: (u32, u32),
}

impl LoadPlan {
    /// The load an experiment file describes.
    pub fn from_experiment(exp: &crate::spec::Experiment) -> LoadPlan {
        LoadPlan {
            seed: exp.file.seed,
            concurrency: exp.concurrency.clone(),
            requests_per_level: exp.requests_per_level,
            warmup_requests: exp.warmup_requests,
            max_tokens: exp.max_tokens,
            input_len: exp.input_len,
        }
    }
}

/// Told about progress so the CLI can draw a bar; the harness itself prints nothing.
pub trait Progress {
    fn level_started(&mut self, _concurrency: u32, _total_requests: u32) {}
    fn request_finished(&mut self, _concurrency: u32, _done: u32, _total_requests: u32) {}
    fn level_finished(&mut self, _concurrency: u32) {}
}

pub struct NoProgress;
impl Progress for NoProgress {}

#[derive(Debug, Clone)]
pub struct LevelResult {
    pub concurrency: u32,
    pub records: Vec<RequestRecord>,
    pub metrics: LevelMetrics,
}

/// Request ids are stable functions of (level, index), so a request's prompt and trace
/// slice do not depend on which level ran first.
pub fn request_id(concurrency: u32, index: u32, warmup: bool) -> u64 {
    ((concurrency as u64) << 32) | ((warmup as u64) << 31) | index as u64
}

pub fn make_request(plan: &LoadPlan, concurrency: u32, index: u32, warmup: bool) -> Request {
    let id = request_id(concurrency, index, warmup);
    let (lo, hi) = plan.input_len;
    let input_len = if lo == hi {
        lo
    } else {
        rng_for(plan.seed, "input_len", id).random_range(lo..=hi)
    };
    Request {
        id,
        input_len,
        max_tokens: plan.max_tokens,
        warmup,
    }
}

/// Runs every level: warm-up requests first (at the level's concurrency, left out of the
/// metrics), then `requests_per_level` requests from `concurrency` closed-loop clients: each
/// client sends its next request the moment its previous one finishes.
pub fn run_levels(
    backend: &mut dyn Backend,
    plan: &LoadPlan,
    progress: &mut dyn Progress,
) -> Result<Vec<LevelResult>, BackendError> {
    let run = run_levels_until_stopped(backend, plan, progress);
    match run.stopped {
        Some(e) => Err(e),
        None => Ok(run.levels),
    }
}

/// The levels that finished, and why the run stopped before the last one, if it did.
#[derive(Debug)]
pub struct Run {
    pub levels: Vec<LevelResult>,
    pub stopped: Option<BackendError>,
}

/// [`run_levels`] that keeps the finished levels when a later one fails or Ctrl-C stops it
/// (see [`crate::interrupt`]), so they can still be reported, marked partial.
pub fn run_levels_until_stopped(
    backend: &mut dyn Backend,
    plan: &LoadPlan,
    progress: &mut dyn Progress,
) -> Run {
    let mut levels = Vec::with_capacity(plan.concurrency.len());
    for &c in &plan.concurrency {
        if crate::interrupt::requested() {
            return Run {
                levels,
                stopped: Some(BackendError::Interrupted),
            };
        }
        match run_level(backend, plan, c, progress) {
            Ok(level) => levels.push(level),
            Err(e) => {
                return Run {
                    levels,
                    stopped: Some(e),
                }
            }
        }
    }
    Run {
        levels,
        stopped: None,
    }
}

fn run_level(
    backend: &mut dyn Backend,
    plan: &LoadPlan,
    c: u32,
    progress: &mut dyn Progress,
) -> Result<LevelResult, BackendError> {
    {
        let total = plan.warmup_requests + plan.requests_per_level;
        progress.level_started(c, total);
        let backend_name = backend.name();
        let mut session = backend.start_level(c)?;
        let mut done = 0u32;
        let mut records = Vec::with_capacity(total as usize);
        for (warmup, count) in [
            (true, plan.warmup_requests),
            (false, plan.requests_per_level),
        ] {
            if !warmup {
                session.measured_started();
            }
            let mut next = 0u32;
            let mut in_flight = 0u32;
            while next < count && in_flight < c {
                session.submit(make_request(plan, c, next, warmup))?;
                next += 1;
                in_flight += 1;
            }
            while in_flight > 0 {
                let finished = session.run_until_completion()?;
                if finished.is_empty() {
                    return Err(BackendError::Stalled {
                        backend: backend_name,
                        pending: in_flight as usize,
                    });
                }
                if crate::interrupt::requested() {
                    return Err(BackendError::Interrupted);
                }
                for record in finished {
                    in_flight -= 1;
                    done += 1;
                    progress.request_finished(c, done, total);
                    records.push(record);
                    if next < count {
                        session.submit(make_request(plan, c, next, warmup))?;
                        next += 1;
                        in_flight += 1;
                    }
                }
            }
        }
        let server_spec = session.server_counters();
        drop(session);
        progress.level_finished(c);
        let mut metrics = level_metrics(c, &records);
        metrics.server_spec = server_spec;
        Ok(LevelResult {
            concurrency: c,
            records,
            metrics,
        })
    }
}
