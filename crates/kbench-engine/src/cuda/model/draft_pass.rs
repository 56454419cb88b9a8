//! The EAGLE-3 draft pass on rank 0, its KV cache and the per-round pool of draft-path
//! entries.

use super::*;
use crate::cuda::ops::{self, AttnGeom, KvSrc};
use crate::error::{EngineError, Result};

impl CudaModel {
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
}
