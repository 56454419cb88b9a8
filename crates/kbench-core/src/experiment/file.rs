//! The experiment file as written on disk (TOML). Every table rejects unknown keys so a
//! typo is an error, not a silently ignored setting.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub seed: u64,
    /// What the file assumes where its source is silent, shown in the report.
    #[serde(default)]
    pub assumptions: Vec<String>,
    pub model: ModelSection,
    #[serde(default)]
    pub draft: Option<DraftSection>,
    pub hardware: HardwareSection,
    /// The serving engine whose scheduler the simulator plays (SGLang unless set).
    #[serde(default)]
    pub engine: Option<EngineSection>,
    pub server: ServerSection,
    #[serde(default)]
    pub speculative: SpeculativeSection,
    pub workload: WorkloadSection,
    pub benchmark: BenchmarkSection,
    #[serde(default)]
    pub backend: BackendSection,
    #[serde(default)]
    pub reference: Option<ReferenceSection>,
    /// A declared sweep: each variant is this experiment with some keys overridden.
    #[serde(default)]
    pub sweep: Option<SweepSection>,
    /// `kbench search`'s space, objective and SLOs. kbench-core knows the seam only: the
    /// table is parsed, strictly, by kbench-search; every other command ignores it.
    #[serde(default)]
    pub search: Option<toml::Table>,
}

/// Keys whose values are paths relative to the experiment file: what must be rewritten
/// when a file is written somewhere else (`kbench search --emit`).
pub const RELATIVE_PATH_KEYS: &[&str] = &[
    "model.config",
    "draft.config",
    "hardware.profile",
    "engine.profile",
    "workload.trace",
    "workload.lengths",
    "backend.engine.model_dir",
    "backend.engine.draft_dir",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A preset name (`kimi-k2.5`, `deepseek-v3`, `llama-3.1-8b`).
    #[serde(default)]
    pub preset: Option<String>,
    /// A HF `config.json`, relative to the experiment file.
    #[serde(default)]
    pub config: Option<String>,
    /// If `config` does not exist yet, kbench creates the model there (`kbench model init`).
    #[serde(default)]
    pub init: Option<ModelInitSection>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInitSection {
    /// `tiny` or `kimi-slice`.
    pub preset: String,
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "default_draft_quality")]
    pub draft_quality: f32,
    #[serde(default)]
    pub layers: Option<u32>,
}

fn default_draft_quality() -> f32 {
    0.8
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftSection {
    #[serde(default)]
    pub preset: Option<String>,
    #[serde(default)]
    pub config: Option<String>,
    #[serde(default)]
    pub hidden_size: Option<u32>,
    #[serde(default)]
    pub num_heads: Option<u32>,
    #[serde(default)]
    pub num_kv_heads: Option<u32>,
    #[serde(default)]
    pub intermediate_size: Option<u32>,
    #[serde(default)]
    pub draft_vocab_size: Option<u32>,
    #[serde(default)]
    pub capture_layers: Option<Vec<u32>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareSection {
    #[serde(default)]
    pub preset: Option<String>,
    /// A hardware profile TOML, relative to the experiment file.
    #[serde(default)]
    pub profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    /// `sglang` or `vllm`.
    pub name: String,
    #[serde(default)]
    pub version: Option<String>,
    /// vLLM's one token budget per step, shared by decodes and prefill chunks
    /// (`--max-num-batched-tokens`; default 8192 for `vllm serve` on GPUs of 70 GiB or more,
    /// else 2048).
    #[serde(default)]
    pub max_num_batched_tokens: Option<u32>,
    /// The engine profile (host terms, launch costs) by preset name ...
    #[serde(default)]
    pub preset: Option<String>,
    /// ... or by file, relative to the experiment file. Neither: the engine's profile for
    /// the experiment's hardware if one ships, else the engine's generic priors.
    #[serde(default)]
    pub profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub tp_size: u32,
    #[serde(default)]
    pub max_running_requests: Option<u32>,
    #[serde(default)]
    pub cuda_graph_max_bs: Option<u32>,
    /// Share of each GPU's memory for weights plus the KV pool (SGLang's
    /// `--mem-fraction-static`, vLLM's `--gpu-memory-utilization`).
    #[serde(default)]
    pub mem_fraction_static: Option<f64>,
    /// The KV pool in tokens, instead of what memory allows (`--max-total-tokens`).
    #[serde(default)]
    pub max_total_tokens: Option<u32>,
    /// `auto` / `bf16` (default) or `fp8_e4m3` / `fp8_e5m2` (`--kv-cache-dtype`).
    #[serde(default)]
    pub kv_cache_dtype: Option<String>,
    /// Reuse cached prompt prefixes (SGLang's radix cache, vLLM's prefix caching): on unless
    /// turned off, as in both engines.
    #[serde(default)]
    pub prefix_caching: Option<bool>,
    /// Prompt tokens per prefill forward; longer prompts are prefilled in chunks (-1: never
    /// chunk). `--chunked-prefill-size`.
    #[serde(default)]
    pub chunked_prefill_size: Option<i64>,
    /// Prompt tokens admitted per prefill batch (`--max-prefill-tokens`, default 16384).
    #[serde(default)]
    pub max_prefill_tokens: Option<u32>,
    /// The longest request the server takes, prompt and output together (vLLM's
    /// `--max-model-len`, SGLang's `--context-length`); default the model's whole context.
    /// vLLM will not start unless one request of this length fits its KV cache.
    #[serde(default)]
    pub max_model_len: Option<u32>,
    /// The engine's own all-reduce for messages below its size cap (on unless turned off, as
    /// in both engines; `--disable-custom-all-reduce`). Where the engine profile prices one
    /// (`[collectives] all_reduce = "custom"`), off prices every all-reduce as NCCL's.
    #[serde(default)]
    pub custom_all_reduce: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Algorithm {
    #[default]
    #[serde(rename = "none", alias = "NONE")]
    None,
    #[serde(rename = "EAGLE3", alias = "eagle3")]
    Eagle3,
    /// vLLM's `eagle`: an EAGLE-1 head over the target's last hidden state (files name it
    /// with `method`, never `algorithm`).
    #[serde(rename = "eagle", skip_deserializing)]
    Eagle,
    /// The checkpoint's own multi-token-prediction layer as the draft: vLLM's `mtp`
    /// method, and SGLang's `algorithm = "NEXTN"` (server_args.py turns NEXTN into EAGLE
    /// with the target's own path as the draft's, so its NextN layer drafts the chain).
    #[serde(rename = "mtp", alias = "NEXTN", alias = "nextn")]
    Mtp,
    /// vLLM's `ngram`: prompt lookup on the host, 0..K tokens per step. A file may write
    /// it as SGLang's `algorithm = "NGRAM"`, to be told which one kbench simulates.
    #[serde(rename = "ngram", alias = "NGRAM")]
    Ngram,
}

impl Algorithm {
    /// Drafts with a separate EAGLE head (a `[draft]` section).
    pub fn uses_draft_head(self) -> bool {
        matches!(self, Algorithm::Eagle3 | Algorithm::Eagle)
    }

    /// Runs a draft model on the GPU (EAGLE heads and MTP layers; n-gram runs on the host).
    pub fn drafts_on_gpu(self) -> bool {
        matches!(self, Algorithm::Eagle3 | Algorithm::Eagle | Algorithm::Mtp)
    }

    /// The name SGLang's `--speculative-algorithm` takes (vLLM's methods have none).
    pub fn sglang_name(self) -> Option<&'static str> {
        match self {
            Algorithm::Eagle3 => Some("EAGLE3"),
            Algorithm::Mtp => Some("NEXTN"),
            Algorithm::None | Algorithm::Eagle | Algorithm::Ngram => None,
        }
    }

    /// The name the engine's own settings give it (`none` for no speculation).
    pub fn name_in(self, engine: super::ServingEngineKind) -> &'static str {
        match engine {
            super::ServingEngineKind::Sglang => self.sglang_name(),
            super::ServingEngineKind::Vllm => self.vllm_method(),
        }
        .unwrap_or("none")
    }

    /// The name vLLM's `--speculative-config` gives the method.
    pub fn vllm_method(self) -> Option<&'static str> {
        match self {
            Algorithm::None => None,
            Algorithm::Eagle3 => Some("eagle3"),
            Algorithm::Eagle => Some("eagle"),
            Algorithm::Mtp => Some("mtp"),
            Algorithm::Ngram => Some("ngram"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeSection {
    #[serde(default)]
    pub algorithm: Algorithm,
    #[serde(default)]
    pub num_steps: Option<u32>,
    #[serde(default)]
    pub eagle_topk: Option<u32>,
    #[serde(default)]
    pub num_draft_tokens: Option<u32>,
    /// SGLANG_ENABLE_SPEC_V2: the overlap scheduler.
    #[serde(default)]
    pub spec_v2: bool,
    /// Turn speculation off for a round whose batch exceeds this (the seed's fork has such
    /// a switch; upstream SGLang does not). Reported as non-upstream.
    #[serde(default)]
    pub disable_batch_threshold: Option<u32>,
    /// Allow settings SGLang rejects (e.g. v2 with trees) for what-if studies.
    #[serde(default)]
    pub allow_unsupported: bool,
    /// `greedy` (default), `target_only` (SGLang's tree sampling) or `exact` (lossless).
    #[serde(default)]
    pub verify: Option<String>,
    /// vLLM (`--speculative-config`): `eagle3`, `eagle`, `mtp` or `ngram`.
    #[serde(default)]
    pub method: Option<String>,
    /// vLLM: tokens drafted per step, K.
    #[serde(default)]
    pub num_speculative_tokens: Option<u32>,
    /// vLLM `ngram`: the shortest and longest suffix looked up in the prompt (5 and 5 unless
    /// set; one set copies it to the other).
    #[serde(default)]
    pub prompt_lookup_min: Option<u32>,
    #[serde(default)]
    pub prompt_lookup_max: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSection {
    /// Acceptance trace (sim backend), relative to the experiment file.
    #[serde(default)]
    pub trace: Option<String>,
    /// Instead of a trace: a mean accept length (tokens per verify round, bonus included)
    /// every round is drawn to, as vLLM's synthetic rejection sampler
    /// (`synthetic_acceptance_length`) and SGLang's `SGLANG_SIMULATE_ACC_LEN` draw it. For
    /// a source that reports only its mean acceptance.
    #[serde(default)]
    pub accept_length: Option<f64>,
    /// The share of a layer's routed experts the concurrent requests' tokens draw from, in
    /// (0, 1]. 1 (the default: the hardware profile's `efficiency.moe_expert_spread`) is
    /// every token's experts drawn independently from all of them; less where the requests
    /// route alike, as when every stream answers the same prompt.
    #[serde(default)]
    pub expert_spread: Option<f64>,
    pub max_tokens: u32,
    /// Prompt length in tokens; a fixed value...
    #[serde(default)]
    pub input_len: Option<u32>,
    /// ...or an inclusive range, sampled per request from the experiment seed.
    #[serde(default)]
    pub input_len_range: Option<[u32; 2]>,
    /// Output lengths drawn per request from an inclusive range (at most `max_tokens`).
    #[serde(default)]
    pub output_len_range: Option<[u32; 2]>,
    /// `sglang.bench_serving`'s random dataset: prompt and output lengths uniform over
    /// `[max(1, floor(len * ratio)), len]` of `input_len` and `max_tokens`.
    #[serde(default)]
    pub range_ratio: Option<f64>,
    /// A length file (histograms or (input, output) pairs, with its source), relative to
    /// the experiment file; outputs are capped at `max_tokens`.
    #[serde(default)]
    pub lengths: Option<String>,
    /// true (default): every request generates its drawn output length, as benchmarks ask
    /// with `ignore_eos`. false: it asks for `max_tokens` and stops at its drawn length as
    /// if it met EOS.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Tokens every request's prompt starts with (a system prompt, a shared document).
    #[serde(default)]
    pub shared_prefix_len: Option<u32>,
    /// Tokens of context of each request's own before its prompt (long-context decode).
    #[serde(default)]
    pub context_len: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchmarkSection {
    /// Closed-loop levels: this many clients, each sending its next request when its
    /// previous one finishes.
    #[serde(default)]
    pub concurrency: Vec<i64>,
    /// Open-loop levels, run after the concurrency levels: requests per second (`inf`: all
    /// at once), as `vllm bench serve --request-rate`.
    #[serde(default)]
    pub request_rate: Vec<f64>,
    /// Gamma shape of the inter-arrival gaps (1 = Poisson; smaller is burstier).
    #[serde(default)]
    pub burstiness: Option<f64>,
    /// At most this many requests in flight at a rate level (the rest wait at the client).
    #[serde(default)]
    pub max_concurrency: Option<i64>,
    /// Measured requests at every level (a rate level's count; a concurrency level's
    /// unless `requests_per_client` is set).
    #[serde(default)]
    pub requests_per_level: Option<i64>,
    /// Measured requests per closed-loop client: concurrency level C sends this times C,
    /// as harnesses that pass `--num-prompts` = N x concurrency do (InferenceX sends 10).
    #[serde(default)]
    pub requests_per_client: Option<i64>,
    #[serde(default)]
    pub warmup_requests: i64,
}

/// `[backend]`: the backend a plain `kbench experiment` runs (`kind`), and one table of
/// settings per backend (`[backend.engine]`, `[backend.http]`, ...). kbench-core knows the
/// seam, not the backends: each table is parsed, strictly, by its backend's own crate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendSection {
    /// `sim` (default), `engine` or `http`.
    pub kind: String,
    /// Each backend's settings, by backend name.
    #[serde(flatten)]
    pub settings: BTreeMap<String, toml::Table>,
}

/// The engine's keys before they had a table of their own: still read, into `[backend.engine]`.
const LEGACY_ENGINE_KEYS: [&str; 4] = ["model_dir", "draft_dir", "device", "kernels"];

impl<'de> Deserialize<'de> for BackendSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<BackendSection, D::Error> {
        use serde::de::Error;
        let table = toml::Table::deserialize(d)?;
        let mut kind = default_backend();
        let mut settings: BTreeMap<String, toml::Table> = BTreeMap::new();
        let mut legacy = toml::Table::new();
        for (key, value) in table {
            match (key.as_str(), value) {
                ("kind", toml::Value::String(k)) => kind = k,
                ("kind", other) => {
                    return Err(D::Error::custom(format!(
                        "`kind` must be a string (sim, engine, http), not {}",
                        other.type_str()
                    )))
                }
                (k, v) if LEGACY_ENGINE_KEYS.contains(&k) => {
                    legacy.insert(key, v);
                }
                (_, toml::Value::Table(t)) => {
                    settings.insert(key, t);
                }
                (k, other) => {
                    return Err(D::Error::custom(format!(
                        "unknown field `{k}` ({}): [backend] holds `kind` and one table per \
                         backend, e.g. [backend.engine] or [backend.http]",
                        other.type_str()
                    )))
                }
            }
        }
        if !legacy.is_empty() {
            let engine = settings.entry("engine".into()).or_default();
            for (k, v) in legacy {
                if engine.contains_key(&k) {
                    return Err(D::Error::custom(format!(
                        "`{k}` is set both in [backend] and in [backend.engine]; keep the \
                         [backend.engine] one"
                    )));
                }
                engine.insert(k, v);
            }
        }
        Ok(BackendSection { kind, settings })
    }
}

impl BackendSection {
    /// A backend's settings table (empty if the file has none).
    pub fn table(&self, backend: &str) -> toml::Table {
        self.settings.get(backend).cloned().unwrap_or_default()
    }

    /// A backend's settings parsed into its own type; the error names the table.
    pub fn parse<T: serde::de::DeserializeOwned>(&self, backend: &str) -> Result<T, String> {
        toml::Value::Table(self.table(backend))
            .try_into()
            .map_err(|e: toml::de::Error| format!("[backend.{backend}]: {}", e.message()))
    }
}

fn default_backend() -> String {
    "sim".into()
}

impl Default for BackendSection {
    fn default() -> Self {
        BackendSection {
            kind: default_backend(),
            settings: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceSection {
    pub source: String,
    #[serde(default)]
    pub note: Option<String>,
    #[serde(default)]
    pub points: Vec<ReferencePoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferencePoint {
    /// `output_throughput` at a concurrency, or `saturation_output_throughput`.
    pub metric: String,
    #[serde(default)]
    pub concurrency: Option<u32>,
    pub value: f64,
    #[serde(default)]
    pub approximate: bool,
    #[serde(default)]
    pub label: Option<String>,
    /// Sweep variant this point belongs to (sweep files only).
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSection {
    pub variants: Vec<SweepVariant>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepVariant {
    pub name: String,
    /// Dotted keys to override, as with `--set`.
    pub set: BTreeMap<String, toml::Value>,
}

#[cfg(test)]
mod backend_section_tests {
    use super::BackendSection;

    fn parse(text: &str) -> Result<BackendSection, String> {
        toml::from_str::<toml::Table>(text)
            .unwrap()
            .remove("backend")
            .unwrap()
            .try_into()
            .map_err(|e: toml::de::Error| e.message().to_string())
    }

    #[test]
    fn one_table_per_backend_and_legacy_engine_keys() {
        let b = parse("[backend]\nkind = \"http\"\n[backend.http]\nurl = \"u\"\n[backend.engine]\ndevice = \"cpu\"").unwrap();
        assert_eq!(b.kind, "http");
        assert_eq!(b.table("http")["url"].as_str(), Some("u"));
        assert!(b.table("sim").is_empty());
        // the keys [backend] held before each backend had its table
        let b =
            parse("[backend]\nkind = \"engine\"\nmodel_dir = \"m\"\ndevice = \"cuda\"").unwrap();
        assert_eq!(b.table("engine")["model_dir"].as_str(), Some("m"));
        assert_eq!(b.table("engine")["device"].as_str(), Some("cuda"));
        let e =
            parse("[backend]\ndevice = \"cpu\"\n[backend.engine]\ndevice = \"cuda\"").unwrap_err();
        assert!(e.contains("both"), "{e}");
        let e = parse("[backend]\nurl = \"x\"").unwrap_err();
        assert!(e.contains("unknown field `url`"), "{e}");
        let e = parse("[backend]\nkind = 3").unwrap_err();
        assert!(e.contains("must be a string"), "{e}");
    }
}
