//! The operators of each pass kind, priced one by one into the breakdown: EAGLE-3's draft
//! layer, and the target's embedding, attention block (MLA or MHA), feed-forward (dense
//! layers, then routed and shared experts) and logits head. Each block is priced once per
//! layer kind and multiplied by its layer count.

use kbench_core::arch::{ArchFamily, ModelArch, QuantInfo, QuantMath, SparseAttention};

use super::{Acc, CostModel, PassKind};
use crate::engine_profile::KvReads;
use crate::error::SimError;
use crate::pricer::{Math, MoeShape, Pricer, Source, Weights};
use crate::profile::HardwareProfile;

/// What every operator of one pass is priced for.
#[derive(Clone, Copy)]
struct Pass<'a> {
    kind: PassKind,
    /// Query tokens, at least one.
    t: u32,
    requests: u32,
    prefill: bool,
    /// Prompt tokens per request (prefill).
    isl: f64,
    /// Rows that need logits: every token of decode/verify/draft-decode; the last token
    /// per request for prefill and draft extend (SGLang captures only the last hidden).
    logit_rows: u32,
    /// Names the pass where an op-table lookup fails.
    why: &'a str,
}

impl CostModel {
    /// The operator list of one pass. For prefill `ctx` is ignored (the prompt is the context).
    pub(super) fn build(
        &self,
        kind: PassKind,
        tokens: u32,
        requests: u32,
        ctx: f64,
        acc: &mut Acc,
    ) -> Result<(), SimError> {
        let why = format!("{kind:?} {tokens} tokens / {requests} requests");
        let pass = Pass {
            kind,
            t: tokens.max(1),
            requests,
            prefill: kind.is_prefill(),
            isl: tokens as f64 / requests.max(1) as f64,
            logit_rows: match kind {
                PassKind::TargetPrefill | PassKind::DraftPrefill | PassKind::DraftExtend => {
                    requests
                }
                _ => tokens,
            },
            why: &why,
        };
        match (kind.is_draft(), &self.draft) {
            (false, _) => self.target_layers(&self.model, pass, ctx, acc),
            (true, Some(_)) => self.draft_layer(pass, ctx, acc),
            // vLLM's `mtp`: the checkpoint's MTP module is one more target decoder layer
            // (after its eh_proj over [embedding; hidden]) with the shared head
            (true, None) if self.model.mtp_layers > 0 => {
                let mut layer = self.model.clone();
                layer.num_layers = 1;
                if let Some(moe) = layer.moe.as_mut() {
                    moe.first_k_dense_replace = 0;
                }
                let h = layer.hidden_size;
                let p = self.pricer();
                // eh_proj stays BF16 in the FP8 checkpoints (DeepSeek-V3's README_WEIGHTS;
                // SGLang's deepseek_nextn.py builds it as a plain nn.Linear)
                acc.add(
                    "mtp.eh_proj",
                    1.0,
                    p.gemm_with(pass.t, h, 2 * h, Weights::BF16, &why)?,
                    1,
                );
                self.target_layers(&layer, pass, ctx, acc)
            }
            (true, None) => Err(SimError::Model(
                "a draft pass needs a draft architecture or a model with MTP layers".into(),
            )),
        }
    }

    /// How many times a decode-type pass streams the KV cache: once per query row for decode
    /// and draft decode (each top-k branch is its own row over the prefix), once per request
    /// for the multi-token blocks of verify and draft extend unless the engine's backend
    /// re-reads per query token.
    fn kv_streams(pass: Pass, reads: KvReads) -> u32 {
        match (pass.kind, reads) {
            (PassKind::TargetVerify | PassKind::DraftExtend, KvReads::PerRequest) => {
                pass.requests.clamp(1, pass.t)
            }
            _ => pass.t,
        }
    }

    /// EAGLE-3's draft: one decoder layer over the embedding and the fused hidden state,
    /// then its own logits head.
    fn draft_layer(&self, pass: Pass, ctx: f64, acc: &mut Acc) -> Result<(), SimError> {
        let p = self.pricer();
        let tp = self.tp;
        let Pass {
            kind,
            t,
            requests,
            prefill,
            isl,
            logit_rows,
            why,
        } = pass;
        let d = self
            .draft
            .as_ref()
            .ok_or_else(|| SimError::Model("a draft pass needs a draft architecture".into()))?;
        let h = d.hidden_size;
        let heads = d.num_heads / tp.min(d.num_heads).max(1);
        let kv = (d.num_kv_heads / tp).max(1);
        let hd = d.head_dim;
        let act_bytes = t as f64 * h as f64 * 2.0 * 2.0;
        acc.add(
            "embedding",
            1.0,
            (p.elementwise(act_bytes), Source::Roofline),
            1,
        );
        acc.add(
            "all_reduce",
            1.0,
            self.all_reduce_kernel(p.all_reduce(t as f64 * h as f64, why)?),
            1,
        );
        if kind != PassKind::DraftDecode {
            // fc over the three captured target hidden states (3h -> h), replicated.
            acc.add("draft.fc", 1.0, p.gemm(t, h, 3 * h, why)?, 1);
        }
        if let Some(mla) = &d.mla {
            // vLLM's Eagle3DeepseekV2ForCausalLM: the target's DeepseekV2MLAAttention over
            // the 2 x hidden concatenation (deepseek_eagle3.py, input_size), BF16 weights;
            // the block adds its own input and post-attention norms
            acc.add(
                "norms",
                2.0,
                (p.elementwise(act_bytes), Source::Roofline),
                1,
            );
            let mut layer = self.model.clone();
            layer.family = ArchFamily::MlaMoe;
            layer.hidden_size = h;
            layer.num_layers = 1;
            layer.num_heads = d.num_heads;
            layer.mla = Some(mla.clone());
            layer.quant = None;
            self.attention_block(&layer, 2 * h, pass, ctx, acc)?;
        } else {
            acc.add(
                "norms",
                3.0,
                (p.elementwise(act_bytes), Source::Roofline),
                1,
            );
            acc.add(
                "draft.qkv_proj",
                1.0,
                p.gemm(t, (heads + 2 * kv) * hd, 2 * h, why)?,
                1,
            );
            acc.add("rope", 1.0, (p.elementwise(act_bytes), Source::Roofline), 1);
            let attn = if prefill {
                self.attention_kernel(p.mha_prefill(heads, kv, hd, requests, isl, why)?)
            } else {
                let streams = Self::kv_streams(pass, self.engine.attention.mha_kv_reads);
                self.attention_kernel(p.mha_decode(heads, kv, hd, streams, t, ctx, why)?)
            };
            acc.attn_us += attn.0;
            acc.add("attention", 1.0, attn, 1);
            acc.add("draft.o_proj", 1.0, p.gemm(t, h, heads * hd, why)?, 1);
        }
        acc.add(
            "all_reduce",
            1.0,
            self.all_reduce_kernel(p.all_reduce(t as f64 * h as f64, why)?),
            1,
        );
        let inter = d.intermediate_size / tp;
        acc.add("draft.mlp", 1.0, p.gemm(t, 2 * inter, h, why)?, 1);
        acc.add(
            "activation",
            1.0,
            (
                p.elementwise(t as f64 * inter as f64 * 6.0),
                Source::Roofline,
            ),
            1,
        );
        acc.add("draft.mlp", 1.0, p.gemm(t, h, inter, why)?, 1);
        acc.add(
            "all_reduce",
            1.0,
            self.all_reduce_kernel(p.all_reduce(t as f64 * h as f64, why)?),
            1,
        );
        add_logits_head(acc, &p, logit_rows, d.draft_vocab_size, h, tp, why)?;
        Ok(())
    }

    fn target_layers(
        &self,
        m: &ModelArch,
        pass: Pass,
        ctx: f64,
        acc: &mut Acc,
    ) -> Result<(), SimError> {
        let p = self.pricer();
        let tp = self.tp;
        let Pass {
            t, logit_rows, why, ..
        } = pass;
        let h = m.hidden_size;
        let act_bytes = t as f64 * h as f64 * 2.0 * 2.0;
        acc.add(
            "embedding",
            1.0,
            (p.elementwise(act_bytes), Source::Roofline),
            1,
        );
        acc.add(
            "all_reduce",
            1.0,
            self.all_reduce_kernel(p.all_reduce(t as f64 * h as f64, why)?),
            1,
        );
        let layers = m.num_layers as f64;
        self.attention_block(m, m.hidden_size, pass, ctx, acc)?;
        acc.add(
            "all_reduce",
            layers,
            self.all_reduce_kernel(p.all_reduce(t as f64 * h as f64, why)?),
            1,
        );
        self.feed_forward(m, pass, acc)?;
        acc.add(
            "all_reduce",
            layers,
            self.all_reduce_kernel(p.all_reduce(t as f64 * h as f64, why)?),
            1,
        );
        acc.add(
            "norms",
            1.0,
            (p.elementwise(act_bytes), Source::Roofline),
            1,
        );
        add_logits_head(acc, &p, logit_rows, m.vocab_size, h, tp, why)?;
        Ok(())
    }

    /// The attention block, identical in every layer: norms, projections, RoPE, attention
    /// (MLA absorbed for decode and verify, up-projected for prefill; or MHA), o_proj.
    /// `input` is the width the q/kv projections read: the hidden size, or EAGLE-3's
    /// 2 x hidden concatenation of embedding and fused hidden state.
    fn attention_block(
        &self,
        m: &ModelArch,
        input: u32,
        pass: Pass,
        ctx: f64,
        acc: &mut Acc,
    ) -> Result<(), SimError> {
        let p = self.pricer();
        let tp = self.tp;
        let w = dense_weights(m, p.profile)?;
        let Pass {
            t,
            requests,
            prefill,
            isl,
            why,
            ..
        } = pass;
        let h = m.hidden_size;
        let act_bytes = t as f64 * h as f64 * 2.0 * 2.0;
        let layers = m.num_layers as f64;
        let heads = m.num_heads / tp;
        acc.add(
            "norms",
            2.0 * layers,
            (p.elementwise(act_bytes), Source::Roofline),
            1,
        );
        match (&m.family, &m.mla) {
            (ArchFamily::MlaMoe, Some(mla)) => {
                let qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
                let latent = mla.kv_lora_rank + mla.qk_rope_head_dim;
                match mla.q_lora_rank {
                    Some(q) => {
                        // Fused q_a + kv_a projection, replicated on every rank (SGLang).
                        acc.add(
                            "attn.qkv_a_proj",
                            layers,
                            p.gemm_with(t, q + latent, input, w, why)?,
                            1,
                        );
                        acc.add(
                            "norms",
                            2.0 * layers,
                            (
                                p.elementwise(t as f64 * (q + latent) as f64 * 4.0),
                                Source::Roofline,
                            ),
                            1,
                        );
                        acc.add(
                            "attn.q_b_proj",
                            layers,
                            p.gemm_with(t, heads * qk, q, w, why)?,
                            1,
                        );
                    }
                    None => {
                        acc.add(
                            "attn.qkv_a_proj",
                            layers,
                            p.gemm_with(t, heads * qk + latent, input, w, why)?,
                            1,
                        );
                        acc.add(
                            "norms",
                            layers,
                            (p.elementwise(act_bytes), Source::Roofline),
                            1,
                        );
                    }
                }
                acc.add(
                    "rope",
                    layers,
                    (
                        p.elementwise(t as f64 * heads as f64 * qk as f64 * 4.0),
                        Source::Roofline,
                    ),
                    1,
                );
                if prefill {
                    // Prefill runs the non-absorbed path: kv_b_proj up-projects the latent.
                    let kvb_n = heads * (mla.qk_nope_head_dim + mla.v_head_dim);
                    acc.add(
                        "attn.kv_b_proj",
                        layers,
                        p.gemm_with(t, kvb_n, mla.kv_lora_rank, w, why)?,
                        1,
                    );
                    let attn = self.mla_prefill_attention(&p, heads, requests, isl, qk, why)?;
                    acc.add("attention", layers, attn, 1);
                } else {
                    acc.add(
                        "attn.bmm_absorb",
                        layers,
                        p.mla_bmm(true, t, heads, mla.kv_lora_rank, mla.qk_nope_head_dim, why)?,
                        1,
                    );
                    let streams = Self::kv_streams(pass, self.engine.attention.mla_kv_reads);
                    let attn =
                        self.attention_kernel(p.mla_decode(heads, streams, t, ctx, latent, why)?);
                    acc.attn_us += attn.0 * layers;
                    acc.add("attention", layers, attn, 1);
                    acc.add(
                        "attn.bmm_absorb",
                        layers,
                        p.mla_bmm(false, t, heads, mla.kv_lora_rank, mla.v_head_dim, why)?,
                        1,
                    );
                }
                acc.add(
                    "attn.o_proj",
                    layers,
                    p.gemm_with(t, h, heads * mla.v_head_dim, w, why)?,
                    1,
                );
            }
            _ => {
                let kv = (m.num_kv_heads / tp).max(1);
                let hd = m.head_dim;
                let qkv_n = (heads + 2 * kv) * hd;
                let sparse = m.sparse_attention.as_ref();
                let sparse_layers = sparse.map_or(0.0, |sa| (sa.layers as f64).min(layers));
                let dense_layers = layers - sparse_layers;
                if dense_layers > 0.0 {
                    acc.add(
                        "attn.qkv_proj",
                        dense_layers,
                        p.gemm_with(t, qkv_n, input, w, why)?,
                        1,
                    );
                }
                if let Some(sa) = sparse {
                    // vLLM computes the index query and key in the qkv GEMM itself
                    // (MinimaxM3QKVParallelLinearWithIndexer: [q | k | v | index_q | index_k]).
                    let index_n =
                        (sa.index_heads / tp).max(1) * sa.index_head_dim + sa.index_head_dim;
                    acc.add(
                        "attn.qkv_proj",
                        sparse_layers,
                        p.gemm_with(t, qkv_n + index_n, input, w, why)?,
                        1,
                    );
                }
                acc.add(
                    "rope",
                    layers,
                    (p.elementwise(act_bytes), Source::Roofline),
                    1,
                );
                if prefill {
                    if dense_layers > 0.0 {
                        let attn = self
                            .attention_kernel(p.mha_prefill(heads, kv, hd, requests, isl, why)?);
                        acc.add("attention", dense_layers, attn, 1);
                    }
                    if let Some(sa) = sparse {
                        let attn = self.attention_kernel(self.sparse_prefill(m, sa, pass));
                        acc.add("attention", sparse_layers, attn, 1);
                    }
                } else {
                    // a sparse query reads its selected blocks: the whole context within the
                    // window, the window's worth past it
                    let mha_reads = self.engine.attention.mha_kv_reads;
                    let kinds = [
                        (dense_layers, mha_reads, ctx),
                        (
                            sparse_layers,
                            self.sparse_kv_reads(),
                            sparse.map_or(ctx, |sa| ctx.min(sa.dense_up_to_tokens as f64)),
                        ),
                    ];
                    for (n, reads, read_ctx) in kinds.into_iter().filter(|k| k.0 > 0.0) {
                        let streams = Self::kv_streams(pass, reads);
                        let attn = self.attention_kernel(
                            p.mha_decode(heads, kv, hd, streams, t, read_ctx, why)?,
                        );
                        acc.attn_us += attn.0 * n;
                        acc.add("attention", n, attn, 1);
                    }
                }
                if let Some(sa) = sparse {
                    self.sparse_indexer(m, sa, pass, ctx, sparse_layers, acc);
                }
                acc.add(
                    "attn.o_proj",
                    layers,
                    p.gemm_with(t, h, heads * hd, w, why)?,
                    1,
                );
            }
        }
        Ok(())
    }

    /// A block-sparse layer's prefill attention over its prompt. Within the window a query
    /// attends to every block (the causal triangle), past it to its selected blocks only (a
    /// band, W x L - W^2 / 2 query-key pairs), at the BF16 rate on its FLOPs. vLLM's M3
    /// kernel gives every query token its own programs (`minimax_m3_sparse_attn`: grid
    /// query tokens x KV heads x requests, BLOCK_SIZE_Q 1), so where the engine profile says
    /// `sparse_kv_reads = "per_query_token"` each query reads its keys and values again.
    fn sparse_prefill(&self, m: &ModelArch, sa: &SparseAttention, pass: Pass) -> (f64, Source) {
        let p = self.pricer();
        let window = sa.dense_up_to_tokens as f64;
        let (isl, reqs) = (pass.isl, pass.requests.max(1) as f64);
        let heads = (m.num_heads / self.tp) as f64;
        let kv = (m.num_kv_heads / self.tp).max(1) as f64;
        let hd = m.head_dim as f64;
        let pairs = if isl <= window {
            isl * isl * 0.5
        } else {
            window * isl - window * window * 0.5
        };
        let flops = 2.0 * 2.0 * reqs * heads * pairs * hd;
        // Q read, O written, the prompt's K and V written once
        let mut bytes = reqs * isl * (heads + 2.0 * kv) * hd * 2.0;
        if self.sparse_kv_reads() == KvReads::PerQueryToken {
            bytes += reqs * pairs * kv * hd * 2.0 * 2.0;
        }
        (p.bf16_kernel(bytes, flops), Source::Roofline)
    }

    fn sparse_kv_reads(&self) -> KvReads {
        self.engine
            .attention
            .sparse_kv_reads
            .unwrap_or(self.engine.attention.mha_kv_reads)
    }

    /// What a block-sparse layer runs besides its attention, as vLLM's MiniMax-M3 code does
    /// on GPUs without the SM100 kernels (vllm/models/minimax_m3/common/ops/index_topk.py,
    /// sparse_attn.py): the indexer's score kernel (every index head against the one index key
    /// of every context token, max-pooled per block) and its top-k selection, one launch in
    /// prefill (`_topk_index_kernel`) and two in decode and verify (`_topk_index_partial_kernel`
    /// over chunks of blocks, then `_topk_index_merge_kernel`); in decode and verify, the
    /// attend's split-K partials merged by another launch (`_merge_topk_attn_out_kernel`).
    fn sparse_indexer(
        &self,
        m: &ModelArch,
        sa: &SparseAttention,
        pass: Pass,
        ctx: f64,
        sparse_layers: f64,
        acc: &mut Acc,
    ) {
        let p = self.pricer();
        let Pass {
            t,
            requests,
            prefill,
            isl,
            ..
        } = pass;
        let index_heads = (sa.index_heads / self.tp).max(1) as f64;
        let kv_heads = (m.num_kv_heads / self.tp).max(1) as f64;
        let dim = sa.index_head_dim as f64;
        let (t, reqs) = (t as f64, requests.max(1) as f64);
        // One score per index head, query and block; the top-k kernel reads them back.
        let (score_bytes, score_flops, scores) = if prefill {
            let blocks = (isl / sa.block_size as f64).ceil();
            (
                reqs * isl * (index_heads + 1.0) * dim * 2.0,
                2.0 * reqs * index_heads * dim * isl * isl * 0.5,
                reqs * index_heads * isl * blocks * 4.0,
            )
        } else {
            // The decode score kernel tiles a request's query tokens (BLOCK_SIZE_Q), so its
            // index keys are read once per request.
            let blocks = (ctx / sa.block_size as f64).ceil().max(1.0);
            (
                reqs * ctx * dim * 2.0 + t * index_heads * dim * 2.0,
                2.0 * t * index_heads * dim * ctx,
                t * index_heads * blocks * 4.0,
            )
        };
        let score = p.bf16_kernel(score_bytes + scores, score_flops);
        let selected = t * index_heads * sa.topk_blocks as f64 * 4.0;
        let (topk, launches) = if prefill {
            (p.elementwise(scores + selected), 2)
        } else {
            // each chunk's partial top-k, then their merge
            (
                p.elementwise(scores + selected) + p.elementwise(2.0 * selected),
                3,
            )
        };
        if !prefill {
            acc.attn_us += (score + topk) * sparse_layers;
        }
        acc.add(
            "attn.indexer",
            sparse_layers,
            (score + topk, Source::Roofline),
            launches,
        );
        if !prefill {
            // split-K over the selected blocks into a fixed grid of about 256 programs
            // (TARGET_GRID), one partial output per chunk, then merged
            let target = (256.0 / (t * kv_heads))
                .floor()
                .clamp(1.0, sa.topk_blocks as f64);
            let chunks = 2f64.powi(target.log2().floor() as i32);
            let heads = (m.num_heads / self.tp) as f64;
            let head_dim = m.head_dim as f64;
            let partials = chunks * t * heads * (head_dim * 2.0 + 4.0);
            let merge = p.elementwise(partials + t * heads * head_dim * 2.0);
            acc.add(
                "attn.split_k_merge",
                sparse_layers,
                (merge, Source::Roofline),
                1,
            );
        }
    }

    /// The feed-forward: dense layers, then MoE layers (router, top-k, routed experts, shared
    /// experts).
    fn feed_forward(&self, m: &ModelArch, pass: Pass, acc: &mut Acc) -> Result<(), SimError> {
        let p = self.pricer();
        let tp = self.tp;
        let w = dense_weights(m, p.profile)?;
        let Pass {
            t, prefill, why, ..
        } = pass;
        let h = m.hidden_size;
        let moe_layers = m.num_moe_layers() as f64;
        let dense_layers = m.num_layers as f64 - moe_layers;
        if dense_layers > 0.0 {
            let inter = m.intermediate_size / tp;
            acc.add(
                "mlp.dense",
                dense_layers,
                p.gemm_with(t, 2 * inter, h, w, why)?,
                1,
            );
            acc.add(
                "activation",
                dense_layers,
                (
                    p.elementwise(t as f64 * inter as f64 * 6.0),
                    Source::Roofline,
                ),
                1,
            );
            acc.add(
                "mlp.dense",
                dense_layers,
                p.gemm_with(t, h, inter, w, why)?,
                1,
            );
        }
        if let Some(moe) = &m.moe {
            if moe_layers > 0.0 {
                acc.add(
                    "moe.router",
                    moe_layers,
                    p.gemm(t, moe.n_routed_experts, h, why)?,
                    1,
                );
                acc.add(
                    "moe.topk",
                    moe_layers,
                    (
                        p.elementwise(t as f64 * moe.n_routed_experts as f64 * 8.0),
                        Source::Roofline,
                    ),
                    2,
                );
                let (bpw, math) = match &m.quant {
                    Some(q) => (q.bytes_per_weight(), quant_math(q, p.profile)?),
                    None => (2.0, Math::Bf16),
                };
                // Marlin MoE: align/sort, gate_up, activation, down, weighted sum.
                acc.add(
                    "moe.routed_experts",
                    moe_layers,
                    self.moe_kernel(
                        prefill,
                        p.moe(
                            t,
                            MoeShape {
                                experts: moe.n_routed_experts,
                                top_k: moe.num_experts_per_tok,
                                hidden: h,
                                inter: moe.moe_intermediate_size,
                                bytes_per_weight: bpw,
                                math,
                            },
                            why,
                        )?,
                    ),
                    5,
                );
                if moe.n_shared_experts > 0 {
                    let si = (moe.n_shared_experts * moe.moe_intermediate_size) / tp;
                    acc.add(
                        "moe.shared_expert",
                        moe_layers,
                        p.gemm_with(t, 2 * si, h, w, why)?,
                        1,
                    );
                    acc.add(
                        "activation",
                        moe_layers,
                        (p.elementwise(t as f64 * si as f64 * 6.0), Source::Roofline),
                        1,
                    );
                    acc.add(
                        "moe.shared_expert",
                        moe_layers,
                        p.gemm_with(t, h, si, w, why)?,
                        1,
                    );
                }
            }
        }
        Ok(())
    }
}

/// lm_head over a vocabulary sharded across TP, the logits all-gather and sampling / top-k:
/// priced alike for the target and the draft head.
fn add_logits_head(
    acc: &mut Acc,
    p: &Pricer,
    rows: u32,
    vocab: u32,
    hidden: u32,
    tp: u32,
    why: &str,
) -> Result<(), SimError> {
    acc.add(
        "lm_head",
        1.0,
        p.gemm(rows, vocab.div_ceil(tp), hidden, why)?,
        1,
    );
    let logits = rows as f64 * vocab as f64;
    acc.add("logits_all_gather", 1.0, p.all_gather(logits, why)?, 1);
    acc.add(
        "sampling",
        1.0,
        (p.elementwise(logits * 4.0), Source::Roofline),
        2,
    );
    Ok(())
}

/// The tensor-core rate a quantized GEMM runs at: weight-only formats dequantize to BF16
/// math (Marlin's W4A16 / W8A16); FP8 and FP4 checkpoints with dynamic activation
/// quantization run on the tensor cores of their own precision; a microscaling format runs
/// on block-scaled tensor cores from compute capability 10.0 and on Marlin below
/// (`QuantMath::BlockScaled`).
fn quant_math(q: &QuantInfo, gpu: &HardwareProfile) -> Result<Math, SimError> {
    Ok(match (runs_native(q, gpu)?, q.num_bits) {
        (false, 4) => Math::W4A16,
        (false, _) => Math::W8A16,
        (true, b) if b <= 4 => Math::Fp4,
        (true, _) => Math::Fp8,
    })
}

/// Whether `q`'s GEMMs quantize their activations and run on the tensor cores of the
/// weights' own precision on `gpu` (else the weights are dequantized to BF16 math).
fn runs_native(q: &QuantInfo, gpu: &HardwareProfile) -> Result<bool, SimError> {
    Ok(match q.math {
        QuantMath::WeightOnly => false,
        QuantMath::Native => true,
        QuantMath::BlockScaled => {
            let capability = gpu.gpu.compute_capability.as_ref().ok_or_else(|| {
                SimError::Profile {
                    origin: gpu.origin.clone(),
                    message: format!(
                        "the model's {} weights run on block-scaled tensor cores only from compute capability 10.0 (vLLM's select_mxfp8_linear_backend) and on Marlin's weight-only kernels below: give gpu.compute_capability",
                        q.method
                    ),
                }
            })?;
            capability.value >= BLOCK_SCALED_MMA_CAPABILITY
        }
    })
}

/// Block-scaled MMA (tcgen05 on SM100, its SM120 kin) arrived with Blackwell; vLLM's
/// `has_device_capability(100)` draws the same line.
const BLOCK_SCALED_MMA_CAPABILITY: f64 = 10.0;

/// The weights of a model's GEMMs outside the routed experts.
fn dense_weights(m: &ModelArch, gpu: &HardwareProfile) -> Result<Weights, SimError> {
    Ok(match m.dense_quant() {
        Some(q) => Weights {
            bytes_per_weight: q.bytes_per_weight(),
            math: quant_math(q, gpu)?,
        },
        None => Weights::BF16,
    })
}
