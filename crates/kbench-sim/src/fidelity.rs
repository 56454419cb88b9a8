//! `kbench fidelity`: every corpus case run on the simulator, each measured point beside its
//! prediction, and the errors summarized per role and metric. The prediction is the
//! experiment's simulation; the measured value is read only to compute the error.

use std::collections::BTreeMap;
use std::path::Path;

use kbench_core::harness::{run_levels, LoadPlan, NoProgress};
use kbench_core::metrics::percentile;
use kbench_core::spec::load_experiment;
use serde::Serialize;

use crate::corpus::{Case, LoadedCorpus, Role};
use crate::error::SimError;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointResult {
    pub source: String,
    pub case: String,
    pub role: Role,
    pub engine: String,
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

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FidelityReport {
    pub points: Vec<PointResult>,
    pub failed: Vec<FailedCase>,
    /// role -> metric -> errors.
    pub summary: BTreeMap<String, BTreeMap<String, ErrorStats>>,
}

/// Runs every case of every corpus file.
pub fn run_corpus(corpora: &[LoadedCorpus]) -> FidelityReport {
    let mut points = Vec::new();
    let mut failed = Vec::new();
    for corpus in corpora {
        let dir = corpus.path.parent().unwrap_or(Path::new("."));
        let source = &corpus.file.source.name;
        for case in &corpus.file.cases {
            match run_case(dir, source, case) {
                Ok(mut p) => points.append(&mut p),
                Err(e) => failed.push(FailedCase {
                    source: source.clone(),
                    case: case.name.clone(),
                    role: case.role,
                    points: case.points.len(),
                    error: error_chain(&e),
                }),
            }
        }
    }
    let summary = summarize(&points);
    FidelityReport {
        points,
        failed,
        summary,
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// The case's own `--set` overrides.
fn own_overrides(case: &Case) -> Vec<String> {
    case.set.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The overrides a case runs with: its own, then the levels its points need.
fn case_overrides(case: &Case, file_levels: &[u32], file_requests: u32) -> Vec<String> {
    let mut sets = own_overrides(case);
    let mut levels: Vec<u32> = case.points.iter().filter_map(|p| p.concurrency).collect();
    if case
        .points
        .iter()
        .any(|p| p.metric == "saturation_output_throughput")
    {
        levels.extend_from_slice(file_levels);
    }
    levels.sort_unstable();
    levels.dedup();
    let list: Vec<String> = levels.iter().map(u32::to_string).collect();
    sets.push(format!("benchmark.concurrency=[{}]", list.join(", ")));
    sets.push("benchmark.request_rate=[]".into());
    let requests = match case.requests_per_client {
        Some(per_client) => (per_client * levels.last().copied().unwrap_or(1)).max(8),
        None => file_requests,
    };
    sets.push(format!("benchmark.requests_per_level={requests}"));
    sets
}

fn run_case(dir: &Path, source: &str, case: &Case) -> Result<Vec<PointResult>, SimError> {
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
    // the file's own levels and request count, which a case keeps unless its points say
    let base = experiment(&own_overrides(case))?;
    let exp = experiment(&case_overrides(
        case,
        &base.concurrency,
        base.requests_per_level,
    ))?;
    let mut backend = crate::open::open(&exp)?;
    let levels = run_levels(
        backend.as_mut(),
        &LoadPlan::from_experiment(&exp),
        &mut NoProgress,
    )
    .map_err(|e| SimError::Backend {
        experiment: case.name.clone(),
        source: Box::new(e),
    })?;
    let metrics: Vec<serde_json::Value> = levels
        .iter()
        .map(|l| serde_json::to_value(&l.metrics).unwrap_or_default())
        .collect();
    let mut out = Vec::with_capacity(case.points.len());
    for p in &case.points {
        let predicted = match p.concurrency {
            None => levels
                .iter()
                .map(|l| l.metrics.output_throughput)
                .fold(0.0, f64::max),
            Some(c) => levels
                .iter()
                .zip(&metrics)
                .find(|(l, _)| l.concurrency == c)
                .and_then(|(_, m)| m.get(&p.metric).and_then(|v| v.as_f64()))
                .ok_or_else(|| SimError::Measurements {
                    path: path.clone(),
                    message: format!(
                        "case `{}`: the run has no `{}` at C={c}",
                        case.name, p.metric
                    ),
                })?,
        };
        out.push(PointResult {
            source: source.into(),
            case: case.name.clone(),
            role: case.role,
            engine: case.engine.clone(),
            metric: p.metric.clone(),
            concurrency: p.concurrency,
            measured: p.value,
            predicted,
            error_pct: (predicted - p.value) / p.value * 100.0,
        });
    }
    Ok(out)
}

fn summarize(points: &[PointResult]) -> BTreeMap<String, BTreeMap<String, ErrorStats>> {
    let mut groups: BTreeMap<(String, String), Vec<&PointResult>> = BTreeMap::new();
    for p in points.iter().filter(|p| p.error_pct.is_finite()) {
        groups
            .entry((p.role.name().to_string(), p.metric.clone()))
            .or_default()
            .push(p);
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
