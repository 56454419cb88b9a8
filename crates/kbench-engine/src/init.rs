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

use rand::RngExt;
use serde::Serialize;
use serde_json::{json, Value};

use kbench_core::arch::{DraftArch, ModelArch};
use kbench_core::seed::rng_for;

use crate::device::Device;
use crate::draft::Draft;
use crate::error::{write_err, EngineError, Result};
use crate::model::Model;
use crate::names::{self, draft, FfnNames, Int4, Proj, TargetNames};
use crate::shapes::{self, DraftShapes, FfnShape, Matrix, TargetShapes};
use crate::st::{write_index, Dtype, StreamWriter, TensorPlan, WeightStore};
use crate::target::Target;
use kbench_numerics::{bf16, int4};

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

/// Every size a generated model has.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dims {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_head: usize,
    pub experts: usize,
    pub experts_per_tok: usize,
    pub shared_experts: usize,
    pub moe_inter: usize,
    pub inter: usize,
    pub vocab: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub first_k_dense: usize,
    pub draft_heads: usize,
    pub draft_kv_heads: usize,
    pub draft_head_dim: usize,
    pub draft_inter: usize,
    pub draft_vocab: usize,
    /// Relative size of what the target's layers add to the embedding.
    pub layer_gain: f32,
    /// Std of the target's logits (peakedness).
    pub logit_scale: f32,
}

impl Dims {
    pub fn tiny() -> Dims {
        Dims {
            hidden: 64,
            layers: 4,
            heads: 4,
            q_lora_rank: Some(32),
            kv_lora_rank: 32,
            nope: 16,
            rope: 8,
            v_head: 16,
            experts: 8,
            experts_per_tok: 2,
            shared_experts: 1,
            moe_inter: 32,
            inter: 96,
            vocab: 256,
            n_group: 2,
            topk_group: 1,
            first_k_dense: 1,
            draft_heads: 4,
            draft_kv_heads: 4,
            draft_head_dim: 16,
            draft_inter: 96,
            draft_vocab: 192,
            layer_gain: 0.04,
            logit_scale: 4.0,
        }
    }

    /// The smallest model kbench-cuda's tuned kernels take (hidden and moe_intermediate
    /// multiples of 64, grouped noaux_tc routing): the tuned CUDA path's test model.
    pub fn tuned_small() -> Dims {
        let mut d = Dims::tiny();
        d.hidden = 128;
        d.moe_inter = 64;
        d.inter = 128;
        d.q_lora_rank = Some(64);
        d.heads = 2;
        d.nope = 32;
        d.v_head = 32;
        d.experts = 16;
        d.experts_per_tok = 4;
        d.n_group = 4;
        d.topk_group = 2;
        d.layers = 4;
        d
    }

    pub fn kimi_slice(layers: usize) -> Dims {
        Dims {
            hidden: 7168,
            layers,
            heads: 64,
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            nope: 128,
            rope: 64,
            v_head: 128,
            experts: 384,
            experts_per_tok: 8,
            shared_experts: 1,
            moe_inter: 2048,
            inter: 18432,
            vocab: 163840,
            n_group: 1,
            topk_group: 1,
            first_k_dense: 1,
            draft_heads: 64,
            draft_kv_heads: 64,
            draft_head_dim: 128,
            draft_inter: 18432,
            draft_vocab: 32000,
            layer_gain: 0.04,
            logit_scale: 4.0,
        }
    }

    /// Target layers whose outputs the draft captures (SGLang's rule, clamped).
    pub fn capture_layers(&self) -> Vec<usize> {
        let n = self.layers;
        vec![1.min(n - 1), (n / 2).saturating_sub(1), n.saturating_sub(4)]
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::Invalid(m));
        if self.layers == 0 || self.hidden % 32 != 0 || self.moe_inter % 32 != 0 {
            return bad(format!(
                "hidden ({}) and moe_inter ({}) must be multiples of 32, layers >= 1",
                self.hidden, self.moe_inter
            ));
        }
        if self.experts % self.n_group != 0
            || self.topk_group > self.n_group
            || self.experts_per_tok > self.experts
        {
            return bad("router groups do not fit the experts".into());
        }
        if self.draft_vocab > self.vocab
            || self.draft_kv_heads == 0
            || self.draft_heads % self.draft_kv_heads != 0
        {
            return bad("draft vocabulary or heads do not fit".into());
        }
        if self.rope % 2 != 0 || self.draft_head_dim % 2 != 0 {
            return bad("rope dims must be even".into());
        }
        Ok(())
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

/// The target's config.json: Kimi-K2.5's wrapper around a DeepSeek-V3 text config, with
/// compressed-tensors INT4 routed experts, in `dims`.
fn config_json(d: &Dims, seed: u64, quality: f32) -> Value {
    let text = json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "vocab_size": d.vocab,
        "hidden_size": d.hidden,
        "intermediate_size": d.inter,
        "moe_intermediate_size": d.moe_inter,
        "num_hidden_layers": d.layers,
        "num_nextn_predict_layers": 0,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.heads,
        "n_shared_experts": d.shared_experts,
        "n_routed_experts": d.experts,
        "routed_scaling_factor": 2.827,
        "kv_lora_rank": d.kv_lora_rank,
        "q_lora_rank": d.q_lora_rank,
        "qk_rope_head_dim": d.rope,
        "v_head_dim": d.v_head,
        "qk_nope_head_dim": d.nope,
        "topk_method": "noaux_tc",
        "n_group": d.n_group,
        "topk_group": d.topk_group,
        "num_experts_per_tok": d.experts_per_tok,
        "moe_layer_freq": 1,
        "first_k_dense_replace": d.first_k_dense,
        "norm_topk_prob": true,
        "scoring_func": "sigmoid",
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0
        },
        "attention_bias": false,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "quantization_config": {
            "config_groups": {"group_0": {
                "input_activations": null, "output_activations": null, "targets": ["Linear"],
                "weights": {"actorder": null, "block_structure": null, "dynamic": false,
                    "group_size": 32, "num_bits": 4, "observer": "minmax", "observer_kwargs": {},
                    "strategy": "group", "symmetric": true, "type": "int"}
            }},
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            "kv_cache_scheme": null,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed"
        }
    });
    json!({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "tie_word_embeddings": false,
        "kbench_generated": {"seed": seed, "draft_quality": quality},
    })
}

/// The draft as the loader reads its config (what [`Gen::draft_config_json`] writes).
fn draft_arch(d: &Dims, target: &ModelArch) -> DraftArch {
    DraftArch {
        name: "draft".into(),
        hidden_size: d.hidden as u32,
        num_heads: d.draft_heads as u32,
        num_kv_heads: d.draft_kv_heads as u32,
        head_dim: d.draft_head_dim as u32,
        intermediate_size: d.draft_inter as u32,
        draft_vocab_size: d.draft_vocab as u32,
        target_vocab_size: d.vocab as u32,
        capture_layers: d.capture_layers().iter().map(|&l| l as u32).collect(),
        rms_norm_eps: 1e-5,
        rope_theta: target.rope_theta,
    }
}

fn rand_row(seed: u64, name: &str, row: usize, n: usize, std: f32) -> Vec<f32> {
    let mut rng = rng_for(seed, name, row as u64);
    let a = std * 3f32.sqrt();
    (0..n).map(|_| rng.random_range(-a..a)).collect()
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

    /// The draft vocabulary: as real d2t maps are built from token frequency, take the
    /// tokens the target most often predicts after a token (its "bigram" image) first.
    /// For large vocabularies (kimi-slice) the first ids.
    fn choose_draft_vocab(&self) -> Vec<u32> {
        let (v, dv, h) = (self.d.vocab, self.d.draft_vocab, self.d.hidden);
        if v * h > (1 << 22) {
            return (0..dv as u32).collect();
        }
        let lm: Vec<Vec<f32>> = (0..v)
            .map(|r| rand_row(self.seed, &self.lm_name(), r, h, self.lm_std()))
            .collect();
        let mut count = vec![0usize; v];
        for x in 0..v {
            let mut e = rand_row(self.seed, &self.embed_name(), x, h, 1.0);
            crate::linalg::rms_norm(&mut e, &vec![1.0; h], 1e-6);
            let logits: Vec<f32> = lm
                .iter()
                .map(|r| r.iter().zip(&e).map(|(a, b)| a * b).sum())
                .collect();
            count[crate::linalg::argmax(&logits)] += 1;
        }
        let mut ids: Vec<usize> = (0..v).collect();
        ids.sort_by(|a, b| count[*b].cmp(&count[*a]).then(a.cmp(b)));
        let mut chosen: Vec<u32> = ids[..dv].iter().map(|&i| i as u32).collect();
        chosen.sort_unstable();
        chosen
    }

    fn lm_std(&self) -> f32 {
        self.d.logit_scale / (self.d.hidden as f32).sqrt()
    }

    fn config_json(&self) -> Value {
        config_json(&self.d, self.seed, self.quality)
    }

    fn draft_config_json(&self) -> Value {
        let d = &self.d;
        json!({
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": d.hidden,
            "num_attention_heads": d.draft_heads,
            "num_key_value_heads": d.draft_kv_heads,
            "head_dim": d.draft_head_dim,
            "intermediate_size": d.draft_inter,
            "num_hidden_layers": 1,
            "vocab_size": d.vocab,
            "draft_vocab_size": d.draft_vocab,
            "rms_norm_eps": 1e-5,
            "rope_theta": 50000.0,
            "max_position_embeddings": 262144,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": d.capture_layers(),
                "use_aux_hidden_state": true
            },
            "kbench_generated": {"seed": self.seed, "draft_quality": self.quality},
        })
    }

    fn head_jobs(&self) -> Vec<Job> {
        let s = &self.shapes;
        vec![
            Job {
                plan: plan(self.embed_name(), Dtype::BF16, s.embed().to_vec()),
                fill: Fill::Rand { std: 1.0 },
            },
            Job {
                plan: plan(
                    names::weight(&self.names().final_norm()),
                    Dtype::BF16,
                    vec![s.hidden],
                ),
                fill: Fill::Const(1.0),
            },
            Job {
                plan: plan(self.lm_name(), Dtype::BF16, s.lm_head().to_vec()),
                fill: Fill::Rand { std: self.lm_std() },
            },
        ]
    }

    fn layer_jobs(&self, l: usize) -> Vec<Job> {
        let s = &self.shapes;
        let h = s.hidden;
        let gain = self.d.layer_gain;
        let ln = self.names().layer(l);
        let w = |module: String| names::weight(&module);
        let std_in = |n: usize| 1.0 / (n as f32).sqrt();
        // a linear drawn with std 1/sqrt(in), its output scaled by `out_gain`
        let linear = |module: String, m: Matrix, out_gain: f32| Job {
            plan: plan(w(module), Dtype::BF16, m.to_vec()),
            fill: Fill::Rand {
                std: out_gain * std_in(m[1]),
            },
        };
        let norm = |module: String, n: usize| Job {
            plan: plan(w(module), Dtype::BF16, vec![n]),
            fill: Fill::Const(1.0),
        };
        let ffn = |names: FfnNames, shape: FfnShape, jobs: &mut Vec<Job>| {
            jobs.push(linear(names.gate(), shape.proj(Proj::Gate), 1.0));
            jobs.push(linear(names.up(), shape.proj(Proj::Up), 1.0));
            jobs.push(linear(names.down(), shape.proj(Proj::Down), gain));
        };
        let mut jobs = vec![norm(ln.input_norm(), h)];
        match s.q_low_rank() {
            Some((a, b)) => {
                jobs.push(linear(ln.q_a(), a, 1.0));
                jobs.push(norm(ln.q_a_norm(), a[0]));
                jobs.push(linear(ln.q_b(), b, 1.0));
            }
            None => jobs.push(linear(ln.q(), s.q_full(), 1.0)),
        }
        jobs.push(linear(ln.kv_a(), s.kv_a(), 1.0));
        jobs.push(norm(ln.kv_a_norm(), s.kv_lora_rank));
        jobs.push(linear(ln.kv_b(), s.kv_b(), 1.0));
        jobs.push(linear(ln.o(), s.o(), gain));
        jobs.push(norm(ln.post_attention_norm(), h));
        if !self.arch.is_moe_layer(l as u32) {
            ffn(ln.dense_mlp(), s.dense, &mut jobs);
            return jobs;
        }
        let moe = s.moe.expect("generated configs have MoE dims");
        jobs.push(linear(ln.router(), moe.router(), 1.0));
        jobs.push(Job {
            plan: plan(ln.router_bias(), Dtype::F32, vec![moe.experts]),
            fill: Fill::Rand { std: 0.05 },
        });
        let scaling = self
            .arch
            .moe
            .as_ref()
            .map_or(1.0, |m| m.routed_scaling_factor as f32);
        for e in 0..moe.experts {
            let ep = ln.expert(e);
            for proj in [Proj::Gate, Proj::Up, Proj::Down] {
                let matrix = moe.expert.proj(proj);
                // routed outputs are scaled up by routed_scaling_factor: draw down smaller
                let std = match proj {
                    Proj::Down => gain * std_in(matrix[1]) / scaling,
                    _ => std_in(matrix[1]),
                };
                let base = ep.proj(proj);
                jobs.push(Job {
                    plan: plan(
                        Int4::packed(&base),
                        Dtype::I32,
                        shapes::int4_packed(matrix).to_vec(),
                    ),
                    fill: Fill::Int4Packed {
                        base: base.clone(),
                        matrix,
                        std,
                    },
                });
                jobs.push(Job {
                    plan: plan(
                        Int4::scale(&base),
                        Dtype::BF16,
                        shapes::int4_scales(matrix, s.group).to_vec(),
                    ),
                    fill: Fill::Int4Scale {
                        base: base.clone(),
                        matrix,
                        std,
                    },
                });
                jobs.push(Job {
                    plan: plan(Int4::shape(&base), Dtype::I32, vec![2]),
                    fill: Fill::Int4Shape { matrix },
                });
            }
        }
        if let Some(shared) = moe.shared {
            ffn(ln.shared_experts(), shared, &mut jobs);
        }
        jobs
    }

    fn draft_jobs(&self) -> Vec<Job> {
        let s = &self.draft_shapes;
        let h = s.hidden;
        let std_in = |n: usize| 1.0 / (n as f32).sqrt();
        let bf = |name: &str, shape: Vec<usize>, fill: Fill| Job {
            plan: plan(name.into(), Dtype::BF16, shape),
            fill,
        };
        let w = |module: &str| names::weight(module);
        let [gate, up, down] = [Proj::Gate, Proj::Up, Proj::Down].map(|p| s.ffn.proj(p));
        vec![
            bf(
                &w(draft::FC),
                s.fc().to_vec(),
                Fill::Rand {
                    std: std_in(s.fc()[1]),
                },
            ),
            bf(&w(draft::INPUT_NORM), vec![h], Fill::Const(1.0)),
            bf(&w(draft::HIDDEN_NORM), vec![h], Fill::Const(1.0)),
            bf(&w(draft::Q), s.q().to_vec(), Fill::DraftAttn(AttnPart::Q)),
            bf(&w(draft::K), s.kv().to_vec(), Fill::DraftAttn(AttnPart::K)),
            bf(&w(draft::V), s.kv().to_vec(), Fill::DraftAttn(AttnPart::V)),
            bf(&w(draft::O), s.o().to_vec(), Fill::DraftAttn(AttnPart::O)),
            bf(&w(draft::POST_ATTENTION_NORM), vec![h], Fill::Const(1.0)),
            bf(
                &w(draft::GATE),
                gate.to_vec(),
                Fill::Rand { std: std_in(h) },
            ),
            bf(&w(draft::UP), up.to_vec(), Fill::Rand { std: std_in(h) }),
            bf(
                &w(draft::DOWN),
                down.to_vec(),
                Fill::Rand {
                    std: 0.05 * std_in(down[1]),
                },
            ),
            bf(&w(draft::FINAL_NORM), vec![h], Fill::Const(1.0)),
            Job {
                plan: plan(w(draft::LM_HEAD), Dtype::BF16, s.lm_head().to_vec()),
                fill: if self.quality > 0.0 {
                    Fill::DraftLmHead
                } else {
                    Fill::Rand { std: self.lm_std() }
                },
            },
            Job {
                plan: plan(draft::D2T.into(), Dtype::I64, vec![s.draft_vocab]),
                fill: Fill::D2t,
            },
            Job {
                plan: plan(draft::T2D.into(), Dtype::BOOL, vec![s.target_vocab]),
                fill: Fill::T2d,
            },
        ]
    }

    /// One row of a float tensor.
    fn float_row(&self, job: &Job, row: usize) -> Vec<f32> {
        let name = &job.plan.name;
        let cols = if job.plan.shape.len() >= 2 {
            job.plan.shape[1]
        } else {
            job.plan.shape[0]
        };
        match &job.fill {
            Fill::Rand { std } => rand_row(self.seed, name, row, cols, *std),
            Fill::Const(c) => vec![*c; cols],
            Fill::DraftLmHead => {
                // Each draft row is the target's row with probability `quality`, else noise:
                // the draft's top-1 agrees with the target's about `quality` of the time.
                let keep = rng_for(self.seed, "draft-row-kept", row as u64)
                    .random_range(0.0f32..1.0)
                    < self.quality;
                if keep {
                    rand_row(
                        self.seed,
                        &self.lm_name(),
                        self.d2t[row] as usize,
                        cols,
                        self.lm_std(),
                    )
                } else {
                    rand_row(self.seed, name, row, cols, self.lm_std())
                }
            }
            Fill::DraftAttn(part) => self.draft_attn_row(*part, row, cols),
            _ => vec![0.0; cols],
        }
    }

    /// Draft attention that attends to the current position and copies its normalised
    /// token embedding: q = k = c * [I | 0] on the embedding half, v = [I | -I], o = I.
    fn draft_attn_row(&self, part: AttnPart, row: usize, cols: usize) -> Vec<f32> {
        let h = self.d.hidden;
        let (nh, nkv, hd) = (
            self.d.draft_heads,
            self.d.draft_kv_heads,
            self.d.draft_head_dim,
        );
        let mut v = vec![0f32; cols];
        let sharp = 3.0f32;
        match part {
            AttnPart::Q => {
                // Query head qh reads the dims its KV head reads.
                let (qh, x) = (row / hd, row % hd);
                let kh = qh / (nh / nkv);
                let dim = kh * hd + x;
                if dim < h {
                    v[dim] = sharp;
                }
            }
            AttnPart::K => {
                if row < h {
                    v[row] = sharp;
                }
            }
            AttnPart::V => {
                // v = norm(embedding) - norm(hidden): with the residual (the hidden, whose
                // rms is ~1 by construction of fc and of this layer) the layer's output is
                // ~ the new token's normalised embedding, whatever came before.
                if row < h {
                    v[row] = 1.0;
                    v[h + row] = -1.0;
                }
            }
            AttnPart::O => {
                // Output dim `row` sums the query heads that carry KV dim `row`.
                let group = nh / nkv;
                if row < nkv * hd {
                    let (kh, x) = (row / hd, row % hd);
                    for g in 0..group {
                        let qh = kh * group + g;
                        v[qh * hd + x] = 1.0 / group as f32;
                    }
                }
            }
        }
        v
    }

    fn produce(
        &self,
        job: &Job,
        cache: &mut QuantCache,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let shape = &job.plan.shape;
        match &job.fill {
            Fill::Int4Packed { base, matrix, std } | Fill::Int4Scale { base, matrix, std } => {
                if cache.key != *base {
                    let group = self.shapes.group;
                    let [out, inp] = *matrix;
                    let (words, scales) = (inp / 8, inp / group);
                    cache.packed = vec![0; out * words];
                    cache.scales = vec![0; out * scales];
                    for r in 0..out {
                        let row = rand_row(self.seed, base, r, inp, *std);
                        int4::quantize_row_into(
                            &row,
                            group,
                            &mut cache.packed[r * words..(r + 1) * words],
                            &mut cache.scales[r * scales..(r + 1) * scales],
                        );
                    }
                    cache.key = base.clone();
                }
                let bytes: Vec<u8> = match &job.fill {
                    Fill::Int4Packed { .. } => {
                        cache.packed.iter().flat_map(|w| w.to_le_bytes()).collect()
                    }
                    _ => cache.scales.iter().flat_map(|w| w.to_le_bytes()).collect(),
                };
                sink(&bytes)
            }
            Fill::Int4Shape { matrix: [out, inp] } => {
                let mut b = Vec::new();
                b.extend((*out as i32).to_le_bytes());
                b.extend((*inp as i32).to_le_bytes());
                sink(&b)
            }
            Fill::D2t => {
                let b: Vec<u8> = self
                    .d2t
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &t)| (t as i64 - i as i64).to_le_bytes())
                    .collect();
                sink(&b)
            }
            Fill::T2d => {
                let mut b = vec![0u8; self.d.vocab];
                for &t in &self.d2t {
                    b[t as usize] = 1;
                }
                sink(&b)
            }
            _ => {
                let rows = if shape.len() >= 2 { shape[0] } else { 1 };
                for r in 0..rows {
                    let row = self.float_row(job, r);
                    let b: Vec<u8> = match job.plan.dtype {
                        Dtype::F32 => row.iter().flat_map(|x| x.to_le_bytes()).collect(),
                        _ => row
                            .iter()
                            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                            .collect(),
                    };
                    sink(&b)?;
                }
                Ok(())
            }
        }
    }
}

/// A WordLevel tokenizer.json over `vocab` pronounceable words (`<unk>`, `<s>`, `</s>` first).
pub fn tokenizer_json(vocab: usize) -> Value {
    let mut map = serde_json::Map::new();
    let specials = ["<unk>", "<s>", "</s>"];
    for (i, s) in specials.iter().enumerate().take(vocab) {
        map.insert((*s).into(), json!(i));
    }
    for i in specials.len()..vocab {
        map.insert(word(i), json!(i));
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .take(vocab)
        .map(|(i, s)| {
            json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": map, "unk_token": "<unk>"}
    })
}

/// Word for token id `i`: syllables in base 70, unique per id.
pub fn word(i: usize) -> String {
    const C: &[u8] = b"bdfgklmnprstvz";
    const V: &[u8] = b"aeiou";
    let mut n = i;
    let mut s = String::new();
    loop {
        let syl = n % 70;
        s.push(C[syl / 5] as char);
        s.push(V[syl % 5] as char);
        n /= 70;
        if n == 0 {
            break;
        }
    }
    s
}
