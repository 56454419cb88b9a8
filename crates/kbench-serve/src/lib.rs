//! kbench-serve: `kbench serve`. The project's engine, or the simulator played out in wall
//! time, behind SGLang's native API (`/generate`, server endpoints) and OpenAI's
//! (`/v1/completions`, `/v1/chat/completions`, `/v1/models`), with Prometheus metrics under
//! vLLM's speculative counter names. docs/serve.md documents every endpoint.
//!
//! - [`worker`]: what the HTTP side and a generation worker say to each other;
//!   [`engine`] and [`sim`] are the two workers, each on its own thread.
//! - [`gen`]: one request followed from submission to its last chunk.
//! - [`sglang`], [`openai`]: the endpoints; [`stream`]: SSE and whole answers;
//!   [`routes`]: the router and the API-key check; [`listen`]: the accept loop;
//!   [`protocol_errors`]: JSON bodies for hyper's own parse-error answers;
//!   [`reqlog`]: `--log-requests`; [`offload`]: parsing and tokenizing off the runtime.
//! - [`stats`]: counters for `/metrics` and `/get_server_info`; [`faults`]: fault injection.

pub mod body;
pub mod chat;
pub mod engine;
pub mod error;
pub mod faults;
pub mod gen;
pub mod listen;
pub mod offload;
pub mod openai;
pub mod protocol_errors;
pub mod reqlog;
pub mod routes;
pub mod sglang;
pub mod sim;
pub mod state;
pub mod stats;
pub mod stream;
pub mod text;
pub mod worker;

use std::net::SocketAddr;
use std::thread::JoinHandle;

use serde_json::Value;
use tokio::sync::watch;

pub use error::{ApiError, ServeError};
pub use faults::{FaultKind, Faults};
pub use state::{Answering, Limits, ModelInfo};
pub use text::TextCodec;

/// What generates the tokens.
pub enum Source {
    Engine(engine::EngineLoad),
    Sim(sim::SimWorker),
}

pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    pub source: Source,
    pub model: ModelInfo,
    pub codec: TextCodec,
    /// `/get_server_info` (the server arguments; for `--sim` the modelled deployment).
    pub server_info: Value,
    pub limits: Limits,
    pub faults: Faults,
    pub answering: Answering,
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    worker: worker::WorkerHandle,
    max_prompt_tokens: Option<usize>,
    probe: Option<engine::PrefillProbe>,
}

/// Loads the model (or starts the simulator), binds, and serves on a thread of its own.
pub fn start(cfg: ServeConfig) -> Result<Server, ServeError> {
    cfg.faults.validate().map_err(ServeError::Config)?;
    let mut model = cfg.model;
    let mut server_info = cfg.server_info;
    let mut probe = None;
    let worker = match cfg.source {
        Source::Engine(how) => {
            let ready = engine::spawn(how)?;
            model.max_prompt_tokens = Some(ready.max_prompt_tokens);
            probe = ready.probe;
            ready.handle
        }
        Source::Sim(w) => sim::spawn(w)?,
    };
    if let Value::Object(info) = &mut server_info {
        info.insert(
            "max_prompt_tokens".into(),
            serde_json::json!(model.max_prompt_tokens),
        );
    }
    let max_prompt_tokens = model.max_prompt_tokens;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kbench-serve")
        .build()
        .map_err(|e| ServeError::Io("starting the HTTP runtime".into(), e))?;
    let bind = format!("{}:{}", cfg.host, cfg.port);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&bind))
        .map_err(|e| ServeError::Io(format!("binding {bind}"), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Io("reading the bound address".into(), e))?;
    let state = state::AppState::new(
        model,
        server_info,
        worker.clone(),
        cfg.codec,
        cfg.limits,
        cfg.faults,
        cfg.answering,
    );
    let (stop, stopped) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("kbench-serve".into())
        .spawn(move || {
            runtime.block_on(listen::serve(listener, state, stopped));
            // connections still open (idle keep-alives, stalled streams) close with the runtime
            runtime.shutdown_timeout(std::time::Duration::from_millis(100));
        })
        .map_err(|e| ServeError::Io("starting the HTTP thread".into(), e))?;
    Ok(Server {
        addr,
        stop,
        thread: Some(thread),
        worker,
        max_prompt_tokens,
        probe,
    })
}

impl Server {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The longest prompt accepted (`None`: as long as the context allows).
    pub fn max_prompt_tokens(&self) -> Option<usize> {
        self.max_prompt_tokens
    }

    /// The engine's load-time prefill timing that set [`Server::max_prompt_tokens`].
    pub fn prefill_probe(&self) -> Option<engine::PrefillProbe> {
        self.probe
    }

    /// Stops accepting, lets running requests finish (within the drain bound), stops the
    /// worker.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.worker.shutdown();
    }

    /// Serves until SIGTERM or Ctrl-C, then stops as [`Server::stop`] does.
    pub fn run_until_signal(mut self) -> Result<(), ServeError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ServeError::Io("starting the signal runtime".into(), e))?;
        rt.block_on(async {
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .map_err(|e| ServeError::Io("listening for SIGTERM".into(), e))?;
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
            }
            Ok::<(), ServeError>(())
        })?;
        self.stop_inner();
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_inner();
    }
}
