//! Levels, warm-up and closed-loop clients, written once for every backend.

use crate::backend::{Backend, BackendError, Nanos, Request, RequestRecord, Session};
use crate::distribution::Distribution;
use crate::metrics::{LevelAccumulator, LevelMetrics};

/// How many requests a level measures: a fixed count, or a count per closed-loop client
/// (harnesses that send `--num-prompts` = N x concurrency). A resolved experiment has the
/// count each of its levels needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LevelRequests {
    pub per_level: Option<u32>,
    pub per_client: Option<u32>,
}

impl LevelRequests {
    pub fn fixed(n: u32) -> LevelRequests {
        LevelRequests {
            per_level: Some(n),
            per_client: None,
        }
    }

    /// Measured requests at a closed-loop level of `clients`.
    pub fn at_concurrency(&self, clients: u32) -> u32 {
        match self.per_client {
            Some(n) => n.saturating_mul(clients),
            None => self.per_level.unwrap_or(0),
        }
    }

    /// Measured requests at a request-rate level.
    pub fn at_rate(&self) -> u32 {
        self.per_level.unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoadPlan {
    pub seed: u64,
    pub concurrency: Vec<u32>,
    pub requests: LevelRequests,
    pub warmup_requests: u32,
    /// Each request's lengths, shared prefix and context.
    pub workload: crate::experiment::Workload,
    /// Open-loop levels (requests/s), after the concurrency levels.
    pub request_rates: Vec<f64>,
    pub burstiness: f64,
    /// At a rate level, the most requests in flight; the rest wait at the client.
    pub max_concurrency: Option<u32>,
    /// Whether each level keeps its requests' records (every token's timestamp) beside its
    /// metrics: for recording a trace and for tests. Off, a level's memory does not grow
    /// with its requests.
    pub keep_records: bool,
    /// Whether levels report latency percentiles; without, only means and counts (a fit's
    /// objective), and nothing per token is stored or sorted.
    pub percentiles: bool,
}

impl LoadPlan {
    /// The load an experiment file describes.
    pub fn from_experiment(exp: &crate::experiment::Experiment) -> LoadPlan {
        LoadPlan {
            seed: exp.file.seed,
            concurrency: exp.concurrency.clone(),
            requests: exp.requests,
            warmup_requests: exp.warmup_requests,
            workload: exp.workload.clone(),
            request_rates: exp.request_rates.clone(),
            burstiness: exp.burstiness,
            max_concurrency: exp.max_concurrency,
            keep_records: false,
            percentiles: true,
        }
    }

    /// The same load, reporting means and counts only.
    pub fn means_only(self) -> LoadPlan {
        LoadPlan {
            percentiles: false,
            ..self
        }
    }

    /// The same load, keeping every level's records.
    pub fn keeping_records(self) -> LoadPlan {
        LoadPlan {
            keep_records: true,
            ..self
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
    /// Empty unless the plan keeps records ([`LoadPlan::keeping_records`]).
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
    let lengths = plan.workload.request(plan.seed, id);
    Request {
        id,
        input_len: lengths.input_len,
        max_tokens: lengths.max_tokens,
        stop_at: lengths.stop_at,
        shared_prefix_len: plan.workload.shared_prefix_len,
        warmup,
    }
}

/// Runs every level: warm-up requests first (at the level's concurrency, left out of the
/// metrics), then the level's measured requests from `concurrency` closed-loop clients: each
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
        .chain((0..plan.request_rates.len()).map(Level::Rate));
    for level in kinds {
        if crate::interrupt::requested() {
            return Run {
                levels,
                stopped: Some(BackendError::Interrupted),
            };
        }
        let result = match level {
            Level::Clients(c) => run_level(backend, plan, c, progress),
            Level::Rate(index) => run_rate_level(backend, plan, index, progress),
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

enum Level {
    Clients(u32),
    /// The index of a rate in `plan.request_rates`.
    Rate(usize),
}

/// A level in progress: its session, what finished, and the progress count.
struct LevelRun<'s, 'p> {
    session: Box<dyn Session + 's>,
    backend: &'static str,
    progress: &'p mut dyn Progress,
    /// The level's name for progress (clients, or a rate level's cap).
    label: u32,
    total: u32,
    finished: u32,
    metrics: LevelAccumulator,
    /// Kept only when the plan asks.
    records: Option<Vec<RequestRecord>>,
    in_flight: u32,
}

impl LevelRun<'_, '_> {
    /// Serves until at least one request finishes; stops on a stall or Ctrl-C.
    fn wait(&mut self) -> Result<Vec<RequestRecord>, BackendError> {
        let finished = self.session.run_until_completion()?;
        if finished.is_empty() {
            return Err(BackendError::Stalled {
                backend: self.backend,
                pending: self.in_flight as usize,
            });
        }
        self.check_interrupt()?;
        Ok(finished)
    }

    fn check_interrupt(&self) -> Result<(), BackendError> {
        if crate::interrupt::requested() {
            return Err(BackendError::Interrupted);
        }
        Ok(())
    }

    fn submit(&mut self, request: Request) -> Result<(), BackendError> {
        self.session.submit(request)?;
        self.in_flight += 1;
        Ok(())
    }

    fn finished(&mut self, record: RequestRecord) {
        self.in_flight -= 1;
        self.finished += 1;
        self.metrics.add(&record);
        if let Some(records) = &mut self.records {
            records.push(record);
        }
        self.progress
            .request_finished(self.label, self.finished, self.total);
    }

    /// `count` requests (ids under `key`) from `clients` closed-loop clients, each sending
    /// its next request the moment its previous one finishes.
    fn closed_loop(
        &mut self,
        plan: &LoadPlan,
        key: u32,
        clients: u32,
        warmup: bool,
        count: u32,
    ) -> Result<(), BackendError> {
        let mut next = 0u32;
        while next < count && self.in_flight < clients {
            self.submit(make_request(plan, key, next, warmup))?;
            next += 1;
        }
        while self.in_flight > 0 {
            for record in self.wait()? {
                self.finished(record);
                if next < count {
                    self.submit(make_request(plan, key, next, warmup))?;
                    next += 1;
                }
            }
        }
        Ok(())
    }

    fn end(mut self, metrics_of: impl FnOnce(LevelAccumulator) -> LevelMetrics) -> LevelResult {
        let server_spec = self.session.server_counters();
        let kv = self.session.kv_cache();
        drop(self.session);
        self.progress.level_finished(self.label);
        let mut metrics = metrics_of(self.metrics);
        metrics.server_spec = server_spec;
        if let Some(kv) = kv {
            metrics.kv_cache_tokens = Some(kv.capacity_tokens);
            metrics.peak_kv_cache_usage =
                Some(kv.peak_used_tokens as f64 / kv.capacity_tokens.max(1) as f64);
        }
        LevelResult {
            concurrency: self.label,
            records: self.records.unwrap_or_default(),
            metrics,
        }
    }
}

fn start<'s, 'p>(
    backend: &'s mut dyn Backend,
    plan: &LoadPlan,
    label: u32,
    clients: u32,
    measured: u32,
    progress: &'p mut dyn Progress,
) -> Result<LevelRun<'s, 'p>, BackendError> {
    let total = plan.warmup_requests.saturating_add(measured);
    progress.level_started(label, total);
    let name = backend.name();
    Ok(LevelRun {
        session: backend.start_level(clients)?,
        backend: name,
        progress,
        label,
        total,
        finished: 0,
        metrics: if plan.percentiles {
            LevelAccumulator::default()
        } else {
            LevelAccumulator::means_only()
        },
        records: plan
            .keep_records
            .then(|| Vec::with_capacity(total as usize)),
        in_flight: 0,
    })
}

fn run_level(
    backend: &mut dyn Backend,
    plan: &LoadPlan,
    c: u32,
    progress: &mut dyn Progress,
) -> Result<LevelResult, BackendError> {
    let measured = plan.requests.at_concurrency(c);
    let mut level = start(backend, plan, c, c, measured, progress)?;
    level.closed_loop(plan, c, c, true, plan.warmup_requests)?;
    level.session.measured_started();
    level.closed_loop(plan, c, c, false, measured)?;
    Ok(level.end(|metrics| metrics.finish(c)))
}

/// The id space of a rate level: its requests' ids must differ from every concurrency
/// level's (whose ids carry the concurrency in the high bits) and from the other rates'.
fn rate_level_key(index: usize) -> u32 {
    0x8000_0000 | index as u32
}

/// One open-loop level: warm-up requests first, closed-loop at the cap (or all at once),
/// then `requests.at_rate()` requests arriving at the rate with the plan's burstiness, each
/// submitted at its arrival unless `max_concurrency` are in flight, in which case it waits
/// at the client (its queueing delay) for the next to finish.
fn run_rate_level(
    backend: &mut dyn Backend,
    plan: &LoadPlan,
    index: usize,
    progress: &mut dyn Progress,
) -> Result<LevelResult, BackendError> {
    let rate = plan.request_rates[index];
    let key = rate_level_key(index);
    let cap = plan.max_concurrency.unwrap_or(u32::MAX);
    let label = plan.max_concurrency.unwrap_or(0);
    let mut level = start(backend, plan, label, cap, plan.requests.at_rate(), progress)?;
    let warm_clients = cap.min(plan.warmup_requests.max(1));
    level.closed_loop(plan, key, warm_clients, true, plan.warmup_requests)?;
    level.session.measured_started();
    let origin = level.session.now_ns();
    let mut arrivals = crate::arrivals::Arrivals::new(
        plan.seed,
        key as u64,
        plan.requests.at_rate(),
        rate,
        plan.burstiness,
    )
    .map(|t| origin + t)
    .peekable();
    // requests sent the moment they arrived: their times count from the arrival, which may
    // fall inside the forward the session was running then (the server's wait, not the
    // client's)
    let mut arrived_at: std::collections::HashMap<u64, Nanos> = Default::default();
    // (index, arrival, whether every slot was taken when it arrived)
    let mut waiting: std::collections::VecDeque<(u32, Nanos, bool)> = Default::default();
    // how many at the front of `waiting` were already there the last time slots ran out:
    // they waited at the client whatever they found on arrival
    let mut waited_before = 0usize;
    let mut full = false;
    let mut queue_delay_ms = Distribution::default();
    let mut max_in_flight = 0u32;
    let mut arrived = 0u32;
    loop {
        let now = level.session.now_ns();
        while let Some(at) = arrivals.next_if(|&at| at <= now) {
            waiting.push_back((arrived, at, full));
            arrived += 1;
        }
        while level.in_flight < cap {
            let Some((index, at, full_on_arrival)) = waiting.pop_front() else {
                break;
            };
            let waited = full_on_arrival || waited_before > 0;
            waited_before = waited_before.saturating_sub(1);
            let request = make_request(plan, key, index, false);
            if waited {
                queue_delay_ms.push(now.saturating_sub(at) as f64 / 1e6);
            } else {
                // a slot was free when it arrived: no wait at the client
                queue_delay_ms.push(0.0);
                arrived_at.insert(request.id, at);
            }
            level.submit(request)?;
            max_in_flight = max_in_flight.max(level.in_flight);
        }
        let next_arrival = arrivals.peek().copied();
        if next_arrival.is_none() && waiting.is_empty() && level.in_flight == 0 {
            break;
        }
        full = level.in_flight >= cap;
        waited_before = waiting.len();
        let finished = match next_arrival {
            Some(at) if !full => {
                let f = level.session.advance_to(at)?;
                level.check_interrupt()?;
                f
            }
            _ => level.wait()?,
        };
        for mut r in finished {
            if let Some(at) = arrived_at.remove(&r.id) {
                r.submitted_ns = at.min(r.submitted_ns);
            }
            level.finished(r);
        }
    }
    let queue_delay = queue_delay_ms.summary();
    Ok(level.end(|metrics| {
        let mut m = metrics.finish(label);
        m.request_rate = Some(rate);
        m.max_concurrent_requests = Some(max_in_flight);
        m.mean_queue_delay_ms = Some(queue_delay.mean);
        m.median_queue_delay_ms = Some(queue_delay.median);
        m.p99_queue_delay_ms = Some(queue_delay.p99);
        m.percentiles = m.percentiles.and(&queue_delay);
        m
    }))
}
