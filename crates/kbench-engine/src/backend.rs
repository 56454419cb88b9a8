//! The `engine` backend: real tokens from the engine, wall-clock times, continuous batching.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use rand::RngExt;

use kbench_core::backend::{Backend, BackendError, Nanos, Request, RequestRecord, Session};
use kbench_core::seed::rng_for;
use kbench_core::spec::{Experiment, VerifyMethod};

use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::spec::{decode_step, prefill, seq_rng, spec_round, Sequence, SpecSettings};

const NAME: &str = "engine";

fn fail(e: EngineError) -> BackendError {
    BackendError::failed(NAME, "engine error", e)
}

pub struct EngineBackend {
    model: Model,
    spec: Option<SpecSettings>,
    spec_v2: bool,
    max_running: usize,
    temperature: f32,
    seed: u64,
}

impl EngineBackend {
    /// Loads the model named by the experiment's `[backend]` (model_dir, draft_dir
    /// defaulting to model_dir/draft, device), relative to the experiment file.
    pub fn new(exp: &Experiment) -> Result<EngineBackend> {
        let b = &exp.file.backend;
        let model_dir: PathBuf = match &b.model_dir {
            Some(d) => exp.base_dir.join(d),
            None => {
                return Err(EngineError::Invalid(
                    "[backend] kind = \"engine\" needs `model_dir` (a checkpoint directory)".into(),
                ))
            }
        };
        let device = match &b.device {
            Some(d) => Device::parse(d)?,
            None => Device::Cpu,
        };
        let spec = if exp.spec.is_speculative() {
            Some(SpecSettings {
                num_steps: exp.spec.num_steps,
                eagle_topk: exp.spec.eagle_topk,
                num_draft_tokens: exp.spec.num_draft_tokens,
                verify: exp.spec.verify,
            })
        } else {
            None
        };
        let draft_dir = spec.map(|_| match &b.draft_dir {
            Some(d) => exp.base_dir.join(d),
            None => model_dir.join("draft"),
        });
        let model = Model::load(&model_dir, draft_dir.as_deref(), device)?;
        let t = exp.file.workload.temperature.unwrap_or(0.0) as f32;
        Ok(EngineBackend {
            model,
            spec,
            spec_v2: exp.spec.spec_v2,
            max_running: exp.max_running_requests as usize,
            temperature: t,
            seed: exp.file.seed,
        })
    }

    /// For callers that already hold a model (tests, benches).
    pub fn from_model(
        model: Model,
        spec: Option<SpecSettings>,
        spec_v2: bool,
        max_running: usize,
        temperature: f32,
        seed: u64,
    ) -> EngineBackend {
        EngineBackend {
            model,
            spec,
            spec_v2,
            max_running: max_running.max(1),
            temperature,
            seed,
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The prompt of a request: `input_len` token ids from the request's own stream.
    pub fn prompt_for(&self, seed: u64, request: &Request) -> Vec<u32> {
        random_prompt(
            seed,
            request.id,
            request.input_len as usize,
            self.model.target.vocab,
        )
    }
}

/// A prompt of `len` (at least 1) random token ids, a pure function of (seed, id): the CPU
/// and GPU backends and `trace record` all draw prompts this way, so they serve the same
/// tokens.
pub fn random_prompt(seed: u64, id: u64, len: usize, vocab: usize) -> Vec<u32> {
    let mut rng = rng_for(seed, "prompt", id);
    (0..len.max(1))
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
}

/// The speculative part of a backend's one-line description.
pub(crate) fn describe_spec(spec: Option<&SpecSettings>, spec_v2: bool, v2_note: &str) -> String {
    match spec {
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
            if spec_v2 { v2_note } else { "" }
        ),
        None => "plain decoding".into(),
    }
}

impl Backend for EngineBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn describe(&self) -> String {
        let what = describe_spec(
            self.spec.as_ref(),
            self.spec_v2,
            ", v2 (same tokens; overlap not modelled on CPU)",
        );
        format!(
            "kbench engine on {} ({}), {what}, wall-clock times",
            self.model.device,
            self.model.dir.display()
        )
    }

    fn start_level(
        &mut self,
        concurrency: u32,
    ) -> std::result::Result<Box<dyn Session + '_>, BackendError> {
        Ok(Box::new(EngineSession {
            backend: self,
            start: Instant::now(),
            cap: concurrency.max(1) as usize,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }))
    }
}

struct Live {
    seq: Sequence,
    request: Request,
    submitted_ns: Nanos,
    token_times: Vec<Nanos>,
}

struct EngineSession<'a> {
    backend: &'a EngineBackend,
    start: Instant,
    cap: usize,
    waiting: VecDeque<Live>,
    running: Vec<Live>,
}

impl EngineSession<'_> {
    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    fn stamp(&self, live: &mut Live, before: usize) {
        let now = self.now();
        let after = live.seq.output_len();
        live.token_times
            .extend(std::iter::repeat_n(now, after.saturating_sub(before)));
    }
}

impl Session for EngineSession<'_> {
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
        let b = self.backend;
        let prompt = b.prompt_for(b.seed, &request);
        let seq = Sequence::new(
            request.id,
            prompt,
            request.max_tokens as usize,
            b.temperature,
            seq_rng(b.seed, request.id),
            &b.model.target,
        );
        let submitted_ns = self.now();
        self.waiting.push_back(Live {
            seq,
            request,
            submitted_ns,
            token_times: Vec::new(),
        });
        Ok(())
    }

    fn run_until_completion(&mut self) -> std::result::Result<Vec<RequestRecord>, BackendError> {
        let b = self.backend;
        let m = b.model.models();
        let limit = self.cap.min(b.max_running);
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                return Ok(Vec::new());
            }
            // Admit and prefill new requests (a prefill batch, as SGLang schedules it).
            let mut admitted = Vec::new();
            while self.running.len() + admitted.len() < limit {
                match self.waiting.pop_front() {
                    Some(l) => admitted.push(l),
                    None => break,
                }
            }
            if !admitted.is_empty() {
                {
                    let mut refs: Vec<&mut Sequence> =
                        admitted.iter_mut().map(|l| &mut l.seq).collect();
                    prefill(&m, &mut refs).map_err(fail)?;
                }
                for mut l in admitted {
                    self.stamp(&mut l, 0);
                    self.running.push(l);
                }
            } else {
                // One decode round over the whole running batch.
                let before: Vec<usize> = self.running.iter().map(|l| l.seq.output_len()).collect();
                {
                    let mut refs: Vec<&mut Sequence> =
                        self.running.iter_mut().map(|l| &mut l.seq).collect();
                    match &b.spec {
                        Some(cfg) => {
                            spec_round(&m, &mut refs, cfg).map_err(fail)?;
                        }
                        None => decode_step(&m, &mut refs).map_err(fail)?,
                    }
                }
                let mut running = std::mem::take(&mut self.running);
                for (l, bf) in running.iter_mut().zip(before) {
                    self.stamp(l, bf);
                }
                self.running = running;
            }
            let mut finished = Vec::new();
            let mut keep = Vec::with_capacity(self.running.len());
            for l in self.running.drain(..) {
                if l.seq.finished() {
                    finished.push(l);
                } else {
                    keep.push(l);
                }
            }
            self.running = keep;
            if !finished.is_empty() {
                finished.sort_by_key(|l| l.request.id);
                return Ok(finished
                    .into_iter()
                    .map(|l| RequestRecord {
                        id: l.request.id,
                        warmup: l.request.warmup,
                        input_len: l.request.input_len,
                        submitted_ns: l.submitted_ns,
                        token_times_ns: l.token_times,
                        round_commits: if b.spec.is_some() {
                            l.seq.round_commits
                        } else {
                            Vec::new()
                        },
                    })
                    .collect());
            }
        }
    }
}
