#![allow(clippy::needless_range_loop)]
//! The CUDA path on kbench-cuda's tuned kernels (`KernelChoice::Tuned`: bf16 activations into
//! `bf16_matmul` and the fused INT4 MoE) against the CPU reference, on the smallest model that
//! fits them (hidden 128, moe_inter 64, 16 experts in 4 groups, top-4). bf16 rounding of the
//! activations means a tolerance instead of token equality. GPU tests are ignored unless asked
//! for (`--include-ignored`); the Tuned-on-the-tiny-model error needs no GPU.

mod common;

use std::path::{Path, PathBuf};

use common::gpu::{
    argmax_agree, check_decode_and_tree_verify, cpu_model, have_gpus, model_dir, prompt, rel_err,
    tiny_dir,
};
use kbench_engine::cuda::{self, CudaModel, CudaOptions, GpuSegment, KernelChoice};
use kbench_engine::generate::run_batch;
use kbench_engine::init::Dims;
use kbench_engine::target::{Attend, Segment};

/// bf16 activations before every linear and in the MoE (the CPU keeps f32).
const TOL: f64 = 3e-2;

fn small_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| model_dir("kbench-cuda-engine-tuned-small-s7-q09", Dims::tuned_small()))
        .clone()
}

fn tuned_opts(tp: usize) -> CudaOptions {
    let mut o = CudaOptions::new(0, tp);
    o.kernels = KernelChoice::Tuned;
    o
}

fn gpu_model(dir: &Path, opts: &CudaOptions) -> CudaModel {
    let m = CudaModel::load(dir, Some(&dir.join("draft")), opts).expect("gpu model loads");
    assert_eq!(m.kernels(), KernelChoice::Tuned);
    m
}

#[test]
fn tuned_kernels_on_the_tiny_model_are_a_clear_error() {
    // the dimension check comes before any device is opened: no GPU needed
    let dir = tiny_dir();
    match CudaModel::load(&dir, Some(&dir.join("draft")), &tuned_opts(1)) {
        Ok(_) => panic!("the tiny model loaded on the tuned kernels"),
        Err(e) => {
            let msg = e.to_string();
            eprintln!("expected error: {msg}");
            assert!(msg.contains("Tuned"), "{msg}");
            assert!(msg.contains("moe_intermediate_size 32"), "{msg}");
        }
    }
}

/// Prompt of 19 tokens through the CPU and the tuned GPU path (tp ranks): per-layer latent
/// KV, layer 1's contribution to the residual stream (attention + fused MoE + shared
/// expert), logits and their argmax. `cublas`: the dense linears through cuBLAS (where it
/// loads) or through kbench-cuda's own bf16_matmul.
fn check_forward(tp: usize, cublas: bool) {
    let dir = small_dir();
    let cpu = cpu_model(&dir);
    let mut opts = tuned_opts(tp);
    opts.cublas = cublas;
    eprintln!("tp {tp}, cublas requested: {cublas}");
    let mut gpu = gpu_model(&dir, &opts);
    let v = cpu.target.vocab;
    let toks = prompt(3, 19, v);
    let n = toks.len();
    let cache = cpu.target.new_cache();
    let seg = Segment {
        cache: &cache,
        tokens: toks.clone(),
        positions: (0..n as u32).collect(),
        attend: Attend::Causal,
        all_logits: true,
    };
    let c = cpu
        .target
        .forward(std::slice::from_ref(&seg))
        .unwrap()
        .remove(0);
    let g = gpu
        .forward_target(
            &[GpuSegment {
                slot: 0,
                cache_len: 0,
                tokens: toks.clone(),
                positions: (0..n as u32).collect(),
                tree: None,
                all_logits: true,
            }],
            true,
        )
        .unwrap()
        .remove(0);
    let gkv = g.kv.as_ref().unwrap();
    for l in 0..cpu.target.num_layers() {
        let e = rel_err(&gkv[l], &c.kv[l]);
        eprintln!("tp {tp} layer {l}: latent KV rel err {e:.2e}");
        assert!(e < TOL, "layer {l} KV rel err {e}");
    }
    // The layers add a few percent to the embedding (layer_gain), so the residual stream
    // hides their errors; the difference of two captured layer outputs does not.
    let cap = gpu.capture_layers().to_vec();
    let (i1, i0) = (
        cap.iter().position(|&l| l == 1),
        cap.iter().position(|&l| l == 0),
    );
    if let (Some(i1), Some(i0)) = (i1, i0) {
        let (h, nc) = (gpu.hidden(), cap.len());
        let delta = |x: &[f32]| -> Vec<f32> {
            (0..n)
                .flat_map(|t| (0..h).map(move |j| (t, j)))
                .map(|(t, j)| x[t * nc * h + i1 * h + j] - x[t * nc * h + i0 * h + j])
                .collect()
        };
        let e = rel_err(&delta(&g.captured), &delta(&c.captured));
        eprintln!("tp {tp} layer 1 (attention + MoE) output rel err {e:.2e}");
        // bf16 alone gives ~1e-2; a routing flip on a near-tie swaps one expert of one token
        // (a few percent over 19 tokens); a wrong expert layout or combine gives ~1
        assert!(e < 0.15, "layer 1 output rel err {e}");
    }
    let e = rel_err(&g.captured, &c.captured);
    eprintln!("tp {tp} captured hidden rel err {e:.2e}");
    assert!(e < TOL, "captured rel err {e}");
    let e = rel_err(&g.logits, &c.logits);
    eprintln!("tp {tp} logits rel err {e:.2e}");
    assert!(e < TOL, "logits rel err {e}");
    let agree = argmax_agree(&g.logits, &c.logits, v);
    eprintln!("tp {tp} argmax agrees at {agree}/{n} positions");
    assert!(agree * 10 >= n * 9, "argmax agrees at only {agree}/{n}");
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check.sh runs it with --include-ignored)"]
fn gpu_tuned_forward_matches_cpu() {
    if !have_gpus(1) {
        return;
    }
    check_forward(1, true);
    check_forward(1, false);
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check.sh runs it with --include-ignored)"]
fn gpu_tuned_auto_selects_tuned_and_exact_stays_exact() {
    if !have_gpus(1) {
        return;
    }
    let dir = small_dir();
    let auto = CudaModel::load(&dir, Some(&dir.join("draft")), &CudaOptions::new(0, 1)).unwrap();
    assert_eq!(auto.kernels(), KernelChoice::Tuned);
    drop(auto);
    let mut o = CudaOptions::new(0, 1);
    o.kernels = KernelChoice::Exact;
    let exact = CudaModel::load(&dir, Some(&dir.join("draft")), &o).unwrap();
    assert_eq!(exact.kernels(), KernelChoice::Exact);
    let tiny = tiny_dir();
    let t = CudaModel::load(&tiny, Some(&tiny.join("draft")), &CudaOptions::new(0, 1)).unwrap();
    assert_eq!(t.kernels(), KernelChoice::Exact);
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check.sh runs it with --include-ignored)"]
fn gpu_tuned_decode_tree_verify_and_generation() {
    if !have_gpus(1) {
        return;
    }
    let dir = small_dir();
    let cpu = cpu_model(&dir);
    let mut opts = tuned_opts(1);
    opts.cuda_graph_max_bs = 0;
    let mut gpu = gpu_model(&dir, &opts);
    check_decode_and_tree_verify(&cpu, &mut gpu, TOL, 4);
    let v = cpu.target.vocab;

    // Generation (graphs on): bf16 rounding may flip a near-tie and the sequences then
    // diverge, so only the first token (the prefill's argmax) must equal the CPU's.
    let mut graphed = gpu_model(&dir, &tuned_opts(1));
    let ps = vec![(0u64, prompt(11, 9, v))];
    let c = run_batch(&cpu, ps.clone(), 16, 0.0, 0, None).unwrap();
    let g = cuda::run_batch(&mut graphed, ps.clone(), 16, 0.0, 0, None).unwrap();
    let cfg = kbench_engine::SpeculativeSettings::new(
        3,
        2,
        6,
        kbench_core::experiment::VerifyMethod::Greedy,
    )
    .unwrap();
    let gs = cuda::run_batch(&mut graphed, ps, 16, 0.0, 0, Some(&cfg)).unwrap();
    let same = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    eprintln!(
        "tokens equal to the CPU's: plain {} / {}, spec {} / {}; graph launches {}",
        same(g[0].output(), c[0].output()),
        c[0].output().len(),
        same(gs[0].output(), c[0].output()),
        c[0].output().len(),
        graphed.graph_launches
    );
    assert_eq!(g[0].output().len(), c[0].output().len());
    assert_eq!(gs[0].output().len(), c[0].output().len());
    assert_eq!(g[0].output()[0], c[0].output()[0], "first token (plain)");
    assert_eq!(gs[0].output()[0], c[0].output()[0], "first token (spec)");
    assert!(
        graphed.graph_launches > 0,
        "decode / verify should replay graphs"
    );
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check.sh runs it with --include-ignored)"]
fn gpu_tuned_tensor_parallel_matches_cpu() {
    if !have_gpus(2) {
        return;
    }
    if !kbench_cuda::comm::nccl_present() {
        eprintln!("skipped: NCCL not loadable");
        return;
    }
    // two ranks of 8 experts each: routed pairs of the other rank's experts must add 0
    check_forward(2, true);
}
