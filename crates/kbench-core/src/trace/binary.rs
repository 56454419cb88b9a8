//! The binary form: magic, version, header length, JSON header, little-endian body, and
//! a checksum of everything before it (layout in docs/trace-format.md): CRC-32 from
//! format v3, FNV-1a 64 before.

use std::path::Path;

use super::{
    Bytes, Sequence, Trace, TraceError, TraceHeader, CRC32_VERSION, FORMAT_VERSION,
    FULLY_OBSERVED_VERSION,
};

pub const MAGIC: &[u8; 8] = b"KBTRACE\0";

/// FNV-1a, 64 bit, formats v1 and v2: one dependent multiply per byte, which made it most
/// of a trace's load time.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The checksum a file of some version ends in.
#[derive(Clone, Copy)]
enum Checksum {
    /// From v3: CRC-32 as zlib computes it, so a writer in any language has it at hand.
    Crc32,
    Fnv1a64,
}

impl Checksum {
    fn of(version: u32) -> Checksum {
        if version >= CRC32_VERSION {
            Checksum::Crc32
        } else {
            Checksum::Fnv1a64
        }
    }

    fn name(self) -> &'static str {
        match self {
            Checksum::Crc32 => "CRC-32",
            Checksum::Fnv1a64 => "FNV-1a 64",
        }
    }

    /// Bytes it takes at the end of the file.
    fn width(self) -> usize {
        match self {
            Checksum::Crc32 => 4,
            Checksum::Fnv1a64 => 8,
        }
    }

    fn compute(self, bytes: &[u8]) -> u64 {
        match self {
            Checksum::Crc32 => u64::from(crc32fast::hash(bytes)),
            Checksum::Fnv1a64 => fnv1a64(bytes),
        }
    }
}

pub fn to_binary(trace: &Trace) -> Vec<u8> {
    encode(trace, FORMAT_VERSION)
}

/// The binary form as `version` lays it out; only tests write older versions.
pub(crate) fn encode(trace: &Trace, version: u32) -> Vec<u8> {
    let header = TraceHeader {
        sequences: trace.sequences.len() as u32,
        version,
        ..trace.header.clone()
    };
    // Serialising plain data with string keys cannot fail.
    let json = serde_json::to_vec(&header).unwrap_or_default();
    let k = header.topk as usize;
    let body: usize = trace
        .sequences
        .iter()
        .map(|s| 12 + s.ranks.len() * (1 + k * header.prob_encoding.bytes()))
        .sum();
    let mut out = Vec::with_capacity(16 + json.len() + body + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    for s in &trace.sequences {
        out.extend_from_slice(&s.id.to_le_bytes());
        out.extend_from_slice(&((s.ranks.len() / header.depth as usize) as u32).to_le_bytes());
        out.extend_from_slice(&s.ranks);
        out.extend_from_slice(&s.codes);
    }
    let checksum = Checksum::of(version);
    let sum = checksum.compute(&out);
    out.extend_from_slice(&sum.to_le_bytes()[..checksum.width()]);
    out
}

struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a Bytes,
    at: usize,
}

impl<'a> Cursor<'a> {
    /// The next `n` bytes as a view sharing the file's buffer.
    fn take_shared(
        &mut self,
        n: usize,
        what: impl FnOnce() -> String,
    ) -> Result<Bytes, TraceError> {
        let start = self.at;
        self.take(n, what)?;
        Ok(self.bytes.slice(start..self.at))
    }

    fn take(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<&'a [u8], TraceError> {
        let bytes: &'a [u8] = self.bytes;
        match self.at.checked_add(n) {
            Some(end) if end <= bytes.len() => {
                let s = &bytes[self.at..end];
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
    from_shared_binary(path, &Bytes::copy_from_slice(bytes))
}

/// Parses the binary form into sequences that share `shared`'s buffer.
pub fn from_shared_binary(path: &Path, bytes: &Bytes) -> Result<Trace, TraceError> {
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
        let ranks = cur.take_shared(cells, || format!("sequence {i}'s ranks"))?;
        let codes = cur.take_shared(cells.saturating_mul(k).saturating_mul(enc.bytes()), || {
            format!("sequence {i}'s probabilities")
        })?;
        trace.sequences.push(Sequence { id, ranks, codes });
    }
    let body_end = cur.at;
    let checksum = Checksum::of(version);
    let width = checksum.width();
    let computed = checksum.compute(&bytes[..body_end]);
    let stored = cur.take(width, || "the checksum".into())?;
    let mut le = [0u8; 8];
    le[..width].copy_from_slice(stored);
    let stored = u64::from_le_bytes(le);
    if stored != computed {
        let hex = |v: u64| format!("{v:#0w$x}", w = 2 + 2 * width);
        return Err(TraceError::Checksum {
            path: path.to_path_buf(),
            algorithm: checksum.name(),
            stored: hex(stored),
            computed: hex(computed),
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

#[cfg(test)]
mod tests {
    use super::{encode, from_binary, to_binary};
    use crate::trace::{preset, synth, FORMAT_VERSION};
    use std::path::Path;

    /// CRC-32 bit by bit (reflected polynomial 0xEDB88320), as zlib defines it.
    fn zlib_crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    fn small_trace() -> crate::trace::Trace {
        let mut p = preset("kimi-k2.5-eagle3-chat").unwrap();
        p.sequences = 3;
        p.positions = 5;
        synth(&p).unwrap()
    }

    #[test]
    fn the_current_version_ends_in_zlibs_crc32() {
        let bytes = to_binary(&small_trace());
        assert_eq!(&bytes[8..12], &FORMAT_VERSION.to_le_bytes());
        let (body, trailer) = bytes.split_at(bytes.len() - 4);
        assert_eq!(trailer, &zlib_crc32(body).to_le_bytes());
    }

    /// Files older kbench wrote (FNV-1a 64 trailers) still read, and read the same.
    #[test]
    fn versions_1_and_2_still_read() {
        let t = small_trace();
        for version in [1, 2] {
            let bytes = encode(&t, version);
            assert_eq!(&bytes[8..12], &version.to_le_bytes());
            let back = from_binary(Path::new("old.kbt"), &bytes).unwrap();
            assert_eq!(back.sequences, t.sequences, "version {version}");
            let mut corrupt = bytes.clone();
            let near_end = corrupt.len() - 20;
            corrupt[near_end] ^= 1;
            let e = from_binary(Path::new("old.kbt"), &corrupt).unwrap_err();
            assert!(e.to_string().contains("checksum mismatch"), "{e}");
        }
    }
}
