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
    let model = load(model_dir, draft_dir, opts.spec.is_some())?;
    generate_with(&model, opts)
}

/// Loads `model_dir` on the CPU, with `draft_dir` (by default `model_dir/draft` when
/// `speculative`).
pub fn load(model_dir: &Path, draft_dir: Option<&Path>, speculative: bool) -> Result<Model> {
    let draft_dir = match (speculative, draft_dir) {
        (true, None) => {
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
    Model::load(model_dir, draft_dir.as_deref(), Device::Cpu)
}

/// A prompt through the model's tokenizer.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// Words the tokenizer does not know, which became its unknown token; None when all are
    /// known (or the tokenizer has no unknown token).
    pub unknown: Option<UnknownWords>,
}

/// Prompt words that became the tokenizer's unknown token: kept as they are (the prompt
/// still runs), and described so a caller can warn, since a WordLevel vocabulary such as a
/// generated model's turns any other text into a row of identical tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownWords {
    /// How many of the prompt's tokens are the unknown token.
    pub count: usize,
    pub of: usize,
    pub unk_token: String,
    pub unk_id: u32,
    /// The first few unknown words as written in the prompt.
    pub words: Vec<String>,
    /// The vocabulary's size and a few of its ordinary (not special) words, lowest ids first.
    pub vocab_size: usize,
    pub known: Vec<String>,
}

impl std::fmt::Display for UnknownWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let quoted: Vec<String> = self.words.iter().map(|w| format!("{w:?}")).collect();
        let more = if self.count > self.words.len() {
            ", ..."
        } else {
            ""
        };
        write!(
            f,
            "{} of the prompt's {} tokens are words the tokenizer does not know ({}{more}); \
             they became the unknown token {} (id {}). Its vocabulary of {} tokens takes \
             whitespace-separated words such as {}",
            self.count,
            self.of,
            quoted.join(", "),
            self.unk_token,
            self.unk_id,
            self.vocab_size,
            self.known.join(" ")
        )
    }
}

/// How many unknown words and known words [`UnknownWords`] quotes.
const QUOTED: usize = 5;
const KNOWN_SHOWN: usize = 8;

/// Encodes `prompt` with the model's tokenizer; an empty encoding is an error.
pub fn encode_prompt(model: &Model, prompt: &str) -> Result<Prompt> {
    let tok = model.tokenizer()?;
    let enc = tok
        .encode(prompt, false)
        .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
    let ids: Vec<u32> = enc.get_ids().to_vec();
    if ids.is_empty() {
        return Err(EngineError::Invalid(
            "the prompt encodes to no tokens".into(),
        ));
    }
    let unknown = unknown_words(tok, prompt, &enc);
    Ok(Prompt { ids, unknown })
}

fn unknown_words(
    tok: &tokenizers::Tokenizer,
    prompt: &str,
    enc: &tokenizers::Encoding,
) -> Option<UnknownWords> {
    use tokenizers::models::ModelWrapper;
    let unk_token = match tok.get_model() {
        ModelWrapper::WordLevel(m) => Some(m.unk_token.clone()),
        ModelWrapper::WordPiece(m) => Some(m.unk_token.clone()),
        ModelWrapper::BPE(m) => m.unk_token.clone(),
        // its unknown id is private to the crate; SentencePiece vocabularies rarely miss a word
        ModelWrapper::Unigram(_) => None,
    }?;
    let unk_id = tok.token_to_id(&unk_token)?;
    let text = |i: usize| {
        let (a, b) = enc.get_offsets()[i];
        prompt.get(a..b)
    };
    // the unknown token written out in the prompt is meant, not a word it missed
    let at: Vec<usize> = (0..enc.get_ids().len())
        .filter(|&i| enc.get_ids()[i] == unk_id && text(i) != Some(unk_token.as_str()))
        .collect();
    if at.is_empty() {
        return None;
    }
    let words = at
        .iter()
        .take(QUOTED)
        .filter_map(|&i| text(i).map(str::to_string))
        .collect();
    let special = tok.get_added_tokens_decoder();
    let mut vocab: Vec<(u32, String)> = tok
        .get_vocab(false)
        .into_iter()
        .filter(|(_, id)| !special.contains_key(id) && *id != unk_id)
        .map(|(w, id)| (id, w))
        .collect();
    vocab.sort_unstable();
    Some(UnknownWords {
        count: at.len(),
        of: enc.get_ids().len(),
        unk_token,
        unk_id,
        words,
        vocab_size: tok.get_vocab_size(true),
        known: vocab
            .into_iter()
            .take(KNOWN_SHOWN)
            .map(|(_, w)| w)
            .collect(),
    })
}

/// Refuses `prompt_tokens + max_tokens` beyond the target's `max_position_embeddings`.
pub fn check_context(model: &Model, prompt_tokens: usize, max_tokens: usize) -> Result<()> {
    let context = model.target.arch.max_position_embeddings;
    if prompt_tokens as u64 + max_tokens as u64 > context {
        return Err(EngineError::ContextLength {
            prompt_tokens,
            max_tokens,
            context,
        });
    }
    Ok(())
}

pub fn generate_with(model: &Model, opts: &GenerateOptions) -> Result<GenerateResult> {
    let prompt = encode_prompt(model, &opts.prompt)?;
    generate_prompt(model, prompt.ids, opts)
}

/// Generates from already-encoded prompt `ids` (`opts.prompt` is not read).
pub fn generate_prompt(
    model: &Model,
    ids: Vec<u32>,
    opts: &GenerateOptions,
) -> Result<GenerateResult> {
    check_context(model, ids.len(), opts.max_tokens)?;
    let tok = model.tokenizer()?;
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
