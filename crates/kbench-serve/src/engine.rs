//! The engine worker: a thread that owns the model and runs the [`Batcher`]'s forwards back
//! to back while requests are running, streaming each request's commits as they happen.

use kbench_core::error_chain::Chain;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};

use kbench_core::verify::SamplingParams;
use kbench_engine::batcher::{self, Batcher, SeqParams};
use kbench_engine::passes::SpecModel;
use kbench_engine::{CudaModel, CudaOptions, Device, EngineError, Model, SpecSettings};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ServeError;
use crate::worker::{Commit, Control, Event, Finish, Job, Load, Round, WorkerHandle};

/// Which checkpoint the worker loads, onto which device.
#[derive(Debug, Clone)]
pub struct EngineLoad {
    pub model_dir: PathBuf,
    pub draft_dir: Option<PathBuf>,
    pub device: Device,
    pub spec: Option<SpecSettings>,
    pub max_running: usize,
}

/// Starts the worker thread. The model loads on it (a GPU context stays on the thread that
/// made it); a loading error is returned here, before anything is served.
pub fn spawn(how: EngineLoad) -> Result<WorkerHandle, ServeError> {
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), EngineError>>();
    let load = Arc::new(Load::default());
    let published = load.clone();
    std::thread::Builder::new()
        .name("kbench-engine".into())
        .spawn(move || {
            let draft = how.draft_dir.as_deref();
            match how.device {
                Device::Cpu => match Model::load(&how.model_dir, draft, Device::Cpu) {
                    Ok(model) => {
                        let _ = ready_tx.send(Ok(()));
                        run(
                            Batcher::new(model.models(), how.spec, how.max_running),
                            rx,
                            &published,
                        );
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                },
                Device::Cuda(first) => {
                    let mut opts = CudaOptions::new(first as usize, 1);
                    opts.max_batch = how.max_running.max(1);
                    match CudaModel::load(&how.model_dir, draft, &opts) {
                        Ok(mut model) => {
                            let _ = ready_tx.send(Ok(()));
                            run(
                                Batcher::new(&mut model, how.spec, how.max_running),
                                rx,
                                &published,
                            );
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
        Ok(Ok(())) => Ok(WorkerHandle::new(tx, load)),
        Ok(Err(e)) => Err(ServeError::Engine(e)),
        Err(_) => Err(ServeError::Worker(
            "the engine thread stopped while loading the model".into(),
        )),
    }
}

fn run<M: SpecModel>(mut batcher: Batcher<M>, rx: mpsc::Receiver<Control>, load: &Load) {
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
fn control<M: SpecModel>(
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
