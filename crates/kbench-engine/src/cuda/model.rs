//! [`CudaModel`]: a checkpoint's target (and EAGLE-3 draft) on one or more GPUs, with the
//! forward passes the speculative loop needs: a batched target pass over segments (prefill /
//! extend, decode, tree-masked verify) returning logits, captured hidden states and the new
//! latent KV entries (kept on the device until [`CudaModel::commit_target`] copies the accepted
//! ones into the cache), and the draft pass with its own KV cache and a per-round pool of
//! draft-path entries.

use std::path::Path;

use kbench_core::arch::{DraftArch, ModelArch};
use kbench_cuda::comm::{self, TpComm};
use kbench_cuda::device::GraphCache;
use kbench_cuda::ops::{self as kops, MoeConfig, MoeScratch, MoeWeights};
use kbench_cuda::{Blas, CudaDevice, DBuf, DeviceRepr};

use super::ops::{self, AttnGeom, KvSrc, Route};
use super::weights::{self, DFfn, DLin, DMlp, DraftWeights, ExpertW, RankWeights, DQ};
use super::{CudaOptions, KernelChoice};
use crate::error::{EngineError, Result};
use crate::rope::{mla_softmax_scale, Rope};
use crate::st::WeightStore;

/// Target dimensions (global, not per rank).
#[derive(Debug, Clone)]
pub(crate) struct Geo {
    pub h: usize,
    pub layers: usize,
    pub heads: usize,
    pub nope: usize,
    pub rd: usize,
    pub vd: usize,
    pub rank: usize,
    pub q_lora: Option<usize>,
    pub vocab: usize,
    pub eps: f32,
    pub scale: f32,
    pub experts: usize,
    pub top_k: usize,
    pub moe_inter: usize,
    pub route: Option<Route>,
    /// Tuned kernels (bf16 activations into kbench-cuda's matmuls and fused MoE).
    pub tuned: bool,
    /// Tuned dense BF16 linears through cuBLAS when it loads.
    pub cublas: bool,
    /// kbench-cuda's router configuration over all experts (tuned MoE layers).
    pub moe_cfg: Option<MoeConfig>,
    pub capture: Vec<usize>,
    pub world: usize,
    pub max_batch: usize,
    pub max_ctx: usize,
    pub max_tokens: usize,
}

impl Geo {
    pub fn width(&self) -> usize {
        self.rank + self.rd
    }
    pub fn qd(&self) -> usize {
        self.nope + self.rd
    }
    pub fn hl(&self) -> usize {
        self.heads / self.world
    }
}

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

/// Draft geometry.
#[derive(Debug, Clone)]
pub(crate) struct DGeo {
    pub h: usize,
    pub ncap: usize,
    pub nh: usize,
    pub nkv: usize,
    pub hd: usize,
    pub inter: usize,
    pub dv: usize,
    pub eps: f32,
    pub max_cands: usize,
    pub max_extra: usize,
}

impl DGeo {
    fn kvw(&self) -> usize {
        self.nkv * self.hd
    }
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

/// One sequence's tokens in a batched target pass (the GPU twin of `target::Segment`).
#[derive(Debug, Clone)]
pub struct GpuSegment {
    /// KV cache slot of the sequence (< max_batch).
    pub slot: usize,
    /// Tokens already in the slot's cache.
    pub cache_len: usize,
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// Per token, the segment tokens it attends to (its tree ancestors and itself); `None`:
    /// causal.
    pub tree: Option<Vec<Vec<usize>>>,
    /// Logits for every token (verify, decode) or only the last (prefill).
    pub all_logits: bool,
}

#[derive(Debug, Clone)]
pub struct GpuSegmentOut {
    /// `[n or 1, vocab]`.
    pub logits: Vec<f32>,
    /// `[n, ncap * hidden]`: the capture layers' outputs.
    pub captured: Vec<f32>,
    /// First row of this segment in the pass (for [`CudaModel::commit_target`]).
    pub row0: usize,
    /// Per layer `[n, kv_width]` (only when asked for; tests compare it with the CPU's).
    pub kv: Option<Vec<Vec<f32>>>,
}

/// One sequence's tokens in a draft pass (the twin of `draft::DraftSegment`).
#[derive(Debug, Clone)]
pub struct GpuDraftSegment {
    pub slot: usize,
    /// Entries already in the slot's draft cache.
    pub cache_len: usize,
    /// Candidates (indices into this round's pool for the slot) attended after the cache.
    pub extra: Vec<usize>,
    pub tokens: Vec<u32>,
    /// `[n, ncap*h]` captured states (extend) or `[n, h]` draft hidden (decode).
    pub hidden_in: Vec<f32>,
    pub positions: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct GpuDraftOut {
    /// `[n, draft_vocab]`.
    pub logits: Vec<f32>,
    /// `[n, h]` pre-norm hidden (input of the next draft step).
    pub aux: Vec<f32>,
    pub row0: usize,
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

/// Writes `data` into `dst` at element `off` (stream-ordered).
fn write_at<T: DeviceRepr>(dev: &CudaDevice, dst: &DBuf<T>, off: usize, data: &[T]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    if off + data.len() > dst.len() {
        return Err(EngineError::Invalid(format!(
            "device write of {} at {off} overflows a buffer of {}",
            data.len(),
            dst.len()
        )));
    }
    let t = dev.upload(data).map_err(EngineError::Cuda)?;
    dev.copy_d2d(dst.ptr_at(off), t.ptr(), std::mem::size_of_val(data))
        .map_err(EngineError::Cuda)
}

/// Reads `n` elements of `src` from element `off` (synchronises the stream).
fn read_at<T: DeviceRepr + Default + Clone>(
    dev: &CudaDevice,
    src: &DBuf<T>,
    off: usize,
    n: usize,
) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if off + n > src.len() {
        return Err(EngineError::Invalid(format!(
            "device read of {n} at {off} overflows a buffer of {}",
            src.len()
        )));
    }
    let t = dev.alloc::<T>(n).map_err(EngineError::Cuda)?;
    dev.copy_d2d(t.ptr(), src.ptr_at(off), n * std::mem::size_of::<T>())
        .map_err(EngineError::Cuda)?;
    let mut v = dev.download(&t).map_err(EngineError::Cuda)?;
    v.truncate(n);
    Ok(v)
}

fn zeros_f32(dev: &CudaDevice, n: usize) -> Result<DBuf<f32>> {
    let b = dev.alloc::<f32>(n.max(1)).map_err(EngineError::Cuda)?;
    dev.fill_bytes(&b, 0).map_err(EngineError::Cuda)?;
    Ok(b)
}
fn zeros_i32(dev: &CudaDevice, n: usize) -> Result<DBuf<i32>> {
    let b = dev.alloc::<i32>(n.max(1)).map_err(EngineError::Cuda)?;
    dev.fill_bytes(&b, 0).map_err(EngineError::Cuda)?;
    Ok(b)
}

/// Runs of consecutive indices: (first, length).
fn runs(which: &[usize]) -> Vec<(usize, usize, usize)> {
    // (position in `which`, first index, length)
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for (j, &i) in which.iter().enumerate() {
        match out.last_mut() {
            Some((_, first, len)) if *first + *len == i => *len += 1,
            _ => out.push((j, i, 1)),
        }
    }
    out
}

impl CudaModel {
    /// Loads the target in `dir` (and the draft in `draft_dir`) onto the GPUs in `opts`.
    pub fn load(dir: &Path, draft_dir: Option<&Path>, opts: &CudaOptions) -> Result<CudaModel> {
        let arch = ModelArch::from_config_file(&dir.join("config.json"))?;
        let ws = WeightStore::open(dir)?;
        let (darch, dws) = match draft_dir {
            Some(dd) => {
                let darch = DraftArch::from_config_file(&dd.join("config.json"), &arch)?;
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
            rank,
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

    fn alloc_bufs(dev: &CudaDevice, g: &Geo, w: &RankWeights, rank0: bool) -> Result<Bufs> {
        let t = g.max_tokens;
        let hl = g.hl();
        let f = |n: usize| zeros_f32(dev, n);
        let mut inter = 1;
        for l in &w.layers {
            match &l.mlp {
                DMlp::Dense(ff) => inter = inter.max(ff.gate.out),
                DMlp::Moe {
                    shared: Some(ff), ..
                } => inter = inter.max(ff.gate.out),
                _ => {}
            }
        }
        let p = t * g.top_k.max(1);
        // buffers only the exact kernels use (tens of MB at Kimi width) shrink to one element
        let ex = usize::from(!g.tuned);
        let tb = if g.tuned {
            let u16z = |n: usize| -> Result<DBuf<u16>> {
                let b = dev.alloc::<u16>(n.max(1)).map_err(EngineError::Cuda)?;
                dev.fill_bytes(&b, 0).map_err(EngineError::Cuda)?;
                Ok(b)
            };
            let xw = g.h.max(g.q_lora.unwrap_or(0)).max(hl * g.vd);
            let moe = match &g.moe_cfg {
                Some(c) => {
                    let sc = MoeScratch::new(dev, c, t).map_err(EngineError::Cuda)?;
                    // pairs of other ranks' experts are zeroed per pass; start from zeros too
                    dev.fill_bytes(&sc.down, 0).map_err(EngineError::Cuda)?;
                    Some(sc)
                }
                None => None,
            };
            Some(TunedBufs {
                hnb: u16z(t * g.h)?,
                xb: u16z(t * xw)?,
                actb: u16z(t * inter)?,
                shb: u16z(t * g.h)?,
                ws: f(SPLITK_WS)?,
                moe,
                blas: if g.cublas {
                    match Blas::new(dev) {
                        Ok(b) => Some(b),
                        Err(e) => {
                            if rank0 {
                                eprintln!(
                                    "kbench: dense linears on kbench's own bf16_matmul ({e})"
                                );
                            }
                            None
                        }
                    }
                } else {
                    None
                },
            })
        } else {
            None
        };
        Ok(Bufs {
            ids: zeros_i32(dev, t)?,
            meta: zeros_i32(dev, t * 8)?,
            mask: {
                let b = dev.alloc::<u64>(t).map_err(EngineError::Cuda)?;
                dev.fill_bytes(&b, 0).map_err(EngineError::Cuda)?;
                b
            },
            extras: zeros_i32(dev, 1)?,
            cos: f(t * g.rd / 2)?,
            sin: f(t * g.rd / 2)?,
            x: f(t * g.h)?,
            hn: f(t * g.h)?,
            qa: f(t * g.q_lora.unwrap_or(1))?,
            q: f(t * hl * g.qd())?,
            qcat: f(t * hl * g.width())?,
            kvnew: f(g.layers * t * g.width())?,
            olat: f(t * hl * g.rank)?,
            ao: f(t * hl * g.vd)?,
            part: f(t * g.h)?,
            partb: {
                let b = dev.alloc::<u16>(t * g.h).map_err(EngineError::Cuda)?;
                dev.fill_bytes(&b, 0).map_err(EngineError::Cuda)?;
                b
            },
            g: f(t * inter)?,
            u: f(t * inter)?,
            act: f(ex * t * inter)?,
            rl: f(t * g.experts.max(1))?,
            rwork: f(ex * t * 2 * g.experts.max(1))?,
            mids: zeros_i32(dev, ex * p)?,
            mwts: f(ex * p)?,
            mg: f(ex * p * g.moe_inter.max(1))?,
            mu: f(ex * p * g.moe_inter.max(1))?,
            mact: f(ex * p * g.moe_inter.max(1))?,
            my: f(ex * p * g.h)?,
            cap: f(if rank0 { t * g.capture.len() * g.h } else { 1 })?,
            rows: zeros_i32(dev, t)?,
            xr: f(t * g.h)?,
            logits: f(t * w.lm_head.out)?,
            scores: f(t * hl * g.max_ctx)?,
            t: tb,
        })
    }

    fn alloc_draft(
        dev: &CudaDevice,
        g: &Geo,
        dg: DGeo,
        w: DraftWeights,
        rope: Rope,
    ) -> Result<DraftDev> {
        let t = g.max_tokens;
        let f = |n: usize| zeros_f32(dev, n);
        let kvw = dg.kvw();
        Ok(DraftDev {
            ids: zeros_i32(dev, t)?,
            meta: zeros_i32(dev, t * 8)?,
            mask: {
                let b = dev.alloc::<u64>(t).map_err(EngineError::Cuda)?;
                dev.fill_bytes(&b, 0).map_err(EngineError::Cuda)?;
                b
            },
            extras: zeros_i32(dev, t * dg.max_extra)?,
            cos: f(t * dg.hd / 2)?,
            sin: f(t * dg.hd / 2)?,
            hin3: f(t * dg.ncap * dg.h)?,
            hid: f(t * dg.h)?,
            e: f(t * dg.h)?,
            xin: f(t * 2 * dg.h)?,
            q: f(t * dg.nh * dg.hd)?,
            k: f(t * kvw)?,
            v: f(t * kvw)?,
            attn: f(t * dg.nh * dg.hd)?,
            res: f(t * dg.h)?,
            hn: f(t * dg.h)?,
            gg: f(t * dg.inter)?,
            uu: f(t * dg.inter)?,
            act: f(t * dg.inter)?,
            normed: f(t * dg.h)?,
            logits: f(t * dg.dv)?,
            scores: f(t * dg.nh * g.max_ctx)?,
            cache_k: f(g.max_batch * g.max_ctx * kvw)?,
            cache_v: f(g.max_batch * g.max_ctx * kvw)?,
            pool_k: f(g.max_batch * dg.max_cands * kvw)?,
            pool_v: f(g.max_batch * dg.max_cands * kvw)?,
            g: dg,
            w,
            rope,
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

    // ------------------------------------------------------------------------------------
    // Target pass.

    /// One batched target pass over `segs` (their tokens must fit `max_tokens`; the spec loop
    /// chunks long prompts). New KV entries stay in the pass buffer until
    /// [`commit_target`](Self::commit_target), which must be called before the next pass.
    pub fn forward_target(
        &mut self,
        segs: &[GpuSegment],
        want_kv: bool,
    ) -> Result<Vec<GpuSegmentOut>> {
        let g = self.g.clone();
        let total: usize = segs.iter().map(|s| s.tokens.len()).sum();
        if total == 0 {
            return Err(EngineError::Invalid("empty target pass".into()));
        }
        if total > g.max_tokens {
            return Err(EngineError::Invalid(format!(
                "target pass of {total} tokens > max_tokens {}",
                g.max_tokens
            )));
        }
        let all_logits = segs.iter().all(|s| s.all_logits);
        // Graph bucket: the padded token count (decode / verify passes only).
        let graph_t = if self.opts.cuda_graph_max_bs > 0
            && g.world == 1
            && all_logits
            && segs.len() <= self.opts.cuda_graph_max_bs
        {
            let tp = total.next_power_of_two();
            (tp <= g.max_tokens).then_some(tp)
        } else {
            None
        };
        let t_run = graph_t.unwrap_or(total);
        // --- host metadata ---
        let half = g.rd / 2;
        let mut ids = vec![0i32; t_run];
        let mut meta = vec![0i32; t_run * 8];
        let mut mask = vec![0u64; t_run];
        let mut cos = vec![1f32; t_run * half];
        let mut sin = vec![0f32; t_run * half];
        let mut rows: Vec<i32> = Vec::new();
        let mut offsets = Vec::with_capacity(segs.len());
        let mut o = 0usize;
        for s in segs {
            let n = s.tokens.len();
            if s.positions.len() != n {
                return Err(EngineError::Invalid(
                    "segment tokens and positions differ in length".into(),
                ));
            }
            if s.slot >= g.max_batch {
                return Err(EngineError::Invalid(format!(
                    "slot {} >= max_batch {}",
                    s.slot, g.max_batch
                )));
            }
            if s.cache_len + n > g.max_ctx {
                return Err(EngineError::Invalid(format!(
                    "context {} exceeds max_ctx {}",
                    s.cache_len + n,
                    g.max_ctx
                )));
            }
            if let Some(tr) = &s.tree {
                if tr.len() != n || n > 64 {
                    return Err(EngineError::Invalid(format!(
                        "tree mask of {} rows for {n} tokens (at most 64)",
                        tr.len()
                    )));
                }
            }
            offsets.push(o);
            for i in 0..n {
                let t = o + i;
                let tok = s.tokens[i];
                if tok as usize >= g.vocab {
                    return Err(EngineError::Invalid(format!(
                        "token id {tok} is outside the vocabulary of {}",
                        g.vocab
                    )));
                }
                ids[t] = tok as i32;
                let m = &mut meta[t * 8..t * 8 + 8];
                m[0] = (s.slot * g.max_ctx) as i32;
                m[1] = s.cache_len as i32;
                m[2] = o as i32;
                m[3] = i as i32;
                m[4] = s.tree.is_some() as i32;
                m[5] = 0;
                m[6] = 0;
                m[7] = n as i32;
                if let Some(tr) = &s.tree {
                    mask[t] = tr[i].iter().fold(0u64, |b, &j| b | (1u64 << j));
                }
                let (c, sn) = self.rope.table(s.positions[i]);
                cos[t * half..(t + 1) * half].copy_from_slice(&c);
                sin[t * half..(t + 1) * half].copy_from_slice(&sn);
            }
            if s.all_logits {
                rows.extend((o..o + n).map(|r| r as i32));
            } else if n > 0 {
                rows.push((o + n - 1) as i32);
            }
            o += n;
        }
        // padding rows (graph buckets): attend to themselves only; never committed
        for t in total..t_run {
            let m = &mut meta[t * 8..t * 8 + 8];
            m[2] = t as i32;
            m[7] = 1;
        }
        let nrows = if graph_t.is_some() { t_run } else { rows.len() };
        let gather = graph_t.is_none() && !all_logits;
        for r in &self.ranks {
            let d = &r.dev;
            write_at(d, &r.b.ids, 0, &ids)?;
            write_at(d, &r.b.meta, 0, &meta)?;
            write_at(d, &r.b.mask, 0, &mask)?;
            write_at(d, &r.b.cos, 0, &cos)?;
            write_at(d, &r.b.sin, 0, &sin)?;
            if gather {
                write_at(d, &r.b.rows, 0, &rows)?;
            }
        }
        // --- device work ---
        match graph_t {
            Some(tb) => {
                let rk = &self.ranks[0];
                if rk.graphs.bucket_for(tb) == Some(tb) {
                    rk.graphs.launch(tb).map_err(EngineError::Cuda)?;
                    self.graph_launches += 1;
                } else {
                    // eager once (loads every kernel), then capture for the next passes
                    device_forward(&g, &self.ranks, tb, tb, false)?;
                    self.eager_launches += 1;
                    // nothing pending (e.g. an async free) may land inside the capture
                    self.ranks[0].dev.sync().map_err(EngineError::Cuda)?;
                    let graph = {
                        let rk = &self.ranks[0];
                        let ranks = &self.ranks;
                        let gg = &g;
                        rk.dev.capture(|| {
                            device_forward(gg, ranks, tb, tb, false)
                                .map_err(|e| kbench_cuda::CudaError::Invalid(e.to_string()))
                        })
                    };
                    match graph {
                        Ok(gr) => self.ranks[0].graphs.insert(tb, gr),
                        Err(e) => {
                            // capture failed: stay eager for this bucket (logged once per bucket)
                            eprintln!("kbench-engine cuda: graph capture for {tb} tokens failed ({e}); running eagerly");
                            self.opts.cuda_graph_max_bs = 0;
                        }
                    }
                }
            }
            None => {
                device_forward(&g, &self.ranks, t_run, nrows, gather)?;
                self.eager_launches += 1;
            }
        }
        // --- results ---
        let mut logits_all = vec![0f32; nrows * g.vocab];
        for r in &self.ranks {
            let vl = r.w.lm_head.out;
            let part = read_at(&r.dev, &r.b.logits, 0, nrows * vl)?;
            for row in 0..nrows {
                logits_all[row * g.vocab + r.w.v0..row * g.vocab + r.w.v0 + vl]
                    .copy_from_slice(&part[row * vl..(row + 1) * vl]);
            }
        }
        let ncap = g.capture.len() * g.h;
        let r0 = &self.ranks[0];
        let cap = read_at(&r0.dev, &r0.b.cap, 0, total * ncap)?;
        let mut out = Vec::with_capacity(segs.len());
        let mut row_cursor = 0;
        for (si, s) in segs.iter().enumerate() {
            let n = s.tokens.len();
            let o = offsets[si];
            let (first, nl) = if graph_t.is_some() {
                if s.all_logits {
                    (o, n)
                } else {
                    (o + n - 1, 1)
                }
            } else {
                let nl = if s.all_logits { n } else { n.min(1) };
                let f = row_cursor;
                row_cursor += nl;
                (f, nl)
            };
            let kv = if want_kv {
                let mut v = Vec::with_capacity(g.layers);
                for l in 0..g.layers {
                    v.push(read_at(
                        &r0.dev,
                        &r0.b.kvnew,
                        (l * g.max_tokens + o) * g.width(),
                        n * g.width(),
                    )?);
                }
                Some(v)
            } else {
                None
            };
            out.push(GpuSegmentOut {
                logits: logits_all[first * g.vocab..(first + nl) * g.vocab].to_vec(),
                captured: cap[o * ncap..(o + n) * ncap].to_vec(),
                row0: o,
                kv,
            });
        }
        Ok(out)
    }

    /// Appends the KV entries of segment rows `which` (relative to `row0`, in order) to the
    /// cache of `slot`, which holds `cache_len` entries. Every rank (the cache is replicated).
    pub fn commit_target(
        &mut self,
        slot: usize,
        cache_len: usize,
        row0: usize,
        which: &[usize],
    ) -> Result<()> {
        let g = &self.g;
        let w = g.width();
        if cache_len + which.len() > g.max_ctx {
            return Err(EngineError::Invalid(format!(
                "KV cache of slot {slot} would exceed max_ctx {}",
                g.max_ctx
            )));
        }
        for r in &self.ranks {
            for l in 0..g.layers {
                let cache_l = (l * g.max_batch + slot) * g.max_ctx;
                for (j, first, len) in runs(which) {
                    let dst = r.cache.ptr_at((cache_l + cache_len + j) * w);
                    let src = r.b.kvnew.ptr_at((l * g.max_tokens + row0 + first) * w);
                    r.dev
                        .copy_d2d(dst, src, len * w * 4)
                        .map_err(EngineError::Cuda)?;
                }
            }
        }
        Ok(())
    }

    /// Per layer, the first `len` cache entries of `slot` (tests).
    pub fn read_cache(&self, slot: usize, len: usize) -> Result<Vec<Vec<f32>>> {
        let g = &self.g;
        let r = &self.ranks[0];
        (0..g.layers)
            .map(|l| {
                read_at(
                    &r.dev,
                    &r.cache,
                    ((l * g.max_batch + slot) * g.max_ctx) * g.width(),
                    len * g.width(),
                )
            })
            .collect()
    }

    // ------------------------------------------------------------------------------------
    // Draft pass (rank 0).

    /// One batched draft pass. Tokens attend to the slot's draft cache, then to the pool
    /// entries in `extra`, then causally to each other. New K/V rows stay in the pass buffer
    /// for [`commit_draft`](Self::commit_draft) / [`pool_store`](Self::pool_store).
    pub fn forward_draft(&mut self, segs: &[GpuDraftSegment]) -> Result<Vec<GpuDraftOut>> {
        let g = self.g.clone();
        let dd = self
            .draft
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("no draft model loaded".into()))?;
        let dg = dd.g.clone();
        let dev = &self.ranks[0].dev;
        let tw = &self.ranks[0].w;
        let total: usize = segs.iter().map(|s| s.tokens.len()).sum();
        if total == 0 {
            return Err(EngineError::Invalid("empty draft pass".into()));
        }
        if total > g.max_tokens {
            return Err(EngineError::Invalid(format!(
                "draft pass of {total} tokens > max_tokens {}",
                g.max_tokens
            )));
        }
        let (h, ncap, kvw) = (dg.h, dg.ncap, dg.kvw());
        let half = dg.hd / 2;
        let mut ids = vec![0i32; total];
        let mut meta = vec![0i32; total * 8];
        let mut extras: Vec<i32> = Vec::new();
        let mut cos = vec![0f32; total * half];
        let mut sin = vec![0f32; total * half];
        let mut o = 0;
        let mut offs = Vec::with_capacity(segs.len());
        for s in segs {
            let n = s.tokens.len();
            if s.positions.len() != n {
                return Err(EngineError::Invalid(
                    "draft segment tokens and positions differ in length".into(),
                ));
            }
            if s.slot >= g.max_batch
                || s.extra.len() > dg.max_extra
                || s.extra.iter().any(|&c| c >= dg.max_cands)
            {
                return Err(EngineError::Invalid(format!(
                    "draft segment: slot {} (max {}), {} extras (max {}), candidates < {}",
                    s.slot,
                    g.max_batch,
                    s.extra.len(),
                    dg.max_extra,
                    dg.max_cands
                )));
            }
            if s.cache_len + s.extra.len() + n > g.max_ctx {
                return Err(EngineError::Invalid(format!(
                    "draft context exceeds max_ctx {}",
                    g.max_ctx
                )));
            }
            let exoff = extras.len();
            extras.extend(s.extra.iter().map(|&c| (s.slot * dg.max_cands + c) as i32));
            offs.push(o);
            for i in 0..n {
                let t = o + i;
                let tok = s.tokens[i];
                if tok as usize >= g.vocab {
                    return Err(EngineError::Invalid(format!(
                        "token id {tok} is outside the vocabulary"
                    )));
                }
                ids[t] = tok as i32;
                let m = &mut meta[t * 8..t * 8 + 8];
                m[0] = (s.slot * g.max_ctx) as i32;
                m[1] = s.cache_len as i32;
                m[2] = o as i32;
                m[3] = i as i32;
                m[4] = 0;
                m[5] = s.extra.len() as i32;
                m[6] = exoff as i32;
                m[7] = n as i32;
                let (c, sn) = dd.rope.table(s.positions[i]);
                cos[t * half..(t + 1) * half].copy_from_slice(&c);
                sin[t * half..(t + 1) * half].copy_from_slice(&sn);
            }
            o += n;
        }
        if extras.len() > total * dg.max_extra {
            return Err(EngineError::Invalid(
                "too many draft extras in one pass".into(),
            ));
        }
        write_at(dev, &dd.ids, 0, &ids)?;
        write_at(dev, &dd.meta, 0, &meta)?;
        write_at(dev, &dd.extras, 0, &extras)?;
        write_at(dev, &dd.cos, 0, &cos)?;
        write_at(dev, &dd.sin, 0, &sin)?;
        // hidden input: fc over captured states (3h) or the draft's own (h)
        for (s, &o) in segs.iter().zip(&offs) {
            let n = s.tokens.len();
            if s.hidden_in.len() == n * ncap * h {
                write_at(dev, &dd.hin3, o * ncap * h, &s.hidden_in)?;
                dd.w.fc.run(
                    dev,
                    dd.hin3.ptr_at(o * ncap * h),
                    ncap * h,
                    dd.hid.ptr_at(o * h),
                    h,
                    n,
                    false,
                )?;
            } else if s.hidden_in.len() == n * h {
                write_at(dev, &dd.hid, o * h, &s.hidden_in)?;
            } else {
                return Err(EngineError::Invalid(format!(
                    "draft hidden input has {} values for {n} tokens (expected {}x{h} or {}x{h})",
                    s.hidden_in.len(),
                    n * ncap,
                    n
                )));
            }
        }
        let e = |x: kbench_cuda::Result<()>| x.map_err(EngineError::Cuda);
        let t = total;
        e(ops::embed(
            dev,
            dd.ids.ptr(),
            tw.embed.ptr(),
            g.vocab,
            h,
            dd.e.ptr(),
            h,
            t,
        ))?;
        e(ops::rmsnorm(
            dev,
            dd.e.ptr(),
            h,
            dd.w.in_norm.ptr(),
            dd.xin.ptr(),
            2 * h,
            t,
            h,
            dg.eps,
        ))?;
        e(ops::rmsnorm(
            dev,
            dd.hid.ptr(),
            h,
            dd.w.hidden_norm.ptr(),
            dd.xin.ptr_at(h),
            2 * h,
            t,
            h,
            dg.eps,
        ))?;
        let qw = dg.nh * dg.hd;
        dd.w.q
            .run(dev, dd.xin.ptr(), 2 * h, dd.q.ptr(), qw, t, false)?;
        dd.w.k
            .run(dev, dd.xin.ptr(), 2 * h, dd.k.ptr(), kvw, t, false)?;
        dd.w.v
            .run(dev, dd.xin.ptr(), 2 * h, dd.v.ptr(), kvw, t, false)?;
        e(ops::rope(
            dev,
            dd.q.ptr(),
            t,
            dg.nh,
            qw,
            dg.hd,
            0,
            dg.hd,
            dd.cos.ptr(),
            dd.sin.ptr(),
            false,
        ))?;
        e(ops::rope(
            dev,
            dd.k.ptr(),
            t,
            dg.nkv,
            kvw,
            dg.hd,
            0,
            dg.hd,
            dd.cos.ptr(),
            dd.sin.ptr(),
            false,
        ))?;
        let geom = AttnGeom {
            t,
            heads: dg.nh,
            group: dg.nh / dg.nkv,
            ldq_tok: qw,
            ldq_head: dg.hd,
            dk: dg.hd,
            dv: dg.hd,
            khs: dg.hd,
            ldout_tok: qw,
            ldout_head: dg.hd,
            scale: 1.0 / (dg.hd as f32).sqrt(),
            max_keys: g.max_ctx,
        };
        e(ops::attention(
            dev,
            &geom,
            dd.q.ptr(),
            KvSrc {
                k: dd.cache_k.ptr(),
                v: dd.cache_v.ptr(),
                ld: kvw,
            },
            KvSrc {
                k: dd.pool_k.ptr(),
                v: dd.pool_v.ptr(),
                ld: kvw,
            },
            KvSrc {
                k: dd.k.ptr(),
                v: dd.v.ptr(),
                ld: kvw,
            },
            dd.meta.ptr(),
            dd.mask.ptr(),
            dd.extras.ptr(),
            dd.scores.ptr(),
            dd.attn.ptr(),
        ))?;
        // res = hid + o(attn); post norm; MLP; res += mlp; final norm; lm_head
        dev.copy_d2d(dd.res.ptr(), dd.hid.ptr(), t * h * 4)
            .map_err(EngineError::Cuda)?;
        dd.w.o
            .run(dev, dd.attn.ptr(), qw, dd.normed.ptr(), h, t, false)?;
        e(ops::add(dev, dd.res.ptr(), dd.normed.ptr(), t * h))?;
        e(ops::rmsnorm(
            dev,
            dd.res.ptr(),
            h,
            dd.w.post_norm.ptr(),
            dd.hn.ptr(),
            h,
            t,
            h,
            dg.eps,
        ))?;
        let di = dg.inter;
        dd.w.gate
            .run(dev, dd.hn.ptr(), h, dd.gg.ptr(), di, t, false)?;
        dd.w.up
            .run(dev, dd.hn.ptr(), h, dd.uu.ptr(), di, t, false)?;
        e(ops::silu_mul(
            dev,
            dd.gg.ptr(),
            dd.uu.ptr(),
            dd.act.ptr(),
            t * di,
        ))?;
        dd.w.down
            .run(dev, dd.act.ptr(), di, dd.normed.ptr(), h, t, false)?;
        e(ops::add(dev, dd.res.ptr(), dd.normed.ptr(), t * h))?;
        e(ops::rmsnorm(
            dev,
            dd.res.ptr(),
            h,
            dd.w.norm.ptr(),
            dd.normed.ptr(),
            h,
            t,
            h,
            dg.eps,
        ))?;
        dd.w.lm_head
            .run(dev, dd.normed.ptr(), h, dd.logits.ptr(), dg.dv, t, false)?;
        let logits = read_at(dev, &dd.logits, 0, t * dg.dv)?;
        let aux = read_at(dev, &dd.res, 0, t * h)?;
        Ok(segs
            .iter()
            .zip(&offs)
            .map(|(s, &o)| {
                let n = s.tokens.len();
                GpuDraftOut {
                    logits: logits[o * dg.dv..(o + n) * dg.dv].to_vec(),
                    aux: aux[o * h..(o + n) * h].to_vec(),
                    row0: o,
                }
            })
            .collect())
    }

    /// Appends draft pass rows `[row0, row0+n)` to the draft cache of `slot` at `cache_len`.
    pub fn commit_draft(
        &mut self,
        slot: usize,
        cache_len: usize,
        row0: usize,
        n: usize,
    ) -> Result<()> {
        let g = &self.g;
        let dd = self
            .draft
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("no draft model loaded".into()))?;
        if cache_len + n > g.max_ctx {
            return Err(EngineError::Invalid(format!(
                "draft cache of slot {slot} would exceed max_ctx {}",
                g.max_ctx
            )));
        }
        let kvw = dd.g.kvw();
        let dev = &self.ranks[0].dev;
        let dst = (slot * g.max_ctx + cache_len) * kvw;
        dev.copy_d2d(dd.cache_k.ptr_at(dst), dd.k.ptr_at(row0 * kvw), n * kvw * 4)
            .map_err(EngineError::Cuda)?;
        dev.copy_d2d(dd.cache_v.ptr_at(dst), dd.v.ptr_at(row0 * kvw), n * kvw * 4)
            .map_err(EngineError::Cuda)?;
        Ok(())
    }

    /// Stores draft pass row `row` as candidate `cand` of `slot` in this round's pool.
    pub fn pool_store(&mut self, slot: usize, cand: usize, row: usize) -> Result<()> {
        let dd = self
            .draft
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("no draft model loaded".into()))?;
        if cand >= dd.g.max_cands {
            return Err(EngineError::Invalid(format!(
                "draft candidate {cand} >= pool size {}",
                dd.g.max_cands
            )));
        }
        let kvw = dd.g.kvw();
        let dev = &self.ranks[0].dev;
        let dst = (slot * dd.g.max_cands + cand) * kvw;
        dev.copy_d2d(dd.pool_k.ptr_at(dst), dd.k.ptr_at(row * kvw), kvw * 4)
            .map_err(EngineError::Cuda)?;
        dev.copy_d2d(dd.pool_v.ptr_at(dst), dd.v.ptr_at(row * kvw), kvw * 4)
            .map_err(EngineError::Cuda)?;
        Ok(())
    }

    /// Waits for every rank's stream.
    pub fn sync(&self) -> Result<()> {
        for r in &self.ranks {
            r.dev.sync().map_err(EngineError::Cuda)?;
        }
        Ok(())
    }
}

/// Sum of the ranks' partial outputs (`part`, `[t, h]`) into the residual stream `x`.
fn reduce_add(g: &Geo, ranks: &[Rank], t: usize) -> Result<()> {
    let n = t * g.h;
    if ranks.len() == 1 {
        let r = &ranks[0];
        return ops::add(&r.dev, r.b.x.ptr(), r.b.part.ptr(), n).map_err(EngineError::Cuda);
    }
    // world > 1: BF16 all-reduce (kbench-cuda's TpComm), then add
    for r in ranks {
        ops::to_bf16(&r.dev, r.b.part.ptr(), r.b.partb.ptr(), n).map_err(EngineError::Cuda)?;
    }
    reduce_add_bf16(g, ranks, t)
}

/// The same for partial outputs already in bf16 (`partb`: kbench-cuda's MoE output).
fn reduce_add_bf16(g: &Geo, ranks: &[Rank], t: usize) -> Result<()> {
    let n = t * g.h;
    if ranks.len() > 1 {
        comm::group_start().map_err(EngineError::Cuda)?;
        for r in ranks {
            r.comm
                .all_reduce_bf16(&r.dev, r.b.partb.ptr(), n)
                .map_err(EngineError::Cuda)?;
        }
        comm::group_end().map_err(EngineError::Cuda)?;
    }
    for r in ranks {
        ops::add_bf16(&r.dev, r.b.x.ptr(), r.b.partb.ptr(), n).map_err(EngineError::Cuda)?;
    }
    Ok(())
}

fn tuned_bufs(b: &Bufs) -> Result<&TunedBufs> {
    b.t.as_ref()
        .ok_or_else(|| EngineError::Invalid("tuned kernels without their buffers".into()))
}

/// Tuned kernels: `hn` (f32, `[t, h]`) rounded to bf16 into `hnb` for the linears that read it.
fn hn_to_bf16(g: &Geo, r: &Rank, t: usize) -> Result<()> {
    if !g.tuned {
        return Ok(());
    }
    let tb = tuned_bufs(&r.b)?;
    ops::to_bf16(&r.dev, r.b.hn.ptr(), tb.hnb.ptr(), t * g.h).map_err(EngineError::Cuda)
}

/// y (f32, row stride `ldy`) = lin(hn): exact on the f32 `hn`, tuned on its bf16 copy `hnb`.
fn lin_hn(g: &Geo, r: &Rank, l: &DLin, y: u64, ldy: usize, t: usize) -> Result<()> {
    if g.tuned {
        let tb = tuned_bufs(&r.b)?;
        l.run_tuned(
            &r.dev,
            tb.hnb.ptr(),
            g.h,
            y,
            ldy,
            true,
            t,
            tb.blas(),
            tb.ws(),
        )
    } else {
        l.run(&r.dev, r.b.hn.ptr(), g.h, y, ldy, t, false)
    }
}

/// y (f32) = lin(x) for an f32 input `x` of `m` contiguous rows of `l.inp`; the tuned
/// kernels read a bf16 copy of it in `xb`.
fn lin_f32(g: &Geo, r: &Rank, l: &DLin, x: u64, y: u64, ldy: usize, m: usize) -> Result<()> {
    if g.tuned {
        let tb = tuned_bufs(&r.b)?;
        ops::to_bf16(&r.dev, x, tb.xb.ptr(), m * l.inp).map_err(EngineError::Cuda)?;
        l.run_tuned(
            &r.dev,
            tb.xb.ptr(),
            l.inp,
            y,
            ldy,
            true,
            m,
            tb.blas(),
            tb.ws(),
        )
    } else {
        l.run(&r.dev, x, l.inp, y, ldy, m, false)
    }
}

/// SwiGLU MLP on `hn` over `t` tokens. Exact: f32 into `part` (added to it with `accum`).
/// Tuned: f32 into `part` (`bf16_out` false) or bf16 into the shared-expert buffer `shb`
/// (`bf16_out` true); `accum` is not available there.
fn ffn_fwd(g: &Geo, r: &Rank, f: &DFfn, t: usize, accum: bool, bf16_out: bool) -> Result<()> {
    let (d, b, h) = (&r.dev, &r.b, g.h);
    let il = f.gate.out;
    lin_hn(g, r, &f.gate, b.g.ptr(), il, t)?;
    lin_hn(g, r, &f.up, b.u.ptr(), il, t)?;
    if g.tuned {
        let tb = tuned_bufs(b)?;
        if accum {
            return Err(EngineError::Invalid(
                "tuned MLP cannot accumulate into its output".into(),
            ));
        }
        ops::silu_mul_bf16(d, b.g.ptr(), b.u.ptr(), tb.actb.ptr(), t * il)
            .map_err(EngineError::Cuda)?;
        let (y, y_f32) = if bf16_out {
            (tb.shb.ptr(), false)
        } else {
            (b.part.ptr(), true)
        };
        f.down
            .run_tuned(d, tb.actb.ptr(), il, y, h, y_f32, t, tb.blas(), tb.ws())
    } else {
        ops::silu_mul(d, b.g.ptr(), b.u.ptr(), b.act.ptr(), t * il).map_err(EngineError::Cuda)?;
        f.down.run(d, b.act.ptr(), il, b.part.ptr(), h, t, accum)
    }
}

/// The exact kernels' routed experts: route, per-pair gate / up / down, combine into `part`.
fn moe_exact(
    g: &Geo,
    r: &Rank,
    router: &DLin,
    bias: u64,
    x: &weights::Experts,
    t: usize,
) -> Result<()> {
    let (d, b, h) = (&r.dev, &r.b, g.h);
    let e = |x: kbench_cuda::Result<()>| x.map_err(EngineError::Cuda);
    let route = g
        .route
        .ok_or_else(|| EngineError::Unsupported("MoE layer without router dims".into()))?;
    let (ne, k, mi) = (g.experts, g.top_k, g.moe_inter);
    router.run(d, b.hn.ptr(), h, b.rl.ptr(), ne, t, false)?;
    e(ops::moe_route(
        d,
        &route,
        b.rl.ptr(),
        bias,
        t,
        b.rwork.ptr(),
        b.mids.ptr(),
        b.mwts.ptr(),
    ))?;
    let p = t * k;
    let (int4, (gw, gs), (uw, us), (dw, ds)) = match &x.w {
        ExpertW::Int4 { gate, up, down } => (
            true,
            (gate.0.ptr(), gate.1.ptr()),
            (up.0.ptr(), up.1.ptr()),
            (down.0.ptr(), down.1.ptr()),
        ),
        ExpertW::Bf16 { gate, up, down } => {
            (false, (gate.ptr(), 0), (up.ptr(), 0), (down.ptr(), 0))
        }
        ExpertW::Fused { .. } => {
            return Err(EngineError::Invalid(
                "experts in the fused-MoE layout on the exact kernels".into(),
            ))
        }
    };
    for (w, s, y) in [(gw, gs, b.mg.ptr()), (uw, us, b.mu.ptr())] {
        e(ops::moe_lin(
            d,
            b.hn.ptr(),
            h,
            k,
            b.mids.ptr(),
            x.e0,
            x.eloc,
            int4,
            w,
            s,
            x.group,
            y,
            mi,
            p,
            mi,
            h,
        ))?;
    }
    e(ops::silu_mul(
        d,
        b.mg.ptr(),
        b.mu.ptr(),
        b.mact.ptr(),
        p * mi,
    ))?;
    e(ops::moe_lin(
        d,
        b.mact.ptr(),
        mi,
        1,
        b.mids.ptr(),
        x.e0,
        x.eloc,
        int4,
        dw,
        ds,
        x.group,
        b.my.ptr(),
        h,
        p,
        h,
        mi,
    ))?;
    e(ops::moe_combine(
        d,
        b.my.ptr(),
        b.mwts.ptr(),
        b.part.ptr(),
        t,
        k,
        h,
    ))
}

/// The tuned routed experts (kbench-cuda's `moe_route` + `moe_experts`) plus the shared
/// expert, into `partb` (bf16, `[t, h]`).
fn moe_tuned(
    g: &Geo,
    r: &Rank,
    router: &DLin,
    bias: u64,
    x: &weights::Experts,
    shared: Option<&DFfn>,
    t: usize,
) -> Result<()> {
    let (d, b, h) = (&r.dev, &r.b, g.h);
    let tb = tuned_bufs(b)?;
    let cfg = g
        .moe_cfg
        .ok_or_else(|| EngineError::Unsupported("MoE layer without router dims".into()))?;
    let sc = tb
        .moe
        .as_ref()
        .ok_or_else(|| EngineError::Invalid("tuned MoE without its scratch".into()))?;
    let ExpertW::Fused { w13, s13, w2, s2 } = &x.w else {
        return Err(EngineError::Invalid(
            "tuned MoE over experts not in the fused layout".into(),
        ));
    };
    router.run_tuned(
        d,
        tb.hnb.ptr(),
        h,
        b.rl.ptr(),
        cfg.n_experts,
        true,
        t,
        tb.blas(),
        tb.ws(),
    )?;
    kops::moe_route(d, &cfg, b.rl.ptr(), bias, t, sc).map_err(EngineError::Cuda)?;
    if x.eloc != cfg.n_experts {
        ops::moe_local_ids(
            d,
            sc.ids.ptr(),
            sc.wts.ptr(),
            sc.down.ptr(),
            t * cfg.top_k,
            h,
            x.e0,
            x.eloc,
        )
        .map_err(EngineError::Cuda)?;
    }
    let shared_p = match shared {
        Some(f) => {
            ffn_fwd(g, r, f, t, false, true)?;
            tb.shb.ptr()
        }
        None => 0,
    };
    // this rank's experts only: ids are local after moe_local_ids (or global = local at tp 1)
    let local = MoeConfig {
        n_experts: x.eloc,
        ..cfg
    };
    let w = MoeWeights {
        w13: w13.ptr(),
        s13: s13.ptr(),
        w2: w2.ptr(),
        s2: s2.ptr(),
    };
    kops::moe_experts(
        d,
        &local,
        tb.hnb.ptr(),
        h,
        t,
        &w,
        sc,
        shared_p,
        h,
        b.partb.ptr(),
        h,
    )
    .map_err(EngineError::Cuda)
}

/// The device part of a target pass over `t` tokens whose metadata is already in the
/// buffers; logits for `nrows` rows (`gather`: the rows listed in `rows`, else rows 0..nrows).
/// Only kernel launches, device copies and NCCL calls: graph-capturable (world size 1).
fn device_forward(g: &Geo, ranks: &[Rank], t: usize, nrows: usize, gather: bool) -> Result<()> {
    let h = g.h;
    let hl = g.hl();
    let (qd, width, rank) = (g.qd(), g.width(), g.rank);
    let e = |x: kbench_cuda::Result<()>| x.map_err(EngineError::Cuda);
    for r in ranks {
        e(ops::embed(
            &r.dev,
            r.b.ids.ptr(),
            r.w.embed.ptr(),
            g.vocab,
            h,
            r.b.x.ptr(),
            h,
            t,
        ))?;
    }
    for l in 0..g.layers {
        for r in ranks {
            let (d, b, ly) = (&r.dev, &r.b, &r.w.layers[l]);
            e(ops::rmsnorm(
                d,
                b.x.ptr(),
                h,
                ly.in_norm.ptr(),
                b.hn.ptr(),
                h,
                t,
                h,
                g.eps,
            ))?;
            hn_to_bf16(g, r, t)?;
            match &ly.q {
                DQ::LowRank { a, norm, b: qb } => {
                    let qr = a.out;
                    lin_hn(g, r, a, b.qa.ptr(), qr, t)?;
                    e(ops::rmsnorm(
                        d,
                        b.qa.ptr(),
                        qr,
                        norm.ptr(),
                        b.qa.ptr(),
                        qr,
                        t,
                        qr,
                        g.eps,
                    ))?;
                    lin_f32(g, r, qb, b.qa.ptr(), b.q.ptr(), hl * qd, t)?;
                }
                DQ::Full(q) => lin_hn(g, r, q, b.q.ptr(), hl * qd, t)?,
            }
            let kvl = b.kvnew.ptr_at(l * g.max_tokens * width);
            lin_hn(g, r, &ly.kv_a, kvl, width, t)?;
            e(ops::rmsnorm(
                d,
                kvl,
                width,
                ly.kv_a_norm.ptr(),
                kvl,
                width,
                t,
                rank,
                g.eps,
            ))?;
            e(ops::rope(
                d,
                kvl,
                t,
                1,
                width,
                0,
                rank,
                g.rd,
                b.cos.ptr(),
                b.sin.ptr(),
                true,
            ))?;
            e(ops::rope(
                d,
                b.q.ptr(),
                t,
                hl,
                hl * qd,
                qd,
                g.nope,
                g.rd,
                b.cos.ptr(),
                b.sin.ptr(),
                true,
            ))?;
            e(ops::mla_absorb_q(
                d,
                b.q.ptr(),
                ly.kv_b.ptr(),
                b.qcat.ptr(),
                t,
                hl,
                g.nope,
                g.rd,
                g.vd,
                rank,
            ))?;
            let cache_l = r.cache.ptr_at(l * g.max_batch * g.max_ctx * width);
            let geom = AttnGeom {
                t,
                heads: hl,
                group: hl,
                ldq_tok: hl * width,
                ldq_head: width,
                dk: width,
                dv: rank,
                khs: 0,
                ldout_tok: hl * rank,
                ldout_head: rank,
                scale: g.scale,
                max_keys: g.max_ctx,
            };
            let src = KvSrc {
                k: cache_l,
                v: cache_l,
                ld: width,
            };
            let own = KvSrc {
                k: kvl,
                v: kvl,
                ld: width,
            };
            e(ops::attention(
                d,
                &geom,
                b.qcat.ptr(),
                src,
                src,
                own,
                b.meta.ptr(),
                b.mask.ptr(),
                b.extras.ptr(),
                b.scores.ptr(),
                b.olat.ptr(),
            ))?;
            e(ops::mla_absorb_v(
                d,
                b.olat.ptr(),
                ly.kv_b.ptr(),
                b.ao.ptr(),
                t,
                hl,
                g.nope,
                g.vd,
                rank,
            ))?;
            lin_f32(g, r, &ly.o, b.ao.ptr(), b.part.ptr(), h, t)?;
        }
        reduce_add(g, ranks, t)?;
        // every rank holds the same kind of layer
        let moe_bf16 = g.tuned && matches!(ranks[0].w.layers[l].mlp, DMlp::Moe { .. });
        for r in ranks {
            let (d, b, ly) = (&r.dev, &r.b, &r.w.layers[l]);
            e(ops::rmsnorm(
                d,
                b.x.ptr(),
                h,
                ly.post_norm.ptr(),
                b.hn.ptr(),
                h,
                t,
                h,
                g.eps,
            ))?;
            hn_to_bf16(g, r, t)?;
            match &ly.mlp {
                DMlp::Dense(f) => ffn_fwd(g, r, f, t, false, false)?,
                DMlp::Moe {
                    router,
                    bias,
                    experts: x,
                    shared,
                } => {
                    let bias_p = bias.as_ref().map(|bb| bb.ptr()).unwrap_or(0);
                    if g.tuned {
                        moe_tuned(g, r, router, bias_p, x, shared.as_ref(), t)?;
                    } else {
                        moe_exact(g, r, router, bias_p, x, t)?;
                        if let Some(f) = shared {
                            ffn_fwd(g, r, f, t, true, false)?;
                        }
                    }
                }
            }
        }
        if moe_bf16 {
            reduce_add_bf16(g, ranks, t)?;
        } else {
            reduce_add(g, ranks, t)?;
        }
        for (ci, &cl) in g.capture.iter().enumerate() {
            if cl == l {
                let r = &ranks[0];
                let ncap = g.capture.len();
                e(r.dev.copy2d(
                    r.b.x.ptr(),
                    h * 4,
                    r.b.cap.ptr_at(ci * h),
                    ncap * h * 4,
                    h * 4,
                    t,
                ))?;
            }
        }
    }
    for r in ranks {
        let (d, b) = (&r.dev, &r.b);
        if gather {
            e(ops::gather_rows(
                d,
                b.x.ptr(),
                h,
                b.rows.ptr(),
                b.xr.ptr(),
                h,
                nrows,
                h,
            ))?;
            e(ops::rmsnorm(
                d,
                b.xr.ptr(),
                h,
                r.w.norm.ptr(),
                b.xr.ptr(),
                h,
                nrows,
                h,
                g.eps,
            ))?;
        } else {
            e(ops::rmsnorm(
                d,
                b.x.ptr(),
                h,
                r.w.norm.ptr(),
                b.xr.ptr(),
                h,
                nrows,
                h,
                g.eps,
            ))?;
        }
        lin_f32(
            g,
            r,
            &r.w.lm_head,
            b.xr.ptr(),
            b.logits.ptr(),
            r.w.lm_head.out,
            nrows,
        )?;
    }
    Ok(())
}
