//! A run's dashboard (`kbench experiment --plot`, `kbench compare --plot`): the four
//! pictures serving engineers read first, one colour per variant or report throughout.
//! - output throughput against load, with the reference's measurements labelled;
//! - output tok/s per GPU against tok/s per user, the frontier InferenceX-style dashboards
//!   publish, each point labelled with its concurrency;
//! - TTFT p50 (solid) and p99 (dashed) against load, on a log axis;
//! - TPOT p50 and p99 against load.
//!
//! Load is concurrency where any report has closed-loop levels, else the request rate.

use kbench_core::metrics::LevelMetrics;
use kbench_core::report::{ReferenceResult, Report};
use plotters::prelude::SeriesLabelPosition;

use super::chart::{colour, value_label};
use super::panel::{dashboard, Axis, Line, Marker, Panel};
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
    let load = Load::of(reports);
    let panels = [
        throughput_panel(reports, labels, load),
        frontier_panel(reports),
        latency_panel(reports, load, "TTFT", |m| (m.median_ttft_ms, m.p99_ttft_ms)),
        latency_panel(reports, load, "TPOT", |m| (m.median_tpot_ms, m.p99_tpot_ms)),
    ];
    // a modelled GPU is named only where it is modelled: an engine run on this CPU is not one
    let hardware = reports
        .first()
        .map(|r| {
            let n = gpus(r);
            let plural = if n == 1 { "" } else { "s" };
            if r.backend.name == "sim" {
                format!(" (modelled: {}, {n} GPU{plural})", r.experiment.hardware)
            } else {
                format!(" (measured: {} backend)", r.backend.name)
            }
        })
        .unwrap_or_default();
    dashboard(&format!("{title}{hardware}"), 2, (600, 420), &panels)
}

#[derive(Clone, Copy, PartialEq)]
enum Load {
    Concurrency,
    RequestRate,
}

impl Load {
    fn of(reports: &[Report]) -> Load {
        if reports
            .iter()
            .flat_map(|r| &r.levels)
            .any(|m| m.request_rate.is_none())
        {
            Load::Concurrency
        } else {
            Load::RequestRate
        }
    }

    fn desc(self) -> &'static str {
        match self {
            Load::Concurrency => "concurrency (closed-loop clients)",
            Load::RequestRate => "request rate (req/s; all-at-once levels left out)",
        }
    }

    /// The level's place on the load axis; None for a level of the other kind.
    fn at(self, m: &LevelMetrics) -> Option<f64> {
        match (self, m.request_rate) {
            (Load::Concurrency, None) => Some(m.concurrency as f64),
            (Load::RequestRate, Some(rate)) if rate.is_finite() => Some(rate),
            _ => None,
        }
    }

    fn levels(self, r: &Report) -> impl Iterator<Item = (f64, &LevelMetrics)> {
        r.levels.iter().filter_map(move |m| Some((self.at(m)?, m)))
    }
}

/// The GPUs a report's throughput is shared by.
fn gpus(r: &Report) -> u32 {
    r.experiment.tp_size.max(1)
}

fn throughput_panel(reports: &[Report], labels: &[String], load: Load) -> Panel {
    let references: Vec<Vec<Marker>> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| throughput_markers(r, i, load))
        .collect();
    let x = Axis::log2(
        load.desc(),
        reports
            .iter()
            .flat_map(|r| load.levels(r).map(|(x, _)| x))
            .chain(references.iter().flatten().map(|m| m.at.0)),
    );
    let y = Axis::linear(
        "output tok/s",
        reports
            .iter()
            .flat_map(|r| load.levels(r).map(|(_, m)| m.output_throughput))
            .chain(references.iter().flatten().map(|m| m.at.1)),
    );
    let mut panel = Panel::new("output throughput against load", x, y);
    for (i, r) in reports.iter().enumerate() {
        let points: Vec<(f64, f64)> = load
            .levels(r)
            .map(|(x, m)| (x, m.output_throughput))
            .collect();
        // the highest point carries its value; the reference's points carry theirs
        let peak = points
            .iter()
            .enumerate()
            .max_by(|a, b| a.1 .1.total_cmp(&b.1 .1))
            .map(|(j, _)| j);
        let point_labels = (0..points.len())
            .map(|j| {
                if Some(j) == peak {
                    value_label(points[j].1)
                } else {
                    String::new()
                }
            })
            .collect();
        panel.lines.push(Line {
            legend: Some(labels[i].clone()),
            colour: colour(i),
            dashed: false,
            points,
            point_labels,
        });
    }
    panel.markers = references.into_iter().flatten().collect();
    panel.marker_legend = Some("measured (reference), with the prediction's error".into());
    panel
}

/// The reference's throughputs as markers at their concurrency (a saturation number at the
/// concurrency the run saturated at), each labelled with the measurement and the error.
fn throughput_markers(r: &Report, i: usize, load: Load) -> Vec<Marker> {
    if load != Load::Concurrency {
        return Vec::new();
    }
    reference_throughputs(r)
        .map(|(c, p)| Marker {
            at: (c as f64, p.reference),
            colour: colour(i),
            text: format!("{}{}", value_label(p.reference), error_suffix(p)),
            ring: false,
            stack: 0,
        })
        .collect()
}

/// The reference's output throughputs with the concurrency each belongs to: a saturation
/// number sits at the concurrency the run saturated at.
fn reference_throughputs(r: &Report) -> impl Iterator<Item = (u32, &ReferenceResult)> {
    r.reference
        .iter()
        .flat_map(|reference| &reference.points)
        .filter_map(|p| match (p.metric.as_str(), p.concurrency) {
            ("saturation_output_throughput", _) => Some((r.saturation_concurrency, p)),
            ("output_throughput", Some(c)) => Some((c, p)),
            _ => None,
        })
}

/// ` (+2.1%)`: the prediction's error beside a measurement, where there is one.
fn error_suffix(p: &ReferenceResult) -> String {
    p.error_pct
        .map(|e| format!(" ({e:+.1}%)"))
        .unwrap_or_default()
}

fn frontier_panel(reports: &[Report]) -> Panel {
    let lines: Vec<Line> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut levels: Vec<&LevelMetrics> = r
                .levels
                .iter()
                .filter(|m| m.per_request_output_throughput.is_finite() && m.completed > 0)
                .collect();
            levels.sort_by_key(|m| m.concurrency);
            let per_gpu = gpus(r) as f64;
            Line {
                legend: None,
                colour: colour(i),
                dashed: false,
                points: levels
                    .iter()
                    .map(|m| {
                        (
                            m.per_request_output_throughput,
                            m.output_throughput / per_gpu,
                        )
                    })
                    .collect(),
                point_labels: levels
                    .iter()
                    .map(|m| match m.request_rate {
                        None => format!("C={}", m.concurrency),
                        Some(rate) => format!("{} req/s", value_label(rate)),
                    })
                    .collect(),
            }
        })
        .collect();
    let markers: Vec<Marker> = reports
        .iter()
        .enumerate()
        .flat_map(|(i, r)| frontier_markers(r, i))
        .collect();
    let all = || {
        lines
            .iter()
            .flat_map(|l| l.points.iter().copied())
            .chain(markers.iter().map(|m| m.at))
    };
    let x = Axis::linear(
        "tok/s per user (output tokens / E2E latency)",
        all().map(|p| p.0),
    );
    let y = Axis::linear("output tok/s per GPU", all().map(|p| p.1));
    let mut panel = Panel::new("throughput per GPU against interactivity", x, y);
    panel.lines = lines;
    panel.markers = markers;
    panel.marker_legend = Some("measured tok/s per GPU, at its level's modelled x".into());
    panel.legend_at = SeriesLabelPosition::UpperRight;
    panel
}

/// A reference throughput at a concurrency the run has, placed at that level's per-user
/// speed: the reference measures the y, and the run's level says where on x it sits.
fn frontier_markers(r: &Report, i: usize) -> Vec<Marker> {
    let at_concurrency = |c: u32| {
        r.levels
            .iter()
            .find(|m| m.request_rate.is_none() && m.concurrency == c)
    };
    reference_throughputs(r)
        .filter_map(|(c, p)| {
            let level = at_concurrency(c)?;
            let per_gpu = p.reference / gpus(r) as f64;
            Some(Marker {
                at: (level.per_request_output_throughput, per_gpu),
                colour: colour(i),
                text: format!("{} at C={c}", value_label(per_gpu)),
                ring: false,
                stack: 0,
            })
        })
        .collect()
}

fn latency_panel(
    reports: &[Report],
    load: Load,
    name: &str,
    p50_p99: impl Fn(&LevelMetrics) -> (f64, f64),
) -> Panel {
    let mut lines = Vec::new();
    for (i, r) in reports.iter().enumerate() {
        let levels: Vec<(f64, (f64, f64))> = load
            .levels(r)
            .filter(|(_, m)| m.completed > 0)
            .map(|(x, m)| (x, p50_p99(m)))
            .collect();
        for dashed in [false, true] {
            let points: Vec<(f64, f64)> = levels
                .iter()
                .map(|&(x, (p50, p99))| (x, if dashed { p99 } else { p50 }))
                .filter(|(_, y)| y.is_finite() && *y > 0.0)
                .collect();
            // the last level's value, where latency is worst
            let point_labels = (0..points.len())
                .map(|j| {
                    if j + 1 == points.len() {
                        value_label(points[j].1)
                    } else {
                        String::new()
                    }
                })
                .collect();
            lines.push(Line {
                legend: None,
                colour: colour(i),
                dashed,
                points,
                point_labels,
            });
        }
    }
    let metric = format!("median_{}_ms", name.to_lowercase());
    let markers: Vec<Marker> = if load == Load::Concurrency {
        reports
            .iter()
            .enumerate()
            .flat_map(|(i, r)| latency_markers(r, i, &metric))
            .collect()
    } else {
        Vec::new()
    };
    let x = Axis::log2(
        load.desc(),
        lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)),
    );
    let values = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .chain(markers.iter().map(|m| m.at.1));
    let y = Axis::log10(format!("{name} ms (log)"), values);
    let mut panel = Panel::new(format!("{name} p50 and p99 against load"), x, y);
    panel.lines = lines;
    panel.markers = markers;
    panel.styles = vec![("p50".into(), false), ("p99".into(), true)];
    panel.marker_legend = Some("measured p50 (reference)".into());
    panel
}

fn latency_markers(r: &Report, i: usize, metric: &str) -> Vec<Marker> {
    let Some(reference) = &r.reference else {
        return Vec::new();
    };
    reference
        .points
        .iter()
        .filter(|p| p.metric == metric)
        .filter_map(|p| {
            Some(Marker {
                at: (p.concurrency? as f64, p.reference),
                colour: colour(i),
                text: format!("{}{}", value_label(p.reference), error_suffix(p)),
                ring: false,
                stack: 0,
            })
        })
        .collect()
}
