//! `kbench compare`: reports side by side, one block per metric, one row per level, each
//! report's value and its difference from the first.

use std::io::{self, Write};

use kbench_core::compare::{metric_at, pct, LevelKey, COMPARED};
use kbench_core::report::Report;

use super::table::{wrap, write_rows};

/// How a report is named in the comparison: its place, file, experiment, variant, backend.
pub fn label(index: usize, file: &str, r: &Report) -> String {
    let variant = r
        .experiment
        .variant
        .as_deref()
        .map(|v| format!(" [{v}]"))
        .unwrap_or_default();
    let partial = if r.partial.is_some() { ", partial" } else { "" };
    format!(
        "#{} {file}: {}{variant} ({}{partial})",
        index + 1,
        r.experiment.name,
        r.backend.name
    )
}

pub fn write_comparison(
    out: &mut dyn Write,
    reports: &[Report],
    labels: &[String],
) -> io::Result<()> {
    writeln!(
        out,
        "== compare ({} reports; differences from #1)",
        reports.len()
    )?;
    for (l, r) in labels.iter().zip(reports) {
        writeln!(out, "   {l}")?;
        for line in wrap(&r.backend.description, 94) {
            writeln!(out, "      {line}")?;
        }
    }
    let mut levels: Vec<LevelKey> = Vec::new();
    for m in reports.iter().flat_map(|r| &r.levels) {
        let k = LevelKey::of(m);
        if !levels.contains(&k) {
            levels.push(k);
        }
    }
    levels.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    for metric in COMPARED {
        let decimals = if metric.contains("throughput") { 1 } else { 2 };
        let mut header = vec!["C".to_string()];
        for i in 0..reports.len() {
            header.push(format!("#{}", i + 1));
            if i > 0 {
                header.push("vs #1".to_string());
            }
        }
        let mut rows = vec![header];
        for &c in &levels {
            let base = metric_at(&reports[0].levels, c, metric);
            let mut row = vec![c.label()];
            let mut any = false;
            for (i, r) in reports.iter().enumerate() {
                let v = metric_at(&r.levels, c, metric);
                any |= v.is_some();
                row.push(match v {
                    Some(v) => format!("{v:.decimals$}"),
                    None => "-".into(),
                });
                if i > 0 {
                    row.push(match (v, base) {
                        (Some(v), Some(b)) => pct(v, b)
                            .map(|p| format!("{p:+.1}%"))
                            .unwrap_or_else(|| "-".into()),
                        _ => "-".into(),
                    });
                }
            }
            if any {
                rows.push(row);
            }
        }
        if rows.len() > 1 {
            writeln!(out, "-- {metric}")?;
            write_rows(out, &rows)?;
        }
    }
    writeln!(out)
}
