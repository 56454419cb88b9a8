//! Loading a target (and its EAGLE-3 draft, and tokenizer) from checkpoint directories.

use std::path::{Path, PathBuf};

use kbench_core::arch::{ArchError, DraftArch, ModelArch};
use serde_json::Value;

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
                let darch = draft_arch(dd, &arch)?;
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

/// The EAGLE-3 head's architecture from `draft_dir/config.json`. A config without a head's
/// fields is reported as not a draft, with what it is instead (often the target's own
/// config, its folder given as the draft by mistake), keeping the missing field as the cause.
pub(crate) fn draft_arch(draft_dir: &Path, target: &ModelArch) -> Result<DraftArch> {
    let path = draft_dir.join("config.json");
    DraftArch::from_config_file(&path, target).map_err(|source| match source {
        ArchError::Field { .. } => EngineError::NotADraft {
            dir: draft_dir.to_path_buf(),
            found: describe_config(&path),
            source,
        },
        other => other.into(),
    })
}

/// What a config.json that is not a draft's holds, in a few words.
fn describe_config(path: &Path) -> String {
    let Some(v) = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        return "a config.json it could not read again".into();
    };
    let architectures = v
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>())
        .filter(|a| !a.is_empty())
        .map(|a| format!("architectures {a:?}"));
    let model_type = v
        .get("model_type")
        .and_then(Value::as_str)
        .map(|t| format!("model_type `{t}`"));
    let what = match (architectures, model_type) {
        (Some(a), Some(t)) => format!("{a}, {t}"),
        (Some(x), None) | (None, Some(x)) => x,
        (None, None) => "no architectures or model_type".into(),
    };
    match ModelArch::from_config_value(&v, path) {
        Ok(arch) => format!(
            "a target model's config ({what}, {} layers); give the draft head's own folder \
             (`kbench model init` writes it in MODEL/draft)",
            arch.num_layers
        ),
        Err(_) => format!("a config with {what}"),
    }
}
