//! `kbench model init`: seeded random models in the exact on-disk format of the real
//! checkpoints (kimi_k25 config wrapper, sharded safetensors with an index, compressed-tensors
//! INT4 routed experts, BF16 elsewhere) plus an EAGLE-3 draft whose agreement with the target
//! is set by `draft_quality`, and a small WordLevel tokenizer.json.
//!
//! Every matrix row is drawn from its own ChaCha stream (`rng_for(seed, tensor name, row)`),
//! so tensors can be generated row by row and streamed to disk, and the draft can derive its
//! rows from the target's without holding the target in memory.
//!
//! How the draft tracks the target: the target's residual stream is dominated by the token
//! embedding (its layers add a context-dependent perturbation of relative size
//! `layer_gain`), so its next token is mostly a function g(current token). The draft's
//! attention is built to attend to the current position and copy its (normalised) token
//! embedding into the residual stream, and its lm_head is
//! the target's rows `target_lm_head[d2t]`, each kept with probability `quality` and
//! replaced by noise otherwise (its value path also subtracts
//! the normalised incoming hidden state, which cancels the residual, so that each draft
//! step predicts from its own input token): at quality 1 it predicts
//! g(next token) as the target will, at quality 0 it is unrelated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};

use kbench_core::arch::{DraftArch, ModelArch};

use crate::device::Device;
use crate::draft::Draft;
use crate::error::{write_err, EngineError, Result};
use crate::model::Model;
use crate::names::{self, TargetNames};
use crate::shapes::{DraftShapes, Matrix, TargetShapes};
use crate::st::{write_index, Dtype, StreamWriter, TensorPlan, WeightStore};
use crate::target::Target;

mod config;
mod dims;
mod fill;
mod tensors;
mod tokenizer;

use config::*;
pub use dims::Dims;
pub use tokenizer::{tokenizer_json, word};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// Milliseconds per token on a CPU: hidden 64, 4 layers, 8 experts, vocab 256.
    Tiny,
    /// Full Kimi-K2.5 width (hidden 7168, 384 experts, vocab 163840) with a few layers.
    KimiSlice,
}

impl Preset {
    pub fn parse(s: &str) -> Result<Preset> {
        match s {
            "tiny" => Ok(Preset::Tiny),
            "kimi-slice" | "kimi_slice" => Ok(Preset::KimiSlice),
            other => Err(EngineError::Invalid(format!(
                "unknown model preset `{other}` (tiny, kimi-slice)"
            ))),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct InitOptions {
    pub preset: Preset,
    pub dims: Dims,
    pub seed: u64,
    pub draft_quality: f32,
}

impl InitOptions {
    pub fn new(preset: Preset, layers: Option<u32>, seed: u64, draft_quality: f32) -> InitOptions {
        let mut dims = match preset {
            Preset::Tiny => Dims::tiny(),
            Preset::KimiSlice => Dims::kimi_slice(3),
        };
        if let Some(l) = layers {
            dims.layers = l as usize;
        }
        InitOptions {
            preset,
            dims,
            seed,
            draft_quality,
        }
    }
}

/// Writes a model to `out_dir` (config.json, tokenizer.json, sharded safetensors + index)
/// and its draft to `out_dir/draft`. Streams tensors: memory stays bounded by one matrix.
pub fn init_model(
    preset: Preset,
    layers: Option<u32>,
    seed: u64,
    draft_quality: f32,
    out_dir: &Path,
) -> Result<()> {
    init_model_with(
        &InitOptions::new(preset, layers, seed, draft_quality),
        out_dir,
    )
}

pub fn init_model_with(opts: &InitOptions, out_dir: &Path) -> Result<()> {
    let g = Gen::new(opts)?;
    let plan = g.plan();
    std::fs::create_dir_all(out_dir.join("draft")).map_err(write_err(out_dir))?;
    write_json(&out_dir.join("config.json"), &plan.config)?;
    write_json(&out_dir.join("tokenizer.json"), &tokenizer_json(g.d.vocab))?;
    write_json(
        &out_dir.join("generation_config.json"),
        &json!({"max_length": 262144, "eos_token_id": 2}),
    )?;
    write_json(
        &out_dir.join("kbench_init.json"),
        &serde_json::to_value(opts).map_err(|e| EngineError::Invalid(e.to_string()))?,
    )?;
    let shard_jobs: Vec<Vec<Job>> = std::iter::once(g.head_jobs())
        .chain((0..g.d.layers).map(|l| g.layer_jobs(l)))
        .collect();
    for ((file, _), jobs) in plan.shards.iter().zip(&shard_jobs) {
        write_shard(&g, &out_dir.join(file), jobs)?;
    }
    write_index(out_dir, &plan.weight_map, plan.total_size)?;
    let ddir = out_dir.join("draft");
    write_json(&ddir.join("config.json"), &plan.draft_config)?;
    write_shard(&g, &ddir.join("model.safetensors"), &g.draft_jobs())?;
    Ok(())
}

/// What `init_model` would write, without writing it: configs, shards and their tensors,
/// the index's weight map and total size.
#[derive(Debug, Clone)]
pub struct CheckpointPlan {
    pub config: Value,
    pub draft_config: Value,
    pub shards: Vec<(String, Vec<TensorPlan>)>,
    pub weight_map: BTreeMap<String, String>,
    pub total_size: u64,
    pub draft_tensors: Vec<TensorPlan>,
}

pub fn plan_checkpoint(opts: &InitOptions) -> Result<CheckpointPlan> {
    Ok(Gen::new(opts)?.plan())
}

/// Creates the tiny model (seed 0, draft quality 0.9) in `dir` unless a config.json is
/// already there. Returns whether it wrote one.
pub fn ensure_tiny_model(dir: &Path) -> Result<bool> {
    if dir.join("config.json").exists() && dir.join("draft").join("config.json").exists() {
        return Ok(false);
    }
    init_model(Preset::Tiny, None, 0, 0.9, dir)?;
    Ok(true)
}

/// Builds a model in memory (same generator, no disk): for tests and benches.
pub fn build_model(opts: &InitOptions) -> Result<Model> {
    let g = Gen::new(opts)?;
    let mut tensors = Vec::new();
    let mut jobs = g.head_jobs();
    for l in 0..g.d.layers {
        jobs.extend(g.layer_jobs(l));
    }
    collect(&g, &jobs, &mut tensors)?;
    let ws = WeightStore::from_tensors(tensors);
    let mut target = Target::load(&g.arch, &ws)?;
    let darch = &g.draft_arch;
    let mut dt = Vec::new();
    collect(&g, &g.draft_jobs(), &mut dt)?;
    let dws = WeightStore::from_tensors(dt);
    let draft = Draft::load(darch, &dws, &target)?;
    target.capture_layers = darch.capture_layers.iter().map(|&l| l as usize).collect();
    Ok(Model {
        dir: PathBuf::from("<memory>"),
        target,
        draft: Some(draft),
        tokenizer: None,
        device: Device::Cpu,
    })
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| EngineError::Invalid(e.to_string()))?;
    std::fs::write(path, text).map_err(write_err(path))
}

fn collect(
    g: &Gen,
    jobs: &[Job],
    out: &mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
) -> Result<()> {
    let mut cache = QuantCache::default();
    for j in jobs {
        let mut bytes = Vec::with_capacity(j.plan.nbytes());
        g.produce(j, &mut cache, &mut |b| {
            bytes.extend_from_slice(b);
            Ok(())
        })?;
        out.push((
            j.plan.name.clone(),
            j.plan.dtype,
            j.plan.shape.clone(),
            bytes,
        ));
    }
    Ok(())
}

fn write_shard(g: &Gen, path: &Path, jobs: &[Job]) -> Result<()> {
    let mut w = StreamWriter::create(path, jobs.iter().map(|j| j.plan.clone()).collect())?;
    let mut cache = QuantCache::default();
    for j in jobs {
        g.produce(j, &mut cache, &mut |b| w.write(b))?;
    }
    w.finish()
}

/// How a tensor's values are made.
#[derive(Debug, Clone)]
enum Fill {
    /// Uniform with the given std, one ChaCha stream per row.
    Rand {
        std: f32,
    },
    Const(f32),
    /// INT4 compressed-tensors part of the `matrix` of module `base`, drawn with `std`.
    Int4Packed {
        base: String,
        matrix: Matrix,
        std: f32,
    },
    Int4Scale {
        base: String,
        matrix: Matrix,
        std: f32,
    },
    Int4Shape {
        matrix: Matrix,
    },
    /// Draft tensors built from the target's.
    DraftLmHead,
    DraftAttn(AttnPart),
    D2t,
    T2d,
}

#[derive(Debug, Clone, Copy)]
enum AttnPart {
    Q,
    K,
    V,
    O,
}

#[derive(Debug, Clone)]
struct Job {
    plan: TensorPlan,
    fill: Fill,
}

#[derive(Default)]
struct QuantCache {
    key: String,
    packed: Vec<u32>,
    scales: Vec<u16>,
}

struct Gen {
    d: Dims,
    /// The target as its written config.json describes it, and the shapes that follow.
    arch: ModelArch,
    shapes: TargetShapes,
    draft_arch: DraftArch,
    draft_shapes: DraftShapes,
    seed: u64,
    quality: f32,
    prefix: String,
    /// Target ids of the draft vocabulary, ascending.
    d2t: Vec<u32>,
}

fn plan(name: String, dtype: Dtype, shape: Vec<usize>) -> TensorPlan {
    TensorPlan { name, dtype, shape }
}

impl Gen {
    fn new(opts: &InitOptions) -> Result<Gen> {
        opts.dims.validate()?;
        if !(0.0..=1.0).contains(&opts.draft_quality) {
            return Err(EngineError::Invalid(format!(
                "draft_quality {} is not in [0, 1]",
                opts.draft_quality
            )));
        }
        let config = config_json(&opts.dims, opts.seed, opts.draft_quality);
        let arch = ModelArch::from_config_value(&config, Path::new("<generated>/config.json"))?;
        let draft_arch = draft_arch(&opts.dims, &arch);
        let mut g = Gen {
            d: opts.dims.clone(),
            shapes: TargetShapes::new(&arch)?,
            draft_shapes: DraftShapes::new(&draft_arch)?,
            prefix: arch.tensor_prefix.clone(),
            arch,
            draft_arch,
            seed: opts.seed,
            quality: opts.draft_quality,
            d2t: Vec::new(),
        };
        g.d2t = g.choose_draft_vocab();
        Ok(g)
    }

    fn plan(&self) -> CheckpointPlan {
        let mut shard_jobs = vec![self.head_jobs()];
        for l in 0..self.d.layers {
            shard_jobs.push(self.layer_jobs(l));
        }
        let n = shard_jobs.len();
        let mut weight_map = BTreeMap::new();
        let mut total = 0u64;
        let mut shards = Vec::with_capacity(n);
        for (i, jobs) in shard_jobs.iter().enumerate() {
            let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
            for j in jobs {
                weight_map.insert(j.plan.name.clone(), file.clone());
                total += j.plan.nbytes() as u64;
            }
            shards.push((file, jobs.iter().map(|j| j.plan.clone()).collect()));
        }
        CheckpointPlan {
            config: self.config_json(),
            draft_config: self.draft_config_json(),
            shards,
            weight_map,
            total_size: total,
            draft_tensors: self.draft_jobs().into_iter().map(|j| j.plan).collect(),
        }
    }

    fn names(&self) -> TargetNames<'_> {
        TargetNames::new(&self.prefix)
    }
    fn embed_name(&self) -> String {
        self.names().embed()
    }
    fn lm_name(&self) -> String {
        names::weight(&self.names().lm_head())
    }
}
