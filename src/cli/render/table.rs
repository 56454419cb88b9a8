//! The terminal table: one row per level, the saturation row, references beside predictions.

use std::io::{self, Write};

use kbench_core::metrics::MAX_DISTINCT_ERRORS;
use kbench_core::report::Report;

const HEADER: [&str; 13] = [
    "C",
    "done",
    "out tok/s",
    "req tok/s",
    "accept",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "ITL p50",
    "ITL p99",
    "E2E p50",
    "dur s",
];

/// The columns a terminal of 100 shows; `--wide` adds ITL and the duration.
const NARROW_LEFT_OUT: [&str; 3] = ["ITL p50", "ITL p99", "dur s"];
const TERMINAL: usize = 100;

/// A line of the report's preamble: whole under `--wide`, else wrapped to the terminal.
fn preamble(out: &mut dyn Write, text: &str, wide: bool) -> io::Result<()> {
    if wide {
        return writeln!(out, "   {text}");
    }
    for (i, line) in wrap(text, TERMINAL - 5).iter().enumerate() {
        let indent = if i == 0 { "   " } else { "     " };
        writeln!(out, "{indent}{line}")?;
    }
    Ok(())
}

pub fn write_report(out: &mut dyn Write, r: &Report, wide: bool) -> io::Result<()> {
    let e = &r.experiment;
    let title = match &e.variant {
        Some(v) => format!("{} [{v}]", e.name),
        None => e.name.clone(),
    };
    writeln!(out, "== {title} ({} backend)", r.backend.name)?;
    let s = &e.speculative;
    let spec = if s.algorithm == "none" {
        "no speculation".to_string()
    } else {
        format!(
            "{} steps={} topk={} draft_tokens={} {}",
            s.algorithm,
            s.num_steps,
            s.eagle_topk,
            s.num_draft_tokens,
            if s.spec_v2 {
                "spec v2 (overlap)"
            } else {
                "spec v1"
            }
        )
    };
    // the engine backend runs here, whatever GPU the file models for the sim
    let hardware = if r.backend.name == "engine" {
        format!(
            "this machine (the file's {} is modelled only by the sim)",
            e.hardware
        )
    } else {
        e.hardware.clone()
    };
    let deployment = format!(
        "{} on {}{}, tp {}{}, {spec}; max_running_requests {}, {}",
        e.model,
        hardware,
        e.engine
            .as_ref()
            .map(|n| format!(" under {n}"))
            .unwrap_or_default(),
        e.tp_size,
        if e.custom_all_reduce {
            ""
        } else {
            " (custom all-reduce off)"
        },
        e.max_running_requests,
        match e.cuda_graph_unit.as_deref() {
            Some(unit) => format!("max_cudagraph_capture_size {} {unit}", e.cuda_graph_max_bs),
            None => format!("cuda_graph_max_bs {}", e.cuda_graph_max_bs),
        }
    );
    preamble(out, &deployment, wide)?;
    let range = |r: [u32; 2]| {
        if r[0] == r[1] {
            r[0].to_string()
        } else {
            format!("{}..{}", r[0], r[1])
        }
    };
    let w = &e.workload;
    let output = if w.ignore_eos {
        format!("{} output tokens", range(w.output_len))
    } else {
        format!(
            "{} output tokens (asks for {}, stops as at EOS)",
            range(w.output_len),
            e.max_tokens
        )
    };
    let mut prompt = format!("input {}", range(e.input_len));
    for (n, what) in [
        (w.shared_prefix_len, "shared prefix"),
        (w.context_len, "context"),
    ] {
        if n > 0 {
            prompt.push_str(&format!(", {what} {n}"));
        }
    }
    if w.lengths.starts_with("file ") {
        prompt.push_str(&format!("; lengths from {}", &w.lengths[5..]));
    }
    let measured = match (e.requests_per_client, e.requests_per_level) {
        (Some(n), Some(rate)) if !e.request_rate.is_empty() => {
            format!("{n} requests/client ({rate} per rate level)")
        }
        (Some(n), _) => format!("{n} requests/client"),
        (None, n) => format!("{} requests/level", n.unwrap_or(0)),
    };
    preamble(
        out,
        &format!(
            "{measured} (+{} warm-up), {output}, {prompt}",
            e.warmup_requests
        ),
        wide,
    )?;
    preamble(out, &r.backend.description, wide)?;
    let mut rows: Vec<Vec<String>> = vec![HEADER.iter().map(|h| h.to_string()).collect()];
    for m in &r.levels {
        rows.push(vec![
            level_label(m),
            // a level where some requests failed says so where its numbers are read
            match m.failed {
                0 => m.completed.to_string(),
                failed => format!("{} of {}", m.completed, m.completed + failed),
            },
            format!("{:.1}", m.output_throughput),
            format!("{:.1}", m.per_request_output_throughput),
            m.accept_length
                .map(|a| format!("{a:.2}"))
                .unwrap_or_else(|| "-".into()),
            ms(m.median_ttft_ms),
            ms(m.p99_ttft_ms),
            ms(m.median_tpot_ms),
            ms(m.p99_tpot_ms),
            ms(m.median_itl_ms),
            ms(m.p99_itl_ms),
            ms(m.median_e2e_latency_ms),
            format!("{:.2}", m.duration_s),
        ]);
    }
    if wide {
        write_rows(out, &rows)?;
    } else {
        let kept: Vec<usize> = (0..HEADER.len())
            .filter(|&c| !NARROW_LEFT_OUT.contains(&HEADER[c]))
            .collect();
        let narrow: Vec<Vec<String>> = rows
            .iter()
            .map(|row| kept.iter().map(|&c| row[c].clone()).collect())
            .collect();
        write_rows(out, &narrow)?;
        writeln!(
            out,
            "   (ITL p50/p99 and the duration: --wide, --json or --csv)"
        )?;
    }
    for m in &r.levels {
        let (Some(_), Some(peak)) = (m.request_rate, m.max_concurrent_requests) else {
            continue;
        };
        let cap = match m.concurrency {
            0 => "no cap".to_string(),
            c => format!("max_concurrency {c}"),
        };
        writeln!(
            out,
            "   {}: {cap}, at most {peak} in flight; queueing at the client p50 {} ms, p99 {} ms",
            level_label(m),
            ms(m.median_queue_delay_ms.unwrap_or(0.0)),
            ms(m.p99_queue_delay_ms.unwrap_or(0.0)),
        )?;
    }
    for m in &r.levels {
        let (Some(tokens), Some(peak)) = (m.kv_cache_tokens, m.peak_kv_cache_usage) else {
            continue;
        };
        let retractions = m.num_retractions.unwrap_or(0);
        // only where the cache shaped the level
        if peak < 0.9 && retractions == 0 {
            continue;
        }
        writeln!(
            out,
            "   {}: KV cache peaked at {:.0}% of {tokens} tokens; {retractions} retraction(s)",
            match m.request_rate {
                Some(_) => level_label(m),
                None => format!("C={}", m.concurrency),
            },
            peak * 100.0
        )?;
    }
    for m in r.levels.iter().filter(|m| m.failed > 0) {
        writeln!(
            out,
            "   C={}: {} request(s) failed: {}{}",
            m.concurrency,
            m.failed,
            m.errors.join("; "),
            match m.errors_not_listed {
                0 => String::new(),
                n => format!("; {n} more for reasons past the first {MAX_DISTINCT_ERRORS}"),
            }
        )?;
    }
    for m in &r.levels {
        let Some(s) = &m.server_spec else { continue };
        let rates: Vec<String> = s
            .per_position_acceptance_rates
            .iter()
            .map(|p| format!("{p:.2}"))
            .collect();
        preamble(
            out,
            &format!(
                "{}: the server counted {} drafts, accept length {}, per position [{}] ({})",
                match m.request_rate {
                    Some(_) => level_label(m),
                    None => format!("C={}", m.concurrency),
                },
                s.num_drafts,
                s.acceptance_length
                    .map(|a| format!("{a:.2}"))
                    .unwrap_or_else(|| "-".into()),
                rates.join(" "),
                s.source
            ),
            wide,
        )?;
    }
    let at = r
        .levels
        .iter()
        .find(|m| m.request_rate.is_some() && m.output_throughput == r.saturation_output_throughput)
        .map(level_label)
        .unwrap_or_else(|| format!("C={}", r.saturation_concurrency));
    if r.levels.iter().all(|m| m.completed == 0) {
        writeln!(out, "   saturation: none (no request completed)")?;
    } else {
        writeln!(
            out,
            "   saturation: {:.1} output tok/s at {at}",
            r.saturation_output_throughput
        )?;
    }
    if let Some(reference) = &r.reference {
        writeln!(out, "   reference: {}", reference.source)?;
        let w = reference
            .points
            .iter()
            .map(|p| p.label.len())
            .max()
            .unwrap_or(0);
        for p in &reference.points {
            let approx = if p.approximate { "~" } else { "" };
            match (p.predicted, p.error_pct) {
                (Some(pred), Some(err)) => writeln!(
                    out,
                    "     {:<w$}  measured {:<9} predicted {:<8.1} error {:+.1}%",
                    p.label,
                    format!("{approx}{}", p.reference),
                    pred,
                    err
                )?,
                _ => writeln!(
                    out,
                    "     {:<w$}  measured {:<9} predicted -        ({})",
                    p.label,
                    format!("{approx}{}", p.reference),
                    p.not_compared
                        .as_deref()
                        .unwrap_or("no such level in this run")
                )?,
            }
        }
    }
    for w in &r.warnings {
        preamble(out, &format!("warning: {w}"), wide)?;
    }
    if let Some(why) = &r.partial {
        writeln!(
            out,
            "   PARTIAL: the run stopped after {} of {} level(s): {why}",
            r.levels.len(),
            e.concurrency.len()
        )?;
    }
    writeln!(out)
}

pub fn write_sweep_summary(out: &mut dyn Write, reports: &[Report]) -> io::Result<()> {
    writeln!(out, "== sweep summary: {}", reports[0].experiment.name)?;
    let mut rows = vec![vec![
        "variant".to_string(),
        "steps".into(),
        "topk".into(),
        "draft".into(),
        "C=1 tok/s".into(),
        "accept@C=1".into(),
        "saturation tok/s".into(),
        "at C".into(),
    ]];
    for r in reports {
        let s = &r.experiment.speculative;
        let first = r.levels.first();
        rows.push(vec![
            r.experiment.variant.clone().unwrap_or_default(),
            s.num_steps.to_string(),
            s.eagle_topk.to_string(),
            s.num_draft_tokens.to_string(),
            first
                .map(|m| format!("{:.1}", m.output_throughput))
                .unwrap_or_default(),
            first
                .and_then(|m| m.accept_length)
                .map(|a| format!("{a:.2}"))
                .unwrap_or_else(|| "-".into()),
            format!("{:.1}", r.saturation_output_throughput),
            r.saturation_concurrency.to_string(),
        ]);
    }
    write_rows(out, &rows)?;
    writeln!(out)
}

/// A latency, or `-` where the level has none (no request completed).
fn ms(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "-".into()
    }
}

pub fn write_rows(out: &mut dyn Write, rows: &[Vec<String>]) -> io::Result<()> {
    let widths = column_widths(rows.iter());
    for (i, row) in rows.iter().enumerate() {
        writeln!(out, "{}", aligned(row, &widths))?;
        if i == 0 {
            writeln!(out, "{}", rule(&widths))?;
        }
    }
    Ok(())
}

/// [`write_rows`] with a heading line before each group, every group aligned as one table.
pub fn write_grouped_rows(
    out: &mut dyn Write,
    header: &[String],
    groups: &[(String, Vec<Vec<String>>)],
) -> io::Result<()> {
    let header = header.to_vec();
    let widths =
        column_widths(std::iter::once(&header).chain(groups.iter().flat_map(|(_, rows)| rows)));
    writeln!(out, "{}", aligned(&header, &widths))?;
    writeln!(out, "{}", rule(&widths))?;
    for (heading, rows) in groups {
        writeln!(out, "   -- {heading}")?;
        for row in rows {
            writeln!(out, "{}", aligned(row, &widths))?;
        }
    }
    Ok(())
}

fn column_widths<'a>(rows: impl Iterator<Item = &'a Vec<String>> + Clone) -> Vec<usize> {
    let cols = rows.clone().next().map_or(0, |r| r.len());
    (0..cols)
        .map(|c| rows.clone().map(|r| r[c].len()).max().unwrap_or(0))
        .collect()
}

fn aligned(row: &[String], widths: &[usize]) -> String {
    let cells: Vec<String> = row
        .iter()
        .zip(widths)
        .map(|(cell, w)| format!("{cell:>w$}"))
        .collect();
    format!("   {}", cells.join("  "))
}

fn rule(widths: &[usize]) -> String {
    let dashes: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    format!("   {}", dashes.join("  "))
}

/// `--predict`: each level's measurement beside the simulator's prediction of it, the error
/// as (predicted - measured) / measured, as the reference comparison gives it.
pub fn write_measured_vs_predicted(
    out: &mut dyn Write,
    measured: &Report,
    wide: bool,
) -> std::io::Result<()> {
    let Some(p) = &measured.prediction else {
        return Ok(());
    };
    writeln!(
        out,
        "== measured ({}) vs predicted (sim)",
        measured.backend.name
    )?;
    preamble(out, &format!("predicted by: {}", p.predicted_by), wide)?;
    // a CPU engine set beside a modelled GPU differs by the hardware, not by the model
    for line in wrap(
        &format!(
            "the prediction is for {} as the file describes it; the measurement is the server \
             that answered, so a server on other hardware (kbench serve on this machine's CPU) \
             differs by the hardware's speed, not by the model's error",
            measured.experiment.hardware
        ),
        94,
    ) {
        writeln!(out, "   {line}")?;
    }
    let err = |e: Option<f64>| e.map(|e| format!("{e:+.1}%")).unwrap_or_else(|| "-".into());
    let mut rows: Vec<Vec<String>> = vec![[
        "C",
        "out tok/s",
        "predicted",
        "error",
        "TPOT p50",
        "predicted",
        "error",
        "accept",
        "predicted",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect()];
    for level in &p.levels {
        let get = |name: &str| level.metrics.iter().find(|m| m.metric == name);
        let key = kbench_core::compare::LevelKey {
            request_rate: level.request_rate,
            concurrency: level.concurrency,
        };
        let (Some(out_tps), Some(tpot), Some(acc)) = (
            get("output_throughput"),
            get("median_tpot_ms"),
            get("accept_length"),
        ) else {
            continue;
        };
        let num = |v: Option<f64>, f: fn(f64) -> String| v.map(f).unwrap_or_else(|| "-".into());
        rows.push(vec![
            key.label(),
            num(out_tps.measured, |v| format!("{v:.1}")),
            num(out_tps.predicted, |v| format!("{v:.1}")),
            err(out_tps.error_pct),
            num(tpot.measured, ms),
            num(tpot.predicted, ms),
            err(tpot.error_pct),
            num(acc.measured, |v| format!("{v:.2}")),
            num(acc.predicted, |v| format!("{v:.2}")),
        ]);
    }
    write_rows(out, &rows)?;
    writeln!(out)
}

/// A level's name in the tables: its clients, or its request rate.
pub fn level_label(m: &kbench_core::metrics::LevelMetrics) -> String {
    kbench_core::compare::LevelKey::of(m).label()
}

/// Words joined into lines of at most `width` characters (a longer word has its own line).
pub(super) fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.len() + 1 + word.len() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}
