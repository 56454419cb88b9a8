//! A search's frontier as SVG, on the axes of the experiment dashboard's frontier panel:
//! output tok/s per GPU against tok/s per user. Every level that ran is faint behind the
//! frontier's line; the three best candidates are ringed and named.

use kbench_search::report::SearchReport;
use plotters::prelude::SeriesLabelPosition;

use super::chart::{colour, value_label};
use super::panel::{dashboard, Axis, Line, Marker, Panel};
use crate::cli::error::CliResult;

const WINNERS_NAMED: usize = 3;

pub fn frontier_svg(r: &SearchReport) -> CliResult<String> {
    let gpus = |candidate: usize| {
        r.candidates
            .get(candidate)
            .and_then(|c| c.config.as_ref())
            .map(|c| c.tp_size.max(1))
            .unwrap_or(1) as f64
    };
    let frontier: Vec<(f64, f64)> = r
        .frontier
        .iter()
        .map(|p| {
            (
                p.per_request_output_throughput,
                p.output_throughput / gpus(p.candidate),
            )
        })
        .collect();
    let ran: Vec<(f64, f64)> = r
        .candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.in_space)
        .flat_map(|(i, c)| {
            let per_gpu = gpus(i);
            c.levels.iter().map(move |l| {
                (
                    l.per_request_output_throughput,
                    l.output_throughput / per_gpu,
                )
            })
        })
        .collect();
    let winners: Vec<Marker> = r
        .ranked
        .iter()
        .take(WINNERS_NAMED)
        .enumerate()
        .filter_map(|(rank, &w)| {
            let c = &r.candidates[w];
            let m = c.at.as_ref()?;
            let name = if rank == 0 {
                "chosen".to_string()
            } else {
                format!("#{}", rank + 1)
            };
            let objective = c
                .objective
                .map(|v| format!(" ({})", value_label(v)))
                .unwrap_or_default();
            Some(Marker {
                at: (
                    m.per_request_output_throughput,
                    m.output_throughput / gpus(w),
                ),
                colour: colour(1),
                text: format!("{name}: {}{objective}", c.label),
                ring: true,
                stack: rank as i32,
            })
        })
        .collect();
    let all = || {
        frontier
            .iter()
            .chain(&ran)
            .copied()
            .chain(winners.iter().map(|m| m.at))
    };
    let x = Axis::linear(
        "tok/s per user (output tokens / E2E latency)",
        all().map(|p| p.0),
    );
    let y = Axis::linear("output tok/s per GPU", all().map(|p| p.1));
    let mut panel = Panel::new(format!("frontier over {} candidates that ran", r.ran), x, y);
    panel.scatter = ran;
    panel.scatter_legend = Some("a level that ran".into());
    panel.lines.push(Line {
        legend: Some("frontier (meets the SLOs)".into()),
        colour: colour(0),
        dashed: false,
        point_labels: Vec::new(),
        points: frontier,
    });
    panel.markers = winners;
    panel.legend_at = SeriesLabelPosition::UpperRight;
    dashboard(
        &format!("{}: throughput per GPU against interactivity", r.experiment),
        1,
        (780, 500),
        &[panel],
    )
}
