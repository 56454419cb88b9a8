//! `kbench serve`: SGLang-style flags into a [`kbench_serve::ServeConfig`], then serve until
//! SIGTERM or Ctrl-C.

use std::path::Path;
use std::time::Duration;

use kbench_core::backend::Backend;
use kbench_core::experiment::{load_experiment, Algorithm};
use kbench_engine::{Device, SpeculativeSettings};
use kbench_serve::engine::EngineLoad;
use kbench_serve::sim::SimWorker;
use kbench_serve::{Faults, Limits, ModelInfo, ServeConfig, Source, TextCodec};
use serde_json::{json, Value};

use super::args::ServeArgs;
use super::engine::{spec_settings, verify_method};
use super::error::{spec_error, CliError, CliResult};
use super::exit;

fn invalid(message: impl Into<String>) -> CliError {
    CliError::new(exit::INVALID_INPUT, message)
}

/// A flag's value the command cannot take: a usage error, as clap's own.
fn usage(message: impl Into<String>) -> CliError {
    CliError::new(exit::USAGE, message)
}

/// `--speed` bounds: a million times slower or faster than the modelled deployment keeps
/// every wall-clock wait of a run inside what `Instant` can add.
const MIN_SPEED: f64 = 1e-6;
const MAX_SPEED: f64 = 1e6;

fn seconds(flag: &str, s: f64) -> CliResult<Duration> {
    kbench_core::duration::checked_seconds(s).map_err(|e| usage(format!("--{flag} {e}")))
}

/// `--speculative-algorithm`: None when not given; Some(None) for EAGLE, which keeps
/// whichever EAGLE-style draft the file has (SGLang reports NEXTN as EAGLE); else the
/// algorithm, `Algorithm::None` for NONE.
fn speculating(a: &ServeArgs) -> CliResult<Option<Option<Algorithm>>> {
    match a.speculative_algorithm.as_deref() {
        None => Ok(None),
        Some(s) => match s.to_ascii_uppercase().as_str() {
            "EAGLE3" => Ok(Some(Some(Algorithm::Eagle3))),
            "NEXTN" => Ok(Some(Some(Algorithm::Mtp))),
            "EAGLE" => Ok(Some(None)),
            "NONE" => Ok(Some(Some(Algorithm::None))),
            other => Err(usage(format!(
                "--speculative-algorithm {other}: kbench serve supports EAGLE3, NEXTN, EAGLE (the file's own) or NONE"
            ))),
        },
    }
}

/// Neither source given. Checked here rather than by clap, whose message for a required
/// flag names only one of the two.
fn no_source() -> CliError {
    usage(
        "kbench serve needs something to serve: --model DIR (the engine on a checkpoint, such \
         as one made by `kbench model init --preset tiny --out DIR`) or --sim FILE (an \
         experiment file's modelled deployment, such as experiments/topk1_v2.toml)",
    )
}

pub fn run(a: ServeArgs) -> CliResult<()> {
    if a.model.is_none() && a.sim.is_none() {
        return Err(no_source());
    }
    // As `--set server.max_running_requests=0` is refused: a batch cap of 0 serves nothing,
    // and raising it silently would serve a deployment other than the one asked for.
    if a.max_running_requests == Some(0) {
        return Err(usage(
            "--max-running-requests 0: max_running_requests must be at least 1\n  fix: give 1 or \
             more, or leave it out for the default",
        ));
    }
    let limits = Limits {
        max_body_bytes: a.max_body_bytes.max(1),
        read_timeout: seconds("read-timeout-secs", a.read_timeout_secs)?,
        max_in_flight: (a.max_running_requests.unwrap_or(0) as usize
            + a.max_queued_requests as usize)
            .max(1),
        drain_timeout: seconds("drain-timeout-secs", a.drain_timeout_secs)?,
    };
    let faults = Faults {
        rate: a.fail_rate,
        kinds: if a.fail_kinds.is_empty() {
            kbench_serve::faults::ALL_KINDS.to_vec()
        } else {
            a.fail_kinds
                .iter()
                .map(|k| k.parse())
                .collect::<Result<Vec<_>, _>>()
                .map_err(usage)?
        },
        seed: a.fail_seed,
        stall: seconds("fail-stall-secs", a.fail_stall_secs)?,
    };
    faults.validate().map_err(usage)?;
    let cfg = match &a.sim {
        Some(file) => sim_config(&a, file, limits, faults)?,
        None => engine_config(&a, limits, faults)?,
    };
    let what = describe(&cfg.server_info);
    let server = kbench_serve::start(cfg).map_err(|e| CliError::from_error(&e))?;
    eprintln!("kbench serve: {what}");
    match (server.max_prompt_tokens(), server.prefill_probe()) {
        (Some(max), Some(p)) => eprintln!(
            "prompts up to {max} tokens: a {}-token prefill took {:.1} ms, so about {} s at {max} \
             (--max-prompt-tokens changes it)",
            p.tokens,
            p.took.as_secs_f64() * 1e3,
            kbench_serve::engine::PREFILL_BUDGET.as_secs()
        ),
        (Some(max), None) => eprintln!("prompts up to {max} tokens (--max-prompt-tokens)"),
        _ => {}
    }
    eprintln!(
        "listening on http://{} (Ctrl-C or SIGTERM stops it)",
        server.addr()
    );
    server
        .run_until_signal()
        .map_err(|e| CliError::from_error(&e))
}

fn describe(info: &Value) -> String {
    info["kbench"]["describe"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn engine_config(a: &ServeArgs, limits: Limits, faults: Faults) -> CliResult<ServeConfig> {
    let Some(model_dir) = a.model.clone() else {
        return Err(no_source());
    };
    let config_path = model_dir.join("config.json");
    if !config_path.exists() {
        return Err(invalid(format!(
            "{}: no config.json (create a model with `kbench model init --preset tiny --out {}`)",
            model_dir.display(),
            model_dir.display()
        )));
    }
    let arch = kbench_core::arch::ModelArch::from_config_file(&config_path)
        .map_err(|e| CliError::from_error(&e).prefixed(config_path.display()))?;
    let wants_spec = match speculating(a)? {
        Some(Some(Algorithm::None)) => false,
        Some(Some(Algorithm::Mtp)) => {
            return Err(usage(
                "--speculative-algorithm NEXTN: the engine drafts with an EAGLE-3 head (--draft); --sim prices NEXTN",
            ))
        }
        Some(_) => true,
        None => {
            a.draft.is_some()
                || a.speculative_num_steps.is_some()
                || a.speculative_eagle_topk.is_some()
                || a.speculative_num_draft_tokens.is_some()
        }
    };
    let spec: Option<SpeculativeSettings> = if wants_spec {
        Some(spec_settings(
            a.speculative_num_steps,
            a.speculative_eagle_topk,
            a.speculative_num_draft_tokens,
            verify_method(None, 0.0)?,
        )?)
    } else {
        if a.speculative_num_steps.is_some()
            || a.speculative_eagle_topk.is_some()
            || a.speculative_num_draft_tokens.is_some()
            || a.draft.is_some()
        {
            return Err(usage(
                "--speculative-algorithm NONE with speculative settings: drop them or speculate",
            ));
        }
        None
    };
    let draft_dir = spec.map(|_| a.draft.clone().unwrap_or_else(|| model_dir.join("draft")));
    if let Some(d) = &draft_dir {
        if !d.join("config.json").exists() {
            return Err(invalid(format!(
                "speculative decoding needs an EAGLE-3 draft: {} has no config.json (give --draft DIR)",
                d.display()
            )));
        }
    }
    let device = Device::parse(&a.device).map_err(|e| CliError::from_error(&e))?;
    if let Some(tp) = a.tp_size {
        if tp != 1 {
            return Err(usage(format!(
                "--tp-size {tp}: kbench serve --model runs the engine on one device (--tp-size 1); \
                 serve a modelled TP deployment with --sim"
            )));
        }
    }
    let tok_path = model_dir.join("tokenizer.json");
    let codec = match kbench_engine::model::load_tokenizer(&tok_path) {
        Ok(t) => TextCodec::Tokenizer {
            tokenizer: Box::new(t),
        },
        Err(_) => TextCodec::Words {
            vocab: arch.vocab_size,
        },
    };
    let max_running = a
        .max_running_requests
        .unwrap_or(if spec.is_some() { 48 } else { 256 });
    let context_length = a
        .context_length
        .unwrap_or(arch.max_position_embeddings as usize);
    let served_name = a
        .served_model_name
        .clone()
        .unwrap_or_else(|| dir_name(&model_dir));
    let max_prompt_tokens = max_prompt_tokens(a, context_length)?;
    let prefill_chunk = match a.chunked_prefill_size {
        None if device == Device::Cpu => Some(256),
        None => Some(2048),
        Some(-1) => None,
        Some(n) if n > 0 => Some(n as usize),
        Some(n) => {
            return Err(usage(format!(
                "--chunked-prefill-size {n}: give a positive number of tokens, or -1 for none"
            )))
        }
    };
    let mut limits = limits;
    limits.max_in_flight = max_running as usize + a.max_queued_requests as usize;
    let spec_desc = match &spec {
        Some(s) => format!(
            "EAGLE-3 ({}, {}, {}) greedy verification",
            s.shape.num_steps, s.shape.topk, s.shape.num_draft_tokens
        ),
        None => "plain decoding".into(),
    };
    let server_info = json!({
        "model_path": model_dir.display().to_string(),
        "tokenizer_path": codec.is_tokenizer().then(|| tok_path.display().to_string()),
        "served_model_name": served_name,
        "model_type": arch.model_type,
        "host": a.host,
        "port": a.port,
        "device": a.device,
        "tp_size": 1,
        "context_length": context_length,
        "max_running_requests": max_running,
        "max_queued_requests": a.max_queued_requests,
        "chunked_prefill_size": prefill_chunk.map_or(-1, |c| c as i64),
        "random_seed": a.random_seed,
        "speculative_algorithm": spec.map(|_| "EAGLE3"),
        "speculative_draft_model_path": draft_dir.as_ref().map(|d| d.display().to_string()),
        "speculative_num_steps": spec.map(|s| s.shape.num_steps),
        "speculative_eagle_topk": spec.map(|s| s.shape.topk),
        "speculative_num_draft_tokens": spec.map(|s| s.shape.num_draft_tokens),
        "stream_interval": 1,
        "enable_metrics": true,
        "log_requests": a.log_requests,
        "incremental_streaming_output": a.incremental_streaming_output,
        "kbench": {
            "mode": "engine",
            "describe": format!("kbench engine on {device}, {} ({spec_desc})", model_dir.display()),
        },
    });
    Ok(ServeConfig {
        host: a.host.clone(),
        port: a.port,
        source: Source::Engine(EngineLoad {
            model_dir: model_dir.clone(),
            draft_dir,
            device,
            spec,
            max_running: max_running as usize,
            prefill_chunk,
            max_prompt_tokens,
            context_length,
        }),
        model: ModelInfo {
            served_name,
            model_path: model_dir.display().to_string(),
            tokenizer_path: codec.is_tokenizer().then(|| tok_path.display().to_string()),
            context_length,
            // the worker's measured bound replaces it when no flag gave one
            max_prompt_tokens,
            vocab: arch.vocab_size as usize,
            eos_token_id: eos_token_id(&model_dir),
            draft_positions: spec
                .map(|s| s.shape.num_draft_tokens as usize - 1)
                .unwrap_or(0),
        },
        codec,
        server_info,
        limits,
        faults,
        answering: answering(a, a.random_seed),
    })
}

/// generation_config.json's, else config.json's `eos_token_id` (the first, if a list).
fn eos_token_id(dir: &Path) -> Option<u32> {
    ["generation_config.json", "config.json"]
        .iter()
        .find_map(|f| {
            let text = std::fs::read_to_string(dir.join(f)).ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            let e = v
                .get("eos_token_id")
                .or_else(|| v.get("text_config")?.get("eos_token_id"))?;
            e.as_u64()
                .or_else(|| e.as_array()?.first()?.as_u64())
                .map(|x| x as u32)
        })
}

fn dir_name(dir: &Path) -> String {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string())
}

fn sim_config(
    a: &ServeArgs,
    file: &Path,
    limits: Limits,
    faults: Faults,
) -> CliResult<ServeConfig> {
    if a.device != "cpu" {
        return Err(usage(
            "--device is for the engine; --sim runs the cost model",
        ));
    }
    // SGLang's flags become the experiment's own settings.
    let mut overrides = a.set.clone();
    if let Some(Some(algorithm)) = speculating(a)? {
        overrides.push(format!(
            "speculative.algorithm={}",
            algorithm.sglang_name().unwrap_or("none")
        ));
    }
    for (key, v) in [
        ("speculative.num_steps", a.speculative_num_steps),
        ("speculative.eagle_topk", a.speculative_eagle_topk),
        (
            "speculative.num_draft_tokens",
            a.speculative_num_draft_tokens,
        ),
        ("server.max_running_requests", a.max_running_requests),
        ("server.tp_size", a.tp_size),
        ("server.cuda_graph_max_bs", a.cuda_graph_max_bs),
    ] {
        if let Some(v) = v {
            overrides.push(format!("{key}={v}"));
        }
    }
    if a.disable_overlap_schedule {
        overrides.push("speculative.spec_v2=false".into());
    }
    super::engine::prepare_models(file, &overrides)?;
    let mut variants = load_experiment(file, &overrides).map_err(|e| spec_error(&e))?;
    if variants.len() != 1 {
        return Err(invalid(format!(
            "{}: {} sweep variants; kbench serve --sim serves one deployment (pick one with --set)",
            file.display(),
            variants.len()
        )));
    }
    let exp = variants.remove(0).experiment;
    if a.disable_overlap_schedule && !exp.speculative.is_speculative() {
        return Err(usage(
            "--disable-overlap-schedule without speculation: kbench models SGLang's plain decoding with its overlap scheduler only",
        ));
    }
    let acceptance = kbench_sim::acceptance_for(&exp).map_err(|e| CliError::from_error(&e))?;
    // Built here once to report errors and describe the deployment; the worker builds its own.
    let probe = kbench_sim::SimBackend::new(&exp, acceptance.clone())
        .map_err(|e| CliError::from_error(&e))?;
    let describe = probe.describe();
    let profile_name = probe.cost_model().profile.name.clone();
    // the cap the simulator serves with: vLLM's default for the GPU where the file is silent
    let max_running = probe
        .max_running_requests()
        .unwrap_or(exp.max_running_requests);
    let cuda_graph_max_bs = probe
        .cuda_graph_bound()
        .map_or(exp.cuda_graph_max_bs, |b| b.max());
    drop(probe);
    let speed = a.speed.unwrap_or(1.0);
    if !(speed.is_finite() && (MIN_SPEED..=MAX_SPEED).contains(&speed)) {
        return Err(usage(format!(
            "--speed {} must be between 1e-6 and 1e6 (virtual seconds per wall second)",
            kbench_core::duration::show(speed)
        )));
    }
    let spec_on = exp.speculative.is_speculative();
    let mut limits = limits;
    limits.max_in_flight = max_running as usize + a.max_queued_requests as usize;
    let served_name = a
        .served_model_name
        .clone()
        .unwrap_or_else(|| exp.model.name.clone());
    let context_length = a
        .context_length
        .unwrap_or(exp.model.max_position_embeddings as usize);
    let server_info = json!({
        "model_path": exp.model.name,
        "served_model_name": served_name,
        "model_type": exp.model.model_type,
        "host": a.host,
        "port": a.port,
        "tp_size": exp.tp_size,
        "context_length": context_length,
        "max_running_requests": max_running,
        "max_queued_requests": a.max_queued_requests,
        "cuda_graph_max_bs": cuda_graph_max_bs,
        "random_seed": exp.file.seed,
        // as SGLang's server_info reports it: its server_args turn NEXTN into EAGLE
        "speculative_algorithm": spec_on.then_some(match exp.speculative.algorithm {
            Algorithm::Mtp => "EAGLE",
            a => a.name_in(exp.engine.kind),
        }),
        "speculative_num_steps": spec_on.then_some(exp.speculative.shape.num_steps),
        "speculative_eagle_topk": spec_on.then_some(exp.speculative.shape.topk),
        "speculative_num_draft_tokens": spec_on.then_some(exp.speculative.shape.num_draft_tokens),
        "enable_spec_v2": exp.speculative.spec_v2,
        "stream_interval": 1,
        "enable_metrics": true,
        "log_requests": a.log_requests,
        "incremental_streaming_output": a.incremental_streaming_output,
        "kbench": {
            "mode": "sim",
            "describe": format!("{describe}; played {speed}x faster than the modelled deployment"),
            "experiment": file.display().to_string(),
            "hardware": profile_name,
            "speed": speed,
            "notes": exp.notes,
        },
    });
    let make_exp = exp.clone();
    let worker = SimWorker {
        make: Box::new(move || {
            kbench_sim::SimBackend::new(&make_exp, acceptance)
                .map(kbench_sim::SimBackend::with_real_clients)
        }),
        speed,
        vocab: exp.model.vocab_size,
        seed: exp.file.seed,
        proposed: spec_on.then(|| exp.speculative.shape.num_draft_tokens.saturating_sub(1)),
        max_running,
    };
    Ok(ServeConfig {
        host: a.host.clone(),
        port: a.port,
        source: Source::Sim(worker),
        model: ModelInfo {
            served_name,
            model_path: exp.model.name.clone(),
            tokenizer_path: None,
            context_length,
            max_prompt_tokens: max_prompt_tokens(a, context_length)?,
            vocab: exp.model.vocab_size as usize,
            eos_token_id: None,
            draft_positions: if spec_on {
                exp.speculative.shape.num_draft_tokens as usize - 1
            } else {
                0
            },
        },
        codec: TextCodec::Words {
            vocab: exp.model.vocab_size,
        },
        server_info,
        limits,
        faults,
        answering: answering(a, exp.file.seed),
    })
}

/// `--max-prompt-tokens`, which must leave room for an output token in the context.
fn max_prompt_tokens(a: &ServeArgs, context_length: usize) -> CliResult<Option<usize>> {
    match a.max_prompt_tokens {
        Some(0) => Err(usage("--max-prompt-tokens 0: give at least 1")),
        Some(n) if n >= context_length => Err(usage(format!(
            "--max-prompt-tokens {n}: the context holds {context_length} tokens, prompt and \
             output together; give at most {}",
            context_length.saturating_sub(1)
        ))),
        n => Ok(n),
    }
}

fn answering(a: &ServeArgs, seed: u64) -> kbench_serve::Answering {
    kbench_serve::Answering {
        api_key: a.api_key.clone(),
        seed,
        per_request_spec_metrics: per_request_spec_metrics(a),
        log_requests: a.log_requests,
        incremental_streaming_output: a.incremental_streaming_output,
    }
}

fn per_request_spec_metrics(
    a: &ServeArgs,
) -> Option<kbench_serve::state::PerRequestSpeculativeMetrics> {
    use kbench_serve::state::PerRequestSpeculativeMetrics;
    match a.per_request_spec_decode_metrics.as_deref() {
        Some("detailed") => Some(PerRequestSpeculativeMetrics::Detailed),
        Some(_) => Some(PerRequestSpeculativeMetrics::Summary),
        None => None,
    }
}
