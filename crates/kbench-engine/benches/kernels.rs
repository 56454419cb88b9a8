//! CPU kernels: INT4 group-32 matmul (Kimi expert shapes) at M = 1, 8, 64 and BF16 matmul,
//! beside a plain memory-copy baseline measured in the same run; MLA decode attention over
//! the latent cache; tree build; greedy verification.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::RngExt;

use kbench_core::tree::{build_tree, DraftTree, TreeError, TreeShape};
use kbench_core::verify::verify_greedy;
use kbench_engine::init::{build_model, InitOptions, Preset};
use kbench_engine::linalg::{Linear, Weight};
use kbench_engine::st::Slice;
use kbench_engine::target::{Attend, Segment};
use kbench_numerics::{bf16, int4};

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = kbench_core::seed::rng_for(seed, "bench", 0);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn int4_linear(out: usize, inp: usize) -> Linear {
    let w = rand_vec(out * inp, 1);
    let (p, s) = int4::quantize(&w, out, inp, 32);
    Linear {
        out,
        inp,
        w: Weight::Int4 {
            packed: Slice::from_vec(p),
            scales: Slice::from_vec(s),
            group: 32,
        },
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
}

fn memcpy(c: &mut Criterion) {
    // Same byte count as one INT4 7168x2048 expert matrix with scales (~8.3 MB), so the
    // source streams from memory as the weights do.
    let n = 7168 * 2048 / 2 + 7168 * 2048 / 32 * 2;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut g = c.benchmark_group("memcpy");
    g.throughput(Throughput::Bytes(n as u64));
    g.bench_function("copy_8.3MB", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    g.finish();
}

fn int4_matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("int4_matmul");
    for (out, inp, label) in [
        (2048, 7168, "gate_up 7168->2048"),
        (7168, 2048, "down 2048->7168"),
    ] {
        let lin = int4_linear(out, inp);
        for m in [1usize, 8, 64] {
            let x = rand_vec(m * inp, 2);
            g.throughput(Throughput::Bytes(lin.bytes() as u64));
            g.bench_with_input(BenchmarkId::new(label, format!("M={m}")), &m, |b, &m| {
                b.iter(|| lin.forward(black_box(&x), m))
            });
        }
    }
    g.finish();
}

fn bf16_matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("bf16_matmul");
    let (out, inp) = (2048, 7168);
    let w: Vec<u16> = rand_vec(out * inp, 3)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let lin = Linear::bf16(out, inp, Slice::from_vec(w));
    for m in [1usize, 8] {
        let x = rand_vec(m * inp, 4);
        g.throughput(Throughput::Bytes(lin.bytes() as u64));
        g.bench_with_input(
            BenchmarkId::new("7168->2048", format!("M={m}")),
            &m,
            |b, &m| b.iter(|| lin.forward(black_box(&x), m)),
        );
    }
    g.finish();
}

fn mla_decode(c: &mut Criterion) {
    // The tiny model's MLA over a 512-token latent cache (one decode token).
    let model = build_model(&InitOptions::new(Preset::Tiny, None, 0, 0.8)).unwrap();
    let t = &model.target;
    let prompt: Vec<u32> = (0..512).map(|i| (i * 7 % 256) as u32).collect();
    let mut cache = t.new_cache();
    let o = t
        .forward(&[Segment {
            cache: &cache,
            tokens: prompt,
            positions: (0..512).collect(),
            attend: Attend::Causal,
            all_logits: false,
        }])
        .unwrap();
    o[0].commit(&mut cache, &(0..512).collect::<Vec<_>>(), t.kv_width());
    c.bench_function("tiny_target_decode_ctx512", |b| {
        b.iter(|| {
            t.forward(&[Segment {
                cache: &cache,
                tokens: vec![5],
                positions: vec![512],
                attend: Attend::Causal,
                all_logits: true,
            }])
            .unwrap()
        })
    });
}

fn tree_and_verify(c: &mut Criterion) {
    let shape = TreeShape::new(5, 4, 8).unwrap();
    let draft = |path: &[u32]| -> Result<Vec<(u32, f32)>, TreeError> {
        let h = path
            .iter()
            .fold(17u32, |a, &t| a.wrapping_mul(31).wrapping_add(t));
        Ok((0..4)
            .map(|j| ((h + j) % 1000, 0.5 / (j + 1) as f32))
            .collect())
    };
    c.bench_function("tree_build_5_4_8", |b| {
        b.iter(|| build_tree(black_box(shape), 1, draft).unwrap())
    });
    let tree: DraftTree = build_tree(shape, 1, draft).unwrap();
    let argmax: Vec<u32> = tree.nodes.iter().map(|n| n.token).collect();
    c.bench_function("verify_greedy_8", |b| {
        b.iter(|| verify_greedy(black_box(&tree), &argmax).unwrap())
    });
}

criterion_group! {
    name = benches;
    config = config();
    targets = memcpy, int4_matmul, bf16_matmul, mla_decode, tree_and_verify
}
criterion_main!(benches);
