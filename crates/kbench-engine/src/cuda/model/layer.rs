//! Per-layer helpers of the target pass: the tensor-parallel reduction, the linears on the
//! exact and the tuned kernels, the SwiGLU feed-forward.

use super::*;
use crate::cuda::ops::{self};
use crate::cuda::weights::{DFfn, DLin};
use crate::error::{EngineError, Result};
use kbench_cuda::comm::{self};

/// Sum of the ranks' partial outputs (`part`, `[t, h]`) into the residual stream `x`.
pub(super) fn reduce_add(g: &Geo, ranks: &[Rank], t: usize) -> Result<()> {
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
pub(super) fn reduce_add_bf16(g: &Geo, ranks: &[Rank], t: usize) -> Result<()> {
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

pub(super) fn tuned_bufs(b: &Bufs) -> Result<&TunedBufs> {
    b.t.as_ref()
        .ok_or_else(|| EngineError::Invalid("tuned kernels without their buffers".into()))
}

/// Tuned kernels: `hn` (f32, `[t, h]`) rounded to bf16 into `hnb` for the linears that read it.
pub(super) fn hn_to_bf16(g: &Geo, r: &Rank, t: usize) -> Result<()> {
    if !g.tuned {
        return Ok(());
    }
    let tb = tuned_bufs(&r.b)?;
    ops::to_bf16(&r.dev, r.b.hn.ptr(), tb.hnb.ptr(), t * g.h).map_err(EngineError::Cuda)
}

/// y (f32, row stride `ldy`) = lin(hn): exact on the f32 `hn`, tuned on its bf16 copy `hnb`.
pub(super) fn lin_hn(g: &Geo, r: &Rank, l: &DLin, y: u64, ldy: usize, t: usize) -> Result<()> {
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
pub(super) fn lin_f32(
    g: &Geo,
    r: &Rank,
    l: &DLin,
    x: u64,
    y: u64,
    ldy: usize,
    m: usize,
) -> Result<()> {
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
pub(super) fn ffn_fwd(
    g: &Geo,
    r: &Rank,
    f: &DFfn,
    t: usize,
    accum: bool,
    bf16_out: bool,
) -> Result<()> {
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
