//! Output throughput against concurrency (log2 axis), one line per variant, measured
//! reference points as hollow squares.

use plotters::prelude::*;

use kbench_core::metrics::LevelMetrics;
use kbench_core::report::Report;

use super::chart::{self, colour, nice_ceiling};
use crate::cli::error::CliResult;

pub fn throughput_svg(reports: &[Report]) -> CliResult<String> {
    let labels: Vec<String> = reports
        .iter()
        .map(|r| {
            r.experiment
                .variant
                .clone()
                .unwrap_or_else(|| format!("{} ({})", r.experiment.name, r.backend.name))
        })
        .collect();
    let title = reports
        .first()
        .map(|r| r.experiment.name.clone())
        .unwrap_or_default();
    labelled_throughput_svg(reports, &labels, &title)
}

/// [`throughput_svg`] with a label per report and a title of the caller's choosing.
pub fn labelled_throughput_svg(
    reports: &[Report],
    labels: &[String],
    title: &str,
) -> CliResult<String> {
    let concurrencies: Vec<u32> = reports
        .iter()
        .flat_map(|r| closed_loop(r).map(|m| m.concurrency))
        .collect();
    let c_min = concurrencies.iter().copied().min().unwrap_or(1).max(1) as f64;
    let c_max = (concurrencies.iter().copied().max().unwrap_or(1) as f64).max(c_min * 2.0);
    // the x axis is log2(concurrency), labelled with the concurrency itself
    let (x0, x1) = (c_min.log2(), c_max.log2());
    let y_max = nice_ceiling(
        reports
            .iter()
            .flat_map(|r| {
                let measured = reference_points(r).map(|(_, v)| v);
                r.levels.iter().map(|m| m.output_throughput).chain(measured)
            })
            .fold(1.0f64, f64::max)
            * 1.05,
    );
    let any_reference = reports.iter().any(|r| reference_points(r).next().is_some());
    chart::svg((720, 440), |canvas| {
        let mut chart = ChartBuilder::on(canvas)
            .caption(
                format!("{title}: output throughput vs concurrency"),
                ("sans-serif", 17),
            )
            .margin(14)
            .x_label_area_size(42)
            .y_label_area_size(58)
            .build_cartesian_2d(x0..x1, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_labels((x1 - x0).round() as usize + 1)
            .x_label_formatter(&|v| format!("{}", 2f64.powf(*v).round()))
            .y_labels(6)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(WHITE)
            .x_desc("concurrency (closed-loop clients)")
            .y_desc("output tok/s")
            .draw()?;
        for (i, r) in reports.iter().enumerate() {
            let c = colour(i);
            let points: Vec<(f64, f64)> = closed_loop(r)
                .map(|m| ((m.concurrency as f64).log2(), m.output_throughput))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?
                .label(labels[i].as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], c.stroke_width(2)));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
            chart.draw_series(reference_points(r).map(|(conc, v)| {
                EmptyElement::at((conc.log2(), v))
                    + Rectangle::new([(-4, -4), (5, 5)], c.stroke_width(2))
            }))?;
        }
        if any_reference {
            chart
                .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
                .label("measured (reference)")
                .legend(|(x, y)| Rectangle::new([(x + 5, y - 4), (x + 13, y + 4)], BLACK));
        }
        chart::legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        Ok(())
    })
}

/// The concurrency levels: the axis is clients, so request-rate levels are left out.
fn closed_loop(r: &Report) -> impl Iterator<Item = &LevelMetrics> {
    r.levels.iter().filter(|m| m.request_rate.is_none())
}

/// The report's measured throughputs as (concurrency, tok/s); a saturation number sits at
/// the concurrency the run saturated at.
fn reference_points(r: &Report) -> impl Iterator<Item = (f64, f64)> + '_ {
    r.reference.iter().flat_map(move |reference| {
        reference
            .points
            .iter()
            .filter_map(move |p| match (p.metric.as_str(), p.concurrency) {
                ("saturation_output_throughput", _) => {
                    Some((r.saturation_concurrency as f64, p.reference))
                }
                ("output_throughput", Some(c)) => Some((c as f64, p.reference)),
                _ => None,
            })
    })
}
