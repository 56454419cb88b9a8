//! The target model: DeepSeek-V3 / Kimi-K2 architecture (MLA attention, sigmoid-routed MoE
//! with shared experts, first-k dense layers), CPU reference forward in f32 over BF16 and
//! INT4 weights.

use rayon::prelude::*;

use kbench_core::arch::{ArchFamily, ModelArch, MoeDims};

use crate::error::{EngineError, Result};
use crate::linalg::{rms_norm, rms_norm_to, swiglu, Linear, Weight};
use crate::names::{self, FfnNames, Int4, Proj, TargetNames};
use crate::rope::{mla_softmax_scale, Rope};
use crate::shapes::{self, FfnShape, Matrix, TargetShapes};
use crate::st::{Slice, WeightStore};
use kbench_numerics::bf16;

#[derive(Debug, Clone)]
enum QProj {
    LowRank {
        a: Linear,
        norm: Vec<f32>,
        b: Linear,
    },
    Full(Linear),
}

#[derive(Debug, Clone)]
struct Mla {
    q: QProj,
    kv_a: Linear,
    kv_a_norm: Vec<f32>,
    /// kv_b_proj `[H * (nope + v), kv_lora_rank]`, BF16: W_UK and W_UV per head.
    kv_b: Slice<u16>,
    o: Linear,
}

#[derive(Debug, Clone)]
pub(crate) struct Ffn {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Ffn {
    fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        swiglu(&self.gate, &self.up, &self.down, x, m)
    }
}

#[derive(Debug, Clone)]
struct Moe {
    dims: MoeDims,
    router: Linear,
    bias: Option<Vec<f32>>,
    experts: Vec<Ffn>,
    shared: Option<Ffn>,
}

#[derive(Debug, Clone)]
enum Mlp {
    Dense(Box<Ffn>),
    Moe(Box<Moe>),
}

#[derive(Debug, Clone)]
struct Layer {
    in_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn: Mla,
    mlp: Mlp,
}

/// Attention mode: naive (materialise K and V per head) or absorbed (attend in the latent
/// space; what the serving path uses). Both give the same result up to rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlaMode {
    Absorbed,
    Naive,
}

/// The latent KV cache of one sequence: per layer, `kv_lora_rank + rope_dim` floats per token.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    pub layers: Vec<Vec<f32>>,
    pub len: usize,
}

impl KvCache {
    pub fn new(num_layers: usize) -> KvCache {
        KvCache {
            layers: vec![Vec::new(); num_layers],
            len: 0,
        }
    }

    /// Appends entries `which` (in order) of a pass's per-layer `[n, width]` KV rows.
    pub fn append(&mut self, kv: &[Vec<f32>], which: &[usize], width: usize) {
        for (l, layer) in self.layers.iter_mut().enumerate() {
            for &i in which {
                layer.extend_from_slice(&kv[l][i * width..(i + 1) * width]);
            }
        }
        self.len += which.len();
    }
}

/// Which earlier tokens of its segment each token attends to (besides the whole cache).
#[derive(Debug, Clone)]
pub enum Attend {
    /// Token i attends to tokens 0..=i.
    Causal,
    /// Token i attends to the listed segment tokens (ascending, itself included): its tree
    /// ancestors.
    Tree(Vec<Vec<usize>>),
}

impl Attend {
    fn keys(&self, i: usize) -> Vec<usize> {
        match self {
            Attend::Causal => (0..=i).collect(),
            Attend::Tree(a) => a[i].clone(),
        }
    }
}

/// One sequence's tokens in a batched forward pass.
#[derive(Debug, Clone)]
pub struct Segment<'a> {
    pub cache: &'a KvCache,
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub attend: Attend,
    /// Compute logits for every token (verify) or only the last (prefill).
    pub all_logits: bool,
}

#[derive(Debug, Clone)]
pub struct SegmentOut {
    /// `[n or 1, vocab]`.
    pub logits: Vec<f32>,
    /// Per layer, `[n, kv_width]`: the latent KV entries of this segment's tokens.
    pub kv: Vec<Vec<f32>>,
    /// `[n, 3 * hidden]`: outputs of the EAGLE-3 capture layers, concatenated.
    pub captured: Vec<f32>,
}

impl SegmentOut {
    /// Appends the KV entries of the given segment tokens (in order) to `cache`.
    pub fn commit(&self, cache: &mut KvCache, which: &[usize], width: usize) {
        cache.append(&self.kv, which, width);
    }
}

#[derive(Debug, Clone)]
pub struct Target {
    pub arch: ModelArch,
    embed: Slice<u16>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Linear,
    rope: Rope,
    softmax_scale: f32,
    pub hidden: usize,
    pub vocab: usize,
    heads: usize,
    nope: usize,
    rope_dim: usize,
    vdim: usize,
    rank: usize,
    eps: f32,
    /// Layers whose outputs EAGLE-3 captures (set by the draft; default SGLang's choice).
    pub capture_layers: Vec<usize>,
}

fn lin(ws: &WeightStore, name: &str, [out, inp]: Matrix) -> Result<Linear> {
    Ok(Linear::bf16(
        out,
        inp,
        ws.bf16s(&names::weight(name), &[out, inp])?,
    ))
}

/// A linear that is INT4 compressed-tensors when `name.weight_packed` exists, else BF16.
fn lin_q(ws: &WeightStore, name: &str, shape: Matrix, group: usize) -> Result<Linear> {
    let packed_name = Int4::packed(name);
    if !ws.contains(&packed_name) {
        return lin(ws, name, shape);
    }
    let [out, inp] = shape;
    if inp % group != 0 || group % 32 != 0 {
        return Err(EngineError::Unsupported(format!(
            "{name}: INT4 needs the input dim ({inp}) to be a multiple of the group size ({group}), itself a multiple of 32"
        )));
    }
    let packed = ws.words(&packed_name, &shapes::int4_packed(shape))?;
    let scales = ws.bf16s(&Int4::scale(name), &shapes::int4_scales(shape, group))?;
    let shape_name = Int4::shape(name);
    if ws.contains(&shape_name) {
        let (_, s) = ws.ints(&shape_name)?;
        if s != [out as i64, inp as i64] {
            return Err(EngineError::ConfigMismatch(format!(
                "{shape_name} is {s:?} but the config implies [{out}, {inp}]"
            )));
        }
    }
    Ok(Linear {
        out,
        inp,
        w: Weight::Int4 {
            packed,
            scales,
            group,
        },
    })
}

fn norm_w(ws: &WeightStore, name: &str, n: usize) -> Result<Vec<f32>> {
    ws.f32s(&names::weight(name), &[n])
}

fn ffn(ws: &WeightStore, names: &FfnNames, shape: FfnShape) -> Result<Ffn> {
    Ok(Ffn {
        gate: lin(ws, &names.gate(), shape.proj(Proj::Gate))?,
        up: lin(ws, &names.up(), shape.proj(Proj::Up))?,
        down: lin(ws, &names.down(), shape.proj(Proj::Down))?,
    })
}

impl Target {
    pub fn load(arch: &ModelArch, ws: &WeightStore) -> Result<Target> {
        if arch.family != ArchFamily::MlaMoe {
            return Err(EngineError::Unsupported(format!(
                "the engine runs DeepSeek-V3 / Kimi-K2 (MLA + MoE) targets; `{}` is a {:?} model",
                arch.model_type, arch.family
            )));
        }
        let s = TargetShapes::new(arch)?;
        let (h, heads, vocab, group) = (s.hidden, s.heads, s.vocab, s.group);
        let names = TargetNames::new(&arch.tensor_prefix);
        let embed = ws.bf16s(&names.embed(), &s.embed())?;
        let mut layers = Vec::with_capacity(arch.num_layers as usize);
        for l in 0..arch.num_layers {
            let ln = names.layer(l as usize);
            let q = match s.q_low_rank() {
                Some((a, b)) => QProj::LowRank {
                    a: lin(ws, &ln.q_a(), a)?,
                    norm: norm_w(ws, &ln.q_a_norm(), a[0])?,
                    b: lin(ws, &ln.q_b(), b)?,
                },
                None => QProj::Full(lin(ws, &ln.q(), s.q_full())?),
            };
            let attn = Mla {
                q,
                kv_a: lin(ws, &ln.kv_a(), s.kv_a())?,
                kv_a_norm: norm_w(ws, &ln.kv_a_norm(), s.kv_lora_rank)?,
                kv_b: ws.bf16s(&names::weight(&ln.kv_b()), &s.kv_b())?,
                o: lin(ws, &ln.o(), s.o())?,
            };
            let mlp = if arch.is_moe_layer(l) {
                let d = arch
                    .moe
                    .clone()
                    .ok_or_else(|| EngineError::Unsupported("MoE dims missing".into()))?;
                let ms = s.moe()?;
                let e = ms.experts;
                let bias_name = ln.router_bias();
                let bias = if ws.contains(&bias_name) {
                    Some(ws.f32s(&bias_name, &[e])?)
                } else if d.topk_method == "noaux_tc" {
                    return Err(EngineError::MissingTensor {
                        name: bias_name,
                        dir: ws.dir.clone(),
                    });
                } else {
                    None
                };
                let mut experts = Vec::with_capacity(e);
                for x in 0..e {
                    let ep = ln.expert(x);
                    experts.push(Ffn {
                        gate: lin_q(ws, &ep.gate(), ms.expert.proj(Proj::Gate), group)?,
                        up: lin_q(ws, &ep.up(), ms.expert.proj(Proj::Up), group)?,
                        down: lin_q(ws, &ep.down(), ms.expert.proj(Proj::Down), group)?,
                    });
                }
                let shared = match ms.shared {
                    Some(ss) => Some(ffn(ws, &ln.shared_experts(), ss)?),
                    None => None,
                };
                if d.num_experts_per_tok as usize > e
                    || d.n_group == 0
                    || e % d.n_group as usize != 0
                {
                    return Err(EngineError::ConfigMismatch(format!(
                        "router: {} experts per token, {} experts in {} groups",
                        d.num_experts_per_tok, e, d.n_group
                    )));
                }
                Mlp::Moe(Box::new(Moe {
                    router: lin(ws, &ln.router(), ms.router())?,
                    dims: d,
                    bias,
                    experts,
                    shared,
                }))
            } else {
                Mlp::Dense(Box::new(ffn(ws, &ln.dense_mlp(), s.dense)?))
            };
            layers.push(Layer {
                in_norm: norm_w(ws, &ln.input_norm(), h)?,
                post_norm: norm_w(ws, &ln.post_attention_norm(), h)?,
                attn,
                mlp,
            });
        }
        let lm_head = if arch.tie_word_embeddings && !ws.contains(&names::weight(&names.lm_head()))
        {
            Linear::bf16(vocab, h, embed.clone())
        } else {
            lin(ws, &names.lm_head(), s.lm_head())?
        };
        let (nope, rd, vd, rank) = (s.nope, s.rope, s.v_head, s.kv_lora_rank);
        let softmax_scale = mla_softmax_scale(nope + rd, arch.rope_scaling.as_ref());
        Ok(Target {
            embed,
            layers,
            norm: norm_w(ws, &names.final_norm(), h)?,
            lm_head,
            rope: Rope::new(rd, arch.rope_theta, arch.rope_scaling.as_ref(), true),
            softmax_scale: softmax_scale as f32,
            hidden: h,
            vocab,
            heads,
            nope,
            rope_dim: rd,
            vdim: vd,
            rank,
            eps: arch.rms_norm_eps as f32,
            capture_layers: arch
                .eagle3_capture_layer_outputs()
                .iter()
                .map(|&x| x as usize)
                .collect(),
            arch: arch.clone(),
        })
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Floats per token per layer in the latent cache.
    pub fn kv_width(&self) -> usize {
        self.rank + self.rope_dim
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }

    /// The target's token embedding (shared with the draft), as f32.
    pub fn embed(&self, token: u32) -> Vec<f32> {
        let h = self.hidden;
        let row = &self.embed.as_slice()[token as usize * h..(token as usize + 1) * h];
        row.iter().map(|&b| bf16::to_f32(b)).collect()
    }

    pub fn forward(&self, segs: &[Segment<'_>]) -> Result<Vec<SegmentOut>> {
        self.forward_mode(segs, MlaMode::Absorbed)
    }

    /// One batched forward pass over every segment's tokens.
    pub fn forward_mode(&self, segs: &[Segment<'_>], mode: MlaMode) -> Result<Vec<SegmentOut>> {
        let h = self.hidden;
        let mut offsets = Vec::with_capacity(segs.len() + 1);
        let mut total = 0;
        for s in segs {
            if s.tokens.len() != s.positions.len() {
                return Err(EngineError::Invalid(
                    "segment tokens and positions differ in length".into(),
                ));
            }
            if let Attend::Tree(a) = &s.attend {
                if a.len() != s.tokens.len() {
                    return Err(EngineError::Invalid(
                        "tree mask size differs from the token count".into(),
                    ));
                }
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= self.vocab) {
                return Err(EngineError::Invalid(format!(
                    "token id {t} is outside the vocabulary of {}",
                    self.vocab
                )));
            }
            offsets.push(total);
            total += s.tokens.len();
        }
        offsets.push(total);
        let mut x = Vec::with_capacity(total * h);
        for s in segs {
            for &t in &s.tokens {
                x.extend(self.embed(t));
            }
        }
        // RoPE tables per token.
        let tables: Vec<(Vec<f32>, Vec<f32>)> = segs
            .iter()
            .flat_map(|s| s.positions.iter().map(|&p| self.rope.table(p)))
            .collect();
        let width = self.kv_width();
        let mut kv_out: Vec<Vec<Vec<f32>>> = segs
            .iter()
            .map(|_| Vec::with_capacity(self.layers.len()))
            .collect();
        let ncap = self.capture_layers.len();
        let mut captured = vec![0f32; total * ncap * h];
        for (li, layer) in self.layers.iter().enumerate() {
            let hn = rms_norm_to(&x, &layer.in_norm, self.eps);
            let (attn_out, kv) = self.attention(li, &hn, &tables, segs, &offsets, mode);
            for (si, _) in segs.iter().enumerate() {
                kv_out[si].push(kv[offsets[si] * width..offsets[si + 1] * width].to_vec());
            }
            for (a, b) in x.iter_mut().zip(&attn_out) {
                *a += b;
            }
            let hn2 = rms_norm_to(&x, &layer.post_norm, self.eps);
            let mlp_out = match &layer.mlp {
                Mlp::Dense(f) => f.forward(&hn2, total),
                Mlp::Moe(m) => self.moe(m, &hn2, total),
            };
            for (a, b) in x.iter_mut().zip(&mlp_out) {
                *a += b;
            }
            for (ci, &cl) in self.capture_layers.iter().enumerate() {
                if cl == li {
                    for t in 0..total {
                        captured[(t * ncap + ci) * h..(t * ncap + ci + 1) * h]
                            .copy_from_slice(&x[t * h..(t + 1) * h]);
                    }
                }
            }
        }
        // Final norm + lm_head on the rows that need logits, in one matmul.
        let mut rows = Vec::new();
        for (si, s) in segs.iter().enumerate() {
            let n = s.tokens.len();
            if s.all_logits {
                rows.extend(offsets[si]..offsets[si] + n);
            } else if n > 0 {
                rows.push(offsets[si] + n - 1);
            }
        }
        let mut xr = Vec::with_capacity(rows.len() * h);
        for &r in &rows {
            xr.extend_from_slice(&x[r * h..(r + 1) * h]);
        }
        rms_norm(&mut xr, &self.norm, self.eps);
        let logits = self.lm_head.forward(&xr, rows.len());
        let v = self.vocab;
        let mut out = Vec::with_capacity(segs.len());
        let mut row_cursor = 0;
        for (si, s) in segs.iter().enumerate() {
            let n = s.tokens.len();
            let nl = if s.all_logits { n } else { n.min(1) };
            out.push(SegmentOut {
                logits: logits[row_cursor * v..(row_cursor + nl) * v].to_vec(),
                kv: std::mem::take(&mut kv_out[si]),
                captured: captured[offsets[si] * ncap * h..offsets[si + 1] * ncap * h].to_vec(),
            });
            row_cursor += nl;
        }
        Ok(out)
    }

    /// Layer `li`'s attention over `hn`, the normed rows of every segment, segment `si`'s
    /// rows `offsets[si]..offsets[si + 1]` (`offsets` ends with the row count).
    fn attention(
        &self,
        li: usize,
        hn: &[f32],
        tables: &[(Vec<f32>, Vec<f32>)],
        segs: &[Segment<'_>],
        offsets: &[usize],
        mode: MlaMode,
    ) -> (Vec<f32>, Vec<f32>) {
        let a = &self.layers[li].attn;
        let total = offsets[segs.len()];
        let (heads, nope, rd, vd, rank) =
            (self.heads, self.nope, self.rope_dim, self.vdim, self.rank);
        let qd = nope + rd;
        let mut q = match &a.q {
            QProj::LowRank { a: qa, norm, b } => {
                let mut c = qa.forward(hn, total);
                rms_norm(&mut c, norm, self.eps);
                b.forward(&c, total)
            }
            QProj::Full(l) => l.forward(hn, total),
        };
        let kva = a.kv_a.forward(hn, total);
        let width = rank + rd;
        let mut kv = vec![0f32; total * width];
        for t in 0..total {
            let src = &kva[t * width..(t + 1) * width];
            let dst = &mut kv[t * width..(t + 1) * width];
            dst.copy_from_slice(src);
            rms_norm(&mut dst[..rank], &a.kv_a_norm, self.eps);
            let (c, s) = &tables[t];
            self.rope.apply(&mut dst[rank..], c, s);
            for hh in 0..heads {
                let qh = &mut q[t * heads * qd + hh * qd..t * heads * qd + (hh + 1) * qd];
                self.rope.apply(&mut qh[nope..], c, s);
            }
        }
        // Per token: attention over cache + own keys, all heads.
        let seg_of: Vec<usize> = (0..segs.len())
            .flat_map(|si| std::iter::repeat_n(si, offsets[si + 1] - offsets[si]))
            .collect();
        let kvb = a.kv_b.as_slice();
        let scale = self.softmax_scale;
        let compute = |t: usize| -> Vec<f32> {
            let si = seg_of[t];
            let seg = &segs[si];
            let local = t - offsets[si];
            let cache = &seg.cache.layers[li];
            let own = seg.attend.keys(local);
            let nkeys = seg.cache.len + own.len();
            let key = |j: usize| -> &[f32] {
                if j < seg.cache.len {
                    &cache[j * width..(j + 1) * width]
                } else {
                    let g = offsets[si] + own[j - seg.cache.len];
                    &kv[g * width..(g + 1) * width]
                }
            };
            let mut out = vec![0f32; heads * vd];
            let mut scores = vec![0f32; nkeys];
            for hh in 0..heads {
                let qh = &q[t * heads * qd + hh * qd..t * heads * qd + (hh + 1) * qd];
                let wuk = |d: usize, r: usize| bf16::to_f32(kvb[(hh * (nope + vd) + d) * rank + r]);
                let wuv = |d: usize, r: usize| {
                    bf16::to_f32(kvb[(hh * (nope + vd) + nope + d) * rank + r])
                };
                match mode {
                    MlaMode::Absorbed => {
                        let mut qlat = vec![0f32; rank];
                        for (d, &qv) in qh[..nope].iter().enumerate() {
                            for (r, ql) in qlat.iter_mut().enumerate() {
                                *ql += qv * wuk(d, r);
                            }
                        }
                        for (j, sc) in scores.iter_mut().enumerate() {
                            let k = key(j);
                            let mut s = 0f32;
                            for r in 0..rank {
                                s += qlat[r] * k[r];
                            }
                            for d in 0..rd {
                                s += qh[nope + d] * k[rank + d];
                            }
                            *sc = s * scale;
                        }
                        crate::linalg::softmax_inplace(&mut scores);
                        let mut olat = vec![0f32; rank];
                        for (j, &p) in scores.iter().enumerate() {
                            let k = key(j);
                            for r in 0..rank {
                                olat[r] += p * k[r];
                            }
                        }
                        for d in 0..vd {
                            let mut s = 0f32;
                            for (r, ol) in olat.iter().enumerate() {
                                s += wuv(d, r) * ol;
                            }
                            out[hh * vd + d] = s;
                        }
                    }
                    MlaMode::Naive => {
                        let mut vals = vec![0f32; nkeys * vd];
                        for (j, sc) in scores.iter_mut().enumerate() {
                            let k = key(j);
                            let mut s = 0f32;
                            for (d, &qv) in qh[..nope].iter().enumerate() {
                                let mut kn = 0f32;
                                for (r, &kr) in k[..rank].iter().enumerate() {
                                    kn += wuk(d, r) * kr;
                                }
                                s += qv * kn;
                            }
                            for d in 0..rd {
                                s += qh[nope + d] * k[rank + d];
                            }
                            *sc = s * scale;
                            for d in 0..vd {
                                let mut v = 0f32;
                                for (r, &kr) in k[..rank].iter().enumerate() {
                                    v += wuv(d, r) * kr;
                                }
                                vals[j * vd + d] = v;
                            }
                        }
                        crate::linalg::softmax_inplace(&mut scores);
                        for (j, &p) in scores.iter().enumerate() {
                            for d in 0..vd {
                                out[hh * vd + d] += p * vals[j * vd + d];
                            }
                        }
                    }
                }
            }
            out
        };
        let heavy =
            total * heads * (segs.iter().map(|s| s.cache.len).max().unwrap_or(0) + 8) * rank
                > (1 << 20);
        let per_token: Vec<Vec<f32>> = if heavy {
            (0..total).into_par_iter().map(compute).collect()
        } else {
            (0..total).map(compute).collect()
        };
        let o: Vec<f32> = per_token.concat();
        (a.o.forward(&o, total), kv)
    }

    /// Router of DeepSeek-V3 (noaux_tc with sigmoid scores, grouped top-k) or softmax
    /// scoring; returns (expert, weight) per token in selection order.
    fn route(&self, m: &Moe, logits: &[f32]) -> Vec<(usize, f32)> {
        let d = &m.dims;
        let e = d.n_routed_experts as usize;
        let k = d.num_experts_per_tok as usize;
        let scores: Vec<f32> = if d.scoring_func == "sigmoid" {
            logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect()
        } else {
            let mut s = logits.to_vec();
            crate::linalg::softmax_inplace(&mut s);
            s
        };
        let choice: Vec<f32> = match &m.bias {
            Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
            None => scores.clone(),
        };
        let ng = d.n_group.max(1) as usize;
        let per = e / ng;
        let mut masked = choice.clone();
        if ng > 1 {
            let group_score: Vec<f32> = (0..ng)
                .map(|g| {
                    let grp = &choice[g * per..(g + 1) * per];
                    if m.bias.is_some() {
                        crate::linalg::topk(grp, 2).iter().map(|x| x.1).sum()
                    } else {
                        grp.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                    }
                })
                .collect();
            let keep: Vec<usize> = crate::linalg::topk(&group_score, d.topk_group as usize)
                .into_iter()
                .map(|x| x.0)
                .collect();
            for g in 0..ng {
                if !keep.contains(&g) {
                    masked[g * per..(g + 1) * per]
                        .iter_mut()
                        .for_each(|v| *v = f32::NEG_INFINITY);
                }
            }
        }
        let sel = crate::linalg::topk(&masked, k);
        let mut w: Vec<f32> = sel.iter().map(|&(i, _)| scores[i]).collect();
        if k > 1 && d.norm_topk_prob {
            let s: f32 = w.iter().sum::<f32>() + 1e-20;
            w.iter_mut().for_each(|x| *x /= s);
        }
        let rs = d.routed_scaling_factor as f32;
        sel.iter().zip(w).map(|(&(i, _), w)| (i, w * rs)).collect()
    }

    fn moe(&self, m: &Moe, x: &[f32], total: usize) -> Vec<f32> {
        let h = self.hidden;
        let e = m.dims.n_routed_experts as usize;
        let router_logits = m.router.forward(x, total);
        let routes: Vec<Vec<(usize, f32)>> = (0..total)
            .map(|t| self.route(m, &router_logits[t * e..(t + 1) * e]))
            .collect();
        // Tokens per expert, then one matmul per active expert.
        let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e];
        for (t, r) in routes.iter().enumerate() {
            for (slot, &(ex, _)) in r.iter().enumerate() {
                by_expert[ex].push((t, slot));
            }
        }
        let active: Vec<usize> = (0..e).filter(|&i| !by_expert[i].is_empty()).collect();
        let run = |&ex: &usize| -> (usize, Vec<f32>) {
            let toks = &by_expert[ex];
            let mut xin = Vec::with_capacity(toks.len() * h);
            for &(t, _) in toks {
                xin.extend_from_slice(&x[t * h..(t + 1) * h]);
            }
            (ex, m.experts[ex].forward(&xin, toks.len()))
        };
        let heavy = active.len() > 1 && m.experts[0].gate.bytes() * 3 * active.len() > (1 << 20);
        let outs: Vec<(usize, Vec<f32>)> = if heavy {
            active.par_iter().map(run).collect()
        } else {
            active.iter().map(run).collect()
        };
        let k = m.dims.num_experts_per_tok as usize;
        let mut slots = vec![0f32; total * k * h];
        for (ex, y) in &outs {
            for (row, &(t, slot)) in by_expert[*ex].iter().enumerate() {
                slots[(t * k + slot) * h..(t * k + slot + 1) * h]
                    .copy_from_slice(&y[row * h..(row + 1) * h]);
            }
        }
        let mut out = vec![0f32; total * h];
        for t in 0..total {
            for (slot, &(_, w)) in routes[t].iter().enumerate() {
                let src = &slots[(t * k + slot) * h..(t * k + slot + 1) * h];
                for (o, s) in out[t * h..(t + 1) * h].iter_mut().zip(src) {
                    *o += w * s;
                }
            }
        }
        if let Some(sh) = &m.shared {
            let s = sh.forward(x, total);
            for (o, v) in out.iter_mut().zip(&s) {
                *o += v;
            }
        }
        out
    }
}
