//! What the SVG plots share: a white canvas drawn by plotters into a string, and the
//! palette. Text stays SVG `<text>` (no font is loaded or embedded; the viewer lays it out).

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::cli::error::{CliError, CliResult};
use crate::cli::exit;

pub(super) type Canvas<'a> = DrawingArea<SVGBackend<'a>, Shift>;
pub(super) type Drawn = Result<(), Box<dyn std::error::Error>>;

/// matplotlib's first colours, so the plots read like the ones users already make.
pub(super) const PALETTE: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
];

pub(super) const FAINT: RGBColor = RGBColor(0xbb, 0xbb, 0xbb);

pub(super) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// An SVG document of `size` pixels with what `draw` puts on it.
pub(super) fn svg(size: (u32, u32), draw: impl FnOnce(&Canvas) -> Drawn) -> CliResult<String> {
    let mut out = String::new();
    {
        let canvas = SVGBackend::with_string(&mut out, size).into_drawing_area();
        let drawn = canvas
            .fill(&WHITE)
            .map_err(Into::into)
            .and_then(|()| draw(&canvas))
            .and_then(|()| canvas.present().map_err(Into::into));
        drawn.map_err(|e| CliError::new(exit::OUTPUT, format!("drawing the plot: {e}")))?;
    }
    Ok(out)
}

/// The series' legend at `position`, on a translucent white box.
pub(super) fn legend<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Drawn
where
    X: plotters::coord::ranged1d::Ranged,
    Y: plotters::coord::ranged1d::Ranged,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

/// An axis maximum just above `v` on a round step (about five ticks): 105 gives 125, not
/// the 200 of the next round number, so the data fill the plot.
pub(super) fn axis_max(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let raw = v / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (v / step).floor() * step + step
}

/// A log2 axis over the concurrencies `lo..=hi`, padded by a third of a doubling each side
/// so markers at the first and last level are drawn whole.
pub(super) fn log2_range(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let (a, b) = (lo.max(1.0).log2(), hi.max(lo.max(1.0) * 2.0).log2());
    (a - 0.35)..(b + 0.35)
}

/// A value as a label: three significant figures, no exponent for the sizes plotted.
pub(super) fn value_label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_maxima_sit_just_above_the_data() {
        assert_eq!(axis_max(105.0), 125.0);
        assert_eq!(axis_max(765.6), 800.0);
        assert_eq!(axis_max(100.0), 120.0);
        assert_eq!(axis_max(0.0), 1.0);
        let r = log2_range(1.0, 64.0);
        assert!(r.start < 0.0 && r.end > 6.0);
    }

    #[test]
    fn text_is_escaped_and_the_document_closed() {
        let doc = svg((100, 50), |canvas| {
            canvas.draw(&Text::new("a<b & c", (5, 5), ("sans-serif", 12)))?;
            Ok(())
        })
        .unwrap();
        assert!(
            doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"),
            "{doc}"
        );
        assert!(doc.contains("a&lt;b &amp; c"), "{doc}");
    }
}
