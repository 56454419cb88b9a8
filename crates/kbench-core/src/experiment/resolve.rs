//! From the file as written to a typed, validated experiment with every preset resolved.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::ExperimentError;
use super::file::{Algorithm, ExperimentFile};
use super::speculative::{validate_speculative, SpeculativeConfig};
use super::vllm_speculative::validate_vllm_speculative;
use super::workload::{KvSettings, ServingEngine, Workload};
use crate::arch::{DraftArch, ModelArch};

/// The hardware the experiment names; its contents are the backend's business.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum HardwareRef {
    Preset(String),
    Profile(PathBuf),
}

impl std::fmt::Display for HardwareRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HardwareRef::Preset(p) => write!(f, "{p}"),
            HardwareRef::Profile(p) => write!(f, "{}", p.display()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Experiment {
    pub file: ExperimentFile,
    pub path: PathBuf,
    pub base_dir: PathBuf,
    pub model: ModelArch,
    pub draft: Option<DraftArch>,
    pub hardware: HardwareRef,
    pub speculative: SpeculativeConfig,
    pub tp_size: u32,
    /// `[server] custom_all_reduce`: the engine may run its own all-reduce below its cap.
    pub custom_all_reduce: bool,
    pub max_running_requests: u32,
    pub cuda_graph_max_bs: u32,
    pub concurrency: Vec<u32>,
    /// `request_rate` levels (requests/s, `f64::INFINITY` for all at once).
    pub request_rates: Vec<f64>,
    pub burstiness: f64,
    pub max_concurrency: Option<u32>,
    /// How many requests each level measures.
    pub requests: crate::harness::LevelRequests,
    pub warmup_requests: u32,
    pub max_tokens: u32,
    /// The shortest and longest whole prompt (shared prefix and context included).
    pub input_len: (u32, u32),
    pub workload: Workload,
    /// KV pool, prefix caching, chunked prefill.
    pub kv: KvSettings,
    /// Whose scheduler the simulator plays.
    pub engine: ServingEngine,
    pub trace: Option<PathBuf>,
    /// `[workload] accept_length`: every round drawn to this mean, where no trace is given.
    pub accept_length: Option<f64>,
    /// `[workload] expert_spread`: the share of the routed experts a batch draws from, where
    /// the file says (else the hardware profile's).
    pub expert_spread: Option<f64>,
    /// Warnings SGLang would log (e.g. max_running_requests forced to 48).
    pub notes: Vec<String>,
    /// What makes a level mean less than it says (more clients than requests), shown with
    /// the report's warnings.
    pub warnings: Vec<String>,
}

/// SGLang forces this when speculation is on and max_running_requests is unset.
pub const SPEC_DEFAULT_MAX_RUNNING_REQUESTS: u32 = 48;
/// Used when neither speculation nor the file bounds the batch.
pub const DEFAULT_MAX_RUNNING_REQUESTS: u32 = 1024;
/// The graph bound kbench's own engines use where the file does not say. The simulator uses
/// the serving engine's default for the GPU instead (kbench-sim's `sglang_defaults` and
/// `vllm_defaults`).
pub const DEFAULT_CUDA_GRAPH_MAX_BS: u32 = 160;

/// The longest a rate level's arrivals may span: a thirtieth of what u64 nanoseconds hold,
/// room for the gamma draw's tail and the serving after the last arrival.
const MAX_LEVEL_SPAN_S: f64 = 1e9;

pub(crate) fn resolve(
    file: ExperimentFile,
    path: &Path,
    base_dir: &Path,
) -> Result<Experiment, ExperimentError> {
    let invalid = |rule: &'static str, message: String, fix: &str| ExperimentError::Invalid {
        path: path.into(),
        rule,
        message,
        fix: fix.into(),
    };
    let arch_err = |key: &'static str, what: String, source| ExperimentError::Arch {
        path: path.into(),
        what,
        key,
        span: None,
        source,
    };

    let model = match (&file.model.preset, &file.model.config) {
        (Some(p), None) => ModelArch::preset(p)
            .map_err(|e| arch_err("model.preset", "[model] preset".into(), e))?,
        (None, Some(c)) => {
            let cfg = base_dir.join(c);
            ModelArch::from_config_file(&cfg)
                .map_err(|e| arch_err("model.config", format!("[model] config {c}"), e))?
        }
        _ => {
            return Err(invalid(
                "model",
                "[model] needs exactly one of `preset` or `config`".into(),
                "write `preset = \"kimi-k2.5\"` or `config = \"path/to/config.json\"`",
            ))
        }
    };

    let hardware = match (&file.hardware.preset, &file.hardware.profile) {
        (Some(p), None) => HardwareRef::Preset(p.clone()),
        (None, Some(p)) => HardwareRef::Profile(base_dir.join(p)),
        _ => return Err(invalid(
            "hardware",
            "[hardware] needs exactly one of `preset` or `profile`".into(),
            "write `preset = \"8x-rtx-pro-6000-server\"` or `profile = \"hardware/my-gpu.toml\"`",
        )),
    };

    // The engine decides whose speculative keys and rules apply, so it is known first (an
    // unknown engine is reported as that, not as another engine's speculative rule).
    let engine = super::workload::resolve_engine(file.engine.as_ref(), base_dir, &invalid)?;
    let vllm = engine.kind == super::workload::ServingEngineKind::Vllm;
    let spec = if vllm {
        validate_vllm_speculative(&file.speculative, model.mtp_layers)
    } else {
        validate_speculative(&file.speculative)
    }
    .map_err(|v| ExperimentError::Invalid {
        path: path.into(),
        rule: v.rule,
        message: v.message,
        fix: v.fix,
    })?;
    if !vllm && spec.algorithm == Algorithm::Mtp && model.mtp_layers == 0 {
        // SGLang loads the draft from the target's own path (speculative_draft_model_path
        // defaults to model_path for NEXTN): without NextN weights there is nothing to draft
        return Err(invalid(
            "speculative.algorithm",
            format!(
                "algorithm = \"NEXTN\" drafts with the model's own multi-token-prediction layer, and {} has none",
                model.name
            ),
            "use a model with MTP layers (preset = \"deepseek-v3\"), or algorithm = \"EAGLE3\" with a [draft]",
        ));
    }
    let mut early_notes = Vec::new();
    if !spec.algorithm.uses_draft_head() && file.draft.is_some() && spec.is_speculative() {
        early_notes.push(if vllm {
            format!(
                "[draft] unused: method `{}` drafts without an EAGLE head",
                spec.algorithm.vllm_method().unwrap_or("none")
            )
        } else {
            format!(
                "[draft] unused: algorithm = \"{}\" drafts with the model's own MTP layer",
                spec.algorithm.sglang_name().unwrap_or("none")
            )
        });
    }

    let draft = if spec.algorithm.uses_draft_head() {
        let section = file.draft.clone().ok_or_else(|| {
            invalid(
                "draft",
                if vllm {
                    format!(
                        "speculative.method = \"{}\" needs a [draft] section (vLLM's `model` key: the EAGLE head)",
                        spec.algorithm.vllm_method().unwrap_or("eagle3")
                    )
                } else {
                    "speculative.algorithm = \"EAGLE3\" needs a [draft] section".into()
                },
                "add [draft] with `preset = \"kimi-k2.5-eagle3\"` (or a config path)",
            )
        })?;
        // the heads kbench reads (presets, EAGLE-3 config.json) take three captured hidden
        // states; vLLM's `eagle` proposer feeds one (use_aux_hidden_state_outputs is
        // eagle3's alone in vLLM's EagleProposer), so such a head cannot load under it
        if spec.algorithm == Algorithm::Eagle {
            if let Some(head) = section.preset.as_ref().or(section.config.as_ref()) {
                return Err(invalid(
                    "speculative.method",
                    format!(
                        "method = \"eagle\" is EAGLE-1, over the target's last hidden state; the [draft] `{head}` is an EAGLE-3 head (it reads three captured layers)"
                    ),
                    "set method = \"eagle3\", or describe an EAGLE-1 head in [draft] by its dimensions",
                ));
            }
        }
        let mut d = match (&section.preset, &section.config) {
            (Some(p), None) => DraftArch::preset(p)
                .map_err(|e| arch_err("draft.preset", "[draft] preset".into(), e))?,
            (None, Some(c)) => DraftArch::from_config_file(&base_dir.join(c), &model)
                .map_err(|e| arch_err("draft.config", format!("[draft] config {c}"), e))?,
            (None, None) => {
                let need = |v: Option<u32>, k: &str| {
                    v.ok_or_else(|| {
                        invalid(
                            "draft",
                            format!("[draft] without a preset or config needs `{k}`"),
                            "give `preset`, `config`, or all of hidden_size, num_heads, intermediate_size, draft_vocab_size",
                        )
                    })
                };
                let hidden = need(section.hidden_size, "hidden_size")?;
                let heads = need(section.num_heads, "num_heads")?;
                DraftArch {
                    name: "custom".into(),
                    hidden_size: hidden,
                    num_heads: heads,
                    num_kv_heads: section.num_kv_heads.unwrap_or(heads),
                    head_dim: hidden / heads.max(1),
                    intermediate_size: need(section.intermediate_size, "intermediate_size")?,
                    draft_vocab_size: need(section.draft_vocab_size, "draft_vocab_size")?,
                    target_vocab_size: model.vocab_size,
                    capture_layers: model.eagle3_capture_layer_outputs().to_vec(),
                    rms_norm_eps: model.rms_norm_eps,
                    rope_theta: model.rope_theta,
                    mla: None,
                }
            }
            _ => {
                return Err(invalid(
                    "draft",
                    "[draft] takes `preset` or `config`, not both".into(),
                    "keep one of them",
                ))
            }
        };
        // Explicit fields refine a preset.
        if section.preset.is_some() || section.config.is_some() {
            if let Some(v) = section.hidden_size {
                d.hidden_size = v;
            }
            if let Some(v) = section.num_heads {
                d.num_heads = v;
            }
            if let Some(v) = section.num_kv_heads {
                d.num_kv_heads = v;
            }
            if let Some(v) = section.intermediate_size {
                d.intermediate_size = v;
            }
            if let Some(v) = section.draft_vocab_size {
                d.draft_vocab_size = v;
            }
        }
        if let Some(layers) = section.capture_layers {
            d.capture_layers = layers;
        }
        if d.capture_layers.len() != 3 || d.capture_layers.iter().any(|&l| l >= model.num_layers) {
            return Err(invalid(
                "draft.capture_layers",
                format!(
                    "EAGLE-3 captures exactly three target layers below {}, got {:?}",
                    model.num_layers, d.capture_layers
                ),
                "use three layer indices, e.g. [1, N/2-1, N-4] as SGLang does",
            ));
        }
        Some(d)
    } else {
        None
    };

    let s = &file.server;
    if s.tp_size == 0 {
        return Err(invalid(
            "server.tp_size",
            "tp_size must be at least 1".into(),
            "set tp_size = 1 or more",
        ));
    }
    if model.num_heads % s.tp_size != 0 {
        return Err(invalid(
            "server.tp_size",
            format!(
                "{} attention heads do not split over tp_size {}",
                model.num_heads, s.tp_size
            ),
            "use a tp_size that divides the number of attention heads",
        ));
    }
    let mut notes = early_notes;
    let max_running_requests = match s.max_running_requests {
        Some(0) => {
            return Err(invalid(
                "server.max_running_requests",
                "max_running_requests must be at least 1".into(),
                "set it to 1 or more, or remove it",
            ))
        }
        Some(n) => n,
        None if spec.is_speculative() && !vllm => {
            notes.push(format!(
                "max_running_requests unset with speculation: SGLang caps it at {SPEC_DEFAULT_MAX_RUNNING_REQUESTS}"
            ));
            SPEC_DEFAULT_MAX_RUNNING_REQUESTS
        }
        None => DEFAULT_MAX_RUNNING_REQUESTS,
    };
    let cuda_graph_max_bs = match s.cuda_graph_max_bs {
        Some(n) => n,
        None => {
            // the simulator resolves the engine's own default by the GPU; this value is
            // what kbench's own engines capture up to
            notes.push(if vllm {
                "cuda_graph_max_bs unset: vLLM's default max_cudagraph_capture_size, 2 x max_num_seqs x (1 + num_speculative_tokens) tokens, at most 512 (1024 on compute capability 10.x) and the token budget".to_string()
            } else {
                "cuda_graph_max_bs unset: SGLang's default for the GPU's memory and tp_size (512 at tp >= 4 from 60 GiB)".to_string()
            });
            DEFAULT_CUDA_GRAPH_MAX_BS
        }
    };

    let b = &file.benchmark;
    if b.concurrency.is_empty() && b.request_rate.is_empty() {
        return Err(invalid(
            "benchmark.concurrency",
            "the benchmark has no levels: both concurrency and request_rate are empty".into(),
            "list at least one level, e.g. concurrency = [1, 8, 64] or request_rate = [1, 4, inf]",
        ));
    }
    for &r in &b.request_rate {
        if r.is_nan() || r <= 0.0 {
            return Err(invalid(
                "benchmark.request_rate",
                format!("request_rate {r} is not a positive rate"),
                "use requests per second above 0, or inf for all at once",
            ));
        }
    }
    let burstiness = b.burstiness.unwrap_or(1.0);
    if !(burstiness > 0.0 && burstiness.is_finite()) {
        return Err(invalid(
            "benchmark.burstiness",
            format!("burstiness = {burstiness} must be a finite number above 0"),
            "1 is a Poisson process; smaller is burstier, larger more even",
        ));
    }
    // vllm bench serve's --max-concurrency caps an open-loop run; a closed-loop level is its
    // own cap, so a cap with no rate level to apply to would be silently dropped
    if b.max_concurrency.is_some() && b.request_rate.is_empty() {
        return Err(invalid(
            "benchmark.max_concurrency",
            "max_concurrency caps the request_rate levels, and this benchmark has none: each concurrency level already keeps that many requests in flight".into(),
            "list request_rate levels to cap, or remove max_concurrency and choose the concurrency levels",
        ));
    }
    let max_concurrency = match b.max_concurrency {
        None => None,
        Some(n) if n > 0 && n <= u32::MAX as i64 => Some(n as u32),
        Some(n) => {
            return Err(invalid(
                "benchmark.max_concurrency",
                format!("max_concurrency = {n} is not a positive count"),
                "use 1 or more, or leave it out for no cap",
            ))
        }
    };
    let mut concurrency = Vec::with_capacity(b.concurrency.len());
    for &c in &b.concurrency {
        if c <= 0 {
            return Err(invalid(
                "benchmark.concurrency",
                format!("concurrency {c} is not a positive count"),
                "use concurrency levels of 1 or more",
            ));
        }
        if c > u32::MAX as i64 {
            return Err(invalid(
                "benchmark.concurrency",
                format!(
                    "concurrency {c} is more streams than a level counts (at most {})",
                    u32::MAX
                ),
                "use a smaller level; no server batches that many requests",
            ));
        }
        if concurrency.contains(&(c as u32)) {
            return Err(invalid(
                "benchmark.concurrency",
                format!("concurrency {c} is listed twice"),
                "list each level once: a level is measured once, and the report keys its rows by it",
            ));
        }
        concurrency.push(c as u32);
    }
    if let Some(r) = b
        .request_rate
        .iter()
        .enumerate()
        .find(|&(i, r)| b.request_rate[..i].contains(r))
        .map(|(_, r)| r)
    {
        return Err(invalid(
            "benchmark.request_rate",
            format!("request_rate {r} is listed twice"),
            "list each rate once: a level is measured once, and the report keys its rows by it",
        ));
    }
    let positive = |v: i64, key: &'static str| -> Result<u32, ExperimentError> {
        if v <= 0 {
            Err(invalid(
                key,
                format!("{key} = {v} is not a positive count"),
                "use 1 or more",
            ))
        } else if v > u32::MAX as i64 {
            Err(invalid(
                key,
                format!(
                    "{key} = {v} is more requests than a level counts (at most {})",
                    u32::MAX
                ),
                "use fewer requests; a few thousand give stable percentiles",
            ))
        } else {
            Ok(v as u32)
        }
    };
    let requests_per_level = b
        .requests_per_level
        .map(|n| positive(n, "benchmark.requests_per_level"))
        .transpose()?;
    let requests_per_client = b
        .requests_per_client
        .map(|n| positive(n, "benchmark.requests_per_client"))
        .transpose()?;
    // virtual time is integer nanoseconds (584 years in a u64): a level whose arrivals
    // alone would span decades is refused rather than overflowing it
    if let Some(per_level) = requests_per_level {
        let sent = per_level as f64 + b.warmup_requests.max(0) as f64;
        if let Some(&r) = b
            .request_rate
            .iter()
            .find(|&&r| sent / r > MAX_LEVEL_SPAN_S)
        {
            return Err(invalid(
                "benchmark.request_rate",
                format!(
                    "request_rate {r:e} sends {sent} requests over about {:.1e} s, past the {MAX_LEVEL_SPAN_S:.0e} s a level's virtual clock covers",
                    sent / r
                ),
                "use a higher rate or fewer requests",
            ));
        }
    }
    let counts = crate::harness::LevelRequests {
        per_level: requests_per_level,
        per_client: requests_per_client,
    };
    if requests_per_level.is_none() && (requests_per_client.is_none() || !b.request_rate.is_empty())
    {
        return Err(invalid(
            "benchmark.requests_per_level",
            if requests_per_client.is_none() {
                "[benchmark] says how many requests a level measures in neither `requests_per_level` nor `requests_per_client`".into()
            } else {
                "a request-rate level has no clients to count per: it needs `requests_per_level`".into()
            },
            "add `requests_per_level = N` (or `requests_per_client = N` for concurrency levels only)",
        ));
    }
    if let Some(&c) = concurrency.iter().find(|&&c| {
        requests_per_client.is_some_and(|n| u64::from(n) * u64::from(c) > u64::from(u32::MAX))
    }) {
        return Err(invalid(
            "benchmark.requests_per_client",
            format!(
                "requests_per_client {} x concurrency {c} is more requests than one level can count",
                requests_per_client.unwrap_or(0)
            ),
            "use fewer requests per client",
        ));
    }
    if b.warmup_requests < 0 {
        return Err(invalid(
            "benchmark.warmup_requests",
            format!("warmup_requests = {} is negative", b.warmup_requests),
            "use 0 or more",
        ));
    }
    if b.warmup_requests > u32::MAX as i64 {
        return Err(invalid(
            "benchmark.warmup_requests",
            format!(
                "warmup_requests = {} is more than one level can count ({})",
                b.warmup_requests,
                u32::MAX
            ),
            "use fewer warm-up requests",
        ));
    }
    // more clients than requests: the extra clients never send, so the level measures less
    // concurrency than its name says
    let sent_at = |c: u32| u64::from(counts.at_concurrency(c)) + b.warmup_requests as u64;
    let mut level_warnings = Vec::new();
    let over: Vec<String> = concurrency
        .iter()
        .filter(|&&c| u64::from(c) > sent_at(c))
        .map(|c| c.to_string())
        .collect();
    if let (false, Some(per_level)) = (over.is_empty(), requests_per_level) {
        let sent = u64::from(per_level) + b.warmup_requests as u64;
        level_warnings.push(format!(
            "concurrency {} exceeds the {sent} requests a level sends (requests_per_level {per_level} + warmup_requests {}): at most {sent} are ever in flight there; raise requests_per_level",
            over.join(", "),
            b.warmup_requests
        ));
    }
    if b.request_rate.is_empty() && b.burstiness.is_some_and(|x| x != 1.0) {
        level_warnings.push(format!(
            "burstiness {burstiness} shapes the arrivals of request_rate levels, and this run has none: its concurrency levels ignore it"
        ));
    }
    let rate_sent = u64::from(counts.at_rate()) + b.warmup_requests as u64;
    let w = &file.workload;
    let workload = super::workload::resolve_workload(w, &model, path, base_dir, &invalid)?;
    let kv = super::workload::resolve_kv(s, &model, &workload, engine.kind, &invalid)?;
    let input_len = workload.prompt_bounds();
    let longest_output = workload.lengths.output_bounds().1.min(w.max_tokens);
    // the most requests a level holds unfinished at once: its clients (or all it sends), a
    // rate level's cap, or all of it at an infinite rate; a finite rate without a cap holds
    // what the server cannot keep up with, which only running it tells
    let rate_in_flight = max_concurrency.map(u64::from).or_else(|| {
        b.request_rate
            .iter()
            .any(|r| r.is_infinite())
            .then_some(u64::from(counts.at_rate()))
    });
    let (in_flight, key) = concurrency
        .iter()
        .map(|&c| (u64::from(c).min(sent_at(c)), "benchmark.concurrency"))
        .chain(
            rate_in_flight
                .filter(|_| !b.request_rate.is_empty())
                .map(|n| (n.min(rate_sent), "benchmark.max_concurrency")),
        )
        .max()
        .unwrap_or((0, "benchmark.concurrency"));
    let held = crate::footprint::level_bytes(in_flight, u64::from(longest_output));
    if let Some(available) = crate::footprint::available_bytes().filter(|&a| held > a) {
        return Err(invalid(
            key,
            format!(
                "{in_flight} requests in flight at once x up to {longest_output} output tokens hold about {} until they finish, more than the {} this machine has available",
                crate::footprint::human(held),
                crate::footprint::human(available)
            ),
            &format!(
                "run fewer requests at once, or shorter ones (each output token in flight costs about {} bytes)",
                crate::footprint::BYTES_PER_OUTPUT_TOKEN
            ),
        ));
    }
    let trace = w.trace.as_ref().map(|t| base_dir.join(t));
    let accept_length = match (w.accept_length, &trace) {
        (None, _) => None,
        (Some(_), Some(_)) => return Err(invalid(
            "workload.accept_length",
            "both `trace` and `accept_length` are set".into(),
            "give one: a trace replays recorded rounds, accept_length draws every round to a mean",
        )),
        (Some(a), None) => {
            let most = spec.shape.num_steps as f64 + 1.0;
            if !(a.is_finite() && a >= 1.0 && (!spec.is_speculative() || a <= most)) {
                return Err(invalid(
                    "workload.accept_length",
                    format!("accept_length {a} is outside 1..={most} (one token per round, up to every draft accepted plus the bonus)"),
                    "give the mean tokens per verify round, bonus included",
                ));
            }
            if spec.ngram.is_some() {
                return Err(invalid(
                    "workload.accept_length",
                    "n-gram's drafts depend on whether its lookup matches, which a mean accept length does not say".into(),
                    "give an n-gram trace (`kbench trace synth --preset ngram-illustrative`)",
                ));
            }
            Some(a)
        }
    };
    if let Some(s) = w.expert_spread {
        if !(s.is_finite() && s > 0.0 && s <= 1.0) {
            return Err(invalid(
                "workload.expert_spread",
                format!("expert_spread {s} is outside (0, 1]"),
                "give the share of the routed experts the batch's tokens draw from (1: all of them, independently)",
            ));
        }
    }
    if let Some(reference) = &file.reference {
        for p in &reference.points {
            if !crate::report::REFERENCE_METRICS.contains(&p.metric.as_str()) {
                return Err(invalid(
                    "reference.points.metric",
                    format!("unknown metric `{}`", p.metric),
                    &format!(
                        "use one of: {}",
                        crate::report::REFERENCE_METRICS.join(", ")
                    ),
                ));
            }
            if p.metric != "saturation_output_throughput" && p.concurrency.is_none() {
                return Err(invalid(
                    "reference.points.concurrency",
                    format!(
                        "reference point `{}` needs the concurrency it was measured at",
                        p.metric
                    ),
                    "add `concurrency = N` to the point",
                ));
            }
            if !(p.value.is_finite() && p.value > 0.0) {
                return Err(invalid(
                    "reference.points.value",
                    format!("reference value {} is not a positive number", p.value),
                    "give the measured value",
                ));
            }
        }
    }

    Ok(Experiment {
        tp_size: s.tp_size,
        custom_all_reduce: s.custom_all_reduce.unwrap_or(true),
        max_running_requests,
        cuda_graph_max_bs,
        requests: counts,
        warmup_requests: b.warmup_requests as u32,
        max_tokens: w.max_tokens,
        input_len,
        workload,
        kv,
        engine,
        trace,
        accept_length,
        expert_spread: w.expert_spread,
        concurrency,
        request_rates: b.request_rate.clone(),
        burstiness,
        max_concurrency,
        notes,
        warnings: level_warnings,
        speculative: spec,
        model,
        draft,
        hardware,
        path: path.into(),
        base_dir: base_dir.into(),
        file,
    })
}
