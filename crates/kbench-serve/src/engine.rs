//! The engine worker: a thread that owns the model and runs the [`Batcher`]'s forwards back
//! to back while requests are running, streaming each request's commits as they happen.
//!
//! Before serving it times a prefill on the loaded model, so that the longest prompt it
//! accepts is what it can prefill in [`PREFILL_BUDGET`] on this machine: a CPU engine takes
//! seconds per thousand tokens, and a prompt the context allows could hold its slot for hours.

use kbench_core::error_chain::Chain;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kbench_core::verify::SamplingParams;
use kbench_engine::batcher::{self, Batcher, SeqParams};
use kbench_engine::passes::SpeculativeModel;
use kbench_engine::{CudaModel, CudaOptions, Device, EngineError, Model, SpeculativeSettings};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ServeError;
use crate::worker::{Commit, Control, Event, Finish, Job, Load, Round, WorkerHandle};

/// Which checkpoint the worker loads, onto which device.
#[derive(Debug, Clone)]
pub struct EngineLoad {
    pub model_dir: PathBuf,
    pub draft_dir: Option<PathBuf>,
    pub device: Device,
    pub spec: Option<SpeculativeSettings>,
    pub max_running: usize,
    /// SGLang's `--chunked-prefill-size`: prompts longer than this are prefilled a chunk per
    /// forward, with the running requests' rounds between chunks; `None`: in one forward.
    pub prefill_chunk: Option<usize>,
    /// The longest prompt accepted; `None`: measured at load ([`max_prompt_for`]).
    pub max_prompt_tokens: Option<usize>,
    /// Prompt plus output: the measured bound never exceeds it.
    pub context_length: usize,
}

/// How long a prompt's whole prefill may take on this engine, by default: long enough for
/// the prompts a CPU engine's users test with (thousands of tokens), short enough that a
/// client's timeout (60 s in most) outlasts it.
pub const PREFILL_BUDGET: Duration = Duration::from_secs(30);

/// The prompt the load-time timing prefills (one forward, unchunked by any default chunk).
pub const PROBE_TOKENS: usize = 256;

/// What the worker measured and settled on before serving.
pub struct EngineReady {
    pub handle: WorkerHandle,
    pub max_prompt_tokens: usize,
    /// `None` when `--max-prompt-tokens` was given and nothing was timed.
    pub probe: Option<PrefillProbe>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillProbe {
    pub tokens: usize,
    pub took: Duration,
}

/// The longest prompt whose prefill fits `budget`, from one timed prefill of `probe.tokens`,
/// assuming time grows with the square of the prompt: attention's work does once it
/// dominates, and the linear layers' grows slower, so the bound errs short. At least the
/// probe's length, at most `context - 1` (room for one output token), in multiples of 64.
pub fn max_prompt_for(probe: PrefillProbe, budget: Duration, context: usize) -> usize {
    let ceiling = context.saturating_sub(1).max(1);
    let took = probe.took.as_secs_f64().max(1e-6);
    let scale = (budget.as_secs_f64() / took).sqrt();
    let n = probe.tokens as f64 * scale;
    let n = if n.is_finite() && n < ceiling as f64 {
        (n as usize / 64 * 64).max(probe.tokens)
    } else {
        ceiling
    };
    n.min(ceiling)
}

/// Starts the worker thread. The model loads on it (a GPU context stays on the thread that
/// made it); a loading error is returned here, before anything is served.
pub fn spawn(how: EngineLoad) -> Result<EngineReady, ServeError> {
    // The batcher would raise 0 to 1, serving another cap than the one reported.
    if how.max_running == 0 {
        return Err(ServeError::Config(
            "max_running_requests must be at least 1".into(),
        ));
    }
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Bound, EngineError>>();
    let load = Arc::new(Load::default());
    let published = load.clone();
    std::thread::Builder::new()
        .name("kbench-engine".into())
        .spawn(move || {
            let draft = how.draft_dir.as_deref();
            match how.device {
                Device::Cpu => match Model::load(&how.model_dir, draft, Device::Cpu) {
                    Ok(model) => {
                        let batcher = Batcher::new(model.models(), how.spec, how.max_running)
                            .with_prefill_chunk(how.prefill_chunk);
                        serve(batcher, &how, rx, &published, ready_tx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                },
                Device::Cuda(first) => {
                    let mut opts = CudaOptions::new(first as usize, 1);
                    opts.max_batch = how.max_running;
                    match CudaModel::load(&how.model_dir, draft, &opts) {
                        Ok(mut model) => {
                            let batcher = Batcher::new(&mut model, how.spec, how.max_running)
                                .with_prefill_chunk(how.prefill_chunk);
                            serve(batcher, &how, rx, &published, ready_tx);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                }
            }
        })
        .map_err(|e| ServeError::Io("starting the engine thread".into(), e))?;
    match ready_rx.recv() {
        Ok(Ok(bound)) => Ok(EngineReady {
            handle: WorkerHandle::new(tx, load),
            max_prompt_tokens: bound.max_prompt_tokens,
            probe: bound.probe,
        }),
        Ok(Err(e)) => Err(ServeError::Engine(e)),
        Err(_) => Err(ServeError::Worker(
            "the engine thread stopped while loading the model".into(),
        )),
    }
}

struct Bound {
    max_prompt_tokens: usize,
    probe: Option<PrefillProbe>,
}

/// Settles the prompt bound (timing a prefill unless it was given), reports it, then serves.
fn serve<M: SpeculativeModel>(
    mut batcher: Batcher<M>,
    how: &EngineLoad,
    rx: mpsc::Receiver<Control>,
    load: &Load,
    ready: mpsc::Sender<Result<Bound, EngineError>>,
) {
    let bound = match how.max_prompt_tokens {
        Some(n) => Ok(Bound {
            max_prompt_tokens: n,
            probe: None,
        }),
        None => probe(&mut batcher, how.context_length).map(|p| Bound {
            max_prompt_tokens: max_prompt_for(p, PREFILL_BUDGET, how.context_length),
            probe: Some(p),
        }),
    };
    let failed = bound.is_err();
    let _ = ready.send(bound);
    if !failed {
        run(batcher, rx, load);
    }
}

/// Times a [`PROBE_TOKENS`]-token prefill (its first token and draft extend included), the
/// faster of two after a short warm-up (first calls pay for allocations and, on a GPU,
/// kernel loads).
fn probe<M: SpeculativeModel>(
    batcher: &mut Batcher<M>,
    context: usize,
) -> Result<PrefillProbe, EngineError> {
    let vocab = batcher.vocab().max(1);
    let tokens = PROBE_TOKENS.min(context.saturating_sub(1)).max(1);
    let mut once = |id: u64, n: usize| -> Result<Duration, EngineError> {
        let prompt = (0..n).map(|i| ((i * 7 + 3) % vocab) as u32).collect();
        let params = SeqParams {
            max_new: 1,
            sampling: SamplingParams {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
            },
            seed: 0,
            stream: 0,
            stop_token_ids: Vec::new(),
        };
        batcher.submit(id, prompt, params)?;
        let started = Instant::now();
        // one forward prefills and finishes it; bounded in case a device splits it
        for _ in 0..64 {
            if batcher.is_idle() {
                break;
            }
            batcher.step()?;
        }
        Ok(started.elapsed())
    };
    once(u64::MAX, tokens.min(16))?;
    let took = once(u64::MAX - 1, tokens)?.min(once(u64::MAX - 2, tokens)?);
    Ok(PrefillProbe { tokens, took })
}

fn run<M: SpeculativeModel>(mut batcher: Batcher<M>, rx: mpsc::Receiver<Control>, load: &Load) {
    let mut clients: HashMap<u64, UnboundedSender<Event>> = HashMap::new();
    loop {
        // Idle: sleep until a request comes. Busy: take what arrived, then run a forward.
        if batcher.is_idle() {
            match rx.recv() {
                Ok(c) => {
                    if !control(c, &mut batcher, &mut clients) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(c) => {
                    if !control(c, &mut batcher, &mut clients) {
                        return;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        }
        let stepped = batcher.step();
        // published before any client hears of its finish, so a client that then asks sees it
        load.set(batcher.running_len(), batcher.waiting_len());
        match stepped {
            Ok(commits) => {
                for c in commits {
                    let finished = c.finish.is_some();
                    let gone = match clients.get(&c.id) {
                        Some(client) => client.send(Event::Commit(commit_of(&c))).is_err(),
                        None => true,
                    };
                    if finished {
                        clients.remove(&c.id);
                    } else if gone {
                        batcher.cancel(c.id);
                        clients.remove(&c.id);
                    }
                }
            }
            Err(e) => {
                let message = format!("engine forward failed: {}", Chain(&e));
                for id in batcher.clear() {
                    if let Some(client) = clients.remove(&id) {
                        let _ = client.send(Event::Failed(message.clone()));
                    }
                }
            }
        }
        load.set(batcher.running_len(), batcher.waiting_len());
    }
}

/// Applies one control message; false: stop the worker.
fn control<M: SpeculativeModel>(
    c: Control,
    batcher: &mut Batcher<M>,
    clients: &mut HashMap<u64, UnboundedSender<Event>>,
) -> bool {
    match c {
        Control::Submit(Job {
            id,
            prompt,
            params,
            events,
        }) => {
            let seq = SeqParams {
                max_new: params.max_new as usize,
                sampling: SamplingParams {
                    temperature: params.temperature,
                    top_k: params.top_k,
                    top_p: params.top_p,
                },
                seed: params.seed,
                stream: params.stream,
                stop_token_ids: params.stop_token_ids,
            };
            match batcher.submit(id, prompt, seq) {
                Ok(()) => {
                    clients.insert(id, events);
                }
                Err(e) => {
                    let _ = events.send(Event::Failed(Chain(&e).to_string()));
                }
            }
        }
        Control::Cancel(id) => {
            batcher.cancel(id);
            clients.remove(&id);
        }
        Control::Shutdown => return false,
    }
    true
}

fn commit_of(c: &batcher::Commit) -> Commit {
    Commit {
        tokens: c.tokens.clone(),
        round: c.round.map(|r| Round {
            proposed: r.proposed,
            accepted: r.accepted,
        }),
        finish: c.finish.map(|f| match f {
            batcher::Finish::Length => Finish::Length,
            batcher::Finish::Stop(t) => Finish::StopToken(t),
        }),
        virtual_ns: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(ms: u64) -> PrefillProbe {
        PrefillProbe {
            tokens: 256,
            took: Duration::from_millis(ms),
        }
    }

    #[test]
    fn the_bound_grows_with_the_square_root_of_the_budget() {
        // 256 tokens in 120 ms: 30 s is 250x, sqrt 15.8 -> 4,047, down to a multiple of 64
        assert_eq!(max_prompt_for(probe(120), PREFILL_BUDGET, 262_144), 4032);
        // a fast device reaches the context
        assert_eq!(max_prompt_for(probe(1), PREFILL_BUDGET, 32_768), 32_767);
        // a probe slower than the budget still accepts what it timed
        assert_eq!(max_prompt_for(probe(60_000), PREFILL_BUDGET, 8192), 256);
        // and never more than the context holds
        assert_eq!(max_prompt_for(probe(60_000), PREFILL_BUDGET, 100), 99);
        assert_eq!(max_prompt_for(probe(0), PREFILL_BUDGET, 4096), 4095);
    }
}
