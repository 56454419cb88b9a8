//! The op-table CSV (docs/cost-model.md, "Op-table format") parsed into rows. Only std:
//! the build script compiles the embedded tables with this same parser.

use std::sync::Arc;

/// One measured point: the operator (shared by its rows, so a table of thousands of rows
/// allocates each name once), its axes, its latency in milliseconds.
pub type Row = (Arc<str>, [f64; 3], f64);

pub const HEADER: &str = "op,x1,x2,x3,latency_ms";

/// What is wrong with a table, at a 1-based line.
#[derive(Debug)]
pub struct CsvError {
    pub line: usize,
    pub message: String,
}

/// Rows in the order tables are built from: by operator, then axis by axis; of rows with
/// the same key, the first read wins (stable, documented).
pub fn normalise(rows: &mut Vec<Row>) {
    rows.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(a.1[0].total_cmp(&b.1[0]))
            .then(a.1[1].total_cmp(&b.1[1]))
            .then(a.1[2].total_cmp(&b.1[2]))
    });
    rows.dedup_by(|b, a| a.0 == b.0 && a.1 == b.1);
}

pub fn parse_csv(text: &str, out: &mut Vec<Row>) -> Result<(), CsvError> {
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|(_, l)| l.trim()).unwrap_or("");
    if header != HEADER {
        return Err(CsvError {
            line: 1,
            message: format!("header is `{header}`, expected `{HEADER}`"),
        });
    }
    for (i, line) in lines {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |message: String| CsvError {
            line: i + 1,
            message,
        };
        let mut fields = line.split(',');
        let mut f = [""; 5];
        let mut n = 0;
        for field in fields.by_ref().take(5) {
            f[n] = field;
            n += 1;
        }
        let n = n + fields.count();
        if n != 5 {
            return Err(bad(format!("expected 5 fields, found {n}")));
        }
        let num = |s: &str, what: &str| -> Result<f64, CsvError> {
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| bad(format!("{what} `{s}` is not a positive number")))
        };
        let op = f[0].trim();
        let name = match out.last() {
            Some((last, _, _)) if &**last == op => Arc::clone(last),
            _ => Arc::from(op),
        };
        out.push((
            name,
            [num(f[1], "x1")?, num(f[2], "x2")?, num(f[3], "x3")?],
            num(f[4], "latency_ms")?,
        ));
    }
    Ok(())
}
