//! The routed experts of a MoE layer: on the exact kernels (route, per-pair projections,
//! combine) and on kbench-cuda's tuned fused MoE.

use super::*;
use crate::cuda::ops::{self};
use crate::cuda::weights::{self, DFfn, DLin, ExpertW};
use crate::error::{EngineError, Result};
use kbench_cuda::ops::{self as kops, MoeConfig, MoeWeights};

/// The exact kernels' routed experts: route, per-pair gate / up / down, combine into `part`.
pub(super) fn moe_exact(
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
pub(super) fn moe_tuned(
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
