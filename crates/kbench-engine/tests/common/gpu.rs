//! Helpers of the CUDA path's tests: GPU presence, models written once per machine, error
//! measures, and the decode + tree-verify check both kernel choices run against the CPU.

use std::path::{Path, PathBuf};

use kbench_engine::cuda::{CudaModel, GpuSegment};
use kbench_engine::init::{init_model_with, Dims, InitOptions, Preset};
pub use kbench_engine::linalg::argmax;
use kbench_engine::target::{Attend, Segment};
use kbench_engine::{Device, Model};

/// True when `n` GPUs are present; else prints the skip line the GPU tests are known by.
/// Whether `n` GPUs are here. The GPU tests are `#[ignore]`d, so the suite reports them as
/// ignored without a GPU; run on purpose (`--include-ignored`, as scripts/gpu-check.sh does)
/// with no GPU at all they fail rather than pass having checked nothing. A test that needs
/// more GPUs than the machine has says so and returns.
pub fn have_gpus(n: usize) -> bool {
    let found = kbench_cuda::device::device_count();
    assert!(
        found > 0,
        "no CUDA device: this GPU test was run on purpose (--include-ignored) where there is no GPU"
    );
    if found < n {
        eprintln!("skipped: needs {n} CUDA devices, found {found}");
    }
    found >= n
}

/// Writes a model (seed 7, draft quality 0.9) once per machine: the CUDA path loads
/// checkpoints, and several test binaries share it (temp dir + rename, so a reader never sees
/// half of one).
pub fn model_dir(name: &str, dims: Dims) -> PathBuf {
    let dir = std::env::temp_dir().join(name);
    if !dir.join("draft").join("config.json").exists() {
        let tmp = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let mut o = InitOptions::new(Preset::Tiny, None, 7, 0.9);
        o.dims = dims;
        init_model_with(&o, &tmp).expect("model writes");
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp); // another process won the race
        }
    }
    dir
}

pub fn tiny_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| model_dir("kbench-cuda-engine-tiny-s7-q09", Dims::tiny()))
        .clone()
}

pub fn cpu_model(dir: &Path) -> Model {
    Model::load(dir, Some(&dir.join("draft")), Device::Cpu).expect("cpu model loads")
}

/// Relative L2 error of `a` against the reference `b`.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// Rows where the two `[rows, v]` logit matrices pick the same token.
pub fn argmax_agree(a: &[f32], b: &[f32], v: usize) -> usize {
    (0..a.len() / v)
        .filter(|&i| argmax(&a[i * v..(i + 1) * v]) == argmax(&b[i * v..(i + 1) * v]))
        .count()
}

/// A deterministic prompt of `len` tokens.
pub fn prompt(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((seed * 2654435761 + i as u64 * 40503) % vocab as u64) as u32)
        .collect()
}

/// Prefill of an 11-token prompt into slot 1, its latent cache, then a 5-node tree-masked
/// verify pass over it, on the GPU and on the CPU: logits within `tol`, the cache within
/// `tol`, and at least `min_agree` of the 5 nodes picking the CPU's token.
pub fn check_decode_and_tree_verify(cpu: &Model, gpu: &mut CudaModel, tol: f64, min_agree: usize) {
    let v = cpu.target.vocab;
    let toks = prompt(5, 11, v);
    let n = toks.len();
    let mut cache = cpu.target.new_cache();
    let pre = {
        let seg = Segment {
            cache: &cache,
            tokens: toks.clone(),
            positions: (0..n as u32).collect(),
            attend: Attend::Causal,
            all_logits: false,
        };
        cpu.target
            .forward(std::slice::from_ref(&seg))
            .unwrap()
            .remove(0)
    };
    pre.commit(
        &mut cache,
        &(0..n).collect::<Vec<_>>(),
        cpu.target.kv_width(),
    );
    let tree_toks = vec![7u32, 9, 11, 13, 15];
    // root 0; 1,2 children of 0; 3 child of 1; 4 child of 3
    let anc: Vec<Vec<usize>> = vec![
        vec![0],
        vec![0, 1],
        vec![0, 2],
        vec![0, 1, 3],
        vec![0, 1, 3, 4],
    ];
    let depth = [0u32, 1, 1, 2, 3];
    let pos: Vec<u32> = depth.iter().map(|d| n as u32 + d).collect();
    let cv = {
        let seg = Segment {
            cache: &cache,
            tokens: tree_toks.clone(),
            positions: pos.clone(),
            attend: Attend::Tree(anc.clone()),
            all_logits: true,
        };
        cpu.target
            .forward(std::slice::from_ref(&seg))
            .unwrap()
            .remove(0)
    };
    let gp = gpu
        .forward_target(
            &[GpuSegment {
                slot: 1,
                cache_len: 0,
                tokens: toks.clone(),
                positions: (0..n as u32).collect(),
                tree: None,
                all_logits: false,
            }],
            false,
        )
        .unwrap()
        .remove(0);
    let e = rel_err(&gp.logits, &pre.logits);
    eprintln!("prefill last logits rel err {e:.2e}");
    assert!(e < tol, "prefill rel err {e}");
    gpu.commit_target(1, 0, gp.row0, &(0..n).collect::<Vec<_>>())
        .unwrap();
    let gc = gpu.read_cache(1, n).unwrap();
    assert_eq!(gc.len(), cache.layers.len(), "cache layers");
    for (l, (g, c)) in gc.iter().zip(&cache.layers).enumerate() {
        let e = rel_err(g, c);
        assert!(e < tol, "cache layer {l} rel err {e}");
    }
    let gv = gpu
        .forward_target(
            &[GpuSegment {
                slot: 1,
                cache_len: n,
                tokens: tree_toks,
                positions: pos,
                tree: Some(anc),
                all_logits: true,
            }],
            false,
        )
        .unwrap()
        .remove(0);
    let e = rel_err(&gv.logits, &cv.logits);
    eprintln!("tree verify logits rel err {e:.2e}");
    assert!(e < tol, "tree verify rel err {e}");
    let agree = argmax_agree(&gv.logits, &cv.logits, v);
    eprintln!("tree verify argmax agrees at {agree}/5 nodes");
    assert!(agree >= min_agree, "tree verify argmax agrees at {agree}/5");
}
