//! `[backend.engine]`: the engine backend's own settings, parsed here (kbench-core only
//! knows that the table exists).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use kbench_core::experiment::Experiment;

use crate::cuda::KernelChoice;
use crate::device::Device;
use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Target checkpoint directory, relative to the experiment file (default: the directory
    /// of `[model] config`).
    #[serde(default)]
    pub model_dir: Option<String>,
    /// EAGLE-3 draft directory (default: model_dir/draft).
    #[serde(default)]
    pub draft_dir: Option<String>,
    /// `cpu` (default), `cuda` or `cuda:N`.
    #[serde(default)]
    pub device: Option<String>,
    /// On CUDA, which kernels run the target: `auto` (default: the tuned bf16 kernels when
    /// the model's dimensions fit them), `exact` (f32, token-equal to the CPU) or `tuned`.
    #[serde(default)]
    pub kernels: Option<String>,
}

impl EngineSettings {
    /// The experiment's `[backend.engine]`, checked (device and kernels parse).
    pub fn of(exp: &Experiment) -> Result<EngineSettings> {
        let s: EngineSettings = exp
            .file
            .backend
            .parse("engine")
            .map_err(|m| EngineError::Invalid(format!("{}: {m}", exp.path.display())))?;
        s.device()?;
        s.kernels()?;
        Ok(s)
    }

    pub fn device(&self) -> Result<Device> {
        self.device
            .as_deref()
            .map(Device::parse)
            .transpose()
            .map(|d| d.unwrap_or(Device::Cpu))
    }

    pub fn kernels(&self) -> Result<KernelChoice> {
        self.kernels
            .as_deref()
            .map(KernelChoice::parse)
            .transpose()
            .map(Option::unwrap_or_default)
    }

    /// The checkpoint directories, relative to the experiment file: model_dir (default the
    /// directory of `[model] config`) and, when speculating, draft_dir (default model_dir/draft).
    pub fn checkpoint_dirs(
        &self,
        exp: &Experiment,
        speculative: bool,
    ) -> Result<(PathBuf, Option<PathBuf>)> {
        let model_dir = match (&self.model_dir, &exp.file.model.config) {
            (Some(d), _) => exp.base_dir.join(d),
            (None, Some(config)) => exp
                .base_dir
                .join(Path::new(config).parent().unwrap_or(Path::new("."))),
            (None, None) => {
                return Err(EngineError::Invalid(format!(
                    "{}: the engine backend needs a checkpoint: set [backend.engine] model_dir \
                     (or [model] config)",
                    exp.path.display()
                )))
            }
        };
        let draft_dir = speculative.then(|| match &self.draft_dir {
            Some(d) => exp.base_dir.join(d),
            None => model_dir.join("draft"),
        });
        Ok((model_dir, draft_dir))
    }
}
