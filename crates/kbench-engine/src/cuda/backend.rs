//! The `engine` backend on the GPU: `crate::session`'s scheduler (the CPU backend's) over
//! [`CudaModel`], each running request holding a KV cache slot from admission to completion.

use std::path::PathBuf;

use kbench_core::backend::{Backend, BackendError, Request, Session};
use kbench_core::experiment::Experiment;

use super::model::CudaModel;
use super::CudaOptions;
use crate::backend::random_prompt;
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::session::{EngineSession, Serving, NAME};
use crate::settings::EngineSettings;

pub struct CudaEngineBackend {
    model: CudaModel,
    model_dir: PathBuf,
    serving: Serving,
}

impl CudaEngineBackend {
    /// Loads the experiment's `[backend]` model (model_dir, draft_dir defaulting to
    /// model_dir/draft) onto `tp_size` GPUs starting at the ordinal of `device = "cuda:N"`.
    pub fn new(exp: &Experiment) -> Result<CudaEngineBackend> {
        let mut serving = Serving::from_experiment(exp);
        let settings = EngineSettings::of(exp)?;
        let (model_dir, draft_dir) = settings.checkpoint_dirs(exp, serving.spec.is_some())?;
        let first = match settings.device()? {
            Device::Cuda(n) => n as usize,
            Device::Cpu => {
                return Err(EngineError::Invalid(
                    "CudaEngineBackend needs [backend.engine] device = \"cuda\" or \"cuda:N\""
                        .into(),
                ))
            }
        };
        let opts = CudaOptions::from_experiment(exp, first)?;
        let model = CudaModel::load(&model_dir, draft_dir.as_deref(), &opts)?;
        serving.max_running = serving.max_running.clamp(1, opts.max_batch);
        Ok(CudaEngineBackend {
            model,
            model_dir,
            serving,
        })
    }

    pub fn model(&self) -> &CudaModel {
        &self.model
    }

    /// The prompt of a request: the same ids as the CPU backend's `prompt_for`.
    pub fn prompt_for(&self, seed: u64, request: &Request) -> Vec<u32> {
        random_prompt(
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
        let what = self
            .serving
            .describe(", v2 (same tokens; overlap not implemented)");
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
        Ok(Box::new(EngineSession::new(
            &mut self.model,
            self.serving,
            "engine error (cuda)",
            concurrency,
        )))
    }
}
