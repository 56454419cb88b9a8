//! Op tables measured on one GPU, used for another: moved per operator by the regime it
//! runs in, said in the report, and checked against public H100 / H200 measurements of one
//! model on both. Verify attention reads a request's KV once per pass.

use std::path::Path;

use kbench_core::arch::{DraftArch, ModelArch};
use kbench_core::experiment::load_experiment;
use kbench_sim::cost::PrefillPart;
use kbench_sim::presets::{engine_preset, load_tables, preset, tables_measured_on};
use kbench_sim::{acceptance_for, CostModel, PassKind, SimBackend};

fn cost(hardware: &str, model: &str, tp: u32) -> CostModel {
    let profile = preset(hardware).unwrap();
    let tables = load_tables(&profile).unwrap();
    let home = tables_measured_on(&profile).unwrap();
    let c = CostModel::new(
        profile,
        engine_preset("vllm").unwrap(),
        tables,
        ModelArch::preset(model).unwrap(),
        None,
        tp,
        512,
    )
    .unwrap();
    match home {
        Some(h) => c.with_tables_measured_on(h),
        None => c,
    }
}

/// Kimi-K2.5 at TP 8 on the RTX PRO 6000 box under `engine`, with the `draft` preset if any.
fn rtx_kimi(engine: &str, draft: Option<&str>) -> CostModel {
    let profile = preset("8x-rtx-pro-6000-server").unwrap();
    CostModel::new(
        profile.clone(),
        engine_preset(engine).unwrap(),
        load_tables(&profile).unwrap(),
        ModelArch::preset("kimi-k2.5").unwrap(),
        draft.map(|d| DraftArch::preset(d).unwrap()),
        8,
        512,
    )
    .unwrap()
}

fn gpu_us(c: &CostModel, kind: PassKind, tokens: u32, reqs: u32, ctx: f64, op: &str) -> f64 {
    c.explain_pass(kind, tokens, reqs, ctx).unwrap().gpu_us[op]
}

#[test]
fn a_gpu_with_its_own_tables_is_not_scaled() {
    let c = cost("8x-h200", "kimi-k2.5", 8);
    assert_eq!(c.tables_scaled_from(), None);
    let p = c
        .explain_pass(PassKind::TargetDecode, 16, 16, 2000.0)
        .unwrap();
    assert!(
        p.sources.values().all(|s| !s.contains("moved")),
        "{:?}",
        p.sources
    );
}

#[test]
fn h100_moves_h200_tables_by_bandwidth_where_memory_bound() {
    let h200 = cost("8x-h200", "kimi-k2.5", 8);
    let h100 = cost("8x-h100", "kimi-k2.5", 8);
    assert_eq!(h100.tables_scaled_from(), Some("NVIDIA H200 SXM"));
    assert!(h100.tables_origin().contains("moved to NVIDIA H100 SXM"));
    let p = h100
        .explain_pass(PassKind::TargetDecode, 64, 64, 4000.0)
        .unwrap();
    assert_eq!(
        p.sources["moe.routed_experts"],
        "table, moved to this GPU / precision"
    );
    // 64 tokens read most of the 384 experts' INT4 weights: bandwidth-bound, so the time
    // grows by H200's / H100's bandwidth (4.8 / 3.35)
    let ratio = gpu_us(
        &h100,
        PassKind::TargetDecode,
        64,
        64,
        4000.0,
        "moe.routed_experts",
    ) / gpu_us(
        &h200,
        PassKind::TargetDecode,
        64,
        64,
        4000.0,
        "moe.routed_experts",
    );
    assert!((ratio - 4.8 / 3.35).abs() < 0.02, "moe ratio {ratio}");
    // decode attention over a long context streams the cache: the same ratio
    let ratio = gpu_us(&h100, PassKind::TargetDecode, 64, 64, 16000.0, "attention")
        / gpu_us(&h200, PassKind::TargetDecode, 64, 64, 16000.0, "attention");
    assert!((ratio - 4.8 / 3.35).abs() < 0.05, "attention ratio {ratio}");
    // the same NVLink 4 fabric: collectives are not moved
    let ar = |c: &CostModel| gpu_us(c, PassKind::TargetDecode, 64, 64, 4000.0, "all_reduce");
    assert!((ar(&h100) / ar(&h200) - 1.0).abs() < 1e-9);
}

#[test]
fn compute_bound_gemms_move_by_the_flop_ratio_and_collectives_by_the_link() {
    let h200 = cost("8x-h200", "kimi-k2.5", 8);
    let b200 = cost("8x-b200", "kimi-k2.5", 8);
    // a 16k-token prefill's projections are compute-bound: BF16 2250 / 989 TFLOP/s
    let proj = |c: &CostModel| gpu_us(c, PassKind::TargetPrefill, 16384, 4, 0.0, "attn.q_b_proj");
    let ratio = proj(&h200) / proj(&b200);
    assert!((ratio - 2250.0 / 989.0).abs() < 0.1, "gemm ratio {ratio}");
    // a large all-reduce is link-bound: NVLink 5 moves it in about half the time
    let ar = |c: &CostModel| gpu_us(c, PassKind::TargetPrefill, 16384, 4, 0.0, "all_reduce");
    let ratio = ar(&h200) / ar(&b200);
    assert!(ratio > 1.5 && ratio < 2.05, "all-reduce ratio {ratio}");
}

#[test]
fn fp8_weights_read_half_the_bytes_of_bf16() {
    // MiniMax-M3 quantizes every linear layer (MXFP8, 1 + 1/32 bytes per weight); the same
    // shapes in BF16 read 2 bytes per weight. At batch 1 the projections are memory-bound.
    let fp8 = cost("8x-h200", "minimax-m3", 8);
    let mut bf16_model = ModelArch::preset("minimax-m3").unwrap();
    bf16_model.quant = None;
    let profile = preset("8x-h200").unwrap();
    let bf16 = CostModel::new(
        profile.clone(),
        engine_preset("vllm").unwrap(),
        load_tables(&profile).unwrap(),
        bf16_model,
        None,
        8,
        512,
    )
    .unwrap();
    let proj = |c: &CostModel| gpu_us(c, PassKind::TargetDecode, 1, 1, 1000.0, "mlp.dense");
    let ratio = proj(&bf16) / proj(&fp8);
    assert!(
        ratio > 1.5 && ratio < 2.0,
        "bf16 / fp8 dense MLP at batch 1: {ratio}"
    );
}

#[test]
fn verify_attention_reads_each_requests_cache_once() {
    // Llama-3.1-8B on one H100, 64 requests verifying 4 tokens each over 256 tokens of
    // context: the KV read is 64 x 256 x 128 KiB = 2.15 GB over the pass, ~0.8 ms at
    // 3.35 TB/s x 0.8; pricing each draft token as its own reader would make it ~3.2 ms
    let profile = preset("8x-h100").unwrap();
    let c = CostModel::new(
        profile.clone(),
        engine_preset("sglang").unwrap(),
        load_tables(&profile).unwrap(),
        ModelArch::preset("llama-3.1-8b").unwrap(),
        Some(DraftArch::preset("llama-3.1-8b-eagle3").unwrap()),
        1,
        512,
    )
    .unwrap()
    .with_tables_measured_on(preset("8x-h200").unwrap());
    let verify = gpu_us(&c, PassKind::TargetVerify, 256, 64, 256.0, "attention");
    let kv_read_us = 64.0 * 256.0 * 131072.0 / (3350.0 * 0.8 * 1e3);
    assert!(
        verify > 0.8 * kv_read_us && verify < 1.5 * kv_read_us,
        "verify attention {verify:.0} us against a {kv_read_us:.0} us KV read"
    );
    let decode = gpu_us(&c, PassKind::TargetDecode, 64, 64, 256.0, "attention");
    assert!(
        verify < 1.5 * decode,
        "verify {verify:.0} us, decode {decode:.0} us"
    );
}

#[test]
fn triton_mla_rereads_the_cache_per_query_token() {
    // vLLM's TRITON_MLA (the RTX PRO 6000 profile) flattens a verify block into decode rows
    let e = |engine: &str| rtx_kimi(engine, Some("kimi-k2.5-eagle3"));
    let at = |c: &CostModel| gpu_us(c, PassKind::TargetVerify, 128, 32, 8000.0, "attention");
    let ratio = at(&e("vllm-8x-rtx-pro-6000-server")) / at(&e("sglang"));
    assert!(
        ratio > 2.5,
        "per-query-token reads / per-request reads: {ratio}"
    );
}

#[test]
fn vllm_prefills_mla_on_sm120_by_its_own_kernels_flops() {
    // The RTX PRO 6000 tables hold SGLang's Triton prefill kernel; vLLM's FlashAttention MLA
    // prefill is priced by its causal FLOPs at the GPU's BF16 rate and flops efficiency.
    let profile = preset("8x-rtx-pro-6000-server").unwrap();
    let (tokens, heads, qk, layers) = (8192.0_f64, 64.0 / 8.0, 192.0, 61.0);
    let flops = 2.0 * heads * tokens * tokens * qk * layers;
    let rate_us = profile.gpu.bf16_tflops.value * 1e6 * profile.efficiency.flops.value;
    let attention = |engine: &str| {
        gpu_us(
            &rtx_kimi(engine, None),
            PassKind::TargetPrefill,
            8192,
            1,
            0.0,
            "attention",
        )
    };
    let vllm = attention("vllm-8x-rtx-pro-6000-server");
    assert!(
        (vllm / (flops / rate_us) - 1.0).abs() < 0.01,
        "vLLM's MLA prefill attention {vllm:.0} us against {:.0} us of FLOPs",
        flops / rate_us
    );
    // SGLang runs the kernel the table measured: 6.2 ms a layer at this shape
    let sglang = attention("sglang-8x-rtx-pro-6000-server");
    assert!(
        sglang > 8.0 * vllm,
        "SGLang {sglang:.0} us, vLLM {vllm:.0} us"
    );
}

#[test]
fn an_mla_drafts_chunk_attends_to_its_cache_as_an_mla_layer() {
    // A chunk's attention over what its request had cached, with the MLA draft's prefill:
    // the draft's one MLA layer, priced as the target's 61, adds 1/61 of the target's part
    let c = rtx_kimi("vllm-8x-rtx-pro-6000-server", Some("kimi-k2.5-eagle3-mla"));
    let part = PrefillPart {
        new_tokens: 8192,
        cached: 8192,
    };
    let cross = |with_draft: bool| {
        c.prefill_parts_ns(&[part], with_draft).unwrap() as f64
            - c.prefill_ns(1, 8192, with_draft).unwrap() as f64
    };
    let ratio = cross(true) / cross(false);
    assert!(
        (ratio - 62.0 / 61.0).abs() < 1e-3,
        "with the draft / without: {ratio}"
    );
}

/// InferenceX (SemiAnalysis database dump as extracted in inference-sim/blis-latency-kernel
/// testdata/measurements/inferencex_direct.json @ a8e879e9, via
/// ../shared/data/validation/inferencex/spec-arms-h100-h200.json): MiniMax-M3 MXFP8, vLLM
/// image `vllm/vllm-openai:minimax-m3`, TP8, 1k1k, no speculation; mean TPOT in ms by
/// concurrency, on 8x H100 and on 8x H200.
const MINIMAX_M3_1K1K_TPOT_MS: &[(u32, f64, f64)] = &[
    (1, 6.93, 6.79),
    (2, 7.44, 7.26),
    (4, 8.90, 8.45),
    (8, 11.29, 10.25),
];

fn predicted_tpot_ms(hardware: &str) -> Vec<(u32, f64)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/validation/experiments/minimax-m3-vllm.toml");
    let set = [
        format!("hardware.preset=\"{hardware}\""),
        "benchmark.concurrency=[1, 2, 4, 8]".to_string(),
        // as InferenceX's runners send: --num-prompts = 10 x concurrency
        "benchmark.requests_per_client=10".to_string(),
    ];
    let e = load_experiment(&path, &set).unwrap().remove(0).experiment;
    let mut b = SimBackend::new(&e, acceptance_for(&e).unwrap()).unwrap();
    let (levels, _) = kbench_sim::predict::run(&e, &mut b).unwrap();
    levels
        .iter()
        .map(|l| (l.concurrency, l.metrics.mean_tpot_ms))
        .collect()
}

/// The H100 profile has no tables of its own: H200's, moved by datasheet ratios, must
/// predict how much slower H100 is. The H100 / H200 TPOT ratio is what the scaling alone
/// decides (the engine terms and the model are the same on both boxes). Checked where it
/// holds, C=1..8 (+2.6%, +3.9%, +3.9%, +3.0% with vllm-minimax-m3-h200's kernel boundaries
/// and vLLM's own all-reduce; +3.9% to +6.3% with NCCL's and none; +5.1% to +11.0% before
/// MSA's kernels), and from C=16 the prediction is 1.18-1.19 against a measured 1.09-1.10
/// (docs/cost-model.md, "Op tables on another GPU": M3's MoE has no table and its roofline
/// is more bandwidth-bound than vLLM's kernel on either GPU).
#[test]
fn h200_tables_moved_to_h100_predict_h100_against_h200() {
    let h100 = predicted_tpot_ms("8x-h100");
    let h200 = predicted_tpot_ms("8x-h200");
    for (i, &(c, m100, m200)) in MINIMAX_M3_1K1K_TPOT_MS.iter().enumerate() {
        assert_eq!((h100[i].0, h200[i].0), (c, c));
        let predicted = h100[i].1 / h200[i].1;
        let measured = m100 / m200;
        let error = predicted / measured - 1.0;
        assert!(
            error.abs() < 0.10,
            "C={c}: predicted H100/H200 {predicted:.3}, measured {measured:.3} ({:+.1}%)",
            error * 100.0
        );
    }
    // the scaling is what makes H100 slower: unscaled, the two would be equal
    let at_c8 = h100[3].1 / h200[3].1;
    assert!(at_c8 > 1.1, "H100/H200 at C=8: {at_c8:.3}");
}

/// A datasheet-only profile predicts its own GPU: H200's tables moved to H100's datasheet
/// land within 10% of InferenceX's H100 baselines (M3 MXFP8, TP8, 1k1k, plain) at C=1..8,
/// +3.9 / +5.3 / +3.1 / +1.3% with the profile's kernel boundaries and vLLM's own all-reduce
/// (-7.9 / -3.3 / -1.1 / +1.4% with NCCL's and none; docs/cost-model.md, "Kernel boundaries
/// in an uncompiled forward").
#[test]
fn h200_tables_moved_to_h100_predict_h100s_baselines() {
    let h100 = predicted_tpot_ms("8x-h100");
    for (i, &(c, measured, _)) in MINIMAX_M3_1K1K_TPOT_MS.iter().enumerate() {
        assert_eq!(h100[i].0, c);
        let error = h100[i].1 / measured - 1.0;
        assert!(
            error.abs() < 0.10,
            "C={c}: predicted {:.2} ms, measured {measured:.2} ({:+.1}%)",
            h100[i].1,
            error * 100.0
        );
    }
}
