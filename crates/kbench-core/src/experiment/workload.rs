//! `[workload]` and the KV-cache keys of `[server]`, checked: the lengths requests draw,
//! their shared prefix and context, and how the server holds and fills its KV cache.

use std::path::Path;

use serde::Serialize;

use super::error::ExperimentError;
use super::file::{ServerSection, WorkloadSection};
use crate::arch::ModelArch;
use crate::lengths::{range_ratio_bounds, Drawn, EmpiricalLengths, LengthDist};

/// What each request of the experiment looks like.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    pub lengths: LengthDist,
    /// The cap on output tokens, and each request's `max_tokens` when not `ignore_eos`.
    pub max_tokens: u32,
    pub ignore_eos: bool,
    /// Leading prompt tokens every request shares.
    pub shared_prefix_len: u32,
    /// Each request's own context before its drawn prompt.
    pub context_len: u32,
}

/// One request's lengths as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLengths {
    /// The whole prompt: shared prefix + context + drawn prompt.
    pub input_len: u32,
    /// What the request asks for (`max_tokens`).
    pub max_tokens: u32,
    /// Where it stops as if it met EOS (`None`: it ignores EOS and runs to `max_tokens`).
    pub stop_at: Option<u32>,
}

impl Workload {
    pub fn request(&self, seed: u64, id: u64) -> RequestLengths {
        let Drawn { input, output } = self.lengths.draw(seed, id);
        let output = output.min(self.max_tokens);
        RequestLengths {
            input_len: self.shared_prefix_len + self.context_len + input,
            max_tokens: if self.ignore_eos {
                output
            } else {
                self.max_tokens
            },
            stop_at: (!self.ignore_eos).then_some(output),
        }
    }

    /// The shortest and longest whole prompt.
    pub fn prompt_bounds(&self) -> (u32, u32) {
        let (lo, hi) = self.lengths.input_bounds();
        let fixed = self.shared_prefix_len + self.context_len;
        (fixed + lo, fixed + hi)
    }
}

/// `--kv-cache-dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtype {
    #[default]
    Bf16,
    Fp8E4m3,
    Fp8E5m2,
}

impl KvCacheDtype {
    /// The `--kv-cache-dtype` value both engines take for it; `None` for their default.
    pub fn flag_value(self) -> Option<&'static str> {
        match self {
            KvCacheDtype::Bf16 => None,
            KvCacheDtype::Fp8E4m3 => Some("fp8_e4m3"),
            KvCacheDtype::Fp8E5m2 => Some("fp8_e5m2"),
        }
    }

    pub fn bytes(self) -> u32 {
        match self {
            KvCacheDtype::Bf16 => 2,
            KvCacheDtype::Fp8E4m3 | KvCacheDtype::Fp8E5m2 => 1,
        }
    }
}

/// `--chunked-prefill-size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ChunkedPrefill {
    /// Unset: the engine's default for the GPU.
    Default,
    /// -1: prompts are prefilled whole.
    Off,
    Size(u32),
}

/// How the server holds its KV cache and fills it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvSettings {
    pub mem_fraction_static: Option<f64>,
    pub max_total_tokens: Option<u32>,
    pub kv_cache_dtype: KvCacheDtype,
    pub prefix_caching: bool,
    pub chunked_prefill: ChunkedPrefill,
    pub max_prefill_tokens: u32,
    /// `None`: the model's maximum context.
    pub max_model_len: Option<u32>,
}

/// SGLang's default `--max-prefill-tokens`.
pub const DEFAULT_MAX_PREFILL_TOKENS: u32 = 16384;

type Invalid<'a> = &'a dyn Fn(&'static str, String, &str) -> ExperimentError;

pub(crate) fn resolve_workload(
    w: &WorkloadSection,
    model: &ModelArch,
    path: &Path,
    base_dir: &Path,
    invalid: Invalid,
) -> Result<Workload, ExperimentError> {
    if w.max_tokens == 0 {
        return Err(invalid(
            "workload.max_tokens",
            "max_tokens = 0 generates nothing".into(),
            "use 1 or more",
        ));
    }
    let ratio = match w.range_ratio {
        None => None,
        Some(r) if (0.0..=1.0).contains(&r) => Some(r),
        Some(r) => {
            return Err(invalid(
                "workload.range_ratio",
                format!("range_ratio = {r} is outside [0, 1]"),
                "bench_serving draws lengths from [len * ratio, len]: use 0 to 1",
            ))
        }
    };
    let lengths = if let Some(file) = &w.lengths {
        if w.input_len.is_some() || w.input_len_range.is_some() || w.output_len_range.is_some() {
            return Err(invalid(
                "workload.lengths",
                "a length file gives the prompt and output lengths: input_len, input_len_range and output_len_range cannot be set beside it".into(),
                "keep `lengths`, or remove it and give the lengths directly",
            ));
        }
        if ratio.is_some() {
            return Err(invalid(
                "workload.range_ratio",
                "range_ratio draws around input_len and max_tokens, not from a length file".into(),
                "remove range_ratio or `lengths`",
            ));
        }
        let e = EmpiricalLengths::load(&base_dir.join(file)).map_err(|source| {
            ExperimentError::Lengths {
                path: path.into(),
                source,
            }
        })?;
        LengthDist::Empirical(e)
    } else {
        let input = match (w.input_len, w.input_len_range) {
            (Some(n), None) if n > 0 => (n, n),
            (None, Some([lo, hi])) if lo > 0 && lo <= hi => (lo, hi),
            (None, None) => return Err(invalid(
                "workload.input_len",
                "the workload needs a prompt length".into(),
                "set `input_len = 512`, `input_len_range = [256, 1024]` or `lengths = \"FILE\"`",
            )),
            _ => {
                return Err(invalid(
                    "workload.input_len",
                    "give one of input_len (>= 1) or input_len_range = [lo, hi] with 1 <= lo <= hi"
                        .into(),
                    "e.g. input_len = 512",
                ))
            }
        };
        let output = match w.output_len_range {
            None => (w.max_tokens, w.max_tokens),
            Some([lo, hi]) if lo > 0 && lo <= hi && hi <= w.max_tokens => (lo, hi),
            Some([lo, hi]) => {
                return Err(invalid(
                    "workload.output_len_range",
                    format!(
                    "output_len_range = [{lo}, {hi}] must satisfy 1 <= lo <= hi <= max_tokens ({})",
                    w.max_tokens
                ),
                    "e.g. output_len_range = [64, 256] with max_tokens = 256",
                ))
            }
        };
        match ratio {
            Some(_) if w.input_len_range.is_some() || w.output_len_range.is_some() => {
                return Err(invalid(
                    "workload.range_ratio",
                    "range_ratio draws around input_len and max_tokens; it cannot be set beside input_len_range or output_len_range".into(),
                    "keep one way of giving the ranges",
                ))
            }
            Some(r) => LengthDist::Uniform {
                input: range_ratio_bounds(input.0, r),
                output: range_ratio_bounds(w.max_tokens, r),
            },
            None => LengthDist::Uniform { input, output },
        }
    };
    let workload = Workload {
        lengths,
        max_tokens: w.max_tokens,
        ignore_eos: w.ignore_eos.unwrap_or(true),
        shared_prefix_len: w.shared_prefix_len.unwrap_or(0),
        context_len: w.context_len.unwrap_or(0),
    };
    // SGLang refuses a request whose prompt plus max_new_tokens exceeds the context length
    // (its tokenizer manager's check), before it reaches the scheduler.
    let (_, longest) = workload.prompt_bounds();
    let asked = longest as u64 + w.max_tokens as u64;
    if asked > model.max_position_embeddings {
        return Err(invalid(
            "workload.context_len",
            format!(
                "the longest request needs {asked} tokens ({longest} of prompt, with shared prefix and context, + max_tokens {}), beyond {}'s maximum context of {} tokens",
                w.max_tokens, model.name, model.max_position_embeddings
            ),
            "shorten context_len / the prompt, or lower max_tokens",
        ));
    }
    Ok(workload)
}

pub(crate) fn resolve_kv(
    s: &ServerSection,
    model: &ModelArch,
    workload: &Workload,
    engine: ServingEngineKind,
    invalid: Invalid,
) -> Result<KvSettings, ExperimentError> {
    if let Some(len) = s.max_model_len {
        if len == 0 || len as u64 > model.max_position_embeddings {
            return Err(invalid(
                "server.max_model_len",
                format!(
                    "max_model_len = {len} is outside 1..={}, {}'s maximum context",
                    model.max_position_embeddings, model.name
                ),
                "use a length up to the model's context, or remove it",
            ));
        }
        let (_, longest) = workload.prompt_bounds();
        let asked = longest as u64 + workload.max_tokens as u64;
        // SGLang refuses prompt + max_new_tokens reaching its context length
        // (TokenizerManager._validate_one_request: `>= _max_req_len`), vLLM only beyond
        // max_model_len
        let refused = match engine {
            ServingEngineKind::Sglang => asked >= len as u64,
            ServingEngineKind::Vllm => asked > len as u64,
        };
        if refused {
            return Err(invalid(
                "server.max_model_len",
                format!(
                    "the longest request needs {asked} tokens ({longest} of prompt + max_tokens {}), beyond max_model_len = {len}: the server would refuse it",
                    workload.max_tokens
                ),
                "raise max_model_len, or shorten the prompt or max_tokens",
            ));
        }
    }
    let mem_fraction_static = match s.mem_fraction_static {
        None => None,
        Some(f) if f > 0.0 && f < 1.0 => Some(f),
        Some(f) => {
            return Err(invalid(
                "server.mem_fraction_static",
                format!("mem_fraction_static = {f} is not a share of memory between 0 and 1"),
                "e.g. mem_fraction_static = 0.88",
            ))
        }
    };
    if s.max_total_tokens == Some(0) {
        return Err(invalid(
            "server.max_total_tokens",
            "max_total_tokens = 0 leaves no KV cache".into(),
            "use 1 or more, or remove it to size the pool from memory",
        ));
    }
    let kv_cache_dtype = match s.kv_cache_dtype.as_deref() {
        None | Some("auto") | Some("bf16") | Some("bfloat16") => KvCacheDtype::Bf16,
        Some("fp8") | Some("fp8_e4m3") => KvCacheDtype::Fp8E4m3,
        Some("fp8_e5m2") => KvCacheDtype::Fp8E5m2,
        Some(other) => {
            return Err(invalid(
                "server.kv_cache_dtype",
                format!("unknown kv_cache_dtype `{other}`"),
                "use auto, bf16, fp8_e4m3 or fp8_e5m2",
            ))
        }
    };
    let chunked_prefill = match s.chunked_prefill_size {
        None => ChunkedPrefill::Default,
        Some(-1) => ChunkedPrefill::Off,
        Some(n) if n > 0 && n <= u32::MAX as i64 => ChunkedPrefill::Size(n as u32),
        Some(n) => {
            return Err(invalid(
                "server.chunked_prefill_size",
                format!("chunked_prefill_size = {n} is not a token count"),
                "use a positive size, or -1 to prefill prompts whole",
            ))
        }
    };
    let max_prefill_tokens = match s.max_prefill_tokens {
        None => DEFAULT_MAX_PREFILL_TOKENS,
        Some(0) => {
            return Err(invalid(
                "server.max_prefill_tokens",
                "max_prefill_tokens = 0 admits no prompt".into(),
                "use 1 or more",
            ))
        }
        Some(n) => n,
    };
    Ok(KvSettings {
        mem_fraction_static,
        max_total_tokens: s.max_total_tokens,
        kv_cache_dtype,
        prefix_caching: s.prefix_caching.unwrap_or(true),
        chunked_prefill,
        max_prefill_tokens,
        max_model_len: s.max_model_len,
    })
}

/// Which serving engine the simulator plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ServingEngineKind {
    /// Prefill first: an admitted prompt runs as its own forward (in chunks) while the
    /// running requests wait.
    #[default]
    Sglang,
    /// vLLM V1: each step spends one token budget on the running requests' decodes first,
    /// then on prefill chunks, in one forward.
    Vllm,
}

impl ServingEngineKind {
    pub fn name(self) -> &'static str {
        match self {
            ServingEngineKind::Sglang => "sglang",
            ServingEngineKind::Vllm => "vllm",
        }
    }
}

/// Which engine profile the experiment names; its contents are the backend's business.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum EngineProfileRef {
    Preset(String),
    Profile(std::path::PathBuf),
}

/// The serving engine an experiment is about (SGLang or vLLM, its version and profile);
/// kbench's own engine has its settings in kbench-engine.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct ServingEngine {
    pub kind: ServingEngineKind,
    pub version: Option<String>,
    /// vLLM's token budget (`None`: its default for the GPU).
    pub max_num_batched_tokens: Option<u32>,
    /// `None`: the engine's profile for the hardware, else its generic one.
    pub profile: Option<EngineProfileRef>,
}

pub(crate) fn resolve_engine(
    e: Option<&super::file::EngineSection>,
    base_dir: &std::path::Path,
    invalid: Invalid,
) -> Result<ServingEngine, ExperimentError> {
    let Some(e) = e else {
        return Ok(ServingEngine::default());
    };
    let kind = match e.name.as_str() {
        "sglang" => ServingEngineKind::Sglang,
        "vllm" => ServingEngineKind::Vllm,
        other => {
            return Err(invalid(
                "engine.name",
                format!("unknown engine `{other}`"),
                "use sglang or vllm",
            ))
        }
    };
    if e.max_num_batched_tokens == Some(0) {
        return Err(invalid(
            "engine.max_num_batched_tokens",
            "max_num_batched_tokens = 0 schedules nothing".into(),
            "use 1 or more, or leave it to vLLM's default",
        ));
    }
    if e.max_num_batched_tokens.is_some() && kind != ServingEngineKind::Vllm {
        return Err(invalid(
            "engine.max_num_batched_tokens",
            "max_num_batched_tokens is vLLM's; SGLang's prefill budget is server.max_prefill_tokens / chunked_prefill_size".into(),
            "set engine.name = \"vllm\", or use the server keys",
        ));
    }
    let profile = match (&e.preset, &e.profile) {
        (None, None) => None,
        (Some(p), None) => Some(EngineProfileRef::Preset(p.clone())),
        (None, Some(p)) => Some(EngineProfileRef::Profile(base_dir.join(p))),
        (Some(_), Some(_)) => {
            return Err(invalid(
                "engine.profile",
                "[engine] names both a `preset` and a `profile`".into(),
                "keep one of them",
            ))
        }
    };
    Ok(ServingEngine {
        kind,
        version: e.version.clone(),
        max_num_batched_tokens: e.max_num_batched_tokens,
        profile,
    })
}
