//! The fidelity corpus's parity plot: predicted against measured on log-log axes, the
//! line where they agree and the +-10% band around it, one colour per source; `check`
//! points filled, `fit` points hollow.

use plotters::prelude::*;

use kbench_sim::fidelity::FidelityReport;

use super::chart::{self, colour};
use crate::cli::error::CliResult;

const BAND: RGBColor = RGBColor(0xee, 0xee, 0xee);
const DIAGONAL: RGBColor = RGBColor(0x88, 0x88, 0x88);

pub fn parity_svg(r: &FidelityReport) -> CliResult<String> {
    let values: Vec<f64> = r
        .points
        .iter()
        .flat_map(|p| [p.measured, p.predicted])
        .filter(|v| *v > 0.0 && v.is_finite())
        .collect();
    let lo = values
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1e-9);
    let hi = values.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    let (a, b) = (lo / 1.5, hi * 1.5);
    let mut sources: Vec<&str> = r.points.iter().map(|p| p.source.as_str()).collect();
    sources.sort_unstable();
    sources.dedup();
    chart::svg((680, 680), |canvas| {
        let mut chart = ChartBuilder::on(canvas)
            .caption("predicted against measured", ("sans-serif", 17))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d((a..b).log_scale(), (a..b).log_scale())?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_label_formatter(&|v| format!("{v}"))
            .y_label_formatter(&|v| format!("{v}"))
            .x_desc("measured (log; ms or tok/s)")
            .y_desc("predicted (log)")
            .draw()?;
        chart
            .draw_series(std::iter::once(Polygon::new(
                vec![(a, a * 1.1), (b / 1.1, b), (b, b * 0.9), (a, a * 0.9)],
                BAND.filled(),
            )))?
            .label("within 10%")
            .legend(|(x, y)| Rectangle::new([(x + 2, y - 5), (x + 16, y + 5)], BAND.filled()));
        chart
            .draw_series(LineSeries::new([(a, a), (b, b)], DIAGONAL))?
            .label("predicted = measured")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], DIAGONAL));
        for (i, source) in sources.iter().enumerate() {
            let c = colour(i);
            let of_source = || r.points.iter().filter(move |p| p.source == *source);
            chart
                .draw_series(
                    of_source()
                        .filter(|p| p.role.name() == "check")
                        .map(|p| Circle::new((p.measured, p.predicted), 4, c.filled())),
                )?
                .label(format!("{source} (filled: check)"))
                .legend(move |(x, y)| Circle::new((x + 9, y), 4, c.filled()));
            chart
                .draw_series(
                    of_source()
                        .filter(|p| p.role.name() != "check")
                        .map(|p| Circle::new((p.measured, p.predicted), 4, c.stroke_width(1))),
                )?
                .label(format!("{source} (hollow: fit)"))
                .legend(move |(x, y)| Circle::new((x + 9, y), 4, c.stroke_width(1)));
        }
        chart::legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        Ok(())
    })
}
