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

/// M3 on 8x H200 with no op table: every operator by its roofline, monotone in its work.
fn roofline(model: ModelArch) -> CostModel {
    roofline_with(shipped(), model)
}

fn roofline_with(engine: EngineProfile, model: ModelArch) -> CostModel {
    roofline_at_tp(engine, model, 8)
}

fn roofline_at_tp(engine: EngineProfile, model: ModelArch, tp: u32) -> CostModel {
    CostModel::new(
        preset("8x-h200").unwrap(),
        engine,
        None,
        model,
        None,
        tp,
        512,
    )
    .unwrap()
}

fn shipped() -> EngineProfile {
    engine_preset("vllm-minimax-m3-h200").unwrap()
}

fn sparse_m3() -> ModelArch {
    ModelArch::preset("minimax-m3").unwrap()
}

fn dense_m3() -> ModelArch {
    let mut m = sparse_m3();
    m.sparse_attention = None;
    m
}

fn pass(c: &CostModel, kind: PassKind, tokens: u32, reqs: u32, ctx: f64) -> PassBreakdown {
    c.explain_pass(kind, tokens, reqs, ctx).unwrap()
}

/// One pass of M3 under the shipped profile, with its MSA layers and with them dense.
fn sparse_and_dense(
    kind: PassKind,
    tokens: u32,
    reqs: u32,
    ctx: f64,
) -> (PassBreakdown, PassBreakdown) {
    (
        pass(&m3(shipped(), sparse_m3()), kind, tokens, reqs, ctx),
        pass(&m3(shipped(), dense_m3()), kind, tokens, reqs, ctx),
    )
}

#[test]
fn msa_layers_launch_the_indexer_and_the_merge_beside_attention() {
    let (sparse, dense) = sparse_and_dense(PassKind::TargetDecode, 1, 1, 1500.0);
    // the index score, the top-k's partial and merge, the attend's merge: four launches more
    // in each sparse layer
    assert_eq!(sparse.operators, dense.operators + 4 * SPARSE_LAYERS);
    assert!(!dense.gpu_us.contains_key("attn.indexer"));
    let floor = 2.7;
    let indexer = sparse.gpu_us["attn.indexer"];
    let merge = sparse.gpu_us["attn.split_k_merge"];
    assert!(
        indexer >= 3.0 * floor * SPARSE_LAYERS as f64 * 0.99,
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
    let qkv = |model: ModelArch| {
        let c = roofline(model);
        // a 4,096-token prefill: compute-bound, so the time follows the GEMM's width
        pass(&c, PassKind::TargetPrefill, 4096, 4, 0.0).gpu_us["attn.qkv_proj"]
    };
    let sparse = qkv(sparse_m3());
    let dense = qkv(dense_m3());
    let expected = (3.0 * 10.0 + SPARSE_LAYERS as f64 * 12.0) / (60.0 * 10.0);
    assert!(
        (sparse / dense - expected).abs() < 0.01,
        "{:.3} against {expected:.3}",
        sparse / dense
    );
}

#[test]
fn a_prefill_scores_blocks_but_merges_nothing() {
    let (sparse, dense) = sparse_and_dense(PassKind::TargetPrefill, 1024, 1, 0.0);
    assert!(sparse.gpu_us["attn.indexer"] > 0.0);
    assert!(!sparse.gpu_us.contains_key("attn.split_k_merge"));
    // the index score and one top-k launch
    assert_eq!(sparse.operators, dense.operators + 2 * SPARSE_LAYERS);
}

#[test]
fn the_indexer_reads_more_as_the_context_grows() {
    let c = m3(shipped(), sparse_m3());
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
    let per_token = m3(shipped(), sparse_m3());
    let mut once = shipped();
    assert_eq!(once.attention.sparse_kv_reads, Some(KvReads::PerQueryToken));
    once.attention.sparse_kv_reads = None;
    let per_request = m3(once, sparse_m3());
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

/// Past its window a sparse layer's query reads its 16 selected blocks, whatever the
/// context: from 8k to 16k tokens the sparse layers' decode attention stays flat (the three
/// dense layers still double), while the indexer, which scores every block, doubles.
#[test]
fn past_the_window_a_query_reads_its_selected_blocks() {
    let sparse = m3(shipped(), sparse_m3());
    let dense = m3(shipped(), dense_m3());
    let at =
        |c: &CostModel, ctx: f64, op: &str| pass(c, PassKind::TargetDecode, 64, 64, ctx).gpu_us[op];
    let grew = at(&sparse, 16000.0, "attention") / at(&sparse, 8000.0, "attention");
    let dense_grew = at(&dense, 16000.0, "attention") / at(&dense, 8000.0, "attention");
    // 57 layers flat at 2,048 tokens, 3 dense ones doubling from about 4 times that:
    // (57 + 3 x 7.8) / (57 + 3 x 3.9) = 1.17
    assert!(grew < 1.2, "sparse attention grew {grew:.2}x");
    assert!(dense_grew > 1.6, "dense attention grew {dense_grew:.2}x");
    let indexer = at(&sparse, 16000.0, "attn.indexer") / at(&sparse, 8000.0, "attn.indexer");
    assert!(indexer > 1.6, "indexer grew {indexer:.2}x");
}

/// A prompt past the window is attended as a band: 2,048 x 8,192 - 2,048^2 / 2 query-key
/// pairs in each sparse layer instead of 8,192^2 / 2, 0.44 of them. Read once per request
/// (`sparse_kv_reads` unset), the prefill is compute-bound and follows the pairs.
#[test]
fn a_long_prompt_attends_a_band_in_the_sparse_layers() {
    let once = || {
        let mut e = shipped();
        e.attention.sparse_kv_reads = None;
        e
    };
    let attention = |model: ModelArch, isl: u32| {
        let c = roofline_with(once(), model);
        pass(&c, PassKind::TargetPrefill, isl, 1, 0.0).gpu_us["attention"]
    };
    let ratio = attention(sparse_m3(), 8192) / attention(dense_m3(), 8192);
    let band = (2048.0 * 8192.0 - 2048.0 * 2048.0 / 2.0) / (8192.0 * 8192.0 / 2.0);
    let expected = (3.0 + SPARSE_LAYERS as f64 * band) / 60.0;
    assert!(
        (ratio - expected).abs() < 0.02,
        "{ratio:.3} against {expected:.3}"
    );
    // within the window the two are the same causal triangle
    let same = attention(sparse_m3(), 1024) / attention(dense_m3(), 1024);
    assert!((same - 1.0).abs() < 1e-9, "{same}");
}

/// vLLM's M3 prefill kernel gives every query token its own programs over its selected
/// blocks (`minimax_m3_sparse_attn`, BLOCK_SIZE_Q 1): an 8k prompt's queries read 2,048 keys
/// and values each, 7.5 GB a layer per rank at TP 8 where the FLOPs alone take a fraction.
#[test]
fn a_sparse_prefill_reads_per_query_token_where_the_profile_says() {
    let mut once = shipped();
    once.attention.sparse_kv_reads = None;
    let at = |engine: EngineProfile| {
        let c = roofline_with(engine, sparse_m3());
        pass(&c, PassKind::TargetPrefill, 8192, 1, 0.0).gpu_us["attention"]
    };
    let ratio = at(shipped()) / at(once);
    assert!(ratio > 3.0, "per-token / once {ratio:.2}");
}

/// The indexer's query heads split over TP like the KV heads (at least one per rank): an
/// 8k prompt's scores cost twice as much per rank at TP 2 (two index heads) as at TP 8 (one).
#[test]
fn index_heads_split_over_tensor_parallel_ranks() {
    let indexer = |tp: u32| {
        let c = roofline_at_tp(shipped(), sparse_m3(), tp);
        pass(&c, PassKind::TargetPrefill, 8192, 1, 0.0).gpu_us["attn.indexer"]
    };
    let ratio = indexer(2) / indexer(8);
    assert!(
        (1.8..=2.05).contains(&ratio),
        "TP2 / TP8 indexer {ratio:.2}"
    );
}

/// The decode score kernel tiles a request's query tokens, so a verify block of 4 tokens
/// reads its request's index keys once: at 16k tokens of context, where the keys are most of
/// what the indexer moves, 128 requests verifying 4 tokens each cost about what 128 plain
/// decodes do.
#[test]
fn the_indexer_reads_a_requests_index_keys_once() {
    let c = roofline(sparse_m3());
    let verify = pass(&c, PassKind::TargetVerify, 512, 128, 16000.0).gpu_us["attn.indexer"];
    let decode = pass(&c, PassKind::TargetDecode, 128, 128, 16000.0).gpu_us["attn.indexer"];
    assert!(
        verify < 1.2 * decode,
        "verify {verify:.1} us, decode {decode:.1} us"
    );
}

/// The indexer's context-dependent cost is part of what a pass adds at its context, not only
/// of the breakdown: a pass past the window grows with the context by at least the indexer's
/// growth (its sparse attention is flat there).
#[test]
fn the_indexer_is_priced_at_the_passs_context() {
    let c = m3(shipped(), sparse_m3());
    let at = |ctx: f64| pass(&c, PassKind::TargetDecode, 64, 64, ctx);
    let (short, long) = (at(8000.0), at(16000.0));
    let indexer = long.gpu_us["attn.indexer"] - short.gpu_us["attn.indexer"];
    assert!(indexer > 0.0);
    assert!(
        long.time_us - short.time_us >= indexer * 0.99,
        "pass grew {:.1} us, its indexer {indexer:.1} us",
        long.time_us - short.time_us
    );
}
