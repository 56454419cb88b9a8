//! Microscaling weights (MXFP8) run where the GPU lets them: block-scaled FP8 tensor cores
//! from compute capability 10.0, Marlin's weight-only W8A16 (BF16 math) below, as vLLM's
//! `select_mxfp8_linear_backend` and MXFP8 MoE oracle choose. The weights' bytes are the
//! same either way; only the math rate moves, and weight-only kernels reach the engine
//! profile's share of it.

use kbench_core::arch::ModelArch;
use kbench_sim::presets::{engine_preset, load_tables, preset, tables_measured_on};
use kbench_sim::{CostModel, EngineProfile, HardwareProfile, PassKind};

/// `model` at TP 8 on `profile` under `engine`, every operator by its roofline (no op
/// table), and weight-only kernels at the full BF16 rate, so the math rate shows undiluted.
fn model_on(
    profile: HardwareProfile,
    engine: &str,
    model: &str,
) -> Result<CostModel, kbench_sim::SimError> {
    let mut engine = engine_preset(engine).unwrap();
    engine.kernels.weight_only_rate.value = 1.0;
    with_engine(profile, engine, model)
}

fn with_engine(
    profile: HardwareProfile,
    engine: EngineProfile,
    model: &str,
) -> Result<CostModel, kbench_sim::SimError> {
    CostModel::new(
        profile,
        engine,
        None,
        ModelArch::preset(model).unwrap(),
        None,
        8,
        512,
    )
}

fn m3_on(profile: HardwareProfile) -> Result<CostModel, kbench_sim::SimError> {
    model_on(profile, "vllm-minimax-m3-h200", "minimax-m3")
}

/// The H200 as shipped (9.0), and the same box claiming block-scaled MMA.
fn h200_at(capability: f64) -> CostModel {
    let mut profile = preset("8x-h200").unwrap();
    profile.gpu.compute_capability.as_mut().unwrap().value = capability;
    m3_on(profile).unwrap()
}

fn gpu_us(c: &CostModel, kind: PassKind, tokens: u32, reqs: u32, op: &str) -> f64 {
    c.explain_pass(kind, tokens, reqs, 0.0).unwrap().gpu_us[op]
}

#[test]
fn hopper_runs_mxfp8_gemms_at_the_bf16_rate() {
    let hopper = h200_at(9.0);
    let blackwell_rule = h200_at(10.0);
    let prefill = |c: &CostModel, op: &str| gpu_us(c, PassKind::TargetPrefill, 8192, 1, op);
    // An 8k-token prefill's GEMMs are compute-bound: the FP8 rate is twice the BF16 one on
    // this datasheet (1,978 against 989 TFLOP/s). The shared expert's activation between
    // its GEMMs is elementwise and moves with neither.
    for op in [
        "moe.routed_experts",
        "moe.shared_expert",
        "attn.qkv_proj",
        "attn.o_proj",
    ] {
        let ratio = prefill(&hopper, op) / prefill(&blackwell_rule, op);
        assert!(
            ratio > 1.85 && ratio < 2.0 + 1e-9,
            "{op}: Marlin W8A16 / block-scaled FP8 at 8k tokens = {ratio}"
        );
    }
}

#[test]
fn a_decode_step_reads_the_same_mxfp8_bytes_on_either_path() {
    // One token is memory-bound: W8A16 and W8A8 read the same FP8 weights and E8M0 scales.
    let decode = |c: &CostModel| gpu_us(c, PassKind::TargetDecode, 1, 1, "moe.routed_experts");
    let (hopper, blackwell_rule) = (decode(&h200_at(9.0)), decode(&h200_at(10.0)));
    assert!(
        (hopper / blackwell_rule - 1.0).abs() < 1e-9,
        "batch-1 routed experts: {hopper} us against {blackwell_rule} us"
    );
}

#[test]
fn b200_runs_mxfp8_natively() {
    let b200 = m3_on(preset("8x-b200").unwrap()).unwrap();
    let mut b200_as_hopper = preset("8x-b200").unwrap();
    b200_as_hopper
        .gpu
        .compute_capability
        .as_mut()
        .unwrap()
        .value = 9.0;
    let b200_as_hopper = m3_on(b200_as_hopper).unwrap();
    // At B200's FP8 rate an 8k prefill's experts are near the weight reads' floor, so the
    // BF16 rate costs less than twice.
    let prefill = |c: &CostModel| gpu_us(c, PassKind::TargetPrefill, 8192, 1, "moe.routed_experts");
    assert!(
        prefill(&b200) * 1.3 < prefill(&b200_as_hopper),
        "B200 (10.0) {} us against the same box at 9.0 {} us",
        prefill(&b200),
        prefill(&b200_as_hopper)
    );
}

#[test]
fn fp8_block_checkpoints_keep_fp8_math_on_hopper() {
    // DeepSeek-V3's FP8 (128 x 128 fp32 block scales) runs W8A8 on Hopper's FP8 tensor
    // cores (DeepGEMM / CUTLASS block FP8): compute capability does not touch it.
    let deepseek_at = |capability: f64| {
        let mut profile = preset("8x-h200").unwrap();
        profile.gpu.compute_capability.as_mut().unwrap().value = capability;
        model_on(profile, "vllm", "deepseek-v3").unwrap()
    };
    let prefill = |c: &CostModel| gpu_us(c, PassKind::TargetPrefill, 8192, 1, "moe.routed_experts");
    assert_eq!(prefill(&deepseek_at(9.0)), prefill(&deepseek_at(10.0)));
}

#[test]
fn a_profile_without_compute_capability_is_told_what_to_add() {
    let mut profile = preset("8x-h200").unwrap();
    profile.gpu.compute_capability = None;
    let err = match m3_on(profile) {
        Ok(c) => c
            .explain_pass(PassKind::TargetDecode, 1, 1, 0.0)
            .expect_err("an MXFP8 model on a GPU of unknown capability"),
        Err(e) => e,
    };
    let message = err.to_string();
    assert!(
        message.contains("gpu.compute_capability") && message.contains("mxfp8"),
        "{message}"
    );
}

#[test]
fn weight_only_kernels_slow_only_what_is_compute_bound() {
    // The engine's Marlin share of the BF16 rate: a prefill's compute-bound GEMMs take
    // 1 / share as long; one decode token reads the same bytes at the same speed.
    let at_share = |share: f64| {
        let mut engine = engine_preset("vllm-minimax-m3-h200").unwrap();
        engine.kernels.weight_only_rate.value = share;
        with_engine(preset("8x-h200").unwrap(), engine, "minimax-m3").unwrap()
    };
    let (full, half) = (at_share(1.0), at_share(0.5));
    for op in ["moe.routed_experts", "attn.qkv_proj", "attn.o_proj"] {
        let prefill = |c: &CostModel| gpu_us(c, PassKind::TargetPrefill, 8192, 1, op);
        let ratio = prefill(&half) / prefill(&full);
        assert!(
            (ratio - 2.0).abs() < 1e-6,
            "{op}: 8k prefill at half the rate = {ratio}x"
        );
        let decode = |c: &CostModel| gpu_us(c, PassKind::TargetDecode, 1, 1, op);
        assert_eq!(decode(&half), decode(&full), "{op} at batch 1");
    }
    // native FP8 math on Blackwell is not a weight-only kernel
    let b200_at = |share: f64| {
        let mut engine = engine_preset("vllm-minimax-m3-h200").unwrap();
        engine.kernels.weight_only_rate.value = share;
        with_engine(preset("8x-b200").unwrap(), engine, "minimax-m3").unwrap()
    };
    let prefill = |c: &CostModel| gpu_us(c, PassKind::TargetPrefill, 8192, 1, "attn.qkv_proj");
    assert_eq!(prefill(&b200_at(0.5)), prefill(&b200_at(1.0)));
}

#[test]
fn a_table_that_measured_the_weight_only_kernel_keeps_its_rate() {
    // Kimi-K2.5's routed experts are priced from an INT4 W4A16 MoE table measured on H200;
    // moved to H100 they keep the measured kernel's rate whatever the engine's share, since
    // the table already holds it. (Only the share of a kernel no table measured is a term.)
    let kimi_on_h100 = |share: f64| {
        let profile = preset("8x-h100").unwrap();
        let tables = load_tables(&profile).unwrap();
        let home = tables_measured_on(&profile).unwrap().unwrap();
        let mut engine = engine_preset("vllm").unwrap();
        engine.kernels.weight_only_rate.value = share;
        CostModel::new(
            profile,
            engine,
            tables,
            ModelArch::preset("kimi-k2.5").unwrap(),
            None,
            8,
            512,
        )
        .unwrap()
        .with_tables_measured_on(home)
    };
    let (full, share) = (kimi_on_h100(1.0), kimi_on_h100(0.28));
    for tokens in [1, 64, 512, 4096, 16384] {
        let experts =
            |c: &CostModel| gpu_us(c, PassKind::TargetPrefill, tokens, 1, "moe.routed_experts");
        assert_eq!(experts(&share), experts(&full), "{tokens} tokens");
    }
}

#[test]
fn a_weight_only_share_outside_its_range_is_refused() {
    for share in [0.0, 0.01, 1.5] {
        let mut engine = engine_preset("vllm-minimax-m3-h200").unwrap();
        engine.kernels.weight_only_rate.value = share;
        let message = engine.validate().unwrap_err().to_string();
        assert!(
            message.contains("kernels.weight_only_rate") && message.contains("(0.05, 1]"),
            "{share}: {message}"
        );
    }
    let mut engine = engine_preset("vllm-minimax-m3-h200").unwrap();
    engine.kernels.weight_only_rate.value = 1.0;
    engine.validate().unwrap();
}
