//! `kbench serve --sim` under load (issue 8's target: 1,000 concurrent streams and 20,000
//! chunks/s on the 2-core development machine). The real binary serves
//! experiments/topk1_v2.toml with the batch cap raised to 1,024; 1,000 clients stream at
//! once from this process. Printed once before measuring: chunks/s and requests/s sustained,
//! and how late chunks reach the client against the simulator's timeline (virtual time /
//! speed; the common offset, the loopback latency, taken out). Criterion then times the
//! whole load.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const STREAMS: usize = 1000;
const TOKENS: u32 = 64;
/// Virtual seconds per wall second. The modelled deployment at 1,000 running requests
/// commits a round about every 1.3 virtual seconds; at the slower speed the server keeps up
/// (lateness is the figure), at the faster the timeline outruns it (chunks/s is the figure:
/// the most the server sustains).
const SPEEDS: [f64; 2] = [20.0, 400.0];
/// The speed criterion times.
const TIMED_SPEED: f64 = 400.0;

struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(speed: f64) -> Server {
    let exp = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/topk1_v2.toml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args([
            "serve",
            "--sim",
            exp,
            "--speed",
            &speed.to_string(),
            "--port",
            "0",
        ])
        .args([
            "--set",
            "server.max_running_requests=1024",
            "--max-queued-requests",
            "0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kbench starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("kbench serve printed its address")
            .unwrap();
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server(child, addr)
}

/// One stream: each chunk's arrival (since `epoch`) and virtual release time.
async fn stream(addr: String, i: usize, epoch: Instant, speed: f64) -> Vec<(f64, f64)> {
    let body = format!(
        r#"{{"input_ids":[{}],"stream":true,"sampling_params":{{"max_new_tokens":{TOKENS},"ignore_eos":true}}}}"#,
        (0..16)
            .map(|j| (3 + (i * 31 + j) % 1000).to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connects");
    s.set_nodelay(true).unwrap();
    let head = format!(
        "POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let key = b"\"kbench_virtual_ns\":";
    let mut carry: Vec<u8> = Vec::new();
    let mut out = Vec::with_capacity(TOKENS as usize);
    let mut buf = vec![0u8; 16384];
    loop {
        let n = match tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => n,
        };
        let at = epoch.elapsed().as_secs_f64();
        carry.extend_from_slice(&buf[..n]);
        let mut consumed = 0;
        while let Some(p) = find(&carry[consumed..], key) {
            let start = consumed + p + key.len();
            let end = match carry[start..].iter().position(|b| !b.is_ascii_digit()) {
                Some(e) => start + e,
                None => break,
            };
            let v: f64 = std::str::from_utf8(&carry[start..end])
                .unwrap()
                .parse()
                .unwrap();
            out.push((at, v / 1e9 / speed));
            consumed = end;
        }
        carry.drain(..consumed);
        if find(&carry, b"[DONE]").is_some() {
            break;
        }
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
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
