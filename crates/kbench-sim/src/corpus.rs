//! The fidelity corpus: one TOML file per public source of end-to-end measurements. Each
//! case is an experiment file (with `--set`-style overrides) in the configuration the source
//! ran, and the points it measured; each case has a role, `fit` (calibration may use it) or
//! `check` (never fitted to). The measured values are only ever compared with predictions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::SimError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorpusFile {
    pub source: Source,
    pub cases: Vec<Case>,
}

/// Where the numbers come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Short stable name, used in tables and plots.
    pub name: String,
    /// A repository, path and commit, or a URL.
    #[serde(default)]
    pub repository: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub commit: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    /// What the source measured and how, in a sentence or two.
    pub description: String,
    /// How the source defines each metric it reports, by kbench metric name.
    #[serde(default)]
    pub metrics: BTreeMap<String, String>,
    /// Points left out, and why.
    #[serde(default)]
    pub excluded: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Fit,
    Check,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Fit => "fit",
            Role::Check => "check",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    /// The experiment file, relative to the corpus file.
    pub experiment: String,
    /// Dotted keys to override, as with `--set`.
    #[serde(default)]
    pub set: BTreeMap<String, toml::Value>,
    pub role: Role,
    /// The serving engine and version the source ran (`vllm v0.16.0`, `sglang ...`).
    pub engine: String,
    /// The source's requests per client: concurrency level C measures this times C, as
    /// the source's harness sent (InferenceX: `--num-prompts` = 10 x concurrency), so a
    /// level's first wave, all its clients sending at once, weighs what it weighed there.
    /// Unset: the experiment file's own count.
    #[serde(default)]
    pub requests_per_client: Option<u32>,
    /// The case without speculation this one's `speedup` points divide by: another case of
    /// the same file, same load.
    #[serde(default)]
    pub baseline: Option<String>,
    pub points: Vec<Point>,
}

/// Speculation's own metric: the case's output throughput over its `baseline` case's at
/// the same concurrency (at saturation without one), as measured by the source.
pub const SPEEDUP: &str = "speedup";

/// Sustained decode: the rate C streams decode at together while none is in prefill, as
/// decode benchmarks that keep C streams running report it (llm_decode_bench's generation
/// counter over a window). Predicted as C / mean TPOT.
pub const DECODE_THROUGHPUT: &str = "decode_throughput";

/// What a speedup may divide: output throughput (requests end to end) or sustained decode.
pub const SPEEDUP_OF: [&str; 2] = ["output_throughput", DECODE_THROUGHPUT];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// A report key of a level (`mean_tpot_ms`, `output_throughput`, ...) or
    /// `saturation_output_throughput`.
    pub metric: String,
    /// The level it was measured at (none for `saturation_output_throughput`).
    #[serde(default)]
    pub concurrency: Option<u32>,
    pub value: f64,
    /// A speedup's throughput: `output_throughput` (unset) or `decode_throughput`.
    #[serde(default)]
    pub of: Option<String>,
    #[serde(default)]
    pub note: Option<String>,
}

impl Point {
    /// The level metric a speedup point divides.
    pub fn speedup_of(&self) -> &str {
        self.of.as_deref().unwrap_or("output_throughput")
    }
}

/// A corpus file as read, with where it lives.
#[derive(Debug, Clone)]
pub struct LoadedCorpus {
    pub path: PathBuf,
    pub file: CorpusFile,
}

/// The level metrics a point may name (every numeric key of a level's report).
pub const POINT_METRICS: [&str; 16] = [
    SPEEDUP,
    DECODE_THROUGHPUT,
    "output_throughput",
    "saturation_output_throughput",
    "per_request_output_throughput",
    "request_throughput",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "mean_e2e_latency_ms",
    "accept_length",
];

pub fn load_corpus(path: &Path) -> Result<LoadedCorpus, SimError> {
    let text = kbench_core::input::read_text(path).map_err(|source| SimError::Read {
        what: "corpus file",
        path: path.into(),
        source,
    })?;
    let bad = |message: String| SimError::Measurements {
        path: path.into(),
        message,
    };
    let file: CorpusFile = toml::from_str(&text).map_err(|e| bad(e.message().to_string()))?;
    if file.cases.is_empty() {
        return Err(bad("no [[cases]]".into()));
    }
    if file.source.repository.is_none() && file.source.url.is_none() {
        return Err(bad(
            "[source] needs `repository` (with `path` and `commit`) or `url`".into(),
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for case in &file.cases {
        if !names.insert(case.name.as_str()) {
            return Err(bad(format!("case `{}` appears twice", case.name)));
        }
        if case.points.is_empty() {
            return Err(bad(format!("case `{}` has no points", case.name)));
        }
        for p in &case.points {
            if !POINT_METRICS.contains(&p.metric.as_str()) {
                return Err(bad(format!(
                    "case `{}`: unknown metric `{}` (known: {})",
                    case.name,
                    p.metric,
                    POINT_METRICS.join(", ")
                )));
            }
            match p.of.as_deref() {
                Some(of) if p.metric != SPEEDUP => {
                    return Err(bad(format!(
                        "case `{}`: `of = \"{of}\"` is for `speedup` points, not `{}`",
                        case.name, p.metric
                    )))
                }
                Some(of) if !SPEEDUP_OF.contains(&of) => {
                    return Err(bad(format!(
                        "case `{}`: a speedup of `{of}`: use one of {}",
                        case.name,
                        SPEEDUP_OF.join(", ")
                    )))
                }
                Some(DECODE_THROUGHPUT) if p.concurrency.is_none() => {
                    return Err(bad(format!(
                        "case `{}`: a speedup of decode_throughput needs the concurrency it was measured at",
                        case.name
                    )))
                }
                _ => {}
            }
            if p.metric == SPEEDUP {
                match case.baseline.as_deref() {
                    None => {
                        return Err(bad(format!(
                            "case `{}`: a `speedup` point needs `baseline = \"CASE\"`, the case without speculation it divides by",
                            case.name
                        )))
                    }
                    Some(b) if b == case.name => {
                        return Err(bad(format!(
                            "case `{}` names itself as its baseline",
                            case.name
                        )))
                    }
                    Some(b) if !file.cases.iter().any(|c| c.name == b) => {
                        return Err(bad(format!(
                            "case `{}`: baseline `{b}` is not a case of this file",
                            case.name
                        )))
                    }
                    Some(_) => {}
                }
            } else if (p.metric == "saturation_output_throughput") != p.concurrency.is_none() {
                return Err(bad(format!(
                    "case `{}`: `{}` {}",
                    case.name,
                    p.metric,
                    if p.concurrency.is_none() {
                        "needs the concurrency it was measured at"
                    } else {
                        "is over all levels: give no concurrency"
                    }
                )));
            }
            if !(p.value.is_finite() && p.value > 0.0) {
                return Err(bad(format!(
                    "case `{}`: value {} is not a positive number",
                    case.name, p.value
                )));
            }
        }
    }
    Ok(LoadedCorpus {
        path: path.into(),
        file,
    })
}

/// Every `*.toml` directly in `dir`, in name order.
pub fn corpus_files(dir: &Path) -> Result<Vec<PathBuf>, SimError> {
    let entries = std::fs::read_dir(dir).map_err(|source| SimError::Read {
        what: "corpus directory",
        path: dir.into(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}
