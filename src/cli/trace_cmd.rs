//! `kbench trace synth | stats | convert | record`.

use std::io::Write;

use kbench_core::trace::{self, SynthParams, TraceForm, TraceStats};
use kbench_core::tree::TreeShape;

use super::args::{TraceCommand, TraceConvertArgs, TraceStatsArgs, TraceSynthArgs};
use super::error::{io_error, CliError, CliResult};
use super::exit;

pub fn run(cmd: TraceCommand) -> CliResult<()> {
    match cmd {
        TraceCommand::Synth(a) => {
            super::output::check_output_paths([&a.out])?;
            synth(a)
        }
        TraceCommand::Stats(a) => stats(a),
        TraceCommand::Convert(a) => {
            super::output::check_output_paths([&a.output])?;
            convert(a)
        }
        // a recording runs minutes against a server or the engine: where it goes is
        // checked first
        TraceCommand::Record(a) => {
            if a.model.is_none() && a.experiment.is_none() {
                return Err(CliError::new(
                    exit::USAGE,
                    "trace record needs a source: --model DIR to record from the engine's own \
                     draft, or --experiment FILE to record a live server's verify rounds",
                ));
            }
            super::output::check_output_paths([&a.out])?;
            if a.experiment.is_some() {
                record_live(a)
            } else {
                super::engine::record_trace(a)
            }
        }
    }
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
                let known: Vec<&str> = trace::PRESETS
                    .iter()
                    .map(|p| p.name)
                    .chain(trace::CHAIN_PRESETS.iter().map(|p| p.name))
                    .collect();
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
    // a flag's value out of range is the command line's fault (exit 2), where the same value
    // read from a --params file is the input's (exit 3, from the synthesiser's own check)
    let unit_flags = [("--stickiness", a.stickiness), ("--contrast", a.contrast)]
        .into_iter()
        .filter_map(|(flag, v)| v.map(|v| (flag, v)))
        .chain(a.accept.iter().map(|&v| ("--accept", v)));
    for (flag, v) in unit_flags {
        if !(0.0..=1.0).contains(&v) {
            return Err(CliError::new(
                exit::USAGE,
                format!("{flag} {v}: must be between 0 and 1"),
            ));
        }
    }
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
    let t = trace::synth(&p).map_err(|e| CliError::from_error(&e))?;
    trace::write(&t, &a.out, TraceForm::from_path(&a.out)).map_err(|e| CliError::from_error(&e))?;
    let shape = TreeShape::new(3.min(p.depth), 1, 3.min(p.depth) + 1)
        .map_err(|e| CliError::from_error(&e))?;
    let al = trace::accept_length(&t, &shape).map_err(|e| CliError::from_error(&e))?;
    super::output::outln!(
        "wrote {} ({} sequences x {} positions, depth {}, top-{}); accept length at ({}, 1, {}): {:.3}",
        a.out.display(),
        p.sequences,
        p.positions,
        p.depth,
        p.topk,
        shape.num_steps,
        shape.num_draft_tokens,
        al.per_round
    )?;
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
    let t = trace::read(&a.file).map_err(|e| CliError::from_error(&e))?;
    let shapes = if a.configs.is_empty() {
        trace::standard_shapes(t.depth(), t.topk())
    } else {
        a.configs
            .iter()
            .map(|c| parse_shape(c))
            .collect::<CliResult<Vec<_>>>()?
    };
    let s = trace::stats(&t, &shapes)
        .map_err(|e| CliError::from_error(&e).prefixed(a.file.display()))?;
    let mut out = super::output::stdout();
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
    let t = trace::convert(&a.input, &a.output, form).map_err(|e| CliError::from_error(&e))?;
    super::output::outln!(
        "converted {} -> {} ({:?}, {} sequences)",
        a.input.display(),
        a.output.display(),
        form,
        t.sequences.len()
    )?;
    Ok(())
}

/// `kbench trace record --experiment FILE`: the file's levels against a live server, each
/// request's recovered verify rounds written as a format-v2 trace.
fn record_live(a: super::args::TraceRecordArgs) -> CliResult<()> {
    let file = a.experiment.clone().expect("checked by the caller");
    let mut overrides = a.set.clone();
    overrides.push("backend.kind=\"http\"".into());
    if let Some(url) = &a.server_url {
        overrides.push(format!(
            "backend.http.url={}",
            toml::Value::String(url.clone())
        ));
    }
    let variants = kbench_core::experiment::load_experiment(&file, &overrides)
        .map_err(|e| super::error::spec_error(&e))?;
    let [variant] = variants.as_slice() else {
        return Err(CliError::new(
            exit::INVALID_INPUT,
            format!(
                "{}: a sweep of {} variants; record one server at a time (pick one with --set)",
                file.display(),
                variants.len()
            ),
        ));
    };
    let exp = &variant.experiment;
    let s = &exp.speculative;
    if !s.is_speculative() {
        return Err(CliError::new(
            exit::INVALID_INPUT,
            format!("{}: no speculative decoding to record", file.display()),
        ));
    }
    super::interrupt::install();
    let mut backend = super::backends::make_backend(exp)?;
    backend.set_notice(Box::new(|what| eprintln!("{what}")));
    let plan = kbench_core::harness::LoadPlan::from_experiment(exp).keeping_records();
    let mut progress =
        super::progress::LevelProgress::new(format!("record {}", exp.file.name), false);
    let levels = kbench_core::harness::run_levels(backend.as_mut(), &plan, &mut progress)
        .map_err(|e| CliError::from_error(&e))?;
    progress.finish();
    let records: Vec<&kbench_core::backend::RequestRecord> = levels
        .iter()
        .flat_map(|l| &l.records)
        .filter(|r| r.error.is_none())
        .collect();
    let coalesced = records
        .iter()
        .filter(|r| r.reported_rounds.is_some())
        .count();
    let requests: Vec<trace::LiveRequest> = records
        .iter()
        .filter(|r| !r.round_commits.is_empty())
        .map(|r| trace::LiveRequest {
            id: r.id,
            round_commits: r.round_commits.clone(),
        })
        .collect();
    if requests.is_empty() {
        return Err(CliError::new(
            exit::BACKEND,
            format!(
                "no request's rounds could be recovered from the stream ({} of {} had coalesced chunks; SGLang needs --stream-interval 1, vLLM --per-request-spec-decode-metrics detailed)",
                coalesced,
                records.len()
            ),
        ));
    }
    let f = &exp.file;
    let target = f
        .model
        .preset
        .clone()
        .unwrap_or_else(|| exp.model.name.clone());
    let draft = f
        .draft
        .as_ref()
        .and_then(|d| d.preset.clone().or_else(|| d.config.clone()))
        .unwrap_or_else(|| "unknown".into());
    let mut provenance = trace::live_provenance(
        &target,
        &draft,
        &format!(
            "{} random-token prompts of {}..{} tokens (seed {}), {} output tokens",
            requests.len(),
            exp.input_len.0,
            exp.input_len.1,
            f.seed,
            exp.max_tokens
        ),
        f.workload.temperature.unwrap_or(0.0),
    );
    provenance
        .params
        .insert("server".into(), serde_json::json!(backend.describe()));
    provenance.params.insert(
        "experiment".into(),
        serde_json::json!(file.display().to_string()),
    );
    let t = trace::from_rounds(
        &requests,
        (s.shape.num_steps, s.shape.topk, s.shape.num_draft_tokens),
        provenance,
    );
    trace::write(&t, &a.out, TraceForm::from_path(&a.out)).map_err(|e| CliError::from_error(&e))?;
    let observed = t
        .header
        .observed
        .as_ref()
        .expect("live traces are observed");
    let rounds: usize = requests.iter().map(|r| r.round_commits.len()).sum();
    let tokens: u64 = requests
        .iter()
        .flat_map(|r| &r.round_commits)
        .map(|&c| c as u64)
        .sum();
    super::output::outln!(
        "recorded {} requests, {} verify rounds (accept length {:.3}) from a {} server ({}, {}, {}) to {}{}",
        requests.len(),
        rounds,
        tokens as f64 / rounds.max(1) as f64,
        match observed.kind {
            trace::ObservedKind::ChainRounds => "chain (exact accept/miss per round)",
            trace::ObservedKind::AcceptLengths => "tree (accept lengths only)",
        },
        s.shape.num_steps,
        s.shape.topk,
        s.shape.num_draft_tokens,
        a.out.display(),
        if coalesced > 0 {
            format!("; {coalesced} request(s) left out: coalesced chunks")
        } else {
            String::new()
        }
    )?;
    Ok(())
}
