//! The terminal table: one row per level, the saturation row, references beside predictions.

use std::io::{self, Write};

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

pub fn write_report(out: &mut dyn Write, r: &Report) -> io::Result<()> {
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
    writeln!(
        out,
        "   {} on {}, tp {}, {spec}; max_running_requests {}, cuda_graph_max_bs {}",
        e.model, e.hardware, e.tp_size, e.max_running_requests, e.cuda_graph_max_bs
    )?;
    writeln!(
        out,
        "   {} requests/level (+{} warm-up), {} output tokens, input {}",
        e.requests_per_level,
        e.warmup_requests,
        e.max_tokens,
        if e.input_len[0] == e.input_len[1] {
            e.input_len[0].to_string()
        } else {
            format!("{}..{}", e.input_len[0], e.input_len[1])
        }
    )?;
    writeln!(out, "   {}", r.backend.description)?;
    let mut rows: Vec<Vec<String>> = vec![HEADER.iter().map(|h| h.to_string()).collect()];
    for m in &r.levels {
        rows.push(vec![
            m.concurrency.to_string(),
            m.completed.to_string(),
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
    write_rows(out, &rows)?;
    for m in r.levels.iter().filter(|m| m.failed > 0) {
        writeln!(
            out,
            "   C={}: {} request(s) failed: {}",
            m.concurrency,
            m.failed,
            m.errors.join("; ")
        )?;
    }
    writeln!(
        out,
        "   saturation: {:.1} output tok/s at C={}",
        r.saturation_output_throughput, r.saturation_concurrency
    )?;
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
                    "     {:<w$}  measured {:<9} predicted -        (no such level in this run)",
                    p.label,
                    format!("{approx}{}", p.reference)
                )?,
            }
        }
    }
    for w in &r.warnings {
        writeln!(out, "   warning: {w}")?;
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

fn ms(x: f64) -> String {
    format!("{x:.2}")
}

fn write_rows(out: &mut dyn Write, rows: &[Vec<String>]) -> io::Result<()> {
    let cols = rows[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:>w$}"))
            .collect();
        writeln!(out, "   {}", line.join("  "))?;
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            writeln!(out, "   {}", rule.join("  "))?;
        }
    }
    Ok(())
}

/// `--predict`: each level's measurement beside the simulator's prediction of it.
pub fn write_measured_vs_predicted(
    out: &mut dyn Write,
    measured: &Report,
    predicted: &Report,
) -> std::io::Result<()> {
    writeln!(
        out,
        "== measured ({}) vs predicted (sim)",
        measured.backend.name
    )?;
    writeln!(out, "   predicted by: {}", predicted.backend.description)?;
    let pct = |m: f64, p: f64| {
        if p > 0.0 {
            format!("{:+.1}%", (m - p) / p * 100.0)
        } else {
            "-".into()
        }
    };
    let acc = |a: Option<f64>| a.map(|a| format!("{a:.2}")).unwrap_or_else(|| "-".into());
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
    for m in &measured.levels {
        let Some(p) = predicted
            .levels
            .iter()
            .find(|p| p.concurrency == m.concurrency)
        else {
            continue;
        };
        rows.push(vec![
            m.concurrency.to_string(),
            format!("{:.1}", m.output_throughput),
            format!("{:.1}", p.output_throughput),
            pct(m.output_throughput, p.output_throughput),
            ms(m.median_tpot_ms),
            ms(p.median_tpot_ms),
            pct(m.median_tpot_ms, p.median_tpot_ms),
            acc(m.accept_length),
            acc(p.accept_length),
        ]);
    }
    write_rows(out, &rows)
}
