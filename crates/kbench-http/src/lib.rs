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
pub mod launch;
pub mod request;
pub mod server;
pub mod settings;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use kbench_core::backend::{
    Backend, BackendError, ChunkEvent, Nanos, Request, RequestRecord, Session,
};
use kbench_core::prompt::random_prompt;
use kbench_core::spec::Experiment;

use crate::client::Client;
use crate::error::HttpError;
use crate::request::{Outcome, Sent};
use crate::settings::{Api, HttpSettings};

pub use error::HttpError as Error;

const NAME: &str = "http";

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
    speculative: bool,
    /// What `/get_server_info` said, once checked (first level).
    server: Option<server::ServerFacts>,
    model: Option<String>,
    expected: server::Expected,
    /// The server this backend started, stopped when the backend is dropped.
    launched: Option<launch::Launched>,
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
            speculative: exp.spec.is_speculative(),
            server: None,
            model: settings.model.clone(),
            expected: server::Expected::of(exp),
            launched,
            settings,
        })
    }

    fn fail(e: HttpError) -> BackendError {
        BackendError::failed(NAME, "server", e)
    }
}

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
            Some(l) => format!("; launched `{}` (log {})", l.line, l.log.display()),
            None => String::new(),
        };
        format!(
            "http: {} at {}{server}; wall-clock times from this client{launched}",
            self.settings.api.name(),
            self.client.target.url
        )
    }

    fn start_level(&mut self, _concurrency: u32) -> Result<Box<dyn Session + '_>, BackendError> {
        let client = self.client.clone();
        let ready = match (&self.launched, &self.server, &self.settings.launch) {
            // the first wait covers the launched server's loading
            (Some(_), None, Some(l)) => l.ready_timeout_s,
            _ => self.settings.ready_timeout_s,
        };
        // in short waits, so a launched server that exits is seen at once
        let deadline = Instant::now() + Duration::from_secs_f64(ready);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let step = left.min(Duration::from_secs(1));
            let waited = self.runtime.block_on(server::wait_healthy(&client, step));
            if let Some(l) = &mut self.launched {
                if let Some(status) = l.exited() {
                    return Err(Self::fail(HttpError::Settings(format!(
                        "launch: the server exited ({status}) before answering /health; its log: {}",
                        l.log.display()
                    ))));
                }
            }
            match waited {
                Ok(()) => break,
                Err(HttpError::NotReady { url, last, .. }) if Instant::now() >= deadline => {
                    return Err(Self::fail(HttpError::NotReady {
                        url,
                        seconds: ready,
                        last,
                    }))
                }
                Err(HttpError::NotReady { .. }) => {}
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
            if self.settings.api == Api::OpenAiCompletions && self.model.is_none() {
                self.model = self
                    .runtime
                    .block_on(server::first_model(&client))
                    .map_err(Self::fail)?;
            }
            self.server = Some(facts);
        }
        if self.settings.flush_cache {
            self.runtime
                .block_on(server::flush_cache(&client))
                .map_err(Self::fail)?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        Ok(Box::new(HttpSession {
            b: self,
            start: Instant::now(),
            tx,
            rx,
            tasks: HashMap::new(),
            chunks: None,
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
}

impl HttpSession<'_> {
    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    fn take(&mut self, o: Outcome) -> RequestRecord {
        self.tasks.remove(&o.record.id);
        if let Some(c) = &self.chunks {
            c.lock().unwrap_or_else(|p| p.into_inner()).extend(o.chunks);
        }
        o.record
    }

    fn drain(&mut self, mut out: Vec<RequestRecord>) -> Vec<RequestRecord> {
        while let Ok(o) = self.rx.try_recv() {
            out.push(self.take(o));
        }
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
            prompt: random_prompt(b.seed, request.id, request.input_len as usize, b.vocab),
            max_tokens: request.max_tokens,
            temperature: b.temperature,
            submitted_ns: self.now(),
        };
        let (client, api, model, spec, start, tx) = (
            b.client.clone(),
            b.settings.api,
            b.model.clone(),
            b.speculative,
            self.start,
            self.tx.clone(),
        );
        let limit = Duration::from_secs_f64(b.settings.request_timeout_s);
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
        let first = self.b.runtime.block_on(self.rx.recv());
        let out = match first {
            Some(o) => vec![self.take(o)],
            None => Vec::new(),
        };
        Ok(self.drain(out))
    }

    fn advance_to(&mut self, deadline: Nanos) -> Result<Vec<RequestRecord>, BackendError> {
        let wait = Duration::from_nanos(deadline.saturating_sub(self.now()));
        let got = self.b.runtime.block_on(async {
            let mut got = Vec::new();
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    o = self.rx.recv() => match o {
                        Some(o) => got.push(o),
                        None => break,
                    },
                }
            }
            got
        });
        let out = got.into_iter().map(|o| self.take(o)).collect();
        Ok(self.drain(out))
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
