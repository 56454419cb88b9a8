//! [`CudaModel`]: a checkpoint's target (and EAGLE-3 draft) on one or more GPUs, with the
//! forward passes the speculative loop needs: a batched target pass over segments (prefill /
//! extend, decode, tree-masked verify) returning logits, captured hidden states and the new
//! latent KV entries (kept on the device until [`CudaModel::commit_target`] copies the accepted
//! ones into the cache), and the draft pass with its own KV cache and a per-round pool of
//! draft-path entries.

use std::path::Path;

use kbench_core::arch::{DraftArch, ModelArch};
use kbench_cuda::comm::TpComm;
use kbench_cuda::device::GraphCache;
use kbench_cuda::ops::{self as kops, MoeConfig, MoeScratch};
use kbench_cuda::{Blas, CudaDevice, DBuf};

use super::ops::{self, Route};
use super::weights::{self, DraftWeights, RankWeights};
use super::{CudaOptions, KernelChoice};
use crate::error::{EngineError, Result};
use crate::rope::{mla_softmax_scale, Rope};
use crate::st::WeightStore;

mod buffers;
mod draft_pass;
mod geometry;
mod layer;
mod moe;
mod segments;
mod target_pass;

use buffers::*;
pub(crate) use geometry::{DGeo, Geo};
use layer::*;
use moe::*;
pub use segments::{GpuDraftOut, GpuDraftSegment, GpuSegment, GpuSegmentOut};

/// Scratch of one rank for passes of up to `max_tokens` tokens.
struct Bufs {
    ids: DBuf<i32>,
    meta: DBuf<i32>,
    mask: DBuf<u64>,
    extras: DBuf<i32>,
    cos: DBuf<f32>,
    sin: DBuf<f32>,
    x: DBuf<f32>,
    hn: DBuf<f32>,
    qa: DBuf<f32>,
    q: DBuf<f32>,
    qcat: DBuf<f32>,
    /// `[layers, max_tokens, width]`: this pass's latent KV entries.
    kvnew: DBuf<f32>,
    olat: DBuf<f32>,
    ao: DBuf<f32>,
    part: DBuf<f32>,
    partb: DBuf<u16>,
    g: DBuf<f32>,
    u: DBuf<f32>,
    act: DBuf<f32>,
    rl: DBuf<f32>,
    rwork: DBuf<f32>,
    mids: DBuf<i32>,
    mwts: DBuf<f32>,
    mg: DBuf<f32>,
    mu: DBuf<f32>,
    mact: DBuf<f32>,
    my: DBuf<f32>,
    cap: DBuf<f32>,
    rows: DBuf<i32>,
    xr: DBuf<f32>,
    logits: DBuf<f32>,
    scores: DBuf<f32>,
    /// Tuned kernels only.
    t: Option<TunedBufs>,
}

/// Scratch of the tuned kernels: bf16 copies of the activations that feed them.
struct TunedBufs {
    /// `[t, h]`: the normed hidden state (q_a / kv_a / MLP / router / experts input).
    hnb: DBuf<u16>,
    /// `[t, max(h, q_lora, hl * vd)]`: input of q_b, o_proj, lm_head.
    xb: DBuf<u16>,
    /// `[t, inter]`: SwiGLU output, input of the dense / shared down projections.
    actb: DBuf<u16>,
    /// `[t, h]`: the shared expert's output, added by kbench-cuda's `moe_combine`.
    shb: DBuf<u16>,
    /// f32 split-K partial sums of the matmuls.
    ws: DBuf<f32>,
    moe: Option<MoeScratch>,
    /// cuBLAS on this rank's stream for the dense BF16 linears (None: the own kernel).
    blas: Option<Blas>,
}

impl TunedBufs {
    fn ws(&self) -> kops::Workspace {
        Some((self.ws.ptr(), self.ws.len()))
    }
    fn blas(&self) -> Option<&Blas> {
        self.blas.as_ref()
    }
}

/// Split-K workspace of the tuned matmuls, in floats. kbench-cuda lowers the split count to
/// what fits, so this bounds memory, not correctness.
const SPLITK_WS: usize = 1 << 22;

pub(crate) struct Rank {
    pub dev: CudaDevice,
    comm: TpComm,
    w: RankWeights,
    b: Bufs,
    /// `[layers, max_batch, max_ctx, width]` f32 latent cache.
    cache: DBuf<f32>,
    graphs: GraphCache,
}

struct DraftDev {
    g: DGeo,
    w: DraftWeights,
    rope: Rope,
    ids: DBuf<i32>,
    meta: DBuf<i32>,
    mask: DBuf<u64>,
    extras: DBuf<i32>,
    cos: DBuf<f32>,
    sin: DBuf<f32>,
    hin3: DBuf<f32>,
    hid: DBuf<f32>,
    e: DBuf<f32>,
    xin: DBuf<f32>,
    q: DBuf<f32>,
    k: DBuf<f32>,
    v: DBuf<f32>,
    attn: DBuf<f32>,
    res: DBuf<f32>,
    hn: DBuf<f32>,
    gg: DBuf<f32>,
    uu: DBuf<f32>,
    act: DBuf<f32>,
    normed: DBuf<f32>,
    logits: DBuf<f32>,
    scores: DBuf<f32>,
    /// `[max_batch, max_ctx, kvw]`.
    cache_k: DBuf<f32>,
    cache_v: DBuf<f32>,
    /// `[max_batch, max_cands, kvw]`: this round's draft-path entries.
    pool_k: DBuf<f32>,
    pool_v: DBuf<f32>,
}

/// The model on the GPU(s).
pub struct CudaModel {
    pub arch: ModelArch,
    pub draft_arch: Option<DraftArch>,
    pub opts: CudaOptions,
    pub(crate) g: Geo,
    ranks: Vec<Rank>,
    draft: Option<DraftDev>,
    /// Target id of each draft id.
    pub d2t: Vec<u32>,
    rope: Rope,
    /// Passes run through a CUDA graph / eagerly (for tests and reports).
    pub graph_launches: usize,
    pub eager_launches: usize,
}

impl CudaModel {
    /// Loads the target in `dir` (and the draft in `draft_dir`) onto the GPUs in `opts`.
    pub fn load(dir: &Path, draft_dir: Option<&Path>, opts: &CudaOptions) -> Result<CudaModel> {
        let arch = ModelArch::from_config_file(&dir.join("config.json"))?;
        let ws = WeightStore::open(dir)?;
        let (darch, dws) = match draft_dir {
            Some(dd) => {
                let darch = crate::model::draft_arch(dd, &arch)?;
                (Some(darch), Some(WeightStore::open(dd)?))
            }
            None => (None, None),
        };
        Self::from_stores(arch, &ws, darch, dws.as_ref(), opts)
    }

    /// The checkpoint a CPU [`crate::Model`] was loaded from, on the GPU(s): reopens
    /// `model.dir` (and `draft_dir`, by default `model.dir/draft` when the model has a
    /// draft). Models built in memory (`build_model`) have no directory: write them with
    /// `init_model_with` first, or use [`from_stores`](Self::from_stores).
    pub fn from_model(
        model: &crate::Model,
        draft_dir: Option<&Path>,
        opts: &CudaOptions,
    ) -> Result<CudaModel> {
        if !model.dir.join("config.json").exists() {
            return Err(EngineError::Invalid(format!(
                "the CUDA path loads checkpoints from disk; {} has no config.json (in-memory model?)",
                model.dir.display()
            )));
        }
        let default_draft = model.dir.join("draft");
        let dd = match (draft_dir, &model.draft) {
            (Some(d), _) => Some(d),
            (None, Some(_)) => Some(default_draft.as_path()),
            (None, None) => None,
        };
        Self::load(&model.dir, dd, opts)
    }

    /// The same from already opened weight stores.
    pub fn from_stores(
        arch: ModelArch,
        ws: &WeightStore,
        darch: Option<DraftArch>,
        dws: Option<&WeightStore>,
        opts: &CudaOptions,
    ) -> Result<CudaModel> {
        opts.validate()?;
        let mla = arch.mla.clone().ok_or_else(|| {
            EngineError::Unsupported("the CUDA path runs MLA + MoE targets".into())
        })?;
        let world = opts.devices.len();
        let (nope, rd, vd, rank) = (
            mla.qk_nope_head_dim as usize,
            mla.qk_rope_head_dim as usize,
            mla.v_head_dim as usize,
            mla.kv_lora_rank as usize,
        );
        let scale = mla_softmax_scale(nope + rd, arch.rope_scaling.as_ref());
        let route = arch.moe.as_ref().map(|d| Route {
            experts: d.n_routed_experts as usize,
            top_k: d.num_experts_per_tok as usize,
            n_group: d.n_group.max(1) as usize,
            topk_group: d.topk_group as usize,
            sigmoid: d.scoring_func == "sigmoid",
            norm: d.norm_topk_prob,
            scaling: d.routed_scaling_factor as f32,
        });
        let first_moe = (0..arch.num_layers).find(|&l| arch.is_moe_layer(l));
        let int4_experts = first_moe.is_some_and(|l| {
            ws.contains(&format!(
                "{}model.layers.{l}.mlp.experts.0.gate_proj.weight_packed",
                arch.tensor_prefix
            ))
        });
        let tuned = opts.kernels.resolve(&arch, world, int4_experts)? == KernelChoice::Tuned;
        let moe_cfg = match (&arch.moe, tuned) {
            (Some(d), true) => {
                let ng = d.n_group.max(1) as usize;
                let k = d.num_experts_per_tok as usize;
                Some(MoeConfig {
                    n_experts: d.n_routed_experts as usize,
                    top_k: k,
                    n_group: ng,
                    // one group: nothing to select (the CPU ignores topk_group then)
                    topk_group: if ng > 1 { d.topk_group as usize } else { 1 },
                    // the CPU renormalises only for top-k > 1; moe_route always would
                    renormalize: d.norm_topk_prob && k > 1,
                    routed_scaling: d.routed_scaling_factor as f32,
                    hidden: arch.hidden_size as usize,
                    inter: d.moe_intermediate_size as usize,
                })
            }
            _ => None,
        };
        let capture: Vec<usize> = match &darch {
            Some(d) => d.capture_layers.iter().map(|&l| l as usize).collect(),
            None => arch
                .eagle3_capture_layer_outputs()
                .iter()
                .map(|&x| x as usize)
                .collect(),
        };
        let g = Geo {
            h: arch.hidden_size as usize,
            layers: arch.num_layers as usize,
            heads: arch.num_heads as usize,
            nope,
            rd,
            vd,
            kv_lora_rank: rank,
            q_lora: mla.q_lora_rank.map(|x| x as usize),
            vocab: arch.vocab_size as usize,
            eps: arch.rms_norm_eps as f32,
            scale: scale as f32,
            experts: route.map(|r| r.experts).unwrap_or(0),
            top_k: route.map(|r| r.top_k).unwrap_or(0),
            moe_inter: arch
                .moe
                .as_ref()
                .map(|d| d.moe_intermediate_size as usize)
                .unwrap_or(0),
            route,
            tuned,
            cublas: opts.cublas,
            moe_cfg,
            capture,
            world,
            max_batch: opts.max_batch,
            max_ctx: opts.max_ctx,
            max_tokens: opts.max_tokens,
        };
        if g.capture.iter().any(|&l| l >= g.layers) {
            return Err(EngineError::ConfigMismatch(format!(
                "capture layers {:?} outside {} layers",
                g.capture, g.layers
            )));
        }
        let mut devs = Vec::with_capacity(world);
        for &o in &opts.devices {
            devs.push(CudaDevice::new(o).map_err(EngineError::Cuda)?);
        }
        for d in &devs {
            d.module(&ops::ENGINE_F32).map_err(EngineError::Cuda)?;
            if tuned {
                d.module(&kbench_cuda::kernels::BF16_MATMUL)
                    .map_err(EngineError::Cuda)?;
                if moe_cfg.is_some() {
                    d.module(&kbench_cuda::kernels::FUSED_MOE)
                        .map_err(EngineError::Cuda)?;
                }
            }
        }
        let comms: Vec<TpComm> = if world == 1 {
            vec![TpComm::single()]
        } else {
            let refs: Vec<&CudaDevice> = devs.iter().collect();
            TpComm::group(&refs).map_err(EngineError::Cuda)?
        };
        let mut ranks = Vec::with_capacity(world);
        for (r, (dev, comm)) in devs.into_iter().zip(comms).enumerate() {
            let w = weights::load_rank(&dev, &arch, ws, world, r, tuned)?;
            let b = Self::alloc_bufs(&dev, &g, &w, r == 0)?;
            let cache = zeros_f32(&dev, g.layers * g.max_batch * g.max_ctx * g.width())?;
            ranks.push(Rank {
                dev,
                comm,
                w,
                b,
                cache,
                graphs: GraphCache::default(),
            });
        }
        let (draft, d2t) = match (&darch, dws) {
            (Some(da), Some(dws)) => {
                if da.hidden_size as usize != g.h {
                    return Err(EngineError::ConfigMismatch(
                        "draft hidden size differs from the target's".into(),
                    ));
                }
                let dev = &ranks[0].dev;
                let (w, d2t) = weights::load_draft(dev, da, dws, g.vocab)?;
                let dg = DGeo {
                    h: g.h,
                    ncap: da.capture_layers.len(),
                    nh: da.num_heads as usize,
                    nkv: da.num_kv_heads as usize,
                    hd: da.head_dim as usize,
                    inter: da.intermediate_size as usize,
                    dv: da.draft_vocab_size as usize,
                    eps: da.rms_norm_eps as f32,
                    max_cands: opts.max_draft_candidates,
                    max_extra: 32,
                };
                let rope = Rope::new(dg.hd, da.rope_theta, None, false);
                (Some(Self::alloc_draft(dev, &g, dg, w, rope)?), d2t)
            }
            _ => (None, Vec::new()),
        };
        let rope = Rope::new(g.rd, arch.rope_theta, arch.rope_scaling.as_ref(), true);
        for r in &ranks {
            r.dev.sync().map_err(EngineError::Cuda)?;
        }
        Ok(CudaModel {
            arch,
            draft_arch: darch,
            opts: opts.clone(),
            g,
            ranks,
            draft,
            d2t,
            rope,
            graph_launches: 0,
            eager_launches: 0,
        })
    }

    pub fn hidden(&self) -> usize {
        self.g.h
    }
    pub fn vocab(&self) -> usize {
        self.g.vocab
    }
    pub fn num_layers(&self) -> usize {
        self.g.layers
    }
    pub fn kv_width(&self) -> usize {
        self.g.width()
    }
    pub fn capture_layers(&self) -> &[usize] {
        &self.g.capture
    }
    pub fn tp_size(&self) -> usize {
        self.g.world
    }
    /// The kernels the target pass runs on (`Exact` or `Tuned`; `Auto` resolved at load).
    pub fn kernels(&self) -> KernelChoice {
        if self.g.tuned {
            KernelChoice::Tuned
        } else {
            KernelChoice::Exact
        }
    }
    pub fn has_draft(&self) -> bool {
        self.draft.is_some()
    }
    pub fn draft_vocab(&self) -> usize {
        self.d2t.len()
    }
    pub fn draft_hidden(&self) -> usize {
        self.draft.as_ref().map(|d| d.g.h).unwrap_or(0)
    }
    pub fn max_draft_candidates(&self) -> usize {
        self.draft.as_ref().map(|d| d.g.max_cands).unwrap_or(0)
    }
    /// Names of the GPUs.
    pub fn devices(&self) -> Vec<String> {
        self.ranks
            .iter()
            .map(|r| format!("cuda:{} ({})", r.dev.ordinal, r.dev.name))
            .collect()
    }

    /// Waits for every rank's stream.
    pub fn sync(&self) -> Result<()> {
        for r in &self.ranks {
            r.dev.sync().map_err(EngineError::Cuda)?;
        }
        Ok(())
    }
}
