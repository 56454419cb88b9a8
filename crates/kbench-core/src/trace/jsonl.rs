//! The JSONL form, for people: line 1 is the header, then one line per sequence with
//! ranks (positions x D) and decoded probabilities (positions x D x K).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Sequence, Trace, TraceError, TraceHeader, FORMAT_VERSION};

#[derive(Serialize)]
struct LineOut<'a> {
    id: u64,
    ranks: Vec<&'a [u8]>,
    probs: Vec<Vec<Vec<f32>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LineIn {
    id: u64,
    ranks: Vec<Vec<u8>>,
    probs: Vec<Vec<Vec<f64>>>,
}

pub fn to_jsonl(trace: &Trace) -> String {
    let header = TraceHeader {
        sequences: trace.sequences.len() as u32,
        version: FORMAT_VERSION,
        ..trace.header.clone()
    };
    let d = header.depth as usize;
    let k = header.topk as usize;
    let enc = header.prob_encoding;
    // Serialising plain data with string keys cannot fail.
    let mut out = serde_json::to_string(&header).unwrap_or_default();
    out.push('\n');
    for s in &trace.sequences {
        let line = LineOut {
            id: s.id,
            ranks: s.ranks.chunks(d).collect(),
            probs: s
                .codes
                .chunks(d * k * enc.bytes())
                .map(|pos| {
                    pos.chunks(k * enc.bytes())
                        .map(|cell| enc.codes(cell).map(|c| enc.decode(c)).collect())
                        .collect()
                })
                .collect(),
        };
        out.push_str(&serde_json::to_string(&line).unwrap_or_default());
        out.push('\n');
    }
    out
}

pub fn from_jsonl(path: &Path, text: &str) -> Result<Trace, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, first)) = lines.next() else {
        return Err(TraceError::Header {
            path: path.to_path_buf(),
            message: "empty file: the first line must be the JSON header".into(),
        });
    };
    let header: TraceHeader = serde_json::from_str(first).map_err(|e| TraceError::Line {
        path: path.to_path_buf(),
        line: 1,
        message: format!("invalid header: {e}"),
    })?;
    header.validate(path)?;
    let d = header.depth as usize;
    let k = header.topk as usize;
    let enc = header.prob_encoding;
    let expected = header.sequences as usize;
    let mut trace = Trace {
        header,
        sequences: Vec::new(),
    };
    for (idx, line) in lines {
        let lineno = idx + 1;
        let bad = |message: String| TraceError::Line {
            path: path.to_path_buf(),
            line: lineno,
            message,
        };
        let rec: LineIn =
            serde_json::from_str(line).map_err(|e| bad(format!("invalid sequence: {e}")))?;
        if rec.ranks.len() != rec.probs.len() {
            return Err(bad(format!(
                "{} rank rows but {} probability rows",
                rec.ranks.len(),
                rec.probs.len()
            )));
        }
        let mut ranks = Vec::with_capacity(rec.ranks.len() * d);
        let mut codes = Vec::with_capacity(rec.ranks.len() * d * k * enc.bytes());
        for (p, (r, pr)) in rec.ranks.iter().zip(&rec.probs).enumerate() {
            if r.len() != d || pr.len() != d {
                return Err(bad(format!(
                    "position {p}: {} ranks and {} probability lists, expected depth {d}",
                    r.len(),
                    pr.len()
                )));
            }
            ranks.extend_from_slice(r);
            for (depth, cell) in pr.iter().enumerate() {
                if cell.len() != k {
                    return Err(bad(format!(
                        "position {p} depth {depth}: {} probabilities, expected topk {k}",
                        cell.len()
                    )));
                }
                if let Some(x) = cell
                    .iter()
                    .find(|x| !(x.is_finite() && (0.0..=1.0).contains(*x)))
                {
                    return Err(bad(format!(
                        "position {p} depth {depth}: probability {x} is not in [0, 1]"
                    )));
                }
                for &x in cell {
                    enc.push_code(&mut codes, enc.encode(x));
                }
            }
        }
        let seq = Sequence {
            id: rec.id,
            ranks: ranks.into(),
            codes: codes.into(),
        };
        if let Some(problem) = trace.sequence_problem(&seq) {
            return Err(bad(format!(
                "sequence {}: {problem}",
                trace.sequences.len()
            )));
        }
        trace.sequences.push(seq);
    }
    if trace.sequences.len() != expected {
        return Err(TraceError::Header {
            path: path.to_path_buf(),
            message: format!(
                "header announces {expected} sequences, the file has {}",
                trace.sequences.len()
            ),
        });
    }
    Ok(trace)
}
