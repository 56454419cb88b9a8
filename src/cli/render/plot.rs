//! Output throughput against concurrency (log2 axis), one line per variant, reference
//! points as hollow markers. Plain SVG text: no font or rendering dependency.

use std::fmt::Write;

use kbench_core::report::Report;

const W: f64 = 720.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

pub fn throughput_svg(reports: &[Report]) -> String {
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
pub fn labelled_throughput_svg(reports: &[Report], labels: &[String], title: &str) -> String {
    let concurrencies: Vec<u32> = reports
        .iter()
        .flat_map(|r| closed_loop(r).map(|m| m.concurrency))
        .collect();
    let c_min = concurrencies.iter().copied().min().unwrap_or(1).max(1) as f64;
    let c_max = (concurrencies.iter().copied().max().unwrap_or(1) as f64).max(c_min * 2.0);
    let y_max_data = reports
        .iter()
        .flat_map(|r| {
            r.levels.iter().map(|m| m.output_throughput).chain(
                r.reference
                    .iter()
                    .flat_map(|x| x.points.iter().map(|p| p.reference)),
            )
        })
        .fold(1.0f64, f64::max);
    let y_max = nice_ceiling(y_max_data * 1.05);
    let x = |c: f64| {
        LEFT + (c.log2() - c_min.log2()) / (c_max.log2() - c_min.log2()) * (W - LEFT - RIGHT)
    };
    let y = |v: f64| H - BOTTOM - v / y_max * (H - TOP - BOTTOM);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let title = esc(title);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="15">{title}: output throughput vs concurrency</text>"#
    );
    // Axes and grid.
    for i in 0..=5 {
        let v = y_max * i as f64 / 5.0;
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    let mut c = c_min;
    while c <= c_max * 1.0001 {
        let xx = x(c);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{c:.0}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0
        );
        c *= 2.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">concurrency (closed-loop clients)</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">output tok/s</text>"#,
        (TOP + H - BOTTOM) / 2.0
    );
    for (i, r) in reports.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = closed_loop(r)
            .map(|m| {
                format!(
                    "{:.1},{:.1}",
                    x(m.concurrency as f64),
                    y(m.output_throughput)
                )
            })
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        for m in closed_loop(r) {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x(m.concurrency as f64),
                y(m.output_throughput)
            );
        }
        let name = esc(&labels[i]);
        let ly = TOP + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            W - RIGHT + 10.0,
            W - RIGHT + 28.0,
            W - RIGHT + 32.0,
            ly + 4.0
        );
        if let Some(reference) = &r.reference {
            for p in &reference.points {
                let c = match (p.metric.as_str(), p.concurrency) {
                    ("saturation_output_throughput", _) => r.saturation_concurrency as f64,
                    (_, Some(c)) => c as f64,
                    _ => continue,
                };
                if p.metric != "output_throughput" && p.metric != "saturation_output_throughput" {
                    continue;
                }
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{:.1}" width="9" height="9" fill="none" stroke="{color}" stroke-width="2"><title>{}: measured {}</title></rect>"#,
                    x(c) - 4.5,
                    y(p.reference) - 4.5,
                    esc(&p.label),
                    p.reference
                );
            }
        }
    }
    let ly = TOP + 16.0 * reports.len() as f64 + 8.0;
    let _ = writeln!(
        s,
        r##"<rect x="{:.1}" y="{:.1}" width="9" height="9" fill="none" stroke="#444" stroke-width="2"/><text x="{:.1}" y="{:.1}">measured (reference)</text>"##,
        W - RIGHT + 14.0,
        ly - 4.5,
        W - RIGHT + 32.0,
        ly + 4.0
    );
    s.push_str("</svg>\n");
    s
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

/// Text escaped for SVG.
pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The concurrency levels: the axis is clients, so request-rate levels are left out.
fn closed_loop(r: &Report) -> impl Iterator<Item = &kbench_core::metrics::LevelMetrics> {
    r.levels.iter().filter(|m| m.request_rate.is_none())
}
