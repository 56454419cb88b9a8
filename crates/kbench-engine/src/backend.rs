//! The `engine` backend: real tokens from the engine, wall-clock times, continuous batching
//! (the scheduler is `crate::session`'s, shared with the GPU backend).

use kbench_core::backend::{Backend, BackendError, Request, Session};
use kbench_core::experiment::Experiment;

use crate::error::Result;
use crate::model::Model;
use crate::session::{EngineSession, Serving, NAME};
use crate::settings::EngineSettings;
use crate::speculative::SpeculativeSettings;

pub struct EngineBackend {
    model: Model,
    serving: Serving,
}

impl EngineBackend {
    /// Loads the model `[backend.engine]` names (model_dir, default the directory of
    /// `[model] config`; draft_dir, default model_dir/draft; device), relative to the
    /// experiment file.
    pub fn new(exp: &Experiment) -> Result<EngineBackend> {
        let serving = Serving::from_experiment(exp);
        let settings = EngineSettings::of(exp)?;
        let (model_dir, draft_dir) = settings.checkpoint_dirs(exp, serving.spec.is_some())?;
        let model = Model::load(&model_dir, draft_dir.as_deref(), settings.device()?)?;
        Ok(EngineBackend { model, serving })
    }

    /// For callers that already hold a model (tests, benches).
    pub fn from_model(
        model: Model,
        spec: Option<SpeculativeSettings>,
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

    /// The prompt of a request: its shared prefix, then token ids from its own stream.
    pub fn prompt_for(&self, seed: u64, request: &Request) -> Vec<u32> {
        kbench_core::prompt::request_prompt(
            seed,
            request.id,
            request.input_len as usize,
            request.shared_prefix_len as usize,
            self.model.target.vocab,
        )
    }
}

/// The prompts every backend sends (kept here for the engine's callers).
pub use kbench_core::prompt::{random_prompt, request_prompt};

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
