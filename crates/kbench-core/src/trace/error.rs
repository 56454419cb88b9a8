//! Everything that can go wrong reading, writing or replaying a trace; each variant
//! names the file (or the setting) and what is wrong.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write trace {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a kbench trace: starts with {found}, expected the binary magic \"KBTRACE\\0\" or a JSONL header line")]
    BadMagic { path: PathBuf, found: String },
    #[error("{path}: trace format version {version} is not supported (this kbench reads versions 1 to {supported})")]
    UnsupportedVersion {
        path: PathBuf,
        version: u64,
        supported: u32,
    },
    #[error(
        "{path}: truncated: {what} needs {needed} bytes at offset {offset}, the file has {len}"
    )]
    Truncated {
        path: PathBuf,
        what: String,
        offset: usize,
        needed: usize,
        len: usize,
    },
    #[error("{path}: checksum mismatch: stored {algorithm} {stored}, computed {computed} (the file is corrupt)")]
    Checksum {
        path: PathBuf,
        /// `CRC-32`, or `FNV-1a 64` in a version 1 or 2 file.
        algorithm: &'static str,
        /// Both in hex, as wide as the checksum.
        stored: String,
        computed: String,
    },
    #[error("{path}: {extra} unexpected bytes after the checksum")]
    TrailingBytes { path: PathBuf, extra: usize },
    #[error("{path}: bad header: {message}")]
    Header { path: PathBuf, message: String },
    #[error("{path}:{line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: sequence {sequence}: {message}")]
    Sequence {
        path: PathBuf,
        sequence: usize,
        message: String,
    },
    #[error("trace replay: {message}")]
    Config { message: String },
    #[error("synthetic trace parameters: {message}")]
    Synth { message: String },
}
