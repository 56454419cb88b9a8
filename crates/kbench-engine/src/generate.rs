//! `kbench generate`: one prompt through the engine, plain or speculative.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::speculative::{self, Sequence, SpeculativeSettings};

#[derive(Debug, Clone, Serialize)]
pub struct GenerateOptions {
    pub prompt: String,
    pub max_tokens: usize,
    /// 0 = greedy.
    pub temperature: f32,
    pub seed: u64,
    /// Speculative settings (needs a draft); None = plain decoding.
    pub spec: Option<SpeculativeSettings>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GenerateResult {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    /// Mean tokens committed per verify round (bonus included); None without speculation.
    pub accept_length: Option<f64>,
    /// Tokens committed by each round (the first token, from prefill, belongs to none).
    pub round_commits: Vec<u32>,
    pub elapsed_ms: f64,
    pub tokens_per_s: f64,
}

/// Loads `model_dir` (and `draft_dir` when speculating) and generates.
pub fn generate(
    model_dir: &Path,
    draft_dir: Option<&Path>,
    opts: &GenerateOptions,
) -> Result<GenerateResult> {
    let draft_dir = match (&opts.spec, draft_dir) {
        (Some(_), None) => {
            let d = model_dir.join("draft");
            if !d.join("config.json").exists() {
                return Err(EngineError::Invalid(format!(
                    "speculative decoding needs a draft: none given and {} has no config.json",
                    d.display()
                )));
            }
            Some(d)
        }
        (_, d) => d.map(Path::to_path_buf),
    };
    let model = Model::load(model_dir, draft_dir.as_deref(), Device::Cpu)?;
    generate_with(&model, opts)
}

pub fn generate_with(model: &Model, opts: &GenerateOptions) -> Result<GenerateResult> {
    let tok = model.tokenizer()?;
    let enc = tok
        .encode(opts.prompt.as_str(), false)
        .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
    let ids: Vec<u32> = enc.get_ids().to_vec();
    if ids.is_empty() {
        return Err(EngineError::Invalid(
            "the prompt encodes to no tokens".into(),
        ));
    }
    let start = Instant::now();
    let seqs = run_batch(
        model,
        vec![(0, ids.clone())],
        opts.max_tokens,
        opts.temperature,
        opts.seed,
        opts.spec.as_ref(),
    )?;
    let elapsed = start.elapsed().as_secs_f64();
    let s = &seqs[0];
    let out = s.output().to_vec();
    let text = tok
        .decode(&out, false)
        .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
    let rounds = s.round_commits.len();
    Ok(GenerateResult {
        prompt_tokens: ids,
        text,
        accept_length: (opts.spec.is_some() && rounds > 0)
            .then(|| s.round_commits.iter().map(|&c| c as f64).sum::<f64>() / rounds as f64),
        round_commits: if opts.spec.is_some() {
            s.round_commits.clone()
        } else {
            Vec::new()
        },
        tokens_per_s: out.len() as f64 / elapsed.max(1e-9),
        tokens: out,
        elapsed_ms: elapsed * 1e3,
    })
}

/// Runs a fixed batch of prompts to completion on the CPU (`speculative::run_batch`). Returns the
/// finished sequences in input order.
pub fn run_batch(
    model: &Model,
    prompts: Vec<(u64, Vec<u32>)>,
    max_new: usize,
    temperature: f32,
    seed: u64,
    spec: Option<&SpeculativeSettings>,
) -> Result<Vec<Sequence>> {
    speculative::run_batch(
        &mut model.models(),
        prompts,
        max_new,
        temperature,
        seed,
        spec,
    )
}
