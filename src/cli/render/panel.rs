//! One chart of a dashboard: axes that may be logarithmic, lines with labelled points,
//! and labelled reference markers, laid out so that nothing is drawn past the plot's edge.
//! Coordinates are plotted as their logarithm where an axis is logarithmic, so every panel
//! is the same plotters chart type and one function draws them all.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::chart::{self, axis_max, value_label, Canvas, Drawn, FAINT};

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Scale {
    Linear,
    /// Concurrency and request rate: each doubling one step.
    Log2,
    /// Latencies that span decades.
    Log10,
}

#[derive(Clone)]
pub(super) struct Axis {
    pub desc: String,
    pub scale: Scale,
    /// In plotted coordinates (the logarithm on a log axis).
    range: std::ops::Range<f64>,
}

impl Axis {
    /// From zero to just above the largest of `values`.
    pub fn linear(desc: impl Into<String>, values: impl IntoIterator<Item = f64>) -> Axis {
        let max = finite(values).fold(0.0, f64::max);
        Axis {
            desc: desc.into(),
            scale: Scale::Linear,
            range: 0.0..axis_max(max * 1.04),
        }
    }

    /// A log2 axis over `values`, padded so markers at the ends are drawn whole.
    pub fn log2(desc: impl Into<String>, values: impl IntoIterator<Item = f64>) -> Axis {
        let (lo, hi) = bounds(values.into_iter().filter(|v| *v > 0.0));
        Axis {
            desc: desc.into(),
            scale: Scale::Log2,
            range: chart::log2_range(lo, hi),
        }
    }

    /// A log10 axis over `values`, padded by a fifth of a decade each side.
    pub fn log10(desc: impl Into<String>, values: impl IntoIterator<Item = f64>) -> Axis {
        let (lo, hi) = bounds(values.into_iter().filter(|v| *v > 0.0));
        let (a, b) = (lo.log10(), hi.max(lo * 1.5).log10());
        Axis {
            desc: desc.into(),
            scale: Scale::Log10,
            range: (a - 0.2)..(b + 0.2),
        }
    }

    /// Where a data value is plotted; None for one a log axis cannot show.
    pub fn to_plot(&self, v: f64) -> Option<f64> {
        if !v.is_finite() {
            return None;
        }
        match self.scale {
            Scale::Linear => Some(v),
            Scale::Log2 => (v > 0.0).then(|| v.log2()),
            Scale::Log10 => (v > 0.0).then(|| v.log10()),
        }
    }

    fn tick_label(&self, at: f64) -> String {
        match self.scale {
            Scale::Linear => value_label(at),
            // concurrencies are whole doublings; a half-step tick would name a fraction
            Scale::Log2 if (at - at.round()).abs() > 1e-6 => String::new(),
            Scale::Log2 => format!("{}", 2f64.powf(at.round())),
            Scale::Log10 => value_label(10f64.powf(at)),
        }
    }

    fn ticks(&self) -> usize {
        let span = self.range.end - self.range.start;
        match self.scale {
            Scale::Linear => 6,
            Scale::Log2 => (span.floor() as usize + 1).clamp(2, 12),
            Scale::Log10 => ((span * 2.0).ceil() as usize + 1).clamp(3, 8),
        }
    }

    /// How far into the axis `at` lies, 0 to 1.
    fn fraction(&self, at: f64) -> f64 {
        (at - self.range.start) / (self.range.end - self.range.start)
    }
}

fn finite(values: impl IntoIterator<Item = f64>) -> impl Iterator<Item = f64> {
    values.into_iter().filter(|v| v.is_finite())
}

fn bounds(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = finite(values).fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo.is_finite() {
        (lo, hi)
    } else {
        (1.0, 2.0)
    }
}

pub(super) struct Line {
    /// Shown in the panel's legend; None: the line is named in another panel.
    pub legend: Option<String>,
    pub colour: RGBColor,
    pub dashed: bool,
    /// Data coordinates, in the order they are joined.
    pub points: Vec<(f64, f64)>,
    /// Beside each point, where not empty.
    pub point_labels: Vec<String>,
}

pub(super) struct Dot {
    pub at: (f64, f64),
    pub colour: RGBColor,
    pub filled: bool,
}

/// The parity plot's band: within 10% of measured.
const PARITY_BAND: f64 = 0.10;
const BAND: RGBColor = RGBColor(0xee, 0xee, 0xee);
const DIAGONAL: RGBColor = RGBColor(0x88, 0x88, 0x88);

/// A point called out: a hollow square (a measurement) or a ring (a winner), and what
/// it says.
pub(super) struct Marker {
    pub at: (f64, f64),
    pub colour: RGBColor,
    pub text: String,
    pub ring: bool,
    /// Text lines to move the label down by, so labels of nearby markers do not overlap.
    pub stack: i32,
}

pub(super) struct Panel {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    /// Points drawn faint behind everything, with their legend entry.
    pub scatter: Vec<(f64, f64)>,
    pub scatter_legend: Option<String>,
    pub lines: Vec<Line>,
    pub markers: Vec<Marker>,
    /// Points as they are, filled or hollow; with legend entries (name, colour, filled).
    pub dots: Vec<Dot>,
    pub dot_legend: Vec<(String, RGBColor, bool)>,
    /// Predicted against measured: the diagonal and the band within `PARITY_BAND` of it.
    pub parity: bool,
    /// Legend entries for styles rather than series: ("p99", dashed).
    pub styles: Vec<(String, bool)>,
    /// The legend's entry for the markers, where there are any.
    pub marker_legend: Option<String>,
    pub legend_at: SeriesLabelPosition,
}

impl Panel {
    pub fn new(title: impl Into<String>, x: Axis, y: Axis) -> Panel {
        Panel {
            title: title.into(),
            x,
            y,
            scatter: Vec::new(),
            scatter_legend: None,
            lines: Vec::new(),
            markers: Vec::new(),
            dots: Vec::new(),
            dot_legend: Vec::new(),
            parity: false,
            styles: Vec::new(),
            marker_legend: None,
            legend_at: SeriesLabelPosition::UpperLeft,
        }
    }

    fn plotted(&self, (x, y): (f64, f64)) -> Option<(f64, f64)> {
        Some((self.x.to_plot(x)?, self.y.to_plot(y)?))
    }

    /// Text beside a point, turned inward near the right and top edges so it stays inside.
    fn label_offset(&self, at: (f64, f64), text: &str) -> (i32, i32) {
        let width = 6 * text.chars().count() as i32;
        let dx = if self.x.fraction(at.0) > 0.62 {
            -width - 8
        } else {
            7
        };
        let dy = if self.y.fraction(at.1) > 0.88 { 6 } else { -14 };
        (dx, dy)
    }
}

/// Label boxes already drawn on a panel, in pixels: a new label moves up or down, a
/// line at a time, to the nearest place that overlaps none of them and stays inside the
/// plotting area (end-of-line values of close series used to print over each other).
struct Placed {
    boxes: Vec<[i32; 4]>,
    inside: [i32; 4],
}

/// Text height and width per character at the labels' 10 px font, with a little air.
const LABEL_HEIGHT: i32 = 12;
const LABEL_CHAR_WIDTH: i32 = 6;

impl Placed {
    fn new(x: std::ops::Range<i32>, y: std::ops::Range<i32>) -> Placed {
        Placed {
            boxes: Vec::new(),
            inside: [x.start, y.start, x.end, y.end],
        }
    }

    /// Where, from `anchor`, to draw `text` first asked for at `offset`.
    fn place(&mut self, anchor: (i32, i32), offset: (i32, i32), text: &str) -> (i32, i32) {
        let width = LABEL_CHAR_WIDTH * text.chars().count() as i32;
        let at = |dy: i32| {
            let (x, y) = (anchor.0 + offset.0, anchor.1 + dy);
            [x, y, x + width, y + LABEL_HEIGHT]
        };
        let free = |b: &[i32; 4]| {
            let [x0, y0, x1, y1] = self.inside;
            b[1] >= y0
                && b[3] <= y1
                && b[0] >= x0
                && b[2] <= x1
                && !self
                    .boxes
                    .iter()
                    .any(|o| b[0] < o[2] && o[0] < b[2] && b[1] < o[3] && o[1] < b[3])
        };
        let chosen = [0, -1, 1, -2, 2, -3, 3, -4, 4]
            .into_iter()
            .map(|k| offset.1 + k * LABEL_HEIGHT)
            .find(|&dy| free(&at(dy)))
            .unwrap_or(offset.1);
        self.boxes.push(at(chosen));
        (offset.0, chosen)
    }
}

pub(super) fn draw(area: &Canvas, p: &Panel) -> Drawn {
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(p.x.range.clone(), p.y.range.clone())?;
    let (x_axis, y_axis) = (&p.x, &p.y);
    chart
        .configure_mesh()
        .x_labels(x_axis.ticks())
        .y_labels(y_axis.ticks())
        .x_label_formatter(&|v| x_axis.tick_label(*v))
        .y_label_formatter(&|v| y_axis.tick_label(*v))
        .light_line_style(WHITE)
        .x_desc(x_axis.desc.as_str())
        .y_desc(y_axis.desc.as_str())
        .draw()?;
    let (px, py) = chart.plotting_area().get_pixel_range();
    let mut placed = Placed::new(px, py);
    // markers carry the measurements: theirs are placed first and never move for a line's
    let marker_offsets: Vec<Option<(i32, i32)>> = p
        .markers
        .iter()
        .map(|m| {
            let at = p.plotted(m.at)?;
            let (dx, dy) = p.label_offset(at, &m.text);
            Some(placed.place(
                chart.backend_coord(&at),
                (dx, dy + LABEL_HEIGHT * m.stack),
                &m.text,
            ))
        })
        .collect();
    let mut any_legend = false;
    if p.parity {
        any_legend = true;
        draw_parity_guides(&mut chart, &p.x)?;
    }
    if !p.scatter.is_empty() {
        let faint = chart.draw_series(
            p.scatter
                .iter()
                .filter_map(|&q| p.plotted(q))
                .map(|q| Circle::new(q, 2, FAINT.filled())),
        )?;
        if let Some(label) = &p.scatter_legend {
            any_legend = true;
            faint
                .label(label.as_str())
                .legend(|(x, y)| Circle::new((x + 9, y), 2, FAINT.filled()));
        }
    }
    for line in &p.lines {
        let c = line.colour;
        let points: Vec<(f64, f64)> = line.points.iter().filter_map(|&q| p.plotted(q)).collect();
        let drawn = if line.dashed {
            chart.draw_series(DashedLineSeries::new(
                points.clone(),
                6,
                4,
                c.stroke_width(1),
            ))?
        } else {
            chart.draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?
        };
        if let Some(label) = &line.legend {
            any_legend = true;
            drawn
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], c.stroke_width(2)));
        }
        let size = if line.dashed { 2 } else { 3 };
        chart.draw_series(points.iter().map(|&q| Circle::new(q, size, c.filled())))?;
        let labelled = line
            .points
            .iter()
            .zip(&line.point_labels)
            .filter(|(_, text)| !text.is_empty())
            .filter_map(|(&q, text)| Some((p.plotted(q)?, text)));
        let offsets: Vec<_> = labelled
            .map(|(at, text)| {
                let offset = placed.place(chart.backend_coord(&at), p.label_offset(at, text), text);
                (at, text, offset)
            })
            .collect();
        chart.draw_series(offsets.into_iter().map(|(at, text, offset)| {
            EmptyElement::at(at)
                + Text::new(
                    text.clone(),
                    offset,
                    ("sans-serif", 10).into_font().color(&c),
                )
        }))?;
    }
    chart.draw_series(p.dots.iter().filter_map(|d| {
        let at = p.plotted(d.at)?;
        let style = if d.filled {
            d.colour.filled()
        } else {
            d.colour.stroke_width(1)
        };
        Some(Circle::new(at, 4, style))
    }))?;
    for (name, c, filled) in &p.dot_legend {
        any_legend = true;
        let style = if *filled {
            c.filled()
        } else {
            c.stroke_width(1)
        };
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label(name.as_str())
            .legend(move |(x, y)| Circle::new((x + 9, y), 4, style));
    }
    for (name, dashed) in &p.styles {
        any_legend = true;
        let dashed = *dashed;
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label(name.as_str())
            .legend(move |(x, y)| {
                let style = BLACK.stroke_width(if dashed { 1 } else { 2 });
                let segments: Vec<(i32, i32)> = if dashed {
                    vec![(x, y), (x + 6, y)]
                } else {
                    vec![(x, y), (x + 18, y)]
                };
                PathElement::new(segments, style)
            });
    }
    for (m, offset) in p.markers.iter().zip(marker_offsets) {
        let (Some(at), Some(offset)) = (p.plotted(m.at), offset) else {
            continue;
        };
        let c = m.colour;
        let shape: DynElement<SVGBackend, (i32, i32)> = if m.ring {
            Circle::new((0, 0), 8, c.stroke_width(2)).into_dyn()
        } else {
            Rectangle::new([(-5, -5), (5, 5)], c.stroke_width(2)).into_dyn()
        };
        chart.draw_series(std::iter::once(
            EmptyElement::at(at)
                + shape
                + Text::new(
                    m.text.clone(),
                    offset,
                    ("sans-serif", 10).into_font().color(&c),
                ),
        ))?;
    }
    if let (Some(label), false) = (&p.marker_legend, p.markers.is_empty()) {
        any_legend = true;
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label(label.as_str())
            .legend(|(x, y)| Rectangle::new([(x + 5, y - 4), (x + 13, y + 4)], BLACK));
    }
    if any_legend {
        chart::legend(&mut chart, p.legend_at.clone())?;
    }
    Ok(())
}

/// The line where predicted equals measured and the band around it, on an axis the
/// panel's x and y share.
fn draw_parity_guides<'a>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    axis: &Axis,
) -> Drawn {
    let (a, b) = (axis.range.start, axis.range.end);
    // on a log axis a ratio is a constant offset
    let (up, down) = match axis.scale {
        Scale::Linear => {
            return Err("a parity panel needs a logarithmic axis".into());
        }
        Scale::Log2 => ((1.0 + PARITY_BAND).log2(), (1.0 - PARITY_BAND).log2()),
        Scale::Log10 => ((1.0 + PARITY_BAND).log10(), (1.0 - PARITY_BAND).log10()),
    };
    chart
        .draw_series(std::iter::once(Polygon::new(
            vec![
                (a, a),
                (a, a + up),
                (b - up, b),
                (b, b),
                (b, b + down),
                (a - down, a),
            ],
            BAND.filled(),
        )))?
        .label(format!("within {:.0}%", PARITY_BAND * 100.0))
        .legend(|(x, y)| Rectangle::new([(x + 2, y - 5), (x + 16, y + 5)], BAND.filled()));
    chart
        .draw_series(LineSeries::new([(a, a), (b, b)], DIAGONAL))?
        .label("predicted = measured")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], DIAGONAL));
    Ok(())
}

/// Panels side by side, `columns` to a row, under one title.
pub(super) fn dashboard(
    title: &str,
    columns: usize,
    (width, height): (u32, u32),
    panels: &[Panel],
) -> crate::cli::error::CliResult<String> {
    let columns = columns.max(1);
    let rows = panels.len().div_ceil(columns).max(1);
    let size = (width * columns as u32, 40 + height * rows as u32);
    chart::svg(size, |canvas| {
        let body = canvas.titled(title, ("sans-serif", 18))?;
        for (area, panel) in body.split_evenly((rows, columns)).iter().zip(panels) {
            draw(area, panel)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_axes_pad_their_ends_and_refuse_what_they_cannot_show() {
        let x = Axis::log2("c", [1.0, 64.0]);
        assert!(x.range.start < 0.0 && x.range.end > 6.0);
        assert_eq!(x.to_plot(0.0), None);
        assert_eq!(x.tick_label(3.0), "8");
        assert_eq!(x.tick_label(2.5), "");
        let y = Axis::log10("ms", [10.0, 1000.0]);
        assert!(y.range.start < 1.0 && y.range.end > 3.0);
        assert_eq!(y.tick_label(2.0), "100");
        let l = Axis::linear("tok/s", [105.0, f64::NAN]);
        assert_eq!(l.range, 0.0..125.0);
    }

    #[test]
    fn labels_near_the_right_edge_turn_inward() {
        let p = Panel::new("t", Axis::linear("x", [100.0]), Axis::linear("y", [100.0]));
        assert!(p.label_offset((100.0, 10.0), "label").0 < 0);
        assert!(p.label_offset((1.0, 10.0), "label").0 > 0);
    }

    #[test]
    fn close_labels_move_apart_and_stay_inside() {
        let mut placed = Placed::new(0..400, 0..300);
        // two series ending on nearly the same value, labelled at the same spot
        let a = placed.place((300, 100), (7, -14), "775");
        let b = placed.place((300, 102), (7, -14), "767");
        assert_eq!(a, (7, -14));
        assert!((a.1 - (b.1 + 2)).abs() >= LABEL_HEIGHT, "{a:?} {b:?}");
        // at the top edge a label goes down, not out
        let c = placed.place((50, 3), (7, -14), "top");
        assert!(3 + c.1 >= 0, "{c:?}");
    }
}
