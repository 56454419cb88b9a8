//! What the HTTP side and a generation worker (the engine's thread, or the simulator's) say
//! to each other. The worker owns the model and its clock; the HTTP side never waits on it
//! except through these channels, so a long forward never blocks a connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use tokio::sync::mpsc::UnboundedSender;

/// How one request is decoded, whatever the worker.
#[derive(Debug, Clone, PartialEq)]
pub struct JobParams {
    pub max_new: u32,
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    /// With `stream`, seeds the request's sampling (`seq_rng(seed, stream)`).
    pub seed: u64,
    pub stream: u64,
    /// Token ids that end the request (EOS unless ignored, plus `stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
}

pub struct Job {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub params: JobParams,
    pub events: UnboundedSender<Event>,
}

/// One forward's commit for one request: one streamed chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub tokens: Vec<u32>,
    /// Set when the commit comes from a verify round.
    pub round: Option<Round>,
    pub finish: Option<Finish>,
    /// `--sim`: when the modelled deployment made these tokens visible (virtual ns).
    pub virtual_ns: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Draft tokens verified: `num_draft_tokens - 1`.
    pub proposed: u32,
    /// Of those, the ones committed.
    pub accepted: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Length,
    /// A stop token id (EOS or one of `stop_token_ids`).
    StopToken(u32),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Commit(Commit),
    /// The worker could not serve the request (a failed forward).
    Failed(String),
}

pub enum Control {
    Submit(Job),
    /// The client went away: free the request's slot.
    Cancel(u64),
    Shutdown,
}

/// Queue lengths the worker publishes after each forward, for `/metrics` and
/// `/get_server_info`.
#[derive(Debug, Default)]
pub struct Load {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
}

impl Load {
    pub fn set(&self, running: usize, waiting: usize) {
        self.running.store(running, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
    }
}

/// The HTTP side's end of a worker.
#[derive(Clone)]
pub struct WorkerHandle {
    tx: mpsc::Sender<Control>,
    pub load: Arc<Load>,
}

impl WorkerHandle {
    pub fn new(tx: mpsc::Sender<Control>, load: Arc<Load>) -> WorkerHandle {
        WorkerHandle { tx, load }
    }

    /// False when the worker has stopped (it failed, or the server is shutting down).
    pub fn submit(&self, job: Job) -> bool {
        self.tx.send(Control::Submit(job)).is_ok()
    }

    pub fn cancel(&self, id: u64) {
        let _ = self.tx.send(Control::Cancel(id));
    }

    pub fn shutdown(&self) {
        let _ = self.tx.send(Control::Shutdown);
    }
}
