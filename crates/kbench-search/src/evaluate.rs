//! Running the candidates on the simulator: in parallel, each on its own backend, with the
//! trace read once and each speculative shape's replayed commits shared. Results are
//! stored by candidate index, so the output is the same bytes on 1 thread or many.

use kbench_core::error_chain::Chain;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::experiment::Experiment;
use kbench_core::harness::{run_levels, LoadPlan, NoProgress};
use kbench_core::report::{build_report, Report};
use kbench_core::trace::{self, Trace, TraceAcceptance};
use kbench_sim::{SimBackend, SimError};

use crate::error::SearchError;
use crate::prepare::Prepared;
use crate::space::Candidate;

#[derive(Debug, Clone)]
pub struct Evaluated {
    pub candidate: Candidate,
    pub outcome: Outcome,
}

#[derive(Debug, Clone)]
pub enum Outcome {
    /// Not simulated: SGLang (or the memory, or the trace) refuses it.
    Skipped {
        rule: String,
        message: String,
    },
    Ran(Box<Run>),
}

#[derive(Debug, Clone)]
pub struct Run {
    pub experiment: Experiment,
    pub report: Report,
}

impl Evaluated {
    pub fn run(&self) -> Option<&Run> {
        match &self.outcome {
            Outcome::Ran(r) => Some(r),
            Outcome::Skipped { .. } => None,
        }
    }
}

/// The rule a skipped candidate broke, as the summary counts it.
pub const RULE_DOES_NOT_FIT: &str = "does not fit the GPUs (weights or one request's KV cache)";
pub const RULE_TRACE: &str =
    "the acceptance trace cannot replay it (deeper or wider than recorded)";

/// Shared across the workers: each trace read once, each shape's acceptance built once.
#[derive(Default)]
struct Shared {
    traces: Mutex<BTreeMap<PathBuf, Arc<Trace>>>,
    /// By (trace, seed, steps, topk): one acceptance answers every num_draft_tokens of a
    /// shape from the same remembered replays.
    acceptance: Mutex<BTreeMap<(PathBuf, u64, u32, u32), TraceAcceptance>>,
}

impl Shared {
    fn acceptance(&self, exp: &Experiment) -> Result<Option<Arc<dyn AcceptanceModel>>, SimError> {
        if !exp.speculative.is_speculative() {
            return Ok(None);
        }
        if exp.accept_length.is_some() {
            return kbench_sim::acceptance_for(exp);
        }
        let path = exp.trace.clone().ok_or_else(|| SimError::NoTrace {
            experiment: exp.path.clone(),
        })?;
        let s = &exp.speculative;
        let key = (path.clone(), exp.file.seed, s.shape.num_steps, s.shape.topk);
        let replay_error = |source| SimError::TraceReplay {
            path: path.clone(),
            source,
        };
        let cached = self
            .acceptance
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned());
        if let Some(a) = cached {
            a.check(s).map_err(replay_error)?;
            return Ok(Some(Arc::new(a)));
        }
        let t = self.trace(&path)?;
        let a = TraceAcceptance::for_spec(t, exp.file.seed, s).map_err(replay_error)?;
        if let Ok(mut m) = self.acceptance.lock() {
            m.entry(key).or_insert_with(|| a.clone());
        }
        Ok(Some(Arc::new(a)))
    }

    fn trace(&self, path: &PathBuf) -> Result<Arc<Trace>, SimError> {
        if let Some(t) = self.traces.lock().ok().and_then(|m| m.get(path).cloned()) {
            return Ok(t);
        }
        // read outside the lock; a second reader of the same file only wastes time
        let t = Arc::new(trace::read(path).map_err(SimError::TraceRead)?);
        if let Ok(mut m) = self.traces.lock() {
            return Ok(m.entry(path.clone()).or_insert(t).clone());
        }
        Ok(t)
    }
}

/// Runs every candidate; `progress(done, total)` after each. `threads` 0: one per core.
pub fn evaluate(
    prepared: &Prepared,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<Evaluated>, SearchError> {
    let total = prepared.candidates.len();
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .clamp(1, total.max(1));
    let shared = Shared::default();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let worker = || -> Result<Vec<(usize, Evaluated)>, SearchError> {
        let mut mine = Vec::new();
        loop {
            if kbench_core::interrupt::requested() {
                return Err(SearchError::Interrupted {
                    done: done.load(Ordering::Relaxed),
                    total,
                });
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(candidate) = prepared.candidates.get(i) else {
                return Ok(mine);
            };
            let outcome = run_candidate(prepared, candidate, &shared)?;
            mine.push((
                i,
                Evaluated {
                    candidate: candidate.clone(),
                    outcome,
                },
            ));
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
        }
    };
    let results: Vec<Result<Vec<(usize, Evaluated)>, SearchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(SearchError::Settings {
                        path: prepared.path.clone(),
                        what: "run".into(),
                        message: "a search worker panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut all = Vec::with_capacity(total);
    for r in results {
        all.extend(r?);
    }
    all.sort_by_key(|(i, _)| *i);
    Ok(all.into_iter().map(|(_, e)| e).collect())
}

/// One candidate: loaded as `kbench experiment --set ...` would load it, run on the sim
/// backend as `kbench experiment` runs it, reported the same way.
fn run_candidate(
    prepared: &Prepared,
    candidate: &Candidate,
    shared: &Shared,
) -> Result<Outcome, SearchError> {
    let exp = match prepared.load(candidate) {
        Ok(e) => e,
        Err(e) => {
            return match e.broken_rule() {
                Some((rule, message)) => Ok(Outcome::Skipped {
                    rule: rule.to_string(),
                    message: message.to_string(),
                }),
                None => Err(e.into()),
            }
        }
    };
    let mut backend = match shared
        .acceptance(&exp)
        .and_then(|a| SimBackend::new(&exp, a))
    {
        Ok(b) => b,
        Err(e @ SimError::DoesNotFit(_)) => {
            return Ok(Outcome::Skipped {
                rule: RULE_DOES_NOT_FIT.into(),
                message: e.to_string(),
            })
        }
        Err(e @ SimError::TraceReplay { .. }) => {
            return Ok(Outcome::Skipped {
                rule: RULE_TRACE.into(),
                message: Chain(&e).to_string(),
            })
        }
        Err(e) => return Err(e.into()),
    };
    let levels = run_levels(
        &mut backend,
        &LoadPlan::from_experiment(&exp),
        &mut NoProgress,
    )
    .map_err(|source| {
        SearchError::Sim(SimError::Backend {
            experiment: exp.path.display().to_string(),
            source: Box::new(source),
        })
    })?;
    let report = build_report(&exp, None, &backend, &levels);
    Ok(Outcome::Ran(Box::new(Run {
        experiment: exp,
        report,
    })))
}

/// The sim backend a candidate ran on, rebuilt to price one round of it: a round's cost
/// does not depend on what it accepts, so the trace is not read again.
pub fn backend_for(exp: &Experiment) -> Result<SimBackend, SimError> {
    SimBackend::new(exp, Some(kbench_sim::predict::default_acceptance(exp)))
}
