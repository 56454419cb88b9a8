//! Launch wrappers. Arguments are raw device addresses (`DBuf::ptr()`, `ptr_at(i)`) plus sizes,
//! so callers can pass sub-ranges; every wrapper checks sizes, alignment and launch limits.
//! Layout conventions are documented in each kernel file's header comment.

// Each wrapper takes its kernel's parameters one for one.
#![allow(clippy::too_many_arguments)]

use crate::device::{Arg, CudaDevice};
use crate::error::{CudaError, Result};
use crate::kernels as k;
use crate::linear_args::LinearArgs;

fn inv(msg: String) -> CudaError {
    CudaError::Invalid(msg)
}
fn aligned(p: u64, a: u64, what: &str) -> Result<()> {
    if p % a != 0 {
        return Err(inv(format!("{what}: address {p:#x} not {a}-byte aligned")));
    }
    Ok(())
}
fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}
fn nt_for(tokens_per_weight: usize) -> (u32, &'static str) {
    if tokens_per_weight <= 8 {
        (1, "nt1")
    } else if tokens_per_weight <= 16 {
        (2, "nt2")
    } else {
        (4, "nt4")
    }
}
/// f32 workspace for split-K partial sums: (address, capacity in floats).
pub type Workspace = Option<(u64, usize)>;

const KC: usize = 512; // WM_KC in kbench_wmat.cuh

fn pick_splits(
    dev: &CudaDevice,
    blocks: usize,
    k: usize,
    need_per_split: usize,
    ws: Workspace,
) -> usize {
    let chunks = cdiv(k, KC);
    let want = cdiv(4 * dev.sm_count, blocks.max(1)).min(chunks).max(1);
    match ws {
        Some((_, cap)) if want > 1 => {
            let mut s = want.min(cap / need_per_split.max(1)).max(1);
            // no empty splits
            while s > 1 && cdiv(chunks, cdiv(chunks, s)) < s {
                s -= 1;
            }
            s
        }
        _ => 1,
    }
}

/// INT4 (group-32) x BF16: `Y[m, n] = sum_k X[m, k] W[n, k]`. Wq int32 [N, K/8], S bf16 [N, K/32].
pub fn int4_matmul(
    dev: &CudaDevice,
    x: u64,
    ldx: usize,
    wq: u64,
    s: u64,
    y: u64,
    ldy: usize,
    y_f32: bool,
    m: usize,
    n: usize,
    kdim: usize,
    ws: Workspace,
) -> Result<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if kdim % 32 != 0 || kdim == 0 || ldx % 8 != 0 || ldx < kdim || ldy < n {
        return Err(inv(format!(
            "int4_matmul: K {kdim} (needs % 32), ldx {ldx} (% 8), ldy {ldy}"
        )));
    }
    aligned(x, 16, "int4_matmul X")?;
    aligned(wq, 16, "int4_matmul Wq")?;
    aligned(s, 2, "int4_matmul S")?;
    let (nt, suffix) = nt_for(m);
    let _ = nt;
    let blocks = cdiv(n, 128);
    let splits = pick_splits(dev, blocks, kdim, m * n, ws);
    let cps = cdiv(cdiv(kdim, KC), splits);
    let wsp = if splits > 1 { ws.unwrap().0 } else { 0 };
    dev.launch(
        &k::INT4_MATMUL,
        &format!("w4a16_matmul_{suffix}"),
        (blocks as u32, splits as u32, 1),
        (128, 1, 1),
        0,
        &[
            Arg::Ptr(x),
            (ldx as i32).into(),
            Arg::Ptr(wq),
            Arg::Ptr(s),
            Arg::Ptr(y),
            (ldy as i32).into(),
            (y_f32 as i32).into(),
            Arg::Ptr(wsp),
            (m as i32).into(),
            (n as i32).into(),
            (kdim as i32).into(),
            (cps as i32).into(),
        ],
    )?;
    if splits > 1 {
        let total = m * n;
        dev.launch(
            &k::INT4_MATMUL,
            "w4a16_splitk_reduce",
            (cdiv(total, 256) as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(wsp),
                (splits as i32).into(),
                (m as i32).into(),
                (n as i32).into(),
                Arg::Ptr(y),
                (ldy as i32).into(),
                (y_f32 as i32).into(),
            ],
        )?;
    }
    Ok(())
}

/// The batched BF16 linear of [`LinearArgs`] on the crate's own kernel, which needs K % 32,
/// row and batch strides of X and W % 8, and X and W 16-byte aligned.
pub fn bf16_matmul(dev: &CudaDevice, args: LinearArgs, ws: Workspace) -> Result<()> {
    if args.is_empty() {
        return Ok(());
    }
    let ((x, ldx, sxz), (w, ldw, swz), (y, ldy, syz)) =
        (args.x.parts(), args.w.parts(), args.y.parts());
    let LinearArgs {
        y_f32,
        m,
        n,
        k: kdim,
        batch,
        ..
    } = args;
    if kdim % 32 != 0
        || ldx % 8 != 0
        || ldw % 8 != 0
        || sxz % 8 != 0
        || swz % 8 != 0
        || ldx < kdim
        || ldw < kdim
        || ldy < n
    {
        return Err(inv(format!("bf16_matmul: K {kdim} (% 32), ldx {ldx}, ldw {ldw}, strides {sxz} {swz} (% 8), ldy {ldy}")));
    }
    if batch > 65535 {
        return Err(inv(format!("bf16_matmul: batch {batch} > 65535")));
    }
    aligned(x, 16, "bf16_matmul X")?;
    aligned(w, 16, "bf16_matmul W")?;
    let (_, suffix) = nt_for(m);
    let blocks = cdiv(n, 128) * batch;
    let splits = pick_splits(dev, blocks, kdim, batch * m * n, ws);
    let cps = cdiv(cdiv(kdim, KC), splits);
    let wsp = if splits > 1 { ws.unwrap().0 } else { 0 };
    dev.launch(
        &k::BF16_MATMUL,
        &format!("bf16_matmul_{suffix}"),
        (cdiv(n, 128) as u32, splits as u32, batch as u32),
        (128, 1, 1),
        0,
        &[
            Arg::Ptr(x),
            (ldx as i32).into(),
            (sxz as i64).into(),
            Arg::Ptr(w),
            (ldw as i32).into(),
            (swz as i64).into(),
            Arg::Ptr(y),
            (ldy as i32).into(),
            (syz as i64).into(),
            (y_f32 as i32).into(),
            Arg::Ptr(wsp),
            (m as i32).into(),
            (n as i32).into(),
            (kdim as i32).into(),
            (cps as i32).into(),
        ],
    )?;
    if splits > 1 {
        let total = batch * m * n;
        dev.launch(
            &k::BF16_MATMUL,
            "bf16_splitk_reduce",
            (cdiv(total, 256).min(65535 * 4) as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(wsp),
                (splits as i32).into(),
                (batch as i32).into(),
                (m as i32).into(),
                (n as i32).into(),
                Arg::Ptr(y),
                (ldy as i32).into(),
                (syz as i64).into(),
                (y_f32 as i32).into(),
            ],
        )?;
    }
    Ok(())
}

/// Router configuration (DeepSeek-V3 / Kimi-K2 names).
#[derive(Debug, Clone, Copy)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub renormalize: bool,
    pub routed_scaling: f32,
    pub hidden: usize,
    pub inter: usize,
}

impl MoeConfig {
    /// Kimi-K2.5: 384 experts, top-8, one group, renormalised, scaling 2.827, 7168 / 2048.
    pub fn kimi_k25() -> Self {
        MoeConfig {
            n_experts: 384,
            top_k: 8,
            n_group: 1,
            topk_group: 1,
            renormalize: true,
            routed_scaling: 2.827,
            hidden: 7168,
            inter: 2048,
        }
    }
}

/// Device scratch for the MoE of up to `max_tokens` tokens.
pub struct MoeScratch {
    pub ids: crate::DBuf<i32>,
    pub wts: crate::DBuf<f32>,
    pub offsets: crate::DBuf<i32>,
    pub sorted: crate::DBuf<i32>,
    pub active: crate::DBuf<i32>,
    pub num_active: crate::DBuf<i32>,
    pub act: crate::DBuf<u16>,
    pub down: crate::DBuf<f32>,
    pub max_tokens: usize,
}

impl MoeScratch {
    pub fn new(dev: &CudaDevice, c: &MoeConfig, max_tokens: usize) -> Result<Self> {
        let p = max_tokens * c.top_k;
        Ok(MoeScratch {
            ids: dev.alloc(p)?,
            wts: dev.alloc(p)?,
            offsets: dev.alloc(c.n_experts + 1)?,
            sorted: dev.alloc(p)?,
            active: dev.alloc(c.n_experts)?,
            num_active: dev.alloc(1)?,
            act: dev.alloc(p * c.inter)?,
            down: dev.alloc(p * c.hidden)?,
            max_tokens,
        })
    }
}

/// Expert weights of one layer: W13 int32 [E, 2I, H/8] (gate rows then up rows), S13 bf16
/// [E, 2I, H/32], W2 int32 [E, H, I/8], S2 bf16 [E, H, I/32].
#[derive(Debug, Clone, Copy)]
pub struct MoeWeights {
    pub w13: u64,
    pub s13: u64,
    pub w2: u64,
    pub s2: u64,
}

/// Routing only: logits f32 [T, E] -> ids, wts in `sc`.
pub fn moe_route(
    dev: &CudaDevice,
    c: &MoeConfig,
    logits: u64,
    bias: u64,
    t: usize,
    sc: &MoeScratch,
) -> Result<()> {
    if c.n_group > 64
        || c.n_group == 0
        || c.n_experts % c.n_group != 0
        || c.topk_group > c.n_group
        || c.top_k > c.n_experts
    {
        return Err(inv(format!("moe_route: bad config {c:?}")));
    }
    if t > sc.max_tokens {
        return Err(inv(format!("moe: {t} tokens > scratch {}", sc.max_tokens)));
    }
    let warps = 4usize;
    let smem = warps * c.n_experts * 4;
    dev.launch(
        &k::FUSED_MOE,
        "moe_route",
        (cdiv(t, warps) as u32, 1, 1),
        (32 * warps as u32, 1, 1),
        smem,
        &[
            Arg::Ptr(logits),
            Arg::Ptr(bias),
            (t as i32).into(),
            (c.n_experts as i32).into(),
            (c.top_k as i32).into(),
            (c.n_group as i32).into(),
            (c.topk_group as i32).into(),
            (c.renormalize as i32).into(),
            c.routed_scaling.into(),
            Arg::from(&sc.ids),
            Arg::from(&sc.wts),
        ],
    )
}

/// The routed experts after routing: align, gate/up + SwiGLU, down, combine (+ shared expert
/// output `shared` bf16 [T, ld_shared], or 0) into `out` bf16 [T, ld_out].
pub fn moe_experts(
    dev: &CudaDevice,
    c: &MoeConfig,
    x: u64,
    ldx: usize,
    t: usize,
    w: &MoeWeights,
    sc: &MoeScratch,
    shared: u64,
    ld_shared: usize,
    out: u64,
    ld_out: usize,
) -> Result<()> {
    let (e, h, i) = (c.n_experts, c.hidden, c.inter);
    if h % 64 != 0 || i % 64 != 0 || ldx % 8 != 0 || e > 4096 {
        return Err(inv(format!(
            "moe: hidden {h} / inter {i} must be multiples of 64, ldx {ldx} of 8"
        )));
    }
    aligned(x, 16, "moe X")?;
    let p = t * c.top_k;
    dev.launch(
        &k::FUSED_MOE,
        "moe_align",
        (1, 1, 1),
        (1024, 1, 1),
        2 * e * 4,
        &[
            Arg::from(&sc.ids),
            (p as i32).into(),
            (e as i32).into(),
            Arg::from(&sc.offsets),
            Arg::from(&sc.sorted),
            Arg::from(&sc.active),
            Arg::from(&sc.num_active),
        ],
    )?;
    let slots = e.min(p) as u32;
    let (_, suffix) = nt_for(cdiv(p, e.min(p)));
    dev.launch(
        &k::FUSED_MOE,
        &format!("moe_gate_up_{suffix}"),
        (cdiv(i, 64) as u32, slots, 1),
        (128, 1, 1),
        0,
        &[
            Arg::Ptr(x),
            (ldx as i32).into(),
            Arg::Ptr(w.w13),
            Arg::Ptr(w.s13),
            Arg::from(&sc.offsets),
            Arg::from(&sc.sorted),
            Arg::from(&sc.active),
            Arg::from(&sc.num_active),
            Arg::from(&sc.act),
            (i as i32).into(),
            (h as i32).into(),
            (c.top_k as i32).into(),
        ],
    )?;
    dev.launch(
        &k::FUSED_MOE,
        &format!("moe_down_{suffix}"),
        (cdiv(h, 128) as u32, slots, 1),
        (128, 1, 1),
        0,
        &[
            Arg::from(&sc.act),
            Arg::Ptr(w.w2),
            Arg::Ptr(w.s2),
            Arg::from(&sc.offsets),
            Arg::from(&sc.sorted),
            Arg::from(&sc.active),
            Arg::from(&sc.num_active),
            Arg::from(&sc.down),
            (i as i32).into(),
            (h as i32).into(),
        ],
    )?;
    dev.launch(
        &k::FUSED_MOE,
        "moe_combine",
        (t as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::from(&sc.down),
            Arg::from(&sc.wts),
            Arg::Ptr(shared),
            (ld_shared as i32).into(),
            (c.top_k as i32).into(),
            (h as i32).into(),
            Arg::Ptr(out),
            (ld_out as i32).into(),
        ],
    )
}

/// MLA attention geometry and workspace.
#[derive(Debug, Clone, Copy)]
pub struct MlaShape {
    pub batch: usize,
    /// query tokens per request (1 = decode)
    pub q_len: usize,
    pub heads: usize,
    pub page_size: usize,
    pub max_pages: usize,
}

/// Number of context splits for `max_kv` tokens (flash-decoding).
pub fn mla_splits(dev: &CudaDevice, s: &MlaShape, max_kv: usize) -> usize {
    // one 150 KB block per SM: pick the split count with the fewest waves per unit of work
    // (ties to fewer splits), each split keeping >= 256 tokens
    let chunks = cdiv(s.q_len * s.heads, 64);
    let base = (s.batch * chunks).max(1);
    let sms = dev.sm_count.max(1);
    let max_s = cdiv(max_kv.max(1), 256).clamp(1, 64);
    let mut best = (f64::INFINITY, 1usize);
    for sp in 1..=max_s {
        let cost = cdiv(base * sp, sms) as f64 / sp as f64;
        if cost < best.0 - 1e-9 {
            best = (cost, sp);
        }
    }
    best.1
}
/// Floats of workspace the attention needs: (o_part, ml).
pub fn mla_workspace(s: &MlaShape, splits: usize) -> (usize, usize) {
    let r = s.q_len * s.heads;
    (s.batch * splits * r * 512, s.batch * splits * r * 2)
}

/// MLA attention (absorbed). q bf16 [B, q_len*H, 576]; cache bf16 [pages, page_size, 576];
/// block_table i32 [B, max_pages]; prefix_len i32 [B]; mask u64 [B, q_len] or 0 (causal);
/// out bf16 [B, q_len*H, ld_out >= 512]. `scale` is the softmax scale (not log2).
pub fn mla_attention(
    dev: &CudaDevice,
    s: &MlaShape,
    q: u64,
    cache: u64,
    block_table: u64,
    prefix_len: u64,
    mask: u64,
    scale: f32,
    splits: usize,
    o_part: u64,
    ml: u64,
    out: u64,
    ld_out: usize,
) -> Result<()> {
    let r = s.q_len * s.heads;
    if s.q_len == 0
        || s.q_len > 64
        || s.heads == 0
        || s.page_size == 0
        || splits == 0
        || splits > 65535
        || ld_out < 512
    {
        return Err(inv(format!(
            "mla_attention: bad shape {s:?} splits {splits} ld_out {ld_out}"
        )));
    }
    aligned(q, 16, "mla q")?;
    aligned(cache, 16, "mla cache")?;
    let chunks = cdiv(r, 64);
    let verify = mask != 0; // causal (mask == 0) runs in the decode kernel for any q_len
    let big = (64 + 2 * 32) * 584 * 2;
    let small = (64 + 16) * 584 * 2;
    let (bt, smem) = if dev.max_smem_optin >= big {
        ("bt32", big)
    } else {
        ("bt16", small)
    };
    let (file, name) = if verify {
        (&k::MLA_VERIFY, format!("mla_verify_{bt}"))
    } else {
        (&k::MLA_DECODE, format!("mla_decode_{bt}"))
    };
    dev.launch(
        file,
        &name,
        (s.batch as u32, chunks as u32, splits as u32),
        (256, 1, 1),
        smem,
        &[
            Arg::Ptr(q),
            Arg::Ptr(cache),
            Arg::Ptr(block_table),
            (s.max_pages as i32).into(),
            Arg::Ptr(prefix_len),
            Arg::Ptr(mask),
            (s.q_len as i32).into(),
            (s.heads as i32).into(),
            (s.page_size as i32).into(),
            (scale * std::f32::consts::LOG2_E).into(),
            Arg::Ptr(o_part),
            Arg::Ptr(ml),
        ],
    )?;
    dev.launch(
        &k::MLA_DECODE,
        "mla_combine",
        (s.batch as u32, r as u32, 1),
        (128, 1, 1),
        0,
        &[
            Arg::Ptr(o_part),
            Arg::Ptr(ml),
            (splits as i32).into(),
            (r as i32).into(),
            Arg::Ptr(out),
            (ld_out as i32).into(),
        ],
    )
}

/// cache[slots[i]] = kv[i] for i < n (rows of 576 bf16).
pub fn mla_kv_store(
    dev: &CudaDevice,
    kv: u64,
    ld_kv: usize,
    slots: u64,
    cache: u64,
    n: usize,
) -> Result<()> {
    aligned(kv, 16, "kv")?;
    if ld_kv % 8 != 0 {
        return Err(inv("mla_kv_store: ld_kv % 8".into()));
    }
    dev.launch(
        &k::MLA_DECODE,
        "mla_kv_store",
        (n as u32, 1, 1),
        (96, 1, 1),
        0,
        &[
            Arg::Ptr(kv),
            (ld_kv as i32).into(),
            Arg::Ptr(slots),
            Arg::Ptr(cache),
        ],
    )
}

/// RMSNorm of `rows` rows of D; with `res_in` != 0, h = x + res_in is stored to `res_out` and normalised.
pub fn rmsnorm(
    dev: &CudaDevice,
    x: u64,
    ldx: usize,
    res_in: u64,
    res_out: u64,
    ldr: usize,
    w: u64,
    y: u64,
    ldy: usize,
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<()> {
    if d % 8 != 0 || ldx % 8 != 0 || ldy % 8 != 0 || (res_in != 0 && ldr % 8 != 0) {
        return Err(inv(format!(
            "rmsnorm: D {d}, ld {ldx} {ldy} {ldr} must be multiples of 8"
        )));
    }
    for (p, n) in [
        (x, "x"),
        (y, "y"),
        (w, "w"),
        (res_in, "res_in"),
        (res_out, "res_out"),
    ] {
        aligned(p, 16, n)?;
    }
    dev.launch(
        &k::RMSNORM,
        "rmsnorm",
        (rows as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(x),
            (ldx as i32).into(),
            Arg::Ptr(res_in),
            Arg::Ptr(res_out),
            (ldr as i32).into(),
            Arg::Ptr(w),
            Arg::Ptr(y),
            (ldy as i32).into(),
            (d as i32).into(),
            eps.into(),
        ],
    )
}

/// In-place rotary embedding (YaRN inv_freq f32 [rot_dim/2] from [`crate::reference::yarn_inv_freq`]).
pub fn rope(
    dev: &CudaDevice,
    x: u64,
    t: usize,
    heads: usize,
    ld_tok: usize,
    ld_head: usize,
    offset: usize,
    rot_dim: usize,
    pos: u64,
    inv_freq: u64,
    mscale: f32,
    interleaved: bool,
) -> Result<()> {
    if rot_dim % 2 != 0 {
        return Err(inv("rope: odd rot_dim".into()));
    }
    dev.launch(
        &k::ROPE,
        "rope_yarn",
        (t as u32, 1, 1),
        (128, 1, 1),
        0,
        &[
            Arg::Ptr(x),
            (heads as i32).into(),
            (ld_tok as i32).into(),
            (ld_head as i32).into(),
            (offset as i32).into(),
            (rot_dim as i32).into(),
            Arg::Ptr(pos),
            Arg::Ptr(inv_freq),
            mscale.into(),
            (interleaved as i32).into(),
        ],
    )
}

/// out[t, i] = silu(gu[t, i]) * gu[t, I + i].
pub fn swiglu(
    dev: &CudaDevice,
    gu: u64,
    ld_in: usize,
    out: u64,
    ld_out: usize,
    t: usize,
    i: usize,
) -> Result<()> {
    if t > 65535 {
        return Err(inv("swiglu: > 65535 rows".into()));
    }
    dev.launch(
        &k::SWIGLU,
        "swiglu",
        (cdiv(i, 256) as u32, t as u32, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(gu),
            (ld_in as i32).into(),
            Arg::Ptr(out),
            (ld_out as i32).into(),
            (i as i32).into(),
        ],
    )
}

/// A bf16 embedding table on the device: `v` rows of `d` values, rows contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingTable {
    pub ptr: u64,
    /// Rows (vocabulary size); ids outside [0, v) read zeros.
    pub v: usize,
    /// Values per row (hidden size), also the row stride.
    pub d: usize,
}

/// out[t] = table[ids[t]] (zeros for ids outside [0, V)).
pub fn embedding(
    dev: &CudaDevice,
    ids: u64,
    table: EmbeddingTable,
    out: u64,
    ld_out: usize,
    t: usize,
) -> Result<()> {
    let EmbeddingTable { ptr: table, v, d } = table;
    if d % 8 != 0 || ld_out % 8 != 0 {
        return Err(inv("embedding: D and ld_out must be multiples of 8".into()));
    }
    aligned(table, 16, "table")?;
    aligned(out, 16, "out")?;
    dev.launch(
        &k::EMBEDDING,
        "embedding_gather",
        (t as u32, 1, 1),
        (128, 1, 1),
        0,
        &[
            Arg::Ptr(ids),
            Arg::Ptr(table),
            (v as i32).into(),
            (d as i32).into(),
            Arg::Ptr(out),
            (ld_out as i32).into(),
        ],
    )
}

/// Per-row top-k of f32 scores; `prob` (or 0) receives softmax probabilities of the picks.
pub fn topk(
    dev: &CudaDevice,
    x: u64,
    ld: usize,
    rows: usize,
    v: usize,
    kk: usize,
    idx: u64,
    val: u64,
    prob: u64,
) -> Result<()> {
    if kk == 0 || kk > v {
        return Err(inv(format!("topk: k {kk} for V {v}")));
    }
    dev.launch(
        &k::TOPK,
        "topk_rows",
        (rows as u32, 1, 1),
        (512, 1, 1),
        0,
        &[
            Arg::Ptr(x),
            (ld as i32).into(),
            (v as i32).into(),
            (kk as i32).into(),
            Arg::Ptr(idx),
            Arg::Ptr(val),
            Arg::Ptr(prob),
        ],
    )
}

/// Greedy tree verification (see tree_verify.cu). All arrays i32 [B, N] except accept_len [B].
pub fn tree_verify_greedy(
    dev: &CudaDevice,
    cand: u64,
    parent: u64,
    target: u64,
    b: usize,
    n: usize,
    accept_len: u64,
    accept_nodes: u64,
    out_tokens: u64,
) -> Result<()> {
    dev.launch(
        &k::TREE_VERIFY,
        "tree_verify_greedy",
        (cdiv(b, 64) as u32, 1, 1),
        (64, 1, 1),
        0,
        &[
            Arg::Ptr(cand),
            Arg::Ptr(parent),
            Arg::Ptr(target),
            (b as i32).into(),
            (n as i32).into(),
            Arg::Ptr(accept_len),
            Arg::Ptr(accept_nodes),
            Arg::Ptr(out_tokens),
        ],
    )
}

/// Per-row sampling (see sampling.cu). temperature f32 [rows], top_k i32 [rows], top_p f32
/// [rows], uniform f32 [rows] in [0, 1); out i32 [rows].
pub fn sample(
    dev: &CudaDevice,
    logits: u64,
    ld: usize,
    rows: usize,
    v: usize,
    temperature: u64,
    top_k: u64,
    top_p: u64,
    uniform: u64,
    out: u64,
) -> Result<()> {
    dev.launch(
        &k::SAMPLING,
        "sample_rows",
        (rows as u32, 1, 1),
        (1024, 1, 1),
        0,
        &[
            Arg::Ptr(logits),
            (ld as i32).into(),
            (v as i32).into(),
            Arg::Ptr(temperature),
            Arg::Ptr(top_k),
            Arg::Ptr(top_p),
            Arg::Ptr(uniform),
            Arg::Ptr(out),
        ],
    )
}
