//! Loading a target (and its EAGLE-3 draft, and tokenizer) from checkpoint directories.

use std::path::{Path, PathBuf};

use kbench_core::arch::{DraftArch, ModelArch};

use crate::cpu::Models;
use crate::device::Device;
use crate::draft::Draft;
use crate::error::{EngineError, Result};
use crate::st::WeightStore;
use crate::target::Target;

/// A loaded model: target, optional draft, optional tokenizer.
pub struct Model {
    pub dir: PathBuf,
    pub target: Target,
    pub draft: Option<Draft>,
    pub tokenizer: Option<tokenizers::Tokenizer>,
    pub device: Device,
}

impl Model {
    /// Loads `dir` (config.json, safetensors, tokenizer.json if present) and, when given,
    /// the draft in `draft_dir`.
    pub fn load(dir: &Path, draft_dir: Option<&Path>, device: Device) -> Result<Model> {
        device.ensure_available()?;
        let arch = ModelArch::from_config_file(&dir.join("config.json"))?;
        let ws = WeightStore::open(dir)?;
        let mut target = Target::load(&arch, &ws)?;
        let draft = match draft_dir {
            Some(dd) => {
                let darch = DraftArch::from_config_file(&dd.join("config.json"), &arch)?;
                let dws = WeightStore::open(dd)?;
                let d = Draft::load(&darch, &dws, &target)?;
                target.capture_layers = darch.capture_layers.iter().map(|&l| l as usize).collect();
                Some(d)
            }
            None => None,
        };
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = if tok_path.exists() {
            Some(load_tokenizer(&tok_path)?)
        } else {
            None
        };
        Ok(Model {
            dir: dir.to_path_buf(),
            target,
            draft,
            tokenizer,
            device,
        })
    }

    pub fn models(&self) -> Models<'_> {
        Models {
            target: &self.target,
            draft: self.draft.as_ref(),
        }
    }

    pub fn tokenizer(&self) -> Result<&tokenizers::Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            EngineError::Tokenizer(format!("no tokenizer.json in {}", self.dir.display()))
        })
    }
}

pub fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer> {
    if !path.exists() {
        return Err(EngineError::Tokenizer(format!(
            "{} does not exist",
            path.display()
        )));
    }
    tokenizers::Tokenizer::from_file(path)
        .map_err(|e| EngineError::Tokenizer(format!("{}: {e}", path.display())))
}
