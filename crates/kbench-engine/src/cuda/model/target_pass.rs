//! The batched target pass (prefill / extend, decode, tree-masked verify) and committing
//! its accepted KV entries to the latent cache.

use super::*;
use crate::cuda::ops::{self, AttnGeom, KvSrc};
use crate::cuda::weights::{DMlp, DMoe, DQ};
use crate::error::{EngineError, Result};

impl CudaModel {
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
}

/// The device part of a target pass over `t` tokens whose metadata is already in the
/// buffers; logits for `nrows` rows (`gather`: the rows listed in `rows`, else rows 0..nrows).
/// Only kernel launches, device copies and NCCL calls: graph-capturable (world size 1).
pub(super) fn device_forward(
    g: &Geo,
    ranks: &[Rank],
    t: usize,
    nrows: usize,
    gather: bool,
) -> Result<()> {
    let h = g.h;
    let hl = g.hl();
    let (qd, width, rank) = (g.qd(), g.width(), g.kv_lora_rank);
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
        let moe_bf16 = g.tuned && matches!(ranks[0].w.layers[l].mlp, DMlp::Moe(_));
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
                DMlp::Moe(m) => {
                    let DMoe {
                        router,
                        bias,
                        experts: x,
                        shared,
                    } = &**m;
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
