//! Reading (form sniffed from the content), atomic writing, conversion.

use std::path::Path;

use super::binary::{from_binary, to_binary, MAGIC};
use super::jsonl::{from_jsonl, to_jsonl};
use super::{Trace, TraceError};
use crate::atomic::write_atomic;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceForm {
    Binary,
    Jsonl,
}

impl TraceForm {
    /// By extension: `.jsonl` is JSONL, anything else binary (`.kbt`).
    pub fn from_path(path: &Path) -> TraceForm {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => TraceForm::Jsonl,
            _ => TraceForm::Binary,
        }
    }
}

pub fn read(path: &Path) -> Result<Trace, TraceError> {
    let bytes = std::fs::read(path).map_err(|source| TraceError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    read_bytes(path, &bytes)
}

/// Parses either form; `path` labels errors.
pub fn read_bytes(path: &Path, bytes: &[u8]) -> Result<Trace, TraceError> {
    if bytes.starts_with(MAGIC) {
        return from_binary(path, bytes);
    }
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        let text = std::str::from_utf8(bytes).map_err(|e| TraceError::Header {
            path: path.to_path_buf(),
            message: format!("JSONL trace is not UTF-8 ({e})"),
        })?;
        return from_jsonl(path, text);
    }
    // A prefix of the magic is a truncated binary file, not a foreign one.
    if !bytes.is_empty() && MAGIC.starts_with(bytes) {
        return from_binary(path, bytes);
    }
    let shown = &bytes[..bytes.len().min(8)];
    Err(TraceError::BadMagic {
        path: path.to_path_buf(),
        found: if shown.is_empty() {
            "nothing (empty file)".into()
        } else {
            format!("{:?}", String::from_utf8_lossy(shown))
        },
    })
}

/// Writes atomically (temporary file beside `path`, then rename).
pub fn write(trace: &Trace, path: &Path, form: TraceForm) -> Result<(), TraceError> {
    let bytes = match form {
        TraceForm::Binary => to_binary(trace),
        TraceForm::Jsonl => to_jsonl(trace).into_bytes(),
    };
    write_atomic(path, &bytes).map_err(|source| TraceError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads `src` in whichever form it is and writes `dst` in `form`.
pub fn convert(src: &Path, dst: &Path, form: TraceForm) -> Result<Trace, TraceError> {
    let trace = read(src)?;
    write(&trace, dst, form)?;
    Ok(trace)
}
