//! `kbench search` on the terminal (ranked table, what was not ranked and why, the
//! frontier, the top two's rounds side by side).

use std::collections::BTreeSet;
use std::io::{self, Write};

use kbench_search::report::{CandidateRow, SearchReport};

use super::table::write_rows;

/// Frontier points printed without --pareto.
const FRONTIER_SUMMARY: usize = 12;

pub fn write_search(
    out: &mut dyn Write,
    r: &SearchReport,
    top: usize,
    full_frontier: bool,
) -> io::Result<()> {
    let baselines = r.candidates.iter().filter(|c| !c.in_space).count();
    let skipped: usize = r.skipped_by_rule.values().sum();
    writeln!(
        out,
        "{}: {} candidates from a space of {}{}: {} ran, {} skipped by rule",
        r.experiment,
        r.candidates_total,
        r.space_size,
        if baselines > 0 {
            format!(" (+{baselines} plain baseline(s))")
        } else {
            String::new()
        },
        r.ran,
        skipped
    )?;
    writeln!(
        out,
        "objective: {}{}",
        r.objective,
        if r.slos.is_empty() {
            String::new()
        } else {
            format!("; SLOs: {}", r.slos.join(", "))
        }
    )?;
    let other_axes: Vec<&str> = r
        .space
        .iter()
        .map(|a| a.key.as_str())
        .filter(|k| !k.starts_with("speculative."))
        .collect();
    let slo_metrics: Vec<String> = {
        let mut m: Vec<String> = r
            .slos
            .iter()
            .filter_map(|s| s.split_whitespace().next().map(str::to_string))
            .filter(|m| *m != r.objective.metric)
            .collect();
        m.dedup();
        m
    };
    writeln!(out)?;
    writeln!(
        out,
        "== ranked (top {} of {})",
        top.min(r.ranked.len()),
        r.ranked.len()
    )?;
    if r.ranked.is_empty() {
        writeln!(out, "   no candidate was ranked")?;
    } else {
        let mut header: Vec<String> = ["rank", "algorithm", "steps", "topk", "draft", "v2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        header.extend(other_axes.iter().map(|k| short(k).to_string()));
        header.push(r.objective.metric.clone());
        header.push("at".into());
        header.extend(slo_metrics.iter().cloned());
        header.push("accept".into());
        header.push("vs plain".into());
        let mut rows = vec![header];
        for &i in r.ranked.iter().take(top) {
            rows.push(ranked_row(r, &r.candidates[i], &other_axes, &slo_metrics));
        }
        write_rows(out, &rows)?;
        if let Some(b) = r.baseline {
            let c = &r.candidates[b];
            writeln!(
                out,
                "   vs plain: against the best plain configuration, {} ({} at {})",
                c.label,
                fmt_value(c.objective),
                at_label(c)
            )?;
        }
        if let Some(own) = r.file_configuration {
            let c = &r.candidates[own];
            let best = r.ranked.first().and_then(|&b| r.candidates[b].objective);
            match (c.rank, c.objective, best) {
                (Some(1), _, _) => writeln!(
                    out,
                    "   the file's own configuration ({}) is the best",
                    c.label
                )?,
                (Some(n), Some(v), Some(b)) => {
                    writeln!(
                        out,
                        "   the file's own configuration ({}) ranks #{n}: {} ({:+.1}% from #1)",
                        c.label,
                        fmt_value(Some(v)),
                        (v / b - 1.0) * 100.0
                    )?;
                    let change = changes(c, &r.candidates[r.ranked[0]]);
                    if !change.is_empty() {
                        writeln!(
                            out,
                            "   instead, #1 changes {change}: {:+.1}% over the file's",
                            (b / v - 1.0) * 100.0
                        )?;
                    }
                }
                _ => writeln!(
                    out,
                    "   the file's own configuration ({}) is not ranked",
                    c.label
                )?,
            }
        }
        let unsupported: Vec<&CandidateRow> = r
            .ranked
            .iter()
            .take(top)
            .map(|&i| &r.candidates[i])
            .filter(|c| !c.unsupported.is_empty())
            .collect();
        for c in unsupported {
            writeln!(
                out,
                "   unsupported by SGLang, run as asked: {}: {}",
                c.label,
                c.unsupported.join("; ")
            )?;
        }
    }
    if !r.skipped_by_rule.is_empty() || !r.skipped_by_slo.is_empty() || r.without_value > 0 {
        writeln!(out)?;
        writeln!(out, "== not ranked")?;
        let mut rows = vec![vec!["candidates".to_string(), "why".to_string()]];
        for (rule, n) in &r.skipped_by_rule {
            rows.push(vec![n.to_string(), format!("skipped, {rule}")]);
        }
        for (slo, n) in &r.skipped_by_slo {
            rows.push(vec![n.to_string(), format!("no level meets the SLO {slo}")]);
        }
        if r.without_value > 0 {
            rows.push(vec![
                r.without_value.to_string(),
                format!("no value for {}", r.objective.metric),
            ]);
        }
        write_aligned(out, &rows, &[1])?;
    }
    writeln!(out)?;
    let shown = if full_frontier {
        r.frontier.len()
    } else {
        FRONTIER_SUMMARY.min(r.frontier.len())
    };
    writeln!(
        out,
        "== Pareto frontier: output throughput against per-request speed ({} points{})",
        r.frontier.len(),
        if shown < r.frontier.len() {
            format!(", {shown} shown evenly; --pareto for all")
        } else {
            String::new()
        }
    )?;
    let mut rows = vec![vec![
        "config".to_string(),
        "at".to_string(),
        "output tok/s".to_string(),
        "per-request tok/s".to_string(),
        "ranked".to_string(),
    ]];
    let winner = r.ranked.first().map(|&w| (w, r.candidates[w].at_level));
    for idx in spread(r.frontier.len(), shown) {
        let p = &r.frontier[idx];
        let c = &r.candidates[p.candidate];
        let level = &c.levels[p.level];
        rows.push(vec![
            c.label.clone(),
            format!("C={}", level.concurrency),
            format!("{:.1}", p.output_throughput),
            format!("{:.1}", p.per_request_output_throughput),
            if winner == Some((p.candidate, Some(p.level))) {
                "#1".into()
            } else {
                "-".into()
            },
        ]);
    }
    if r.frontier.is_empty() {
        writeln!(out, "   no level of any candidate meets the SLOs")?;
    } else {
        write_rows(out, &rows)?;
    }
    if let [(first, a), rest @ ..] = r.decomposition.as_slice() {
        writeln!(out)?;
        let second = rest.first();
        let title = match second {
            Some((s, _)) => format!(
                "why #1 ({}) beats #2 ({})",
                r.candidates[*first].label, r.candidates[*s].label
            ),
            None => format!("#1 ({})", r.candidates[*first].label),
        };
        writeln!(
            out,
            "== {title}\n   one decode round at batch {}, mean context {:.0}",
            a.batch, a.mean_context
        )?;
        let cols: Vec<&kbench_search::explain::Decomposition> =
            std::iter::once(a).chain(second.map(|(_, d)| d)).collect();
        let mut rows = vec![{
            let mut h = vec!["".to_string()];
            h.push("#1".into());
            if cols.len() > 1 {
                h.push("#2".into());
            }
            h
        }];
        let us = |v: f64| format!("{v:.1} us");
        let line = |name: &str, f: &dyn Fn(&kbench_search::explain::Decomposition) -> String| {
            let mut row = vec![name.to_string()];
            row.extend(cols.iter().map(|d| f(d)));
            row
        };
        rows.push(line("round", &|d| d.what.clone()));
        rows.push(line("batch (capped by max_running_requests)", &|d| {
            d.batch.to_string()
        }));
        rows.push(line("target forward (GPU)", &|d| us(d.target_us)));
        rows.push(line("draft passes (GPU)", &|d| {
            format!("{} in {}", us(d.draft_us), d.draft_passes)
        }));
        rows.push(line("all-reduce (GPU)", &|d| us(d.all_reduce_us)));
        rows.push(line("launches beyond GPU time", &|d| {
            if d.eager_passes > 0 {
                format!("{} ({} eager)", us(d.launch_us), d.eager_passes)
            } else {
                us(d.launch_us)
            }
        }));
        rows.push(line("host (scheduler, streaming)", &|d| {
            format!("{} [{}]", us(d.host_us), d.combine)
        }));
        rows.push(line("sync", &|d| us(d.sync_us)));
        rows.push(line("round total", &|d| us(d.round_us)));
        rows.push(line("tokens per round (accept length)", &|d| {
            format!("{:.2}", d.accept_length)
        }));
        rows.push(line("per output token of a request", &|d| {
            us(d.us_per_token)
        }));
        write_aligned(out, &rows, &[0])?;
        if let Some((s, _)) = second {
            let (x, y) = (r.candidates[*first].objective, r.candidates[*s].objective);
            if let (Some(x), Some(y)) = (x, y) {
                writeln!(
                    out,
                    "   {}: {} against {} ({:+.1}%)",
                    r.objective.metric,
                    fmt_value(Some(x)),
                    fmt_value(Some(y)),
                    (x / y - 1.0) * 100.0
                )?;
            }
        }
    }
    Ok(())
}

fn ranked_row(
    r: &SearchReport,
    c: &CandidateRow,
    other_axes: &[&str],
    slo_metrics: &[String],
) -> Vec<String> {
    let cfg = c.config.as_ref();
    let speculating = cfg.is_some_and(|x| x.algorithm != "none");
    let spec = |f: &dyn Fn(&kbench_search::report::CandidateConfig) -> String| {
        cfg.filter(|_| speculating)
            .map(f)
            .unwrap_or_else(|| "-".into())
    };
    let mut row = vec![
        c.rank.map(|n| format!("#{n}")).unwrap_or_default(),
        cfg.map(|x| x.algorithm.clone()).unwrap_or_default(),
        spec(&|x| x.num_steps.to_string()),
        spec(&|x| x.eagle_topk.to_string()),
        spec(&|x| x.num_draft_tokens.to_string()),
        spec(&|x| if x.spec_v2 { "v2".into() } else { "v1".into() }),
    ];
    for k in other_axes {
        row.push(c.overrides.get(*k).cloned().unwrap_or_default());
    }
    row.push(fmt_value(c.objective));
    row.push(at_label(c));
    for m in slo_metrics {
        row.push(fmt_value(
            c.at.as_ref()
                .and_then(|l| kbench_search::objective::metric_value(l, m)),
        ));
    }
    row.push(
        c.at.as_ref()
            .and_then(|l| l.accept_length)
            .map(|a| format!("{a:.2}"))
            .unwrap_or_else(|| "-".into()),
    );
    row.push(match c.margin {
        Some(m) if r.baseline == Some(c.id) => format!("{:+.1}% (best plain)", m * 100.0),
        Some(m) => format!("{:+.1}%", m * 100.0),
        None => "-".into(),
    });
    row
}

/// What `to` changes in `from`, as `key from -> to` over the space's axes; a switch
/// between plain decoding and speculation is said as the two labels, not key by key.
fn changes(from: &CandidateRow, to: &CandidateRow) -> String {
    let plain = |c: &CandidateRow| c.config.as_ref().is_some_and(|x| x.algorithm == "none");
    if plain(from) != plain(to) {
        return format!("{} to {}", from.label, to.label);
    }
    let shown = |v: Option<&String>| v.map_or("-", |v| v.trim_matches('"')).to_string();
    // SGLang's order for the speculative keys (the table's columns), then the rest by name
    const FIRST: [&str; 5] = [
        "speculative.algorithm",
        "speculative.num_steps",
        "speculative.eagle_topk",
        "speculative.num_draft_tokens",
        "speculative.spec_v2",
    ];
    let keys: BTreeSet<(usize, &String)> = from
        .overrides
        .keys()
        .chain(to.overrides.keys())
        .map(|k| (FIRST.iter().position(|f| f == k).unwrap_or(FIRST.len()), k))
        .collect();
    keys.into_iter()
        .map(|(_, k)| k)
        .filter(|k| from.overrides.get(*k) != to.overrides.get(*k))
        .map(|k| {
            format!(
                "{} {} -> {}",
                short(k),
                shown(from.overrides.get(k)),
                shown(to.overrides.get(k))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn at_label(c: &CandidateRow) -> String {
    match &c.at {
        Some(m) => match m.request_rate {
            Some(rate) if rate.is_infinite() => "rate inf".into(),
            Some(rate) => format!("rate {rate}"),
            None => format!("C={}", m.concurrency),
        },
        None => "-".into(),
    }
}

fn fmt_value(v: Option<f64>) -> String {
    match v {
        Some(x) if x.abs() >= 100.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
        None => "-".into(),
    }
}

fn short(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

/// `n` of `len` indices, evenly spread, ends included.
fn spread(len: usize, n: usize) -> Vec<usize> {
    if n >= len || n < 2 {
        return (0..n.min(len)).collect();
    }
    let mut v: Vec<usize> = (0..n)
        .map(|i| (i * (len - 1) + (n - 1) / 2) / (n - 1))
        .collect();
    v.dedup();
    v
}

/// Rows with the columns in `left` left-aligned (names, reasons), the rest right-aligned.
fn write_aligned(out: &mut dyn Write, rows: &[Vec<String>], left: &[usize]) -> io::Result<()> {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                let w = widths[c];
                if left.contains(&c) {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        writeln!(out, "   {}", cells.join("  ").trim_end())?;
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            writeln!(out, "   {}", rule.join("  "))?;
        }
    }
    Ok(())
}
