//! Reports side by side: a measurement beside its prediction (`--predict`), and
//! `kbench compare` over any reports. One definition of the error, shared with the
//! reference comparison: (other - base) / base, in percent.

use serde::{Deserialize, Serialize};

use crate::metrics::LevelMetrics;
use crate::report::{level_metric, round_to, Report, SweepReport};

/// The per-level metrics compared, in the order tables show them.
pub const COMPARED: &[&str] = &[
    "output_throughput",
    "per_request_output_throughput",
    "median_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "accept_length",
];

/// `(value - base) / base` in percent, two decimals; None where the base is zero.
pub fn pct(value: f64, base: f64) -> Option<f64> {
    (base != 0.0 && base.is_finite() && value.is_finite())
        .then(|| round_to((value - base) / base * 100.0, 2))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// What predicted it (the simulator's description: profile, trace).
    pub predicted_by: String,
    pub levels: Vec<PredictedLevel>,
}

/// One level's predicted metrics and each one's error against the measurement:
/// (predicted - measured) / measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictedLevel {
    pub concurrency: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_rate: Option<f64>,
    pub metrics: Vec<PredictedMetric>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictedMetric {
    pub metric: String,
    pub measured: Option<f64>,
    pub predicted: Option<f64>,
    pub error_pct: Option<f64>,
}

/// The prediction of each measured level (levels the prediction lacks are left out).
pub fn prediction(measured: &Report, predicted: &Report) -> Prediction {
    let levels = measured
        .levels
        .iter()
        .filter_map(|m| {
            let p = predicted
                .levels
                .iter()
                .find(|p| LevelKey::of(p) == LevelKey::of(m))?;
            Some(PredictedLevel {
                concurrency: m.concurrency,
                request_rate: m.request_rate,
                metrics: COMPARED
                    .iter()
                    .map(|name| {
                        let (mv, pv) = (level_metric(m, name), level_metric(p, name));
                        PredictedMetric {
                            metric: name.to_string(),
                            measured: mv,
                            predicted: pv,
                            error_pct: match (mv, pv) {
                                (Some(mv), Some(pv)) => pct(pv, mv),
                                _ => None,
                            },
                        }
                    })
                    .collect(),
            })
        })
        .collect();
    Prediction {
        predicted_by: predicted.backend.description.clone(),
        levels,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportReadError {
    #[error("not a kbench report (JSON with `levels`, or a sweep with `variants`)")]
    Shape(#[source] serde_json::Error),
    #[error("not a kbench report: no `format_version` (write one with `kbench experiment FILE --json OUT`)")]
    NoVersion,
    #[error("report format {found}; this kbench reads format {expected}")]
    Version { found: u64, expected: u32 },
}

/// The reports in a `--json` file: one, or one per variant of a sweep.
pub fn reports_from_json(text: &str) -> Result<Vec<Report>, ReportReadError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(ReportReadError::Shape)?;
    let Some(found) = value["format_version"].as_u64() else {
        return Err(ReportReadError::NoVersion);
    };
    if found != crate::report::REPORT_FORMAT_VERSION as u64 {
        return Err(ReportReadError::Version {
            found,
            expected: crate::report::REPORT_FORMAT_VERSION,
        });
    }
    if value.get("variants").is_some() {
        let sweep: SweepReport = serde_json::from_value(value).map_err(ReportReadError::Shape)?;
        Ok(sweep.variants)
    } else {
        Ok(vec![
            serde_json::from_value(value).map_err(ReportReadError::Shape)?
        ])
    }
}

/// What makes two reports' levels the same level: the clients, or the request rate (and its
/// cap).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct LevelKey {
    /// Closed-loop levels first, then rate levels by rate.
    pub request_rate: Option<f64>,
    pub concurrency: u32,
}

impl LevelKey {
    pub fn of(m: &LevelMetrics) -> LevelKey {
        LevelKey {
            request_rate: m.request_rate,
            concurrency: m.concurrency,
        }
    }

    pub fn label(&self) -> String {
        match self.request_rate {
            Some(r) if r.is_infinite() => "inf/s".into(),
            Some(r) => format!("{r}/s"),
            None => self.concurrency.to_string(),
        }
    }
}

/// The value of a compared metric at one level of a report.
pub fn metric_at(levels: &[LevelMetrics], key: LevelKey, name: &str) -> Option<f64> {
    levels
        .iter()
        .find(|m| LevelKey::of(m) == key)
        .and_then(|m| level_metric(m, name))
}
