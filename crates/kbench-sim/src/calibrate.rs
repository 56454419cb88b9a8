//! Calibration: fit each engine profile's free parameters (at most four, declared in the
//! profile's `[[free]]` with a prior and physical bounds) to every `fit` point of the chosen
//! corpus sources at once, by regularised least squares on log-relative error:
//!
//! J(x) = sum_i w_i ln(pred_i / meas_i)^2 + sum_j lambda_j ((x_j - prior_j) / (max_j - min_j))^2
//!
//! with w_i = N / (S n_s) (N points from S sources, n_s of them from point i's source: each
//! source weighs the same, and one source gives w = 1), minimised by bounded Nelder-Mead
//! from the priors. The held-apart error refits without each source and predicts it (with one
//! source, without each point). Hardware profiles, op tables and datasheets stay fixed;
//! `check` points are never read here. Format and method: docs/calibration.md.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::atomic::write_atomic;
use kbench_core::experiment::Experiment;
use serde::Serialize;

use crate::corpus::{Case, LoadedCorpus, Role, SPEEDUP};
use crate::engine_profile::{EngineCalibration, EngineProfile, FreeParam};
use crate::error::SimError;
use crate::fidelity::{case_experiment, predict_points};
use crate::fit::{nelder_mead, FitResult};
use crate::optable::OpTables;
use crate::presets::{load_tables, resolve_engine_profile, resolve_profile};
use crate::profile::{HardwareProfile, Provenance};
use crate::sim::SimBackend;

const MAX_EVALS: u32 = 500;
/// Above this many points from one source, leaving each out in turn costs more refits
/// than a calibration should; the source's `check` points are its held-apart error then.
pub const MAX_LEAVE_ONE_POINT_OUT: usize = 12;

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
    pub source: String,
    pub case: String,
    pub metric: String,
    pub concurrency: Option<u32>,
    pub measured: f64,
    pub predicted: f64,
    /// predicted / measured - 1.
    pub rel_error: f64,
    /// Predicted by a fit that left this point's source (one source: the point) out.
    pub held_out_predicted: Option<f64>,
    pub held_out_rel_error: Option<f64>,
}

/// One engine profile fitted.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileFit {
    pub profile: String,
    pub origin: String,
    pub sources: Vec<String>,
    /// Distinct configurations simulated per evaluation (cases that repeat a configuration
    /// share its run).
    pub configurations: usize,
    pub params: Vec<FittedParam>,
    pub points: Vec<PointResidual>,
    pub rms_log_error: f64,
    pub max_abs_rel_error: f64,
    /// `leave-one-source-out`, `leave-one-point-out`, or why neither was run.
    pub held_out: String,
    pub held_out_rms_rel_error: Option<f64>,
    pub evaluations: u32,
    /// Where the fitted profile was written.
    pub written: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CalibrationReport {
    pub fits: Vec<ProfileFit>,
    /// Profiles with `fit` points but no `[[free]]`: nothing to fit.
    pub not_fitted: Vec<String>,
}

/// A `fit` case, loaded once: what one evaluation needs to predict its points.
struct FitCase {
    source: String,
    case: Case,
    exp: Experiment,
    hardware: HardwareProfile,
    /// The template each run takes a fresh copy of (behind a lock only so the problem can
    /// be shared by the threads; only the main thread touches it).
    tables: std::sync::Mutex<Option<OpTables>>,
    acceptance: Option<Arc<dyn AcceptanceModel>>,
    /// Index of the configuration whose run gives this case's predictions.
    config: usize,
}

/// A configuration's index and its points' predictions.
type ConfigRun = (usize, Result<Vec<f64>, SimError>);

/// One engine profile and the fit cases that run on it.
struct Problem {
    base: EngineProfile,
    cases: Vec<FitCase>,
    /// For each distinct configuration, the first case that has it.
    configs: Vec<usize>,
    free: Vec<FreeParam>,
}

impl Problem {
    fn profile_at(&self, x: &[f64]) -> EngineProfile {
        let mut p = self.base.clone();
        for (fp, v) in self.free.iter().zip(x) {
            if let Some(param) = p.param_mut(&fp.param) {
                param.value = *v;
            }
        }
        p
    }

    /// Predictions per case at parameters `x`; the distinct configurations run in parallel
    /// (each its own simulator), collected in order, so the result does not depend on the
    /// number of threads.
    fn predict(&self, x: &[f64]) -> Result<Vec<Vec<f64>>, SimError> {
        let engine = self.profile_at(x);
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(self.configs.len())
            .max(1);
        let jobs: Vec<(usize, Option<OpTables>)> = self
            .configs
            .iter()
            .map(|&i| {
                let template = self.cases[i]
                    .tables
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                (i, template.as_ref().map(OpTables::fresh))
            })
            .collect();
        // each thread takes the next configuration when it is free: their run times differ
        // several-fold (8k-token outputs against 1k), so a fixed split leaves a core idle
        let queue = std::sync::Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
        let queue = &queue;
        let engine = &engine;
        let results: Vec<Vec<ConfigRun>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(move || {
                        let mut done = Vec::new();
                        loop {
                            let next = queue
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .pop();
                            let Some((k, (i, tables))) = next else {
                                break;
                            };
                            done.push((k, self.run_case(i, engine, tables)));
                        }
                        done
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        vec![(
                            usize::MAX,
                            Err(SimError::Calibration("a simulation thread panicked".into())),
                        )]
                    })
                })
                .collect()
        });
        let mut by_config: Vec<Option<Vec<f64>>> = vec![None; self.configs.len()];
        for (k, r) in results.into_iter().flatten() {
            let r = r?;
            if let Some(slot) = by_config.get_mut(k) {
                *slot = Some(r);
            }
        }
        self.cases
            .iter()
            .map(|c| {
                by_config[c.config]
                    .clone()
                    .ok_or_else(|| SimError::Calibration("a configuration did not run".into()))
            })
            .collect()
    }

    fn run_case(
        &self,
        i: usize,
        engine: &EngineProfile,
        tables: Option<OpTables>,
    ) -> Result<Vec<f64>, SimError> {
        let c = &self.cases[i];
        let mut backend = SimBackend::with_profiles(
            &c.exp,
            c.hardware.clone(),
            engine.clone(),
            tables,
            c.acceptance.clone(),
        )?;
        predict_points(&c.exp, &c.case, &mut backend, true)
    }

    /// Point weights: every source weighs the same, whatever its number of points.
    fn weights(&self, keep: &dyn Fn(usize, usize) -> bool) -> Vec<Vec<f64>> {
        let mut per_source: BTreeMap<&str, usize> = BTreeMap::new();
        for (ci, c) in self.cases.iter().enumerate() {
            for pi in 0..c.case.points.len() {
                if keep(ci, pi) {
                    *per_source.entry(c.source.as_str()).or_default() += 1;
                }
            }
        }
        let total: usize = per_source.values().sum();
        let sources = per_source.len().max(1);
        self.cases
            .iter()
            .enumerate()
            .map(|(ci, c)| {
                (0..c.case.points.len())
                    .map(|pi| {
                        if keep(ci, pi) {
                            total as f64 / (sources * per_source[c.source.as_str()]) as f64
                        } else {
                            0.0
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn objective(&self, x: &[f64], weights: &[Vec<f64>]) -> f64 {
        // Outside the physical constraints (profile validation) the objective is infinite.
        if self.profile_at(x).validate().is_err() {
            return f64::MAX;
        }
        let Ok(pred) = self.predict(x) else {
            return f64::MAX;
        };
        let mut s = 0.0;
        for ((c, p), w) in self.cases.iter().zip(&pred).zip(weights) {
            for ((pt, v), w) in c.case.points.iter().zip(p).zip(w) {
                s += w * (v.max(1e-9) / pt.value).ln().powi(2);
            }
        }
        for (fp, v) in self.free.iter().zip(x) {
            s += fp.prior_weight * ((v - fp.prior) / (fp.max - fp.min)).powi(2);
        }
        s
    }

    fn fit(
        &self,
        weights: &[Vec<f64>],
        x0: &[f64],
        progress: &mut dyn FnMut(&str),
        what: &str,
    ) -> FitResult {
        let lo: Vec<f64> = self.free.iter().map(|f| f.min).collect();
        let hi: Vec<f64> = self.free.iter().map(|f| f.max).collect();
        let mut n = 0u32;
        let r = nelder_mead(
            &mut |x| {
                n += 1;
                if n % 50 == 0 {
                    progress(&format!("  {what}: {n} evaluations"));
                }
                self.objective(x, weights)
            },
            x0,
            &lo,
            &hi,
            MAX_EVALS,
        );
        r
    }
}

/// Loads every `fit` case of `corpora` and groups them by the engine profile they resolve
/// to (profiles named in `only`, when given).
fn problems(corpora: &[LoadedCorpus], only: &[String]) -> Result<Vec<Problem>, SimError> {
    let mut groups: BTreeMap<String, Problem> = BTreeMap::new();
    let mut config_keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for corpus in corpora {
        let dir = corpus.path.parent().unwrap_or(Path::new("."));
        for case in corpus.file.cases.iter().filter(|c| c.role == Role::Fit) {
            // a speedup is the ratio of two runs' throughputs, which the fit already has
            // as points where the source gives them; it is reported, not fitted
            let case = &Case {
                points: case
                    .points
                    .iter()
                    .filter(|p| p.metric != SPEEDUP)
                    .cloned()
                    .collect(),
                ..case.clone()
            };
            if case.points.is_empty() {
                continue;
            }
            let exp = case_experiment(dir, case)?;
            let hardware = resolve_profile(&exp.hardware)?;
            let engine = resolve_engine_profile(&exp, &hardware)?;
            if !only.is_empty() && !only.contains(&engine.name) {
                continue;
            }
            let tables = load_tables(&hardware)?;
            let acceptance = crate::open::acceptance_for(&exp)?;
            // Cases that differ only in their measurements share one run per evaluation.
            let key = format!(
                "{}\n{}\n{}",
                exp.path.display(),
                serde_json::to_string(&exp.file).unwrap_or_default(),
                hardware.name
            );
            let keys = config_keys.entry(engine.name.clone()).or_default();
            let group = groups
                .entry(engine.name.clone())
                .or_insert_with(|| Problem {
                    free: engine.free.clone(),
                    base: engine.clone(),
                    cases: Vec::new(),
                    configs: Vec::new(),
                });
            if group.base.origin != engine.origin {
                return Err(SimError::Calibration(format!(
                    "two engine profiles are named `{}` ({} and {}): give them distinct names",
                    engine.name, group.base.origin, engine.origin
                )));
            }
            let config = match keys.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    keys.push(key);
                    group.configs.push(group.cases.len());
                    keys.len() - 1
                }
            };
            group.cases.push(FitCase {
                source: corpus.file.source.name.clone(),
                case: case.clone(),
                exp,
                hardware,
                tables: std::sync::Mutex::new(tables),
                acceptance,
                config,
            });
        }
    }
    Ok(groups.into_values().collect())
}

/// `kbench calibrate`: fits every engine profile the `fit` cases of `corpora` run on (or
/// those named in `only`), reports, and writes each fitted profile to `out_dir` as
/// `<name>.toml` (atomically) when given.
pub fn run(
    corpora: &[LoadedCorpus],
    only: &[String],
    out_dir: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<CalibrationReport, SimError> {
    let all = problems(corpora, only)?;
    if all.is_empty() {
        return Err(SimError::Calibration(if only.is_empty() {
            "the corpus files given have no `fit` cases".into()
        } else {
            format!(
                "no `fit` case of the corpus files given runs on {}",
                only.join(", ")
            )
        }));
    }
    let mut report = CalibrationReport {
        fits: Vec::new(),
        not_fitted: Vec::new(),
    };
    for problem in all {
        let n_points: usize = problem.cases.iter().map(|c| c.case.points.len()).sum();
        if problem.free.is_empty() {
            report.not_fitted.push(format!(
                "{} ({}): {n_points} fit points, but the profile declares no [[free]] parameters",
                problem.base.name, problem.base.origin
            ));
            continue;
        }
        report
            .fits
            .push(fit_profile(&problem, n_points, out_dir, progress)?);
    }
    Ok(report)
}

fn fit_profile(
    problem: &Problem,
    n_points: usize,
    out_dir: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<ProfileFit, SimError> {
    let name = &problem.base.name;
    let sources: Vec<String> = problem
        .cases
        .iter()
        .map(|c| c.source.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if n_points <= problem.free.len() {
        return Err(SimError::Calibration(format!(
            "`{name}`: {n_points} fit points cannot determine {} parameters",
            problem.free.len()
        )));
    }
    // The same configuration measured again at the same level adds weight, not information:
    // a term needs a measurement of its own.
    let independent = problem
        .cases
        .iter()
        .flat_map(|c| {
            c.case
                .points
                .iter()
                .map(move |p| (c.config, p.metric.as_str(), p.concurrency))
        })
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if independent <= problem.free.len() {
        return Err(SimError::Calibration(format!(
            "`{name}`: its {n_points} fit points are {independent} independent measurements ({} configuration(s); a configuration measured again at the same level and metric counts once), too few for {} free parameters: add fit cases that differ, or free fewer terms",
            problem.configs.len(),
            problem.free.len()
        )));
    }
    progress(&format!(
        "fitting `{name}`: {} parameters to {n_points} points from {} ({} configurations)",
        problem.free.len(),
        sources.join(", "),
        problem.configs.len()
    ));
    let x0: Vec<f64> = problem.free.iter().map(|f| f.prior).collect();
    let all = problem.weights(&|_, _| true);
    let mut best = problem.fit(&all, &x0, progress, "all points");
    let mut evaluations = best.evaluations;
    // Nelder-Mead finds a local minimum: a second start from the profile's current values
    // (an earlier fit) keeps a model change from dropping the fit into a worse one
    let current: Vec<f64> = problem
        .free
        .iter()
        .map(|f| {
            problem
                .base
                .param(&f.param)
                .map_or(f.prior, |p| p.value)
                .clamp(f.min, f.max)
        })
        .collect();
    if current != x0 {
        let from_current = problem.fit(
            &all,
            &current,
            progress,
            "all points, from the current values",
        );
        evaluations += from_current.evaluations;
        if from_current.value < best.value {
            best = from_current;
        }
    }
    let x = best.x;
    let pred = problem.predict(&x)?;

    // Held apart: each source (or, with one source, each point) refitted without, then
    // predicted, starting from the full fit.
    let mut held: Vec<Vec<Option<f64>>> = problem
        .cases
        .iter()
        .map(|c| vec![None; c.case.points.len()])
        .collect();
    let held_out = if sources.len() >= 2 {
        for (k, s) in sources.iter().enumerate() {
            let w = problem.weights(&|ci, _| problem.cases[ci].source != *s);
            let what = format!("leave out {s} ({}/{})", k + 1, sources.len());
            progress(&format!("  {what}"));
            let FitResult {
                x: xs,
                evaluations: e,
                ..
            } = problem.fit(&w, &x, progress, &what);
            evaluations += e;
            let p = problem.predict(&xs)?;
            for (ci, c) in problem.cases.iter().enumerate() {
                if c.source == *s {
                    held[ci] = p[ci].iter().map(|v| Some(*v)).collect();
                }
            }
        }
        "leave-one-source-out".to_string()
    } else if n_points <= MAX_LEAVE_ONE_POINT_OUT {
        let every: Vec<(usize, usize)> = held
            .iter()
            .enumerate()
            .flat_map(|(ci, points)| (0..points.len()).map(move |pi| (ci, pi)))
            .collect();
        for (k, &(ci, pi)) in every.iter().enumerate() {
            let w = problem.weights(&|cj, pj| (cj, pj) != (ci, pi));
            let what = format!("leave-one-out {}/{n_points}", k + 1);
            progress(&format!("  {what}"));
            let FitResult {
                x: xi,
                evaluations: e,
                ..
            } = problem.fit(&w, &x, progress, &what);
            evaluations += e;
            held[ci][pi] = Some(problem.predict(&xi)?[ci][pi]);
        }
        "leave-one-point-out (one source)".to_string()
    } else {
        format!(
            "none: one source with {n_points} fit points (more than {MAX_LEAVE_ONE_POINT_OUT} refits); its `check` points are the held-apart error (kbench fidelity)"
        )
    };

    let mut points = Vec::new();
    for ((c, p), h) in problem.cases.iter().zip(&pred).zip(&held) {
        for ((pt, v), h) in c.case.points.iter().zip(p).zip(h) {
            points.push(PointResidual {
                source: c.source.clone(),
                case: c.case.name.clone(),
                metric: pt.metric.clone(),
                concurrency: pt.concurrency,
                measured: pt.value,
                predicted: *v,
                rel_error: v / pt.value - 1.0,
                held_out_predicted: *h,
                held_out_rel_error: h.map(|h| h / pt.value - 1.0),
            });
        }
    }
    let n = points.len() as f64;
    let rms_log_error = (points
        .iter()
        .map(|r| (r.predicted / r.measured).ln().powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    let max_abs_rel_error = points.iter().map(|r| r.rel_error.abs()).fold(0.0, f64::max);
    let held_errors: Vec<f64> = points.iter().filter_map(|r| r.held_out_rel_error).collect();
    let held_out_rms_rel_error = (!held_errors.is_empty()).then(|| {
        (held_errors.iter().map(|e| e * e).sum::<f64>() / held_errors.len() as f64).sqrt()
    });

    let mut out = problem.base.clone();
    let params: Vec<FittedParam> = problem
        .free
        .iter()
        .zip(&x)
        .map(|(f, v)| {
            if let Some(p) = out.param_mut(&f.param) {
                p.value = round_sig(*v);
                p.source = Provenance::Fitted;
                let generated = format!(
                    "{FITTED_PREFIX}{} (prior {}, bounds [{}, {}])",
                    sources.join(", "),
                    f.prior,
                    f.min,
                    f.max
                );
                p.reference = refit_reference(&p.reference, generated);
            }
            let span = f.max - f.min;
            FittedParam {
                param: f.param.clone(),
                prior: f.prior,
                fitted: *v,
                min: f.min,
                max: f.max,
                at_bound: (v - f.min).abs() < 0.01 * span || (f.max - v).abs() < 0.01 * span,
            }
        })
        .collect();
    out.calibration = Some(EngineCalibration {
        sources: sources.clone(),
        fit_points: points.len(),
        method: format!(
            "bounded Nelder-Mead from the priors and from the profile's current values (the lower kept) on sum w*ln(pred/meas)^2 + prior terms, each source weighted equally; {} free parameters, {} points, {} configurations",
            params.len(),
            points.len(),
            problem.configs.len()
        ),
        rms_log_error,
        max_abs_rel_error,
        held_out: held_out.clone(),
        held_out_rms_rel_error: held_out_rms_rel_error.unwrap_or(0.0),
    });
    out.validate()?;
    let written = match out_dir {
        Some(dir) => {
            let path = dir.join(format!("{name}.toml"));
            write_profile(&out, &path)?;
            Some(path.display().to_string())
        }
        None => None,
    };
    Ok(ProfileFit {
        profile: name.clone(),
        origin: problem.base.origin.clone(),
        sources,
        configurations: problem.configs.len(),
        params,
        points,
        rms_log_error,
        max_abs_rel_error,
        held_out,
        held_out_rms_rel_error,
        evaluations,
        written,
    })
}

pub(crate) fn round_sig(v: f64) -> f64 {
    if v == 0.0 {
        return 0.0;
    }
    let mag = 10f64.powi(5 - v.abs().log10().ceil() as i32);
    (v * mag).round() / mag
}

/// A refitted term's reference: the generated clause, then whatever a person wrote after the
/// previous fit's generated clause (the mechanism the term stands for, its evidence), so a
/// refit keeps the provenance it was given. A term fitted for the first time takes the
/// generated clause alone: its prior's reference describes the prior.
fn refit_reference(previous: &str, generated: String) -> String {
    const CLAUSE_END: &str = "]); ";
    let note = previous
        .strip_prefix(FITTED_PREFIX)
        .and_then(|rest| rest.find(CLAUSE_END).map(|i| &rest[i + CLAUSE_END.len()..]))
        .filter(|note| !note.trim().is_empty());
    match note {
        Some(note) => format!("{generated}; {note}"),
        None => generated,
    }
}

const FITTED_PREFIX: &str = "fitted by kbench calibrate to ";

/// Writes to a temporary file next to `out` and renames it over `out` (atomic on one
/// filesystem: a reader never sees half a profile).
fn write_profile(profile: &EngineProfile, out: &Path) -> Result<(), SimError> {
    let header = "# Engine profile written by `kbench calibrate` (docs/calibration.md). Fitted values are\n# marked `fitted`; their priors and bounds are in [[free]]. Rerun calibrate rather than\n# editing a fitted value by hand.\n";
    let text = format!("{header}{}", profile.to_toml_string()?);
    write_atomic(out, text.as_bytes()).map_err(|source| SimError::Write {
        path: PathBuf::from(out),
        source,
    })
}

impl std::fmt::Display for CalibrationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for fit in &self.fits {
            write!(f, "{fit}")?;
        }
        for n in &self.not_fitted {
            writeln!(f, "not fitted: {n}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for ProfileFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "== calibration of engine profile `{}` to {}",
            self.profile,
            self.sources.join(", ")
        )?;
        writeln!(
            f,
            "   {:<34} {:>12} {:>12} {:>20}",
            "parameter", "prior", "fitted", "bounds"
        )?;
        for p in &self.params {
            writeln!(
                f,
                "   {:<34} {:>12.4} {:>12.4} {:>20}{}",
                p.param,
                p.prior,
                p.fitted,
                format!("[{}, {}]", p.min, p.max),
                if p.at_bound { "  AT BOUND" } else { "" }
            )?;
        }
        writeln!(
            f,
            "   {:<48} {:>28} {:>4} {:>10} {:>10} {:>8} {:>10} {:>8}",
            "source/case", "metric", "C", "measured", "predicted", "error", "held out", "error"
        )?;
        for p in &self.points {
            let c = p
                .concurrency
                .map(|c| c.to_string())
                .unwrap_or_else(|| "sat".into());
            let (h, he) = match (p.held_out_predicted, p.held_out_rel_error) {
                (Some(h), Some(e)) => (format!("{h:.2}"), format!("{:+.1}%", 100.0 * e)),
                _ => ("-".into(), "-".into()),
            };
            writeln!(
                f,
                "   {:<48} {:>28} {:>4} {:>10.2} {:>10.2} {:>+7.1}% {:>10} {:>8}",
                format!("{}/{}", p.source, p.case),
                p.metric,
                c,
                p.measured,
                p.predicted,
                100.0 * p.rel_error,
                h,
                he
            )?;
        }
        writeln!(
            f,
            "   rms log error {:.4}, max |error| {:.1}%, {} evaluations",
            self.rms_log_error,
            100.0 * self.max_abs_rel_error,
            self.evaluations
        )?;
        match self.held_out_rms_rel_error {
            Some(e) => writeln!(f, "   {}: rms error {:.1}%", self.held_out, 100.0 * e)?,
            None => writeln!(f, "   held apart: {}", self.held_out)?,
        }
        match &self.written {
            Some(w) => writeln!(f, "   wrote {w}"),
            None => writeln!(
                f,
                "   not written (give --out-dir to write the fitted profile)"
            ),
        }
    }
}

#[cfg(test)]
mod refit_reference_tests {
    use super::refit_reference;

    #[test]
    fn a_refit_keeps_what_was_written_after_the_generated_clause() {
        let previous = "fitted by kbench calibrate to old-source (prior 1, bounds [0.5, 2]); Marlin's MoE at decode";
        let generated =
            "fitted by kbench calibrate to new-source (prior 1, bounds [0.5, 3])".to_string();
        assert_eq!(
            refit_reference(previous, generated),
            "fitted by kbench calibrate to new-source (prior 1, bounds [0.5, 3]); Marlin's MoE at decode"
        );
    }

    #[test]
    fn a_first_fit_or_a_bare_clause_takes_the_generated_clause_alone() {
        let generated = || "fitted by kbench calibrate to s (prior 1, bounds [0, 2])".to_string();
        assert_eq!(
            refit_reference("PyTorch eager dispatch per operator", generated()),
            generated()
        );
        assert_eq!(
            refit_reference(
                "fitted by kbench calibrate to s (prior 1, bounds [0, 2])",
                generated()
            ),
            generated()
        );
    }
}
