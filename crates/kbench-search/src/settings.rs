//! The `[search]` table (and the flags that stand in for it), parsed strictly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::SearchError;
use crate::objective::{metric_names, suggest_metric, At, Objective, Slo};
use crate::space::{Axis, AxisValues};

/// Above this many candidates a search asks for `--max-candidates` (a typo in a range
/// should not start an hour of simulation).
pub const DEFAULT_MAX_CANDIDATES: usize = 5000;
pub const DEFAULT_TOP: usize = 10;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchSection {
    /// Dotted experiment keys (as `--set` takes them) and the values to try.
    #[serde(default)]
    space: BTreeMap<String, toml::Value>,
    #[serde(default)]
    objective: Option<String>,
    #[serde(default)]
    at: Option<toml::Value>,
    #[serde(default)]
    slo: Vec<String>,
    #[serde(default)]
    top: Option<usize>,
    #[serde(default)]
    max_candidates: Option<usize>,
    #[serde(default)]
    allow_unsupported: bool,
}

/// What the command line adds to, or puts in place of, the file's `[search]`.
#[derive(Debug, Clone, Default)]
pub struct SearchFlags {
    /// `KEY=VALUES`: an axis added to the space, or replacing the file's.
    pub space: Vec<String>,
    pub objective: Option<String>,
    pub at: Option<String>,
    /// Added to the file's SLOs.
    pub slo: Vec<String>,
    pub top: Option<usize>,
    pub max_candidates: Option<usize>,
    pub allow_unsupported: bool,
}

#[derive(Debug, Clone)]
pub struct SearchSettings {
    pub path: PathBuf,
    pub axes: Vec<Axis>,
    pub objective: Objective,
    pub slos: Vec<Slo>,
    pub top: usize,
    pub max_candidates: usize,
    pub allow_unsupported: bool,
}

impl SearchSettings {
    /// From the file's `[search]` table (None: the file has none) and the flags.
    pub fn new(
        path: &Path,
        table: Option<&toml::Table>,
        flags: &SearchFlags,
    ) -> Result<SearchSettings, SearchError> {
        let settings_error = |what: &str, message: String| SearchError::Settings {
            path: path.to_path_buf(),
            what: what.to_string(),
            message,
        };
        if table.is_none() && flags.space.is_empty() {
            return Err(SearchError::NoSearch {
                path: path.to_path_buf(),
            });
        }
        let section: SearchSection = match table {
            Some(t) => toml::Value::Table(t.clone())
                .try_into()
                .map_err(|e: toml::de::Error| settings_error("table", e.message().to_string()))?,
            None => toml::from_str("")
                .map_err(|e: toml::de::Error| settings_error("table", e.message().to_string()))?,
        };
        let mut space = section.space.clone();
        for assignment in &flags.space {
            let (key, raw) = assignment.split_once('=').ok_or_else(|| {
                settings_error(
                    "--space",
                    format!("`{assignment}`: expected KEY=VALUES, e.g. speculative.num_steps=1..5"),
                )
            })?;
            space.insert(key.trim().to_string(), parse_flag_value(raw.trim()));
        }
        let mut axes = Vec::with_capacity(space.len());
        for (key, value) in &space {
            let values = AxisValues::parse(key, value)
                .map_err(|m| settings_error(&format!("space.\"{key}\""), m))?;
            axes.push(Axis {
                key: key.clone(),
                values,
            });
        }
        let metric = flags
            .objective
            .clone()
            .or(section.objective)
            .unwrap_or_else(|| "output_throughput".into());
        check_metric(path, "the objective", &metric)?;
        let at = match (&flags.at, &section.at) {
            (Some(text), _) => At::parse(text).map_err(|m| settings_error("--at", m))?,
            (None, Some(toml::Value::Integer(c))) => At::parse(&c.to_string())
                .map_err(|m| settings_error("at", m))?,
            (None, Some(toml::Value::String(s))) => {
                At::parse(s).map_err(|m| settings_error("at", m))?
            }
            (None, Some(other)) => {
                return Err(settings_error(
                    "at",
                    format!(
                        "a {} is not a place to read the objective: use \"saturation\", a concurrency or \"rate=R\"",
                        other.type_str()
                    ),
                ))
            }
            (None, None) => At::Saturation,
        };
        let mut slos = Vec::new();
        for text in section.slo.iter().chain(&flags.slo) {
            let slo = Slo::parse(text).map_err(|m| settings_error("slo", m))?;
            check_metric(path, "an SLO", &slo.metric)?;
            slos.push(slo);
        }
        let top = flags.top.or(section.top).unwrap_or(DEFAULT_TOP);
        if top == 0 {
            return Err(settings_error(
                "top",
                "0 rows would show nothing; use 1 or more".into(),
            ));
        }
        Ok(SearchSettings {
            path: path.to_path_buf(),
            axes,
            objective: Objective { metric, at },
            slos,
            top,
            max_candidates: flags
                .max_candidates
                .or(section.max_candidates)
                .unwrap_or(DEFAULT_MAX_CANDIDATES),
            allow_unsupported: flags.allow_unsupported || section.allow_unsupported,
        })
    }
}

fn check_metric(path: &Path, what: &'static str, metric: &str) -> Result<(), SearchError> {
    if metric_names().iter().any(|n| n == metric) {
        return Ok(());
    }
    Err(SearchError::UnknownMetric {
        path: path.to_path_buf(),
        what,
        metric: metric.to_string(),
        suggestion: suggest_metric(metric),
    })
}

/// A flag's VALUES: a TOML value (`[1, 2]`, `{ min = 1, max = 5 }`, `true`), else a bare
/// word (`auto`, `1..5`, `none`).
fn parse_flag_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}
