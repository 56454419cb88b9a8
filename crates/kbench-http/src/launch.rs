//! Launching the server an experiment runs against: the exact SGLang command line and
//! environment the file implies (`kbench sglang-args` prints it), a free port when the url
//! says port 0, the log kept in a file, and the process stopped (SIGTERM, then SIGKILL after
//! the grace period) when the backend goes away, on success, error or Ctrl-C alike.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use kbench_core::experiment::Experiment;

use crate::error::HttpError;
use crate::settings::Target;

fn default_command() -> Vec<String> {
    ["python3", "-m", "sglang.launch_server"]
        .map(String::from)
        .to_vec()
}

fn default_ready() -> f64 {
    900.0
}

fn default_grace() -> f64 {
    10.0
}

/// `[backend.http.launch]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSettings {
    /// The server's command before its flags; `{kbench}` stands for this kbench binary.
    #[serde(default = "default_command")]
    pub command: Vec<String>,
    /// `--model-path` (default: the directory of `[model] config`, or the Hugging Face id of
    /// a known `[model] preset`).
    pub model_path: Option<String>,
    /// `--speculative-draft-model-path` (default likewise, from `[draft]`).
    pub draft_model_path: Option<String>,
    /// Flags appended after the ones the file implies.
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How long the server may take to answer /health (loading 1T parameters takes minutes).
    #[serde(default = "default_ready")]
    pub ready_timeout_s: f64,
    /// Between SIGTERM and SIGKILL.
    #[serde(default = "default_grace")]
    pub grace_s: f64,
    /// Where the server's output goes (default: a file in the temporary directory, named in
    /// the report's backend line).
    pub log: Option<String>,
    /// `draft` (default): the server's draft model decides what is accepted. `simulate`:
    /// SGLang's simulated acceptance (`SGLANG_SIMULATE_ACC_LEN` set to the trace's accept
    /// length for the file's steps/topk/draft tokens), so the server's timing can be
    /// checked against the cost model apart from its draft's quality.
    #[serde(default)]
    pub acceptance: LaunchAcceptance,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LaunchAcceptance {
    #[default]
    Draft,
    Simulate,
}

impl Default for LaunchSettings {
    fn default() -> LaunchSettings {
        LaunchSettings {
            command: default_command(),
            model_path: None,
            draft_model_path: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            ready_timeout_s: default_ready(),
            grace_s: default_grace(),
            log: None,
            acceptance: LaunchAcceptance::Draft,
        }
    }
}

/// The Hugging Face ids of the presets' checkpoints (what SGLang and vLLM load).
pub(crate) fn hub_id(preset: &str) -> Option<&'static str> {
    match preset {
        "kimi-k2.5" => Some("moonshotai/Kimi-K2.5"),
        "kimi-k2.5-eagle3" => Some("lightseekorg/kimi-k2.5-eagle3"),
        "kimi-k2.5-eagle3-mla" => Some("lightseekorg/kimi-k2.5-eagle3-mla"),
        "deepseek-v3" => Some("deepseek-ai/DeepSeek-V3"),
        "minimax-m3" => Some("MiniMaxAI/MiniMax-M3-MXFP8"),
        "minimax-m3-eagle3" => Some("Inferact/MiniMax-M3-EAGLE3"),
        "llama-3.1-8b" => Some("meta-llama/Llama-3.1-8B-Instruct"),
        "llama-3.1-8b-eagle3" => Some("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
        _ => None,
    }
}

/// Appends `--name value` to a command line.
pub(crate) fn flag(argv: &mut Vec<String>, name: &str, value: String) {
    argv.push(format!("--{name}"));
    argv.push(value);
}

/// Checkpoints whose hub repository carries its own Python code that both engines must be
/// allowed to run: Kimi-K2.5's tokenizer (tokenization_kimi.py; every launch line on the
/// rtx6kpro pages passes the flag) and DeepSeek-V3's configuration_deepseek.py (SGLang's
/// DeepSeek guide launches it with the flag), and MiniMax-M3 (its model card asks for
/// trust_remote_code; docs/research/models.md). A flag the launch settings already pass is
/// not repeated.
pub(crate) fn needs_remote_code(preset: &Option<String>, extra_args: &[String]) -> bool {
    matches!(
        preset.as_deref(),
        Some("kimi-k2.5" | "deepseek-v3" | "minimax-m3")
    ) && !extra_args.iter().any(|a| a == "--trust-remote-code")
}

/// Where a checkpoint comes from: an explicit path, the directory of a config file, or a
/// preset's hub id.
pub(crate) fn checkpoint_path(
    exp: &Experiment,
    explicit: &Option<String>,
    config: &Option<String>,
    preset: &Option<String>,
    what: &str,
) -> Result<String, HttpError> {
    if let Some(p) = explicit {
        return Ok(p.clone());
    }
    if let Some(c) = config {
        let dir = exp.base_dir.join(
            std::path::Path::new(c)
                .parent()
                .unwrap_or(std::path::Path::new(".")),
        );
        return Ok(dir.display().to_string());
    }
    preset
        .as_deref()
        .and_then(hub_id)
        .map(str::to_string)
        .ok_or_else(|| {
            HttpError::Settings(format!(
                "launch: no {what} path: set [backend.http.launch] {what}_path"
            ))
        })
}

/// The command line and environment that serve `exp` at `target`.
pub fn command_line(
    exp: &Experiment,
    l: &LaunchSettings,
    target: &Target,
) -> Result<(Vec<String>, BTreeMap<String, String>), HttpError> {
    let path_of =
        |explicit: &Option<String>,
         config: &Option<String>,
         preset: &Option<String>,
         what: &str| checkpoint_path(exp, explicit, config, preset, what);
    let f = &exp.file;
    let mut argv: Vec<String> = l
        .command
        .iter()
        .map(|c| {
            if c == "{kbench}" {
                std::env::current_exe()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| "kbench".into())
            } else {
                c.clone()
            }
        })
        .collect();
    if argv.is_empty() {
        return Err(HttpError::Settings("launch: `command` is empty".into()));
    }
    flag(
        &mut argv,
        "model-path",
        path_of(&l.model_path, &f.model.config, &f.model.preset, "model")?,
    );
    flag(&mut argv, "host", target.host.clone());
    flag(&mut argv, "port", target.port.to_string());
    flag(&mut argv, "tp-size", exp.tp_size.to_string());
    if exp.speculative.is_speculative() {
        let algorithm = exp.speculative.algorithm;
        flag(
            &mut argv,
            "speculative-algorithm",
            algorithm.sglang_name().unwrap_or("EAGLE3").into(),
        );
        // NEXTN drafts with the target's own NextN layer: SGLang takes the model path for
        // DeepSeek unless a draft path is given
        if algorithm.uses_draft_head() || l.draft_model_path.is_some() {
            let draft = f.draft.as_ref();
            flag(
                &mut argv,
                "speculative-draft-model-path",
                path_of(
                    &l.draft_model_path,
                    &draft.and_then(|d| d.config.clone()),
                    &draft.and_then(|d| d.preset.clone()),
                    "draft_model",
                )?,
            );
        }
        flag(
            &mut argv,
            "speculative-num-steps",
            exp.speculative.shape.num_steps.to_string(),
        );
        flag(
            &mut argv,
            "speculative-eagle-topk",
            exp.speculative.shape.topk.to_string(),
        );
        flag(
            &mut argv,
            "speculative-num-draft-tokens",
            exp.speculative.shape.num_draft_tokens.to_string(),
        );
    }
    if let Some(n) = f.server.max_running_requests {
        flag(&mut argv, "max-running-requests", n.to_string());
    }
    match f.server.cuda_graph_max_bs {
        // no batch is small enough for a graph: every forward runs eager
        Some(0) => argv.push("--disable-cuda-graph".into()),
        Some(n) => flag(&mut argv, "cuda-graph-max-bs", n.to_string()),
        None => {}
    }
    // the KV pool and prefill settings the simulator sizes and schedules with, in
    // SGLang's own flag names (server_args.py); unset ones keep SGLang's defaults
    if let Some(m) = f.server.mem_fraction_static {
        flag(&mut argv, "mem-fraction-static", m.to_string());
    }
    if let Some(n) = f.server.max_total_tokens {
        flag(&mut argv, "max-total-tokens", n.to_string());
    }
    if let Some(n) = f.server.max_model_len {
        flag(&mut argv, "context-length", n.to_string());
    }
    if let Some(dtype) = exp.kv.kv_cache_dtype.flag_value() {
        flag(&mut argv, "kv-cache-dtype", dtype.into());
    }
    if let Some(n) = f.server.chunked_prefill_size {
        flag(&mut argv, "chunked-prefill-size", n.to_string());
    }
    if let Some(n) = f.server.max_prefill_tokens {
        flag(&mut argv, "max-prefill-tokens", n.to_string());
    }
    if !exp.kv.prefix_caching {
        argv.push("--disable-radix-cache".into());
    }
    if !exp.custom_all_reduce {
        argv.push("--disable-custom-all-reduce".into());
    }
    if needs_remote_code(&f.model.preset, &l.args) {
        argv.push("--trust-remote-code".into());
    }
    // spec v1: SGLang releases whose overlapped v2 worker is the default (their
    // SGLANG_ENABLE_SPEC_V2 switch gone) run v1 only under --disable-overlap-schedule;
    // earlier ones turn the overlap off for v1 themselves, so there the flag changes nothing
    if exp.speculative.is_speculative() && !exp.speculative.spec_v2 {
        argv.push("--disable-overlap-schedule".into());
    }
    argv.extend(l.args.iter().cloned());
    let mut env = l.env.clone();
    if exp.speculative.spec_v2 {
        env.insert("SGLANG_ENABLE_SPEC_V2".into(), "True".into());
    }
    if l.acceptance == LaunchAcceptance::Simulate {
        let accept = simulated_accept_length(exp)?;
        env.insert("SGLANG_SIMULATE_ACC_LEN".into(), format!("{accept:.3}"));
        env.insert("SGLANG_SIMULATE_ACC_METHOD".into(), "match-expected".into());
    }
    Ok((argv, env))
}

/// The accept length (tokens per verify round, bonus included) the simulator replays for the
/// file's configuration: what SGLang's simulated acceptance is told to produce.
pub fn simulated_accept_length(exp: &Experiment) -> Result<f64, HttpError> {
    if !exp.speculative.is_speculative() {
        return Err(HttpError::Settings(
            "launch: acceptance = \"simulate\" needs speculative decoding in [speculative]".into(),
        ));
    }
    if let Some(accept_length) = exp.accept_length {
        return Ok(accept_length);
    }
    let path = exp.trace.as_ref().ok_or_else(|| {
        HttpError::Settings(
            "launch: acceptance = \"simulate\" takes its accept length from the trace or [workload] accept_length: set one".into(),
        )
    })?;
    let trace_error = |source| HttpError::Trace {
        path: path.display().to_string(),
        source,
    };
    let trace = kbench_core::trace::read(path).map_err(trace_error)?;
    let s = &exp.speculative;
    let shape = kbench_core::tree::TreeShape::new(
        s.shape.num_steps,
        s.shape.topk,
        s.shape.num_draft_tokens,
    )
    .map_err(|e| HttpError::Settings(format!("launch: {e}")))?;
    let a = kbench_core::trace::accept_length(&trace, &shape).map_err(trace_error)?;
    Ok(a.per_round)
}

/// The command as a shell line (for `kbench sglang-args` and the log).
pub fn shell_line(argv: &[String], env: &BTreeMap<String, String>) -> String {
    let quote = |s: &str| {
        if !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+".contains(c))
        {
            s.to_string()
        } else {
            format!("'{}'", s.replace('\'', "'\\''"))
        }
    };
    env.iter()
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .chain(argv.iter().map(|a| quote(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A launched server; stopped when dropped.
pub struct Launched {
    /// Behind a lock so a running level (which borrows the backend) can ask whether the
    /// server exited.
    child: std::sync::Mutex<Child>,
    pub log: PathBuf,
    pub line: String,
    grace: Duration,
    /// A log in the temporary directory that no one asked for: removed when the server is
    /// stopped, unless something went wrong that it may explain.
    pub temporary_log: bool,
    keep_log: std::sync::atomic::AtomicBool,
}

impl Launched {
    pub fn start(
        exp: &Experiment,
        l: &LaunchSettings,
        target: &Target,
    ) -> Result<Launched, HttpError> {
        let (argv, env) = command_line(exp, l, target)?;
        let line = shell_line(&argv, &env);
        let log = match &l.log {
            Some(p) => exp.base_dir.join(p),
            None => std::env::temp_dir().join(format!(
                "kbench-{}-{}-{}.server.log",
                exp.file.name,
                std::process::id(),
                target.port
            )),
        };
        let io = |e| {
            HttpError::Settings(format!(
                "launch: cannot write the server log {}: {e}",
                log.display()
            ))
        };
        let out = std::fs::File::create(&log).map_err(io)?;
        let err = out.try_clone().map_err(io)?;
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| HttpError::Settings(format!("launch: cannot start `{}`: {e}", argv[0])))?;
        Ok(Launched {
            child: std::sync::Mutex::new(child),
            log,
            line,
            grace: kbench_core::duration::saturating_seconds(l.grace_s),
            temporary_log: l.log.is_none(),
            keep_log: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The run failed, or a request did: the log stays for the reader.
    pub fn keep_log(&self) {
        self.keep_log
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the server has exited already (its status if so).
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        self.child().try_wait().ok().flatten()
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if self.exited().is_some() {
            // it stopped on its own: whatever it said is the reason
            self.keep_log();
        } else {
            self.stop();
        }
        if self.temporary_log && !self.keep_log.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

impl Launched {
    /// SIGTERM, `grace` to exit, then SIGKILL.
    fn stop(&self) {
        #[cfg(unix)]
        {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child().id().to_string()])
                .status();
            let deadline = Instant::now() + self.grace;
            while Instant::now() < deadline {
                if self.exited().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let mut child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A free loopback port for a server to be launched on.
pub fn free_port(host: &str) -> Result<u16, HttpError> {
    std::net::TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| HttpError::Settings(format!("launch: no free port on {host}: {e}")))
}

/// The launch line `kbench sglang-args` prints: `[backend.http.launch]` if the file has it,
/// else SGLang's own launcher; the url's host and port, else SGLang's 127.0.0.1:30000.
pub fn sglang_command(exp: &Experiment) -> Result<String, HttpError> {
    if exp.engine.kind == kbench_core::experiment::ServingEngineKind::Vllm
        && exp.speculative.is_speculative()
    {
        return Err(HttpError::LaunchLine(format!(
            "{}: the file simulates vLLM's speculative decoding (method `{}`); `kbench vllm-args` prints its launch line",
            exp.path.display(),
            exp.speculative.algorithm.vllm_method().unwrap_or("none")
        )));
    }
    let settings = crate::settings::HttpSettings::of(exp)?;
    let target = match &settings.url {
        Some(_) => settings.target()?,
        None => Target::parse("http://127.0.0.1:30000")?,
    };
    let launch = settings.launch.clone().unwrap_or_default();
    let (argv, env) = command_line(exp, &launch, &target)?;
    Ok(shell_line(&argv, &env))
}
