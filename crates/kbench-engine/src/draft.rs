//! The EAGLE-3 draft head (SGLang's llama_eagle3.py): `fc` over the three captured target
//! hidden states, one Llama decoder layer whose attention input is
//! concat(input_layernorm(embedding), hidden_norm(hidden)), a final norm, and an lm_head over
//! the draft vocabulary mapped to target ids by `d2t`. Token embeddings are the target's.

use kbench_core::arch::DraftArch;

use crate::error::{EngineError, Result};
use crate::linalg::{rms_norm, rms_norm_to, silu, softmax_inplace, Linear};
use crate::names::{self, draft, Proj};
use crate::rope::Rope;
use crate::shapes::{DraftShapes, Matrix};
use crate::st::WeightStore;
use crate::target::Target;

#[derive(Debug, Clone)]
pub struct Draft {
    pub arch: DraftArch,
    fc: Linear,
    in_norm: Vec<f32>,
    hidden_norm: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    post_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
    norm: Vec<f32>,
    lm_head: Linear,
    /// Target id of each draft id.
    pub d2t: Vec<u32>,
    rope: Rope,
    pub hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f32,
}

/// The draft's own MHA/GQA KV cache of one sequence: K and V rows per token.
#[derive(Debug, Clone, Default)]
pub struct DraftCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub len: usize,
}

/// One K/V entry (a token's keys and values for every KV head).
#[derive(Debug, Clone)]
pub struct DraftKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// A draft pass over one sequence: tokens attend to the cache, then to `extra` (entries of
/// this round's draft path not in the cache), then causally to each other.
#[derive(Debug, Clone)]
pub struct DraftSegment<'a> {
    pub cache: &'a DraftCache,
    pub extra: Vec<&'a DraftKv>,
    pub tokens: Vec<u32>,
    /// `[n, 3h]` captured target states (extend) or `[n, h]` draft hidden (decode).
    pub hidden_in: Vec<f32>,
    pub positions: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct DraftOut {
    /// `[n, draft_vocab]` logits.
    pub logits: Vec<f32>,
    /// `[n, h]`: the pre-norm hidden state fed to the next draft step.
    pub aux: Vec<f32>,
    pub kv: Vec<DraftKv>,
}

impl Draft {
    pub fn load(arch: &DraftArch, ws: &WeightStore, target: &Target) -> Result<Draft> {
        let h = arch.hidden_size as usize;
        if h != target.hidden {
            return Err(EngineError::ConfigMismatch(format!(
                "draft hidden_size {h} differs from the target's {} (EAGLE-3 shares the embeddings)",
                target.hidden
            )));
        }
        for &l in &arch.capture_layers {
            if l as usize >= target.num_layers() {
                return Err(EngineError::ConfigMismatch(format!(
                    "draft captures target layer {l} but the target has {} layers",
                    target.num_layers()
                )));
            }
        }
        let (nh, nkv, hd) = (
            arch.num_heads as usize,
            arch.num_kv_heads as usize,
            arch.head_dim as usize,
        );
        let s = DraftShapes::new(arch)?;
        let l = |name: &str, [out, inp]: Matrix| -> Result<Linear> {
            Ok(Linear::bf16(
                out,
                inp,
                ws.bf16s(&names::weight(name), &[out, inp])?,
            ))
        };
        let n = |name: &str| ws.f32s(&names::weight(name), &[h]);
        let d2t = read_d2t(ws, s.draft_vocab, target.vocab)?;
        Ok(Draft {
            fc: l(draft::FC, s.fc())?,
            in_norm: n(draft::INPUT_NORM)?,
            hidden_norm: n(draft::HIDDEN_NORM)?,
            q: l(draft::Q, s.q())?,
            k: l(draft::K, s.kv())?,
            v: l(draft::V, s.kv())?,
            o: l(draft::O, s.o())?,
            post_norm: n(draft::POST_ATTENTION_NORM)?,
            gate: l(draft::GATE, s.ffn.proj(Proj::Gate))?,
            up: l(draft::UP, s.ffn.proj(Proj::Up))?,
            down: l(draft::DOWN, s.ffn.proj(Proj::Down))?,
            norm: n(draft::FINAL_NORM)?,
            lm_head: l(draft::LM_HEAD, s.lm_head())?,
            d2t,
            rope: Rope::new(hd, arch.rope_theta, None, false),
            hidden: h,
            heads: nh,
            kv_heads: nkv,
            head_dim: hd,
            eps: arch.rms_norm_eps as f32,
            arch: arch.clone(),
        })
    }

    pub fn draft_vocab(&self) -> usize {
        self.d2t.len()
    }

    /// One batched draft pass.
    pub fn forward(&self, target: &Target, segs: &[DraftSegment<'_>]) -> Result<Vec<DraftOut>> {
        let h = self.hidden;
        let ncap = self.arch.capture_layers.len();
        let (nh, nkv, hd) = (self.heads, self.kv_heads, self.head_dim);
        let kvw = nkv * hd;
        let total: usize = segs.iter().map(|s| s.tokens.len()).sum();
        // Hidden input: fc over captured states where given (3h), else the draft's own.
        let mut hid = Vec::with_capacity(total * h);
        for s in segs {
            let n = s.tokens.len();
            if s.positions.len() != n {
                return Err(EngineError::Invalid(
                    "draft segment tokens and positions differ in length".into(),
                ));
            }
            if s.hidden_in.len() == n * ncap * h {
                hid.extend(self.fc.forward(&s.hidden_in, n));
            } else if s.hidden_in.len() == n * h {
                hid.extend_from_slice(&s.hidden_in);
            } else {
                return Err(EngineError::Invalid(format!(
                    "draft hidden input has {} values for {n} tokens (expected {}x{h} or {}x{h})",
                    s.hidden_in.len(),
                    n * ncap,
                    n
                )));
            }
        }
        let mut xin = Vec::with_capacity(total * 2 * h);
        for (t, tok) in segs.iter().flat_map(|s| s.tokens.iter()).enumerate() {
            if *tok as usize >= target.vocab {
                return Err(EngineError::Invalid(format!(
                    "token id {tok} is outside the vocabulary"
                )));
            }
            let mut e = target.embed(*tok);
            rms_norm(&mut e, &self.in_norm, self.eps);
            xin.extend(e);
            xin.extend(rms_norm_to(
                &hid[t * h..(t + 1) * h],
                &self.hidden_norm,
                self.eps,
            ));
        }
        let mut q = self.q.forward(&xin, total);
        let mut k = self.k.forward(&xin, total);
        let v = self.v.forward(&xin, total);
        let mut t0 = 0;
        let mut attn = vec![0f32; total * nh * hd];
        let scale = 1.0 / (hd as f32).sqrt();
        for s in segs {
            let n = s.tokens.len();
            for i in 0..n {
                let t = t0 + i;
                let (c, sn) = self.rope.table(s.positions[i]);
                for hh in 0..nh {
                    self.rope
                        .apply(&mut q[(t * nh + hh) * hd..(t * nh + hh + 1) * hd], &c, &sn);
                }
                for hh in 0..nkv {
                    self.rope.apply(
                        &mut k[(t * nkv + hh) * hd..(t * nkv + hh + 1) * hd],
                        &c,
                        &sn,
                    );
                }
            }
            for i in 0..n {
                let t = t0 + i;
                let nkeys = s.cache.len + s.extra.len() + i + 1;
                let key = |j: usize| -> (&[f32], &[f32]) {
                    if j < s.cache.len {
                        (
                            &s.cache.k[j * kvw..(j + 1) * kvw],
                            &s.cache.v[j * kvw..(j + 1) * kvw],
                        )
                    } else if j < s.cache.len + s.extra.len() {
                        let e = s.extra[j - s.cache.len];
                        (&e.k, &e.v)
                    } else {
                        let g = t0 + j - s.cache.len - s.extra.len();
                        (&k[g * kvw..(g + 1) * kvw], &v[g * kvw..(g + 1) * kvw])
                    }
                };
                let mut scores = vec![0f32; nkeys];
                for hh in 0..nh {
                    let kh = hh / (nh / nkv);
                    let qh = &q[(t * nh + hh) * hd..(t * nh + hh + 1) * hd];
                    for (j, sc) in scores.iter_mut().enumerate() {
                        let kk = &key(j).0[kh * hd..(kh + 1) * hd];
                        let mut d = 0f32;
                        for x in 0..hd {
                            d += qh[x] * kk[x];
                        }
                        *sc = d * scale;
                    }
                    softmax_inplace(&mut scores);
                    let o = &mut attn[(t * nh + hh) * hd..(t * nh + hh + 1) * hd];
                    for (j, &p) in scores.iter().enumerate() {
                        let vv = &key(j).1[kh * hd..(kh + 1) * hd];
                        for x in 0..hd {
                            o[x] += p * vv[x];
                        }
                    }
                }
            }
            t0 += n;
        }
        let attn_out = self.o.forward(&attn, total);
        // residual = hidden; post-attention norm over (attn + residual); MLP; final norm.
        let mut res: Vec<f32> = attn_out.iter().zip(&hid).map(|(a, b)| a + b).collect();
        let hn = rms_norm_to(&res, &self.post_norm, self.eps);
        let g = self.gate.forward(&hn, total);
        let u = self.up.forward(&hn, total);
        let act: Vec<f32> = g.iter().zip(&u).map(|(a, b)| silu(*a) * b).collect();
        let mlp = self.down.forward(&act, total);
        for (r, m) in res.iter_mut().zip(&mlp) {
            *r += m;
        }
        let normed = rms_norm_to(&res, &self.norm, self.eps);
        let logits = self.lm_head.forward(&normed, total);
        let dv = self.draft_vocab();
        let mut outs = Vec::with_capacity(segs.len());
        let mut t0 = 0;
        for s in segs {
            let n = s.tokens.len();
            outs.push(DraftOut {
                logits: logits[t0 * dv..(t0 + n) * dv].to_vec(),
                aux: res[t0 * h..(t0 + n) * h].to_vec(),
                kv: (t0..t0 + n)
                    .map(|t| DraftKv {
                        k: k[t * kvw..(t + 1) * kvw].to_vec(),
                        v: v[t * kvw..(t + 1) * kvw].to_vec(),
                    })
                    .collect(),
            });
            t0 += n;
        }
        Ok(outs)
    }

    /// [`target_probs`] with this draft's vocabulary map.
    pub fn target_probs(&self, logits: &[f32], temperature: f32, target_vocab: usize) -> Vec<f32> {
        target_probs(&self.d2t, logits, temperature, target_vocab)
    }
}

/// Softmax of draft logits (after temperature; greedy uses T = 1 for the scores, as SGLang's
/// draft does) mapped into the target vocabulary through `d2t` (target id of each draft id).
pub fn target_probs(
    d2t: &[u32],
    logits: &[f32],
    temperature: f32,
    target_vocab: usize,
) -> Vec<f32> {
    let mut p: Vec<f32> = if temperature > 1e-5 {
        logits.iter().map(|x| x / temperature).collect()
    } else {
        logits.to_vec()
    };
    softmax_inplace(&mut p);
    let mut full = vec![0f32; target_vocab];
    for (i, &pi) in p.iter().enumerate() {
        full[d2t[i] as usize] += pi;
    }
    full
}

impl DraftCache {
    pub fn push(&mut self, kv: &DraftKv) {
        self.k.extend_from_slice(&kv.k);
        self.v.extend_from_slice(&kv.v);
        self.len += 1;
    }
}

/// The draft-to-target vocabulary map: `d2t` holds offsets (target id = draft id + offset),
/// checked to land inside the target vocabulary; without it the vocabularies must be equal.
pub(crate) fn read_d2t(ws: &WeightStore, dv: usize, target_vocab: usize) -> Result<Vec<u32>> {
    if !ws.contains(draft::D2T) {
        if dv == target_vocab {
            return Ok((0..dv as u32).collect());
        }
        return Err(EngineError::MissingTensor {
            name: draft::D2T.into(),
            dir: ws.dir.clone(),
        });
    }
    let (shape, off) = ws.ints(draft::D2T)?;
    if shape != [dv] {
        return Err(EngineError::Shape {
            name: draft::D2T.into(),
            expected: vec![dv],
            got: shape,
        });
    }
    off.iter()
        .enumerate()
        .map(|(i, o)| {
            let t = i as i64 + o;
            if t < 0 || t as usize >= target_vocab {
                return Err(EngineError::ConfigMismatch(format!(
                    "d2t maps draft id {i} to {t}, outside the target vocabulary of {target_vocab}"
                )));
            }
            Ok(t as u32)
        })
        .collect()
}
