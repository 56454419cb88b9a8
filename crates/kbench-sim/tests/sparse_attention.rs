//! MiniMax-M3's MSA layers priced as upstream vLLM runs them on Hopper: the index projections
//! in the qkv GEMM, the indexer's score and top-k launches, the split-K attend's merge, and
//! a verify block's per-query-token reads where the engine profile says so.

use kbench_core::arch::ModelArch;
use kbench_sim::engine_profile::KvReads;
use kbench_sim::presets::{engine_preset, load_tables, preset, tables_measured_on};
use kbench_sim::{CostModel, EngineProfile, PassBreakdown, PassKind};

const SPARSE_LAYERS: u32 = 57;

fn m3(engine: EngineProfile, model: ModelArch) -> CostModel {
    let profile = preset("8x-h200").unwrap();
    let tables = load_tables(&profile).unwrap();
    let home = tables_measured_on(&profile).unwrap();
    let c = CostModel::new(profile, engine, tables, model, None, 8, 512).unwrap();
    match home {
        Some(h) => c.with_tables_measured_on(h),
        None => c,
    }
}

fn shipped() -> EngineProfile {
    engine_preset("vllm-minimax-m3-h200").unwrap()
}

fn dense_m3() -> ModelArch {
    let mut m = ModelArch::preset("minimax-m3").unwrap();
    m.sparse_attention = None;
    m
}

fn pass(c: &CostModel, kind: PassKind, tokens: u32, reqs: u32, ctx: f64) -> PassBreakdown {
    c.explain_pass(kind, tokens, reqs, ctx).unwrap()
}

#[test]
fn msa_layers_launch_the_indexer_and_the_merge_beside_attention() {
    let sparse = pass(
        &m3(shipped(), ModelArch::preset("minimax-m3").unwrap()),
        PassKind::TargetDecode,
        1,
        1,
        1500.0,
    );
    let dense = pass(
        &m3(shipped(), dense_m3()),
        PassKind::TargetDecode,
        1,
        1,
        1500.0,
    );
    // score + top-k + merge in each sparse layer
    assert_eq!(sparse.operators, dense.operators + 3 * SPARSE_LAYERS);
    assert!(!dense.gpu_us.contains_key("attn.indexer"));
    let floor = 2.7;
    let indexer = sparse.gpu_us["attn.indexer"];
    let merge = sparse.gpu_us["attn.split_k_merge"];
    assert!(
        indexer >= 2.0 * floor * SPARSE_LAYERS as f64 * 0.99,
        "indexer {indexer:.1} us"
    );
    assert!(
        merge >= floor * SPARSE_LAYERS as f64 * 0.99,
        "merge {merge:.1} us"
    );
    assert!(
        sparse.gpu_total_us > dense.gpu_total_us + indexer + merge - dense.gpu_us["attn.qkv_proj"]
    );
}

/// The index query and key ride in the qkv GEMM: by the roofline (no op table, whose
/// measured rows need not rise monotonically with width), the sparse layers' GEMM is
/// (8 + 2 + 1 + 1) x 128 columns wide per rank at TP 8 instead of (8 + 2) x 128.
#[test]
fn the_index_projections_widen_the_qkv_gemm() {
    let roofline = |model: ModelArch| {
        let c = CostModel::new(
            preset("8x-h200").unwrap(),
            shipped(),
            None,
            model,
            None,
            8,
            512,
        )
        .unwrap();
        // a 4,096-token prefill: compute-bound, so the time follows the GEMM's width
        pass(&c, PassKind::TargetPrefill, 4096, 4, 0.0).gpu_us["attn.qkv_proj"]
    };
    let sparse = roofline(ModelArch::preset("minimax-m3").unwrap());
    let dense = roofline(dense_m3());
    let expected = (3.0 * 10.0 + SPARSE_LAYERS as f64 * 12.0) / (60.0 * 10.0);
    assert!(
        (sparse / dense - expected).abs() < 0.01,
        "{:.3} against {expected:.3}",
        sparse / dense
    );
}

#[test]
fn a_prefill_scores_blocks_but_merges_nothing() {
    let c = m3(shipped(), ModelArch::preset("minimax-m3").unwrap());
    let p = pass(&c, PassKind::TargetPrefill, 1024, 1, 0.0);
    assert!(p.gpu_us["attn.indexer"] > 0.0);
    assert!(!p.gpu_us.contains_key("attn.split_k_merge"));
}

#[test]
fn the_indexer_reads_more_as_the_context_grows() {
    let c = m3(shipped(), ModelArch::preset("minimax-m3").unwrap());
    let short = pass(&c, PassKind::TargetDecode, 128, 128, 256.0).gpu_us["attn.indexer"];
    let long = pass(&c, PassKind::TargetDecode, 128, 128, 2000.0).gpu_us["attn.indexer"];
    assert!(
        long > 2.0 * short,
        "{short:.1} us at 256 tokens, {long:.1} at 2,000"
    );
}

/// vLLM's Triton decode kernel for MSA gives each query token of a verify block its own
/// programs: 4 tokens read their request's blocks 4 times in the 57 sparse layers, once in
/// the 3 dense ones.
#[test]
fn verify_reads_msa_blocks_per_query_token_where_the_profile_says() {
    let per_token = m3(shipped(), ModelArch::preset("minimax-m3").unwrap());
    let mut once = shipped();
    assert_eq!(once.attention.sparse_kv_reads, Some(KvReads::PerQueryToken));
    once.attention.sparse_kv_reads = None;
    let per_request = m3(once, ModelArch::preset("minimax-m3").unwrap());
    let a = pass(&per_token, PassKind::TargetVerify, 512, 128, 1500.0).gpu_us["attention"];
    let b = pass(&per_request, PassKind::TargetVerify, 512, 128, 1500.0).gpu_us["attention"];
    let ratio = a / b;
    assert!(
        (3.0..=4.0).contains(&ratio),
        "per-token / per-request verify attention {ratio:.2}"
    );
    // a plain decode has one query per request either way
    let a = pass(&per_token, PassKind::TargetDecode, 128, 128, 1500.0).gpu_us["attention"];
    let b = pass(&per_request, PassKind::TargetDecode, 128, 128, 1500.0).gpu_us["attention"];
    assert_eq!(a, b);
}
