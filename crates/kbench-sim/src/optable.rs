//! Measured operator tables: latency by up to three numeric axes, interpolated log-log.
//!
//! Format (docs/cost-model.md, "Op-table format"): CSV with the header
//! `op,x1,x2,x3,latency_ms`; `op` names the operator and everything held fixed
//! (`gemm/bf16`, `moe/int4_wo/h7168/i2048/e384/k8/balanced`, ...), `x1..x3` are the axes
//! interpolated over (unused axes are 1), `latency_ms` is one call on one GPU.
//!
//! Interpolation is piecewise linear in (ln x, ln latency) per axis, nested axis by axis:
//! exact for power laws (a memory-bound GEMM scales linearly in n*k, attention in context),
//! and never negative. A query outside the measured range is answered (below: the smallest
//! measured point; above: log-log extrapolation from the last two points, slope clamped to
//! [0, 1], or [0, 2] along a prompt's length for context attention, whose causal FLOPs grow
//! with its square) and recorded in [`OpTables::flagged`] so a report can show it.

use crate::memo::Memo;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use crate::error::SimError;

#[derive(Debug, Clone)]
enum Node {
    Leaf(f64),
    /// Sorted by key.
    Inner(Vec<(f64, Node)>),
}

/// A set of operator tables (one system), with a record of extrapolated queries.
#[derive(Debug, Clone)]
pub struct OpTables {
    origin: String,
    ops: Arc<BTreeMap<String, Node>>,
    flagged: RefCell<BTreeSet<String>>,
}

// the build script encodes and lists the files, the library decodes
#[allow(dead_code)]
mod compiled;
mod csv;

pub use compiled::EMBEDDED_SYSTEMS;
use csv::{parse_csv, Row};

/// The rows compiled into the binary for `system`.
fn compiled_rows(system: &str) -> Option<&'static [u8]> {
    macro_rules! sys {
        ($s:literal) => {
            include_bytes!(concat!(env!("OUT_DIR"), "/", $s, ".optable")).as_slice()
        };
    }
    match system {
        "rtx_pro_6000_server" => Some(sys!("rtx_pro_6000_server")),
        "h200_sxm" => Some(sys!("h200_sxm")),
        _ => None,
    }
}

impl OpTables {
    pub fn empty() -> OpTables {
        OpTables {
            origin: "(no op tables)".into(),
            ops: Arc::new(BTreeMap::new()),
            flagged: RefCell::new(BTreeSet::new()),
        }
    }

    /// The tables compiled into the binary; parsed once per process and shared (the fast
    /// path: building a backend then costs no parsing).
    pub fn embedded(system: &str) -> Result<OpTables, SimError> {
        static PARSED: Memo<OpTables> = Memo::new();
        PARSED
            .get_or_try(system, || Self::parse_embedded(system))
            .map(|t| t.fresh())
    }

    fn parse_embedded(system: &str) -> Result<OpTables, SimError> {
        let origin = format!("[optables] system = \"{system}\"");
        let compiled = compiled_rows(system).ok_or_else(|| SimError::Profile {
            origin: origin.clone(),
            message: format!(
                "no embedded op tables for `{system}` (embedded: {})",
                EMBEDDED_SYSTEMS.join(", ")
            ),
        })?;
        let rows = compiled::decode(compiled).ok_or_else(|| SimError::Profile {
            origin,
            message: "the op tables compiled into this binary are damaged".into(),
        })?;
        Ok(Self::from_normalised_rows(
            format!("data/optables/{system} (embedded)"),
            rows,
        ))
    }

    /// Reads every `*.csv` in a directory (sorted by name, so the result is deterministic).
    /// The tables of every `.csv` in `dir` (read once per process).
    pub fn from_dir(dir: &Path) -> Result<OpTables, SimError> {
        static PARSED: Memo<OpTables> = Memo::new();
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        PARSED
            .get_or_try(&key.display().to_string(), || Self::read_dir(dir))
            .map(|t| t.fresh())
    }

    fn read_dir(dir: &Path) -> Result<OpTables, SimError> {
        let read_dir = std::fs::read_dir(dir).map_err(|source| SimError::Read {
            what: "op-table directory",
            path: dir.into(),
            source,
        })?;
        let mut files: Vec<_> = read_dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(SimError::OpTable {
                origin: dir.display().to_string(),
                line: 0,
                message: "no .csv files in the op-table directory".into(),
            });
        }
        let mut rows = Vec::new();
        for f in files {
            let text = kbench_core::input::read_text(&f).map_err(|source| SimError::Read {
                what: "op table",
                path: f.clone(),
                source,
            })?;
            parse_csv(&text, &mut rows).map_err(|e| SimError::OpTable {
                origin: f.display().to_string(),
                line: e.line,
                message: e.message,
            })?;
        }
        Ok(Self::from_rows(dir.display().to_string(), rows))
    }

    /// A copy sharing the parsed tables, with an empty record of flagged queries.
    pub fn fresh(&self) -> OpTables {
        OpTables {
            origin: self.origin.clone(),
            ops: Arc::clone(&self.ops),
            flagged: RefCell::new(BTreeSet::new()),
        }
    }

    fn from_rows(origin: String, mut rows: Vec<Row>) -> OpTables {
        csv::normalise(&mut rows);
        Self::from_normalised_rows(origin, rows)
    }

    /// `rows` as [`csv::normalise`] leaves them (the compiled tables are stored so).
    fn from_normalised_rows(origin: String, rows: Vec<Row>) -> OpTables {
        let mut ops = BTreeMap::new();
        let mut i = 0;
        while i < rows.len() {
            let j = rows[i..]
                .iter()
                .position(|r| r.0 != rows[i].0)
                .map_or(rows.len(), |p| i + p);
            let pts: Vec<([f64; 3], f64)> = rows[i..j].iter().map(|r| (r.1, r.2)).collect();
            let mut node = build(&pts, 0);
            if rows[i].0.starts_with("all_") {
                // NCCL switches protocol by size and the measured curve has dips (8 GPUs on
                // PCIe: 0.156 ms at 256K elements, 0.132 ms at 512K). A smaller message never
                // has to be slower than a larger one, so collectives take the suffix minimum
                // along the message axis.
                suffix_min(&mut node, 1);
            }
            ops.insert(rows[i].0.to_string(), node);
            i = j;
        }
        OpTables {
            origin,
            ops: Arc::new(ops),
            flagged: RefCell::new(BTreeSet::new()),
        }
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    pub fn has(&self, op: &str) -> bool {
        self.ops.contains_key(op)
    }

    pub fn ops(&self) -> impl Iterator<Item = &str> {
        self.ops.keys().map(String::as_str)
    }

    /// Latency in milliseconds of `op` at `x`, interpolated; extrapolation is recorded.
    pub fn lookup(&self, op: &str, x: [f64; 3], why: &str) -> Result<f64, SimError> {
        let node = self.ops.get(op).ok_or_else(|| SimError::MissingOp {
            op: op.into(),
            why: why.into(),
            origin: self.origin.clone(),
        })?;
        let mut notes = Vec::new();
        let v = query(node, &x, 0, &mut notes, max_slopes(op));
        if !notes.is_empty() {
            notes.sort();
            notes.dedup();
            self.flagged.borrow_mut().insert(format!(
                "{op} at ({}, {}, {}) for {why}: {}",
                x[0],
                x[1],
                x[2],
                notes.join("; ")
            ));
        }
        Ok(v)
    }

    /// Every extrapolated query since these tables were loaded (or [`OpTables::fresh`]).
    pub fn flagged(&self) -> Vec<String> {
        self.flagged.borrow().iter().cloned().collect()
    }
}

fn suffix_min(node: &mut Node, axis: usize) {
    let Node::Inner(children) = node else { return };
    if axis > 0 {
        for (_, c) in children.iter_mut() {
            suffix_min(c, axis - 1);
        }
        return;
    }
    let mut best = f64::INFINITY;
    for (_, c) in children.iter_mut().rev() {
        let v = leaf_value(c);
        best = best.min(v);
        set_leaf(c, best);
    }
}

fn leaf_value(node: &Node) -> f64 {
    match node {
        Node::Leaf(v) => *v,
        Node::Inner(c) => c
            .first()
            .map(|(_, n)| leaf_value(n))
            .unwrap_or(f64::INFINITY),
    }
}

fn set_leaf(node: &mut Node, v: f64) {
    match node {
        Node::Leaf(x) => *x = v,
        Node::Inner(c) => {
            if let Some((_, n)) = c.first_mut() {
                set_leaf(n, v);
            }
        }
    }
}

fn build(pts: &[([f64; 3], f64)], axis: usize) -> Node {
    if axis == 3 {
        return Node::Leaf(pts[0].1);
    }
    let mut children = Vec::new();
    let mut i = 0;
    while i < pts.len() {
        let key = pts[i].0[axis];
        let j = pts[i..]
            .iter()
            .position(|p| p.0[axis] != key)
            .map_or(pts.len(), |p| i + p);
        children.push((key, build(&pts[i..j], axis + 1)));
        i = j;
    }
    Node::Inner(children)
}

/// The steepest log-log growth an axis may be extrapolated with: linear in every axis (a
/// GEMM's rows, a batch's requests, a decode's context), but quadratic in the prompt length
/// of context attention (`mla_ctx`, `attn_ctx`: heads, requests, prompt tokens), where every
/// token attends to those before it. A measured table ends at 16k-32k tokens with a slope
/// of about 2 there; clamped to 1, a 128k prompt's attention came out 4x short.
fn max_slopes(op: &str) -> [f64; 3] {
    if op.starts_with("mla_ctx/") || op.starts_with("attn_ctx/") {
        [1.0, 1.0, 2.0]
    } else {
        [1.0; 3]
    }
}

fn query(
    node: &Node,
    x: &[f64; 3],
    axis: usize,
    notes: &mut Vec<String>,
    max_slope: [f64; 3],
) -> f64 {
    let children = match node {
        Node::Leaf(v) => return *v,
        Node::Inner(c) => c,
    };
    let q = x[axis];
    let n = children.len();
    if let Some((_, c)) = children
        .iter()
        .find(|(k, _)| (k - q).abs() <= 1e-9 * k.abs().max(1.0))
    {
        return query(c, x, axis + 1, notes, max_slope);
    }
    let ln = |v: f64| v.max(1e-12).ln();
    let (lo, hi) = (children[0].0, children[n - 1].0);
    if n == 1 || q < lo {
        notes.push(format!(
            "x{} = {q} outside measured [{lo}, {hi}]: nearest point used",
            axis + 1
        ));
        let c = if q < lo {
            &children[0].1
        } else {
            &children[n - 1].1
        };
        return query(c, x, axis + 1, notes, max_slope);
    }
    if q > hi {
        notes.push(format!(
            "x{} = {q} above measured max {hi}: extrapolated",
            axis + 1
        ));
        let (k0, c0) = &children[n - 2];
        let (k1, c1) = &children[n - 1];
        let (y0, y1) = (
            query(c0, x, axis + 1, notes, max_slope),
            query(c1, x, axis + 1, notes, max_slope),
        );
        let slope = ((ln(y1) - ln(y0)) / (ln(*k1) - ln(*k0))).clamp(0.0, max_slope[axis]);
        return (ln(y1) + slope * (ln(q) - ln(*k1))).exp();
    }
    let idx = children.partition_point(|(k, _)| *k < q);
    let (k0, c0) = &children[idx - 1];
    let (k1, c1) = &children[idx];
    let (y0, y1) = (
        query(c0, x, axis + 1, notes, max_slope),
        query(c1, x, axis + 1, notes, max_slope),
    );
    let t = (ln(q) - ln(*k0)) / (ln(*k1) - ln(*k0));
    (ln(y0) + t * (ln(y1) - ln(y0))).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(csv: &str) -> OpTables {
        let mut rows = Vec::new();
        parse_csv(csv, &mut rows).unwrap();
        OpTables::from_rows("test".into(), rows)
    }

    #[test]
    fn log_log_interpolation_is_exact_for_power_laws() {
        let t = tables("op,x1,x2,x3,latency_ms\na,1,1,1,1\na,4,1,1,4\n");
        assert!((t.lookup("a", [2.0, 1.0, 1.0], "t").unwrap() - 2.0).abs() < 1e-12);
        assert!(t.flagged().is_empty());
    }

    #[test]
    fn extrapolation_is_flagged() {
        let t = tables("op,x1,x2,x3,latency_ms\na,1,1,1,1\na,4,1,1,4\n");
        assert!((t.lookup("a", [8.0, 1.0, 1.0], "t").unwrap() - 8.0).abs() < 1e-9);
        assert!((t.lookup("a", [0.5, 1.0, 1.0], "t").unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(t.flagged().len(), 2);
    }

    #[test]
    fn context_attention_extrapolates_quadratically_in_the_prompt_length() {
        // 4x the time for 2x the prompt: causal attention's FLOPs are quadratic
        let csv = "op,x1,x2,x3,latency_ms\n\
                   mla_ctx/bf16,8,1,16384,4\nmla_ctx/bf16,8,1,32768,16\n\
                   gemm/bf16,1,1,16384,4\ngemm/bf16,1,1,32768,16\n";
        let t = tables(csv);
        let at_128k = t.lookup("mla_ctx/bf16", [8.0, 1.0, 131072.0], "t").unwrap();
        assert!((at_128k - 256.0).abs() < 1e-6, "{at_128k}");
        // any other op keeps the linear ceiling
        let gemm = t.lookup("gemm/bf16", [1.0, 1.0, 131072.0], "t").unwrap();
        assert!((gemm - 64.0).abs() < 1e-6, "{gemm}");
        assert_eq!(t.flagged().len(), 2);
    }

    #[test]
    fn bad_rows_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("f.csv"),
            "op,x1,x2,x3,latency_ms\na,1,x,1,1\n",
        )
        .unwrap();
        let e = OpTables::from_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("f.csv:2"), "{e}");
        std::fs::write(dir.path().join("f.csv"), "op,a\n").unwrap();
        let e = OpTables::from_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("header"), "{e}");
    }

    /// The compiled tables are the CSVs as the runtime parser reads them, row for row.
    #[test]
    fn compiled_tables_equal_the_csvs() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/optables");
        for system in EMBEDDED_SYSTEMS {
            let mut rows = Vec::new();
            for file in compiled::TABLE_FILES {
                let text = std::fs::read_to_string(data.join(system).join(file)).unwrap();
                parse_csv(&text, &mut rows).unwrap();
            }
            let compiled = compiled::decode(compiled_rows(system).unwrap()).unwrap();
            csv::normalise(&mut rows);
            assert_eq!(compiled, rows, "{system}");
            assert_eq!(compiled::decode(&compiled::encode(&rows)).unwrap(), rows);
        }
    }

    #[test]
    fn missing_op_is_an_error() {
        let t = tables("op,x1,x2,x3,latency_ms\na,1,1,1,1\n");
        assert!(matches!(
            t.lookup("b", [1.0; 3], "why"),
            Err(SimError::MissingOp { .. })
        ));
    }

    #[test]
    fn embedded_tables_load() {
        for s in EMBEDDED_SYSTEMS {
            let t = OpTables::embedded(s).unwrap();
            assert!(t.has("gemm/bf16") && t.has("all_reduce/half"), "{s}");
        }
    }
}
