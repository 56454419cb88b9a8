//! Reading an experiment file: TOML parse with positions, `--set` overrides, declared
//! sweeps, unknown-key suggestions, then validation into a typed [`Experiment`].

use std::path::{Path, PathBuf};

use super::error::{span_at, ExperimentError, SourceSpan};
use super::file::ExperimentFile;
use super::resolve::{resolve, Experiment};

/// One runnable configuration of a file: the file itself, or one variant of its sweep.
#[derive(Debug, Clone)]
pub struct Variant {
    /// None for a file without a sweep.
    pub name: Option<String>,
    pub experiment: Experiment,
}

/// Loads a file, applies `overrides` (`key=value`, TOML values; bare words are strings),
/// expands its sweep, and validates every variant.
pub fn load_experiment(path: &Path, overrides: &[String]) -> Result<Vec<Variant>, ExperimentError> {
    let text =
        crate::input::read_text(path).map_err(|source| ExperimentError::read(path, source))?;
    load_experiment_str(&text, path, overrides)
}

pub fn load_experiment_str(
    text: &str,
    path: &Path,
    overrides: &[String],
) -> Result<Vec<Variant>, ExperimentError> {
    load_selected(text, path, overrides, None)
}

/// As [`load_experiment`], resolving only the sweep variant named `only` (all of them
/// when `None`), so another variant's error does not stand in its way. Naming a variant
/// the file does not declare resolves nothing: the caller says which exist.
pub fn load_experiment_variant(
    path: &Path,
    overrides: &[String],
    only: Option<&str>,
) -> Result<Vec<Variant>, ExperimentError> {
    let text =
        crate::input::read_text(path).map_err(|source| ExperimentError::read(path, source))?;
    load_selected(&text, path, overrides, only)
}

fn load_selected(
    text: &str,
    path: &Path,
    overrides: &[String],
    only: Option<&str>,
) -> Result<Vec<Variant>, ExperimentError> {
    resolve_variants(text, path, overrides, only)
        .map_err(|e| {
            blame_flag(e, overrides, |o| {
                resolve_variants(text, path, o, only).err()
            })
        })
        .map_err(|e| locate_arch(e, text))
}

fn resolve_variants(
    text: &str,
    path: &Path,
    overrides: &[String],
    only: Option<&str>,
) -> Result<Vec<Variant>, ExperimentError> {
    let base_dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    variant_files_str(text, path, overrides)?
        .into_iter()
        .filter(|(name, _)| only.is_none() || name.as_deref() == only)
        .map(|(name, file)| {
            let experiment = resolve(file, path, &base_dir).map_err(|e| match (&name, e) {
                (
                    Some(variant),
                    ExperimentError::Invalid {
                        path,
                        rule,
                        message,
                        fix,
                    },
                ) => ExperimentError::Invalid {
                    path,
                    rule,
                    message: format!("sweep variant `{variant}`: {message}"),
                    fix,
                },
                (_, other) => other,
            })?;
            Ok(Variant { name, experiment })
        })
        .collect()
}

/// The file as written, per variant, with overrides applied but nothing resolved: for
/// callers that must prepare inputs (e.g. create a model directory) before resolution.
pub fn variant_files(
    path: &Path,
    overrides: &[String],
) -> Result<Vec<(Option<String>, ExperimentFile)>, ExperimentError> {
    let text =
        crate::input::read_text(path).map_err(|source| ExperimentError::read(path, source))?;
    variant_files_str(&text, path, overrides)
        .map_err(|e| blame_flag(e, overrides, |o| variant_files_str(&text, path, o).err()))
}

/// An error that only the command line's overrides cause is theirs: the first override
/// that makes a valid file fail is named, as the user wrote it, instead of the file.
fn blame_flag(
    err: ExperimentError,
    overrides: &[String],
    fails_with: impl Fn(&[String]) -> Option<ExperimentError>,
) -> ExperimentError {
    if overrides.is_empty()
        || matches!(
            err,
            ExperimentError::Override { .. }
                | ExperimentError::Flag { .. }
                | ExperimentError::Read { .. }
        )
        || fails_with(&[]).is_some()
    {
        return err;
    }
    // The first override after which the file fails the same way is the one to blame. A
    // prefix can fail differently on the way (`method=eagle3` before its token count): then
    // no single flag is at fault and the error stands as it is.
    let Some((n, first)) =
        (1..=overrides.len()).find_map(|n| fails_with(&overrides[..n]).map(|e| (n, e)))
    else {
        return err;
    };
    if first.detail() != err.detail() {
        return err;
    }
    ExperimentError::Flag {
        flag: format!("--set {}", overrides[n - 1]),
        index: n - 1,
        cause: Box::new(err),
    }
}

/// A preset or config that does not resolve is pointed at where the file names it.
fn locate_arch(err: ExperimentError, text: &str) -> ExperimentError {
    match err {
        ExperimentError::Arch {
            path,
            what,
            key,
            span: None,
            source,
        } => ExperimentError::Arch {
            span: super::locate::value_span(text, key),
            path,
            what,
            key,
            source,
        },
        other => other,
    }
}

fn variant_files_str(
    text: &str,
    path: &Path,
    overrides: &[String],
) -> Result<Vec<(Option<String>, ExperimentFile)>, ExperimentError> {
    // Deserializing the text directly (not a Value) keeps spans for schema errors.
    let _: ExperimentFile = toml::from_str(text).map_err(|e| from_toml_error(e, text, path))?;
    let mut table: toml::Table =
        toml::from_str(text).map_err(|e| from_toml_error(e, text, path))?;
    // a variant starts from the file as written: the command line is applied after the
    // variant's own settings, knowing whether the variant speculates
    let as_written = table.clone();
    apply_overrides(&mut table, overrides)?;
    check_finite(&table, path)?;
    let base = parse_table(&table, path).map_err(|e| name_override_section(e, overrides))?;
    let Some(sweep) = base.sweep.clone() else {
        return Ok(vec![(None, base)]);
    };
    if sweep.variants.is_empty() {
        return Err(ExperimentError::Invalid {
            path: path.into(),
            rule: "sweep",
            message: "[sweep] declares no variants".into(),
            fix: "add [[sweep.variants]] entries with a name and a `set` table, or remove [sweep]"
                .into(),
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = sweep
        .variants
        .iter()
        .find(|v| !seen.insert(v.name.as_str()))
    {
        return Err(ExperimentError::Invalid {
            path: path.into(),
            rule: "sweep.variants",
            message: format!("two variants are named `{}`", twice.name),
            fix: "give each variant a name of its own: reports and --variant tell them apart by it"
                .into(),
        });
    }
    let mut out = Vec::with_capacity(sweep.variants.len());
    let command_line = override_keys(overrides);
    for variant in &sweep.variants {
        let mut t = as_written.clone();
        t.remove("sweep");
        if turns_speculation_off(&variant.set) {
            clear_speculative_keys(&mut t, &variant.set);
        }
        for (key, value) in &variant.set {
            set_dotted(&mut t, key, value.clone()).map_err(|reason| ExperimentError::Override {
                assignment: format!("sweep variant `{}`: {key}", variant.name),
                reason,
            })?;
        }
        // Command-line overrides win over the sweep's own settings, except that tuning a
        // speculation (`--set speculative.num_steps=3`) leaves a plain variant plain: the
        // flag is aimed at the variants that speculate, unless it names the method too.
        let stays_plain = !speculates(&t) && !names_speculation_method(&command_line);
        apply_overrides_where(&mut t, overrides, |a| {
            !(stays_plain && tunes_speculation(a))
        })?;
        check_finite(&t, path)?;
        let file = parse_table(&t, path)
            .map_err(|e| name_override_section(e, overrides))
            .map_err(|e| in_variant(e, &variant.name, text))?;
        out.push((Some(variant.name.clone()), file));
    }
    Ok(out)
}

/// The file parsed on its own, so what breaks it here is the variant's `set`: the error names
/// the variant and points into its entry, found by position in the file as written (the
/// merged table it was read from has none).
fn in_variant(err: ExperimentError, name: &str, text: &str) -> ExperimentError {
    let entry = VariantSpans::find(text, name);
    let span = |range: Option<std::ops::Range<usize>>| range.map(|r| span_at(text, r));
    match err {
        ExperimentError::UnknownKey {
            path,
            key,
            suggestion,
            span: None,
            ..
        } => ExperimentError::UnknownKey {
            span: span(entry.as_ref().map(|e| e.key_naming(&key))),
            path,
            key,
            section: format!("sweep variant `{name}`'s set"),
            suggestion,
        },
        ExperimentError::Schema {
            path,
            message,
            span: None,
        } => ExperimentError::Schema {
            path,
            message: format!("sweep variant `{name}`: {message}"),
            span: span(entry.map(|e| e.set)),
        },
        ExperimentError::Invalid {
            path,
            rule,
            message,
            fix,
        } => ExperimentError::Invalid {
            path,
            rule,
            message: format!("sweep variant `{name}`: {message}"),
            fix,
        },
        other => other,
    }
}

/// Where one `[[sweep.variants]]` entry's `set` and its keys are in the file.
struct VariantSpans {
    set: std::ops::Range<usize>,
    keys: Vec<(String, std::ops::Range<usize>)>,
}

impl VariantSpans {
    fn find(text: &str, name: &str) -> Option<VariantSpans> {
        use toml::Spanned;
        #[derive(serde::Deserialize)]
        struct File {
            sweep: Option<Sweep>,
        }
        #[derive(serde::Deserialize)]
        struct Sweep {
            #[serde(default)]
            variants: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            name: String,
            set: Spanned<std::collections::BTreeMap<Spanned<String>, toml::Value>>,
        }
        let file: File = toml::from_str(text).ok()?;
        let entry = file.sweep?.variants.into_iter().find(|v| v.name == name)?;
        let set = entry.set.span();
        let keys = entry
            .set
            .into_inner()
            .into_keys()
            .map(|k| {
                let span = k.span();
                (k.into_inner(), span)
            })
            .collect();
        Some(VariantSpans { set, keys })
    }

    /// The `set` key an unknown key came from: the one with it as a dotted part, else the
    /// whole `set`.
    fn key_naming(&self, unknown: &str) -> std::ops::Range<usize> {
        self.keys
            .iter()
            .find(|(k, _)| k.split('.').any(|part| part == unknown))
            .map_or(self.set.clone(), |(_, span)| span.clone())
    }
}

/// Applies `--set` overrides to a file's table as loading does: one that sets
/// `speculative.algorithm = "none"` first clears the speculative keys the others do not set.
pub fn apply_overrides(
    table: &mut toml::Table,
    overrides: &[String],
) -> Result<(), ExperimentError> {
    apply_overrides_where(table, overrides, |_| true)
}

/// [`apply_overrides`], skipping the assignments `keep` turns down.
fn apply_overrides_where(
    table: &mut toml::Table,
    overrides: &[String],
    keep: impl Fn(&str) -> bool,
) -> Result<(), ExperimentError> {
    let set_by_overrides = override_keys(overrides);
    if turns_speculation_off(&set_by_overrides) {
        clear_speculative_keys(table, &set_by_overrides);
    }
    for assignment in overrides.iter().filter(|a| keep(a)) {
        apply_override(table, assignment)?;
    }
    Ok(())
}

/// Keys where an infinite number means something: a request rate of `inf` sends every
/// request at once, as `vllm bench serve --request-rate inf` does.
const INFINITY_ALLOWED: &[&str] = &["benchmark.request_rate"];

/// No NaN anywhere in the file, and no infinity where it is not a setting's meaning: a
/// `temperature = nan` would otherwise run, and compare false against every bound.
fn check_finite(table: &toml::Table, path: &Path) -> Result<(), ExperimentError> {
    fn walk(value: &toml::Value, key: &str, path: &Path) -> Result<(), ExperimentError> {
        match value {
            toml::Value::Float(f) if f.is_nan() || (f.is_infinite() && !allowed(key, *f)) => {
                Err(ExperimentError::Invalid {
                    path: path.into(),
                    rule: "finite numbers",
                    message: format!("`{key}` is {f}"),
                    fix: if INFINITY_ALLOWED.iter().any(|k| key.starts_with(k)) {
                        "use a positive number, or inf for all at once".into()
                    } else {
                        "use a finite number".into()
                    },
                })
            }
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let child = if key.is_empty() {
                        k.clone()
                    } else {
                        format!("{key}.{k}")
                    };
                    walk(v, &child, path)?;
                }
                Ok(())
            }
            toml::Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{key}[{i}]"), path)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
    fn allowed(key: &str, f: f64) -> bool {
        f > 0.0
            && INFINITY_ALLOWED.iter().any(|k| {
                key.strip_prefix(k)
                    .is_some_and(|rest| rest.starts_with('['))
            })
    }
    walk(&toml::Value::Table(table.clone()), "", path)
}

/// The keys `--set` assigns, with their values where they parse (what the speculation
/// switch looks at; errors are reported when the overrides are applied).
fn override_keys(overrides: &[String]) -> std::collections::BTreeMap<String, toml::Value> {
    overrides
        .iter()
        .filter_map(|a| a.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(v.to_string()));
            (k.trim().to_string(), value)
        })
        .collect()
}

/// A variant (or `--set`) that sets `speculative.algorithm = "none"` is the file without
/// speculation.
fn turns_speculation_off(set: &std::collections::BTreeMap<String, toml::Value>) -> bool {
    ["speculative.algorithm", "speculative.method"]
        .iter()
        .any(|k| {
            set.get(*k)
                .and_then(|v| v.as_str())
                .is_some_and(|a| a.eq_ignore_ascii_case("none"))
        })
}

/// The table, as a variant made it, names a speculative algorithm or method other than
/// `none` (a plain variant sets it to none, or its file never had one).
fn speculates(t: &toml::Table) -> bool {
    let Some(toml::Value::Table(spec)) = t.get("speculative") else {
        return false;
    };
    ["algorithm", "method"].iter().any(|k| {
        spec.get(*k)
            .and_then(|v| v.as_str())
            .is_some_and(|a| !a.eq_ignore_ascii_case("none"))
    })
}

/// The command line chooses the speculation itself (`speculative.algorithm` or `method`).
fn names_speculation_method(set: &std::collections::BTreeMap<String, toml::Value>) -> bool {
    ["speculative.algorithm", "speculative.method"]
        .iter()
        .any(|k| set.contains_key(*k))
}

/// An override of a speculative setting that only means something with speculation on.
fn tunes_speculation(assignment: &str) -> bool {
    assignment
        .split_once('=')
        .map(|(k, _)| k.trim())
        .and_then(|k| k.strip_prefix("speculative."))
        .is_some_and(|k| k != "algorithm" && k != "method")
}

/// Drops the file's speculative settings that only mean something with speculation on
/// (SGLang refuses them without an algorithm), except those the variant sets itself, so
/// spec and baseline variants can share one file.
fn clear_speculative_keys(
    t: &mut toml::Table,
    set: &std::collections::BTreeMap<String, toml::Value>,
) {
    let Some(toml::Value::Table(spec)) = t.get_mut("speculative") else {
        return;
    };
    for key in [
        "num_steps",
        "eagle_topk",
        "num_draft_tokens",
        "spec_v2",
        "disable_batch_threshold",
        "num_speculative_tokens",
        "prompt_lookup_min",
        "prompt_lookup_max",
    ] {
        if !set.contains_key(&format!("speculative.{key}")) {
            spec.remove(key);
        }
    }
    // vLLM's `method = "none"` is no method at all (vLLM has no such name)
    if set
        .get("speculative.method")
        .and_then(|v| v.as_str())
        .is_some_and(|m| m.eq_ignore_ascii_case("none"))
    {
        spec.remove("method");
    }
}

fn parse_table(table: &toml::Table, path: &Path) -> Result<ExperimentFile, ExperimentError> {
    // `--set engine.max_num_batched_tokens=...` on a file with no [engine] starts a section
    // without the name every [engine] needs: say that, not serde's "missing field"
    if let Some(toml::Value::Table(engine)) = table.get("engine") {
        if !engine.contains_key("name") {
            return Err(ExperimentError::Invalid {
                path: path.into(),
                rule: "engine.name",
                message: "[engine] has no `name` (a file without [engine] is SGLang's; setting an engine key starts the section)".into(),
                fix: "set engine.name = \"vllm\" or \"sglang\" as well".into(),
            });
        }
    }
    ExperimentFile::deserialize_table(table).map_err(|e| {
        let message = e.message().to_string();
        schema_error(&message, path, None)
    })
}

impl ExperimentFile {
    fn deserialize_table(table: &toml::Table) -> Result<ExperimentFile, toml::de::Error> {
        toml::Value::Table(table.clone()).try_into()
    }
}

/// An unknown key that came from `--set` is named with the table the user aimed at.
fn name_override_section(e: ExperimentError, overrides: &[String]) -> ExperimentError {
    match e {
        ExperimentError::UnknownKey {
            path,
            key,
            suggestion,
            span,
            ..
        } => {
            let section = overrides
                .iter()
                .filter_map(|o| o.split_once('=').map(|(k, _)| k.trim()))
                .find_map(|k| {
                    k.rsplit_once('.')
                        .filter(|(_, last)| *last == key)
                        .map(|(parent, _)| format!("[{parent}] (from --set {k})"))
                })
                .unwrap_or_else(|| "the experiment".into());
            ExperimentError::UnknownKey {
                path,
                key,
                section,
                suggestion,
                span,
            }
        }
        other => other,
    }
}

fn from_toml_error(e: toml::de::Error, text: &str, path: &Path) -> ExperimentError {
    let span = e.span().map(|r| span_at(text, r));
    let message = e.message().to_string();
    if message.contains("unknown field")
        || message.starts_with("missing field")
        || is_type_error(&message)
    {
        let section = e.span().map(|r| table_header_before(text, r.start));
        return match schema_error(&message, path, span) {
            ExperimentError::UnknownKey {
                path,
                key,
                suggestion,
                span,
                ..
            } => ExperimentError::UnknownKey {
                path,
                key,
                section: section.unwrap_or_else(|| "the experiment".into()),
                suggestion,
                span,
            },
            other => other,
        };
    }
    match span {
        Some(span) => ExperimentError::Syntax {
            path: path.into(),
            message: message.trim().to_string(),
            span,
        },
        None => ExperimentError::Schema {
            path: path.into(),
            message,
            span: None,
        },
    }
}

fn is_type_error(m: &str) -> bool {
    m.starts_with("invalid type")
        || m.starts_with("invalid value")
        || m.starts_with("unknown variant")
}

/// Turns serde's "unknown field `x`, expected one of `a`, `b`" into a suggestion.
fn schema_error(message: &str, path: &Path, span: Option<SourceSpan>) -> ExperimentError {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let key = rest.split('`').next().unwrap_or("").to_string();
        let expected: Vec<&str> = rest
            .split("expected")
            .nth(1)
            .map(|e| e.split('`').skip(1).step_by(2).collect())
            .unwrap_or_default();
        let suggestion = expected
            .iter()
            .map(|c| (strsim::jaro_winkler(&key, c), *c))
            .filter(|(score, _)| *score > 0.75)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, c)| c.to_string());
        return ExperimentError::UnknownKey {
            path: path.into(),
            key,
            section: "the experiment".into(),
            suggestion,
            span,
        };
    }
    ExperimentError::Schema {
        path: path.into(),
        message: message.trim().to_string(),
        span,
    }
}

/// The `[table]` a byte offset sits in, or the top level.
fn table_header_before(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    // the unknown key is a table header's own name (`[benchmarks]`, `[backend.htpp]`): it
    // sits in the table its dotted prefix names, not in the header's opening bracket
    let line = before.rsplit('\n').next().unwrap_or("").trim_start();
    if line.starts_with('[') && !line.contains(']') {
        let parent = line.trim_start_matches('[').trim_end_matches('.').trim();
        return if parent.is_empty() {
            "the top level".into()
        } else {
            format!("[{parent}]")
        };
    }
    before
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.to_string())
        .unwrap_or_else(|| "the top level".into())
}

pub fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<(), ExperimentError> {
    let (key, raw) = assignment
        .split_once('=')
        .ok_or_else(|| ExperimentError::Override {
            assignment: assignment.into(),
            reason: "expected KEY=VALUE, e.g. speculative.num_steps=3".into(),
        })?;
    let key = key.trim();
    let raw = raw.trim();
    if key.is_empty() {
        return Err(ExperimentError::Override {
            assignment: assignment.into(),
            reason: "the key is empty".into(),
        });
    }
    let value = parse_value(raw);
    set_dotted(table, key, value).map_err(|reason| ExperimentError::Override {
        assignment: assignment.into(),
        reason,
    })
}

/// A TOML value if it parses as one (`3`, `true`, `[1, 2]`, `"x"`), else a bare string.
fn parse_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.into()),
    }
}

fn set_dotted(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let parts: Vec<&str> = key.split('.').collect();
    let (last, parents) = parts.split_last().expect("split yields at least one part");
    let mut cur = table;
    for (i, part) in parents.iter().enumerate() {
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(format!("`{}` is not a table", parts[..=i].join("."))),
        };
    }
    cur.insert(last.to_string(), value);
    Ok(())
}
