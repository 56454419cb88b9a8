//! `kbench serve --sim` under load (issue 8's target: 1,000 concurrent streams and 20,000
//! chunks/s on the 2-core development machine). The real binary serves
//! experiments/topk1_v2.toml with the batch cap raised to 1,024; 1,000 clients stream at
//! once from this process. Printed once before measuring: chunks/s and requests/s sustained,
//! and how late chunks reach the client against the simulator's timeline (virtual time /
//! speed; the common offset, the loopback latency, taken out). Criterion then times the
//! whole load.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const STREAMS: usize = 1000;
const TOKENS: u32 = 64;
/// Virtual seconds per wall second. The modelled deployment at 1,000 running requests
/// commits a round about every 1.3 virtual seconds; at the slower speed the server keeps up
/// (lateness is the figure), at the faster the timeline outruns it (chunks/s is the figure:
/// the most the server sustains).
const SPEEDS: [f64; 2] = [20.0, 400.0];
/// The speed criterion times.
const TIMED_SPEED: f64 = 400.0;

mod support;

use support::{percentile, raw_stream, start};

/// One stream: each chunk's arrival (since `epoch`) and virtual release time / speed, in s.
async fn stream(addr: String, i: usize, epoch: Instant, speed: f64) -> Vec<(f64, f64)> {
    raw_stream(addr, i, TOKENS, b"\"kbench_virtual_ns\":", || {
        epoch.elapsed().as_secs_f64()
    })
    .await
    .into_iter()
    .map(|(at, v)| (at, v as f64 / 1e9 / speed))
    .collect()
}

/// Runs the whole load; returns (chunks, wall seconds, lateness of every chunk in seconds).
fn load(rt: &tokio::runtime::Runtime, addr: &str, speed: f64) -> (usize, f64, Vec<f64>) {
    let epoch = Instant::now();
    let results = rt.block_on(async {
        let tasks: Vec<_> = (0..STREAMS)
            .map(|i| tokio::spawn(stream(addr.to_string(), i, epoch, speed)))
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.unwrap());
        }
        all
    });
    let wall = epoch.elapsed().as_secs_f64();
    let chunks: usize = results.iter().map(Vec::len).sum();
    assert_eq!(
        results.iter().filter(|r| r.is_empty()).count(),
        0,
        "a stream got nothing"
    );
    let offset = results
        .iter()
        .flatten()
        .map(|(at, scheduled)| at - scheduled)
        .fold(f64::INFINITY, f64::min);
    let late = results
        .iter()
        .flatten()
        .map(|(at, scheduled)| at - scheduled - offset)
        .collect();
    (chunks, wall, late)
}

fn serve(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for speed in SPEEDS {
        let server = start(speed);
        let (chunks, wall, mut late) = load(&rt, &server.1, speed);
        late.sort_by(f64::total_cmp);
        eprintln!(
            "serve --sim: {STREAMS} concurrent streams x {TOKENS} tokens at {speed}x: {chunks} chunks in {wall:.2} s = {:.0} chunks/s, {:.0} requests/s; chunk lateness vs the timeline p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            chunks as f64 / wall,
            STREAMS as f64 / wall,
            percentile(&late, 0.5) * 1e3,
            percentile(&late, 0.99) * 1e3,
            late.last().unwrap() * 1e3,
        );
    }
    let server = start(TIMED_SPEED);
    let (chunks, _, _) = load(&rt, &server.1, TIMED_SPEED);
    let mut g = c.benchmark_group("serve_sim");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(chunks as u64));
    g.bench_function("1000_streams_x_64_tokens", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (_, wall, _) = load(&rt, &server.1, TIMED_SPEED);
                total += Duration::from_secs_f64(wall);
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, serve);
criterion_main!(benches);
