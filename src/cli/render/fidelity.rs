//! The fidelity report as a table, and its parity plot.

use std::io::{self, Write};

use kbench_sim::fidelity::{point_label, FidelityReport};

use super::table::write_rows;

/// The targets on `check` points: (metric, median, P90) in absolute %.
const TARGETS: [(&str, f64, Option<f64>); 3] = [
    ("mean_tpot_ms", 5.0, Some(10.0)),
    ("output_throughput", 5.0, Some(10.0)),
    ("mean_ttft_ms", 15.0, None),
];

pub fn write_fidelity(out: &mut dyn Write, r: &FidelityReport) -> io::Result<()> {
    writeln!(out, "== fidelity: {} points", r.points.len())?;
    let mut rows = vec![[
        "source/case",
        "role",
        "engine",
        "metric",
        "C",
        "measured",
        "predicted",
        "error",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect::<Vec<_>>()];
    for p in &r.points {
        rows.push(vec![
            format!("{}/{}", p.source, p.case),
            p.role.name().into(),
            p.engine.clone(),
            p.metric.clone(),
            p.concurrency
                .map(|c| c.to_string())
                .unwrap_or_else(|| "sat".into()),
            format!("{:.2}", p.measured),
            format!("{:.2}", p.predicted),
            format!("{:+.1}%", p.error_pct),
        ]);
    }
    write_rows(out, &rows)?;
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
    let mut rows = vec![[
        "role", "metric", "n", "median", "P90", "max", "target", "worst",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect::<Vec<_>>()];
    for (role, metrics) in &r.summary {
        for (metric, s) in metrics {
            let target = TARGETS
                .iter()
                .find(|t| role == "check" && t.0 == metric)
                .map(|t| match t.2 {
                    Some(p90) => format!("<= {:.0} / {:.0}", t.1, p90),
                    None => format!("<= {:.0} median", t.1),
                })
                .unwrap_or_else(|| "-".into());
            rows.push(vec![
                role.clone(),
                metric.clone(),
                s.n.to_string(),
                format!("{:.1}%", s.median_abs_pct),
                format!("{:.1}%", s.p90_abs_pct),
                format!("{:.1}%", s.max_abs_pct),
                target,
                s.worst.clone(),
            ]);
        }
    }
    write_rows(out, &rows)?;
    writeln!(out)?;
    writeln!(out, "== engine profiles")?;
    for (name, u) in &r.engine_profiles {
        match (&u.fitted_to[..], &u.held_out) {
            ([], _) => writeln!(out, "   {name}: priors, fitted to nothing")?,
            (to, held) => writeln!(
                out,
                "   {name}: fitted to the `fit` points of {}; held apart: {}",
                to.join(", "),
                held.as_deref().unwrap_or("-")
            )?,
        }
    }
    Ok(())
}

/// Measured (x) against predicted (y), log-log, with y = x and the +-10% band; one colour
/// per source.
pub fn parity_svg(r: &FidelityReport) -> String {
    const W: f64 = 640.0;
    const H: f64 = 640.0;
    const M: f64 = 60.0;
    const COLOURS: [&str; 6] = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
    ];
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
    let (l0, l1) = ((lo / 1.5).log10(), (hi * 1.5).log10());
    let px = |v: f64| M + (v.log10() - l0) / (l1 - l0) * (W - 2.0 * M);
    let py = |v: f64| H - M - (v.log10() - l0) / (l1 - l0) * (H - 2.0 * M);
    let mut sources: Vec<&str> = r.points.iter().map(|p| p.source.as_str()).collect();
    sources.dedup();
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let (a, b) = (10f64.powf(l0), 10f64.powf(l1));
    s.push_str(&format!(
        "<polygon points=\"{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\" fill=\"#eeeeee\"/>\n",
        px(a),
        py(a * 1.1),
        px(b / 1.1),
        py(b),
        px(b),
        py(b * 0.9),
        px(a),
        py(a * 0.9)
    ));
    s.push_str(&format!(
        "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>\n",
        px(a),
        py(a),
        px(b),
        py(b)
    ));
    s.push_str(&format!(
        "<rect x=\"{M}\" y=\"{M}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n",
        W - 2.0 * M,
        H - 2.0 * M
    ));
    s.push_str(&format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">measured (log)</text>\n<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">predicted (log)</text>\n",
        W / 2.0,
        H - 16.0,
        H / 2.0,
        H / 2.0
    ));
    for p in &r.points {
        let i = sources.iter().position(|s| *s == p.source).unwrap_or(0);
        let colour = COLOURS[i % COLOURS.len()];
        let fill = if p.role.name() == "check" {
            colour
        } else {
            "none"
        };
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" stroke=\"{colour}\" fill=\"{fill}\"><title>{} {}: measured {:.2}, predicted {:.2} ({:+.1}%)</title></circle>\n",
            px(p.measured),
            py(p.predicted),
            point_label(p),
            p.metric,
            p.measured,
            p.predicted,
            p.error_pct
        ));
    }
    for (i, src) in sources.iter().enumerate() {
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{c}\" stroke=\"{c}\"/><text x=\"{:.1}\" y=\"{:.1}\">{src}</text>\n",
            M + 12.0,
            M + 16.0 + 16.0 * i as f64,
            M + 22.0,
            M + 20.0 + 16.0 * i as f64,
            c = COLOURS[i % COLOURS.len()]
        ));
    }
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\">filled: check, hollow: fit; grey band: +-10%</text>\n</svg>\n",
        M + 12.0,
        M + 20.0 + 16.0 * sources.len() as f64
    ));
    s
}
