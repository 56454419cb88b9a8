//! GPU tests: every kernel against the f32 CPU reference on fresh random inputs (ChaCha-seeded),
//! outputs poisoned (0xFF bytes: NaN / -1) before each launch, relative-error bounds per dtype.
//! Used by `tests/gpu.rs` (cargo test) and by `kbench-gpu selftest` (scripts/gpu-check.sh).

use kbench_core::error_chain::Chain;
use kbench_cuda::bf16;
use kbench_cuda::device::CudaDevice;
use kbench_cuda::ops::{self, MlaShape, MoeConfig, MoeScratch, MoeWeights};
use kbench_cuda::reference as r;
use kbench_cuda::{LinearArgs, Operand};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// Outcome of one GPU test.
#[derive(Debug, Clone)]
pub struct TestResult {
    pub name: String,
    pub ok: bool,
    /// Passed without testing anything (an optional library is missing); `detail` says why.
    pub skipped: bool,
    pub detail: String,
    pub millis: f64,
}

impl TestResult {
    /// "ok", "skip" or "FAIL".
    pub fn status(&self) -> &'static str {
        match (self.ok, self.skipped) {
            (false, _) => "FAIL",
            (true, true) => "skip",
            (true, false) => "ok",
        }
    }
}

type TResult = std::result::Result<String, String>;

/// A test that returns `Ok` with a detail starting with this was skipped.
const SKIPPED: &str = "skipped: ";

/// Deterministic random source for the tests.
pub struct Rand(ChaCha8Rng);
impl Rand {
    pub fn new(seed: u64) -> Self {
        Rand(ChaCha8Rng::seed_from_u64(seed))
    }
    pub fn u32(&mut self) -> u32 {
        self.0.next_u32()
    }
    /// uniform in [0, 1)
    pub fn f(&mut self) -> f32 {
        (self.0.next_u32() >> 8) as f32 / (1u32 << 24) as f32
    }
    /// uniform in [-a, a)
    pub fn sym(&mut self, a: f32) -> f32 {
        (self.f() * 2.0 - 1.0) * a
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }
    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.sym(a)).collect()
    }
    /// bf16-representable values in [-a, a)
    pub fn vec_bf(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| bf16::round(self.sym(a))).collect()
    }
    pub fn q4(&mut self, n: usize) -> Vec<i8> {
        (0..n).map(|_| (self.below(16) as i8) - 8).collect()
    }
}

/// KBENCH_SELFTEST_SMALL=1 drops the largest cases (for runs under compute-sanitizer).
fn small() -> bool {
    std::env::var("KBENCH_SELFTEST_SMALL").is_ok_and(|v| v == "1")
}

/// A CUDA error as a failed check's message, with its sources.
fn e(x: kbench_cuda::CudaError) -> String {
    Chain(&x).to_string()
}
fn check_err(what: &str, err: f64, tol: f64) -> TResult {
    if err <= tol {
        Ok(format!("{what}: rel err {err:.2e} <= {tol:.0e}"))
    } else {
        Err(format!("{what}: rel err {err:.3e} > {tol:.0e}"))
    }
}

/// Random INT4 linear (dequantized f32 reference kept).
pub struct QLinear {
    pub wq: Vec<u32>,
    pub s: Vec<u16>,
    pub w: Vec<f32>,
}
pub fn rand_qlinear(rng: &mut Rand, n: usize, k: usize) -> QLinear {
    let q = rng.q4(n * k);
    let wq = r::pack_int4(&q, n, k);
    let s: Vec<u16> = (0..n * k / 32)
        .map(|_| bf16::from_f32(0.002 + rng.f() * 0.02))
        .collect();
    let w = r::dequant_int4(&wq, &s, n, k);
    QLinear { wq, s, w }
}

fn t_int4_matmul(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let mut out = vec![];
    for &(m, n, k, split, f32o) in &[
        (1, 4096, 7168, true, false),
        (1, 1000, 2048, false, true),
        (5, 1000, 2048, true, false),
        (16, 512, 1536, true, true),
        (37, 384, 512, false, false),
        (64, 256, 7168, true, false),
        (200, 130, 1024, false, false),
    ] {
        if small() && m * n * k > 50_000_000 {
            continue;
        }
        let ql = rand_qlinear(rng, n, k);
        let x = rng.vec_bf(m * k, 1.0);
        let yref = r::matmul_nt(&x, &ql.w, m, n, k);
        let dx = dev.upload(&bf16::vec_from(&x)).map_err(e)?;
        let dw = dev.upload(&ql.wq).map_err(e)?;
        let ds = dev.upload(&ql.s).map_err(e)?;
        let ws = dev.alloc::<f32>(16 * m * n).map_err(e)?;
        let wsopt = if split {
            Some((ws.ptr(), ws.len()))
        } else {
            None
        };
        // the one linear, its output f32 or bf16
        let matmul = |y: u64, y_f32: bool| {
            ops::int4_matmul(
                dev,
                dx.ptr(),
                k,
                dw.ptr(),
                ds.ptr(),
                y,
                n,
                y_f32,
                m,
                n,
                k,
                wsopt,
            )
            .map_err(e)
        };
        let y: Vec<f32> = if f32o {
            let dy = dev.alloc_poison::<f32>(m * n).map_err(e)?;
            matmul(dy.ptr(), true)?;
            dev.download(&dy).map_err(e)?
        } else {
            let dy = dev.alloc_poison::<u16>(m * n).map_err(e)?;
            matmul(dy.ptr(), false)?;
            bf16::vec_to(&dev.download(&dy).map_err(e)?)
        };
        let tol = if f32o { 1e-4 } else { 8e-3 };
        out.push(check_err(
            &format!("M{m} N{n} K{k} split {split} f32 {f32o}"),
            r::rel_err(&y, &yref),
            tol,
        )?);
    }
    Ok(out.join("; "))
}

fn t_bf16_matmul(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let mut out = vec![];
    for &(m, n, k, batch, split, f32o) in &[
        (1, 1000, 512, 1, true, false),
        (9, 640, 7168, 1, true, true),
        (3, 512, 128, 4, false, false),
        (40, 300, 256, 2, true, false),
        (130, 96, 96, 1, false, true),
    ] {
        // batched layout as the MLA absorb uses it: X rows of batch*k, W [batch][n][k], Y rows of batch*n
        let x = rng.vec_bf(m * batch * k, 1.0);
        let w = rng.vec_bf(batch * n * k, 0.05);
        let dx = dev.upload(&bf16::vec_from(&x)).map_err(e)?;
        let dw = dev.upload(&bf16::vec_from(&w)).map_err(e)?;
        let ws = dev.alloc::<f32>(16 * batch * m * n).map_err(e)?;
        let wsopt = if split {
            Some((ws.ptr(), ws.len()))
        } else {
            None
        };
        let mut yref = vec![0f32; m * batch * n];
        for z in 0..batch {
            let xz: Vec<f32> = (0..m)
                .flat_map(|i| x[i * batch * k + z * k..i * batch * k + (z + 1) * k].to_vec())
                .collect();
            let yz = r::matmul_nt(&xz, &w[z * n * k..(z + 1) * n * k], m, n, k);
            for i in 0..m {
                yref[i * batch * n + z * n..i * batch * n + (z + 1) * n]
                    .copy_from_slice(&yz[i * n..(i + 1) * n]);
            }
        }
        // the one linear, its output f32 or bf16
        let matmul = |y: u64, y_f32: bool| {
            let args = LinearArgs {
                x: Operand::batched(dx.ptr(), batch * k, k),
                w: Operand::batched(dw.ptr(), k, n * k),
                y: Operand::batched(y, batch * n, n),
                y_f32,
                m,
                n,
                k,
                batch,
            };
            ops::bf16_matmul(dev, args, wsopt).map_err(e)
        };
        let y: Vec<f32> = if f32o {
            let dy = dev.alloc_poison::<f32>(m * batch * n).map_err(e)?;
            matmul(dy.ptr(), true)?;
            dev.download(&dy).map_err(e)?
        } else {
            let dy = dev.alloc_poison::<u16>(m * batch * n).map_err(e)?;
            matmul(dy.ptr(), false)?;
            bf16::vec_to(&dev.download(&dy).map_err(e)?)
        };
        let tol = if f32o { 1e-4 } else { 8e-3 };
        out.push(check_err(
            &format!("M{m} N{n} K{k} batch {batch} split {split} f32 {f32o}"),
            r::rel_err(&y, &yref),
            tol,
        )?);
    }
    Ok(out.join("; "))
}

/// One cuBLAS linear case in the layout of the absorbed MLA matmuls (batch entries side by side
/// in each row: X rows of batch*k, W [batch][n][k], Y rows of batch*n), every row stride padded
/// by `pad` elements.
struct LinCase {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    f32o: bool,
    pad: usize,
}
impl LinCase {
    fn ldx(&self) -> usize {
        self.batch * self.k + self.pad
    }
    fn ldw(&self) -> usize {
        self.k + self.pad
    }
    fn swz(&self) -> usize {
        self.n * self.ldw()
    }
    fn ldy(&self) -> usize {
        self.batch * self.n + self.pad
    }
    fn label(&self) -> String {
        format!(
            "M{} N{} K{} batch {} pad {} f32 {}",
            self.m, self.n, self.k, self.batch, self.pad, self.f32o
        )
    }
    /// f64-accumulated reference, [m, batch*n] without padding.
    fn reference(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        let (m, n, k, b) = (self.m, self.n, self.k, self.batch);
        let mut yref = vec![0f32; m * b * n];
        for z in 0..b {
            let xz: Vec<f32> = (0..m)
                .flat_map(|i| x[i * self.ldx() + z * k..][..k].to_vec())
                .collect();
            let wz: Vec<f32> = (0..n)
                .flat_map(|j| w[z * self.swz() + j * self.ldw()..][..k].to_vec())
                .collect();
            let yz = r::matmul_nt(&xz, &wz, m, n, k);
            for i in 0..m {
                yref[i * b * n + z * n..][..n].copy_from_slice(&yz[i * n..][..n]);
            }
        }
        yref
    }
    /// Enqueue the linear on `blas` into `y`.
    fn run(&self, blas: &kbench_cuda::Blas, dx: u64, dw: u64, y: u64) -> kbench_cuda::Result<()> {
        blas.bf16_linear(LinearArgs {
            x: Operand::batched(dx, self.ldx(), self.k),
            w: Operand::batched(dw, self.ldw(), self.swz()),
            y: Operand::batched(y, self.ldy(), self.n),
            y_f32: self.f32o,
            m: self.m,
            n: self.n,
            k: self.k,
            batch: self.batch,
        })
    }
    /// Run into a poisoned output and check it against `yref`; the padding must stay poisoned.
    fn check(
        &self,
        dev: &CudaDevice,
        yref: &[f32],
        what: &str,
        run: &dyn Fn(u64) -> kbench_cuda::Result<()>,
    ) -> TResult {
        let (m, bn, ldy) = (self.m, self.batch * self.n, self.ldy());
        let (y, poisoned): (Vec<f32>, Vec<bool>) = if self.f32o {
            let dy = dev.alloc_poison::<f32>(m * ldy).map_err(e)?;
            run(dy.ptr()).map_err(e)?;
            let v = dev.download(&dy).map_err(e)?;
            let p = v.iter().map(|a| a.to_bits() == u32::MAX).collect();
            (v, p)
        } else {
            let dy = dev.alloc_poison::<u16>(m * ldy).map_err(e)?;
            run(dy.ptr()).map_err(e)?;
            let v = dev.download(&dy).map_err(e)?;
            let p = v.iter().map(|&a| a == u16::MAX).collect();
            (bf16::vec_to(&v), p)
        };
        for i in 0..m {
            if !poisoned[i * ldy + bn..(i + 1) * ldy].iter().all(|&p| p) {
                return Err(format!(
                    "{} {what}: wrote into row {i}'s padding",
                    self.label()
                ));
            }
        }
        let got: Vec<f32> = (0..m).flat_map(|i| y[i * ldy..][..bn].to_vec()).collect();
        let tol = if self.f32o { 1e-4 } else { 8e-3 };
        check_err(
            &format!("{} {what}", self.label()),
            r::rel_err(&got, yref),
            tol,
        )
    }
}

fn t_cublas_linear(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    // an absent libcublas is a configuration, not a failure; a failing handle is a failure
    if let Err(why) = kbench_cuda::blas::cublas_status() {
        return Ok(format!("{SKIPPED}{why}"));
    }
    let blas = kbench_cuda::Blas::new(dev).map_err(e)?;
    let cases = [
        // decode row, lm_head-like N
        LinCase {
            m: 1,
            n: 4096 + 64,
            k: 7168,
            batch: 1,
            f32o: false,
            pad: 0,
        },
        // odd M, q_a-like, f32 out
        LinCase {
            m: 7,
            n: 1536,
            k: 7168,
            batch: 1,
            f32o: true,
            pad: 0,
        },
        // odd N, K not a multiple of 32, odd padded strides (rows not 16-byte aligned)
        LinCase {
            m: 5,
            n: 1001,
            k: 520,
            batch: 1,
            f32o: false,
            pad: 3,
        },
        // absorbed W_UK: 8 heads, k 128 -> n 512
        LinCase {
            m: 4,
            n: 512,
            k: 128,
            batch: 8,
            f32o: false,
            pad: 0,
        },
        // absorbed W_UV: 8 heads, k 512 -> n 128, padded, f32 out
        LinCase {
            m: 3,
            n: 128,
            k: 512,
            batch: 8,
            f32o: true,
            pad: 8,
        },
    ];
    let mut out = vec![format!(
        "{} (workspace {} MiB)",
        blas.version,
        kbench_cuda::blas::WORKSPACE_BYTES >> 20
    )];
    for (ci, c) in cases.iter().enumerate() {
        if small() && c.m * c.n * c.k * c.batch > 50_000_000 {
            continue;
        }
        let x = rng.vec_bf(c.m * c.ldx(), 1.0);
        let w = rng.vec_bf(c.batch * c.swz(), 0.05);
        let yref = c.reference(&x, &w);
        let dx = dev.upload(&bf16::vec_from(&x)).map_err(e)?;
        let dw = dev.upload(&bf16::vec_from(&w)).map_err(e)?;
        out.push(c.check(dev, &yref, "eager", &|y| {
            c.run(&blas, dx.ptr(), dw.ptr(), y)
        })?);
        // captured into a graph and replayed, as the engine and the layer stack run it (with the
        // handle's own workspace cuBLAS allocates nothing inside the capture); the shape already
        // ran eagerly, so no first-use set-up happens inside it either
        if ci == 2 || ci == 3 {
            out.push(c.check(dev, &yref, "graph", &|y| {
                dev.sync()?;
                let g = dev.capture(|| c.run(&blas, dx.ptr(), dw.ptr(), y))?;
                g.launch()?;
                // the graph must not be destroyed while it runs
                dev.sync()
            })?);
        }
    }
    Ok(out.join("; "))
}

/// Random MoE layer on the device plus host copies for the reference.
pub struct RandMoe {
    pub w13: Vec<QLinear>,
    pub w2: Vec<QLinear>,
    pub dw13: kbench_cuda::DBuf<u32>,
    pub ds13: kbench_cuda::DBuf<u16>,
    pub dw2: kbench_cuda::DBuf<u32>,
    pub ds2: kbench_cuda::DBuf<u16>,
}
pub fn rand_moe(dev: &CudaDevice, rng: &mut Rand, c: &MoeConfig) -> kbench_cuda::Result<RandMoe> {
    let (mut w13, mut w2) = (vec![], vec![]);
    for _ in 0..c.n_experts {
        w13.push(rand_qlinear(rng, 2 * c.inter, c.hidden));
        w2.push(rand_qlinear(rng, c.hidden, c.inter));
    }
    let cat_q = |v: &Vec<QLinear>| v.iter().flat_map(|q| q.wq.clone()).collect::<Vec<u32>>();
    let cat_s = |v: &Vec<QLinear>| v.iter().flat_map(|q| q.s.clone()).collect::<Vec<u16>>();
    Ok(RandMoe {
        dw13: dev.upload(&cat_q(&w13))?,
        ds13: dev.upload(&cat_s(&w13))?,
        dw2: dev.upload(&cat_q(&w2))?,
        ds2: dev.upload(&cat_s(&w2))?,
        w13,
        w2,
    })
}

fn t_moe(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let mut out = vec![];
    let small = MoeConfig {
        n_experts: 32,
        top_k: 4,
        n_group: 1,
        topk_group: 1,
        renormalize: true,
        routed_scaling: 2.5,
        hidden: 512,
        inter: 256,
    };
    let grouped = MoeConfig {
        n_group: 4,
        topk_group: 2,
        renormalize: false,
        routed_scaling: 1.0,
        ..small
    };
    let wide = MoeConfig {
        n_experts: 8,
        top_k: 4,
        n_group: 1,
        topk_group: 1,
        renormalize: true,
        routed_scaling: 2.827,
        hidden: 7168,
        inter: 2048,
    };
    let mut configs = vec![(small, vec![1usize, 5, 40, 150]), (grouped, vec![7])];
    if !self::small() {
        configs.push((wide, vec![2]));
    }
    for (c, tokens) in configs {
        let m = rand_moe(dev, rng, &c).map_err(e)?;
        let weights = MoeWeights {
            w13: m.dw13.ptr(),
            s13: m.ds13.ptr(),
            w2: m.dw2.ptr(),
            s2: m.ds2.ptr(),
        };
        for t in tokens {
            let (e_, h) = (c.n_experts, c.hidden);
            let logits = rng.vec(t * e_, 3.0);
            let bias = rng.vec(e_, 0.1);
            let x = rng.vec_bf(t * h, 1.0);
            let shared = rng.vec_bf(t * h, 0.1);
            let (ids, wts) = r::moe_route(
                &logits,
                Some(&bias),
                t,
                e_,
                c.top_k,
                c.n_group,
                c.topk_group,
                c.renormalize,
                c.routed_scaling,
            );
            let sc = MoeScratch::new(dev, &c, t).map_err(e)?;
            dev.fill_bytes(&sc.ids, 0xff).map_err(e)?;
            dev.fill_bytes(&sc.wts, 0xff).map_err(e)?;
            dev.fill_bytes(&sc.act, 0xff).map_err(e)?;
            dev.fill_bytes(&sc.down, 0xff).map_err(e)?;
            let dl = dev.upload(&logits).map_err(e)?;
            let db = dev.upload(&bias).map_err(e)?;
            let dx = dev.upload(&bf16::vec_from(&x)).map_err(e)?;
            let dsh = dev.upload(&bf16::vec_from(&shared)).map_err(e)?;
            let dy = dev.alloc_poison::<u16>(t * h).map_err(e)?;
            ops::moe_route(dev, &c, dl.ptr(), db.ptr(), t, &sc).map_err(e)?;
            ops::moe_experts(
                dev,
                &c,
                dx.ptr(),
                h,
                t,
                &weights,
                &sc,
                dsh.ptr(),
                h,
                dy.ptr(),
                h,
            )
            .map_err(e)?;
            let gids = dev.download(&sc.ids).map_err(e)?;
            let gw = dev.download(&sc.wts).map_err(e)?;
            if gids[..t * c.top_k] != ids[..] {
                return Err(format!(
                    "moe_route ids differ (T {t}): gpu {:?} cpu {:?}",
                    &gids[..c.top_k.min(gids.len())],
                    &ids[..c.top_k]
                ));
            }
            let werr = r::rel_err(&gw[..t * c.top_k], &wts);
            if werr > 1e-5 {
                return Err(format!("moe_route weights rel err {werr:.2e}"));
            }
            let yref = r::moe_experts(
                &x,
                t,
                h,
                c.inter,
                &ids,
                &wts,
                c.top_k,
                &|ex| m.w13[ex].w.clone(),
                &|ex| m.w2[ex].w.clone(),
                Some(&shared),
            );
            let y = bf16::vec_to(&dev.download(&dy).map_err(e)?);
            out.push(check_err(
                &format!(
                    "E{} k{} H{} I{} groups {}/{} T{t}",
                    e_, c.top_k, h, c.inter, c.n_group, c.topk_group
                ),
                r::rel_err(&y, &yref),
                1e-2,
            )?);
        }
    }
    Ok(out.join("; "))
}

/// One case of [`t_mla`]: `batch` sequences of `q_len` new tokens each (tree-masked when
/// `masked`), sequence i after `prefixes[i]` cached tokens in pages of `page_size`, the KV
/// split `splits` ways.
struct MlaCase {
    batch: usize,
    q_len: usize,
    heads: usize,
    page_size: usize,
    prefixes: Vec<usize>,
    masked: bool,
    splits: usize,
}

fn t_mla(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let mut out = vec![];
    let cases = [
        MlaCase {
            batch: 3,
            q_len: 1,
            heads: 16,
            page_size: 16,
            prefixes: vec![0, 37, 300],
            masked: false,
            splits: 1,
        },
        MlaCase {
            batch: 3,
            q_len: 1,
            heads: 16,
            page_size: 16,
            prefixes: vec![5, 37, 300],
            masked: false,
            splits: 3,
        },
        MlaCase {
            batch: 2,
            q_len: 1,
            heads: 64,
            page_size: 64,
            prefixes: vec![1000, 129],
            masked: false,
            splits: 4,
        },
        MlaCase {
            batch: 2,
            q_len: 4,
            heads: 16,
            page_size: 16,
            prefixes: vec![50, 200],
            masked: true,
            splits: 2,
        },
        MlaCase {
            batch: 1,
            q_len: 2,
            heads: 64,
            page_size: 32,
            prefixes: vec![77],
            masked: true,
            splits: 1,
        },
        MlaCase {
            batch: 2,
            q_len: 3,
            heads: 8,
            page_size: 16,
            prefixes: vec![20, 90],
            masked: false,
            splits: 2,
        },
    ];
    for MlaCase {
        batch: b,
        q_len,
        heads: h,
        page_size: ps,
        prefixes,
        masked,
        splits,
    } in cases
    {
        let s_r = q_len * h;
        let max_kv = prefixes.iter().max().unwrap() + q_len;
        let max_pages = max_kv.div_ceil(ps);
        let n_pages = b * max_pages + 3;
        // shuffled page assignment
        let mut perm: Vec<i32> = (0..n_pages as i32).collect();
        for i in (1..perm.len()).rev() {
            let j = rng.below(i + 1);
            perm.swap(i, j);
        }
        let mut table = vec![0i32; b * max_pages];
        for (i, v) in table.iter_mut().enumerate() {
            *v = perm[i];
        }
        let cache = rng.vec_bf(n_pages * ps * 576, 1.0);
        let q = rng.vec_bf(b * s_r * 576, 1.0);
        let mut masks = vec![0u64; b * q_len];
        for bi in 0..b {
            for qi in 0..q_len {
                // a random tree: parent of node qi is a random earlier node (or none)
                let mut m = 1u64 << qi;
                if qi > 0 {
                    let p = rng.below(qi);
                    m |= masks[bi * q_len + p];
                }
                masks[bi * q_len + qi] = m;
            }
        }
        let scale = 1.0 / (192f32).sqrt();
        let dq = dev.upload(&bf16::vec_from(&q)).map_err(e)?;
        let dc = dev.upload(&bf16::vec_from(&cache)).map_err(e)?;
        let dt = dev.upload(&table).map_err(e)?;
        let dp = dev
            .upload(&prefixes.iter().map(|&p| p as i32).collect::<Vec<_>>())
            .map_err(e)?;
        let dm = dev.upload(&masks).map_err(e)?;
        let shape = MlaShape {
            batch: b,
            q_len,
            heads: h,
            page_size: ps,
            max_pages,
        };
        let (no, nm) = ops::mla_workspace(&shape, splits);
        let dop = dev.alloc_poison::<f32>(no).map_err(e)?;
        let dml = dev.alloc_poison::<f32>(nm).map_err(e)?;
        let dout = dev.alloc_poison::<u16>(b * s_r * 512).map_err(e)?;
        ops::mla_attention(
            dev,
            &shape,
            dq.ptr(),
            dc.ptr(),
            dt.ptr(),
            dp.ptr(),
            if masked { dm.ptr() } else { 0 },
            scale,
            splits,
            dop.ptr(),
            dml.ptr(),
            dout.ptr(),
            512,
        )
        .map_err(e)?;
        let y = bf16::vec_to(&dev.download(&dout).map_err(e)?);
        let mut yref = vec![];
        for bi in 0..b {
            let kv_len = prefixes[bi] + q_len;
            let mut kv = vec![0f32; kv_len * 576];
            for tok in 0..kv_len {
                let page = table[bi * max_pages + tok / ps] as usize;
                let src = (page * ps + tok % ps) * 576;
                kv[tok * 576..(tok + 1) * 576].copy_from_slice(&cache[src..src + 576]);
            }
            let qb = &q[bi * s_r * 576..(bi + 1) * s_r * 576];
            yref.extend(r::mla_attention(
                qb,
                &kv,
                q_len,
                h,
                prefixes[bi],
                if masked {
                    Some(&masks[bi * q_len..(bi + 1) * q_len])
                } else {
                    None
                },
                scale,
            ));
        }
        out.push(check_err(
            &format!("B{b} q{q_len} H{h} page {ps} splits {splits} masked {masked}"),
            r::rel_err(&y, &yref),
            2e-2,
        )?);
    }
    Ok(out.join("; "))
}

fn t_rmsnorm(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let mut out = vec![];
    for &(rows, d, res) in &[
        (5usize, 7168usize, false),
        (3, 7168, true),
        (9, 512, true),
        (2, 1536, false),
    ] {
        let x = rng.vec_bf(rows * d, 2.0);
        let rs = rng.vec_bf(rows * d, 2.0);
        let w = rng.vec_bf(d, 1.0);
        let h: Vec<f32> = if res {
            x.iter().zip(&rs).map(|(a, b)| bf16::round(a + b)).collect()
        } else {
            x.clone()
        };
        let yref = r::rmsnorm(&h, &w, d, 1e-6);
        let dx = dev.upload(&bf16::vec_from(&x)).map_err(e)?;
        let dr = dev.upload(&bf16::vec_from(&rs)).map_err(e)?;
        let dw = dev.upload(&bf16::vec_from(&w)).map_err(e)?;
        let dy = dev.alloc_poison::<u16>(rows * d).map_err(e)?;
        // residual stream updated in place (res_out aliases res_in)
        ops::rmsnorm(
            dev,
            dx.ptr(),
            d,
            if res { dr.ptr() } else { 0 },
            if res { dr.ptr() } else { 0 },
            d,
            dw.ptr(),
            dy.ptr(),
            d,
            rows,
            d,
            1e-6,
        )
        .map_err(e)?;
        let y = bf16::vec_to(&dev.download(&dy).map_err(e)?);
        out.push(check_err(
            &format!("rows {rows} D{d} residual {res}"),
            r::rel_err(&y, &yref),
            8e-3,
        )?);
        if res {
            let hr = bf16::vec_to(&dev.download(&dr).map_err(e)?);
            if r::rel_err(&hr, &h) > 1e-6 {
                return Err("rmsnorm residual output differs".into());
            }
        }
    }
    Ok(out.join("; "))
}

fn t_rope(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let mut out = vec![];
    let (t, heads, hd, off, rot) = (5usize, 4usize, 192usize, 128usize, 64usize);
    for &interleaved in &[true, false] {
        for y in [
            r::kimi_k25_yarn(),
            r::Yarn {
                factor: 1.0,
                ..r::kimi_k25_yarn()
            },
        ] {
            let (inv, ms) = r::yarn_inv_freq(&y, rot);
            let x = rng.vec_bf(t * heads * hd, 1.0);
            let pos: Vec<i32> = (0..t).map(|_| rng.below(5000) as i32).collect();
            let mut xr = x.clone();
            for (ti, &p) in pos.iter().enumerate() {
                for hh in 0..heads {
                    let b = ti * heads * hd + hh * hd + off;
                    r::rope(&mut xr[b..b + rot], p, &inv, ms, interleaved);
                }
            }
            let dx = dev.upload(&bf16::vec_from(&x)).map_err(e)?;
            let dp = dev.upload(&pos).map_err(e)?;
            let di = dev.upload(&inv).map_err(e)?;
            ops::rope(
                dev,
                dx.ptr(),
                t,
                heads,
                heads * hd,
                hd,
                off,
                rot,
                dp.ptr(),
                di.ptr(),
                ms,
                interleaved,
            )
            .map_err(e)?;
            let g = bf16::vec_to(&dev.download(&dx).map_err(e)?);
            out.push(check_err(
                &format!("interleaved {interleaved} factor {}", y.factor),
                r::rel_err(&g, &xr),
                1e-2,
            )?);
        }
    }
    Ok(out.join("; "))
}

fn t_swiglu_embedding(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let (t, i) = (7usize, 2048usize);
    let gu = rng.vec_bf(t * 2 * i, 3.0);
    let yref: Vec<f32> = (0..t * i)
        .map(|k| {
            let (tt, ii) = (k / i, k % i);
            r::silu(gu[tt * 2 * i + ii]) * gu[tt * 2 * i + i + ii]
        })
        .collect();
    let dg = dev.upload(&bf16::vec_from(&gu)).map_err(e)?;
    let dy = dev.alloc_poison::<u16>(t * i).map_err(e)?;
    ops::swiglu(dev, dg.ptr(), 2 * i, dy.ptr(), i, t, i).map_err(e)?;
    let y = bf16::vec_to(&dev.download(&dy).map_err(e)?);
    let a = check_err("swiglu", r::rel_err(&y, &yref), 8e-3)?;
    let (v, d) = (1000usize, 7168usize);
    let table: Vec<u16> = (0..v * d).map(|_| (rng.u32() & 0x7f7f) as u16).collect();
    let ids: Vec<i32> = vec![0, 999, 17, -1, 1000, 500];
    let di = dev.upload(&ids).map_err(e)?;
    let dt = dev.upload(&table).map_err(e)?;
    let dout = dev.alloc_poison::<u16>(ids.len() * d).map_err(e)?;
    let dtable = ops::EmbeddingTable {
        ptr: dt.ptr(),
        v,
        d,
    };
    ops::embedding(dev, di.ptr(), dtable, dout.ptr(), d, ids.len()).map_err(e)?;
    let g = dev.download(&dout).map_err(e)?;
    for (ti, &id) in ids.iter().enumerate() {
        let want: Vec<u16> = if id >= 0 && (id as usize) < v {
            table[id as usize * d..(id as usize + 1) * d].to_vec()
        } else {
            vec![0; d]
        };
        if g[ti * d..(ti + 1) * d] != want[..] {
            return Err(format!("embedding row {ti} (id {id}) differs"));
        }
    }
    Ok(format!("{a}; embedding exact"))
}

fn t_topk(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let (rows, v, k) = (3usize, 32000usize, 8usize);
    let mut x = rng.vec(rows * v, 10.0);
    x[5] = f32::NAN;
    x[v + 7] = x[v + 8]; // a tie
    let dx = dev.upload(&x).map_err(e)?;
    let di = dev.alloc_poison::<i32>(rows * k).map_err(e)?;
    let dv = dev.alloc_poison::<f32>(rows * k).map_err(e)?;
    let dp = dev.alloc_poison::<f32>(rows * k).map_err(e)?;
    ops::topk(dev, dx.ptr(), v, rows, v, k, di.ptr(), dv.ptr(), dp.ptr()).map_err(e)?;
    let gi = dev.download(&di).map_err(e)?;
    let gp = dev.download(&dp).map_err(e)?;
    for rr in 0..rows {
        let row = &x[rr * v..(rr + 1) * v];
        let want = r::topk(row, k);
        let mx = want[0].1 as f64;
        let z: f64 = row
            .iter()
            .filter(|a| !a.is_nan())
            .map(|&a| (a as f64 - mx).exp())
            .sum();
        for (j, (wi, wv)) in want.iter().enumerate() {
            if gi[rr * k + j] != *wi as i32 {
                return Err(format!(
                    "row {rr} pick {j}: gpu {} cpu {wi}",
                    gi[rr * k + j]
                ));
            }
            let p = ((*wv as f64 - mx).exp() / z) as f32;
            if (gp[rr * k + j] - p).abs() > 1e-4 * p.max(1e-3) + 1e-7 {
                return Err(format!("row {rr} prob {j}: gpu {} cpu {p}", gp[rr * k + j]));
            }
        }
    }
    Ok(format!("{rows}x{v} k{k} exact"))
}

fn t_tree_verify(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let (b, n) = (50usize, 16usize);
    let mut cand = vec![0i32; b * n];
    let mut parent = vec![-1i32; b * n];
    let mut target = vec![0i32; b * n];
    for bi in 0..b {
        for i in 0..n {
            cand[bi * n + i] = rng.below(4) as i32;
            target[bi * n + i] = rng.below(4) as i32;
            if i > 0 {
                parent[bi * n + i] = rng.below(i) as i32;
            }
        }
    }
    let (dc, dp, dt) = (
        dev.upload(&cand).map_err(e)?,
        dev.upload(&parent).map_err(e)?,
        dev.upload(&target).map_err(e)?,
    );
    let dl = dev.alloc_poison::<i32>(b).map_err(e)?;
    let dn = dev.alloc_poison::<i32>(b * n).map_err(e)?;
    let dto = dev.alloc_poison::<i32>(b * n).map_err(e)?;
    ops::tree_verify_greedy(
        dev,
        dc.ptr(),
        dp.ptr(),
        dt.ptr(),
        b,
        n,
        dl.ptr(),
        dn.ptr(),
        dto.ptr(),
    )
    .map_err(e)?;
    let (gl, gn, gt) = (
        dev.download(&dl).map_err(e)?,
        dev.download(&dn).map_err(e)?,
        dev.download(&dto).map_err(e)?,
    );
    let mut total = 0;
    for bi in 0..b {
        let s = bi * n..(bi + 1) * n;
        let (len, nodes, toks) =
            r::tree_verify_greedy(&cand[s.clone()], &parent[s.clone()], &target[s]);
        total += len;
        if gl[bi] as usize != len
            || gn[bi * n..bi * n + len - 1] != nodes[..]
            || gt[bi * n..bi * n + len] != toks[..]
        {
            return Err(format!("request {bi}: gpu len {} cpu {len}", gl[bi]));
        }
    }
    Ok(format!(
        "{b} trees of {n}, mean accept len {:.2}",
        total as f64 / b as f64
    ))
}

fn t_sampling(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let v = 50000usize;
    let params: Vec<(f32, i32, f32)> = vec![
        (0.0, 0, 1.0),
        (1.0, 0, 1.0),
        (0.7, 20, 1.0),
        (1.0, 0, 0.9),
        (0.5, 50, 0.8),
        (1.3, 1, 1.0),
        (1.0, 5000, 0.95),
    ];
    let rows = params.len() * 4;
    let x = rng.vec(rows * v, 6.0);
    let temp: Vec<f32> = (0..rows).map(|i| params[i % params.len()].0).collect();
    let tk: Vec<i32> = (0..rows).map(|i| params[i % params.len()].1).collect();
    let tp: Vec<f32> = (0..rows).map(|i| params[i % params.len()].2).collect();
    let u: Vec<f32> = (0..rows).map(|_| rng.f()).collect();
    let dx = dev.upload(&x).map_err(e)?;
    let (d1, d2, d3, d4) = (
        dev.upload(&temp).map_err(e)?,
        dev.upload(&tk).map_err(e)?,
        dev.upload(&tp).map_err(e)?,
        dev.upload(&u).map_err(e)?,
    );
    let dout = dev.alloc_poison::<i32>(rows).map_err(e)?;
    ops::sample(
        dev,
        dx.ptr(),
        v,
        rows,
        v,
        d1.ptr(),
        d2.ptr(),
        d3.ptr(),
        d4.ptr(),
        dout.ptr(),
    )
    .map_err(e)?;
    let g = dev.download(&dout).map_err(e)?;
    for rr in 0..rows {
        let dist = r::sampling_distribution(&x[rr * v..(rr + 1) * v], temp[rr], tk[rr], tp[rr]);
        let mut cum = 0.0;
        let mut found = false;
        for (i, p) in &dist {
            let lo = cum;
            cum += p;
            if *i as i32 == g[rr] {
                found = true;
                // u must fall in [lo, cum) up to rounding
                let uu = u[rr] as f64;
                if uu < lo - 1e-4 || uu > cum + 1e-4 {
                    return Err(format!(
                        "row {rr}: token {} has cumulative [{lo:.5}, {cum:.5}) but u = {uu:.5}",
                        g[rr]
                    ));
                }
            }
        }
        if !found {
            return Err(format!(
                "row {rr} (T {} k {} p {}): token {} not in the kept set of {}",
                temp[rr],
                tk[rr],
                tp[rr],
                g[rr],
                dist.len()
            ));
        }
    }
    Ok(format!("{rows} rows, V {v}"))
}

fn t_graph(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let (rows, d) = (4usize, 1024usize);
    let x = rng.vec_bf(rows * 2 * d, 2.0);
    let w = rng.vec_bf(2 * d, 1.0);
    let dx = dev.upload(&bf16::vec_from(&x)).map_err(e)?;
    let dw = dev.upload(&bf16::vec_from(&w)).map_err(e)?;
    let dn = dev.alloc::<u16>(rows * 2 * d).map_err(e)?;
    let dy = dev.alloc_poison::<u16>(rows * d).map_err(e)?;
    let run = || -> kbench_cuda::Result<()> {
        ops::rmsnorm(
            dev,
            dx.ptr(),
            2 * d,
            0,
            0,
            0,
            dw.ptr(),
            dn.ptr(),
            2 * d,
            rows,
            2 * d,
            1e-6,
        )?;
        ops::swiglu(dev, dn.ptr(), 2 * d, dy.ptr(), d, rows, d)
    };
    run().map_err(e)?;
    let eager = dev.download(&dy).map_err(e)?;
    dev.fill_bytes(&dy, 0xff).map_err(e)?;
    dev.sync().map_err(e)?;
    let g = dev.capture(run).map_err(e)?;
    g.launch().map_err(e)?;
    g.launch().map_err(e)?;
    let replay = dev.download(&dy).map_err(e)?;
    if eager != replay {
        return Err("graph replay differs from eager run".into());
    }
    Ok("capture + replay bitwise equal to eager".into())
}

fn t_comm(dev: &CudaDevice, rng: &mut Rand) -> TResult {
    let x = bf16::vec_from(&rng.vec(4096, 1.0));
    let d = dev.upload(&x).map_err(e)?;
    let c = kbench_cuda::comm::TpComm::single();
    c.all_reduce_bf16(dev, d.ptr(), x.len()).map_err(e)?;
    if dev.download(&d).map_err(e)? != x {
        return Err("world-size-1 all-reduce changed the data".into());
    }
    let mut msg = "world size 1: no-op".to_string();
    if small() {
        return Ok(msg + "; NCCL skipped (small mode)");
    }
    match kbench_cuda::comm::TpComm::nccl_single(dev) {
        Ok(c) => {
            c.all_reduce_bf16(dev, d.ptr(), x.len()).map_err(e)?;
            if dev.download(&d).map_err(e)? != x {
                return Err("NCCL single-rank all-reduce changed the data".into());
            }
            msg.push_str("; NCCL single rank ok");
        }
        Err(err) => msg.push_str(&format!("; NCCL not tested ({})", Chain(&err))),
    }
    Ok(msg)
}

type TestFn = fn(&CudaDevice, &mut Rand) -> TResult;

/// Every GPU test, by name.
/// (Simple kernels first: a sticky device error in one test fails every later one.)
pub const TESTS: &[(&str, TestFn)] = &[
    ("rmsnorm", t_rmsnorm),
    ("rope_yarn", t_rope),
    ("swiglu_embedding", t_swiglu_embedding),
    ("topk", t_topk),
    ("tree_verify_greedy", t_tree_verify),
    ("sampling", t_sampling),
    ("cuda_graph", t_graph),
    ("comm", t_comm),
    ("int4_matmul", t_int4_matmul),
    ("bf16_matmul", t_bf16_matmul),
    ("cublas_linear", t_cublas_linear),
    ("fused_moe", t_moe),
    ("mla_decode_verify", t_mla),
];

/// Run the tests whose name contains `filter` (all with ""; `=name` for exactly one), each with its own seed. A test
/// that panics or returns an error is reported as failed; the device is synchronised after each.
pub fn run(dev: &CudaDevice, filter: &str, seed: u64) -> Vec<TestResult> {
    let mut out = vec![];
    for (i, (name, f)) in TESTS.iter().enumerate() {
        let selected = match filter.strip_prefix('=') {
            Some(exact) => *name == exact,
            None => name.contains(filter),
        };
        if !selected {
            continue;
        }
        let t0 = std::time::Instant::now();
        let mut rng = Rand::new(seed.wrapping_mul(1000).wrapping_add(i as u64));
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(dev, &mut rng)));
        let res = match res {
            Ok(r) => r.and_then(|s| dev.sync().map(|_| s).map_err(e)),
            Err(p) => Err(format!(
                "panicked: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        };
        let (ok, detail) = match res {
            Ok(s) => (true, s),
            Err(s) => (false, s),
        };
        out.push(TestResult {
            name: name.to_string(),
            ok,
            skipped: ok && detail.starts_with(SKIPPED),
            detail,
            millis: t0.elapsed().as_secs_f64() * 1e3,
        });
    }
    out
}
