//! The fidelity report as a table.

use std::io::{self, Write};

use kbench_sim::fidelity::{ErrorStats, FidelityReport};

use super::table::{wrap, write_grouped_rows, write_rows};

/// The targets on `check` points: (metric, median, P90) in absolute %. TTFT's holds for
/// whichever statistic a source reports, its mean or its median.
const TARGETS: [(&str, f64, Option<f64>); 6] = [
    ("mean_tpot_ms", 5.0, Some(10.0)),
    ("output_throughput", 5.0, Some(10.0)),
    ("decode_throughput", 5.0, Some(10.0)),
    ("speedup", 5.0, Some(10.0)),
    ("mean_ttft_ms", 15.0, None),
    ("median_ttft_ms", 15.0, None),
];

pub fn write_fidelity(out: &mut dyn Write, r: &FidelityReport) -> io::Result<()> {
    writeln!(out, "== fidelity: {} points", r.points.len())?;
    // grouped by source and engine, so the rows fit a 100-column terminal
    let header: Vec<String> = [
        "case",
        "role",
        "metric",
        "C",
        "measured",
        "predicted",
        "error",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut groups: Vec<(String, Vec<Vec<String>>)> = Vec::new();
    for p in &r.points {
        let heading = format!("{}: {}", p.source, p.engine);
        if groups.last().is_none_or(|(h, _)| *h != heading) {
            groups.push((heading, Vec::new()));
        }
        // ratios and accept lengths sit near 1-4: a third decimal is their resolution
        let value = |v: f64| {
            if matches!(p.metric.as_str(), "speedup" | "accept_length") {
                format!("{v:.3}")
            } else {
                format!("{v:.2}")
            }
        };
        let rows = &mut groups.last_mut().expect("pushed above").1;
        rows.push(vec![
            p.case.clone(),
            p.role.name().into(),
            p.metric.clone(),
            p.concurrency
                .map(|c| c.to_string())
                .unwrap_or_else(|| "sat".into()),
            value(p.measured),
            value(p.predicted),
            format!("{:+.1}%", p.error_pct),
        ]);
    }
    write_grouped_rows(out, &header, &groups)?;
    for f in &r.failed {
        writeln!(
            out,
            "   not run: {}/{} ({}, {} points): {}",
            f.source,
            f.case,
            f.role.name(),
            f.points,
            f.error
        )?;
    }
    writeln!(out)?;
    writeln!(out, "== summary: absolute % error")?;
    let mut rows = vec![["role", "metric", "n", "median", "P90", "max", "target"]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()];
    let mut worst = Vec::new();
    for (role, metrics) in &r.summary {
        for (metric, s) in metrics {
            worst.push(format!("{role} {metric}: {}", s.worst));
            let target = TARGETS
                .iter()
                .find(|t| role == "check" && t.0 == metric)
                .map(|t| {
                    let met = s.median_abs_pct <= t.1 && t.2.is_none_or(|p90| s.p90_abs_pct <= p90);
                    let verdict = if met { "met" } else { "missed" };
                    match t.2 {
                        Some(p90) => format!("<= {:.0} / {:.0} {verdict}", t.1, p90),
                        None => format!("<= {:.0} median {verdict}", t.1),
                    }
                })
                .unwrap_or_else(|| "-".into());
            let mut row = vec![role.clone(), metric.clone()];
            row.extend(stat_cells(s));
            row.push(target);
            rows.push(row);
        }
    }
    write_rows(out, &rows)?;
    writeln!(out, "   the largest error of each:")?;
    for w in &worst {
        writeln!(out, "     {w}")?;
    }
    writeln!(out)?;
    writeln!(out, "== check points by source: absolute % error")?;
    let mut rows = vec![["source", "metric", "n", "median", "P90", "max"]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()];
    for (source, metrics) in &r.check_by_source {
        for (metric, s) in metrics {
            let mut row = vec![source.clone(), metric.clone()];
            row.extend(stat_cells(s));
            rows.push(row);
        }
    }
    write_rows(out, &rows)?;
    writeln!(out)?;
    writeln!(out, "== engine profiles")?;
    for (name, u) in &r.engine_profiles {
        match (&u.fitted_to[..], &u.held_out) {
            ([], _) => writeln!(out, "   {name}: priors, fitted to nothing")?,
            (to, held) => {
                writeln!(
                    out,
                    "   {name}: fitted to the `fit` points of {}",
                    to.join(", ")
                )?;
                let held = format!("held apart: {}", held.as_deref().unwrap_or("-"));
                for line in wrap(&held, 92) {
                    writeln!(out, "     {line}")?;
                }
            }
        }
    }
    Ok(())
}

/// A summary row's count and its median, P90 and largest absolute error.
fn stat_cells(s: &ErrorStats) -> [String; 4] {
    [
        s.n.to_string(),
        format!("{:.1}%", s.median_abs_pct),
        format!("{:.1}%", s.p90_abs_pct),
        format!("{:.1}%", s.max_abs_pct),
    ]
}
