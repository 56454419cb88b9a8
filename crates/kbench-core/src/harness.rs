//! Levels, warm-up and closed-loop clients, written once for every backend.

use rand::RngExt;

use crate::backend::{Backend, BackendError, Nanos, Request, RequestRecord};
use crate::metrics::{level_metrics, LevelMetrics};
use crate::seed::rng_for;

#[derive(Debug, Clone, PartialEq)]
pub struct LoadPlan {
    pub seed: u64,
    pub concurrency: Vec<u32>,
    pub requests_per_level: u32,
    pub warmup_requests: u32,
    pub max_tokens: u32,
    /// Inclusive prompt-length range.
    pub input_len: (u32, u32),
    /// Open-loop levels (requests/s), after the concurrency levels.
    pub request_rates: Vec<f64>,
    pub burstiness: f64,
    /// At a rate level, the most requests in flight; the rest wait at the client.
    pub max_concurrency: Option<u32>,
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
            request_rates: exp.request_rates.clone(),
            burstiness: exp.burstiness,
            max_concurrency: exp.max_concurrency,
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
    let mut levels = Vec::with_capacity(plan.concurrency.len() + plan.request_rates.len());
    let kinds = plan
        .concurrency
        .iter()
        .map(|&c| Level::Clients(c))
        .chain(plan.request_rates.iter().map(|&r| Level::Rate(r)));
    for level in kinds {
        if crate::interrupt::requested() {
            return Run {
                levels,
                stopped: Some(BackendError::Interrupted),
            };
        }
        let result = match level {
            Level::Clients(c) => run_level(backend, plan, c, progress),
            Level::Rate(r) => run_rate_level(backend, plan, r, progress),
        };
        match result {
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

enum Level {
    Clients(u32),
    Rate(f64),
}

/// The id space of a rate level: its requests' ids must differ from every concurrency
/// level's (whose ids carry the concurrency in the high bits) and from the other rates'.
fn rate_level_key(index: usize) -> u32 {
    0x8000_0000 | index as u32
}

/// One open-loop level: warm-up requests first, closed-loop at the cap (or all at once),
/// then `requests_per_level` requests arriving at `rate` per second with the plan's
/// burstiness, each submitted at its arrival unless `max_concurrency` are in flight, in which
/// case it waits at the client (its queueing delay) for the next to finish.
fn run_rate_level(
    backend: &mut dyn Backend,
    plan: &LoadPlan,
    rate: f64,
    progress: &mut dyn Progress,
) -> Result<LevelResult, BackendError> {
    let index = plan
        .request_rates
        .iter()
        .position(|&r| r == rate)
        .unwrap_or(0);
    let key = rate_level_key(index);
    let cap = plan.max_concurrency.unwrap_or(u32::MAX);
    let total = plan.warmup_requests + plan.requests_per_level;
    let label = plan.max_concurrency.unwrap_or(0);
    progress.level_started(label, total);
    let backend_name = backend.name();
    let mut session = backend.start_level(cap)?;
    let mut records = Vec::with_capacity(total as usize);
    let mut done = 0u32;
    // requests sent the moment they arrived: their times count from the arrival, which may
    // fall inside the forward the session was running then (the server's wait, not the
    // client's)
    let mut arrived_at: std::collections::HashMap<u64, Nanos> = Default::default();
    let mut finish = |records: &mut Vec<RequestRecord>,
                      finished: Vec<RequestRecord>,
                      in_flight: &mut u32,
                      arrived_at: &mut std::collections::HashMap<u64, Nanos>| {
        for mut r in finished {
            if let Some(at) = arrived_at.remove(&r.id) {
                r.submitted_ns = at.min(r.submitted_ns);
            }
            *in_flight -= 1;
            done += 1;
            progress.request_finished(label, done, total);
            records.push(r);
        }
    };
    // warm-up: closed loop at the cap, bounded by the warm-up count
    let warm_cap = cap.min(plan.warmup_requests.max(1));
    let (mut next, mut in_flight) = (0u32, 0u32);
    while next < plan.warmup_requests || in_flight > 0 {
        while next < plan.warmup_requests && in_flight < warm_cap {
            session.submit(make_request(plan, key, next, true))?;
            next += 1;
            in_flight += 1;
        }
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
        finish(&mut records, finished, &mut in_flight, &mut arrived_at);
    }
    session.measured_started();
    let origin = session.now_ns();
    let arrivals = crate::arrivals::arrival_times(
        plan.seed,
        key as u64,
        plan.requests_per_level,
        rate,
        plan.burstiness,
    );
    // (index, arrival, whether every slot was taken when it arrived)
    let mut waiting: std::collections::VecDeque<(u32, Nanos, bool)> = Default::default();
    let mut full = false;
    let mut queue_delays_ns = Vec::with_capacity(arrivals.len());
    let mut max_in_flight = 0u32;
    let mut arrived = 0usize;
    loop {
        let now = session.now_ns();
        while arrived < arrivals.len() && origin + arrivals[arrived] <= now {
            waiting.push_back((arrived as u32, origin + arrivals[arrived], full));
            arrived += 1;
        }
        while in_flight < cap {
            let Some((index, at, waited)) = waiting.pop_front() else {
                break;
            };
            let request = make_request(plan, key, index, false);
            if !waited {
                // a slot was free when it arrived: no wait at the client
                queue_delays_ns.push(0);
                arrived_at.insert(request.id, at);
            } else {
                queue_delays_ns.push(session.now_ns().saturating_sub(at));
            }
            session.submit(request)?;
            in_flight += 1;
            max_in_flight = max_in_flight.max(in_flight);
        }
        if arrived == arrivals.len() && waiting.is_empty() && in_flight == 0 {
            break;
        }
        full = in_flight >= cap;
        for w in waiting.iter_mut() {
            w.2 = true;
        }
        let finished = if arrived < arrivals.len() && (in_flight < cap || in_flight == 0) {
            session.advance_to(origin + arrivals[arrived])?
        } else {
            let f = session.run_until_completion()?;
            if f.is_empty() {
                return Err(BackendError::Stalled {
                    backend: backend_name,
                    pending: in_flight as usize,
                });
            }
            f
        };
        if crate::interrupt::requested() {
            return Err(BackendError::Interrupted);
        }
        finish(&mut records, finished, &mut in_flight, &mut arrived_at);
    }
    let server_spec = session.server_counters();
    drop(session);
    progress.level_finished(label);
    let mut metrics = level_metrics(label, &records);
    metrics.server_spec = server_spec;
    metrics.request_rate = Some(rate);
    metrics.max_concurrent_requests = Some(max_in_flight);
    queue_delays_ns.sort_unstable();
    let ms: Vec<f64> = queue_delays_ns.iter().map(|&d| d as f64 / 1e6).collect();
    metrics.mean_queue_delay_ms = Some(ms.iter().sum::<f64>() / ms.len().max(1) as f64);
    metrics.median_queue_delay_ms = Some(crate::metrics::percentile(&ms, 50.0));
    metrics.p99_queue_delay_ms = Some(crate::metrics::percentile(&ms, 99.0));
    Ok(LevelResult {
        concurrency: label,
        records,
        metrics,
    })
}
