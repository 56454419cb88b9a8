//! Prices single operators on one GPU: from a measured op table when the profile has one
//! for the operator, else from a roofline `max(bytes / BW, flops / F)` with the profile's
//! efficiency factors, floored at the GPU's shortest kernel. Times in microseconds.

use crate::error::SimError;
use crate::optable::OpTables;
use crate::profile::HardwareProfile;

/// Where a price came from, for the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Table,
    Roofline,
}

pub struct Pricer<'a> {
    pub profile: &'a HardwareProfile,
    pub tables: Option<&'a OpTables>,
    /// GPUs in the tensor-parallel group.
    pub tp: u32,
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
}

pub const MOE_TABLE_INT4: &str = "moe/int4_wo/h7168/i2048/e384/k8/balanced";

impl Pricer<'_> {
    fn table(&self, op: &str) -> Option<&OpTables> {
        self.tables.filter(|t| t.has(op))
    }

    fn bw_bytes_per_us(&self) -> f64 {
        self.profile.gpu.mem_bandwidth_gbs.value * 1e3 * self.profile.efficiency.mem_bw.value
    }

    fn floor(&self) -> f64 {
        self.profile.gpu.min_kernel_us.value
    }

    /// Roofline for `bytes` moved and `flops` done at `tflops`.
    pub fn roofline(&self, bytes: f64, flops: f64, tflops: f64) -> f64 {
        let mem = bytes / self.bw_bytes_per_us();
        let math = flops / (tflops * 1e6 * self.profile.efficiency.flops.value);
        mem.max(math).max(self.floor())
    }

    /// Elementwise / reduction kernels (norms, activations, RoPE, top-k, sampling).
    pub fn elementwise(&self, bytes: f64) -> f64 {
        (bytes / self.bw_bytes_per_us()).max(self.floor())
    }

    /// BF16 GEMM `[m, k] x [k, n]`.
    pub fn gemm(&self, m: u32, n: u32, k: u32, why: &str) -> Result<(f64, Source), SimError> {
        if let Some(t) = self.table("gemm/bf16") {
            let ms = t.lookup("gemm/bf16", [n as f64, k as f64, m.max(1) as f64], why)?;
            return Ok((ms * 1e3, Source::Table));
        }
        let (m, n, k) = (m as f64, n as f64, k as f64);
        let bytes = 2.0 * (n * k + m * k + m * n);
        Ok((
            self.roofline(bytes, 2.0 * m * n * k, self.profile.gpu.bf16_tflops.value),
            Source::Roofline,
        ))
    }

    /// All-reduce of `elements` BF16 values over the TP group.
    pub fn all_reduce(&self, elements: f64, why: &str) -> Result<(f64, Source), SimError> {
        self.collective("all_reduce/half", elements, why, 2.0)
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
        if let Some(t) = self.table(op) {
            let ms = t.lookup(op, [self.tp as f64, elements.max(1.0), 1.0], why)?;
            return Ok((ms * 1e3, Source::Table));
        }
        // Ring algorithm: each GPU moves (n-1)/n of the buffer, twice for all-reduce.
        let n = self.tp as f64;
        let bytes = 2.0 * elements * passes * (n - 1.0) / n;
        let ic = &self.profile.interconnect;
        Ok((
            ic.all_reduce_latency_us.value + bytes / (ic.all_reduce_bus_gbs.value * 1e3),
            Source::Roofline,
        ))
    }

    /// Routed experts of one MoE layer for `tokens` tokens (W4A16), per GPU, with expert
    /// coverage under random routing (see docs/cost-model.md, "Routed experts").
    pub fn moe(&self, tokens: u32, shape: MoeShape, why: &str) -> Result<(f64, Source), SimError> {
        let MoeShape {
            experts,
            top_k,
            hidden,
            inter,
            bytes_per_weight,
        } = shape;
        let (e, k, t) = (experts as f64, top_k as f64, tokens.max(1) as f64);
        // Distinct experts under random routing over the experts in play (skew: fewer).
        let e_eff = (e * self.profile.efficiency.moe_expert_spread.value).max(k);
        let touched_random = e_eff * (1.0 - (1.0 - k / e_eff).powf(t));
        let touched_balanced = (t * k).min(e);
        let expert_bytes = 3.0 * hidden as f64 * inter as f64 * bytes_per_weight / self.tp as f64;
        let floor = touched_random * expert_bytes / self.bw_bytes_per_us();
        let shape_matches = experts == 384 && top_k == 8 && hidden == 7168 && inter == 2048;
        if let Some(tb) = self
            .table(MOE_TABLE_INT4)
            .filter(|_| shape_matches && bytes_per_weight < 1.0)
        {
            // The table routes round-robin ("balanced"): T tokens read min(T*k, E) experts,
            // more than random routing does. Scale the measured time by the ratio of experts
            // read, then floor at the bytes of the experts actually touched: the isolated
            // benchmark reruns on L2-hot buffers, a 60-layer model reads them cold.
            let ms = tb.lookup(MOE_TABLE_INT4, [self.tp as f64, t, 1.0], why)?;
            let scaled = ms * 1e3 * touched_random / touched_balanced;
            return Ok((scaled.max(floor).max(self.floor()), Source::Table));
        }
        let flops = 2.0 * 3.0 * hidden as f64 * inter as f64 * t * k / self.tp as f64;
        let act = 2.0 * t * hidden as f64 * 2.0;
        Ok((
            self.roofline(
                touched_random * expert_bytes + act,
                flops,
                self.profile.gpu.int4_tflops.value,
            ),
            Source::Roofline,
        ))
    }

    /// MLA decode-style attention over the latent cache: `rows` query tokens, each against
    /// `ctx` cached tokens, `heads` heads on this GPU.
    pub fn mla_decode(
        &self,
        heads: u32,
        rows: u32,
        ctx: f64,
        latent: u32,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        if let Some(t) = self.table("mla_gen/bf16") {
            let ms = t.lookup(
                "mla_gen/bf16",
                [heads as f64, rows.max(1) as f64, ctx.max(1.0)],
                why,
            )?;
            return Ok((ms * 1e3, Source::Table));
        }
        let bytes = rows as f64 * ctx * latent as f64 * 2.0;
        let flops = 2.0 * 2.0 * rows as f64 * heads as f64 * ctx * latent as f64;
        Ok((
            self.roofline(bytes, flops, self.profile.gpu.bf16_tflops.value),
            Source::Roofline,
        ))
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
        if let Some(t) = self.table("mla_ctx/bf16") {
            let ms = t.lookup(
                "mla_ctx/bf16",
                [heads as f64, reqs.max(1) as f64, isl.max(1.0)],
                why,
            )?;
            return Ok((ms * 1e3, Source::Table));
        }
        let flops = 2.0 * 2.0 * reqs as f64 * heads as f64 * isl * isl * 0.5 * head_dim as f64;
        let bytes = reqs as f64 * isl * heads as f64 * head_dim as f64 * 2.0 * 4.0;
        Ok((
            self.roofline(bytes, flops, self.profile.gpu.bf16_tflops.value),
            Source::Roofline,
        ))
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
        if let Some(t) = self.table(op) {
            let ms = t.lookup(op, [heads as f64, tokens.max(1) as f64, 1.0], why)?;
            return Ok((ms * 1e3, Source::Table));
        }
        let (t, h) = (tokens as f64, heads as f64);
        let bytes = 2.0 * h * (kv_lora as f64 * head_dim as f64 + t * (kv_lora + head_dim) as f64);
        let flops = 2.0 * t * h * kv_lora as f64 * head_dim as f64;
        Ok((
            self.roofline(bytes, flops, self.profile.gpu.bf16_tflops.value),
            Source::Roofline,
        ))
    }

    /// MHA decode attention (head_dim 128 tables): `rows` queries against `ctx` tokens.
    pub fn mha_decode(
        &self,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        rows: u32,
        ctx: f64,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        if heads == kv_heads && head_dim == 128 {
            if let Some(t) = self.table("attn_gen/hd128/bf16") {
                let ms = t.lookup(
                    "attn_gen/hd128/bf16",
                    [heads as f64, rows.max(1) as f64, ctx.max(1.0)],
                    why,
                )?;
                return Ok((ms * 1e3, Source::Table));
            }
        }
        let bytes = rows as f64 * ctx * 2.0 * kv_heads as f64 * head_dim as f64 * 2.0;
        let flops = 2.0 * 2.0 * rows as f64 * heads as f64 * ctx * head_dim as f64;
        Ok((
            self.roofline(bytes, flops, self.profile.gpu.bf16_tflops.value),
            Source::Roofline,
        ))
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
        if heads == kv_heads && head_dim == 128 {
            if let Some(t) = self.table("attn_ctx/hd128/bf16") {
                let ms = t.lookup(
                    "attn_ctx/hd128/bf16",
                    [heads as f64, reqs.max(1) as f64, isl.max(1.0)],
                    why,
                )?;
                return Ok((ms * 1e3, Source::Table));
            }
        }
        let flops = 2.0 * 2.0 * reqs as f64 * heads as f64 * isl * isl * 0.5 * head_dim as f64;
        let bytes = reqs as f64 * isl * (heads + 2 * kv_heads) as f64 * head_dim as f64 * 2.0;
        Ok((
            self.roofline(bytes, flops, self.profile.gpu.bf16_tflops.value),
            Source::Roofline,
        ))
    }
}
