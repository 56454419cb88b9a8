//! `kbench trace synth | stats | convert | record`.

use std::io::Write;

use kbench_core::trace::{self, SynthParams, TraceForm, TraceStats};
use kbench_core::tree::TreeShape;

use super::args::{TraceCommand, TraceConvertArgs, TraceStatsArgs, TraceSynthArgs};
use super::error::{io_error, CliError, CliResult};
use super::exit;

pub fn run(cmd: TraceCommand) -> CliResult<()> {
    match cmd {
        TraceCommand::Synth(a) => synth(a),
        TraceCommand::Stats(a) => stats(a),
        TraceCommand::Convert(a) => convert(a),
        TraceCommand::Record(a) => super::engine::record_trace(a),
    }
}

fn invalid(e: &(dyn std::error::Error + 'static)) -> CliError {
    CliError::from_chain(exit::INVALID_INPUT, e)
}

fn synth(a: TraceSynthArgs) -> CliResult<()> {
    let mut p: SynthParams = match (&a.preset, &a.params) {
        (_, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                io_error(
                    exit::INVALID_INPUT,
                    format!("reading {}", path.display()),
                    e,
                )
            })?;
            toml::from_str(&text).map_err(|e| {
                CliError::new(
                    exit::INVALID_INPUT,
                    format!("{}: {}", path.display(), e.message()),
                )
            })?
        }
        (preset, None) => {
            let name = preset.as_deref().unwrap_or("kimi-k2.5-eagle3-chat");
            trace::preset(name).ok_or_else(|| {
                let known: Vec<&str> = trace::PRESETS.iter().map(|p| p.name).collect();
                CliError::new(
                    exit::INVALID_INPUT,
                    format!(
                        "unknown trace preset `{name}` (known: {})",
                        known.join(", ")
                    ),
                )
            })?
        }
    };
    if !a.accept.is_empty() {
        p.depth = a.accept.len() as u32;
        p.accept = a.accept.clone();
        // The preset's label describes the preset's rates, not these.
        p.dataset = "synthetic (rates given on the command line)".into();
    }
    if let Some(v) = a.stickiness {
        p.stickiness = v;
    }
    if let Some(v) = a.contrast {
        p.contrast = v;
    }
    if let Some(v) = a.sequences {
        p.sequences = v;
    }
    if let Some(v) = a.positions {
        p.positions = v;
    }
    if let Some(v) = a.topk {
        p.topk = v;
    }
    if let Some(v) = a.seed {
        p.seed = v;
    }
    if let Some(v) = &a.dataset {
        p.dataset = v.clone();
    }
    let t = trace::synth(&p).map_err(|e| invalid(&e))?;
    trace::write(&t, &a.out, TraceForm::from_path(&a.out))
        .map_err(|e| CliError::from_chain(exit::OUTPUT, &e))?;
    let shape = TreeShape::new(3.min(p.depth), 1, 3.min(p.depth) + 1).map_err(|e| invalid(&e))?;
    let al = trace::accept_length(&t, &shape).map_err(|e| invalid(&e))?;
    println!(
        "wrote {} ({} sequences x {} positions, depth {}, top-{}); accept length at ({}, 1, {}): {:.3}",
        a.out.display(),
        p.sequences,
        p.positions,
        p.depth,
        p.topk,
        shape.num_steps,
        shape.num_draft_tokens,
        al.per_round
    );
    Ok(())
}

fn parse_shape(s: &str) -> CliResult<TreeShape> {
    let parts: Vec<&str> = s.split('/').collect();
    let nums: Option<Vec<u32>> = parts.iter().map(|p| p.trim().parse().ok()).collect();
    match nums.as_deref() {
        Some([a, b, c]) => TreeShape::new(*a, *b, *c)
            .map_err(|e| CliError::new(exit::INVALID_INPUT, format!("--config {s}: {e}"))),
        _ => Err(CliError::new(
            exit::INVALID_INPUT,
            format!("--config {s}: expected STEPS/TOPK/DRAFT_TOKENS, e.g. 3/1/4"),
        )),
    }
}

fn stats(a: TraceStatsArgs) -> CliResult<()> {
    let t = trace::read(&a.file).map_err(|e| invalid(&e))?;
    let shapes = if a.configs.is_empty() {
        trace::standard_shapes(t.depth(), t.topk())
    } else {
        a.configs
            .iter()
            .map(|c| parse_shape(c))
            .collect::<CliResult<Vec<_>>>()?
    };
    let s = trace::stats(&t, &shapes).map_err(|e| invalid(&e).prefixed(a.file.display()))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = if a.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&s).expect("stats serialize")
        )
    } else {
        write_stats(&mut out, &a.file.display().to_string(), &s)
    };
    result.map_err(|e| io_error(exit::OUTPUT, "writing to stdout", e))
}

pub fn write_stats(out: &mut dyn Write, name: &str, s: &TraceStats) -> std::io::Result<()> {
    writeln!(out, "trace {name}")?;
    writeln!(
        out,
        "  {:?} ({}), target {}, draft {}, dataset {}, temperature {}",
        s.kind, s.generator, s.target, s.draft, s.dataset, s.temperature
    )?;
    writeln!(
        out,
        "  {} sequences, {} positions, depth {}, top-{}",
        s.sequences, s.total_positions, s.depth, s.topk
    )?;
    writeln!(
        out,
        "  depth  conditional  cumulative   top-1  in top-K  mean top-1 prob"
    )?;
    for d in &s.per_depth {
        writeln!(
            out,
            "  {:>5}  {:>11.4}  {:>10.4}  {:>6.4}  {:>8.4}  {:>15.4}",
            d.depth, d.conditional, d.cumulative, d.top1, d.in_top_k, d.mean_top1_prob
        )?;
    }
    writeln!(
        out,
        "  steps/topk/draft  accept length (per round)  per position  bounds"
    )?;
    for al in &s.accept_length {
        writeln!(
            out,
            "  {:>16}  {:>25.4}  {:>12.4}  [{:.4}, {:.4}]",
            format!("{}/{}/{}", al.num_steps, al.topk, al.num_draft_tokens),
            al.per_round,
            al.per_position,
            al.per_position_lower,
            al.per_position_upper
        )?;
    }
    Ok(())
}

fn convert(a: TraceConvertArgs) -> CliResult<()> {
    let form = TraceForm::from_path(&a.output);
    let t = trace::convert(&a.input, &a.output, form).map_err(|e| invalid(&e))?;
    println!(
        "converted {} -> {} ({:?}, {} sequences)",
        a.input.display(),
        a.output.display(),
        form,
        t.sequences.len()
    );
    Ok(())
}
