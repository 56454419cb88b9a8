//! Device scratch: allocating a rank's pass buffers and the draft's, and stream-ordered
//! host reads and writes into them.

use super::*;
use crate::cuda::weights::{DMlp, DraftWeights, RankWeights};
use crate::error::{EngineError, Result};
use crate::rope::Rope;
use kbench_cuda::ops::MoeScratch;
use kbench_cuda::{Blas, CudaDevice, DBuf, DeviceRepr};

impl CudaModel {
    pub(super) fn alloc_bufs(
        dev: &CudaDevice,
        g: &Geo,
        w: &RankWeights,
        rank0: bool,
    ) -> Result<Bufs> {
        let t = g.max_tokens;
        let hl = g.hl();
        let f = |n: usize| zeros_f32(dev, n);
        let mut inter = 1;
        for l in &w.layers {
            match &l.mlp {
                DMlp::Dense(ff) => inter = inter.max(ff.gate.out),
                DMlp::Moe(m) => {
                    if let Some(ff) = &m.shared {
                        inter = inter.max(ff.gate.out);
                    }
                }
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
            olat: f(t * hl * g.kv_lora_rank)?,
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

    pub(super) fn alloc_draft(
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
}

/// Writes `data` into `dst` at element `off` (stream-ordered).
pub(super) fn write_at<T: DeviceRepr>(
    dev: &CudaDevice,
    dst: &DBuf<T>,
    off: usize,
    data: &[T],
) -> Result<()> {
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
pub(super) fn read_at<T: DeviceRepr + Default + Clone>(
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

pub(super) fn zeros_f32(dev: &CudaDevice, n: usize) -> Result<DBuf<f32>> {
    let b = dev.alloc::<f32>(n.max(1)).map_err(EngineError::Cuda)?;
    dev.fill_bytes(&b, 0).map_err(EngineError::Cuda)?;
    Ok(b)
}
pub(super) fn zeros_i32(dev: &CudaDevice, n: usize) -> Result<DBuf<i32>> {
    let b = dev.alloc::<i32>(n.max(1)).map_err(EngineError::Cuda)?;
    dev.fill_bytes(&b, 0).map_err(EngineError::Cuda)?;
    Ok(b)
}

/// Runs of consecutive indices: (first, length).
pub(super) fn runs(which: &[usize]) -> Vec<(usize, usize, usize)> {
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
