//! What the rtx6kpro decode corpus needed from the simulator: the MLA EAGLE-3 head priced as
//! latent attention, an fp8 cache on TRITON_MLA priced as half as many rows, the all-reduce
//! from the link terms measured on that box, acceptance drawn to a cell's mean, and the
//! cells' routing (every stream answering one prompt) as the share of experts a batch draws
//! from.

use std::path::Path;

use kbench_core::experiment::{load_experiment, Experiment, KvCacheDtype};
use kbench_sim::{acceptance_for, SimBackend};

fn decode(sets: &[&str]) -> Experiment {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/validation/experiments/kimi-k2.6-rtx-pro-6000-vllm-decode.toml");
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    load_experiment(&path, &sets).unwrap().remove(0).experiment
}

fn decode_error(sets: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/validation/experiments/kimi-k2.6-rtx-pro-6000-vllm-decode.toml");
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    format!("{:?}", load_experiment(&path, &sets).unwrap_err())
}

const EAGLE3: [&str; 3] = [
    "speculative.method=\"eagle3\"",
    "speculative.num_speculative_tokens=3",
    "workload.accept_length=2.155",
];

fn backend(e: &Experiment) -> SimBackend {
    SimBackend::new(e, acceptance_for(e).unwrap()).unwrap()
}

#[test]
fn the_mla_head_is_priced_as_latent_attention_over_twice_the_hidden_width() {
    let mla = decode(&EAGLE3);
    let mut mha_sets = EAGLE3.to_vec();
    mha_sets.push("draft.preset=\"kimi-k2.5-eagle3\"");
    let mha = decode(&mha_sets);
    let pass = |e: &Experiment, kind: kbench_sim::PassKind| {
        backend(e)
            .explain_round(1, 1000.0)
            .unwrap()
            .passes
            .into_iter()
            .find(|p| p.kind == kind)
            .unwrap()
    };
    let draft = pass(&mla, kbench_sim::PassKind::DraftDecode);
    assert!(draft.gpu_us.contains_key("attn.qkv_a_proj"), "{draft:?}");
    assert!(draft.gpu_us.contains_key("attn.bmm_absorb"));
    assert!(!draft.gpu_us.contains_key("draft.qkv_proj"));
    let llama = pass(&mha, kbench_sim::PassKind::DraftDecode);
    assert!(llama.gpu_us.contains_key("draft.qkv_proj"));
    assert!(!llama.gpu_us.contains_key("attn.qkv_a_proj"));
    // a few tokens' q/kv down-projection streams its weights: the head's reads 2 x hidden
    let target = pass(&mla, kbench_sim::PassKind::TargetVerify);
    let per_layer = target.gpu_us["attn.qkv_a_proj"] / 61.0;
    let ratio = draft.gpu_us["attn.qkv_a_proj"] / per_layer;
    assert!((1.6..=2.2).contains(&ratio), "draft / target qkv_a {ratio}");
    // the head's cache is the latent: 576 elements, one byte each in fp8
    let d = mla.draft.as_ref().unwrap();
    assert_eq!(
        kbench_sim::kv::draft_bytes_per_token(d, 8, KvCacheDtype::Fp8E4m3),
        576
    );
}

fn attention_us(e: &Experiment, bs: u32, ctx: f64) -> f64 {
    backend(e).explain_round(bs, ctx).unwrap().passes[0].gpu_us["attention"]
}

#[test]
fn an_fp8_cache_on_triton_mla_costs_half_the_rows_never_fewer_than_one() {
    let fp8 = decode(&[]);
    assert_eq!(fp8.kv.kv_cache_dtype, KvCacheDtype::Fp8E4m3);
    // a BF16 cache holds Kimi's whole context only below it (vLLM would not start otherwise)
    let bf16 = decode(&[
        "server.kv_cache_dtype=\"bf16\"",
        "server.max_model_len=131072",
    ]);
    let ctx = 65536.0;
    // one row: the kernel's programs are latency-bound, fp8 loads gain nothing
    let (one_fp8, one_bf16) = (attention_us(&fp8, 1, ctx), attention_us(&bf16, 1, ctx));
    assert!(
        (one_fp8 / one_bf16 - 1.0).abs() < 1e-9,
        "{one_fp8} {one_bf16}"
    );
    // 32 fp8 rows read what 16 bf16 rows do
    let (many_fp8, half_bf16) = (attention_us(&fp8, 32, ctx), attention_us(&bf16, 16, ctx));
    assert!(
        (many_fp8 / half_bf16 - 1.0).abs() < 1e-9,
        "{many_fp8} {half_bf16}"
    );
    assert!(many_fp8 < 0.8 * attention_us(&bf16, 32, ctx));
}

#[test]
fn the_all_reduce_follows_the_link_terms_measured_on_that_box() {
    let e = decode(&[]);
    let all_reduce = |bs: u32| {
        let p = backend(&e)
            .explain_round(bs, 1000.0)
            .unwrap()
            .passes
            .remove(0);
        (p.gpu_us["all_reduce"], p.sources["all_reduce"])
    };
    let ((one, source), (many, _)) = (all_reduce(1), all_reduce(32));
    assert_eq!(source, "roofline", "priced from link terms, not the table");
    // 25 us + 1.75 x message bytes at 37.6 GB/s (the profile's measured terms)
    let link = |bs: f64| 25.0 + 1.75 * bs * 7168.0 * 2.0 / 37.6e3;
    let want = link(32.0) / link(1.0);
    assert!((many / one - want).abs() < 1e-9, "{} vs {want}", many / one);
    // the seed's SGLang profile on the same GPUs keeps the op table's NCCL
    let seed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/baseline.toml");
    let sglang = load_experiment(&seed, &[]).unwrap().remove(0).experiment;
    let p = backend(&sglang)
        .explain_round(32, 1000.0)
        .unwrap()
        .passes
        .remove(0);
    assert_eq!(p.sources["all_reduce"], "table");
}

#[test]
fn rounds_are_drawn_to_the_cells_accept_length() {
    let e = decode(&[
        EAGLE3[0],
        EAGLE3[1],
        "workload.accept_length=2.155",
        "benchmark.concurrency=[1]",
        "benchmark.requests_per_level=2",
    ]);
    let mut b = backend(&e);
    let (_, p) = kbench_sim::predict::run(&e, &mut b).unwrap();
    let accept = p.accept_length[0].1.unwrap();
    assert!((accept - 2.155).abs() < 0.02, "accept {accept}");
}

#[test]
fn an_accept_length_is_refused_where_it_cannot_hold() {
    for (sets, want) in [
        (
            vec![
                EAGLE3[0],
                EAGLE3[1],
                EAGLE3[2],
                "workload.trace=\"../../../traces/kimi-k2.5-eagle3-chat.synth.kbt\"",
            ],
            "both `trace` and `accept_length`",
        ),
        (
            vec![EAGLE3[0], EAGLE3[1], "workload.accept_length=4.5"],
            "outside 1..=4",
        ),
        (
            vec![
                "speculative.method=\"ngram\"",
                "speculative.num_speculative_tokens=3",
                "workload.accept_length=2",
            ],
            "n-gram",
        ),
    ] {
        let e = decode_error(&sets);
        assert!(e.contains(want), "{want}: {e}");
    }
}

/// Routed-expert time of one pass of a round at batch `bs` and context 1000.
fn routed_experts(e: &Experiment, bs: u32, kind: kbench_sim::PassKind) -> f64 {
    backend(e)
        .explain_round(bs, 1000.0)
        .unwrap()
        .passes
        .into_iter()
        .find(|p| p.kind == kind)
        .unwrap()
        .gpu_us["moe.routed_experts"]
}

#[test]
fn a_batch_that_routes_alike_reads_fewer_experts_and_verify_gains_most() {
    use kbench_sim::PassKind::{TargetDecode, TargetVerify};
    let uniform = |sets: &[&str]| {
        let mut s = sets.to_vec();
        s.push("workload.expert_spread=1.0");
        decode(&s)
    };
    let (plain, plain_uniform) = (decode(&[]), uniform(&[]));
    let (spec, spec_uniform) = (decode(&EAGLE3), uniform(&EAGLE3));
    // one token reads its own 8 experts whatever the others do
    let one =
        routed_experts(&plain, 1, TargetDecode) / routed_experts(&plain_uniform, 1, TargetDecode);
    assert!((one - 1.0).abs() < 1e-9, "batch 1: {one}");
    // 32 tokens drawing from half the experts touch fewer of them (~143 of 384 against ~188)
    let decode32 =
        routed_experts(&plain, 32, TargetDecode) / routed_experts(&plain_uniform, 32, TargetDecode);
    assert!(
        (0.6..0.9).contains(&decode32),
        "batch 32 decode: {decode32}"
    );
    // and verify's 128 tokens, which under uniform routing read nearly every expert, gain more
    let verify32 =
        routed_experts(&spec, 32, TargetVerify) / routed_experts(&spec_uniform, 32, TargetVerify);
    assert!(
        verify32 < decode32 - 0.1,
        "verify {verify32} against decode {decode32}"
    );
}

#[test]
fn an_expert_spread_outside_its_range_is_refused_by_name() {
    for bad in ["0", "1.5", "-0.2"] {
        let e = decode_error(&[&format!("workload.expert_spread={bad}")]);
        assert!(e.contains("workload.expert_spread"), "{bad}: {e}");
        assert!(e.contains("outside (0, 1]"), "{bad}: {e}");
    }
}
