//! `--emit`: a candidate written as an experiment file of its own, which `kbench
//! experiment` runs to the same report and `kbench sglang-args` turns into a launch line.

use std::path::{Component, Path, PathBuf};

use kbench_core::experiment::{apply_overrides, RELATIVE_PATH_KEYS};

use crate::error::SearchError;
use crate::prepare::Prepared;
use crate::space::Candidate;

/// The candidate's file: the base with `--set` and the candidate's overrides applied, its
/// [search], [reference] and [sweep] removed, paths rewritten to be relative to `out`.
pub fn emitted_text(
    prepared: &Prepared,
    candidate: &Candidate,
    out: &Path,
    note: &str,
) -> Result<String, SearchError> {
    let text = std::fs::read_to_string(&prepared.path)
        .map_err(|source| kbench_core::experiment::ExperimentError::read(&prepared.path, source))?;
    let mut table: toml::Table =
        toml::from_str(&text).map_err(|e: toml::de::Error| SearchError::Settings {
            path: prepared.path.clone(),
            what: "file".into(),
            message: e.message().to_string(),
        })?;
    for t in ["search", "reference", "sweep"] {
        table.remove(t);
    }
    let mut overrides = prepared.set.clone();
    overrides.extend(candidate.set_arguments());
    apply_overrides(&mut table, &overrides)?;
    let from = absolute(prepared.path.parent().unwrap_or(Path::new(".")));
    let to = absolute(out.parent().unwrap_or(Path::new(".")));
    for key in RELATIVE_PATH_KEYS {
        rewrite_path(&mut table, key, &from, &to);
    }
    let description = table
        .get("description")
        .and_then(|d| d.as_str())
        .unwrap_or("")
        .to_string();
    table.insert(
        "description".into(),
        toml::Value::String(if description.is_empty() {
            note.to_string()
        } else {
            format!("{note} Base: {description}")
        }),
    );
    let body = toml::to_string(&table).map_err(|e| SearchError::Settings {
        path: prepared.path.clone(),
        what: "--emit".into(),
        message: format!("cannot write the file: {e}"),
    })?;
    Ok(format!(
        "# Written by `kbench search {}`: the candidate {}.\n{body}",
        prepared.path.display(),
        if candidate.overrides.is_empty() {
            "with no overrides".to_string()
        } else {
            candidate.set_arguments().join(" ")
        }
    ))
}

/// A path relative to `from` rewritten relative to `to` (absolute paths stay as they are).
fn rewrite_path(table: &mut toml::Table, dotted: &str, from: &Path, to: &Path) {
    let mut parts: Vec<&str> = dotted.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut cur = table;
    for p in parts {
        match cur.get_mut(p) {
            Some(toml::Value::Table(t)) => cur = t,
            _ => return,
        }
    }
    let Some(toml::Value::String(s)) = cur.get_mut(last) else {
        return;
    };
    let p = Path::new(s.as_str());
    if p.is_absolute() {
        return;
    }
    let target = normalize(&from.join(p));
    *s = relative(&target, to).to_string_lossy().replace('\\', "/");
}

fn absolute(p: &Path) -> PathBuf {
    let p = if p.as_os_str().is_empty() {
        Path::new(".")
    } else {
        p
    };
    match std::fs::canonicalize(p) {
        Ok(c) => c,
        Err(_) => normalize(&std::env::current_dir().unwrap_or_default().join(p)),
    }
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `target` as seen from the directory `base` (both absolute and normalized).
fn relative(target: &Path, base: &Path) -> PathBuf {
    let t: Vec<Component> = target.components().collect();
    let b: Vec<Component> = base.components().collect();
    let common = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_rewritten_relative_to_the_new_place() {
        assert_eq!(
            relative(Path::new("/r/traces/t.kbt"), Path::new("/r/experiments")),
            PathBuf::from("../traces/t.kbt")
        );
        assert_eq!(
            relative(Path::new("/r/traces/t.kbt"), Path::new("/tmp/x")),
            PathBuf::from("../../r/traces/t.kbt")
        );
        assert_eq!(
            normalize(Path::new("/r/experiments/../traces/t.kbt")),
            PathBuf::from("/r/traces/t.kbt")
        );
        let mut t: toml::Table =
            toml::from_str("[workload]\ntrace = \"../traces/t.kbt\"\n").unwrap();
        rewrite_path(
            &mut t,
            "workload.trace",
            Path::new("/r/experiments"),
            Path::new("/r/experiments/found"),
        );
        assert_eq!(t["workload"]["trace"].as_str(), Some("../../traces/t.kbt"));
    }
}
