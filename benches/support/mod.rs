//! What the benchmarks against `kbench serve --sim` share: the server (the real binary on
//! experiments/topk1_v2.toml, batch cap raised to 1,024) and the least a client can do with
//! a stream (one read loop, one number picked out of each chunk's bytes, no parsing).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running `kbench serve --sim`, killed when dropped; `.1` is its address.
pub struct Server(Child, pub String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start(speed: f64) -> Server {
    let exp = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/topk1_v2.toml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(["serve", "--sim", exp, "--speed", &speed.to_string()])
        .args(["--port", "0", "--set", "server.max_running_requests=1024"])
        .args(["--max-queued-requests", "0"])
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

/// Stream `i` of `tokens` tokens through `/generate`: for each chunk, `arrived()` when its
/// bytes came and the integer after `key` (e.g. `"kbench_virtual_ns":`) in it.
pub async fn raw_stream<T>(
    addr: String,
    i: usize,
    tokens: u32,
    key: &[u8],
    arrived: impl Fn() -> T,
) -> Vec<(T, u64)>
where
    T: Copy,
{
    let ids: Vec<String> = (0..16)
        .map(|j| (3 + (i * 31 + j) % 1000).to_string())
        .collect();
    let body = format!(
        r#"{{"input_ids":[{}],"stream":true,"sampling_params":{{"max_new_tokens":{tokens},"ignore_eos":true}}}}"#,
        ids.join(",")
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
    let (mut carry, mut out, mut buf) = (Vec::new(), Vec::new(), vec![0u8; 16384]);
    loop {
        let n = match tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => n,
        };
        let at = arrived();
        carry.extend_from_slice(&buf[..n]);
        let mut consumed = 0;
        while let Some(p) = find(&carry[consumed..], key) {
            let start = consumed + p + key.len();
            let Some(len) = carry[start..].iter().position(|b| !b.is_ascii_digit()) else {
                break;
            };
            let v: u64 = std::str::from_utf8(&carry[start..start + len])
                .unwrap()
                .parse()
                .unwrap();
            out.push((at, v));
            consumed = start + len;
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

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
