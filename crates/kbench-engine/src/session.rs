//! The `engine` backend's scheduler, on any [`SpecModel`]: admit and prefill new requests up
//! to the concurrency cap (a prefill batch, as SGLang schedules it), else one decode /
//! speculative round over the whole running batch; continuous batching, wall-clock token
//! times. On devices with KV slots a request holds one from admission to completion.

use std::collections::VecDeque;
use std::time::Instant;

use kbench_core::backend::{BackendError, Nanos, Request, RequestRecord, Session};
use kbench_core::spec::{Experiment, VerifyMethod};

use crate::backend::random_prompt;
use crate::error::EngineError;
use crate::passes::SpecModel;
use crate::spec::{decode_step, prefill, seq_rng, spec_round, Seq, SpecSettings};

pub(crate) const NAME: &str = "engine";

/// How an `engine` backend serves, whatever its device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Serving {
    pub spec: Option<SpecSettings>,
    pub spec_v2: bool,
    pub max_running: usize,
    pub temperature: f32,
    pub seed: u64,
}

impl Serving {
    pub fn from_experiment(exp: &Experiment) -> Serving {
        let spec = exp.spec.is_speculative().then_some(SpecSettings {
            num_steps: exp.spec.num_steps,
            eagle_topk: exp.spec.eagle_topk,
            num_draft_tokens: exp.spec.num_draft_tokens,
            verify: exp.spec.verify,
        });
        Serving {
            spec,
            spec_v2: exp.spec.spec_v2,
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
                s.num_steps,
                s.eagle_topk,
                s.num_draft_tokens,
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

struct Waiting {
    request: Request,
    prompt: Vec<u32>,
    submitted_ns: Nanos,
}

struct Live<C> {
    seq: Seq<C>,
    slot: usize,
    request: Request,
    submitted_ns: Nanos,
    token_times: Vec<Nanos>,
}

pub(crate) struct EngineSession<M: SpecModel> {
    model: M,
    serving: Serving,
    /// Message of errors from the device's passes.
    error: &'static str,
    start: Instant,
    cap: usize,
    waiting: VecDeque<Waiting>,
    running: Vec<Live<M::Caches>>,
    /// KV slots no running request holds; `None` where the device has no slots.
    free_slots: Option<Vec<usize>>,
}

impl<M: SpecModel> EngineSession<M> {
    pub fn new(model: M, serving: Serving, error: &'static str, concurrency: u32) -> Self {
        let free_slots = model.kv_slots().map(|n| (0..n).rev().collect());
        EngineSession {
            model,
            serving,
            error,
            start: Instant::now(),
            cap: concurrency.max(1) as usize,
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_slots,
        }
    }

    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    fn fail(&self, e: EngineError) -> BackendError {
        BackendError::failed(NAME, self.error, e)
    }

    /// Takes waiting requests while the cap and the free slots allow.
    fn admit(&mut self, limit: usize) -> Vec<Live<M::Caches>> {
        let mut admitted = Vec::new();
        while self.running.len() + admitted.len() < limit && !self.waiting.is_empty() {
            let slot = match &mut self.free_slots {
                Some(free) => match free.pop() {
                    Some(slot) => slot,
                    None => break,
                },
                None => 0,
            };
            let w = self.waiting.pop_front().expect("checked");
            let s = &self.serving;
            let seq = Seq::with_caches(
                w.request.id,
                w.prompt,
                w.request.max_tokens as usize,
                s.temperature,
                seq_rng(s.seed, w.request.id),
                self.model.new_caches(slot),
            );
            admitted.push(Live {
                seq,
                slot,
                request: w.request,
                submitted_ns: w.submitted_ns,
                token_times: Vec::new(),
            });
        }
        admitted
    }
}

fn stamp<C>(now: Nanos, live: &mut Live<C>, before: usize) {
    let after = live.seq.output_len();
    live.token_times
        .extend(std::iter::repeat_n(now, after.saturating_sub(before)));
}

impl<M: SpecModel> Session for EngineSession<M> {
    fn now_ns(&self) -> Nanos {
        self.now()
    }

    fn submit(&mut self, request: Request) -> std::result::Result<(), BackendError> {
        if request.max_tokens == 0 {
            return Err(BackendError::msg(
                NAME,
                format!("request {} asks for 0 tokens", request.id),
            ));
        }
        let prompt = random_prompt(
            self.serving.seed,
            request.id,
            request.input_len as usize,
            self.model.vocab(),
        );
        let submitted_ns = self.now();
        self.waiting.push_back(Waiting {
            request,
            prompt,
            submitted_ns,
        });
        Ok(())
    }

    fn run_until_completion(&mut self) -> std::result::Result<Vec<RequestRecord>, BackendError> {
        let limit = self.cap.min(self.serving.max_running);
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                return Ok(Vec::new());
            }
            let mut admitted = self.admit(limit);
            if !admitted.is_empty() {
                let mut refs: Vec<&mut Seq<M::Caches>> =
                    admitted.iter_mut().map(|l| &mut l.seq).collect();
                prefill(&mut self.model, &mut refs).map_err(|e| self.fail(e))?;
                let now = self.now();
                for mut l in admitted {
                    stamp(now, &mut l, 0);
                    self.running.push(l);
                }
            } else {
                let before: Vec<usize> = self.running.iter().map(|l| l.seq.output_len()).collect();
                let mut refs: Vec<&mut Seq<M::Caches>> =
                    self.running.iter_mut().map(|l| &mut l.seq).collect();
                let done = match &self.serving.spec {
                    Some(cfg) => spec_round(&mut self.model, &mut refs, cfg).map(drop),
                    None => decode_step(&mut self.model, &mut refs),
                };
                done.map_err(|e| self.fail(e))?;
                let now = self.now();
                for (l, bf) in self.running.iter_mut().zip(before) {
                    stamp(now, l, bf);
                }
            }
            let (finished, keep): (Vec<_>, Vec<_>) =
                self.running.drain(..).partition(|l| l.seq.finished());
            self.running = keep;
            if !finished.is_empty() {
                return Ok(self.retire(finished));
            }
        }
    }
}

impl<M: SpecModel> EngineSession<M> {
    /// Records of finished requests, by id; their slots become free.
    fn retire(&mut self, mut finished: Vec<Live<M::Caches>>) -> Vec<RequestRecord> {
        if let Some(free) = &mut self.free_slots {
            free.extend(finished.iter().map(|l| l.slot));
        }
        finished.sort_by_key(|l| l.request.id);
        let spec_on = self.serving.spec.is_some();
        finished
            .into_iter()
            .map(|l| RequestRecord {
                id: l.request.id,
                warmup: l.request.warmup,
                input_len: l.request.input_len,
                submitted_ns: l.submitted_ns,
                token_times_ns: l.token_times,
                round_commits: if spec_on {
                    l.seq.round_commits
                } else {
                    Vec::new()
                },
            })
            .collect()
    }
}
