//! The `engine` backend: real tokens from the engine, wall-clock times, continuous batching
//! (the scheduler is `crate::session`'s, shared with the GPU backend).

use std::path::PathBuf;

use rand::RngExt;

use kbench_core::backend::{Backend, BackendError, Request, Session};
use kbench_core::seed::rng_for;
use kbench_core::spec::Experiment;

use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::session::{EngineSession, Serving, NAME};
use crate::spec::SpecSettings;

pub struct EngineBackend {
    model: Model,
    serving: Serving,
}

impl EngineBackend {
    /// Loads the model named by the experiment's `[backend]` (model_dir, draft_dir
    /// defaulting to model_dir/draft, device), relative to the experiment file.
    pub fn new(exp: &Experiment) -> Result<EngineBackend> {
        let serving = Serving::from_experiment(exp);
        let (model_dir, draft_dir) = checkpoint_dirs(exp, serving.spec.is_some())?;
        let device = match &exp.file.backend.device {
            Some(d) => Device::parse(d)?,
            None => Device::Cpu,
        };
        let model = Model::load(&model_dir, draft_dir.as_deref(), device)?;
        Ok(EngineBackend { model, serving })
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
            serving: Serving {
                spec,
                spec_v2,
                max_running: max_running.max(1),
                temperature,
                seed,
            },
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

/// The `[backend]` checkpoint directories of an experiment: model_dir and, when speculating,
/// draft_dir (default model_dir/draft), relative to the experiment file.
pub(crate) fn checkpoint_dirs(
    exp: &Experiment,
    speculative: bool,
) -> Result<(PathBuf, Option<PathBuf>)> {
    let b = &exp.file.backend;
    let model_dir: PathBuf = match &b.model_dir {
        Some(d) => exp.base_dir.join(d),
        None => {
            return Err(EngineError::Invalid(
                "[backend] kind = \"engine\" needs `model_dir` (a checkpoint directory)".into(),
            ))
        }
    };
    let draft_dir = speculative.then(|| match &b.draft_dir {
        Some(d) => exp.base_dir.join(d),
        None => model_dir.join("draft"),
    });
    Ok((model_dir, draft_dir))
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

impl Backend for EngineBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn describe(&self) -> String {
        let what = self
            .serving
            .describe(", v2 (same tokens; overlap not modelled on CPU)");
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
        Ok(Box::new(EngineSession::new(
            self.model.models(),
            self.serving,
            "engine error",
            concurrency,
        )))
    }
}
