//! The embedded op tables, compiled when kbench is built: the build script parses the
//! CSVs under data/optables with the runtime's own parser and stores the rows as
//! little-endian numbers, so a process pays no float parsing (it was a third of a whole
//! `kbench experiment` run's own time).
//!
//! Layout (private to one build): u32 operator count, each name as u32 length and UTF-8;
//! u32 row count, each row as u32 operator index and four f64 (x1, x2, x3, latency_ms).
//! The rows are stored as `csv::normalise` leaves them, so loading sorts nothing.

use std::sync::Arc;

use super::csv::Row;

/// Systems whose tables are compiled into the binary (so it runs from any directory).
pub const EMBEDDED_SYSTEMS: &[&str] = &["rtx_pro_6000_server", "h200_sxm"];

/// The files of one system's table directory, in the order they are read.
pub const TABLE_FILES: &[&str] = &[
    "gemm.csv",
    "moe.csv",
    "mla.csv",
    "attention.csv",
    "nccl.csv",
];

pub fn encode(rows: &[Row]) -> Vec<u8> {
    let mut names: Vec<&str> = Vec::new();
    let mut index = Vec::with_capacity(rows.len());
    for (op, _, _) in rows {
        let i = match names.iter().position(|n| *n == &**op) {
            Some(i) => i,
            None => {
                names.push(op);
                names.len() - 1
            }
        };
        index.push(i as u32);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for n in &names {
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
    }
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for ((_, x, latency), i) in rows.iter().zip(index) {
        out.extend_from_slice(&i.to_le_bytes());
        for v in [x[0], x[1], x[2], *latency] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// The rows [`encode`] wrote; `None` if the bytes are not what it writes.
pub fn decode(bytes: &[u8]) -> Option<Vec<Row>> {
    let mut r = Reader { bytes, at: 0 };
    let ops = r.u32()?;
    let mut names: Vec<Arc<str>> = Vec::with_capacity(ops.min(1 << 16));
    for _ in 0..ops {
        let len = r.u32()?;
        names.push(Arc::from(std::str::from_utf8(r.take(len)?).ok()?));
    }
    let n = r.u32()?;
    let mut rows = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let op = names.get(r.u32()?)?;
        let (x1, x2, x3, latency) = (r.f64()?, r.f64()?, r.f64()?, r.f64()?);
        rows.push((Arc::clone(op), [x1, x2, x3], latency));
    }
    (r.at == bytes.len()).then_some(rows)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u32(&mut self) -> Option<usize> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn f64(&mut self) -> Option<f64> {
        let mut le = [0u8; 8];
        le.copy_from_slice(self.take(8)?);
        Some(f64::from_le_bytes(le))
    }
}
