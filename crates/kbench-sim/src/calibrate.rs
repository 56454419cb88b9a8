//! Calibration: fit at most four free parameters of a hardware profile (the terms the op
//! tables do not cover: host costs, a whole-model efficiency factor) to end-to-end
//! measurements, by regularised least squares on log-relative error.
//!
//! Measurement file (TOML, docs/calibration.md):
//!
//! ```toml
//! source = "where the numbers come from"
//! [[free]]                      # at most 4
//! param = "host.spec_round_us"  # a profile key (profile::PARAM_KEYS)
//! min = 0.0                     # physical bounds
//! max = 50000.0
//! prior_weight = 0.05           # pull toward the base profile's value (0: none)
//! [[points]]
//! experiment = "../baseline.toml"   # relative to this file
//! metric = "output_throughput"      # or "saturation_output_throughput"
//! concurrency = 1                   # for output_throughput
//! value = 92.7
//! weight = 1.0
//! label = "baseline, C=1"
//! ```
//!
//! Objective: sum_i w_i ln(pred_i / meas_i)^2 + sum_j lambda_j ((x_j - prior_j) / (max_j - min_j))^2,
//! minimised by bounded Nelder-Mead. The report gives residuals per point and the
//! leave-one-out error (refit without each point, predict it). This module is the only
//! place the seed's numbers enter the simulator, and only to set the profile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::atomic::write_atomic;
use kbench_core::spec::{load_experiment, Experiment};
use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::fit::nelder_mead;
use crate::optable::OpTables;
use crate::predict::{default_acceptance, Prediction};
use crate::presets::load_tables;
use crate::profile::{CalibrationStamp, HardwareProfile, Provenance, PARAM_KEYS};
use crate::sim::SimBackend;

pub const MAX_FREE_PARAMS: usize = 4;
const MAX_EVALS: u32 = 400;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasurementFile {
    pub source: String,
    #[serde(default)]
    pub note: String,
    pub free: Vec<FreeParam>,
    pub points: Vec<MeasuredPoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeParam {
    pub param: String,
    pub min: f64,
    pub max: f64,
    #[serde(default)]
    pub prior_weight: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredPoint {
    pub experiment: String,
    pub metric: String,
    #[serde(default)]
    pub concurrency: Option<u32>,
    pub value: f64,
    #[serde(default = "one")]
    pub weight: f64,
    #[serde(default)]
    pub label: Option<String>,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Serialize)]
pub struct FittedParam {
    pub param: String,
    pub prior: f64,
    pub fitted: f64,
    pub min: f64,
    pub max: f64,
    /// The fitted value sits within 1% of a bound (the data push past what is physical).
    pub at_bound: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PointResidual {
    pub label: String,
    pub measured: f64,
    pub predicted: f64,
    /// predicted / measured - 1.
    pub rel_error: f64,
    /// Predicted by a fit that left this point out.
    pub loo_predicted: f64,
    pub loo_rel_error: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CalibrationReport {
    pub measurements: String,
    pub base_profile: String,
    pub out_profile: String,
    pub params: Vec<FittedParam>,
    pub points: Vec<PointResidual>,
    pub rms_log_error: f64,
    pub max_abs_rel_error: f64,
    pub loo_rms_rel_error: f64,
    pub evaluations: u32,
    pub acceptance: String,
}

impl std::fmt::Display for CalibrationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "calibration of {} to {}",
            self.base_profile, self.measurements
        )?;
        writeln!(f, "  acceptance: {}", self.acceptance)?;
        writeln!(
            f,
            "  {:<34} {:>12} {:>12} {:>20}",
            "parameter", "prior", "fitted", "bounds"
        )?;
        for p in &self.params {
            writeln!(
                f,
                "  {:<34} {:>12.4} {:>12.4} {:>20}{}",
                p.param,
                p.prior,
                p.fitted,
                format!("[{}, {}]", p.min, p.max),
                if p.at_bound { "  AT BOUND" } else { "" }
            )?;
        }
        writeln!(
            f,
            "  {:<34} {:>10} {:>10} {:>8} {:>10} {:>8}",
            "point", "measured", "predicted", "error", "LOO pred", "LOO err"
        )?;
        for p in &self.points {
            writeln!(
                f,
                "  {:<34} {:>10.1} {:>10.1} {:>7.1}% {:>10.1} {:>7.1}%",
                p.label,
                p.measured,
                p.predicted,
                100.0 * p.rel_error,
                p.loo_predicted,
                100.0 * p.loo_rel_error
            )?;
        }
        writeln!(f, "  rms log error {:.4}, max |error| {:.1}%, leave-one-out rms error {:.1}%, {} evaluations",
            self.rms_log_error, 100.0 * self.max_abs_rel_error, 100.0 * self.loo_rms_rel_error, self.evaluations)?;
        write!(f, "  wrote {}", self.out_profile)
    }
}

/// Everything one evaluation needs, loaded once.
struct Problem {
    base: HardwareProfile,
    tables: Option<OpTables>,
    experiments: BTreeMap<PathBuf, (Experiment, Arc<dyn AcceptanceModel>)>,
    points: Vec<(PathBuf, MeasuredPoint)>,
    free: Vec<FreeParam>,
}

impl Problem {
    fn profile_at(&self, x: &[f64]) -> HardwareProfile {
        let mut p = self.base.clone();
        for (fp, v) in self.free.iter().zip(x) {
            if let Some(param) = p.param_mut(&fp.param) {
                param.value = *v;
            }
        }
        p
    }

    /// Predictions for every point at parameters `x`.
    fn predict(&self, x: &[f64]) -> Result<Vec<f64>, SimError> {
        let profile = self.profile_at(x);
        let mut by_exp: BTreeMap<&PathBuf, Prediction> = BTreeMap::new();
        for (path, (exp, acc)) in &self.experiments {
            let tables = self.tables.as_ref().map(OpTables::fresh);
            let mut backend =
                SimBackend::with_profile(exp, profile.clone(), tables, Some(Arc::clone(acc)))?;
            let (_, pred) = crate::predict::run(exp, &mut backend)?;
            by_exp.insert(path, pred);
        }
        self.points
            .iter()
            .map(|(path, pt)| {
                let pred = &by_exp[path];
                metric(pred, pt).ok_or_else(|| {
                    SimError::Calibration(format!(
                        "{}: no level at concurrency {:?}",
                        path.display(),
                        pt.concurrency
                    ))
                })
            })
            .collect()
    }

    fn objective(&self, x: &[f64], skip: Option<usize>) -> f64 {
        // Outside the physical constraints (profile validation) the objective is infinite.
        if self.profile_at(x).validate().is_err() {
            return f64::MAX;
        }
        let Ok(pred) = self.predict(x) else {
            return f64::MAX;
        };
        let mut s = 0.0;
        for (i, ((_, pt), p)) in self.points.iter().zip(&pred).enumerate() {
            if Some(i) == skip {
                continue;
            }
            s += pt.weight * (p.max(1e-9) / pt.value).ln().powi(2);
        }
        for (fp, v) in self.free.iter().zip(x) {
            let prior = self.base.param(&fp.param).map(|p| p.value).unwrap_or(*v);
            s += fp.prior_weight * ((v - prior) / (fp.max - fp.min)).powi(2);
        }
        s
    }

    fn fit(&self, skip: Option<usize>, x0: &[f64]) -> (Vec<f64>, u32) {
        let lo: Vec<f64> = self.free.iter().map(|f| f.min).collect();
        let hi: Vec<f64> = self.free.iter().map(|f| f.max).collect();
        let r = nelder_mead(&mut |x| self.objective(x, skip), x0, &lo, &hi, MAX_EVALS);
        (r.x, r.evaluations)
    }
}

fn metric(pred: &Prediction, pt: &MeasuredPoint) -> Option<f64> {
    match pt.metric.as_str() {
        "saturation_output_throughput" => Some(pred.saturation_output_throughput),
        "output_throughput" => pred.at(pt.concurrency?),
        _ => None,
    }
}

pub fn read_measurements(path: &Path) -> Result<MeasurementFile, SimError> {
    let text = std::fs::read_to_string(path).map_err(|source| SimError::Read {
        what: "measurement file",
        path: path.into(),
        source,
    })?;
    let bad = |message: String| SimError::Measurements {
        path: path.into(),
        message,
    };
    let m: MeasurementFile =
        toml::from_str(&text).map_err(|e| bad(e.to_string().trim().to_string()))?;
    if m.free.is_empty() || m.free.len() > MAX_FREE_PARAMS {
        return Err(bad(format!(
            "{} free parameters; give 1 to {MAX_FREE_PARAMS}",
            m.free.len()
        )));
    }
    for f in &m.free {
        if !PARAM_KEYS.contains(&f.param.as_str()) {
            return Err(bad(format!(
                "unknown parameter `{}` (known: {})",
                f.param,
                PARAM_KEYS.join(", ")
            )));
        }
        if !(f.min.is_finite() && f.max.is_finite() && f.min < f.max) || f.prior_weight < 0.0 {
            return Err(bad(format!(
                "`{}`: need finite min < max and prior_weight >= 0",
                f.param
            )));
        }
    }
    if m.points.len() <= m.free.len() {
        return Err(bad(format!(
            "{} points cannot determine {} parameters (and leave one out)",
            m.points.len(),
            m.free.len()
        )));
    }
    for p in &m.points {
        let ok_metric = match p.metric.as_str() {
            "output_throughput" => p.concurrency.is_some(),
            "saturation_output_throughput" => true,
            _ => false,
        };
        if !ok_metric {
            return Err(bad(format!(
                "point `{}`: metric must be output_throughput (with concurrency) or saturation_output_throughput",
                p.label.clone().unwrap_or_else(|| p.experiment.clone())
            )));
        }
        if !(p.value > 0.0 && p.weight >= 0.0) {
            return Err(bad("every point needs value > 0 and weight >= 0".into()));
        }
    }
    Ok(m)
}

/// `kbench calibrate`: fits, reports, and writes the profile atomically.
pub fn run(
    measurements_path: &Path,
    base_profile_path: &Path,
    out_path: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<CalibrationReport, SimError> {
    run_with(
        measurements_path,
        base_profile_path,
        out_path,
        &default_acceptance,
        progress,
    )
}

/// As [`run`], with the acceptance model per experiment chosen by the caller (e.g. trace replay).
pub fn run_with(
    measurements_path: &Path,
    base_profile_path: &Path,
    out_path: &Path,
    acceptance_for: &dyn Fn(&Experiment) -> Arc<dyn AcceptanceModel>,
    progress: &mut dyn FnMut(&str),
) -> Result<CalibrationReport, SimError> {
    let m = read_measurements(measurements_path)?;
    let base = HardwareProfile::from_file(base_profile_path)?;
    let tables = load_tables(&base)?;
    let dir = measurements_path.parent().unwrap_or(Path::new("."));
    let mut experiments = BTreeMap::new();
    let mut points = Vec::new();
    let mut acceptance = String::new();
    for pt in &m.points {
        let path = dir.join(&pt.experiment);
        if !experiments.contains_key(&path) {
            let exp = load_experiment(&path, &[])
                .map_err(|source| SimError::Experiment {
                    path: path.clone(),
                    source: Box::new(source),
                })?
                .remove(0)
                .experiment;
            let acc = acceptance_for(&exp);
            if exp.spec.is_speculative() && acceptance.is_empty() {
                acceptance = acc.describe();
            }
            experiments.insert(path.clone(), (exp, acc));
        }
        points.push((path, pt.clone()));
    }
    let problem = Problem {
        base: base.clone(),
        tables,
        experiments,
        points,
        free: m.free.clone(),
    };
    let x0: Vec<f64> = m
        .free
        .iter()
        .map(|f| {
            base.param(&f.param)
                .map(|p| p.value)
                .unwrap_or(f.min)
                .clamp(f.min, f.max)
        })
        .collect();
    progress("fitting all points");
    let (x, mut evals) = problem.fit(None, &x0);
    let pred = problem.predict(&x)?;
    let mut loo = Vec::new();
    for i in 0..problem.points.len() {
        progress(&format!("leave-one-out {}/{}", i + 1, problem.points.len()));
        let (xi, e) = problem.fit(Some(i), &x);
        evals += e;
        loo.push(problem.predict(&xi)?[i]);
    }
    let residuals: Vec<PointResidual> = problem
        .points
        .iter()
        .zip(pred.iter().zip(&loo))
        .map(|((_, pt), (p, l))| PointResidual {
            label: pt
                .label
                .clone()
                .unwrap_or_else(|| format!("{} {}", pt.experiment, pt.metric)),
            measured: pt.value,
            predicted: *p,
            rel_error: p / pt.value - 1.0,
            loo_predicted: *l,
            loo_rel_error: l / pt.value - 1.0,
        })
        .collect();
    let n = residuals.len() as f64;
    let rms_log_error = (residuals
        .iter()
        .map(|r| (r.predicted / r.measured).ln().powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    let max_abs_rel_error = residuals
        .iter()
        .map(|r| r.rel_error.abs())
        .fold(0.0, f64::max);
    let loo_rms_rel_error = (residuals
        .iter()
        .map(|r| r.loo_rel_error.powi(2))
        .sum::<f64>()
        / n)
        .sqrt();

    let mut out = base.clone();
    let params: Vec<FittedParam> = m
        .free
        .iter()
        .zip(&x)
        .map(|(f, v)| {
            let prior = base.param(&f.param).map(|p| p.value).unwrap_or(*v);
            if let Some(p) = out.param_mut(&f.param) {
                p.value = round_sig(*v);
                p.source = Provenance::Fitted;
                p.reference = format!(
                    "fitted by kbench calibrate to {} (prior {prior}, bounds [{}, {}])",
                    measurements_path.display(),
                    f.min,
                    f.max
                );
            }
            let span = f.max - f.min;
            FittedParam {
                param: f.param.clone(),
                prior,
                fitted: *v,
                min: f.min,
                max: f.max,
                at_bound: (v - f.min).abs() < 0.01 * span || (f.max - v).abs() < 0.01 * span,
            }
        })
        .collect();
    out.calibration = Some(CalibrationStamp {
        measurements: measurements_path.display().to_string(),
        base_profile: base_profile_path.display().to_string(),
        method: format!(
            "bounded Nelder-Mead on sum w*ln(pred/meas)^2 + prior terms; {} free parameters, {} points; acceptance: {}",
            params.len(), residuals.len(), acceptance
        ),
        rms_log_error,
        max_abs_rel_error,
        loo_rms_rel_error,
    });
    out.validate()?;
    let header = format!(
        "# Hardware profile written by `kbench calibrate` from {} (do not edit by hand;\n# edit the base profile or the measurement file and rerun, see docs/calibration.md).\n",
        base_profile_path.display()
    );
    write_profile(&out, out_path, &header)?;
    Ok(CalibrationReport {
        measurements: measurements_path.display().to_string(),
        base_profile: base_profile_path.display().to_string(),
        out_profile: out_path.display().to_string(),
        params,
        points: residuals,
        rms_log_error,
        max_abs_rel_error,
        loo_rms_rel_error,
        evaluations: evals,
        acceptance,
    })
}

pub(crate) fn round_sig(v: f64) -> f64 {
    if v == 0.0 {
        return 0.0;
    }
    let mag = 10f64.powi(5 - v.abs().log10().ceil() as i32);
    (v * mag).round() / mag
}

/// Writes to a temporary file next to `out` and renames it over `out` (atomic on one
/// filesystem: a reader never sees half a profile).
pub(crate) fn write_profile(
    profile: &HardwareProfile,
    out: &Path,
    header: &str,
) -> Result<(), SimError> {
    let body = profile.to_toml_string()?;
    let text = format!("{header}{body}");
    write_atomic(out, text.as_bytes()).map_err(|source| SimError::Write {
        path: out.into(),
        source,
    })
}
