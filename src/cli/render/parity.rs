//! The fidelity corpus's parity plots: one panel per metric, each on its own unit, with
//! predicted against measured on log-log axes, the line where they agree and the +-10% band
//! around it, one colour per source; `check` points filled, `fit` points hollow.

use std::collections::BTreeMap;

use kbench_sim::fidelity::{FidelityReport, PointResult};

use super::chart::colour;
use super::panel::{dashboard, Axis, Dot, Panel};
use crate::cli::error::CliResult;

pub fn parity_svg(r: &FidelityReport) -> CliResult<String> {
    let mut sources: Vec<&str> = r.points.iter().map(|p| p.source.as_str()).collect();
    sources.sort_unstable();
    sources.dedup();
    let source_colour = |s: &str| colour(sources.iter().position(|x| *x == s).unwrap_or(0));
    let mut by_metric: BTreeMap<&str, Vec<&PointResult>> = BTreeMap::new();
    for p in &r.points {
        by_metric.entry(p.metric.as_str()).or_default().push(p);
    }
    let panels: Vec<Panel> = by_metric
        .iter()
        .map(|(metric, points)| {
            let values = points.iter().flat_map(|p| [p.measured, p.predicted]);
            let unit = unit_of(metric);
            let axis = Axis::log10(format!("measured {unit} (log)"), values);
            let mut y = axis.clone();
            y.desc = format!("predicted {unit} (log)");
            let checks = points.iter().filter(|p| is_check(p)).count();
            let mut panel = Panel::new(
                format!("{metric}: {} points, {checks} check", points.len()),
                axis,
                y,
            );
            panel.parity = true;
            panel.dots = points
                .iter()
                .map(|p| Dot {
                    at: (p.measured, p.predicted),
                    colour: source_colour(&p.source),
                    filled: is_check(p),
                })
                .collect();
            panel
        })
        .collect();
    let mut panels = panels;
    // the sources' colours and the fill's meaning, once, in the first panel
    if let Some(first) = panels.first_mut() {
        first.dot_legend = sources
            .iter()
            .map(|s| (s.to_string(), source_colour(s), true))
            .collect();
        first
            .dot_legend
            .push(("filled: check, hollow: fit".into(), colour(7), false));
    }
    let columns = if panels.len() > 1 { 2 } else { 1 };
    dashboard("predicted against measured", columns, (560, 520), &panels)
}

fn is_check(p: &PointResult) -> bool {
    p.role.name() == "check"
}

/// The unit a metric is measured in, from its name as reports spell it.
fn unit_of(metric: &str) -> &'static str {
    if metric.ends_with("_ms") {
        "ms"
    } else if metric.contains("throughput") {
        "tok/s"
    } else if metric.contains("speedup") {
        "x"
    } else if metric.contains("accept") {
        "tokens per round"
    } else {
        "(as reported)"
    }
}
