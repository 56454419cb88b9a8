//! The `engine` backend on the GPU: `crate::backend::EngineBackend`'s scheduler (admit and
//! prefill up to the concurrency cap, then one decode / speculative round over the running
//! batch, continuous batching, wall-clock token times) over [`CudaModel`] and
//! [`GpuSequence`]s, each holding a KV cache slot from admission to completion.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use kbench_core::backend::{Backend, BackendError, Nanos, Request, RequestRecord, Session};
use kbench_core::spec::Experiment;

use super::model::CudaModel;
use super::spec::{decode_step, prefill, spec_round, GpuSequence};
use super::CudaOptions;
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::spec::{seq_rng, SpecSettings};

const NAME: &str = "engine";

fn fail(e: EngineError) -> BackendError {
    BackendError::failed(NAME, "engine error (cuda)", e)
}

pub struct CudaEngineBackend {
    model: CudaModel,
    model_dir: PathBuf,
    spec: Option<SpecSettings>,
    spec_v2: bool,
    max_running: usize,
    temperature: f32,
    seed: u64,
}

impl CudaEngineBackend {
    /// Loads the experiment's `[backend]` model (model_dir, draft_dir defaulting to
    /// model_dir/draft) onto `tp_size` GPUs starting at the ordinal of `device = "cuda:N"`.
    pub fn new(exp: &Experiment) -> Result<CudaEngineBackend> {
        let b = &exp.file.backend;
        let model_dir: PathBuf = match &b.model_dir {
            Some(d) => exp.base_dir.join(d),
            None => {
                return Err(EngineError::Invalid(
                    "[backend] kind = \"engine\" needs `model_dir` (a checkpoint directory)".into(),
                ))
            }
        };
        let first = match b.device.as_deref().map(Device::parse).transpose()? {
            Some(Device::Cuda(n)) => n as usize,
            _ => {
                return Err(EngineError::Invalid(
                    "CudaEngineBackend needs device = \"cuda\" or \"cuda:N\"".into(),
                ))
            }
        };
        let spec = exp.spec.is_speculative().then_some(SpecSettings {
            num_steps: exp.spec.num_steps,
            eagle_topk: exp.spec.eagle_topk,
            num_draft_tokens: exp.spec.num_draft_tokens,
            verify: exp.spec.verify,
        });
        let draft_dir = spec.map(|_| match &b.draft_dir {
            Some(d) => exp.base_dir.join(d),
            None => model_dir.join("draft"),
        });
        let opts = CudaOptions::from_experiment(exp, first)?;
        let model = CudaModel::load(&model_dir, draft_dir.as_deref(), &opts)?;
        Ok(CudaEngineBackend {
            model,
            model_dir,
            spec,
            spec_v2: exp.spec.spec_v2,
            max_running: (exp.max_running_requests as usize).clamp(1, opts.max_batch),
            temperature: exp.file.workload.temperature.unwrap_or(0.0) as f32,
            seed: exp.file.seed,
        })
    }

    pub fn model(&self) -> &CudaModel {
        &self.model
    }

    /// The prompt of a request: the same ids as the CPU backend's `prompt_for`.
    pub fn prompt_for(&self, seed: u64, request: &Request) -> Vec<u32> {
        crate::backend::random_prompt(
            seed,
            request.id,
            request.input_len as usize,
            self.model.vocab(),
        )
    }
}

impl Backend for CudaEngineBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn describe(&self) -> String {
        let what = crate::backend::describe_spec(
            self.spec.as_ref(),
            self.spec_v2,
            ", v2 (same tokens; overlap not implemented)",
        );
        format!(
            "kbench engine on {} (tp {}, {}), {what}, wall-clock times",
            self.model.devices().join(", "),
            self.model.tp_size(),
            self.model_dir.display()
        )
    }

    fn start_level(
        &mut self,
        concurrency: u32,
    ) -> std::result::Result<Box<dyn Session + '_>, BackendError> {
        let slots = (0..self.model.opts.max_batch).rev().collect();
        Ok(Box::new(CudaSession {
            backend: self,
            start: Instant::now(),
            cap: concurrency.max(1) as usize,
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_slots: slots,
        }))
    }
}

struct Live {
    seq: GpuSequence,
    request: Request,
    submitted_ns: Nanos,
    token_times: Vec<Nanos>,
}

struct CudaSession<'a> {
    backend: &'a mut CudaEngineBackend,
    start: Instant,
    cap: usize,
    waiting: VecDeque<Live>,
    running: Vec<Live>,
    free_slots: Vec<usize>,
}

impl CudaSession<'_> {
    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }
}

fn stamp(now: Nanos, live: &mut Live, before: usize) {
    let after = live.seq.output_len();
    live.token_times
        .extend(std::iter::repeat_n(now, after.saturating_sub(before)));
}

impl Session for CudaSession<'_> {
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
        let b = &*self.backend;
        let prompt = b.prompt_for(b.seed, &request);
        // slot assigned at admission
        let seq = GpuSequence::new(
            request.id,
            usize::MAX,
            prompt,
            request.max_tokens as usize,
            b.temperature,
            seq_rng(b.seed, request.id),
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
        let limit = self.cap.min(self.backend.max_running);
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                return Ok(Vec::new());
            }
            let mut admitted = Vec::new();
            while self.running.len() + admitted.len() < limit && !self.free_slots.is_empty() {
                match self.waiting.pop_front() {
                    Some(mut l) => {
                        l.seq.slot = self.free_slots.pop().expect("checked");
                        admitted.push(l);
                    }
                    None => break,
                }
            }
            if !admitted.is_empty() {
                {
                    let mut refs: Vec<&mut GpuSequence> =
                        admitted.iter_mut().map(|l| &mut l.seq).collect();
                    prefill(&mut self.backend.model, &mut refs).map_err(fail)?;
                }
                let now = self.now();
                for mut l in admitted {
                    stamp(now, &mut l, 0);
                    self.running.push(l);
                }
            } else {
                let before: Vec<usize> = self.running.iter().map(|l| l.seq.output_len()).collect();
                {
                    let mut refs: Vec<&mut GpuSequence> =
                        self.running.iter_mut().map(|l| &mut l.seq).collect();
                    let spec = self.backend.spec;
                    match &spec {
                        Some(cfg) => {
                            spec_round(&mut self.backend.model, &mut refs, cfg).map_err(fail)?;
                        }
                        None => decode_step(&mut self.backend.model, &mut refs).map_err(fail)?,
                    }
                }
                let now = self.now();
                for (l, bf) in self.running.iter_mut().zip(before) {
                    stamp(now, l, bf);
                }
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
                for l in &finished {
                    self.free_slots.push(l.seq.slot);
                }
                finished.sort_by_key(|l| l.request.id);
                let spec_on = self.backend.spec.is_some();
                return Ok(finished
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
                    .collect());
            }
        }
    }
}
