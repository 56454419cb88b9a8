//! The `engine` backend's session, on any [`SpeculativeModel`]: the [`Batcher`]'s continuous
//! batching (a prefill batch while slots are free, else one decode / speculative round over
//! the running batch) with wall-clock token times. On devices with KV slots a request holds
//! one from admission to completion.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kbench_core::backend::{BackendError, ChunkEvent, Nanos, Request, RequestRecord, Session};
use kbench_core::experiment::{Experiment, VerifyMethod};
use kbench_core::verify::SamplingParams;

use crate::backend::request_prompt;
use crate::batcher::{Batcher, Commit, SeqParams};
use crate::error::EngineError;
use crate::passes::SpeculativeModel;
use crate::speculative::SpeculativeSettings;

pub(crate) const NAME: &str = "engine";

/// How an `engine` backend serves, whatever its device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Serving {
    pub spec: Option<SpeculativeSettings>,
    pub spec_v2: bool,
    pub max_running: usize,
    pub temperature: f32,
    pub seed: u64,
}

impl Serving {
    pub fn from_experiment(exp: &Experiment) -> Serving {
        // a resolved experiment's speculative settings passed SGLang's rules, which are
        // stricter than what a tree needs
        let spec = exp
            .speculative
            .is_speculative()
            .then_some(SpeculativeSettings {
                shape: exp.speculative.shape,
                verify: exp.speculative.verify,
            });
        Serving {
            spec,
            spec_v2: exp.speculative.spec_v2,
            max_running: exp.max_running_requests as usize,
            temperature: exp.file.workload.temperature.unwrap_or(0.0) as f32,
            seed: exp.file.seed,
        }
    }

    /// The speculative part of a backend's one-line description.
    pub fn describe(&self, v2_note: &str) -> String {
        match &self.spec {
            Some(s) => format!(
                "EAGLE-3 ({}, {}, {}) {} verification{}",
                s.shape.num_steps,
                s.shape.topk,
                s.shape.num_draft_tokens,
                match s.verify {
                    VerifyMethod::Greedy => "greedy",
                    VerifyMethod::TargetOnly => "target-only sampling",
                    VerifyMethod::Exact => "exact sampling",
                },
                if self.spec_v2 { v2_note } else { "" }
            ),
            None => "plain decoding".into(),
        }
    }
}

struct Live {
    request: Request,
    submitted_ns: Nanos,
    token_times: Vec<Nanos>,
    round_commits: Vec<u32>,
}

pub(crate) struct EngineSession<M: SpeculativeModel> {
    batcher: Batcher<M>,
    serving: Serving,
    /// Message of errors from the device's passes.
    error: &'static str,
    start: Instant,
    live: BTreeMap<u64, Live>,
    chunks: Option<Vec<ChunkEvent>>,
}

impl<M: SpeculativeModel> EngineSession<M> {
    pub fn new(model: M, serving: Serving, error: &'static str, concurrency: u32) -> Self {
        let limit = (concurrency.max(1) as usize).min(serving.max_running);
        EngineSession {
            batcher: Batcher::new(model, serving.spec, limit),
            serving,
            error,
            start: Instant::now(),
            live: BTreeMap::new(),
            chunks: None,
        }
    }

    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    fn fail(&self, e: EngineError) -> BackendError {
        BackendError::failed(NAME, self.error, e)
    }

    /// One forward; returns the requests it finished, by id.
    fn step(&mut self) -> std::result::Result<Vec<RequestRecord>, BackendError> {
        let commits = match self.batcher.step() {
            Ok(c) => c,
            Err(e) => {
                self.batcher.clear();
                self.live.clear();
                return Err(self.fail(e));
            }
        };
        let now = self.now();
        let spec_on = self.serving.spec.is_some();
        let mut finished = Vec::new();
        for Commit {
            id,
            tokens,
            round,
            finish,
        } in commits
        {
            let Some(l) = self.live.get_mut(&id) else {
                continue;
            };
            l.token_times.extend(std::iter::repeat_n(now, tokens.len()));
            if spec_on && round.is_some() {
                l.round_commits.push(tokens.len() as u32);
            }
            if let Some(chunks) = &mut self.chunks {
                chunks.push(ChunkEvent {
                    id,
                    visible_ns: now,
                    tokens: tokens.len() as u32,
                    spec_round: round.is_some(),
                    finished: finish.is_some(),
                });
            }
            if finish.is_some() {
                finished.push(id);
            }
        }
        finished.sort_unstable();
        Ok(finished
            .into_iter()
            .filter_map(|id| self.live.remove(&id))
            .map(|l| RequestRecord {
                id: l.request.id,
                warmup: l.request.warmup,
                input_len: l.request.input_len,
                requested_tokens: l.request.max_tokens,
                submitted_ns: l.submitted_ns,
                retractions: None,
                token_times_ns: l.token_times,
                round_commits: l.round_commits,
                undrafted_rounds: 0,
                reported_rounds: None,
                reported_accepted: None,
                error: None,
            })
            .collect())
    }
}

impl<M: SpeculativeModel> Session for EngineSession<M> {
    fn now_ns(&self) -> Nanos {
        self.now()
    }

    fn submit(&mut self, request: Request) -> std::result::Result<(), BackendError> {
        let prompt = request_prompt(
            self.serving.seed,
            request.id,
            request.input_len as usize,
            request.shared_prefix_len as usize,
            self.batcher.vocab(),
        );
        // A request that would meet EOS stops at its drawn length: the tiny model's own EOS
        // is not the workload's.
        let params = SeqParams {
            max_new: request.output_len() as usize,
            sampling: SamplingParams::temperature(self.serving.temperature),
            seed: self.serving.seed,
            stream: request.id,
            stop_token_ids: Vec::new(),
        };
        self.batcher
            .submit(request.id, prompt, params)
            .map_err(|e| BackendError::failed(NAME, "request refused", e))?;
        let submitted_ns = self.now();
        self.live.insert(
            request.id,
            Live {
                request,
                submitted_ns,
                token_times: Vec::new(),
                round_commits: Vec::new(),
            },
        );
        Ok(())
    }

    fn run_until_completion(&mut self) -> std::result::Result<Vec<RequestRecord>, BackendError> {
        while !self.batcher.is_idle() {
            let finished = self.step()?;
            if !finished.is_empty() {
                return Ok(finished);
            }
        }
        Ok(Vec::new())
    }

    fn advance_to(
        &mut self,
        deadline: Nanos,
    ) -> std::result::Result<Vec<RequestRecord>, BackendError> {
        let mut out = Vec::new();
        while !self.batcher.is_idle() && self.now() <= deadline {
            out.extend(self.step()?);
        }
        let now = self.now();
        if self.batcher.is_idle() && now < deadline {
            std::thread::sleep(Duration::from_nanos(deadline - now));
        }
        Ok(out)
    }

    fn record_chunks(&mut self) {
        self.chunks.get_or_insert_with(Vec::new);
    }

    fn take_chunks(&mut self) -> Vec<ChunkEvent> {
        self.chunks.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn cancel(&mut self, id: u64) -> bool {
        self.live.remove(&id);
        self.batcher.cancel(id)
    }
}
