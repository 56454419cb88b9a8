//! Launch wrappers for `engine_f32.cu` (the engine's exact f32 kernels). Addresses are raw
//! device pointers (`DBuf::ptr_at`), sizes in elements; every wrapper checks what the kernel
//! cannot (grid limits, empty work).

// Each wrapper takes its kernel's parameters one for one.
#![allow(clippy::too_many_arguments)]

use kbench_cuda::device::Arg;
use kbench_cuda::kernels::KernelFile;
use kbench_cuda::{CudaDevice, CudaError};

/// The engine's kernel file, compiled by NVRTC like kbench-cuda's own.
pub const ENGINE_F32: KernelFile = KernelFile {
    name: "kbench_engine_f32.cu",
    source: include_str!("engine_f32.cu"),
};

type R = std::result::Result<(), CudaError>;

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn launch(
    dev: &CudaDevice,
    name: &str,
    grid: (usize, usize, usize),
    block: usize,
    args: &[Arg],
) -> R {
    if grid.1 > 65535 || grid.2 > 65535 {
        return Err(CudaError::Invalid(format!(
            "{name}: grid {grid:?} exceeds 65535 in y/z"
        )));
    }
    dev.launch(
        &ENGINE_F32,
        name,
        (grid.0 as u32, grid.1 as u32, grid.2 as u32),
        (block as u32, 1, 1),
        0,
        args,
    )
}

fn p(x: u64) -> Arg {
    Arg::Ptr(x)
}
fn i(x: usize) -> Arg {
    Arg::I32(x as i32)
}

/// Rows per launch of the warp-per-output kernels (grid.y limit).
const MAX_ROWS: usize = 65535;

/// y[m, n] (+)= sum_k x[m, k] W[n, k] over BF16 `w` [N, K].
pub fn lin_bf16(
    dev: &CudaDevice,
    x: u64,
    ldx: usize,
    w: u64,
    y: u64,
    ldy: usize,
    m: usize,
    n: usize,
    k: usize,
    accum: bool,
) -> R {
    for m0 in (0..m).step_by(MAX_ROWS) {
        let mm = (m - m0).min(MAX_ROWS);
        launch(
            dev,
            "lin_bf16",
            (cdiv(n, 4), mm, 1),
            128,
            &[
                p(x + (m0 * ldx * 4) as u64),
                i(ldx),
                p(w),
                p(y + (m0 * ldy * 4) as u64),
                i(ldy),
                i(mm),
                i(n),
                i(k),
                i(accum as usize),
            ],
        )?;
    }
    Ok(())
}

/// Routed-expert linear over (token, slot) pairs; see `moe_lin` in the kernel file.
pub fn moe_lin(
    dev: &CudaDevice,
    x: u64,
    ldx: usize,
    xdiv: usize,
    ids: u64,
    e0: usize,
    eloc: usize,
    int4: bool,
    w: u64,
    sc: u64,
    group: usize,
    y: u64,
    ldy: usize,
    pairs: usize,
    n: usize,
    k: usize,
) -> R {
    if pairs > MAX_ROWS {
        return Err(CudaError::Invalid(format!(
            "moe_lin: {pairs} pairs > {MAX_ROWS}"
        )));
    }
    launch(
        dev,
        "moe_lin",
        (cdiv(n, 4), pairs, 1),
        128,
        &[
            p(x),
            i(ldx),
            i(xdiv),
            p(ids),
            i(e0),
            i(eloc),
            i(int4 as usize),
            p(w),
            p(sc),
            i(group.max(1)),
            p(y),
            i(ldy),
            i(pairs),
            i(n),
            i(k),
        ],
    )
}

pub fn silu_mul(dev: &CudaDevice, g: u64, u: u64, out: u64, n: usize) -> R {
    launch(
        dev,
        "silu_mul",
        (cdiv(n, 256), 1, 1),
        256,
        &[p(g), p(u), p(out), i(n)],
    )
}

/// out (bf16) = silu(g) * u over `n` f32 elements.
pub fn silu_mul_bf16(dev: &CudaDevice, g: u64, u: u64, out: u64, n: usize) -> R {
    launch(
        dev,
        "silu_mul_bf16",
        (cdiv(n, 256), 1, 1),
        256,
        &[p(g), p(u), p(out), i(n)],
    )
}

/// Global expert ids of `pairs` (token, slot) pairs -> this rank's local ids (or -1), with the
/// weights and `h`-wide f32 down rows of other ranks' pairs zeroed; see `moe_local_ids`.
pub fn moe_local_ids(
    dev: &CudaDevice,
    ids: u64,
    wts: u64,
    down: u64,
    pairs: usize,
    h: usize,
    e0: usize,
    eloc: usize,
) -> R {
    launch(
        dev,
        "moe_local_ids",
        (pairs, 1, 1),
        256,
        &[p(ids), p(wts), p(down), i(pairs), i(h), i(e0), i(eloc)],
    )
}

pub fn add(dev: &CudaDevice, dst: u64, src: u64, n: usize) -> R {
    launch(
        dev,
        "add_f32",
        (cdiv(n, 256), 1, 1),
        256,
        &[p(dst), p(src), i(n)],
    )
}

pub fn to_bf16(dev: &CudaDevice, src: u64, dst: u64, n: usize) -> R {
    launch(
        dev,
        "f32_to_bf16",
        (cdiv(n, 256), 1, 1),
        256,
        &[p(src), p(dst), i(n)],
    )
}

pub fn add_bf16(dev: &CudaDevice, dst: u64, src: u64, n: usize) -> R {
    launch(
        dev,
        "add_bf16_to_f32",
        (cdiv(n, 256), 1, 1),
        256,
        &[p(dst), p(src), i(n)],
    )
}

pub fn gather_rows(
    dev: &CudaDevice,
    src: u64,
    lds: usize,
    idx: u64,
    dst: u64,
    ldd: usize,
    rows: usize,
    cols: usize,
) -> R {
    launch(
        dev,
        "gather_rows",
        (rows, 1, 1),
        256,
        &[p(src), i(lds), p(idx), p(dst), i(ldd), i(cols)],
    )
}

pub fn embed(
    dev: &CudaDevice,
    ids: u64,
    table: u64,
    v: usize,
    d: usize,
    out: u64,
    ldo: usize,
    t: usize,
) -> R {
    launch(
        dev,
        "embed_f32",
        (t, 1, 1),
        128,
        &[p(ids), p(table), i(v), i(d), p(out), i(ldo)],
    )
}

pub fn rmsnorm(
    dev: &CudaDevice,
    x: u64,
    ldx: usize,
    w: u64,
    y: u64,
    ldy: usize,
    rows: usize,
    d: usize,
    eps: f32,
) -> R {
    launch(
        dev,
        "rmsnorm_f32",
        (rows, 1, 1),
        256,
        &[p(x), i(ldx), p(w), p(y), i(ldy), i(d), Arg::F32(eps)],
    )
}

pub fn rope(
    dev: &CudaDevice,
    x: u64,
    t: usize,
    heads: usize,
    ld_tok: usize,
    ld_head: usize,
    offset: usize,
    dim: usize,
    cos: u64,
    sin: u64,
    interleaved: bool,
) -> R {
    launch(
        dev,
        "rope_f32",
        (t, 1, 1),
        128,
        &[
            p(x),
            i(heads),
            i(ld_tok),
            i(ld_head),
            i(offset),
            i(dim),
            p(cos),
            p(sin),
            i(interleaved as usize),
        ],
    )
}

pub fn mla_absorb_q(
    dev: &CudaDevice,
    q: u64,
    kvb: u64,
    qcat: u64,
    t: usize,
    heads: usize,
    nope: usize,
    rd: usize,
    vd: usize,
    rank: usize,
) -> R {
    launch(
        dev,
        "mla_absorb_q",
        (t, heads, 1),
        128,
        &[
            p(q),
            p(kvb),
            p(qcat),
            i(heads),
            i(nope),
            i(rd),
            i(vd),
            i(rank),
        ],
    )
}

pub fn mla_absorb_v(
    dev: &CudaDevice,
    olat: u64,
    kvb: u64,
    out: u64,
    t: usize,
    heads: usize,
    nope: usize,
    vd: usize,
    rank: usize,
) -> R {
    launch(
        dev,
        "mla_absorb_v",
        (t, heads, 1),
        128,
        &[p(olat), p(kvb), p(out), i(heads), i(nope), i(vd), i(rank)],
    )
}

/// Key/value sources of one attention launch: (k base, v base, row stride in floats).
#[derive(Debug, Clone, Copy)]
pub struct KvSrc {
    pub k: u64,
    pub v: u64,
    pub ld: usize,
}

/// Geometry of one attention launch.
#[derive(Debug, Clone, Copy)]
pub struct AttnGeom {
    pub t: usize,
    pub heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    pub ldq_tok: usize,
    pub ldq_head: usize,
    pub dk: usize,
    pub dv: usize,
    /// Offset of KV head `kh` within a row is `kh * khs` (0: all heads share one row).
    pub khs: usize,
    pub ldout_tok: usize,
    pub ldout_head: usize,
    pub scale: f32,
    pub max_keys: usize,
}

pub fn attention(
    dev: &CudaDevice,
    g: &AttnGeom,
    q: u64,
    cache: KvSrc,
    pool: KvSrc,
    own: KvSrc,
    meta: u64,
    mask: u64,
    extras: u64,
    scores: u64,
    out: u64,
) -> R {
    launch(
        dev,
        "attention_f32",
        (g.t, g.heads, 1),
        128,
        &[
            p(q),
            i(g.ldq_tok),
            i(g.ldq_head),
            i(g.dk),
            i(g.heads),
            i(g.group.max(1)),
            p(cache.k),
            p(cache.v),
            i(cache.ld),
            p(pool.k),
            p(pool.v),
            i(pool.ld),
            p(own.k),
            p(own.v),
            i(own.ld),
            i(g.khs),
            i(g.dv),
            p(meta),
            p(mask),
            p(extras),
            Arg::F32(g.scale),
            p(scores),
            i(g.max_keys),
            p(out),
            i(g.ldout_tok),
            i(g.ldout_head),
        ],
    )
}

/// Router configuration.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub sigmoid: bool,
    pub norm: bool,
    pub scaling: f32,
}

pub fn moe_route(
    dev: &CudaDevice,
    r: &Route,
    logits: u64,
    bias: u64,
    t: usize,
    work: u64,
    ids: u64,
    wts: u64,
) -> R {
    if r.n_group > 64 {
        return Err(CudaError::Invalid(format!(
            "moe_route: n_group {} > 64",
            r.n_group
        )));
    }
    launch(
        dev,
        "moe_route_f32",
        (cdiv(t, 32), 1, 1),
        32,
        &[
            p(logits),
            p(bias),
            i(t),
            i(r.experts),
            i(r.top_k),
            i(r.n_group.max(1)),
            i(r.topk_group),
            i(r.sigmoid as usize),
            i(r.norm as usize),
            Arg::F32(r.scaling),
            p(work),
            p(ids),
            p(wts),
        ],
    )
}

pub fn moe_combine(
    dev: &CudaDevice,
    y: u64,
    wts: u64,
    out: u64,
    t: usize,
    k: usize,
    h: usize,
) -> R {
    launch(
        dev,
        "moe_combine_f32",
        (t, 1, 1),
        256,
        &[p(y), p(wts), p(out), i(k), i(h)],
    )
}
