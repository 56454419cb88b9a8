//! The `vllm serve` line an experiment file implies (`kbench vllm-args`): vLLM's own flag
//! names (vllm/engine/arg_utils.py) and its `--speculative-config` JSON keys, so the file
//! that predicts a vLLM deployment also launches it.

use kbench_core::experiment::{Algorithm, Experiment, ServingEngineKind};
use serde_json::{Map, Value};

use crate::error::HttpError;
use crate::launch::{
    checkpoint_path, flag, needs_remote_code, shell_line, simulated_accept_length, LaunchAcceptance,
};
use crate::settings::{HttpSettings, Target};

/// vLLM's JSON for `--speculative-config`, keys in the order vLLM's docs write them.
pub fn speculative_config(exp: &Experiment) -> Result<Option<String>, HttpError> {
    let s = &exp.speculative;
    let Some(method) = s.algorithm.vllm_method() else {
        return Ok(None);
    };
    let mut m = Map::new();
    m.insert("method".into(), method.into());
    let launch = HttpSettings::of(exp)?.launch.unwrap_or_default();
    if s.algorithm.uses_draft_head() {
        let draft = exp.file.draft.as_ref();
        let path = checkpoint_path(
            exp,
            &launch.draft_model_path,
            &draft.and_then(|d| d.config.clone()),
            &draft.and_then(|d| d.preset.clone()),
            "draft_model",
        )?;
        m.insert("model".into(), path.into());
    }
    m.insert("num_speculative_tokens".into(), s.shape.num_steps.into());
    if let (Algorithm::Ngram, Some(w)) = (s.algorithm, s.ngram) {
        m.insert("prompt_lookup_min".into(), w.min.into());
        m.insert("prompt_lookup_max".into(), w.max.into());
    }
    if launch.acceptance == LaunchAcceptance::Simulate {
        // vLLM's simulated acceptance: every round drawn to this mean by its synthetic
        // rejection sampler (vllm/config/speculative.py), as SGLANG_SIMULATE_ACC_LEN does
        let accept = simulated_accept_length(exp)?;
        m.insert("rejection_sample_method".into(), "synthetic".into());
        m.insert(
            "synthetic_acceptance_length".into(),
            ((accept * 1000.0).round() / 1000.0).into(),
        );
    }
    Ok(Some(Value::Object(m).to_string()))
}

/// The `vllm serve` command line, with the url's host and port (else vLLM's 127.0.0.1:8000).
pub fn vllm_command(exp: &Experiment) -> Result<String, HttpError> {
    if exp.engine.kind != ServingEngineKind::Vllm && exp.speculative.is_speculative() {
        return Err(HttpError::LaunchLine(format!(
            "{}: the file simulates SGLang's EAGLE ({}, {}, {}); vLLM's settings differ (a chain of num_speculative_tokens): set [engine] name = \"vllm\" with method and num_speculative_tokens, or use `kbench sglang-args`",
            exp.path.display(),
            exp.speculative.shape.num_steps,
            exp.speculative.shape.topk,
            exp.speculative.shape.num_draft_tokens
        )));
    }
    let settings = HttpSettings::of(exp)?;
    let target = match &settings.url {
        Some(_) => settings.target()?,
        None => Target::parse("http://127.0.0.1:8000")?,
    };
    let launch = settings.launch.clone().unwrap_or_default();
    let f = &exp.file;
    let model = checkpoint_path(
        exp,
        &launch.model_path,
        &f.model.config,
        &f.model.preset,
        "model",
    )?;
    let mut argv: Vec<String> = vec!["vllm".into(), "serve".into(), model];
    flag(&mut argv, "host", target.host.clone());
    flag(&mut argv, "port", target.port.to_string());
    flag(&mut argv, "tensor-parallel-size", exp.tp_size.to_string());
    if let Some(n) = f.server.max_running_requests {
        flag(&mut argv, "max-num-seqs", n.to_string());
    }
    if let Some(n) = exp.engine.max_num_batched_tokens {
        flag(&mut argv, "max-num-batched-tokens", n.to_string());
    }
    if let Some(n) = f.server.max_model_len {
        flag(&mut argv, "max-model-len", n.to_string());
    }
    if let Some(m) = f.server.mem_fraction_static {
        flag(&mut argv, "gpu-memory-utilization", m.to_string());
    }
    match f.server.cuda_graph_max_bs {
        // no batch is small enough for a graph: every forward runs eager, torch.compile
        // kept (--enforce-eager would drop it too)
        Some(0) => flag(
            &mut argv,
            "compilation-config",
            r#"{"cudagraph_mode":"NONE"}"#.into(),
        ),
        Some(n) => flag(&mut argv, "max-cudagraph-capture-size", n.to_string()),
        None => {}
    }
    if let Some(dtype) = exp.kv.kv_cache_dtype.flag_value() {
        flag(&mut argv, "kv-cache-dtype", dtype.into());
    }
    if let Some(json) = speculative_config(exp)? {
        flag(&mut argv, "speculative-config", json);
    }
    if !exp.kv.prefix_caching {
        argv.push("--no-enable-prefix-caching".into());
    }
    if !exp.custom_all_reduce {
        argv.push("--disable-custom-all-reduce".into());
    }
    if needs_remote_code(&f.model.preset, &launch.args) {
        argv.push("--trust-remote-code".into());
    }
    argv.extend(launch.args.iter().cloned());
    Ok(shell_line(&argv, &launch.env))
}
