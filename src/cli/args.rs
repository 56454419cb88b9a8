//! Command-line grammar.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "kbench",
    version,
    about = "Predict and confirm EAGLE-3 speculative decoding on large MoE models",
    long_about = "kbench runs one experiment file on a backend: `sim` predicts it in virtual time from \
a calibrated cost model and recorded acceptance traces; `engine` runs the project's own target model \
and EAGLE-3 draft head for real. Reports follow `sglang.bench_serving` / `vllm bench serve` key names.",
    after_help = super::exit::HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an experiment file: every concurrency level (and sweep variant) on a backend.
    Experiment(ExperimentArgs),
    /// Check an experiment file without running it.
    Validate(ValidateArgs),
    /// Acceptance traces: synthesize, summarize, convert, record.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Fit engine profiles' free parameters to the corpus's `fit` points, with held-apart error.
    Calibrate(CalibrateArgs),
    /// Set a GPU's measured per-pass layer times (gpu-check.sh's profile.toml) beside the
    /// cost model's and fit efficiency.in_model to them.
    CalibratePasses(CalibratePassesArgs),
    /// Create model checkpoints in the real on-disk format.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Generate text with the engine (optionally with EAGLE-3 speculation).
    Generate(GenerateArgs),
    /// CUDA kernels: compile them through NVRTC (no GPU needed).
    #[command(subcommand)]
    Kernels(KernelsCommand),
    /// Print the SGLang launch command (and environment) an experiment file implies.
    SglangArgs(SglangArgsArgs),
    /// Print the `vllm serve` command (with `--speculative-config`) an experiment file implies.
    VllmArgs(SglangArgsArgs),
    /// Set two or more `--json` reports (any backends) side by side per level, with each
    /// one's difference from the first.
    Compare(CompareArgs),
    /// Run the fidelity corpus (public measurements, each in experiment-file terms) on the
    /// simulator: every point measured beside predicted, and the errors per role and metric.
    Fidelity(FidelityArgs),
    /// Search a space of configurations (an experiment file's [search]) on the simulator for
    /// the best under latency SLOs: ranked, with the throughput/per-request-speed frontier and
    /// why the winner beats the runner-up.
    Search(SearchArgs),
    /// Serve SGLang's and OpenAI's HTTP APIs: the engine (--model), or an experiment's
    /// modelled deployment played out in wall time (--sim). Flags keep SGLang's names.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// An experiment file with a [search] table (or any file, with --space).
    pub file: PathBuf,
    /// An axis: KEY=VALUES with VALUES a list ([1, 2, 4]), a range (1..5, or
    /// {min = 16, max = 256, factor = 2}), auto (speculative.num_draft_tokens), or one value.
    /// Adds to the file's [search.space] or replaces its axis for KEY (repeatable).
    #[arg(long, value_name = "KEY=VALUES")]
    pub space: Vec<String>,
    /// The report metric to maximise (throughputs, accept length) or minimise (`*_ms`).
    #[arg(long, value_name = "METRIC")]
    pub objective: Option<String>,
    /// Where the objective is read: saturation (the best level meeting the SLOs), a
    /// concurrency, or rate=R.
    #[arg(long, value_name = "WHERE")]
    pub at: Option<String>,
    /// A service-level objective on a report metric at the objective's level, e.g.
    /// "p99_tpot_ms <= 50" (repeatable; added to the file's).
    #[arg(long, value_name = "METRIC<=VALUE")]
    pub slo: Vec<String>,
    /// Print the whole Pareto frontier (output throughput against per-request speed), not
    /// only its summary.
    #[arg(long)]
    pub pareto: bool,
    /// Rows of the ranked table.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub top: Option<usize>,
    /// Run spaces larger than the default limit of 5000 candidates.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_candidates: Option<usize>,
    /// Also run configurations SGLang refuses that the simulator can model (v2 with
    /// trees), marked as unsupported.
    #[arg(long)]
    pub allow_unsupported: bool,
    /// Worker threads (default: one per core); the result is the same for any number.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub threads: usize,
    /// Override a field of the base experiment (repeatable), as `kbench experiment --set`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Write every candidate, the ranking, the frontier and the decomposition as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write one CSV row per candidate.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Draw the frontier with the chosen configuration marked (SVG).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Write the winner as an experiment file (`kbench sglang-args` gives its launch line).
    #[arg(long, value_name = "FILE")]
    pub emit: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Reports written by `kbench experiment --json` (a sweep's file counts one per variant);
    /// the first is the base the differences are taken from.
    #[arg(required = true, num_args = 2.., value_name = "REPORT.json")]
    pub reports: Vec<PathBuf>,
    /// Also write output throughput against concurrency, one line per report, as SVG.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct FidelityArgs {
    /// Corpus files (default: every `*.toml` in data/validation/).
    #[arg(value_name = "CORPUS.toml")]
    pub files: Vec<PathBuf>,
    /// Also write every point and the summary as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write a parity plot (measured against predicted, log-log, the +-10% band) as SVG.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SglangArgsArgs {
    pub file: PathBuf,
    /// Only this sweep variant.
    #[arg(long)]
    pub variant: Option<String>,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Checkpoint directory the engine serves (SGLang: --model-path).
    #[arg(long, visible_alias = "model-path", conflicts_with = "sim")]
    pub model: Option<PathBuf>,
    /// EAGLE-3 draft checkpoint (default MODEL/draft when speculating).
    #[arg(
        long,
        visible_alias = "speculative-draft-model-path",
        requires = "model"
    )]
    pub draft: Option<PathBuf>,
    /// Serve an experiment file's simulated deployment instead of the engine.
    #[arg(long, value_name = "FILE")]
    pub sim: Option<PathBuf>,
    /// --sim: virtual seconds per wall second (the modelled deployment played X times faster).
    #[arg(long, requires = "sim", allow_negative_numbers = true)]
    pub speed: Option<f64>,
    /// --sim: override an experiment field (repeatable), as `kbench experiment --set`.
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "sim")]
    pub set: Vec<String>,
    /// EAGLE3, NEXTN (--sim), EAGLE (the file's own, as SGLang reports NEXTN) or NONE.
    #[arg(long)]
    pub speculative_algorithm: Option<String>,
    /// SGLang's switch off the overlap scheduler. --sim: speculation runs spec v1 (plain
    /// decoding without the overlap is not modelled, and is refused); the engine runs its
    /// rounds one after another anyway.
    #[arg(long)]
    pub disable_overlap_schedule: bool,
    #[arg(long)]
    pub speculative_num_steps: Option<u32>,
    #[arg(long)]
    pub speculative_eagle_topk: Option<u32>,
    #[arg(long)]
    pub speculative_num_draft_tokens: Option<u32>,
    /// Requests decoded together (the batch cap); more wait in the queue.
    #[arg(long)]
    pub max_running_requests: Option<u32>,
    /// The engine serves on one device (1 only); --sim: the modelled deployment's tp_size.
    #[arg(long)]
    pub tp_size: Option<u32>,
    /// --sim: the modelled deployment's CUDA graph bound; the CPU engine has no graphs and
    /// records the value only.
    #[arg(long)]
    pub cuda_graph_max_bs: Option<u32>,
    /// Requests waiting beyond the running ones before new ones get 429.
    #[arg(long, default_value_t = 4096)]
    pub max_queued_requests: u32,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every request but /health, /health_generate and
    /// /metrics.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Longest prompt + output accepted (default: the model's max_position_embeddings).
    #[arg(long)]
    pub context_length: Option<usize>,
    /// Longest prompt accepted; beyond it, 400. Default for the engine: what it prefills in
    /// 30 s on this machine, timed at load; --sim: the context length.
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,
    /// The engine prefills longer prompts a chunk per forward, the running requests' rounds
    /// between chunks (SGLang's flag; -1: in one forward). Default: 256 on cpu, 2048 on cuda.
    #[arg(long, allow_negative_numbers = true)]
    pub chunked_prefill_size: Option<i64>,
    /// The model name in OpenAI responses and /v1/models (default: the model directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Engine device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Seeds sampling for requests that give no seed.
    #[arg(long, default_value_t = 0)]
    pub random_seed: u64,
    /// vLLM's flag: each OpenAI response carries `metrics.speculative_decoding` (streamed in
    /// the final usage chunk); `detailed` adds every round's accepted and drafted counts.
    #[arg(long, value_parser = ["summary", "detailed"])]
    pub per_request_spec_decode_metrics: Option<String>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a client has to send a request's headers, and then its body.
    #[arg(long, default_value_t = 30.0)]
    pub read_timeout_secs: f64,
    /// On SIGTERM, seconds running requests get to finish.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout_secs: f64,
    /// Fault injection: the fraction of requests answered with a fault.
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Which faults: rate_limit, server_error, context_length, invalid_api_key, drop, stall, malformed.
    #[arg(long, value_delimiter = ',')]
    pub fail_kinds: Vec<String>,
    #[arg(long, default_value_t = 0)]
    pub fail_seed: u64,
    /// How long a `stall` fault holds a stream before closing it.
    #[arg(long, default_value_t = 30.0)]
    pub fail_stall_secs: f64,
    /// One line on stderr per finished request: id, method, endpoint, HTTP status, prompt and
    /// completion tokens, duration in ms.
    #[arg(long)]
    pub log_requests: bool,
    /// SGLang's flag: each chunk of a /generate stream carries only its new text and
    /// output_ids (by default every chunk repeats the whole output so far).
    #[arg(long, alias = "stream-output")]
    pub incremental_streaming_output: bool,
}

#[derive(Debug, Args)]
pub struct ExperimentArgs {
    /// The experiment file (TOML).
    pub file: PathBuf,
    /// Backend, replacing the file's `[backend] kind`.
    #[arg(long, value_parser = ["sim", "engine", "http"])]
    pub backend: Option<String>,
    /// Concurrency levels, replacing the file's list.
    #[arg(long, num_args = 1.., allow_negative_numbers = true)]
    pub concurrency: Vec<i64>,
    /// Request-rate levels (requests/s, or inf), replacing the file's; alone, they replace its
    /// concurrency levels too (as `vllm bench serve --request-rate`).
    #[arg(long, num_args = 1.., value_name = "RATE", allow_negative_numbers = true)]
    pub request_rate: Vec<String>,
    /// Gamma shape of the inter-arrival gaps at rate levels (1 = Poisson).
    #[arg(long, allow_negative_numbers = true)]
    pub burstiness: Option<f64>,
    /// At rate levels, at most this many requests in flight.
    #[arg(long, allow_negative_numbers = true)]
    pub max_concurrency: Option<i64>,
    /// Measured requests per level.
    #[arg(long, visible_alias = "num-requests", allow_negative_numbers = true)]
    pub requests_per_level: Option<i64>,
    /// Measured requests per client at a concurrency level (level C sends N x C).
    #[arg(long, allow_negative_numbers = true)]
    pub requests_per_client: Option<i64>,
    /// Warm-up requests per level (served, not measured).
    #[arg(long, allow_negative_numbers = true)]
    pub warmup_requests: Option<i64>,
    /// Output tokens per request.
    #[arg(long, allow_negative_numbers = true)]
    pub max_tokens: Option<i64>,
    /// Override any field: --set speculative.num_steps=3 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Shorthand for --backend http --set backend.http.url="URL" (the seed script's flag).
    #[arg(long, value_name = "URL")]
    pub server_url: Option<String>,
    /// Also run the simulator on the same file and print its prediction beside each level
    /// (the default on the http backend, where a file the simulator cannot run gets a note
    /// instead).
    #[arg(long, conflicts_with = "no_predict")]
    pub predict: bool,
    /// No prediction beside an http backend's measurement.
    #[arg(long)]
    pub no_predict: bool,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one CSV row per level here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Draw the run's dashboard (SVG) here: throughput, per-GPU against per-user speed,
    /// TTFT and TPOT against load.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print nothing but errors (files are still written).
    #[arg(long, short)]
    pub quiet: bool,
    /// Print every column and every line whole, past 100 columns.
    #[arg(long)]
    pub wide: bool,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    pub file: PathBuf,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Synthesize a trace from per-depth acceptance rates.
    Synth(TraceSynthArgs),
    /// Per-depth acceptance and expected accept length.
    Stats(TraceStatsArgs),
    /// Convert between the binary (.kbt) and JSONL (.jsonl) forms.
    Convert(TraceConvertArgs),
    /// Record a trace from the engine (target + draft).
    Record(TraceRecordArgs),
}

#[derive(Debug, Args)]
pub struct TraceSynthArgs {
    /// Start from a shipped preset's parameters (kimi-k2.5-eagle3-chat, kimi-k2.5-eagle3-math).
    #[arg(long, conflicts_with = "params")]
    pub preset: Option<String>,
    /// Start from a parameter file (TOML with the generator's keys, docs/trace-format.md).
    #[arg(long)]
    pub params: Option<PathBuf>,
    /// Per-depth top-1 acceptance rates, e.g. 0.75,0.73,0.72 (sets the recorded depth).
    // a list whose first rate is negative does not look like one number to clap
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub accept: Vec<f64>,
    /// Probability a position keeps its easy/hard regime (0 = independent positions).
    #[arg(long, allow_negative_numbers = true)]
    pub stickiness: Option<f64>,
    /// How far apart the easy and hard regimes are (0..1).
    #[arg(long, allow_negative_numbers = true)]
    pub contrast: Option<f64>,
    #[arg(long, allow_negative_numbers = true)]
    pub sequences: Option<u32>,
    #[arg(long, allow_negative_numbers = true)]
    pub positions: Option<u32>,
    /// Recorded top-K per depth.
    #[arg(long, allow_negative_numbers = true)]
    pub topk: Option<u32>,
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// What the rates are calibrated to (stored in the header).
    #[arg(long)]
    pub dataset: Option<String>,
    /// Output; .kbt writes the binary form, .jsonl the text form.
    #[arg(long, short)]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct TraceStatsArgs {
    pub file: PathBuf,
    /// Configurations to evaluate, as STEPS/TOPK/DRAFT_TOKENS (repeatable).
    #[arg(long = "config", value_name = "S/K/D")]
    pub configs: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TraceConvertArgs {
    pub input: PathBuf,
    /// Output; the extension picks the form (.kbt binary, .jsonl text).
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct TraceRecordArgs {
    /// Record from the engine's own draft: the checkpoint directory.
    // one of --model and --experiment is required: checked by the command, whose message
    // names both ways, where clap's would name --model alone
    #[arg(long, conflicts_with = "experiment")]
    pub model: Option<PathBuf>,
    /// Record from a live server's verify rounds instead: run this experiment file's levels
    /// on the http backend (a chain server gives exact accept/miss up to its num_steps; a
    /// tree server only accept lengths).
    #[arg(long, value_name = "FILE")]
    pub experiment: Option<PathBuf>,
    /// With --experiment: the server (shorthand for --set backend.http.url=...).
    #[arg(long, requires = "experiment")]
    pub server_url: Option<String>,
    /// With --experiment: overrides, as `kbench experiment --set`.
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "experiment")]
    pub set: Vec<String>,
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Number of prompts (deterministic random token prompts) to record.
    #[arg(long, default_value_t = 16, allow_negative_numbers = true)]
    pub prompts: u32,
    #[arg(long, default_value_t = 16, allow_negative_numbers = true)]
    pub prompt_len: u32,
    /// Target tokens generated per prompt (positions recorded).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 5, allow_negative_numbers = true)]
    pub depth: u32,
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    pub topk: u32,
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub seed: u64,
    #[arg(long, short)]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Corpus files whose `fit` points are fitted to (default: every `*.toml` in
    /// data/validation/). `check` points are never read.
    #[arg(value_name = "CORPUS.toml")]
    pub files: Vec<PathBuf>,
    /// Only this engine profile (repeatable; default: every profile the fit cases run on
    /// that declares [[free]] parameters).
    #[arg(long = "profile", value_name = "NAME")]
    pub profiles: Vec<String>,
    /// Write each fitted profile here as NAME.toml (experiments/engines updates the shipped
    /// presets); without it nothing is written.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct CalibratePassesArgs {
    /// The GPU's layer-stack profile (profile.toml from scripts/gpu-check.sh).
    pub measured: PathBuf,
    /// Hardware profile to predict with: a file, or a preset name (h200).
    #[arg(long, default_value = "h200")]
    pub hardware: String,
    /// Write the profile with the fitted efficiency.in_model here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write config.json, tokenizer.json and sharded safetensors with seeded random weights,
    /// plus a matching EAGLE-3 draft in OUT/draft.
    Init(ModelInitArgs),
}

#[derive(Debug, Args)]
pub struct ModelInitArgs {
    /// tiny (milliseconds per token on a CPU) or kimi-slice (full Kimi-K2.5 width).
    #[arg(long)]
    pub preset: String,
    #[arg(long, allow_negative_numbers = true)]
    pub layers: Option<u32>,
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub seed: u64,
    /// How often the draft agrees with the target: 0.0 (unrelated) to 1.0 (almost always).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub draft_quality: f32,
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long)]
    pub draft: Option<PathBuf>,
    #[arg(long)]
    pub num_steps: Option<u32>,
    #[arg(long)]
    pub eagle_topk: Option<u32>,
    #[arg(long)]
    pub num_draft_tokens: Option<u32>,
    #[arg(long)]
    pub prompt: String,
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// greedy, target_only or exact (sampling verification when temperature > 0).
    #[arg(long)]
    pub verify: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum KernelsCommand {
    /// Compile every kernel in kernels/ through NVRTC for each architecture.
    Check(KernelsCheckArgs),
}

#[derive(Debug, Args)]
pub struct KernelsCheckArgs {
    #[arg(long, value_delimiter = ',', default_value = "sm_90,sm_120")]
    pub arch: Vec<String>,
}
