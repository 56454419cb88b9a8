//! kbench-http: the `http` backend. It drives a running SGLang, vLLM or OpenAI-compatible
//! server (or `kbench serve`) with the harness's closed-loop clients: the same prompts as
//! every backend (token ids from the seed and the request id), exact lengths, every chunk
//! timestamped on arrival. docs/http.md says which statistic comes from where.
//!
//! - [`settings`]: `[backend.http]`; [`client`]: a small HTTP/1.1 client;
//!   [`request`]: one streamed generation; [`server`]: health, server info, the
//!   speculative-settings check, `/flush_cache`.

pub mod client;
pub mod error;
pub mod event;
pub mod launch;
pub mod prometheus;
pub mod request;
pub mod server;
pub mod settings;
pub mod vllm_args;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use kbench_core::backend::{
    Backend, BackendError, ChunkEvent, Nanos, Request, RequestRecord, ServerSpeculativeCounters,
    Session,
};
use kbench_core::experiment::Experiment;
use kbench_core::prompt::request_prompt;

use crate::client::Client;
use crate::error::HttpError;
use crate::request::{Outcome, Sent};
use crate::settings::{Api, HttpSettings};

pub use error::HttpError as Error;

const NAME: &str = "http";

/// Everything `open` checks before it would start or reach a server: the settings, the url,
/// the API key's variable and the launch line. `kbench validate` calls this, so checking
/// a file never starts a 1T-parameter server only to stop it.
pub fn check(exp: &Experiment) -> Result<(), HttpError> {
    let settings = HttpSettings::of(exp)?;
    let mut target = settings.target()?;
    settings.api_key()?;
    if let Some(l) = &settings.launch {
        if target.port == 0 {
            // the port a launch would pick; any will do for the line
            target.port = 30000;
        }
        launch::command_line(exp, l, &target)?;
    }
    Ok(())
}

pub fn open(exp: &Experiment) -> Result<Box<dyn Backend>, HttpError> {
    Ok(Box::new(HttpBackend::new(exp)?))
}

pub struct HttpBackend {
    runtime: Runtime,
    settings: HttpSettings,
    client: Arc<Client>,
    seed: u64,
    vocab: usize,
    temperature: f64,
    /// The most drafts one round proposes (the bound on what it accepts); None without
    /// speculation.
    max_drafts: Option<u32>,
    /// What the server said it is, once checked (first level).
    server: Option<server::ServerFacts>,
    /// The file's API, or the server's own once it is known.
    api: Api,
    model: Option<String>,
    expected: server::Expected,
    /// The server this backend started, stopped when the backend is dropped.
    launched: Option<launch::Launched>,
    notice: Option<kbench_core::backend::Notice>,
}

impl HttpBackend {
    pub fn new(exp: &Experiment) -> Result<HttpBackend, HttpError> {
        let settings = HttpSettings::of(exp)?;
        let mut target = settings.target()?;
        let launched = match &settings.launch {
            Some(l) => {
                if target.port == 0 {
                    target.port = launch::free_port(&target.host)?;
                    target.url = format!("http://{}:{}{}", target.host, target.port, target.prefix);
                }
                Some(launch::Launched::start(exp, l, &target)?)
            }
            None => None,
        };
        let client = Arc::new(Client::new(target, settings.api_key()?));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("kbench-http")
            .build()
            .map_err(HttpError::Runtime)?;
        Ok(HttpBackend {
            runtime,
            client,
            seed: exp.file.seed,
            vocab: exp.model.vocab_size as usize,
            temperature: exp.file.workload.temperature.unwrap_or(0.0),
            max_drafts: exp
                .speculative
                .is_speculative()
                .then_some(exp.speculative.shape.num_steps),
            server: None,
            api: settings.api.unwrap_or(Api::Sglang),
            model: settings.model.clone(),
            expected: server::Expected::of(exp),
            launched,
            settings,
            notice: None,
        })
    }

    /// A failure the launched server's log may explain keeps the log.
    fn keep_log(&self) {
        if let Some(l) = &self.launched {
            l.keep_log();
        }
    }

    fn notify(&self, what: &str) {
        if let Some(n) = &self.notice {
            n(what);
        }
    }

    /// Until the server answers `/health` (the launched one's loading included), then its
    /// facts checked against the file on the first level, and its cache flushed.
    fn ready(&mut self) -> Result<(), BackendError> {
        let client = self.client.clone();
        let ready = match (&self.launched, &self.server, &self.settings.launch) {
            // the first wait covers the launched server's loading
            (Some(_), None, Some(l)) => l.ready_timeout_s,
            _ => self.settings.ready_timeout_s,
        };
        // in short waits, so a launched server that exits is seen at once
        let deadline = Instant::now() + kbench_core::duration::saturating_seconds(ready);
        let mut said = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // the first look is quick, so a wait is announced at once
            let step = left.min(if said {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(300)
            });
            let waited = self.runtime.block_on(server::wait_healthy(&client, step));
            self.check_launched().map_err(Self::fail)?;
            match waited {
                Ok(()) => break,
                Err(HttpError::NotReady { .. })
                    if self.launched.is_none()
                        && self.runtime.block_on(client.refuses_connections()) =>
                {
                    // no one is starting it: waiting would only delay the same answer
                    return Err(Self::fail(HttpError::Refused {
                        url: client.target.url.clone(),
                    }));
                }
                Err(HttpError::NotReady { url, last, .. }) if Instant::now() >= deadline => {
                    return Err(Self::fail(HttpError::NotReady {
                        url,
                        seconds: ready,
                        last,
                    }))
                }
                Err(HttpError::NotReady { last, .. }) => {
                    if !said {
                        said = true;
                        let whose = match &self.launched {
                            Some(l) => format!("the launched server (log {})", l.log.display()),
                            None => "the server".into(),
                        };
                        self.notify(&format!(
                            "waiting up to {ready} s for {whose} to answer {}/health (last: {last}) ...",
                            client.target.url
                        ));
                    }
                }
                Err(e) => return Err(Self::fail(e)),
            }
        }
        if self.server.is_none() {
            let facts = self
                .runtime
                .block_on(server::facts(&client))
                .map_err(Self::fail)?;
            if !self.settings.allow_mismatch {
                self.expected.check(&facts).map_err(Self::fail)?;
            }
            self.api = self.settings.api.unwrap_or_else(|| facts.default_api());
            if self.api.names_model() {
                self.model = server::choose_model(
                    &facts,
                    self.settings.model.as_deref(),
                    &client.target.url,
                )
                .map_err(Self::fail)?;
            }
            self.server = Some(facts);
        }
        if self.settings.flush_cache {
            let engine = self
                .server
                .as_ref()
                .map_or(server::Engine::Unknown, |f| f.engine);
            self.runtime
                .block_on(server::flush_cache(&client, engine))
                .map_err(Self::fail)?;
        }
        Ok(())
    }

    fn fail(e: HttpError) -> BackendError {
        BackendError::failed(NAME, "the run stopped", e)
    }

    /// A launched server that exited stops the run, whatever the level was doing.
    fn check_launched(&self) -> Result<(), HttpError> {
        match &self.launched {
            Some(l) => match l.exited() {
                Some(status) => Err(HttpError::Exited {
                    status: status.to_string(),
                    log: l.log.display().to_string(),
                }),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }
}

/// How long a server that failed a request in transport has to answer `/health` before the
/// run stops: long enough for a busy server, short next to a level.
const GONE_WAIT: Duration = Duration::from_secs(5);
/// How long a `/metrics` scrape may take.
const SCRAPE: Duration = Duration::from_secs(10);
/// How often a waiting session looks at Ctrl-C and at a launched server.
const POLL: Duration = Duration::from_millis(100);

impl Backend for HttpBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn describe(&self) -> String {
        let server = match &self.server {
            Some(f) => format!(", {}", f.describe()),
            None => String::new(),
        };
        let launched = match &self.launched {
            Some(l) if l.temporary_log => format!(
                "; launched `{}` (log {}, removed after a run where nothing failed)",
                l.line,
                l.log.display()
            ),
            Some(l) => format!("; launched `{}` (log {})", l.line, l.log.display()),
            None => String::new(),
        };
        let text = if self.api == Api::OpenAiChat {
            "; prompts sent as text (one `w<id>` word per prompt token, in the server's chat template): input lengths are the server's usage.prompt_tokens"
        } else {
            ""
        };
        let detected = if self.settings.api.is_none() && self.server.is_some() {
            " (the server's own; [backend.http] api names another)"
        } else {
            ""
        };
        format!(
            "http: {}{detected} at {}{server}; wall-clock times from this client{text}{launched}",
            self.api.name(),
            self.client.target.url
        )
    }

    fn set_notice(&mut self, notice: kbench_core::backend::Notice) {
        self.notice = Some(notice);
    }

    /// The server's own bound, where it says one.
    fn cuda_graph_bound(&self) -> Option<kbench_core::backend::CudaGraphBound> {
        self.server.as_ref().and_then(|f| f.cuda_graph_bound)
    }

    fn start_level(&mut self, _concurrency: u32) -> Result<Box<dyn Session + '_>, BackendError> {
        if let Err(e) = self.ready() {
            self.keep_log();
            return Err(e);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        Ok(Box::new(HttpSession {
            b: self,
            start: Instant::now(),
            tx,
            rx,
            tasks: HashMap::new(),
            chunks: None,
            counters_before: None,
        }))
    }
}

struct HttpSession<'a> {
    b: &'a HttpBackend,
    start: Instant,
    tx: mpsc::UnboundedSender<Outcome>,
    rx: mpsc::UnboundedReceiver<Outcome>,
    tasks: HashMap<u64, tokio::task::JoinHandle<()>>,
    chunks: Option<Arc<Mutex<Vec<ChunkEvent>>>>,
    /// vLLM's speculative counters when the measured requests started.
    counters_before: Option<prometheus::SpeculativeReading>,
}

impl HttpSession<'_> {
    /// The server's speculative counters now, where it exposes them.
    fn read_counters(&self) -> Option<prometheus::SpeculativeReading> {
        let client = self.b.client.clone();
        let text = self.b.runtime.block_on(async move {
            let r = client.send("GET", "/metrics", None, SCRAPE).await.ok()?;
            if r.status != 200 {
                return None;
            }
            r.all(SCRAPE).await.ok()
        })?;
        prometheus::read(&String::from_utf8_lossy(&text))
    }

    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    /// After a request failed in transport: a server that exited, or that does not answer
    /// `/health` in [`GONE_WAIT`], stops the run with one error instead of failing every
    /// request left.
    fn check_alive(&self, failure: &str) -> Result<(), BackendError> {
        self.b.check_launched().map_err(HttpBackend::fail)?;
        let client = self.b.client.clone();
        match self
            .b
            .runtime
            .block_on(server::wait_healthy(&client, GONE_WAIT))
        {
            Ok(()) => Ok(()),
            Err(HttpError::NotReady { last, .. }) => {
                self.b.check_launched().map_err(HttpBackend::fail)?;
                Err(HttpBackend::fail(HttpError::Gone {
                    url: client.target.url.clone(),
                    failure: failure.to_string(),
                    health: last,
                }))
            }
            Err(e) => Err(HttpBackend::fail(e)),
        }
    }

    /// Waits for the next finished request, looking at Ctrl-C and at a launched server
    /// every [`POLL`]; `until` bounds the wait (None: until a request finishes).
    fn wait(&mut self, until: Option<Instant>) -> Result<Vec<Outcome>, BackendError> {
        let waited = self.wait_for_outcomes(until);
        let failed = match &waited {
            Ok(got) => got.iter().any(|o| o.record.error.is_some()),
            Err(_) => true,
        };
        if failed {
            self.b.keep_log();
        }
        waited
    }

    fn wait_for_outcomes(&mut self, until: Option<Instant>) -> Result<Vec<Outcome>, BackendError> {
        let mut got = Vec::new();
        loop {
            if kbench_core::interrupt::requested() {
                return Err(BackendError::Interrupted);
            }
            self.b.check_launched().map_err(HttpBackend::fail)?;
            let mut step = POLL;
            if let Some(u) = until {
                let left = u.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                step = step.min(left);
            }
            let rx = &mut self.rx;
            let first = self
                .b
                .runtime
                .block_on(async { tokio::time::timeout(step, rx.recv()).await });
            match first {
                Ok(Some(o)) => {
                    got.push(o);
                    if until.is_none() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => {}
            }
        }
        while let Ok(o) = self.rx.try_recv() {
            got.push(o);
        }
        if let Some(o) = got.iter().find(|o| o.transport_failed) {
            let failure = o.record.error.clone().unwrap_or_default();
            self.check_alive(&failure)?;
        }
        Ok(got)
    }

    fn take(&mut self, o: Outcome) -> RequestRecord {
        self.tasks.remove(&o.record.id);
        if let Some(c) = &self.chunks {
            c.lock().unwrap_or_else(|p| p.into_inner()).extend(o.chunks);
        }
        o.record
    }

    fn records(&mut self, got: Vec<Outcome>) -> Vec<RequestRecord> {
        let mut out: Vec<RequestRecord> = got.into_iter().map(|o| self.take(o)).collect();
        out.sort_by_key(|r| (r.finished_ns(), r.id));
        out
    }
}

impl Session for HttpSession<'_> {
    fn now_ns(&self) -> Nanos {
        self.now()
    }

    fn submit(&mut self, request: Request) -> Result<(), BackendError> {
        if request.max_tokens == 0 {
            return Err(BackendError::msg(
                NAME,
                format!("request {} asks for 0 tokens", request.id),
            ));
        }
        let b = self.b;
        let sent = Sent {
            id: request.id,
            warmup: request.warmup,
            prompt: request_prompt(
                b.seed,
                request.id,
                request.input_len as usize,
                request.shared_prefix_len as usize,
                b.vocab,
            ),
            max_tokens: request.max_tokens,
            ignore_eos: request.stop_at.is_none(),
            temperature: b.temperature,
            submitted_ns: self.now(),
        };
        let (client, api, model, spec, start, tx) = (
            b.client.clone(),
            b.api,
            b.model.clone(),
            b.max_drafts,
            self.start,
            self.tx.clone(),
        );
        let limit = kbench_core::duration::saturating_seconds(b.settings.request_timeout_s);
        let task = b.runtime.spawn(async move {
            let o = request::run(&client, api, model.as_deref(), spec, sent, start, limit).await;
            let _ = tx.send(o);
        });
        self.tasks.insert(request.id, task);
        Ok(())
    }

    fn run_until_completion(&mut self) -> Result<Vec<RequestRecord>, BackendError> {
        if self.tasks.is_empty() {
            return Ok(Vec::new());
        }
        let got = self.wait(None)?;
        Ok(self.records(got))
    }

    fn advance_to(&mut self, deadline: Nanos) -> Result<Vec<RequestRecord>, BackendError> {
        let until = self.start + Duration::from_nanos(deadline);
        let got = self.wait(Some(until))?;
        Ok(self.records(got))
    }

    fn record_chunks(&mut self) {
        self.chunks.get_or_insert_with(Default::default);
    }

    fn take_chunks(&mut self) -> Vec<ChunkEvent> {
        match &self.chunks {
            Some(c) => std::mem::take(&mut *c.lock().unwrap_or_else(|p| p.into_inner())),
            None => Vec::new(),
        }
    }

    fn measured_started(&mut self) {
        if self.b.max_drafts.is_some() {
            self.counters_before = self.read_counters();
        }
    }

    fn server_counters(&mut self) -> Option<ServerSpeculativeCounters> {
        let before = self.counters_before.take()?;
        let after = self.read_counters()?;
        Some(prometheus::delta(&before, &after))
    }

    fn cancel(&mut self, id: u64) -> bool {
        match self.tasks.remove(&id) {
            Some(t) => {
                t.abort();
                true
            }
            None => false,
        }
    }
}

impl Drop for HttpSession<'_> {
    fn drop(&mut self) {
        for (_, t) in self.tasks.drain() {
            t.abort();
        }
    }
}
