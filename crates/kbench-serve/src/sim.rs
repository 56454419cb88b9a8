//! The simulator worker (`kbench serve --sim`): requests arriving in wall time enter the
//! simulator's schedule at the matching virtual time (`speed` x the wall time since start),
//! and each chunk is released when the cost model says the modelled deployment shows it,
//! divided by `speed`. The simulator never runs a forward that starts after the wall clock's
//! virtual now, so a later arrival can never change a forward already priced.

use kbench_core::error_chain::Chain;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc::UnboundedSender;

use kbench_core::backend::{Backend, ChunkEvent, Nanos, Request};
use kbench_sim::SimBackend;

use crate::error::ServeError;
use crate::worker::{Commit, Control, Event, Finish, Load, Round, WorkerHandle};

/// Ids the simulator's tokens are drawn from: past the special ids, inside the vocabulary.
const FIRST_TOKEN_ID: u32 = 3;

/// Builds the simulator on its own thread (its price caches are not shared between threads).
pub type MakeSim = Box<dyn FnOnce() -> Result<SimBackend, kbench_sim::SimError> + Send>;

pub struct SimWorker {
    pub make: MakeSim,
    /// Virtual seconds per wall second.
    pub speed: f64,
    pub vocab: u32,
    pub seed: u64,
    /// Draft tokens verified per round (`num_draft_tokens - 1`) when speculating.
    pub proposed: Option<u32>,
    pub max_running: u32,
}

pub fn spawn(worker: SimWorker) -> Result<WorkerHandle, ServeError> {
    if !(worker.speed.is_finite() && worker.speed > 0.0) {
        return Err(ServeError::Config(format!(
            "--speed {} must be a positive number",
            worker.speed
        )));
    }
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let load = Arc::new(Load::default());
    let published = load.clone();
    std::thread::Builder::new()
        .name("kbench-sim".into())
        .spawn(move || {
            let SimWorker {
                make,
                speed,
                vocab,
                seed,
                proposed,
                max_running,
            } = worker;
            match make() {
                Ok(backend) => {
                    let _ = ready_tx.send(Ok(()));
                    let w = Running {
                        backend,
                        speed,
                        vocab,
                        seed,
                        proposed,
                        max_running,
                    };
                    run(w, rx, &published);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| ServeError::Io("starting the simulator thread".into(), e))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(WorkerHandle::new(tx, load)),
        Ok(Err(e)) => Err(ServeError::Sim(e)),
        Err(_) => Err(ServeError::Worker(
            "the simulator thread stopped while starting".into(),
        )),
    }
}

struct Running {
    backend: SimBackend,
    speed: f64,
    vocab: u32,
    seed: u64,
    proposed: Option<u32>,
    max_running: u32,
}

struct Client {
    events: UnboundedSender<Event>,
    tokens: ChaCha8Rng,
    /// The simulator has priced this request's last forward.
    last_recorded: bool,
}

/// A chunk waiting for its release time, ordered by (virtual time, order of recording).
type Pending = Reverse<(Nanos, u64, ChunkEvent)>;

fn run(w: Running, rx: mpsc::Receiver<Control>, load: &Load) {
    let start = Instant::now();
    let speed = w.speed;
    let virtual_now = || (start.elapsed().as_secs_f64() * 1e9 * speed) as Nanos;
    // saturating: a virtual time far past any run waits a year rather than panicking
    let wall_at = |v: Nanos| {
        let wait = kbench_core::duration::saturating_seconds(v as f64 / 1e9 / speed);
        start.checked_add(wait).unwrap_or(start)
    };
    let mut backend = w.backend;
    let mut session = match backend.start_level(w.max_running) {
        Ok(s) => s,
        Err(e) => return fail_all_forever(rx, &Chain(&e).to_string()),
    };
    session.record_chunks();
    let mut clients: HashMap<u64, Client> = HashMap::new();
    let mut pending: BinaryHeap<Pending> = BinaryHeap::new();
    let mut order = 0u64;
    // Clients whose last forward the simulator has not priced yet: while any, it has work.
    let mut unpriced = 0usize;
    loop {
        // Sleep until the next chunk is due, the next forward starts, or a message comes.
        let next_v = [
            pending.peek().map(|Reverse((v, _, _))| *v),
            (unpriced > 0).then(|| session.now_ns()),
        ]
        .into_iter()
        .flatten()
        .min();
        let first = match next_v {
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            Some(v) => rx.recv_timeout(wall_at(v).saturating_duration_since(Instant::now())),
        };
        let mut messages = Vec::new();
        match first {
            Ok(m) => messages.push(m),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(m) = rx.try_recv() {
            messages.push(m);
        }
        let mut failed = None;
        for m in messages {
            match m {
                Control::Submit(job) => {
                    // forwards that started before this arrival run without it
                    if let Err(e) = session.advance_to(virtual_now()) {
                        failed = Some(Chain(&e).to_string());
                    }
                    let request = Request {
                        id: job.id,
                        input_len: job.prompt.len() as u32,
                        max_tokens: job.params.max_new,
                        // a simulated model has no EOS of its own and sees no shared
                        // prefix in a request
                        ..Request::default()
                    };
                    match session.submit(request) {
                        Ok(()) => {
                            unpriced += 1;
                            clients.insert(
                                job.id,
                                Client {
                                    events: job.events,
                                    tokens: kbench_core::seed::rng_for(
                                        w.seed,
                                        "serve-sim-tokens",
                                        job.id,
                                    ),
                                    last_recorded: false,
                                },
                            );
                        }
                        Err(e) => {
                            let _ = job.events.send(Event::Failed(Chain(&e).to_string()));
                        }
                    }
                }
                Control::Cancel(id) => {
                    session.cancel(id);
                    if let Some(c) = clients.remove(&id) {
                        if !c.last_recorded {
                            unpriced -= 1;
                        }
                    }
                }
                Control::Shutdown => return,
            }
        }
        if let Err(e) = session.advance_to(virtual_now()) {
            failed = Some(Chain(&e).to_string());
        }
        if let Some(message) = failed {
            // the cost model refused a forward: nothing running can be priced any more
            for (id, c) in clients.drain() {
                session.cancel(id);
                let _ = c
                    .events
                    .send(Event::Failed(format!("simulator: {message}")));
            }
            pending.clear();
            unpriced = 0;
        }
        for chunk in session.take_chunks() {
            if chunk.finished {
                if let Some(c) = clients.get_mut(&chunk.id) {
                    c.last_recorded = true;
                    unpriced -= 1;
                }
            }
            order += 1;
            pending.push(Reverse((chunk.visible_ns, order, chunk)));
        }
        let now_v = virtual_now();
        while pending.peek().is_some_and(|Reverse((v, _, _))| *v <= now_v) {
            let Reverse((_, _, chunk)) = pending.pop().expect("peeked");
            let Some(c) = clients.get_mut(&chunk.id) else {
                continue;
            };
            let delivered = release(c, chunk, w.proposed, w.vocab);
            if chunk.finished || !delivered {
                let c = clients.remove(&chunk.id).expect("present");
                if !c.last_recorded {
                    // its client went away mid-stream: stop simulating it
                    session.cancel(chunk.id);
                    unpriced -= 1;
                }
            }
        }
        let running = clients.len().min(w.max_running as usize);
        load.set(running, clients.len() - running);
    }
}

/// Sends a chunk to its client (token ids drawn from the request's own stream); false when
/// the client has gone.
fn release(c: &mut Client, chunk: ChunkEvent, proposed: Option<u32>, vocab: u32) -> bool {
    let tokens: Vec<u32> = (0..chunk.tokens)
        .map(|_| {
            c.tokens
                .random_range(FIRST_TOKEN_ID..vocab.max(FIRST_TOKEN_ID + 1))
        })
        .collect();
    let commit = Commit {
        round: match (chunk.spec_round, proposed) {
            (true, Some(p)) => Some(Round {
                proposed: p,
                accepted: chunk.tokens.saturating_sub(1),
            }),
            _ => None,
        },
        tokens,
        finish: chunk.finished.then_some(Finish::Length),
        virtual_ns: Some(chunk.visible_ns),
    };
    c.events.send(Event::Commit(commit)).is_ok()
}

fn fail_all_forever(rx: mpsc::Receiver<Control>, message: &str) {
    while let Ok(m) = rx.recv() {
        match m {
            Control::Submit(job) => {
                let _ = job
                    .events
                    .send(Event::Failed(format!("simulator: {message}")));
            }
            Control::Cancel(_) => {}
            Control::Shutdown => return,
        }
    }
}
