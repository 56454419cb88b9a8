//! `kbench fidelity`: every corpus case run on the simulator, each measured point beside its
//! prediction, and the errors summarized per role and metric. The prediction is the
//! experiment's simulation; the measured value is read only to compute the error.

use kbench_core::error_chain::Chain;
use std::collections::BTreeMap;
use std::path::Path;

use kbench_core::backend::Backend;
use kbench_core::experiment::{load_experiment, Experiment};
use kbench_core::harness::{run_levels, LoadPlan, NoProgress};
use kbench_core::metrics::percentile;
use serde::Serialize;

use crate::corpus::{Case, LoadedCorpus, Role, DECODE_THROUGHPUT, SPEEDUP};
use crate::engine_profile::EngineProfile;
use crate::error::SimError;
use crate::sim::SimBackend;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointResult {
    pub source: String,
    pub case: String,
    pub role: Role,
    pub engine: String,
    /// The engine profile the prediction ran on.
    pub engine_profile: String,
    pub metric: String,
    pub concurrency: Option<u32>,
    pub measured: f64,
    pub predicted: f64,
    /// (predicted - measured) / measured, percent.
    pub error_pct: f64,
}

/// A case the simulator could not run (a configuration it refuses, a missing trace).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedCase {
    pub source: String,
    pub case: String,
    pub role: Role,
    pub points: usize,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorStats {
    pub n: usize,
    pub median_abs_pct: f64,
    pub p90_abs_pct: f64,
    pub max_abs_pct: f64,
    /// The point with the largest error: `source/case C=..`.
    pub worst: String,
}

/// An engine profile the corpus ran on, and what it was fitted to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileUse {
    /// The corpus sources its `[calibration]` names (empty: priors only).
    pub fitted_to: Vec<String>,
    /// Its held-apart error as calibration measured it (`leave-one-source-out: 12.3%`).
    pub held_out: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FidelityReport {
    pub points: Vec<PointResult>,
    pub failed: Vec<FailedCase>,
    /// Engine profile name -> what it was fitted to.
    pub engine_profiles: BTreeMap<String, ProfileUse>,
    /// role -> metric -> errors.
    pub summary: BTreeMap<String, BTreeMap<String, ErrorStats>>,
    /// source -> metric -> errors of its `check` points alone: one model's miss on one box
    /// is not spread over the others' summary.
    pub check_by_source: BTreeMap<String, BTreeMap<String, ErrorStats>>,
}

/// Runs every case of every corpus file.
pub fn run_corpus(corpora: &[LoadedCorpus]) -> FidelityReport {
    let mut points = Vec::new();
    let mut failed = Vec::new();
    let mut engine_profiles = BTreeMap::new();
    for corpus in corpora {
        let dir = corpus.path.parent().unwrap_or(Path::new("."));
        let source = &corpus.file.source.name;
        for case in &corpus.file.cases {
            match run_case(dir, source, case, &corpus.file.cases) {
                Ok((mut p, profile)) => {
                    points.append(&mut p);
                    engine_profiles
                        .entry(profile.name.clone())
                        .or_insert_with(|| {
                            let c = profile.calibration.as_ref();
                            ProfileUse {
                                fitted_to: c.map(|c| c.sources.clone()).unwrap_or_default(),
                                held_out: c.map(|c| {
                                    if c.held_out.starts_with("none") {
                                        c.held_out.clone()
                                    } else {
                                        format!(
                                            "{}: rms {:.1}%",
                                            c.held_out,
                                            100.0 * c.held_out_rms_rel_error
                                        )
                                    }
                                }),
                            }
                        });
                }
                Err(e) => failed.push(FailedCase {
                    source: source.clone(),
                    case: case.name.clone(),
                    role: case.role,
                    points: case.points.len(),
                    error: Chain(&e).to_string(),
                }),
            }
        }
    }
    let summary = summarize(&points, |p| Some(p.role.name().to_string()));
    let check_by_source = summarize(&points, |p| {
        (p.role == Role::Check).then(|| p.source.clone())
    });
    FidelityReport {
        points,
        failed,
        engine_profiles,
        summary,
        check_by_source,
    }
}

/// The case's own `--set` overrides.
fn own_overrides(case: &Case) -> Vec<String> {
    case.set.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The overrides a case runs with: its own, then the levels its points need.
fn case_overrides(case: &Case, file_levels: &[u32]) -> Vec<String> {
    let mut sets = own_overrides(case);
    let mut levels: Vec<u32> = case.points.iter().filter_map(|p| p.concurrency).collect();
    // a point at saturation (its own metric, or a speedup there) needs every level
    if case.points.iter().any(|p| p.concurrency.is_none()) {
        levels.extend_from_slice(file_levels);
    }
    levels.sort_unstable();
    levels.dedup();
    let list: Vec<String> = levels.iter().map(u32::to_string).collect();
    sets.push(format!("benchmark.concurrency=[{}]", list.join(", ")));
    sets.push("benchmark.request_rate=[]".into());
    if let Some(per_client) = case.requests_per_client {
        sets.push(format!("benchmark.requests_per_client={per_client}"));
    }
    sets
}

/// The experiment a case runs: its file with the case's overrides and the levels its
/// points need.
pub(crate) fn case_experiment(dir: &Path, case: &Case) -> Result<Experiment, SimError> {
    let path = dir.join(&case.experiment);
    let experiment = |sets: &[String]| {
        let mut variants = load_experiment(&path, sets).map_err(|e| SimError::Experiment {
            path: path.clone(),
            source: Box::new(e),
        })?;
        if variants.len() != 1 {
            return Err(SimError::Measurements {
                path: path.clone(),
                message: format!(
                    "case `{}`: a corpus case names one configuration, not a sweep of {}",
                    case.name,
                    variants.len()
                ),
            });
        }
        Ok(variants.remove(0).experiment)
    };
    // the file's own levels, which a case keeps unless its points say
    let base = experiment(&own_overrides(case))?;
    experiment(&case_overrides(case, &base.concurrency))
}

/// Runs a case's experiment on `backend` and reads the value of each of its points.
/// `means_only` when no point reads a percentile (a fit's evaluations): the levels then
/// store and sort no latencies.
pub(crate) fn predict_points(
    exp: &Experiment,
    case: &Case,
    backend: &mut dyn Backend,
    means_only: bool,
) -> Result<Vec<f64>, SimError> {
    let plan = LoadPlan::from_experiment(exp);
    let plan = if means_only && !case.points.iter().any(|p| reads_a_percentile(&p.metric)) {
        plan.means_only()
    } else {
        plan
    };
    let levels = run_levels(backend, &plan, &mut NoProgress).map_err(|e| SimError::Backend {
        experiment: case.name.clone(),
        source: Box::new(e),
    })?;
    let metrics: Vec<serde_json::Value> = levels
        .iter()
        .map(|l| serde_json::to_value(&l.metrics).unwrap_or_default())
        .collect();
    case.points
        .iter()
        .map(|p| match p.concurrency {
            None => Ok(levels
                .iter()
                .map(|l| l.metrics.output_throughput)
                .fold(0.0, f64::max)),
            Some(c) => levels
                .iter()
                .zip(&metrics)
                .find(|(l, _)| l.concurrency == c)
                .and_then(|(_, m)| {
                    // a speedup's numerator; divide_speedups divides by the baseline's
                    let key = if p.metric == SPEEDUP {
                        p.speedup_of()
                    } else {
                        p.metric.as_str()
                    };
                    if key == DECODE_THROUGHPUT {
                        let tpot = m.get("mean_tpot_ms").and_then(|v| v.as_f64())?;
                        return (tpot > 0.0).then(|| c as f64 * 1000.0 / tpot);
                    }
                    m.get(key).and_then(|v| v.as_f64())
                })
                .ok_or_else(|| SimError::Measurements {
                    path: exp.path.clone(),
                    message: format!(
                        "case `{}`: the run has no `{}` at C={c}",
                        case.name, p.metric
                    ),
                }),
        })
        .collect()
}

fn run_case(
    dir: &Path,
    source: &str,
    case: &Case,
    cases: &[Case],
) -> Result<(Vec<PointResult>, EngineProfile), SimError> {
    let exp = case_experiment(dir, case)?;
    let mut backend = SimBackend::new(&exp, crate::open::acceptance_for(&exp)?)?;
    let profile = backend.cost_model().engine.clone();
    let mut predicted = predict_points(&exp, case, &mut backend, false)?;
    divide_speedups(dir, case, cases, &mut predicted)?;
    let points = case
        .points
        .iter()
        .zip(predicted)
        .map(|(p, predicted)| PointResult {
            source: source.into(),
            case: case.name.clone(),
            role: case.role,
            engine: case.engine.clone(),
            engine_profile: profile.name.clone(),
            metric: p.metric.clone(),
            concurrency: p.concurrency,
            measured: p.value,
            predicted,
            error_pct: (predicted - p.value) / p.value * 100.0,
        })
        .collect();
    Ok((points, profile))
}

fn reads_a_percentile(metric: &str) -> bool {
    metric.starts_with("median_") || metric.starts_with("p99_")
}

/// A `speedup` point was predicted as the case's own output throughput; divides it by its
/// baseline case's, run at the same loads.
fn divide_speedups(
    dir: &Path,
    case: &Case,
    cases: &[Case],
    predicted: &mut [f64],
) -> Result<(), SimError> {
    let speedups: Vec<usize> = (0..case.points.len())
        .filter(|&i| case.points[i].metric == SPEEDUP)
        .collect();
    if speedups.is_empty() {
        return Ok(());
    }
    let baseline = case
        .baseline
        .as_deref()
        .and_then(|b| cases.iter().find(|c| c.name == b))
        .ok_or_else(|| SimError::Measurements {
            path: dir.join(&case.experiment),
            message: format!("case `{}`: its baseline is not in the corpus", case.name),
        })?;
    let plain = Case {
        points: speedups.iter().map(|&i| case.points[i].clone()).collect(),
        ..baseline.clone()
    };
    let exp = case_experiment(dir, &plain)?;
    let mut backend = SimBackend::new(&exp, crate::open::acceptance_for(&exp)?)?;
    let plain_throughput = predict_points(&exp, &plain, &mut backend, false)?;
    for (&i, t) in speedups.iter().zip(plain_throughput) {
        predicted[i] /= t;
    }
    Ok(())
}

/// Error statistics per group (the key `group_of` gives a point; `None` leaves it out) and
/// metric.
fn summarize(
    points: &[PointResult],
    group_of: impl Fn(&PointResult) -> Option<String>,
) -> BTreeMap<String, BTreeMap<String, ErrorStats>> {
    let mut groups: BTreeMap<(String, String), Vec<&PointResult>> = BTreeMap::new();
    for p in points.iter().filter(|p| p.error_pct.is_finite()) {
        if let Some(key) = group_of(p) {
            groups.entry((key, p.metric.clone())).or_default().push(p);
        }
    }
    let mut summary: BTreeMap<String, BTreeMap<String, ErrorStats>> = BTreeMap::new();
    for ((role, metric), group) in groups {
        let mut abs: Vec<f64> = group.iter().map(|p| p.error_pct.abs()).collect();
        abs.sort_by(f64::total_cmp);
        let worst = group
            .iter()
            .max_by(|a, b| a.error_pct.abs().total_cmp(&b.error_pct.abs()))
            .map(|p| point_label(p))
            .unwrap_or_default();
        summary.entry(role).or_default().insert(
            metric,
            ErrorStats {
                n: group.len(),
                median_abs_pct: percentile(&abs, 50.0),
                p90_abs_pct: percentile(&abs, 90.0),
                max_abs_pct: abs.last().copied().unwrap_or(0.0),
                worst,
            },
        );
    }
    summary
}

pub fn point_label(p: &PointResult) -> String {
    match p.concurrency {
        Some(c) => format!("{}/{} C={c}", p.source, p.case),
        None => format!("{}/{} saturation", p.source, p.case),
    }
}
