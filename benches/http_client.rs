//! The http backend's client against `kbench serve --sim` on loopback (issue 9's target:
//! 1,000 concurrent streams, and under 1 ms p99 added delay at 256 streams, on the 2-core
//! development machine). The server stamps each chunk when it writes it
//! (`meta_info.kbench_sent_unix_ns`); the client's own request code (`kbench_http::request`,
//! the same SSE and JSON parsing the backend runs, on a 2-thread runtime as the backend's)
//! timestamps it on arrival. Printed once per load before measuring: streams, chunks/s, and
//! the delay from a chunk leaving the server to its timestamp (p50, p99, max). Criterion
//! then times the 1,000-stream load.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use kbench_http::client::Client;
use kbench_http::request::{run, Sent};
use kbench_http::settings::{Api, Target};

const TOKENS: u32 = 64;
/// (streams, speed): 256 streams at a speed the server keeps up with (the delay is the
/// figure); 1,000 at one that outruns it (chunks/s is the figure).
const LOADS: [(usize, f64); 2] = [(256, 20.0), (1000, 400.0)];

mod support;

use support::{percentile, raw_stream, start, Server};

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// One load: (chunks, wall seconds, every chunk's delay from leaving the server to its
/// timestamp, in seconds).
fn load(
    rt: &tokio::runtime::Runtime,
    client: &Arc<Client>,
    streams: usize,
) -> (usize, f64, Vec<f64>) {
    let start = Instant::now();
    let start_unix = unix_ns();
    let outcomes = rt.block_on(async {
        let tasks: Vec<_> = (0..streams)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let sent = Sent {
                        id: i as u64,
                        warmup: false,
                        prompt: (0..16).map(|j| (3 + (i * 31 + j) % 1000) as u32).collect(),
                        max_tokens: TOKENS,
                        ignore_eos: true,
                        temperature: 0.0,
                        submitted_ns: start.elapsed().as_nanos() as u64,
                    };
                    run(
                        &client,
                        Api::Sglang,
                        None,
                        // topk1_v2's chain drafts 2 a round
                        Some(2),
                        sent,
                        start,
                        Duration::from_secs(120),
                    )
                    .await
                })
            })
            .collect();
        let mut all = Vec::with_capacity(streams);
        for t in tasks {
            all.push(t.await.unwrap());
        }
        all
    });
    let wall = start.elapsed().as_secs_f64();
    let failed: Vec<_> = outcomes
        .iter()
        .filter_map(|o| o.record.error.clone())
        .collect();
    assert!(
        failed.is_empty(),
        "{} streams failed: {:?}",
        failed.len(),
        &failed[..1]
    );
    let mut delays = Vec::new();
    for o in &outcomes {
        assert_eq!(
            o.sent_unix_ns.len(),
            o.chunks.len(),
            "the server stamps every chunk"
        );
        for (c, sent) in o.chunks.iter().zip(&o.sent_unix_ns) {
            let arrived = start_unix + c.visible_ns;
            delays.push(arrived.saturating_sub(sent.unwrap()) as f64 / 1e9);
        }
    }
    (delays.len(), wall, delays)
}

/// The baseline: the least a client can do with the same streams (one read loop per
/// connection, the stamps picked out of the bytes, no SSE or JSON parsing), so what the
/// backend's client adds is the difference between the two delays, measured in one run.
async fn raw_stream_delays(addr: String, i: usize) -> Vec<f64> {
    raw_stream(addr, i, TOKENS, b"\"kbench_sent_unix_ns\":", unix_ns)
        .await
        .into_iter()
        .map(|(arrived, sent)| arrived.saturating_sub(sent) as f64 / 1e9)
        .collect()
}

fn raw_load(rt: &tokio::runtime::Runtime, addr: &str, streams: usize) -> (usize, f64, Vec<f64>) {
    let start = Instant::now();
    let delays: Vec<f64> = rt.block_on(async {
        let tasks: Vec<_> = (0..streams)
            .map(|i| tokio::spawn(raw_stream_delays(addr.to_string(), i)))
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    (delays.len(), start.elapsed().as_secs_f64(), delays)
}

fn client_for(server: &Server) -> Arc<Client> {
    let target = Target::parse(&format!("http://{}", server.1)).unwrap();
    Arc::new(Client::new(target, None))
}

fn http_client(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for (streams, speed) in LOADS {
        let server = start(speed);
        let client = client_for(&server);
        let mut p99 = Vec::new();
        for (name, (chunks, wall, mut delays)) in [
            ("minimal client", raw_load(&rt, &server.1, streams)),
            ("http backend  ", load(&rt, &client, streams)),
        ] {
            delays.sort_by(f64::total_cmp);
            p99.push(percentile(&delays, 0.99));
            eprintln!(
                "{name} vs serve --sim at {speed}x, {streams} streams x {TOKENS} tokens: {chunks} chunks in {wall:.2} s = {:.0} chunks/s; server-to-timestamp delay p50 {:.3} ms, p99 {:.3} ms, max {:.2} ms",
                chunks as f64 / wall,
                percentile(&delays, 0.5) * 1e3,
                p99[p99.len() - 1] * 1e3,
                delays.last().unwrap() * 1e3,
            );
        }
        eprintln!(
            "  the http backend's client adds {:+.3} ms at p99 over the minimal one",
            (p99[1] - p99[0]) * 1e3
        );
    }
    let (streams, speed) = LOADS[1];
    let server = start(speed);
    let client = client_for(&server);
    let (chunks, _, _) = load(&rt, &client, streams);
    let mut g = c.benchmark_group("http_client");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(chunks as u64));
    g.bench_function("1000_streams_x_64_tokens", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (_, wall, _) = load(&rt, &client, streams);
                total += Duration::from_secs_f64(wall);
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, http_client);
criterion_main!(benches);
