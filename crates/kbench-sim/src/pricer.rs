//! Prices single operators on one GPU: from a measured op table when the profile has one
//! for the operator, else from a roofline `max(bytes / BW, flops / F)` with the profile's
//! efficiency factors, floored at the GPU's shortest kernel. Times in microseconds.
//!
//! A table time is measured on one GPU at one precision (BF16 weights, SGLang's kernels).
//! Used for another GPU, or for weights of another precision, it is moved per operator by
//! the ratio of the two rooflines: the bandwidth ratio where the operator is memory-bound,
//! the FLOP ratio at its precision where it is compute-bound, the launch floor where it is
//! latency-bound, and the link ratio for a collective.

use crate::error::SimError;
use crate::optable::OpTables;
use crate::profile::HardwareProfile;

/// Where a price came from, for the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Table,
    /// A table time moved to this GPU or precision by the roofline ratio.
    ScaledTable,
    Roofline,
}

pub struct Pricer<'a> {
    pub profile: &'a HardwareProfile,
    pub tables: Option<&'a OpTables>,
    /// The box the tables were measured on, where it is not `profile`'s GPU.
    pub tables_gpu: Option<&'a HardwareProfile>,
    /// GPUs in the tensor-parallel group.
    pub tp: u32,
    /// Bf16 rows of the decode-attention tables one KV row is priced as (1, or 0.5 for an
    /// fp8 cache under `Fp8Kv::HalfRows`), never fewer than one in all.
    pub kv_rows_scale: f64,
    /// The share of the routed experts a batch's tokens draw from (1: all, independently).
    pub expert_spread: f64,
    /// (latency us, bus GB/s): price the all-reduce from these link terms, not the table.
    pub all_reduce_link: Option<(f64, f64)>,
    /// Bytes below which the engine's custom all-reduce (the tables' `custom_all_reduce`)
    /// carries an all-reduce instead of NCCL.
    pub custom_all_reduce_below: Option<f64>,
    /// The share of its precision's tensor rate the engine's weight-only kernels (Marlin's
    /// W4A16 / W8A16) reach where compute-bound: 1 takes the hardware profile's rate.
    pub weight_only_rate: f64,
}

/// The tensor-core rate an operator's math runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Math {
    Bf16,
    /// INT4 weights dequantized to BF16 math (Marlin).
    W4A16,
    /// 8-bit weights (FP8, MXFP8, INT8) dequantized to BF16 math (Marlin's W8A16).
    W8A16,
    Fp8,
    Fp4,
}

/// What one call of an operator moves and computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Work {
    pub bytes: f64,
    pub flops: f64,
    pub math: Math,
}

impl Work {
    fn bf16(bytes: f64, flops: f64) -> Work {
        Work {
            bytes,
            flops,
            math: Math::Bf16,
        }
    }
}

/// A GEMM's weights: bytes per weight and the math they run at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub bytes_per_weight: f64,
    pub math: Math,
}

impl Weights {
    pub const BF16: Weights = Weights {
        bytes_per_weight: 2.0,
        math: Math::Bf16,
    };
}

/// A routed-expert layer: `experts` experts of (hidden -> inter -> hidden), top-k routing.
#[derive(Debug, Clone, Copy)]
pub struct MoeShape {
    pub experts: u32,
    pub top_k: u32,
    pub hidden: u32,
    pub inter: u32,
    /// Including group scales (0.5625 for INT4 group-32).
    pub bytes_per_weight: f64,
    pub math: Math,
}

/// The custom all-reduce (IPC one-shot / two-shot) as a CUDA graph replays it.
pub const CUSTOM_ALL_REDUCE: &str = "custom_all_reduce/half";

pub const MOE_TABLE_INT4: &str = "moe/int4_wo/h7168/i2048/e384/k8/balanced";

/// Tensor throughput of `p`'s GPU at `math`, TFLOP/s.
fn rate(p: &HardwareProfile, math: Math) -> Result<f64, SimError> {
    let g = &p.gpu;
    let missing = |key: &str| SimError::Profile {
        origin: p.origin.clone(),
        message: format!(
            "the model needs {key} (its weights' precision) and the profile gives none"
        ),
    };
    Ok(match math {
        Math::Bf16 => g.bf16_tflops.value,
        Math::W4A16 => g.int4_tflops.value,
        Math::W8A16 => g.bf16_tflops.value,
        Math::Fp8 => {
            g.fp8_tflops
                .as_ref()
                .ok_or_else(|| missing("gpu.fp8_tflops"))?
                .value
        }
        Math::Fp4 => {
            g.fp4_tflops
                .as_ref()
                .ok_or_else(|| missing("gpu.fp4_tflops"))?
                .value
        }
    })
}

/// Causal attention of `reqs` prompts of `isl` tokens: bytes of Q, K, V and O in BF16, and
/// the FLOPs of QK^T and PV over the lower triangle, both at `head_dim` (FlashAttention-2
/// takes MLA's V padded to the QK head dim).
fn mla_prefill_work(heads: u32, reqs: u32, isl: f64, head_dim: u32) -> (f64, f64) {
    let flops = 2.0 * 2.0 * reqs as f64 * heads as f64 * isl * isl * 0.5 * head_dim as f64;
    let bytes = reqs as f64 * isl * heads as f64 * head_dim as f64 * 2.0 * 4.0;
    (bytes, flops)
}

/// `max(bytes / BW, flops / F, floor)` on `p`'s GPU at `tflops`, microseconds.
fn roofline_on(p: &HardwareProfile, bytes: f64, flops: f64, tflops: f64) -> f64 {
    let mem = bytes / (p.gpu.mem_bandwidth_gbs.value * 1e3 * p.efficiency.mem_bw.value);
    let math = flops / (tflops * 1e6 * p.efficiency.flops.value);
    mem.max(math).max(p.gpu.min_kernel_us.value)
}

impl Pricer<'_> {
    fn table(&self, op: &str) -> Option<&OpTables> {
        self.tables.filter(|t| t.has(op))
    }

    /// The roofline of `w` on `p`'s GPU, its math at `share` of its precision's rate.
    fn roof_on(&self, p: &HardwareProfile, w: Work, share: f64) -> Result<f64, SimError> {
        Ok(roofline_on(p, w.bytes, w.flops, rate(p, w.math)? * share))
    }

    /// The share of `math`'s rate the engine's kernel for it reaches: its weight-only
    /// kernels' share, else the whole rate.
    fn engine_share(&self, math: Math) -> f64 {
        match math {
            Math::W4A16 | Math::W8A16 => self.weight_only_rate,
            Math::Bf16 | Math::Fp8 | Math::Fp4 => 1.0,
        }
    }

    /// The roofline of `w` on this GPU as the engine's kernel for its math runs it.
    fn engine_roof(&self, w: Work) -> Result<(f64, Source), SimError> {
        Ok((
            self.roof_on(self.profile, w, self.engine_share(w.math))?,
            Source::Roofline,
        ))
    }

    /// A table time, measured as `measured` on the tables' GPU, for `here` on this one.
    fn moved(&self, table_us: f64, measured: Work, here: Work) -> Result<(f64, Source), SimError> {
        if self.tables_gpu.is_none() && measured == here {
            return Ok((table_us, Source::Table));
        }
        let home = self.tables_gpu.unwrap_or(self.profile);
        // A table that measured the engine's own kind of kernel already holds its rate; one
        // measured at another precision (a BF16 GEMM for a Marlin one) does not.
        let share = if measured.math == here.math {
            1.0
        } else {
            self.engine_share(here.math)
        };
        let ratio = self.roof_on(self.profile, here, share)? / self.roof_on(home, measured, 1.0)?;
        Ok((table_us * ratio, Source::ScaledTable))
    }

    /// A table time measured as `w` on the tables' GPU, for the same work on this one.
    fn moved_same(&self, table_us: f64, w: Work) -> Result<(f64, Source), SimError> {
        self.moved(table_us, w, w)
    }

    fn bw_bytes_per_us(&self) -> f64 {
        self.profile.gpu.mem_bandwidth_gbs.value * 1e3 * self.profile.efficiency.mem_bw.value
    }

    fn floor(&self) -> f64 {
        self.profile.gpu.min_kernel_us.value
    }

    /// Roofline for `bytes` moved and `flops` done at `tflops`.
    pub fn roofline(&self, bytes: f64, flops: f64, tflops: f64) -> f64 {
        roofline_on(self.profile, bytes, flops, tflops)
    }

    /// Elementwise / reduction kernels (norms, activations, RoPE, top-k, sampling).
    pub fn elementwise(&self, bytes: f64) -> f64 {
        (bytes / self.bw_bytes_per_us()).max(self.floor())
    }

    /// BF16 GEMM `[m, k] x [k, n]`.
    pub fn gemm(&self, m: u32, n: u32, k: u32, why: &str) -> Result<(f64, Source), SimError> {
        self.gemm_with(m, n, k, Weights::BF16, why)
    }

    /// GEMM `[m, k] x [k, n]` whose `[k, n]` weights are `w` (BF16 activations in and out).
    pub fn gemm_with(
        &self,
        m: u32,
        n: u32,
        k: u32,
        w: Weights,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        let (mf, nf, kf) = (m.max(1) as f64, n as f64, k as f64);
        let act = 2.0 * (mf * kf + mf * nf);
        let flops = 2.0 * mf * nf * kf;
        let here = Work {
            bytes: w.bytes_per_weight * nf * kf + act,
            flops,
            math: w.math,
        };
        if let Some(t) = self.table("gemm/bf16") {
            let ms = t.lookup("gemm/bf16", [n as f64, k as f64, m.max(1) as f64], why)?;
            let measured = Work::bf16(2.0 * nf * kf + act, flops);
            return self.moved(ms * 1e3, measured, here);
        }
        self.engine_roof(here)
    }

    /// All-reduce of `elements` BF16 values over the TP group.
    pub fn all_reduce(&self, elements: f64, why: &str) -> Result<(f64, Source), SimError> {
        let custom = self
            .custom_all_reduce_below
            .is_some_and(|cap| 2.0 * elements < cap);
        if !custom {
            return self.collective("all_reduce/half", elements, why, 2.0);
        }
        // tables that measured NCCL but not the custom kernel cannot price it: say so rather
        // than price NCCL under the custom kernel's name (no tables: the link terms price both)
        if let Some(t) = self.tables.filter(|t| !t.has(CUSTOM_ALL_REDUCE)) {
            return Err(SimError::MissingOp {
                op: CUSTOM_ALL_REDUCE.into(),
                why: format!(
                    "{why}: the engine profile's custom all-reduce (set [server] custom_all_reduce = false to price NCCL)"
                ),
                origin: t.origin().into(),
            });
        }
        self.collective(CUSTOM_ALL_REDUCE, elements, why, 2.0)
    }

    /// All-gather whose gathered output holds `elements` BF16 values.
    pub fn all_gather(&self, elements: f64, why: &str) -> Result<(f64, Source), SimError> {
        self.collective("all_gather/half", elements, why, 1.0)
    }

    fn collective(
        &self,
        op: &str,
        elements: f64,
        why: &str,
        passes: f64,
    ) -> Result<(f64, Source), SimError> {
        if self.tp <= 1 {
            return Ok((0.0, Source::Roofline));
        }
        // Ring algorithm: each GPU moves (n-1)/n of the buffer, twice for all-reduce.
        let n = self.tp as f64;
        let bytes = 2.0 * elements * passes * (n - 1.0) / n;
        let link = |p: &HardwareProfile| {
            let ic = &p.interconnect;
            ic.all_reduce_latency_us.value + bytes / (ic.all_reduce_bus_gbs.value * 1e3)
        };
        if let Some((latency_us, bus_gbs)) = self
            .all_reduce_link
            .filter(|_| op.starts_with("all_reduce"))
        {
            return Ok((latency_us + bytes / (bus_gbs * 1e3), Source::Roofline));
        }
        if let Some(t) = self.table(op) {
            let ms = t.lookup(op, [self.tp as f64, elements.max(1.0), 1.0], why)?;
            return Ok(match self.tables_gpu {
                None => (ms * 1e3, Source::Table),
                Some(home) => (
                    ms * 1e3 * link(self.profile) / link(home),
                    Source::ScaledTable,
                ),
            });
        }
        Ok((link(self.profile), Source::Roofline))
    }

    /// Routed experts of one MoE layer for `tokens` tokens, per GPU, with expert coverage
    /// under random routing (see docs/cost-model.md, "Routed experts").
    pub fn moe(&self, tokens: u32, shape: MoeShape, why: &str) -> Result<(f64, Source), SimError> {
        let MoeShape {
            experts,
            top_k,
            hidden,
            inter,
            bytes_per_weight,
            math,
        } = shape;
        let (e, k, t) = (experts as f64, top_k as f64, tokens.max(1) as f64);
        // Distinct experts under random routing over the experts in play (skew: fewer).
        let e_eff = (e * self.expert_spread).max(k);
        let touched_random = e_eff * (1.0 - (1.0 - k / e_eff).powf(t));
        let touched_balanced = (t * k).min(e);
        let expert_bytes = 3.0 * hidden as f64 * inter as f64 * bytes_per_weight / self.tp as f64;
        let floor = touched_random * expert_bytes / self.bw_bytes_per_us();
        let flops = 2.0 * 3.0 * hidden as f64 * inter as f64 * t * k / self.tp as f64;
        let act = 2.0 * t * hidden as f64 * 2.0;
        let shape_matches = experts == 384 && top_k == 8 && hidden == 7168 && inter == 2048;
        if let Some(tb) = self
            .table(MOE_TABLE_INT4)
            .filter(|_| shape_matches && bytes_per_weight < 1.0 && math == Math::W4A16)
        {
            // The table routes round-robin ("balanced"): T tokens read min(T*k, E) experts,
            // more than random routing does. Scale the measured time by the ratio of experts
            // read, then floor at the bytes of the experts actually touched: the isolated
            // benchmark reruns on L2-hot buffers, a 60-layer model reads them cold.
            let ms = tb.lookup(MOE_TABLE_INT4, [self.tp as f64, t, 1.0], why)?;
            let measured = Work {
                bytes: touched_balanced * expert_bytes + act,
                flops,
                math,
            };
            let (us, source) = self.moved_same(ms * 1e3, measured)?;
            let scaled = us * touched_random / touched_balanced;
            return Ok((scaled.max(floor).max(self.floor()), source));
        }
        self.engine_roof(Work {
            bytes: touched_random * expert_bytes + act,
            flops,
            math,
        })
    }

    /// The bf16 table rows `kv_streams` rows of this cache are priced as.
    fn table_rows(&self, kv_streams: u32) -> f64 {
        (kv_streams as f64 * self.kv_rows_scale).max(1.0)
    }

    /// MLA decode-style attention over the latent cache: `queries` query tokens from
    /// `kv_streams` reads of a `ctx`-token cache, `heads` heads on this GPU. A decode batch
    /// has one query per stream; a verify block of K + 1 queries reads its request's cache
    /// once (`kv_streams` = requests) unless the backend re-reads per query. The op table
    /// measures one query per stream, so it prices the streams; the extra queries' math is a
    /// floor at the GPU's rate.
    pub fn mla_decode(
        &self,
        heads: u32,
        kv_streams: u32,
        queries: u32,
        ctx: f64,
        latent: u32,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        let flops = 2.0 * 2.0 * queries.max(kv_streams) as f64 * heads as f64 * ctx * latent as f64;
        let rows = self.table_rows(kv_streams);
        let bytes = rows * ctx * latent as f64 * 2.0;
        if let Some(t) = self.table("mla_gen/bf16") {
            let ms = t.lookup("mla_gen/bf16", [heads as f64, rows, ctx.max(1.0)], why)?;
            let per_stream = 2.0 * 2.0 * kv_streams as f64 * heads as f64 * ctx * latent as f64;
            let (us, source) = self.moved_same(ms * 1e3, Work::bf16(bytes, per_stream))?;
            let math = self.bf16_kernel(0.0, flops);
            return Ok((us.max(math), source));
        }
        Ok((self.bf16_kernel(bytes, flops), Source::Roofline))
    }

    /// MLA prefill attention: `reqs` prompts of `isl` tokens.
    pub fn mla_prefill(
        &self,
        heads: u32,
        reqs: u32,
        isl: f64,
        head_dim: u32,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        let (bytes, flops) = mla_prefill_work(heads, reqs, isl, head_dim);
        if let Some(t) = self.table("mla_ctx/bf16") {
            let ms = t.lookup(
                "mla_ctx/bf16",
                [heads as f64, reqs.max(1) as f64, isl.max(1.0)],
                why,
            )?;
            return self.moved_same(ms * 1e3, Work::bf16(bytes, flops));
        }
        Ok((self.bf16_kernel(bytes, flops), Source::Roofline))
    }

    /// MLA prefill attention by a kernel the op tables did not measure: its causal FLOPs
    /// and its Q/K/V/O bytes at the GPU's BF16 rate.
    pub fn mla_prefill_roofline(&self, heads: u32, reqs: u32, isl: f64, head_dim: u32) -> f64 {
        let (bytes, flops) = mla_prefill_work(heads, reqs, isl, head_dim);
        self.bf16_kernel(bytes, flops)
    }

    /// A kernel in BF16 math by its roofline: its bytes and FLOPs at the GPU's BF16 rate,
    /// never faster than the shortest kernel.
    pub fn bf16_kernel(&self, bytes: f64, flops: f64) -> f64 {
        self.roofline(bytes, flops, self.profile.gpu.bf16_tflops.value)
    }

    /// The absorbed MLA batched matmuls (q_nope x W_kc before, attn x W_vc after).
    pub fn mla_bmm(
        &self,
        pre: bool,
        tokens: u32,
        heads: u32,
        kv_lora: u32,
        head_dim: u32,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        let op = if pre {
            "mla_bmm_pre/bf16"
        } else {
            "mla_bmm_post/bf16"
        };
        let (t, h) = (tokens as f64, heads as f64);
        let bytes = 2.0 * h * (kv_lora as f64 * head_dim as f64 + t * (kv_lora + head_dim) as f64);
        let flops = 2.0 * t * h * kv_lora as f64 * head_dim as f64;
        if let Some(tb) = self.table(op) {
            let ms = tb.lookup(op, [heads as f64, tokens.max(1) as f64, 1.0], why)?;
            return self.moved_same(ms * 1e3, Work::bf16(bytes, flops));
        }
        Ok((self.bf16_kernel(bytes, flops), Source::Roofline))
    }

    /// MHA decode attention (head_dim 128 tables): `queries` queries from `kv_streams`
    /// reads of a `ctx`-token cache (as [`Pricer::mla_decode`]).
    #[allow(clippy::too_many_arguments)]
    pub fn mha_decode(
        &self,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        kv_streams: u32,
        queries: u32,
        ctx: f64,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        let flops =
            2.0 * 2.0 * queries.max(kv_streams) as f64 * heads as f64 * ctx * head_dim as f64;
        let rows = self.table_rows(kv_streams);
        let bytes = rows * ctx * 2.0 * kv_heads as f64 * head_dim as f64 * 2.0;
        if heads == kv_heads && head_dim == 128 {
            if let Some(t) = self.table("attn_gen/hd128/bf16") {
                let ms = t.lookup(
                    "attn_gen/hd128/bf16",
                    [heads as f64, rows, ctx.max(1.0)],
                    why,
                )?;
                let per_stream =
                    2.0 * 2.0 * kv_streams as f64 * heads as f64 * ctx * head_dim as f64;
                let (us, source) = self.moved_same(ms * 1e3, Work::bf16(bytes, per_stream))?;
                let math = self.bf16_kernel(0.0, flops);
                return Ok((us.max(math), source));
            }
        }
        Ok((self.bf16_kernel(bytes, flops), Source::Roofline))
    }

    /// MHA prefill attention: `reqs` prompts of `isl` tokens.
    pub fn mha_prefill(
        &self,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        reqs: u32,
        isl: f64,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        let flops = 2.0 * 2.0 * reqs as f64 * heads as f64 * isl * isl * 0.5 * head_dim as f64;
        let bytes = reqs as f64 * isl * (heads + 2 * kv_heads) as f64 * head_dim as f64 * 2.0;
        if heads == kv_heads && head_dim == 128 {
            if let Some(t) = self.table("attn_ctx/hd128/bf16") {
                let ms = t.lookup(
                    "attn_ctx/hd128/bf16",
                    [heads as f64, reqs.max(1) as f64, isl.max(1.0)],
                    why,
                )?;
                return self.moved_same(ms * 1e3, Work::bf16(bytes, flops));
            }
        }
        Ok((self.bf16_kernel(bytes, flops), Source::Roofline))
    }
}
