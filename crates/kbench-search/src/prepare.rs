//! From an experiment file with a `[search]` table to the candidates to run: the base
//! validated, the space checked key by key, its size bounded before it is expanded.

use std::path::{Path, PathBuf};

use kbench_core::experiment::{
    apply_overrides, load_experiment, load_experiment_str, Experiment, ExperimentError,
};

use crate::error::SearchError;
use crate::settings::{SearchFlags, SearchSettings};
use crate::space::{count, expand, AxisValues, BaseSpeculative, Candidate};

/// A search ready to run.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub path: PathBuf,
    pub settings: SearchSettings,
    /// The file with `--set` applied and its [search] and [reference] tables removed: what
    /// every candidate is this file plus its overrides of.
    pub base_text: String,
    pub base: Experiment,
    /// The `--set` overrides the base was given (an emitted winner carries them).
    pub set: Vec<String>,
    pub candidates: Vec<Candidate>,
    /// The space's size before rules (plain configurations counted once).
    pub space_size: u128,
}

impl Prepared {
    /// A candidate's experiment, as `kbench experiment --set ...` on the base would load it.
    pub fn load(&self, candidate: &Candidate) -> Result<Experiment, ExperimentError> {
        let mut variants =
            load_experiment_str(&self.base_text, &self.path, &candidate.set_arguments())?;
        Ok(variants.remove(0).experiment)
    }
}

pub fn prepare(path: &Path, set: &[String], flags: &SearchFlags) -> Result<Prepared, SearchError> {
    let variants = load_experiment(path, set)?;
    let settings_error = |what: &str, message: String| SearchError::Settings {
        path: path.to_path_buf(),
        what: what.into(),
        message,
    };
    if variants.len() != 1 || variants[0].name.is_some() {
        return Err(settings_error(
            "file",
            "the file declares a [sweep]: a search's variants are its space; move the swept keys into [search.space]".into(),
        ));
    }
    let base = variants
        .into_iter()
        .next()
        .map(|v| v.experiment)
        .ok_or_else(|| settings_error("file", "the file loads to no experiment".into()))?;
    let text =
        std::fs::read_to_string(path).map_err(|source| ExperimentError::read(path, source))?;
    let mut table: toml::Table = toml::from_str(&text)
        .map_err(|e: toml::de::Error| settings_error("file", e.message().to_string()))?;
    let search_table = match table.remove("search") {
        Some(toml::Value::Table(t)) => Some(t),
        Some(other) => {
            return Err(settings_error(
                "table",
                format!("`search` must be a table, not {}", other.type_str()),
            ))
        }
        None => None,
    };
    // a reference's points measure the file's own configuration, not the candidates'
    table.remove("reference");
    apply_overrides(&mut table, set)?;
    let base_text = toml::to_string(&table)
        .map_err(|e| settings_error("file", format!("cannot re-serialise the file: {e}")))?;
    let settings = SearchSettings::new(path, search_table.as_ref(), flags)?;
    if settings.axes.is_empty() {
        return Err(SearchError::EmptySpace {
            path: path.to_path_buf(),
            why: "[search.space] lists no keys".into(),
        });
    }
    for s in set {
        let key = s.split_once('=').map(|(k, _)| k.trim()).unwrap_or(s);
        if settings.axes.iter().any(|a| a.key == key) {
            return Err(settings_error(
                "--set",
                format!("`{key}` is both fixed by --set and varied by the space; drop one"),
            ));
        }
    }
    let spec_table = table.get("speculative").and_then(|v| v.as_table());
    let raw_u32 = |k: &str| {
        spec_table
            .and_then(|t| t.get(k))
            .and_then(|v| v.as_integer())
            .and_then(|i| u32::try_from(i).ok())
    };
    let base_spec = BaseSpeculative {
        speculating: base.speculative.is_speculative(),
        num_steps: raw_u32("num_steps"),
        eagle_topk: raw_u32("eagle_topk"),
    };
    let mut prepared = Prepared {
        path: path.to_path_buf(),
        settings,
        base_text,
        base,
        set: set.to_vec(),
        candidates: Vec::new(),
        space_size: 0,
    };
    check_axis_keys(&prepared)?;
    let size = count(&prepared.settings.axes, &base_spec);
    if size == 0 {
        return Err(SearchError::EmptySpace {
            path: path.to_path_buf(),
            why: "no combination of the axes' values is a configuration (auto draft tokens for num_steps or eagle_topk 0?)".into(),
        });
    }
    if size > prepared.settings.max_candidates as u128 {
        return Err(SearchError::TooLarge {
            path: path.to_path_buf(),
            count: size,
            limit: prepared.settings.max_candidates,
        });
    }
    prepared.space_size = size;
    prepared.candidates = expand(&prepared.settings.axes, &base_spec);
    check_objective_level(&prepared)?;
    Ok(prepared)
}

/// Every axis names a key the experiment file has, with values of its type: a typo is an
/// error before anything runs, not a space of skipped candidates.
fn check_axis_keys(p: &Prepared) -> Result<(), SearchError> {
    for axis in &p.settings.axes {
        let AxisValues::List(values) = &axis.values else {
            continue;
        };
        for v in values {
            let assignment = format!("{}={v}", axis.key);
            match load_experiment_str(&p.base_text, &p.path, std::slice::from_ref(&assignment)) {
                Ok(_) => {}
                Err(e) if e.broken_rule().is_some() => {}
                Err(e) => {
                    return Err(SearchError::Settings {
                        path: p.path.clone(),
                        what: format!("space.\"{}\"", axis.key),
                        message: format!("the value {v} cannot be set: {}", e.detail()),
                    })
                }
            }
        }
    }
    Ok(())
}

/// A fixed level must be one the experiment runs.
fn check_objective_level(p: &Prepared) -> Result<(), SearchError> {
    use crate::objective::At;
    let varies_levels = p
        .settings
        .axes
        .iter()
        .any(|a| a.key.starts_with("benchmark."));
    let runs = match p.settings.objective.at {
        At::Saturation => true,
        At::Concurrency(c) => varies_levels || p.base.concurrency.contains(&c),
        At::RequestRate(r) => varies_levels || p.base.request_rates.contains(&r),
    };
    if runs {
        return Ok(());
    }
    Err(SearchError::Settings {
        path: p.path.clone(),
        what: "at".into(),
        message: format!(
            "the objective is read at {}, a level the experiment does not run (concurrency {:?}, request rates {:?}); add it to [benchmark] or use at = \"saturation\"",
            p.settings.objective.at, p.base.concurrency, p.base.request_rates
        ),
    })
}
