//! From run candidates to the answer: each one's objective at its level under the SLOs,
//! the ranking, the margin over plain decoding, and the Pareto frontier of throughput
//! against per-request speed. Pure functions of the evaluated candidates.

use std::collections::BTreeMap;

use kbench_core::metrics::LevelMetrics;
use kbench_core::report::Report;
use serde::Serialize;

use crate::evaluate::{Evaluated, Outcome};
use crate::objective::{metric_value, At, Objective, Slo};

/// A candidate's objective: the value and the level it was read at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Score {
    /// Index into the evaluated candidates.
    pub candidate: usize,
    /// Index into that candidate's report levels.
    pub level: usize,
    pub value: f64,
}

/// Why a candidate that ran is not ranked.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unranked {
    /// No level (at the objective's place) meets every SLO; the first SLO it misses.
    Slo(String),
    /// The level has no value for the objective (accept length without speculation).
    NoValue,
    /// The objective's level is not in its report.
    NoLevel,
}

/// A candidate's score, or why it has none.
pub fn score(
    candidate: usize,
    report: &Report,
    objective: &Objective,
    slos: &[Slo],
) -> Result<Score, Unranked> {
    let levels: Vec<(usize, &LevelMetrics)> = report
        .levels
        .iter()
        .enumerate()
        .filter(|(_, m)| objective.at.matches(m))
        .collect();
    if levels.is_empty() {
        return Err(Unranked::NoLevel);
    }
    let mut best: Option<Score> = None;
    let mut first_missed: Option<&Slo> = None;
    let mut any_value = false;
    for (i, m) in levels {
        if let Some(missed) = slos.iter().find(|s| !s.met(m)) {
            first_missed.get_or_insert(missed);
            continue;
        }
        let Some(v) = metric_value(m, &objective.metric) else {
            continue;
        };
        any_value = true;
        if best.is_none_or(|b| objective.better(v, b.value)) {
            best = Some(Score {
                candidate,
                level: i,
                value: v,
            });
        }
    }
    match (best, first_missed) {
        (Some(b), _) => Ok(b),
        (None, Some(s)) if !any_value => Err(Unranked::Slo(s.to_string())),
        _ => Err(Unranked::NoValue),
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Ranking {
    /// Best first; ties go to the earlier candidate.
    pub ranked: Vec<Score>,
    /// Skipped before running, by rule.
    pub skipped_by_rule: BTreeMap<String, usize>,
    /// Ran but met no SLO, by the first SLO missed.
    pub skipped_by_slo: BTreeMap<String, usize>,
    pub without_value: usize,
    /// The best plain-decoding configuration (in the space or run as the baseline).
    pub baseline: Option<Score>,
}

impl Ranking {
    pub fn best(&self) -> Option<&Score> {
        self.ranked.first()
    }

    /// (value - baseline) / baseline, signed so that better is positive.
    pub fn margin(&self, objective: &Objective, s: &Score) -> Option<f64> {
        let b = self.baseline?;
        if b.value == 0.0 || s.value == 0.0 {
            return None;
        }
        Some(if objective.lower_is_better() {
            b.value / s.value - 1.0
        } else {
            s.value / b.value - 1.0
        })
    }
}

pub fn rank(evaluated: &[Evaluated], objective: &Objective, slos: &[Slo]) -> Ranking {
    let mut r = Ranking::default();
    for (i, e) in evaluated.iter().enumerate() {
        let run = match &e.outcome {
            Outcome::Skipped { rule, .. } => {
                if e.candidate.in_space {
                    *r.skipped_by_rule.entry(rule.clone()).or_default() += 1;
                }
                continue;
            }
            Outcome::Ran(run) => run,
        };
        let plain = !run.experiment.speculative.is_speculative();
        match score(i, &run.report, objective, slos) {
            Ok(s) => {
                if plain
                    && r.baseline
                        .is_none_or(|b| objective.better(s.value, b.value))
                {
                    r.baseline = Some(s);
                }
                if e.candidate.in_space {
                    r.ranked.push(s);
                }
            }
            Err(Unranked::Slo(first)) if e.candidate.in_space => {
                *r.skipped_by_slo.entry(first).or_default() += 1;
            }
            Err(_) if e.candidate.in_space => r.without_value += 1,
            Err(_) => {}
        }
    }
    r.ranked.sort_by(|a, b| {
        let order = if objective.lower_is_better() {
            a.value.total_cmp(&b.value)
        } else {
            b.value.total_cmp(&a.value)
        };
        order.then(a.candidate.cmp(&b.candidate))
    });
    r
}

/// One (candidate, level) on the frontier.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FrontierPoint {
    pub candidate: usize,
    pub level: usize,
    pub output_throughput: f64,
    pub per_request_output_throughput: f64,
}

/// Every level of every ranked-able candidate that meets the SLOs, reduced to those no
/// other beats on both output throughput and per-request speed; by per-request speed.
pub fn frontier(evaluated: &[Evaluated], slos: &[Slo]) -> Vec<FrontierPoint> {
    let mut points = Vec::new();
    for (i, e) in evaluated.iter().enumerate() {
        let Some(run) = e.run().filter(|_| e.candidate.in_space) else {
            continue;
        };
        for (l, m) in run.report.levels.iter().enumerate() {
            if slos.iter().all(|s| s.met(m)) {
                points.push(FrontierPoint {
                    candidate: i,
                    level: l,
                    output_throughput: m.output_throughput,
                    per_request_output_throughput: m.per_request_output_throughput,
                });
            }
        }
    }
    // by speed descending, then throughput descending: a point is on the frontier when its
    // throughput beats every faster point's
    points.sort_by(|a, b| {
        b.per_request_output_throughput
            .total_cmp(&a.per_request_output_throughput)
            .then(b.output_throughput.total_cmp(&a.output_throughput))
            .then(a.candidate.cmp(&b.candidate))
            .then(a.level.cmp(&b.level))
    });
    let mut out: Vec<FrontierPoint> = Vec::new();
    let mut best_throughput = f64::NEG_INFINITY;
    for p in points {
        if p.output_throughput > best_throughput {
            best_throughput = p.output_throughput;
            out.push(p);
        }
    }
    out.reverse();
    out
}

/// The concurrency a score's level was run at (for a rate level, its cap, else the most
/// requests in flight).
pub fn level_concurrency(m: &LevelMetrics) -> u32 {
    match (m.request_rate, m.max_concurrent_requests) {
        (None, _) => m.concurrency,
        (Some(_), Some(n)) => n,
        (Some(_), None) => m.concurrency,
    }
}

/// The objective's place as a concurrency, for explaining a round there.
pub fn at_concurrency(at: &At, m: &LevelMetrics) -> u32 {
    match at {
        At::Concurrency(c) => *c,
        _ => level_concurrency(m),
    }
}
