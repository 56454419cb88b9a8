//! The report: one structure behind the terminal table, JSON, CSV and plots. Key names
//! follow `vllm bench serve` / `sglang.bench_serving` (docs/report.md). Field order is the
//! declaration order, so the JSON is byte-stable.

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, CudaGraphBound};
use crate::experiment::{Experiment, HardwareRef, ReferencePoint};
use crate::harness::LevelResult;
use crate::metrics::LevelMetrics;

pub const REPORT_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub format_version: u32,
    pub experiment: ExperimentSummary,
    pub backend: BackendSummary,
    pub levels: Vec<LevelMetrics>,
    pub saturation_output_throughput: f64,
    pub saturation_concurrency: u32,
    pub reference: Option<ReferenceComparison>,
    /// Things the reader must know: extrapolated op-table lookups, unsupported settings.
    pub warnings: Vec<String>,
    /// Why the run stopped before its last level (a server that died, Ctrl-C): the levels
    /// here are the ones that finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
    /// `--predict`: the simulator's prediction of each level, with its error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<crate::compare::Prediction>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentSummary {
    pub name: String,
    pub variant: Option<String>,
    pub description: String,
    pub seed: u64,
    pub model: String,
    pub draft: Option<String>,
    pub hardware: String,
    /// The engine whose scheduler was simulated, where the file names one (`vllm 0.22.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    pub tp_size: u32,
    /// `[server] custom_all_reduce`: written only when off, the engines' default being on.
    #[serde(
        default = "engines_default",
        skip_serializing_if = "is_engines_default"
    )]
    pub custom_all_reduce: bool,
    pub max_running_requests: u32,
    /// The largest forward replayed from a CUDA graph, in requests (SGLang's
    /// `cuda_graph_max_bs`) unless `cuda_graph_unit` says tokens (vLLM's
    /// `max_cudagraph_capture_size`).
    pub cuda_graph_max_bs: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_graph_unit: Option<String>,
    pub speculative: SpeculativeSummary,
    pub max_tokens: u32,
    pub input_len: [u32; 2],
    pub concurrency: Vec<u32>,
    /// Request-rate levels, run after the concurrency levels (`"inf"`: all at once).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::metrics::rate_json::list"
    )]
    pub request_rate: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burstiness: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_level: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_client: Option<u32>,
    pub warmup_requests: u32,
    /// Where lengths come from, EOS, shared prefix and context.
    #[serde(default)]
    pub workload: WorkloadSummary,
    /// How the server holds its KV cache, as the file sets it (unset: the engine's default).
    #[serde(default)]
    pub kv_cache: KvCacheSummary,
    pub assumptions: Vec<String>,
    pub notes: Vec<String>,
}

fn engines_default() -> bool {
    true
}

fn is_engines_default(on: &bool) -> bool {
    *on
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct WorkloadSummary {
    /// `fixed`, `uniform`, or `file NAME (SOURCE)`.
    pub lengths: String,
    /// The shortest and longest output a request draws.
    pub output_len: [u32; 2],
    pub ignore_eos: bool,
    pub shared_prefix_len: u32,
    pub context_len: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct KvCacheSummary {
    pub kv_cache_dtype: String,
    pub prefix_caching: bool,
    /// None: the engine's default for the GPU; -1: off.
    pub chunked_prefill_size: Option<i64>,
    pub mem_fraction_static: Option<f64>,
    pub max_total_tokens: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpeculativeSummary {
    pub algorithm: String,
    pub num_steps: u32,
    pub eagle_topk: u32,
    pub num_draft_tokens: u32,
    pub spec_v2: bool,
    pub disable_batch_threshold: Option<u32>,
    pub verify: String,
    pub unsupported: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackendSummary {
    pub name: String,
    pub description: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReferenceComparison {
    pub source: String,
    pub note: Option<String>,
    pub points: Vec<ReferenceResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReferenceResult {
    pub label: String,
    pub metric: String,
    pub concurrency: Option<u32>,
    pub reference: f64,
    pub approximate: bool,
    /// None when the run has no such level, or the point cannot be compared with it.
    pub predicted: Option<f64>,
    pub error_pct: Option<f64>,
    /// Why a point has no prediction beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_compared: Option<String>,
}

/// Rounds for presentation; the rounding is part of the stable format.
pub fn round_to(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    let r = (x * scale).round() / scale;
    if r == 0.0 {
        0.0
    } else {
        r
    }
}

fn rounded(m: &LevelMetrics) -> LevelMetrics {
    let r3 = |x: f64| round_to(x, 3);
    LevelMetrics {
        duration_s: round_to(m.duration_s, 6),
        request_throughput: round_to(m.request_throughput, 4),
        input_throughput: r3(m.input_throughput),
        output_throughput: r3(m.output_throughput),
        per_request_output_throughput: r3(m.per_request_output_throughput),
        accept_length: m.accept_length.map(|a| round_to(a, 4)),
        mean_ttft_ms: r3(m.mean_ttft_ms),
        median_ttft_ms: r3(m.median_ttft_ms),
        p99_ttft_ms: r3(m.p99_ttft_ms),
        mean_tpot_ms: r3(m.mean_tpot_ms),
        median_tpot_ms: r3(m.median_tpot_ms),
        p99_tpot_ms: r3(m.p99_tpot_ms),
        mean_itl_ms: r3(m.mean_itl_ms),
        median_itl_ms: r3(m.median_itl_ms),
        p99_itl_ms: r3(m.p99_itl_ms),
        mean_e2e_latency_ms: r3(m.mean_e2e_latency_ms),
        median_e2e_latency_ms: r3(m.median_e2e_latency_ms),
        p99_e2e_latency_ms: r3(m.p99_e2e_latency_ms),
        mean_queue_delay_ms: m.mean_queue_delay_ms.map(r3),
        median_queue_delay_ms: m.median_queue_delay_ms.map(r3),
        p99_queue_delay_ms: m.p99_queue_delay_ms.map(r3),
        peak_kv_cache_usage: m.peak_kv_cache_usage.map(|u| round_to(u, 4)),
        ..m.clone()
    }
}

pub fn summarize_experiment(exp: &Experiment, variant: Option<&str>) -> ExperimentSummary {
    let s = &exp.speculative;
    ExperimentSummary {
        name: exp.file.name.clone(),
        variant: variant.map(str::to_string),
        description: exp.file.description.clone(),
        seed: exp.file.seed,
        model: exp.model.name.clone(),
        draft: exp.draft.as_ref().map(|d| d.name.clone()),
        hardware: match &exp.hardware {
            HardwareRef::Preset(p) => p.clone(),
            HardwareRef::Profile(p) => p.display().to_string(),
        },
        engine: exp.file.engine.as_ref().map(|e| match &e.version {
            Some(v) => format!("{} {v}", e.name),
            None => e.name.clone(),
        }),
        tp_size: exp.tp_size,
        custom_all_reduce: exp.custom_all_reduce,
        max_running_requests: exp.max_running_requests,
        cuda_graph_max_bs: exp.cuda_graph_max_bs,
        cuda_graph_unit: None,
        speculative: SpeculativeSummary {
            algorithm: s.algorithm.name_in(exp.engine.kind).into(),
            num_steps: s.shape.num_steps,
            eagle_topk: s.shape.topk,
            num_draft_tokens: s.shape.num_draft_tokens,
            spec_v2: s.spec_v2,
            disable_batch_threshold: s.disable_batch_threshold,
            verify: serde_json::to_value(s.verify)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            unsupported: s.unsupported.clone(),
        },
        max_tokens: exp.max_tokens,
        input_len: [exp.input_len.0, exp.input_len.1],
        concurrency: exp.concurrency.clone(),
        request_rate: exp.request_rates.clone(),
        burstiness: (!exp.request_rates.is_empty()).then_some(exp.burstiness),
        max_concurrency: exp
            .max_concurrency
            .filter(|_| !exp.request_rates.is_empty()),
        requests_per_level: exp.requests.per_level,
        requests_per_client: exp.requests.per_client,
        warmup_requests: exp.warmup_requests,
        workload: workload_summary(&exp.workload),
        kv_cache: KvCacheSummary {
            kv_cache_dtype: serde_json::to_value(exp.kv.kv_cache_dtype)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            prefix_caching: exp.kv.prefix_caching,
            chunked_prefill_size: match exp.kv.chunked_prefill {
                crate::experiment::ChunkedPrefill::Default => None,
                crate::experiment::ChunkedPrefill::Off => Some(-1),
                crate::experiment::ChunkedPrefill::Size(n) => Some(n as i64),
            },
            mem_fraction_static: exp.kv.mem_fraction_static,
            max_total_tokens: exp.kv.max_total_tokens,
        },
        assumptions: exp.file.assumptions.clone(),
        notes: exp.notes.clone(),
    }
}

fn workload_summary(w: &crate::experiment::Workload) -> WorkloadSummary {
    use crate::lengths::LengthDist;
    let lengths = match &w.lengths {
        LengthDist::Uniform { input, output } if input.0 == input.1 && output.0 == output.1 => {
            "fixed".to_string()
        }
        LengthDist::Uniform { .. } => "uniform".to_string(),
        LengthDist::Empirical(e) => format!("file {} ({})", e.name, e.source),
    };
    let (lo, hi) = w.lengths.output_bounds();
    WorkloadSummary {
        lengths,
        output_len: [lo.min(w.max_tokens), hi.min(w.max_tokens)],
        ignore_eos: w.ignore_eos,
        shared_prefix_len: w.shared_prefix_len,
        context_len: w.context_len,
    }
}

/// Builds the report of what `backend` served; reference points are compared here and only
/// here.
pub fn build_report(
    exp: &Experiment,
    variant: Option<&str>,
    backend: &dyn Backend,
    levels: &[LevelResult],
) -> Report {
    let warnings = backend.warnings();
    let mut experiment = summarize_experiment(exp, variant);
    if let Some(n) = backend.max_running_requests() {
        experiment.max_running_requests = n;
    }
    if let Some(bound) = backend.cuda_graph_bound() {
        experiment.cuda_graph_max_bs = bound.max();
        experiment.cuda_graph_unit = match bound {
            CudaGraphBound::Requests(_) => None,
            CudaGraphBound::Tokens(_) => Some("tokens".into()),
        };
    }
    let backend = BackendSummary {
        name: backend.name().to_string(),
        description: backend.describe(),
    };
    let metrics: Vec<LevelMetrics> = levels.iter().map(|l| rounded(&l.metrics)).collect();
    let (saturation_concurrency, saturation_output_throughput) = metrics
        .iter()
        .map(|m| (m.concurrency, m.output_throughput))
        .fold((0, 0.0), |best, x| if x.1 > best.1 { x } else { best });
    let reference = exp.file.reference.as_ref().map(|r| ReferenceComparison {
        source: r.source.clone(),
        note: r.note.clone(),
        points: r
            .points
            .iter()
            .filter(|p| p.variant.is_none() || p.variant.as_deref() == variant)
            .map(|p| compare_point(p, &metrics, saturation_output_throughput))
            .collect(),
    });
    let mut warnings = warnings;
    warnings.extend(exp.warnings.iter().cloned());
    warnings.extend(
        exp.speculative
            .unsupported
            .iter()
            .map(|u| format!("unsupported by SGLang: {u}")),
    );
    Report {
        format_version: REPORT_FORMAT_VERSION,
        experiment,
        backend,
        levels: metrics,
        saturation_output_throughput,
        saturation_concurrency,
        reference,
        warnings,
        partial: None,
        prediction: None,
    }
}

fn compare_point(p: &ReferencePoint, levels: &[LevelMetrics], saturation: f64) -> ReferenceResult {
    let closed_loop = levels.iter().filter(|m| m.request_rate.is_none()).count();
    // the best of one level is that level, not the server's saturation
    let not_compared = (p.metric == "saturation_output_throughput" && closed_loop < 2).then(|| {
        format!(
            "a saturation throughput is the best of several concurrency levels; this run has {closed_loop}"
        )
    });
    // a level where nothing completed measured nothing to set beside the reference
    let none_completed = match p.concurrency {
        Some(c) => levels
            .iter()
            .any(|m| m.concurrency == c && m.completed == 0),
        None => levels.iter().all(|m| m.completed == 0),
    };
    let not_compared = not_compared.or_else(|| {
        none_completed.then(|| match p.concurrency {
            Some(c) => format!("no request completed at C={c}"),
            None => "no request completed at any level".into(),
        })
    });
    let predicted = match (p.metric.as_str(), p.concurrency) {
        _ if not_compared.is_some() => None,
        ("saturation_output_throughput", _) => Some(saturation),
        (metric, Some(c)) => levels
            .iter()
            .find(|m| m.concurrency == c)
            .and_then(|m| level_metric(m, metric)),
        _ => None,
    };
    let error_pct = predicted.map(|v| round_to((v - p.value) / p.value * 100.0, 2));
    ReferenceResult {
        label: p.label.clone().unwrap_or_else(|| match p.concurrency {
            Some(c) => format!("{} at C={c}", p.metric),
            None => p.metric.clone(),
        }),
        metric: p.metric.clone(),
        concurrency: p.concurrency,
        reference: p.value,
        approximate: p.approximate,
        predicted,
        error_pct,
        not_compared,
    }
}

/// A level's metric by its report name, for the metrics reference points may name and the
/// latency percentiles SLOs bound (None for any other name).
pub fn level_metric(m: &LevelMetrics, name: &str) -> Option<f64> {
    let value = match name {
        "output_throughput" => m.output_throughput,
        "per_request_output_throughput" => m.per_request_output_throughput,
        "accept_length" => return m.accept_length,
        "mean_ttft_ms" => m.mean_ttft_ms,
        "median_ttft_ms" => m.median_ttft_ms,
        "mean_tpot_ms" => m.mean_tpot_ms,
        "median_tpot_ms" => m.median_tpot_ms,
        "median_itl_ms" => m.median_itl_ms,
        "median_e2e_latency_ms" => m.median_e2e_latency_ms,
        "p99_ttft_ms" => m.p99_ttft_ms,
        "p99_tpot_ms" => m.p99_tpot_ms,
        "mean_itl_ms" => m.mean_itl_ms,
        "p99_itl_ms" => m.p99_itl_ms,
        "mean_e2e_latency_ms" => m.mean_e2e_latency_ms,
        "p99_e2e_latency_ms" => m.p99_e2e_latency_ms,
        _ => return None,
    };
    // NaN: the level has no such latency
    value.is_finite().then_some(value)
}

pub const REFERENCE_METRICS: &[&str] = &[
    "saturation_output_throughput",
    "output_throughput",
    "per_request_output_throughput",
    "accept_length",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "median_e2e_latency_ms",
];

/// A sweep file's report: one report per variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepReport {
    pub format_version: u32,
    pub experiment: String,
    pub variants: Vec<Report>,
}
