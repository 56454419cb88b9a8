//! Timings on the GPU with CUDA events: ceilings measured in the same run (device-to-device copy
//! bandwidth, cuBLAS BF16 GEMM), kernel cases beside SGLang's H200 numbers (aiconfigurator
//! h200_sxm CSVs, embedded below; the BF16 linears both on the own kernel and on cuBLAS), and a
//! full-width Kimi-K2.5-like layer stack (MLA attention + INT4 MoE per layer, random weights,
//! dense projections on cuBLAS where it loads) for decode and verify, written as a calibration
//! profile.

use crate::selftest::Rand;
use kbench_core::error_chain::Chain;
use kbench_cuda::bf16;
use kbench_cuda::blas::Blas;
use kbench_cuda::device::{CudaDevice, DBuf};
use kbench_cuda::ops::{self, MlaShape, MoeConfig, MoeScratch, MoeWeights};
use kbench_cuda::Result;
use kbench_cuda::{Linear, LinearArgs, Operand};
use std::fmt::Write as _;

/// One timed case.
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub name: String,
    pub ms: f64,
    /// bytes moved (minimum: each input once, each output once)
    pub bytes: f64,
    pub flops: f64,
    /// SGLang's time for the same shape on H200 (ms), and which kernel
    pub ref_ms: Option<f64>,
    pub ref_name: &'static str,
}
impl BenchRow {
    pub fn gbs(&self) -> f64 {
        self.bytes / (self.ms * 1e-3) / 1e9
    }
    pub fn tflops(&self) -> f64 {
        self.flops / (self.ms * 1e-3) / 1e12
    }
}

/// A case to time: `run` enqueues one execution.
pub struct Case<'a> {
    pub name: String,
    pub bytes: f64,
    pub flops: f64,
    pub ref_ms: Option<f64>,
    pub ref_name: &'static str,
    pub run: Box<dyn FnMut() -> Result<()> + 'a>,
}

/// SGLang's time for one call of `op` at `x` on H200 (ms), from the aiconfigurator h200_sxm
/// tables kbench embeds (data/optables/h200_sxm, the same rows the simulator prices with);
/// `None` where the tables would have to extrapolate.
pub fn sglang_h200_ms(op: &str, x: [f64; 3]) -> Option<f64> {
    let tables = kbench_sim::optable::OpTables::embedded("h200_sxm").ok()?;
    let ms = tables
        .lookup(op, x, "a kernel benchmark's reference")
        .ok()?;
    tables.flagged().is_empty().then_some(ms)
}

/// Marlin INT4 MoE (int4_wo), 384 experts, top-8, moe_tp 1, ep 1, balanced routing.
fn sglang_marlin_moe_ms(tokens: usize) -> Option<f64> {
    sglang_h200_ms(
        "moe/int4_wo/h7168/i2048/e384/k8/balanced",
        [1.0, tokens as f64, 1.0],
    )
}

/// torch's bf16 linear (`gemm/bf16`: n, k, m).
fn sglang_bf16_gemm_ms(m: usize, n: usize, k: usize) -> Option<f64> {
    sglang_h200_ms("gemm/bf16", [n as f64, k as f64, m as f64])
}

/// MLA decode (`mla_gen/bf16`: heads, batch, step) with Kimi-K2.5's 64 heads.
fn sglang_mla_decode_ms(batch: usize, step: usize) -> Option<f64> {
    sglang_h200_ms("mla_gen/bf16", [NH as f64, batch as f64, step as f64])
}

/// The BF16 linears of Kimi-K2.5's attention and shared expert at TP 1 (m, n, k).
const BF16_LINEAR_SHAPES: &[(usize, usize, usize)] = &[
    (1, 1536, 7168),
    (16, 1536, 7168),
    (64, 1536, 7168),
    (1, 4096, 7168),
    (16, 4096, 7168),
    (64, 4096, 7168),
    (1, 7168, 8192),
    (16, 7168, 8192),
    (64, 7168, 8192),
    (1, 12288, 1536),
    (16, 12288, 1536),
    (64, 12288, 1536),
];

/// Upload `n` random bf16 values in [-a, a).
pub fn rand_bf16(dev: &CudaDevice, rng: &mut Rand, n: usize, a: f32) -> Result<DBuf<u16>> {
    let v: Vec<u16> = (0..n).map(|_| bf16::from_f32(rng.sym(a))).collect();
    dev.upload(&v)
}
/// Buffer of `n` u16 filled with a pattern word (two bf16: +-2^-7 by default).
pub fn pattern_u16(dev: &CudaDevice, n: usize, word: u32) -> Result<DBuf<u16>> {
    let b = dev.alloc::<u16>(n.div_ceil(2) * 2)?;
    dev.fill_u32(b.ptr(), word, n.div_ceil(2))?;
    Ok(b)
}
pub fn pattern_u32(dev: &CudaDevice, n: usize, word: u32) -> Result<DBuf<u32>> {
    let b = dev.alloc::<u32>(n)?;
    dev.fill_u32(b.ptr(), word, n)?;
    Ok(b)
}
const BF_PM: u32 = 0x3C00_BC00; // (+0.0078125, -0.0078125)
const Q4_WORD: u32 = 0x19E6_A57C; // mixed nibbles
const SCALE_WORD: u32 = 0x3C00_3C00;

/// Time a case: `warm` runs, then the median of `reps` event-timed runs.
pub fn time_case(dev: &CudaDevice, c: &mut Case<'_>, warm: usize, reps: usize) -> Result<BenchRow> {
    for _ in 0..warm {
        (c.run)()?;
    }
    dev.sync()?;
    let ms = dev.time_ms(reps, || (c.run)())?;
    Ok(BenchRow {
        name: c.name.clone(),
        ms,
        bytes: c.bytes,
        flops: c.flops,
        ref_ms: c.ref_ms,
        ref_name: c.ref_name,
    })
}

/// Microseconds per kernel of a replayed CUDA graph of dependent one-row RMSNorms: the
/// slope between graphs of 250 and 1,000 kernels, so the graph's own launch cancels.
pub fn kernel_boundary_us(dev: &CudaDevice) -> Result<f64> {
    const D: usize = 64;
    let mut rng = Rand::new(0x6b62_656e_6368);
    let a = rand_bf16(dev, &mut rng, D, 1.0)?;
    let b = rand_bf16(dev, &mut rng, D, 1.0)?;
    let w = rand_bf16(dev, &mut rng, D, 1.0)?;
    // each kernel reads what the one before wrote, as a forward's layers do
    let chain = |n: usize| -> Result<()> {
        for i in 0..n {
            let (x, y) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
            ops::rmsnorm(dev, x.ptr(), D, 0, 0, 0, w.ptr(), y.ptr(), D, 1, D, 1e-6)?;
        }
        Ok(())
    };
    // eagerly first: the kernel's module loads outside any capture
    chain(2)?;
    dev.sync()?;
    let (short, long) = (250, 1000);
    let g_short = dev.capture(|| chain(short))?;
    let g_long = dev.capture(|| chain(long))?;
    for g in [&g_short, &g_long] {
        g.launch()?;
    }
    dev.sync()?;
    let t_short = dev.time_ms(20, || g_short.launch())?;
    let t_long = dev.time_ms(20, || g_long.launch())?;
    Ok((t_long - t_short) * 1e3 / (long - short) as f64)
}

/// Device-to-device copy bandwidth (bytes read + written per second), GB/s.
pub fn copy_bandwidth(dev: &CudaDevice) -> Result<f64> {
    let n = 1usize << 30;
    let a = dev.alloc::<u8>(n)?;
    let b = dev.alloc::<u8>(n)?;
    dev.fill_bytes(&a, 0x5a)?;
    for _ in 0..2 {
        dev.copy_d2d(b.ptr(), a.ptr(), n)?;
    }
    let ms = dev.time_ms(10, || dev.copy_d2d(b.ptr(), a.ptr(), n))?;
    Ok(2.0 * n as f64 / (ms * 1e-3) / 1e9)
}

/// cuBLAS BF16 GEMM n^3 (f32 compute) on random data through [`Blas`], TFLOP/s.
/// `CudaError::NoCublas` if libcublas is not loadable.
pub fn cublas_bf16_tflops(dev: &CudaDevice, n: usize) -> Result<f64> {
    let blas = Blas::new(dev)?;
    let mut rng = Rand::new(7);
    let a = rand_bf16(dev, &mut rng, n * n, 1.0)?;
    let b = rand_bf16(dev, &mut rng, n * n, 1.0)?;
    let c = dev.alloc::<u16>(n * n)?;
    let run = || blas.bf16_linear(LinearArgs::dense(a.ptr(), b.ptr(), c.ptr(), n, n, n));
    for _ in 0..3 {
        run()?;
    }
    let ms = dev.time_ms(10, run)?;
    Ok(2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12)
}

/// Kernel cases (weights rotated over several copies so repeated runs do not measure L2).
pub fn kernel_cases<'a>(dev: &'a CudaDevice, quick: bool) -> Result<Vec<Case<'a>>> {
    let mut cases: Vec<Case<'a>> = vec![];
    let mut rng = Rand::new(11);
    let rot =
        |bytes: usize| -> usize { ((4 * dev.l2_bytes.max(1)) / bytes.max(1)).clamp(1, 16) + 1 };
    let ws = std::rc::Rc::new(dev.alloc::<f32>(32 << 20)?);
    // INT4 matmul, N = K = 7168
    let (n, k) = (7168usize, 7168usize);
    let wbytes = n * k / 2 + n * k / 32 * 2;
    let copies = rot(wbytes);
    let wq = std::rc::Rc::new(
        (0..copies)
            .map(|_| pattern_u32(dev, n * k / 8, Q4_WORD))
            .collect::<Result<Vec<_>>>()?,
    );
    let sc = std::rc::Rc::new(
        (0..copies)
            .map(|_| pattern_u16(dev, n * k / 32, SCALE_WORD))
            .collect::<Result<Vec<_>>>()?,
    );
    let ms: &[usize] = if quick {
        &[1, 16]
    } else {
        &[1, 2, 4, 8, 16, 64]
    };
    for &m in ms {
        let x = rand_bf16(dev, &mut rng, m * k, 1.0)?;
        let y = dev.alloc::<u16>(m * n)?;
        let (wq, sc, ws) = (wq.clone(), sc.clone(), ws.clone());
        let mut i = 0usize;
        let dref: &'a CudaDevice = dev;
        cases.push(Case {
            name: format!("int4_matmul M{m} N{n} K{k}"),
            bytes: (wbytes + m * k * 2 + m * n * 2) as f64,
            flops: 2.0 * (m * n * k) as f64,
            ref_ms: None,
            ref_name: "",
            run: Box::new(move || {
                i = (i + 1) % wq.len();
                ops::int4_matmul(
                    dref,
                    x.ptr(),
                    k,
                    wq[i].ptr(),
                    sc[i].ptr(),
                    y.ptr(),
                    n,
                    false,
                    m,
                    n,
                    k,
                    Some((ws.ptr(), ws.len())),
                )
            }),
        });
    }
    // BF16 linear beside torch's: the own kernel, then cuBLAS at the same shape on the same
    // rotated weights (no cuBLAS rows where it is not loadable; kernel_table says why)
    let blas = Blas::new(dev).ok().map(std::rc::Rc::new);
    for &(m, n, k) in BF16_LINEAR_SHAPES {
        let r = sglang_bf16_gemm_ms(m, n, k);
        if quick && m != 16 {
            continue;
        }
        let copies = rot(n * k * 2);
        let w = std::rc::Rc::new(
            (0..copies)
                .map(|_| pattern_u16(dev, n * k, BF_PM))
                .collect::<Result<Vec<_>>>()?,
        );
        let x = std::rc::Rc::new(rand_bf16(dev, &mut rng, m * k, 1.0)?);
        let y = std::rc::Rc::new(dev.alloc::<u16>(m * n)?);
        let bytes = (n * k * 2 + m * k * 2 + m * n * 2) as f64;
        let flops = 2.0 * (m * n * k) as f64;
        {
            let (w, x, y, ws) = (w.clone(), x.clone(), y.clone(), ws.clone());
            let mut i = 0usize;
            let dref: &'a CudaDevice = dev;
            cases.push(Case {
                name: format!("bf16_matmul M{m} N{n} K{k}"),
                bytes,
                flops,
                ref_ms: r,
                ref_name: "torch bf16 linear",
                run: Box::new(move || {
                    i = (i + 1) % w.len();
                    ops::bf16_matmul(
                        dref,
                        LinearArgs::dense(x.ptr(), w[i].ptr(), y.ptr(), m, n, k),
                        Some((ws.ptr(), ws.len())),
                    )
                }),
            });
        }
        if let Some(blas) = &blas {
            let blas = blas.clone();
            let mut i = 0usize;
            cases.push(Case {
                name: format!("cublas bf16 linear M{m} N{n} K{k}"),
                bytes,
                flops,
                ref_ms: r,
                ref_name: "torch bf16 linear",
                run: Box::new(move || {
                    i = (i + 1) % w.len();
                    blas.bf16_linear(LinearArgs::dense(x.ptr(), w[i].ptr(), y.ptr(), m, n, k))
                }),
            });
        }
    }
    // Kimi MoE layer: 384 experts, top-8 (9.5 GB of INT4 weights: no rotation needed)
    let c = MoeConfig::kimi_k25();
    let moe = std::rc::Rc::new(MoeLayerBufs::new(dev, &c)?);
    let toks: &[usize] = if quick {
        &[1, 64]
    } else {
        &[1, 8, 16, 32, 64, 128]
    };
    let mut moe_cases: Vec<(usize, bool)> = toks.iter().map(|&t| (t, true)).collect();
    moe_cases.push((64, false));
    for (t, balanced) in moe_cases {
        // balanced: token i takes experts (8i .. 8i+7) mod E, like aiconfigurator's "balanced"
        let lg: Vec<f32> = if balanced {
            (0..t * c.n_experts)
                .map(|i| {
                    let (tok, e) = (i / c.n_experts, i % c.n_experts);
                    let hit = (0..c.top_k).any(|j| (tok * c.top_k + j) % c.n_experts == e);
                    if hit {
                        8.0 + rng.sym(0.5)
                    } else {
                        -8.0 + rng.sym(0.5)
                    }
                })
                .collect()
        } else {
            rng.vec(t * c.n_experts, 3.0)
        };
        let logits = dev.upload(&lg)?;
        let x = rand_bf16(dev, &mut rng, t * c.hidden, 1.0)?;
        let out = dev.alloc::<u16>(t * c.hidden)?;
        let sc = MoeScratch::new(dev, &c, t)?;
        let moe = moe.clone();
        let dref: &'a CudaDevice = dev;
        let p = t * c.top_k;
        let distinct = if balanced {
            (t * c.top_k).min(c.n_experts) as f64
        } else {
            c.n_experts as f64 * (1.0 - (1.0 - c.top_k as f64 / c.n_experts as f64).powi(t as i32))
        };
        let per_expert = (3 * c.hidden * c.inter) as f64 * 0.5625;
        cases.push(Case {
            name: format!(
                "moe int4 E384 top8 T{t} {} (route+experts)",
                if balanced { "balanced" } else { "random" }
            ),
            bytes: distinct * per_expert + (t * c.hidden * 4) as f64,
            flops: 2.0 * (p * 3 * c.hidden * c.inter) as f64,
            ref_ms: if balanced {
                sglang_marlin_moe_ms(t)
            } else {
                None
            },
            ref_name: if balanced {
                "SGLang Marlin MoE (balanced)"
            } else {
                ""
            },
            run: Box::new(move || {
                ops::moe_route(dref, &c, logits.ptr(), moe.bias.ptr(), t, &sc)?;
                ops::moe_experts(
                    dref,
                    &c,
                    x.ptr(),
                    c.hidden,
                    t,
                    &moe.weights(),
                    &sc,
                    0,
                    0,
                    out.ptr(),
                    c.hidden,
                )
            }),
        });
    }
    // MLA decode / verify
    let mla: &[(usize, usize, usize, Option<f64>)] = if quick {
        &[(64, 1, 4095, sglang_mla_decode_ms(64, 4095))]
    } else {
        &[
            (1, 1, 4095, None),
            (16, 1, 4095, None),
            (64, 1, 4095, sglang_mla_decode_ms(64, 4095)),
            (64, 1, 8191, None),
            (16, 4, 2048, None),
        ]
    };
    for &(b, q_len, prefix, r) in mla {
        let h = 64usize;
        let ps = 64usize;
        let kv_len = prefix + q_len;
        let max_pages = kv_len.div_ceil(ps);
        let cache = pattern_u16(dev, b * max_pages * ps * 576, BF_PM)?;
        let table: Vec<i32> = (0..(b * max_pages) as i32).collect();
        let dt = dev.upload(&table)?;
        let dp = dev.upload(&vec![prefix as i32; b])?;
        let masks: Vec<u64> = (0..b * q_len)
            .map(|i| (1u64 << ((i % q_len) + 1)) - 1)
            .collect();
        let dm = dev.upload(&masks)?;
        let q = rand_bf16(dev, &mut rng, b * q_len * h * 576, 1.0)?;
        let shape = MlaShape {
            batch: b,
            q_len,
            heads: h,
            page_size: ps,
            max_pages,
        };
        let splits = ops::mla_splits(dev, &shape, kv_len);
        let (no, nm) = ops::mla_workspace(&shape, splits);
        let op = dev.alloc::<f32>(no)?;
        let ml = dev.alloc::<f32>(nm)?;
        let out = dev.alloc::<u16>(b * q_len * h * 512)?;
        let dref: &'a CudaDevice = dev;
        let masked = q_len > 1;
        cases.push(Case {
            name: format!(
                "mla_{} B{b} q{q_len} H{h} kv{kv_len} splits {splits}",
                if masked { "verify" } else { "decode" }
            ),
            bytes: (b * kv_len * 576 * 2 + b * q_len * h * (576 + 512) * 2) as f64,
            flops: (b * q_len * h * kv_len * 2 * (576 + 512)) as f64,
            ref_ms: r,
            ref_name: if r.is_some() {
                "SGLang MLA decode (flash_attention, bf16 KV)"
            } else {
                ""
            },
            run: Box::new(move || {
                ops::mla_attention(
                    dref,
                    &shape,
                    q.ptr(),
                    cache.ptr(),
                    dt.ptr(),
                    dp.ptr(),
                    if masked { dm.ptr() } else { 0 },
                    1.0 / 192f32.sqrt(),
                    splits,
                    op.ptr(),
                    ml.ptr(),
                    out.ptr(),
                    512,
                )
            }),
        });
    }
    Ok(cases)
}

/// INT4 expert weights of one Kimi layer (pattern-filled) + random correction bias.
pub struct MoeLayerBufs {
    pub w13: DBuf<u32>,
    pub s13: DBuf<u16>,
    pub w2: DBuf<u32>,
    pub s2: DBuf<u16>,
    pub bias: DBuf<f32>,
}
impl MoeLayerBufs {
    pub fn new(dev: &CudaDevice, c: &MoeConfig) -> Result<Self> {
        let (e, h, i) = (c.n_experts, c.hidden, c.inter);
        let mut rng = Rand::new(3);
        Ok(MoeLayerBufs {
            w13: pattern_u32(dev, e * 2 * i * h / 8, Q4_WORD)?,
            s13: pattern_u16(dev, e * 2 * i * h / 32, SCALE_WORD)?,
            w2: pattern_u32(dev, e * h * i / 8, Q4_WORD)?,
            s2: pattern_u16(dev, e * h * i / 32, SCALE_WORD)?,
            bias: dev.upload(&rng.vec(e, 0.01))?,
        })
    }
    pub fn weights(&self) -> MoeWeights {
        MoeWeights {
            w13: self.w13.ptr(),
            s13: self.s13.ptr(),
            w2: self.w2.ptr(),
            s2: self.s2.ptr(),
        }
    }
}

/// Compact table of kernel timings and ceilings.
pub fn kernel_table(dev: &CudaDevice, quick: bool) -> Result<(String, Vec<BenchRow>)> {
    let mut s = String::new();
    let copy = copy_bandwidth(dev)?;
    let _ = writeln!(
        s,
        "ceiling: device-to-device copy {copy:.0} GB/s (read + write)"
    );
    match cublas_bf16_tflops(dev, 8192) {
        Ok(t) => {
            let sglang = sglang_bf16_gemm_ms(8192, 8192, 8192)
                .map_or("not in the h200 tables".into(), |ms| format!("{ms:.3} ms"));
            let _ = writeln!(
                s,
                "ceiling: cuBLAS bf16 8192^3 {t:.0} TFLOP/s ({:.3} ms; SGLang torch {sglang})",
                2.0 * 8192f64.powi(3) / t / 1e9
            );
        }
        Err(e) => {
            let _ = writeln!(s, "ceiling: cuBLAS bf16 unavailable: {}", Chain(&e));
        }
    }
    match kernel_boundary_us(dev) {
        Ok(us) => {
            let _ = writeln!(
                s,
                "ceiling: a replayed graph's dependent one-row kernels take {us:.2} us each (the boundary cost kbench's launch.kernel_gap_us stands for where it is not Marlin's)"
            );
        }
        Err(e) => {
            let _ = writeln!(s, "ceiling: kernel boundary unavailable: {}", Chain(&e));
        }
    }
    let mut rows = vec![];
    let _ = writeln!(
        s,
        "{:<62} {:>9} {:>8} {:>6} {:>8} {:>9} {:>7}",
        "case", "ms", "GB/s", "%copy", "TFLOP/s", "ref ms", "ref/us"
    );
    for mut c in kernel_cases(dev, quick)? {
        let row = match time_case(dev, &mut c, 3, if quick { 10 } else { 30 }) {
            Ok(r) => r,
            Err(e) => {
                let _ = writeln!(s, "{:<62} FAILED: {}", c.name, Chain(&e));
                continue;
            }
        };
        let _ = writeln!(
            s,
            "{:<62} {:>9.4} {:>8.0} {:>5.0}% {:>8.1} {:>9} {:>7}",
            row.name,
            row.ms,
            row.gbs(),
            100.0 * row.gbs() / copy,
            row.tflops(),
            row.ref_ms.map(|r| format!("{r:.4}")).unwrap_or_default(),
            row.ref_ms
                .map(|r| format!("{:.2}x", r / row.ms))
                .unwrap_or_default()
        );
        rows.push(row);
    }
    let _ = writeln!(
        s,
        "(ref/us > 1: ours faster than SGLang's kernel on H200; refs from aiconfigurator h200_sxm)"
    );
    Ok((s, rows))
}

// ---------------------------------------------------------------------------------------------
// Layer stack

/// One full-width Kimi-K2.5 decoder layer with random (pattern) weights.
struct StackLayer {
    q_a: DBuf<u16>,
    q_a_norm: DBuf<u16>,
    q_b: DBuf<u16>,
    kv_a: DBuf<u16>,
    kv_norm: DBuf<u16>,
    w_uk_t: DBuf<u16>,
    w_uv: DBuf<u16>,
    o_proj: DBuf<u16>,
    attn_norm: DBuf<u16>,
    ffn_norm: DBuf<u16>,
    router: DBuf<u16>,
    sh_gu: DBuf<u16>,
    sh_down: DBuf<u16>,
    moe: MoeLayerBufs,
    cache: DBuf<u16>,
}

const HID: usize = 7168;
const QLR: usize = 1536;
const NH: usize = 64;
const QK: usize = 192;
const NOPE: usize = 128;
const KVL: usize = 512;
const D576: usize = 576;
const VH: usize = 128;
const SHI: usize = 2048;

/// Per-pass timing of the stack.
#[derive(Debug, Clone)]
pub struct StackRow {
    pub kind: &'static str,
    pub batch: usize,
    pub tokens: usize,
    pub ms: f64,
    pub graph: bool,
    pub active_experts: i32,
}

/// Time `layers` full-width layers for decode (batch b, 1 token each) and verify (4 tokens each,
/// a chain tree mask) with `context` cached tokens per request. The dense BF16 projections run
/// on cuBLAS when it loads, else on the own kernel; the table header and the profile's
/// `[stack] dense_linears` ("cublas" / "own") say which. Returns (table, rows, TOML profile).
pub fn layer_stack(
    dev: &CudaDevice,
    layers: usize,
    context: usize,
    batches: &[usize],
    reps: usize,
) -> Result<(String, Vec<StackRow>, String)> {
    let c = MoeConfig::kimi_k25();
    let q_len_v = 4usize;
    let bmax = *batches.iter().max().unwrap_or(&1);
    let tmax = bmax * q_len_v;
    let ps = 64usize;
    let pages_per_req = (context + q_len_v).div_ceil(ps);
    // memory check: ~9.6 GB per layer for experts + ~0.3 GB rest + cache
    let (free, _) = dev.mem_info()?;
    let per_layer = 9.9e9 + (bmax * pages_per_req * ps * D576 * 2) as f64;
    let layers = layers.min(((free as f64 * 0.85 - 2e9) / per_layer).floor().max(1.0) as usize);
    let mut rng = Rand::new(5);
    let mut ls = vec![];
    for _ in 0..layers {
        ls.push(StackLayer {
            q_a: pattern_u16(dev, QLR * HID, BF_PM)?,
            q_a_norm: pattern_u16(dev, QLR, 0x3F80_3F80)?,
            q_b: pattern_u16(dev, NH * QK * QLR, BF_PM)?,
            kv_a: pattern_u16(dev, D576 * HID, BF_PM)?,
            kv_norm: pattern_u16(dev, KVL, 0x3F80_3F80)?,
            w_uk_t: pattern_u16(dev, NH * KVL * NOPE, BF_PM)?,
            w_uv: pattern_u16(dev, NH * VH * KVL, BF_PM)?,
            o_proj: pattern_u16(dev, HID * NH * VH, BF_PM)?,
            attn_norm: pattern_u16(dev, HID, 0x3F80_3F80)?,
            ffn_norm: pattern_u16(dev, HID, 0x3F80_3F80)?,
            router: rand_bf16(dev, &mut rng, c.n_experts * HID, 0.05)?,
            sh_gu: pattern_u16(dev, 2 * SHI * HID, BF_PM)?,
            sh_down: pattern_u16(dev, HID * SHI, BF_PM)?,
            moe: MoeLayerBufs::new(dev, &c)?,
            cache: pattern_u16(dev, bmax * pages_per_req * ps * D576, BF_PM)?,
        });
    }
    // activations
    let x0 = rand_bf16(dev, &mut rng, tmax * HID, 1.0)?;
    let res = dev.alloc::<u16>(tmax * HID)?;
    let xn = dev.alloc::<u16>(tmax * HID)?;
    let qa = dev.alloc::<u16>(tmax * QLR)?;
    let q = dev.alloc::<u16>(tmax * NH * QK)?;
    let kv = dev.alloc::<u16>(tmax * D576)?;
    let qf = dev.alloc::<u16>(tmax * NH * D576)?;
    let lat = dev.alloc::<u16>(tmax * NH * KVL)?;
    let av = dev.alloc::<u16>(tmax * NH * VH)?;
    let o = dev.alloc::<u16>(tmax * HID)?;
    let logits = dev.alloc::<f32>(tmax * c.n_experts)?;
    let shgu = dev.alloc::<u16>(tmax * 2 * SHI)?;
    let shact = dev.alloc::<u16>(tmax * SHI)?;
    let shout = dev.alloc::<u16>(tmax * HID)?;
    let xa = dev.alloc::<u16>(tmax * HID)?;
    let xb = dev.alloc::<u16>(tmax * HID)?;
    let sc = MoeScratch::new(dev, &c, tmax)?;
    let ws = dev.alloc::<f32>(64 << 20)?;
    let wso = Some((ws.ptr(), ws.len()));
    // the dense projections go through cuBLAS when it loads; the absorbed W_UK / W_UV batched
    // matmuls and the f32 router stay on the own kernel either way
    let blas = Blas::new(dev);
    let lin = Linear::pick(blas.as_ref().ok(), wso);
    let lin_note = match &blas {
        Ok(b) => format!("cuBLAS ({})", b.version),
        Err(e) => format!(
            "own bf16_matmul ({})",
            Chain(e).to_string().replace('\n', " ")
        ),
    };
    let yarn = kbench_cuda::reference::kimi_k25_yarn();
    let (inv, msc) = kbench_cuda::reference::yarn_inv_freq(&yarn, 64);
    let dinv = dev.upload(&inv)?;
    let scale = kbench_cuda::reference::mla_softmax_scale(QK, &yarn);
    let table: Vec<i32> = (0..(bmax * pages_per_req) as i32).collect();
    let dtable = dev.upload(&table)?;
    let mut mla_ws_need = 0usize;
    for &b in batches {
        for ql in [1, q_len_v] {
            let sh = MlaShape {
                batch: b,
                q_len: ql,
                heads: NH,
                page_size: ps,
                max_pages: pages_per_req,
            };
            let (a, m) = ops::mla_workspace(&sh, ops::mla_splits(dev, &sh, context + ql));
            mla_ws_need = mla_ws_need.max(a + m);
        }
    }
    let mla_ws = dev.alloc::<f32>(mla_ws_need)?;

    let mut out_rows = vec![];
    let mut table_s = String::new();
    for &(kind, q_len) in &[("decode", 1usize), ("verify", q_len_v)] {
        for &b in batches {
            let t = b * q_len;
            // per-batch metadata
            let prefix = dev.upload(&vec![context as i32; b])?;
            let pos: Vec<i32> = (0..t).map(|i| (context + i % q_len) as i32).collect();
            let dpos = dev.upload(&pos)?;
            let slots: Vec<i32> = (0..t)
                .map(|i| ((i / q_len) * pages_per_req * ps + context + i % q_len) as i32)
                .collect();
            let dslots = dev.upload(&slots)?;
            let masks: Vec<u64> = (0..t).map(|i| (1u64 << ((i % q_len) + 1)) - 1).collect();
            let dmask = dev.upload(&masks)?;
            let shape = MlaShape {
                batch: b,
                q_len,
                heads: NH,
                page_size: ps,
                max_pages: pages_per_req,
            };
            let splits = ops::mla_splits(dev, &shape, context + q_len);
            let (na, _) = ops::mla_workspace(&shape, splits);
            let pass = || -> Result<()> {
                dev.fill_bytes(&res, 0)?;
                let mut cur = x0.ptr();
                for (li, l) in ls.iter().enumerate() {
                    let next = if li % 2 == 0 { xa.ptr() } else { xb.ptr() };
                    ops::rmsnorm(
                        dev,
                        cur,
                        HID,
                        res.ptr(),
                        res.ptr(),
                        HID,
                        l.attn_norm.ptr(),
                        xn.ptr(),
                        HID,
                        t,
                        HID,
                        1e-6,
                    )?;
                    lin.run(
                        dev,
                        LinearArgs::dense(xn.ptr(), l.q_a.ptr(), qa.ptr(), t, QLR, HID),
                    )?;
                    ops::rmsnorm(
                        dev,
                        qa.ptr(),
                        QLR,
                        0,
                        0,
                        0,
                        l.q_a_norm.ptr(),
                        qa.ptr(),
                        QLR,
                        t,
                        QLR,
                        1e-6,
                    )?;
                    lin.run(
                        dev,
                        LinearArgs::dense(qa.ptr(), l.q_b.ptr(), q.ptr(), t, NH * QK, QLR),
                    )?;
                    lin.run(
                        dev,
                        LinearArgs::dense(xn.ptr(), l.kv_a.ptr(), kv.ptr(), t, D576, HID),
                    )?;
                    ops::rmsnorm(
                        dev,
                        kv.ptr(),
                        D576,
                        0,
                        0,
                        0,
                        l.kv_norm.ptr(),
                        kv.ptr(),
                        D576,
                        t,
                        KVL,
                        1e-6,
                    )?;
                    ops::rope(
                        dev,
                        kv.ptr(),
                        t,
                        1,
                        D576,
                        D576,
                        KVL,
                        64,
                        dpos.ptr(),
                        dinv.ptr(),
                        msc,
                        true,
                    )?;
                    ops::rope(
                        dev,
                        q.ptr(),
                        t,
                        NH,
                        NH * QK,
                        QK,
                        NOPE,
                        64,
                        dpos.ptr(),
                        dinv.ptr(),
                        msc,
                        true,
                    )?;
                    ops::mla_kv_store(dev, kv.ptr(), D576, dslots.ptr(), l.cache.ptr(), t)?;
                    ops::bf16_matmul(
                        dev,
                        LinearArgs {
                            x: Operand::batched(q.ptr(), NH * QK, QK),
                            w: Operand::batched(l.w_uk_t.ptr(), NOPE, KVL * NOPE),
                            y: Operand::batched(qf.ptr(), NH * D576, D576),
                            y_f32: false,
                            m: t,
                            n: KVL,
                            k: NOPE,
                            batch: NH,
                        },
                        wso,
                    )?;
                    dev.copy2d(
                        q.ptr() + (NOPE * 2) as u64,
                        QK * 2,
                        qf.ptr() + (KVL * 2) as u64,
                        D576 * 2,
                        64 * 2,
                        t * NH,
                    )?;
                    ops::mla_attention(
                        dev,
                        &shape,
                        qf.ptr(),
                        l.cache.ptr(),
                        dtable.ptr(),
                        prefix.ptr(),
                        if q_len > 1 { dmask.ptr() } else { 0 },
                        scale,
                        splits,
                        mla_ws.ptr(),
                        mla_ws.ptr_at(na),
                        lat.ptr(),
                        KVL,
                    )?;
                    ops::bf16_matmul(
                        dev,
                        LinearArgs {
                            x: Operand::batched(lat.ptr(), NH * KVL, KVL),
                            w: Operand::batched(l.w_uv.ptr(), KVL, VH * KVL),
                            y: Operand::batched(av.ptr(), NH * VH, VH),
                            y_f32: false,
                            m: t,
                            n: VH,
                            k: KVL,
                            batch: NH,
                        },
                        wso,
                    )?;
                    lin.run(
                        dev,
                        LinearArgs::dense(av.ptr(), l.o_proj.ptr(), o.ptr(), t, HID, NH * VH),
                    )?;
                    ops::rmsnorm(
                        dev,
                        o.ptr(),
                        HID,
                        res.ptr(),
                        res.ptr(),
                        HID,
                        l.ffn_norm.ptr(),
                        xn.ptr(),
                        HID,
                        t,
                        HID,
                        1e-6,
                    )?;
                    ops::bf16_matmul(
                        dev,
                        LinearArgs {
                            y_f32: true,
                            ..LinearArgs::dense(
                                xn.ptr(),
                                l.router.ptr(),
                                logits.ptr(),
                                t,
                                c.n_experts,
                                HID,
                            )
                        },
                        wso,
                    )?;
                    ops::moe_route(dev, &c, logits.ptr(), l.moe.bias.ptr(), t, &sc)?;
                    lin.run(
                        dev,
                        LinearArgs::dense(xn.ptr(), l.sh_gu.ptr(), shgu.ptr(), t, 2 * SHI, HID),
                    )?;
                    ops::swiglu(dev, shgu.ptr(), 2 * SHI, shact.ptr(), SHI, t, SHI)?;
                    lin.run(
                        dev,
                        LinearArgs::dense(shact.ptr(), l.sh_down.ptr(), shout.ptr(), t, HID, SHI),
                    )?;
                    ops::moe_experts(
                        dev,
                        &c,
                        xn.ptr(),
                        HID,
                        t,
                        &l.moe.weights(),
                        &sc,
                        shout.ptr(),
                        HID,
                        next,
                        HID,
                    )?;
                    cur = next;
                }
                Ok(())
            };
            // eager once (checks everything launches), then a graph if capture works
            pass()?;
            dev.sync()?;
            let graph = dev.capture(pass).ok();
            dev.sync()?;
            let ms = match &graph {
                Some(g) => {
                    for _ in 0..2 {
                        g.launch()?;
                    }
                    dev.time_ms(reps, || g.launch())?
                }
                None => {
                    pass()?;
                    dev.time_ms(reps, pass)?
                }
            };
            let active = dev.download(&sc.num_active)?[0];
            out_rows.push(StackRow {
                kind,
                batch: b,
                tokens: t,
                ms,
                graph: graph.is_some(),
                active_experts: active,
            });
        }
    }
    let _ = writeln!(table_s, "layer stack: {layers} full-width Kimi-K2.5 layers (MLA + INT4 MoE 384/top-8 + shared expert), context {context}, page {ps}");
    let _ = writeln!(table_s, "dense BF16 linears (q_a, q_b, kv_a, o_proj, shared expert): {lin_note}; absorbed W_UK / W_UV and router: own bf16_matmul");
    let _ = writeln!(
        table_s,
        "{:<7} {:>5} {:>6} {:>10} {:>12} {:>6} {:>8}",
        "kind", "batch", "tokens", "ms/pass", "ms/layer", "graph", "experts"
    );
    for r in &out_rows {
        let _ = writeln!(
            table_s,
            "{:<7} {:>5} {:>6} {:>10.3} {:>12.4} {:>6} {:>8}",
            r.kind,
            r.batch,
            r.tokens,
            r.ms,
            r.ms / layers as f64,
            r.graph,
            r.active_experts
        );
    }
    let meta = StackMeta {
        device_name: dev.name.clone(),
        compute_capability: dev.cc,
        sm_count: dev.sm_count,
        l2_bytes: dev.l2_bytes,
        total_mem_bytes: dev.total_mem,
        driver_cuda_version: dev.driver_version,
        driver: std::env::var("KBENCH_DRIVER_VERSION").unwrap_or_default(),
        layers,
        context,
        page_size: ps,
        verify_tokens_per_request: q_len_v,
        dense_linears: lin.name().to_string(),
        dense_linears_note: lin_note.to_string(),
        reps,
    };
    let toml = stack_profile_toml(&meta, &out_rows);
    Ok((table_s, out_rows, toml))
}

/// What a stack profile says about where and how it was measured.
#[derive(Debug, Clone)]
pub struct StackMeta {
    pub device_name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: usize,
    pub l2_bytes: usize,
    pub total_mem_bytes: usize,
    pub driver_cuda_version: i32,
    pub driver: String,
    pub layers: usize,
    pub context: usize,
    pub page_size: usize,
    pub verify_tokens_per_request: usize,
    /// `cublas` or `own`.
    pub dense_linears: String,
    pub dense_linears_note: String,
    pub reps: usize,
}

/// The profile `kbench calibrate-passes` reads (kbench-core's `StackProfile`, the one type
/// both sides use); a pure function so the root crate's tests can check the reader takes what
/// this writes without a GPU.
pub fn stack_profile_toml(m: &StackMeta, rows: &[StackRow]) -> String {
    use kbench_core::stack_profile::{StackDevice, StackInfo, StackPass, StackProfile};
    let c = MoeConfig::kimi_k25();
    // times to 10 ns: finer than CUDA events resolve
    let round = |ms: f64| (ms * 1e5).round() / 1e5;
    let profile = StackProfile {
        device: StackDevice {
            name: m.device_name.clone(),
            compute_capability: format!("{}.{}", m.compute_capability.0, m.compute_capability.1),
            sm_count: Some(m.sm_count as u64),
            l2_bytes: Some(m.l2_bytes as u64),
            total_mem_bytes: Some(m.total_mem_bytes as u64),
            driver_cuda_version: Some(i64::from(m.driver_cuda_version)),
            driver: Some(m.driver.clone()),
        },
        stack: StackInfo {
            model: "kimi-k2.5 slice".into(),
            layers: m.layers as u32,
            hidden: HID as u32,
            n_routed_experts: c.n_experts as u32,
            top_k: c.top_k as u32,
            moe_intermediate: c.inter as u32,
            heads: NH as u32,
            kv_lora_rank: KVL as u32,
            context: m.context as u32,
            page_size: Some(m.page_size as u32),
            verify_tokens_per_request: m.verify_tokens_per_request as u32,
            weights: Some("random (pattern-filled experts, random router)".into()),
            dense_linears: Some(m.dense_linears.clone()),
        },
        pass: rows
            .iter()
            .map(|r| StackPass {
                kind: r.kind.into(),
                batch: r.batch as u32,
                tokens: r.tokens as u32,
                ms: round(r.ms),
                ms_per_layer: Some(round(r.ms / m.layers as f64)),
                cuda_graph: r.graph,
                active_experts_last_layer: Some(i64::from(r.active_experts)),
            })
            .collect(),
    };
    profile.to_toml(&format!(
        "kbench GPU layer-stack profile, written by kbench-gpu stack (scripts/gpu-check.sh).\n\
         Per-pass times of `layers` full-width Kimi-K2.5 decoder layers with random weights, CUDA events, median of {}.\n\
         q_a, q_b, kv_a, o_proj, shared expert gate_up / down: {}; absorbed W_UK / W_UV and the f32 router: own bf16_matmul.",
        m.reps, m.dense_linears_note
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel cases' references come from the h200 tables at measured points: the op
    /// names and the axis order are right when each lands on its row (the values here are
    /// the rows of data/optables/h200_sxm, as SGLang measured them).
    #[test]
    fn every_reference_is_a_measured_h200_row() {
        for &(m, n, k) in BF16_LINEAR_SHAPES {
            assert!(sglang_bf16_gemm_ms(m, n, k).is_some(), "({m}, {n}, {k})");
        }
        for t in [1, 8, 16, 32, 64, 128] {
            assert!(sglang_marlin_moe_ms(t).is_some(), "{t} tokens");
        }
        let close = |got: Option<f64>, row: f64| (got.unwrap() - row).abs() < 1e-9;
        assert!(close(sglang_marlin_moe_ms(1), 0.086336));
        assert!(close(sglang_bf16_gemm_ms(16, 4096, 7168), 0.0206347));
        assert!(close(sglang_mla_decode_ms(64, 4095), 0.103918));
        // beyond the grid the tables do not guess
        assert_eq!(sglang_marlin_moe_ms(1 << 20), None);
    }
}
