//! A search's frontier as SVG: output throughput against per-request speed, every level
//! that ran faint behind the frontier's line, the chosen configuration ringed and named.

use plotters::prelude::*;

use kbench_search::report::SearchReport;

use super::chart::{self, colour, nice_ceiling, FAINT};
use crate::cli::error::CliResult;

pub fn frontier_svg(r: &SearchReport) -> CliResult<String> {
    let frontier: Vec<(f64, f64)> = r
        .frontier
        .iter()
        .map(|p| (p.per_request_output_throughput, p.output_throughput))
        .collect();
    let x_max = nice_ceiling(frontier.iter().map(|p| p.0).fold(1.0, f64::max) * 1.05);
    let y_max = nice_ceiling(frontier.iter().map(|p| p.1).fold(1.0, f64::max) * 1.05);
    let ran: Vec<(f64, f64)> = r
        .candidates
        .iter()
        .filter(|c| c.in_space)
        .flat_map(|c| &c.levels)
        .map(|l| (l.per_request_output_throughput, l.output_throughput))
        .filter(|&(x, y)| x <= x_max && y <= y_max)
        .collect();
    let chosen = r.ranked.first().and_then(|&w| {
        let c = &r.candidates[w];
        c.at.as_ref().map(|m| {
            (
                (m.per_request_output_throughput, m.output_throughput),
                c.label.clone(),
            )
        })
    });
    let (line, red) = (colour(0), colour(1));
    chart::svg((720, 460), |canvas| {
        let mut chart = ChartBuilder::on(canvas)
            .caption(
                format!(
                    "{}: output throughput against per-request speed",
                    r.experiment
                ),
                ("sans-serif", 17),
            )
            .margin(14)
            .x_label_area_size(42)
            .y_label_area_size(58)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_labels(6)
            .y_labels(6)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(WHITE)
            .x_desc("per-request output tok/s")
            .y_desc("output tok/s")
            .draw()?;
        chart
            .draw_series(ran.iter().map(|&p| Circle::new(p, 2, FAINT.filled())))?
            .label("a level that ran")
            .legend(|(x, y)| Circle::new((x + 9, y), 2, FAINT.filled()));
        chart
            .draw_series(LineSeries::new(frontier.clone(), line.stroke_width(2)))?
            .label("frontier")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], line.stroke_width(2)));
        chart.draw_series(frontier.iter().map(|&p| Circle::new(p, 4, line.filled())))?;
        if let Some((at, label)) = chosen {
            chart.draw_series(std::iter::once(
                EmptyElement::at(at)
                    + Circle::new((0, 0), 8, red.stroke_width(2))
                    + Text::new(
                        format!("chosen: {label}"),
                        (12, -20),
                        ("sans-serif", 13).into_font().color(&red),
                    ),
            ))?;
        }
        chart::legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    })
}
