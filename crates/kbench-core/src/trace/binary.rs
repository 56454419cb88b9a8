//! The binary form: magic, version, header length, JSON header, little-endian body,
//! FNV-1a 64 checksum of everything before it (layout in docs/trace-format.md).

use std::path::Path;

use super::{Sequence, Trace, TraceError, TraceHeader, FORMAT_VERSION, FULLY_OBSERVED_VERSION};

pub const MAGIC: &[u8; 8] = b"KBTRACE\0";

/// FNV-1a, 64 bit: simple, byte-order free and enough to catch corruption (not tampering).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub fn to_binary(trace: &Trace) -> Vec<u8> {
    let header = TraceHeader {
        sequences: trace.sequences.len() as u32,
        version: trace.header.written_version(),
        ..trace.header.clone()
    };
    // Serialising plain data with string keys cannot fail.
    let json = serde_json::to_vec(&header).unwrap_or_default();
    let k = header.topk as usize;
    let wide = header.prob_encoding.bytes() == 2;
    let body: usize = trace
        .sequences
        .iter()
        .map(|s| 12 + s.ranks.len() * (1 + k * header.prob_encoding.bytes()))
        .sum();
    let mut out = Vec::with_capacity(16 + json.len() + body + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&header.written_version().to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    for s in &trace.sequences {
        out.extend_from_slice(&s.id.to_le_bytes());
        out.extend_from_slice(&((s.ranks.len() / header.depth as usize) as u32).to_le_bytes());
        out.extend_from_slice(&s.ranks);
        if wide {
            for &c in &s.probs {
                out.extend_from_slice(&c.to_le_bytes());
            }
        } else {
            out.extend(s.probs.iter().map(|&c| c as u8));
        }
    }
    let sum = fnv1a64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<&'a [u8], TraceError> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => Err(TraceError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.at,
                needed: n,
                len: self.bytes.len(),
            }),
        }
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, TraceError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, TraceError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

/// Parses the binary form; `path` labels errors.
pub fn from_binary(path: &Path, bytes: &[u8]) -> Result<Trace, TraceError> {
    // FNV-1a is one dependent multiply per byte; on a well-formed file the checksummed
    // bytes are all but the last 8, so it runs on a second core while the body is parsed.
    std::thread::scope(|scope| {
        let well_formed_body = bytes.len().saturating_sub(8);
        let sum = scope.spawn(move || fnv1a64(&bytes[..well_formed_body]));
        parse_binary(path, bytes, |body_end| {
            if body_end == well_formed_body {
                sum.join().unwrap_or_else(|_| fnv1a64(&bytes[..body_end]))
            } else {
                fnv1a64(&bytes[..body_end])
            }
        })
    })
}

fn parse_binary(
    path: &Path,
    bytes: &[u8],
    checksum: impl FnOnce(usize) -> u64,
) -> Result<Trace, TraceError> {
    let mut cur = Cursor { path, bytes, at: 0 };
    let magic = cur.take(8, || "the magic".into())?;
    if magic != MAGIC {
        return Err(TraceError::BadMagic {
            path: path.to_path_buf(),
            found: format!("{:?}", String::from_utf8_lossy(magic)),
        });
    }
    let version = cur.u32(|| "the version".into())?;
    if !(FULLY_OBSERVED_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(TraceError::UnsupportedVersion {
            path: path.to_path_buf(),
            version: u64::from(version),
            supported: FORMAT_VERSION,
        });
    }
    let hlen = cur.u32(|| "the header length".into())? as usize;
    let hbytes = cur.take(hlen, || "the JSON header".into())?;
    let header: TraceHeader = serde_json::from_slice(hbytes).map_err(|e| TraceError::Header {
        path: path.to_path_buf(),
        message: format!("invalid JSON header: {e}"),
    })?;
    header.validate(path)?;
    let d = header.depth as usize;
    let k = header.topk as usize;
    let enc = header.prob_encoding;
    let n = header.sequences as usize;
    let mut trace = Trace {
        header,
        sequences: Vec::with_capacity(n.min(1 << 16)),
    };
    for i in 0..n {
        let id = cur.u64(|| format!("sequence {i}'s id"))?;
        let positions = cur.u32(|| format!("sequence {i}'s position count"))? as usize;
        let cells = positions.saturating_mul(d);
        let ranks = cur
            .take(cells, || format!("sequence {i}'s ranks"))?
            .to_vec();
        let raw = cur.take(cells.saturating_mul(k).saturating_mul(enc.bytes()), || {
            format!("sequence {i}'s probabilities")
        })?;
        let probs: Vec<u16> = if enc.bytes() == 2 {
            raw.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        } else {
            raw.iter().map(|&b| u16::from(b)).collect()
        };
        trace.sequences.push(Sequence { id, ranks, probs });
    }
    let body_end = cur.at;
    let stored = cur.u64(|| "the checksum".into())?;
    let computed = checksum(body_end);
    if stored != computed {
        return Err(TraceError::Checksum {
            path: path.to_path_buf(),
            stored,
            computed,
        });
    }
    if cur.at != bytes.len() {
        return Err(TraceError::TrailingBytes {
            path: path.to_path_buf(),
            extra: bytes.len() - cur.at,
        });
    }
    // Content checks come after the checksum so corruption is reported as corruption.
    for (i, seq) in trace.sequences.iter().enumerate() {
        trace.validate_sequence(path, i, seq)?;
    }
    Ok(trace)
}
