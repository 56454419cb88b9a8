//! Loading a checkpoint's weights onto the GPU(s), sharded for tensor parallelism.
//!
//! Rank `r` of `w` holds: attention heads `[r*H/w, (r+1)*H/w)` (q_b / q_proj rows, kv_b rows,
//! o_proj columns; q_a, kv_a and the norms replicated), the dense MLP's and shared expert's
//! intermediate slice (gate / up rows, down columns), routed experts `[r*E/w, (r+1)*E/w)`
//! (the router is replicated), and a contiguous slice of the vocabulary of lm_head. The token
//! embedding and the latent KV cache are replicated. The EAGLE-3 draft lives on rank 0.

use kbench_core::arch::{DraftArch, ModelArch};
use kbench_cuda::{CudaDevice, DBuf, LinearArgs, Operand};

use super::ops;
use crate::error::{EngineError, Result};
use crate::names::{self, draft, FfnNames, Int4, LayerNames, Proj, TargetNames};
use crate::shapes::{self, DraftShapes, FfnShape, Matrix, TargetShapes};
use crate::st::WeightStore;

/// One linear layer on the device: BF16 `[out, inp]` row-major, as every linear but the
/// routed experts is in the real checkpoints (the experts are stacked in [`Experts`]).
pub(crate) struct DLin {
    pub out: usize,
    pub inp: usize,
    pub w: DBuf<u16>,
}

impl DLin {
    /// y[m, :out] (+)= x[m, :inp] W^T (f32 activations).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        dev: &CudaDevice,
        x: u64,
        ldx: usize,
        y: u64,
        ldy: usize,
        m: usize,
        accum: bool,
    ) -> Result<()> {
        ops::lin_bf16(
            dev,
            x,
            ldx,
            self.w.ptr(),
            y,
            ldy,
            m,
            self.out,
            self.inp,
            accum,
        )
        .map_err(EngineError::Cuda)
    }

    /// y[m, :out] = x[m, :inp] W^T through kbench-cuda's tuned matmuls: `x` bf16 (16-byte
    /// aligned rows, `ldx` a multiple of 8), `y` f32 or bf16; BF16 weights through cuBLAS when
    /// `blas` is given; `ws` the own kernels' split-K workspace.
    #[allow(clippy::too_many_arguments)]
    pub fn run_tuned(
        &self,
        dev: &CudaDevice,
        x: u64,
        ldx: usize,
        y: u64,
        ldy: usize,
        y_f32: bool,
        m: usize,
        blas: Option<&kbench_cuda::Blas>,
        ws: kbench_cuda::ops::Workspace,
    ) -> Result<()> {
        kbench_cuda::Linear::pick(blas, ws)
            .run(
                dev,
                LinearArgs {
                    x: Operand::matrix(x, ldx),
                    w: Operand::matrix(self.w.ptr(), self.inp),
                    y: Operand::matrix(y, ldy),
                    y_f32,
                    m,
                    n: self.out,
                    k: self.inp,
                    batch: 1,
                },
            )
            .map_err(EngineError::Cuda)
    }
}

pub(crate) struct DFfn {
    pub gate: DLin,
    pub up: DLin,
    pub down: DLin,
}

/// This rank's routed experts `[e0, e0 + eloc)`, stacked per layer.
pub(crate) struct Experts {
    pub e0: usize,
    pub eloc: usize,
    pub group: usize,
    pub w: ExpertW,
}

pub(crate) enum ExpertW {
    /// Exact kernels: gate / up `[eloc, mi, h]`, down `[eloc, h, mi]`, each INT4 (packed
    /// words + bf16 scales) or BF16.
    Int4 {
        gate: (DBuf<u32>, DBuf<u16>),
        up: (DBuf<u32>, DBuf<u16>),
        down: (DBuf<u32>, DBuf<u16>),
    },
    Bf16 {
        gate: DBuf<u16>,
        up: DBuf<u16>,
        down: DBuf<u16>,
    },
    /// Tuned kernels (kbench-cuda's `MoeWeights`): W13 `[eloc, 2 mi, h/8]` with each expert's
    /// gate rows then its up rows, S13 `[eloc, 2 mi, h/32]`, W2 `[eloc, h, mi/8]`, S2
    /// `[eloc, h, mi/32]`; group 32.
    Fused {
        w13: DBuf<u32>,
        s13: DBuf<u16>,
        w2: DBuf<u32>,
        s2: DBuf<u16>,
    },
}

/// Both payloads boxed: a MoE layer's handles are several times a dense MLP's, and each is
/// reached once per layer per pass, so the indirection costs nothing.
pub(crate) enum DMlp {
    Dense(Box<DFfn>),
    Moe(Box<DMoe>),
}

pub(crate) struct DMoe {
    pub router: DLin,
    pub bias: Option<DBuf<f32>>,
    pub experts: Experts,
    pub shared: Option<DFfn>,
}

pub(crate) enum DQ {
    LowRank { a: DLin, norm: DBuf<f32>, b: DLin },
    Full(DLin),
}

pub(crate) struct DLayer {
    pub in_norm: DBuf<f32>,
    pub post_norm: DBuf<f32>,
    pub q: DQ,
    pub kv_a: DLin,
    pub kv_a_norm: DBuf<f32>,
    /// kv_b rows of this rank's heads: `[hl * (nope + vd), rank]`.
    pub kv_b: DBuf<u16>,
    pub o: DLin,
    pub mlp: DMlp,
}

pub(crate) struct RankWeights {
    pub embed: DBuf<u16>,
    pub layers: Vec<DLayer>,
    pub norm: DBuf<f32>,
    pub lm_head: DLin,
    /// This rank's vocabulary slice `[v0, v0 + lm_head.out)`.
    pub v0: usize,
}

/// The draft head on rank 0.
pub(crate) struct DraftWeights {
    pub fc: DLin,
    pub in_norm: DBuf<f32>,
    pub hidden_norm: DBuf<f32>,
    pub q: DLin,
    pub k: DLin,
    pub v: DLin,
    pub o: DLin,
    pub post_norm: DBuf<f32>,
    pub gate: DLin,
    pub up: DLin,
    pub down: DLin,
    pub norm: DBuf<f32>,
    pub lm_head: DLin,
}

/// Even split of `n` over `w` ranks; errors when it does not divide.
pub(crate) fn split(n: usize, w: usize, r: usize, what: &str) -> Result<(usize, usize)> {
    if n % w != 0 {
        return Err(EngineError::Unsupported(format!(
            "tensor parallel size {w} does not divide {what} ({n})"
        )));
    }
    Ok((r * n / w, n / w))
}

/// Vocabulary slice of rank `r` (the last ranks may hold one row fewer).
pub(crate) fn vocab_slice(v: usize, w: usize, r: usize) -> (usize, usize) {
    let base = v / w;
    let extra = v % w;
    let start = r * base + r.min(extra);
    (start, base + usize::from(r < extra))
}

fn up16(dev: &CudaDevice, v: &[u16]) -> Result<DBuf<u16>> {
    dev.upload(v).map_err(EngineError::Cuda)
}

fn upf(dev: &CudaDevice, v: &[f32]) -> Result<DBuf<f32>> {
    dev.upload(v).map_err(EngineError::Cuda)
}

fn rows<T: Copy>(all: &[T], inp: usize, r0: usize, n: usize) -> Vec<T> {
    all[r0 * inp..(r0 + n) * inp].to_vec()
}

fn cols<T: Copy>(all: &[T], out: usize, inp: usize, c0: usize, n: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(out * n);
    for r in 0..out {
        v.extend_from_slice(&all[r * inp + c0..r * inp + c0 + n]);
    }
    v
}

/// BF16 linear `name.weight` `[out, inp]`, rows `[r0, r0+nr)` and columns `[c0, c0+nc)`
/// (each range as (first, count), as [`split`] gives a rank's share).
fn lin_slice(
    dev: &CudaDevice,
    ws: &WeightStore,
    name: &str,
    [out, inp]: Matrix,
    (r0, nr): (usize, usize),
    (c0, nc): (usize, usize),
) -> Result<DLin> {
    let w = ws.bf16s(&names::weight(name), &[out, inp])?;
    let all = w.as_slice();
    let v = if nc == inp {
        rows(all, inp, r0, nr)
    } else {
        cols(&rows(all, inp, r0, nr), nr, inp, c0, nc)
    };
    Ok(DLin {
        out: nr,
        inp: nc,
        w: up16(dev, &v)?,
    })
}

fn lin_full(dev: &CudaDevice, ws: &WeightStore, name: &str, shape: Matrix) -> Result<DLin> {
    let [out, inp] = shape;
    lin_slice(dev, ws, name, shape, (0, out), (0, inp))
}

fn norm(dev: &CudaDevice, ws: &WeightStore, name: &str, n: usize) -> Result<DBuf<f32>> {
    upf(dev, &ws.f32s(&names::weight(name), &[n])?)
}

fn ffn(
    dev: &CudaDevice,
    ws: &WeightStore,
    ffn: &FfnNames,
    shape: FfnShape,
    w: usize,
    r: usize,
) -> Result<DFfn> {
    let h = shape.hidden;
    let (i0, il) = split(
        shape.inter,
        w,
        r,
        &format!("{} intermediate size", ffn.base()),
    )?;
    // this rank's rows of gate / up and columns of down; all of the hidden side
    let (part, whole) = ((i0, il), (0, h));
    Ok(DFfn {
        gate: lin_slice(dev, ws, &ffn.gate(), shape.proj(Proj::Gate), part, whole)?,
        up: lin_slice(dev, ws, &ffn.up(), shape.proj(Proj::Up), part, whole)?,
        down: lin_slice(dev, ws, &ffn.down(), shape.proj(Proj::Down), whole, part)?,
    })
}

/// Copies expert `e`'s packed words `[out, inp/8]` and scales `[out, inp/group]` of
/// `proj` to element offsets `qoff` / `soff` of the stacks `q` / `s`.
fn put_int4(
    dev: &CudaDevice,
    ws: &WeightStore,
    name: &str,
    shape: Matrix,
    group: usize,
    (q, qoff): (&DBuf<u32>, usize),
    (s, soff): (&DBuf<u16>, usize),
) -> Result<()> {
    let (packed, scales) = (
        shapes::int4_packed(shape),
        shapes::int4_scales(shape, group),
    );
    let (nq, ns) = (packed[0] * packed[1], scales[0] * scales[1]);
    let wq = ws.words(&Int4::packed(name), &packed)?;
    let sc = ws.bf16s(&Int4::scale(name), &scales)?;
    let tq = dev.upload(wq.as_slice()).map_err(EngineError::Cuda)?;
    let ts = dev.upload(sc.as_slice()).map_err(EngineError::Cuda)?;
    dev.copy_d2d(q.ptr_at(qoff), tq.ptr(), nq * 4)
        .map_err(EngineError::Cuda)?;
    dev.copy_d2d(s.ptr_at(soff), ts.ptr(), ns * 2)
        .map_err(EngineError::Cuda)
}

/// Stacks one INT4 projection of the local experts: `[eloc, out, inp/8]` + scales.
fn stack_int4(
    dev: &CudaDevice,
    ws: &WeightStore,
    layer: &LayerNames,
    proj: Proj,
    (e0, eloc): (usize, usize),
    expert: FfnShape,
    group: usize,
) -> Result<(DBuf<u32>, DBuf<u16>)> {
    let shape = expert.proj(proj);
    let [out, inp] = shape;
    let (nq, ns) = (out * inp / 8, out * inp / group);
    let q = dev.alloc::<u32>(eloc * nq).map_err(EngineError::Cuda)?;
    let s = dev.alloc::<u16>(eloc * ns).map_err(EngineError::Cuda)?;
    for j in 0..eloc {
        let name = layer.expert(e0 + j).proj(proj);
        put_int4(dev, ws, &name, shape, group, (&q, j * nq), (&s, j * ns))?;
    }
    Ok((q, s))
}

/// Stacks one BF16 projection of the local experts: `[eloc, out, inp]`.
fn stack_bf16(
    dev: &CudaDevice,
    ws: &WeightStore,
    layer: &LayerNames,
    proj: Proj,
    (e0, eloc): (usize, usize),
    expert: FfnShape,
) -> Result<DBuf<u16>> {
    let [out, inp] = expert.proj(proj);
    let n = out * inp;
    let b = dev.alloc::<u16>(eloc * n).map_err(EngineError::Cuda)?;
    for j in 0..eloc {
        let name = names::weight(&layer.expert(e0 + j).proj(proj));
        let t = dev
            .upload(ws.bf16s(&name, &[out, inp])?.as_slice())
            .map_err(EngineError::Cuda)?;
        dev.copy_d2d(b.ptr_at(j * n), t.ptr(), n * 2)
            .map_err(EngineError::Cuda)?;
    }
    Ok(b)
}

/// The local experts in kbench-cuda's fused-MoE layout: each expert's gate rows followed by
/// its up rows (W13 / S13), and down (W2 / S2) as stacked by [`stack_int4`].
fn stack_fused(
    dev: &CudaDevice,
    ws: &WeightStore,
    layer: &LayerNames,
    (e0, eloc): (usize, usize),
    expert: FfnShape,
    group: usize,
) -> Result<ExpertW> {
    let (mi, h) = (expert.inter, expert.hidden);
    let gate_up = expert.proj(Proj::Gate);
    // one projection of one expert: [mi, h/8] words and [mi, h/group] scales
    let (nq, ns) = (mi * h / 8, mi * h / group);
    let w13 = dev.alloc::<u32>(eloc * 2 * nq).map_err(EngineError::Cuda)?;
    let s13 = dev.alloc::<u16>(eloc * 2 * ns).map_err(EngineError::Cuda)?;
    for j in 0..eloc {
        let ep = layer.expert(e0 + j);
        let (q0, s0) = (j * 2 * nq, j * 2 * ns);
        put_int4(dev, ws, &ep.gate(), gate_up, group, (&w13, q0), (&s13, s0))?;
        put_int4(
            dev,
            ws,
            &ep.up(),
            gate_up,
            group,
            (&w13, q0 + nq),
            (&s13, s0 + ns),
        )?;
    }
    let (w2, s2) = stack_int4(dev, ws, layer, Proj::Down, (e0, eloc), expert, group)?;
    Ok(ExpertW::Fused { w13, s13, w2, s2 })
}

/// The target weights of rank `r` of `w`; `fused_experts`: routed experts in the tuned
/// kernels' layout ([`ExpertW::Fused`]; the caller has checked that they are INT4 group 32).
pub(crate) fn load_rank(
    dev: &CudaDevice,
    arch: &ModelArch,
    ws: &WeightStore,
    w: usize,
    r: usize,
    fused_experts: bool,
) -> Result<RankWeights> {
    let s = TargetShapes::new(arch)?;
    let (h, heads, vocab, group) = (s.hidden, s.heads, s.vocab, s.group);
    let (qd, kvd, vd) = (s.qk_head(), s.nope + s.v_head, s.v_head);
    let names = TargetNames::new(&arch.tensor_prefix);
    let (h0, hl) = split(heads, w, r, "attention heads")?;
    let embed_w = ws.bf16s(&names.embed(), &s.embed())?;
    let embed = up16(dev, embed_w.as_slice())?;
    let mut layers = Vec::with_capacity(arch.num_layers as usize);
    for l in 0..arch.num_layers {
        let ln = names.layer(l as usize);
        let q = match s.q_low_rank() {
            Some((a, b)) => {
                let qr = a[0];
                DQ::LowRank {
                    a: lin_full(dev, ws, &ln.q_a(), a)?,
                    norm: norm(dev, ws, &ln.q_a_norm(), qr)?,
                    b: lin_slice(dev, ws, &ln.q_b(), b, (h0 * qd, hl * qd), (0, qr))?,
                }
            }
            None => DQ::Full(lin_slice(
                dev,
                ws,
                &ln.q(),
                s.q_full(),
                (h0 * qd, hl * qd),
                (0, h),
            )?),
        };
        let kvb_all = ws.bf16s(&names::weight(&ln.kv_b()), &s.kv_b())?;
        let kv_b = up16(
            dev,
            &rows(kvb_all.as_slice(), s.kv_lora_rank, h0 * kvd, hl * kvd),
        )?;
        let mlp = if arch.is_moe_layer(l) {
            let d = arch
                .moe
                .clone()
                .ok_or_else(|| EngineError::Unsupported("MoE dims missing".into()))?;
            let ms = s.moe()?;
            let (e, mi) = (ms.experts, ms.expert.inter);
            let bias_name = ln.router_bias();
            let bias = if ws.contains(&bias_name) {
                Some(upf(dev, &ws.f32s(&bias_name, &[e])?)?)
            } else if d.topk_method == "noaux_tc" {
                return Err(EngineError::MissingTensor {
                    name: bias_name,
                    dir: ws.dir.clone(),
                });
            } else {
                None
            };
            let (e0, eloc) = split(e, w, r, "routed experts")?;
            let int4 = ws.contains(&Int4::packed(&ln.expert(0).gate()));
            if int4 && (h % group != 0 || mi % group != 0 || group % 8 != 0) {
                return Err(EngineError::Unsupported(format!(
                    "INT4 experts: hidden {h} / moe_inter {mi} not multiples of group {group}"
                )));
            }
            let ew = if fused_experts {
                if !int4 || group != 32 {
                    return Err(EngineError::Unsupported(format!(
                        "the fused MoE takes INT4 group-32 experts (int4 {int4}, group {group})"
                    )));
                }
                stack_fused(dev, ws, &ln, (e0, eloc), ms.expert, group)?
            } else if int4 {
                ExpertW::Int4 {
                    gate: stack_int4(dev, ws, &ln, Proj::Gate, (e0, eloc), ms.expert, group)?,
                    up: stack_int4(dev, ws, &ln, Proj::Up, (e0, eloc), ms.expert, group)?,
                    down: stack_int4(dev, ws, &ln, Proj::Down, (e0, eloc), ms.expert, group)?,
                }
            } else {
                ExpertW::Bf16 {
                    gate: stack_bf16(dev, ws, &ln, Proj::Gate, (e0, eloc), ms.expert)?,
                    up: stack_bf16(dev, ws, &ln, Proj::Up, (e0, eloc), ms.expert)?,
                    down: stack_bf16(dev, ws, &ln, Proj::Down, (e0, eloc), ms.expert)?,
                }
            };
            let shared = match ms.shared {
                Some(ss) => Some(ffn(dev, ws, &ln.shared_experts(), ss, w, r)?),
                None => None,
            };
            DMlp::Moe(Box::new(DMoe {
                router: lin_full(dev, ws, &ln.router(), ms.router())?,
                bias,
                experts: Experts {
                    e0,
                    eloc,
                    group,
                    w: ew,
                },
                shared,
            }))
        } else {
            DMlp::Dense(Box::new(ffn(dev, ws, &ln.dense_mlp(), s.dense, w, r)?))
        };
        layers.push(DLayer {
            in_norm: norm(dev, ws, &ln.input_norm(), h)?,
            post_norm: norm(dev, ws, &ln.post_attention_norm(), h)?,
            q,
            kv_a: lin_full(dev, ws, &ln.kv_a(), s.kv_a())?,
            kv_a_norm: norm(dev, ws, &ln.kv_a_norm(), s.kv_lora_rank)?,
            kv_b,
            o: lin_slice(dev, ws, &ln.o(), s.o(), (0, h), (h0 * vd, hl * vd))?,
            mlp,
        });
    }
    let (v0, vl) = vocab_slice(vocab, w, r);
    let lm_head = if arch.tie_word_embeddings && !ws.contains(&names::weight(&names.lm_head())) {
        DLin {
            out: vl,
            inp: h,
            w: up16(dev, &rows(embed_w.as_slice(), h, v0, vl))?,
        }
    } else {
        lin_slice(dev, ws, &names.lm_head(), s.lm_head(), (v0, vl), (0, h))?
    };
    Ok(RankWeights {
        embed,
        layers,
        norm: norm(dev, ws, &names.final_norm(), h)?,
        lm_head,
        v0,
    })
}

/// The EAGLE-3 head (same tensor names as the CPU's draft.rs) and its d2t map.
pub(crate) fn load_draft(
    dev: &CudaDevice,
    arch: &DraftArch,
    ws: &WeightStore,
    target_vocab: usize,
) -> Result<(DraftWeights, Vec<u32>)> {
    let s = DraftShapes::new(arch)?;
    let h = s.hidden;
    let d2t = crate::draft::read_d2t(ws, s.draft_vocab, target_vocab)?;
    let w = DraftWeights {
        fc: lin_full(dev, ws, draft::FC, s.fc())?,
        in_norm: norm(dev, ws, draft::INPUT_NORM, h)?,
        hidden_norm: norm(dev, ws, draft::HIDDEN_NORM, h)?,
        q: lin_full(dev, ws, draft::Q, s.q())?,
        k: lin_full(dev, ws, draft::K, s.kv())?,
        v: lin_full(dev, ws, draft::V, s.kv())?,
        o: lin_full(dev, ws, draft::O, s.o())?,
        post_norm: norm(dev, ws, draft::POST_ATTENTION_NORM, h)?,
        gate: lin_full(dev, ws, draft::GATE, s.ffn.proj(Proj::Gate))?,
        up: lin_full(dev, ws, draft::UP, s.ffn.proj(Proj::Up))?,
        down: lin_full(dev, ws, draft::DOWN, s.ffn.proj(Proj::Down))?,
        norm: norm(dev, ws, draft::FINAL_NORM, h)?,
        lm_head: lin_full(dev, ws, draft::LM_HEAD, s.lm_head())?,
    };
    Ok((w, d2t))
}
