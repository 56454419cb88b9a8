//! Reading (form sniffed from the content), atomic writing, conversion.

use std::path::Path;

use super::binary::{from_binary, from_shared_binary, to_binary, MAGIC};
use super::jsonl::{from_jsonl, to_jsonl};
use super::{Bytes, Trace, TraceError};
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

/// Bytes read before the rest: enough for a binary trace's magic or a JSONL header line.
const SNIFF_BYTES: u64 = 1 << 20;

pub fn read(path: &Path) -> Result<Trace, TraceError> {
    let file = std::fs::File::open(path).map_err(|source| TraceError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let bytes = match map(&file) {
        Some(mapped) => {
            // what is not a trace is refused from its first bytes, whatever its size
            let sniffed = mapped.len().min(SNIFF_BYTES as usize);
            if let Some(e) = refuse_from_start(path, &mapped[..sniffed], sniffed < mapped.len()) {
                return Err(e);
            }
            mapped
        }
        None => match file.metadata() {
            // one read into a buffer of the file's size: no regrowth, no second copy
            Ok(meta) if meta.is_file() && meta.len() > 0 => {
                let bytes = read_sized(path, file, meta.len())?;
                let sniffed = bytes.len().min(SNIFF_BYTES as usize);
                if let Some(e) = refuse_from_start(path, &bytes[..sniffed], sniffed < bytes.len()) {
                    return Err(e);
                }
                bytes.into()
            }
            _ => read_whole(path, file)?,
        },
    };
    read_shared(path, &bytes)
}

/// Traces up to this size are read into memory rather than mapped: a mapped file truncated
/// while in use (another process rewriting it in place) kills the reader with SIGBUS, and
/// reading one of this size costs a few milliseconds.
pub const MAP_ABOVE_BYTES: u64 = 64 << 20;

/// The file's pages mapped read-only, or `None` where it is small enough to read (at most
/// [`MAP_ABOVE_BYTES`]) or cannot be mapped (a pipe, an empty file). Mapping a large trace
/// costs no copy and no fresh pages.
fn map(file: &std::fs::File) -> Option<Bytes> {
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() <= MAP_ABOVE_BYTES {
        return None;
    }
    // SAFETY: the map is read-only and lives as long as the trace's views of it. What
    // memory mapping cannot guard against is another process truncating or changing the
    // file in place while it is mapped (docs/trace-format.md says so for traces this
    // large); kbench itself replaces files by renaming a new one over them, which leaves
    // mapped pages as they were.
    let mapped = unsafe { memmap2::Mmap::map(file) }.ok()?;
    Some(Bytes::from_owner(mapped))
}

/// Reads a regular file of `len` bytes whole.
fn read_sized(path: &Path, mut file: std::fs::File, len: u64) -> Result<Vec<u8>, TraceError> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(len as usize);
    file.read_to_end(&mut bytes)
        .map_err(|source| TraceError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(bytes)
}

/// Reads what cannot be mapped, refusing what is not a trace from its first bytes before
/// reading the rest.
fn read_whole(path: &Path, mut file: std::fs::File) -> Result<Bytes, TraceError> {
    use std::io::Read;
    let read_error = |source| TraceError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    (&mut file)
        .take(SNIFF_BYTES)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if let Some(e) = refuse_from_start(path, &bytes, bytes.len() as u64 == SNIFF_BYTES) {
        return Err(e);
    }
    file.read_to_end(&mut bytes).map_err(read_error)?;
    Ok(bytes.into())
}

/// The error a file's first bytes already show: not the magic, not a JSONL header line.
fn refuse_from_start(path: &Path, head: &[u8], more: bool) -> Option<TraceError> {
    if head.starts_with(MAGIC) || !more {
        // a binary trace is checked whole; a file that fits the sniff is read_bytes' to judge
        return None;
    }
    let first = head.iter().position(|b| !b.is_ascii_whitespace())?;
    if head[first] != b'{' {
        return read_bytes(path, head).err();
    }
    let Some(end) = head[first..].iter().position(|&b| b == b'\n') else {
        return Some(TraceError::Header {
            path: path.to_path_buf(),
            message: format!(
                "no header line in the first {} MiB: a JSONL trace starts with one line of JSON",
                SNIFF_BYTES >> 20
            ),
        });
    };
    let line = std::str::from_utf8(&head[first..first + end]).ok()?;
    serde_json::from_str::<super::TraceHeader>(line)
        .err()
        .map(|e| TraceError::Line {
            path: path.to_path_buf(),
            line: 1,
            message: format!("invalid header: {e}"),
        })
}

/// Parses either form; a binary trace's sequences share `bytes`' buffer.
fn read_shared(path: &Path, bytes: &Bytes) -> Result<Trace, TraceError> {
    if bytes.starts_with(MAGIC) {
        from_shared_binary(path, bytes)
    } else {
        read_bytes(path, bytes)
    }
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
