//! What a search maximises, where, and the SLOs a candidate must meet there.

use std::fmt;

use kbench_core::metrics::LevelMetrics;
use serde::Serialize;

/// Where the objective is read from a candidate's report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum At {
    /// The best level that meets every SLO (for output throughput: saturation).
    Saturation,
    /// The closed-loop level with this many clients.
    Concurrency(u32),
    /// The open-loop level at this many requests per second.
    RequestRate(f64),
}

impl At {
    /// `saturation`, a number of clients, or `rate=R` (requests per second).
    pub fn parse(text: &str) -> Result<At, String> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("saturation") {
            return Ok(At::Saturation);
        }
        if let Some(r) = t.strip_prefix("rate=").or_else(|| t.strip_prefix("rate:")) {
            return match r.trim().parse::<f64>() {
                Ok(v) if v > 0.0 && !v.is_nan() => Ok(At::RequestRate(v)),
                _ => Err(format!(
                    "`{t}`: a request rate is a positive number of requests per second (or inf)"
                )),
            };
        }
        match t.parse::<u32>() {
            Ok(c) if c >= 1 => Ok(At::Concurrency(c)),
            _ => Err(format!(
                "`{t}`: use `saturation`, a concurrency (e.g. 64) or `rate=R` (requests per second)"
            )),
        }
    }

    pub fn matches(&self, m: &LevelMetrics) -> bool {
        match *self {
            At::Saturation => true,
            At::Concurrency(c) => m.request_rate.is_none() && m.concurrency == c,
            At::RequestRate(r) => m.request_rate == Some(r),
        }
    }
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Saturation => write!(f, "saturation"),
            At::Concurrency(c) => write!(f, "concurrency {c}"),
            At::RequestRate(r) if r.is_infinite() => write!(f, "request rate inf"),
            At::RequestRate(r) => write!(f, "request rate {r}/s"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Objective {
    /// A report metric (`output_throughput`, `per_request_output_throughput`, ...).
    pub metric: String,
    pub at: At,
}

impl Objective {
    pub fn lower_is_better(&self) -> bool {
        lower_is_better(&self.metric)
    }

    /// Whether `a` is a better objective value than `b`.
    pub fn better(&self, a: f64, b: f64) -> bool {
        if self.lower_is_better() {
            a < b
        } else {
            a > b
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.lower_is_better() {
            "minimise"
        } else {
            "maximise"
        };
        write!(f, "{verb} {} at {}", self.metric, self.at)
    }
}

/// Latencies, failures and retractions are better low; throughputs and accept length high.
pub fn lower_is_better(metric: &str) -> bool {
    metric.ends_with("_ms")
        || matches!(
            metric,
            "failed" | "num_retractions" | "duration_s" | "peak_kv_cache_usage"
        )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Comparison {
    #[serde(rename = "<=")]
    AtMost,
    #[serde(rename = "<")]
    Below,
    #[serde(rename = ">=")]
    AtLeast,
    #[serde(rename = ">")]
    Above,
}

impl Comparison {
    fn symbol(self) -> &'static str {
        match self {
            Comparison::AtMost => "<=",
            Comparison::Below => "<",
            Comparison::AtLeast => ">=",
            Comparison::Above => ">",
        }
    }
}

/// `metric <= value` (or `<`, `>=`, `>`) on a level's report metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slo {
    pub metric: String,
    pub comparison: Comparison,
    pub bound: f64,
}

impl Slo {
    /// `p99_tpot_ms <= 50`; the metric is checked against [`metric_names`] by the caller.
    pub fn parse(text: &str) -> Result<Slo, String> {
        let t = text.trim();
        // two-character operators first, so `<=` is not read as `<` then `=50`
        for (symbol, comparison) in [
            ("<=", Comparison::AtMost),
            (">=", Comparison::AtLeast),
            ("<", Comparison::Below),
            (">", Comparison::Above),
        ] {
            if let Some((metric, bound)) = t.split_once(symbol) {
                let metric = metric.trim();
                let bound = bound.trim();
                if metric.is_empty() {
                    break;
                }
                return match bound.parse::<f64>() {
                    Ok(b) if b.is_finite() => Ok(Slo {
                        metric: metric.to_string(),
                        comparison,
                        bound: b,
                    }),
                    _ => Err(format!("`{t}`: the bound `{bound}` is not a finite number")),
                };
            }
        }
        Err(format!(
            "`{t}`: an SLO is METRIC <= VALUE (or <, >=, >), e.g. \"p99_tpot_ms <= 50\""
        ))
    }

    /// Met where the level has the metric and it is within the bound.
    pub fn met(&self, m: &LevelMetrics) -> bool {
        metric_value(m, &self.metric).is_some_and(|v| self.met_by(v))
    }

    pub fn met_by(&self, v: f64) -> bool {
        match self.comparison {
            Comparison::AtMost => v <= self.bound,
            Comparison::Below => v < self.bound,
            Comparison::AtLeast => v >= self.bound,
            Comparison::Above => v > self.bound,
        }
    }

    /// Whether every value this SLO admits, `other` admits too.
    pub fn at_least_as_tight_as(&self, other: &Slo) -> bool {
        if self.metric != other.metric {
            return false;
        }
        let upper = |c| matches!(c, Comparison::AtMost | Comparison::Below);
        match (upper(self.comparison), upper(other.comparison)) {
            (true, true) => {
                self.bound < other.bound
                    || (self.bound == other.bound
                        && (self.comparison == other.comparison
                            || self.comparison == Comparison::Below))
            }
            (false, false) => {
                self.bound > other.bound
                    || (self.bound == other.bound
                        && (self.comparison == other.comparison
                            || self.comparison == Comparison::Above))
            }
            _ => false,
        }
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.metric,
            self.comparison.symbol(),
            self.bound
        )
    }
}

/// Every metric a level reports a number for, by the name the JSON report uses.
pub fn metric_names() -> Vec<String> {
    let empty = kbench_core::metrics::level_metrics(1, &[]);
    let mut names: Vec<String> = match serde_json::to_value(&empty) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .filter(|(_, v)| v.is_number() || v.is_null())
            .map(|(k, _)| k)
            .collect(),
        _ => Vec::new(),
    };
    // the optional ones an empty level leaves out
    for extra in [
        "mean_queue_delay_ms",
        "median_queue_delay_ms",
        "p99_queue_delay_ms",
        "num_retractions",
        "kv_cache_tokens",
        "peak_kv_cache_usage",
        "requested_output_tokens",
        "max_concurrent_requests",
        "request_rate",
        "failed",
    ] {
        if !names.iter().any(|n| n == extra) {
            names.push(extra.to_string());
        }
    }
    names.sort();
    names
}

/// A level's metric by its report name; None where the level has no value for it.
pub fn metric_value(m: &LevelMetrics, metric: &str) -> Option<f64> {
    // the ones reference points name, without a trip through JSON
    if let Some(v) = kbench_core::report::level_metric(m, metric) {
        return Some(v);
    }
    if metric == "accept_length" {
        return None;
    }
    match serde_json::to_value(m) {
        Ok(serde_json::Value::Object(map)) => map.get(metric).and_then(|v| v.as_f64()),
        _ => None,
    }
}

/// The known metric nearest to an unknown one, if any is near.
pub fn suggest_metric(unknown: &str) -> Option<String> {
    metric_names()
        .into_iter()
        .map(|n| (strsim::jaro_winkler(unknown, &n), n))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, n)| n)
}
