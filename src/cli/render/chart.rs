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

/// The axis maximum: the next 1, 2, 2.5 or 5 times a power of ten at or above `v`.
pub(super) fn nice_ceiling(v: f64) -> f64 {
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(753.0), 1000.0);
        assert_eq!(nice_ceiling(201.0), 250.0);
        assert_eq!(nice_ceiling(0.9), 1.0);
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
