use std::path::PathBuf;

use crate::arch::ArchError;

/// Where in the experiment file an error points, for rendering a snippet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpan {
    pub line: usize,
    pub column: usize,
    pub offset: usize,
    pub len: usize,
    pub snippet: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("cannot read experiment file {path}{}", nearest.as_ref().map(|n| format!(" (did you mean {}?)", n.display())).unwrap_or_default())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
        /// A file beside it whose name is one or two characters away, where it does not exist.
        nearest: Option<PathBuf>,
    },
    #[error("{path}:{}:{}: {message}", span.line, span.column)]
    Syntax {
        path: PathBuf,
        message: String,
        span: SourceSpan,
    },
    #[error("{path}{}: unknown key `{key}` in {section}{}", span_suffix(.span), suggestion_suffix(.suggestion))]
    UnknownKey {
        path: PathBuf,
        key: String,
        section: String,
        suggestion: Option<String>,
        span: Option<SourceSpan>,
    },
    #[error("{path}{}: {message}", span_suffix(.span))]
    Schema {
        path: PathBuf,
        message: String,
        span: Option<SourceSpan>,
    },
    #[error("invalid --set `{assignment}`: {reason}")]
    Override { assignment: String, reason: String },
    /// The file is valid on its own and this command-line setting is what breaks it.
    #[error("{flag}: {}", .cause.detail())]
    Flag {
        /// How the user wrote it: `--set key=value`, or the friendlier flag it came from.
        flag: String,
        /// Which of the overrides it is, in the order they were given.
        index: usize,
        /// What the file with this setting fails with; kept whole so that a broken rule
        /// stays a broken rule to callers that skip those (`kbench search`).
        cause: Box<ExperimentError>,
    },
    #[error("{path}: {rule}: {message}\n  fix: {fix}")]
    Invalid {
        path: PathBuf,
        rule: &'static str,
        message: String,
        fix: String,
    },
    #[error("{path}: workload.lengths")]
    Lengths {
        path: PathBuf,
        #[source]
        source: crate::lengths::LengthFileError,
    },
    #[error("{path}{}: {what}", span_suffix(.span))]
    Arch {
        path: PathBuf,
        what: String,
        /// The setting that names the architecture (`model.preset`), to locate it in the file.
        key: &'static str,
        span: Option<SourceSpan>,
        #[source]
        source: ArchError,
    },
}

fn span_suffix(span: &Option<SourceSpan>) -> String {
    span.as_ref()
        .map(|s| format!(":{}:{}", s.line, s.column))
        .unwrap_or_default()
}

fn suggestion_suffix(s: &Option<String>) -> String {
    s.as_ref()
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default()
}

impl ExperimentError {
    pub fn span(&self) -> Option<&SourceSpan> {
        match self {
            ExperimentError::Syntax { span, .. } => Some(span),
            ExperimentError::UnknownKey { span, .. }
            | ExperimentError::Schema { span, .. }
            | ExperimentError::Arch { span, .. } => span.as_ref(),
            _ => None,
        }
    }

    /// What is wrong, without the file's name and position: what a command-line flag is
    /// blamed with when the file is fine without it.
    pub fn detail(&self) -> String {
        match self {
            ExperimentError::UnknownKey {
                key, suggestion, ..
            } => format!("unknown key `{key}`{}", suggestion_suffix(suggestion)),
            ExperimentError::Schema { message, .. } | ExperimentError::Syntax { message, .. } => {
                message.clone()
            }
            ExperimentError::Invalid {
                rule, message, fix, ..
            } => format!("{rule}: {message}\n  fix: {fix}"),
            ExperimentError::Arch { source, .. } => source.to_string(),
            ExperimentError::Lengths { source, .. } => format!("workload.lengths: {source}"),
            ExperimentError::Override { reason, .. } => reason.clone(),
            ExperimentError::Flag { cause, .. } => cause.detail(),
            ExperimentError::Read { .. } => self.to_string(),
        }
    }

    /// A [`ExperimentError::Flag`] named as the user wrote it: `labels[i]` for the `i`th override.
    pub fn with_flag_labels(self, labels: &[String]) -> ExperimentError {
        match self {
            ExperimentError::Flag { index, cause, flag } => ExperimentError::Flag {
                flag: labels.get(index).cloned().unwrap_or(flag),
                index,
                cause,
            },
            other => other,
        }
    }

    /// The engine rule this configuration breaks, with what breaks it, whether the file
    /// or a command-line setting brought it in: a configuration that cannot exist rather
    /// than input that is wrong.
    pub fn broken_rule(&self) -> Option<(&'static str, &str)> {
        match self {
            ExperimentError::Invalid { rule, message, .. } => Some((rule, message)),
            ExperimentError::Flag { cause, .. } => cause.broken_rule(),
            _ => None,
        }
    }
}

pub(crate) fn span_at(text: &str, range: std::ops::Range<usize>) -> SourceSpan {
    let offset = range.start.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let column = text[line_start..offset].chars().count() + 1;
    let line_end = text[offset..]
        .find('\n')
        .map(|i| offset + i)
        .unwrap_or(text.len());
    SourceSpan {
        line,
        column,
        offset,
        len: range.end.saturating_sub(range.start).max(1),
        snippet: text[line_start..line_end].to_string(),
    }
}

impl ExperimentError {
    /// The experiment file at `path` could not be read: where it does not exist, names the
    /// file beside it that is nearest to what was typed (`topk1-v2.toml` for `topk1_v2.toml`).
    pub fn read(path: &std::path::Path, source: std::io::Error) -> ExperimentError {
        let nearest = (source.kind() == std::io::ErrorKind::NotFound)
            .then(|| nearest_file(path))
            .flatten();
        ExperimentError::Read {
            path: path.to_path_buf(),
            source,
            nearest,
        }
    }
}

fn nearest_file(path: &std::path::Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .map(|candidate| (strsim::levenshtein(name, &candidate), candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, candidate)| path.with_file_name(candidate))
}
