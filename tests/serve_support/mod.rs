//! For the `kbench serve` tests: the real binary started on a free loopback port (port 0,
//! the bound address read from its log) and stopped when dropped; a small blocking HTTP/1.1
//! client that times every server-sent event and bounds every read.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Longest any single test read may wait.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

pub struct ServerProc {
    child: Child,
    pub addr: String,
    pub log: mpsc::Receiver<String>,
}

impl ServerProc {
    /// `kbench serve ARGS --port 0`; waits (bounded) for its "listening on" line.
    pub fn start(args: &[&str]) -> ServerProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kbench"))
            .arg("serve")
            .args(args)
            .args(["--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kbench starts");
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let addr = rest.split_whitespace().next().expect("address").to_string();
                        return ServerProc {
                            child,
                            addr,
                            log: rx,
                        };
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("kbench serve did not start: {}", seen.join("\n"));
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn sigterm(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `kbench ARGS` to completion and returns stdout (panics with stderr on failure).
pub fn kbench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(args)
        .output()
        .expect("kbench runs");
    assert!(
        out.status.success(),
        "kbench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body ended as HTTP says it should (last chunk, full length); false when the
    /// server closed the connection early.
    pub complete: bool,
    /// Each server-sent event's payload and when it arrived.
    pub events: Vec<(Instant, String)>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    /// The events' payloads parsed as JSON (`[DONE]` left out).
    pub fn event_json(&self) -> Vec<serde_json::Value> {
        self.events
            .iter()
            .filter(|(_, e)| e != "[DONE]")
            .map(|(_, e)| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
            .collect()
    }
    pub fn done(&self) -> bool {
        self.events.last().is_some_and(|(_, e)| e == "[DONE]")
    }
}

pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut s = connect(addr);
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    read_response(&mut s)
}

pub fn post(addr: &str, path: &str, body: &str) -> Resp {
    request(addr, "POST", path, &[], body)
}

pub fn get(addr: &str, path: &str) -> Resp {
    request(addr, "GET", path, &[], "")
}

/// Reads one response; SSE events are timed as their bytes arrive.
pub fn read_response(s: &mut TcpStream) -> Resp {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut status_line = String::new();
    if r.read_line(&mut status_line).unwrap_or(0) == 0 {
        return Resp {
            status: 0,
            headers: Vec::new(),
            body: Vec::new(),
            complete: false,
            events: Vec::new(),
        };
    }
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').expect("header");
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let header = |k: &str| headers.iter().find(|(h, _)| h == k).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    let mut events = Vec::new();
    let mut pending = String::new();
    let mut complete = false;
    let mut on_bytes = |bytes: &[u8], body: &mut Vec<u8>, events: &mut Vec<(Instant, String)>| {
        body.extend_from_slice(bytes);
        pending.push_str(&String::from_utf8_lossy(bytes));
        while let Some(i) = pending.find("\n\n") {
            let ev: String = pending.drain(..i + 2).collect();
            for line in ev.lines() {
                if let Some(d) = line.strip_prefix("data: ") {
                    events.push((Instant::now(), d.to_string()));
                }
            }
        }
    };
    if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        loop {
            let mut size_line = String::new();
            if r.read_line(&mut size_line).unwrap_or(0) == 0 {
                break;
            }
            let Ok(size) = usize::from_str_radix(size_line.trim(), 16) else {
                break;
            };
            if size == 0 {
                complete = true;
                break;
            }
            let mut buf = vec![0; size];
            if r.read_exact(&mut buf).is_err() {
                break;
            }
            on_bytes(&buf, &mut body, &mut events);
            let mut crlf = [0u8; 2];
            if r.read_exact(&mut crlf).is_err() {
                break;
            }
        }
    } else if let Some(n) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        let mut buf = vec![0; n];
        complete = r.read_exact(&mut buf).is_ok();
        on_bytes(&buf, &mut body, &mut events);
    } else {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        on_bytes(&buf, &mut body, &mut events);
    }
    Resp {
        status,
        headers,
        body,
        complete,
        events,
    }
}

/// A tiny model (target + draft) made once per test binary in a temporary directory.
pub fn tiny_model() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        kbench(&[
            "model",
            "init",
            "--preset",
            "tiny",
            "--out",
            d.path().to_str().unwrap(),
        ]);
        d
    })
    .path()
}

/// `kbench serve` on the tiny model with an EAGLE-3 round of (steps, topk, draft tokens),
/// plus `extra` flags.
pub fn spec_server(steps: u32, topk: u32, draft_tokens: u32, extra: &[&str]) -> ServerProc {
    let m = tiny_model().display().to_string();
    let draft = format!("{m}/draft");
    let (s, k, d) = (
        steps.to_string(),
        topk.to_string(),
        draft_tokens.to_string(),
    );
    let mut args = vec![
        "--model",
        &m,
        "--draft",
        &draft,
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        &s,
        "--speculative-eagle-topk",
        &k,
        "--speculative-num-draft-tokens",
        &d,
    ];
    args.extend_from_slice(extra);
    ServerProc::start(&args)
}

/// A finished `/generate` stream's last `meta_info`, after checking that every verify round
/// came as its own chunk (the first chunk is prefill's).
pub fn finished_meta(r: &Resp) -> serde_json::Value {
    assert_eq!(r.status, 200, "{}", r.text());
    let chunks = r.event_json();
    let meta = chunks.last().expect("a chunk")["meta_info"].clone();
    assert_eq!(
        meta["spec_verify_ct"].as_u64().unwrap(),
        chunks.len() as u64 - 1,
        "rounds were coalesced"
    );
    meta
}

/// Starts a long `/generate` stream of `text` and returns once the server has answered its
/// headers (the request is then in flight); dropping the connection ends it.
pub fn hold_a_request(addr: &str, text: &str) -> TcpStream {
    let body = serde_json::json!({"text": text, "stream": true,
        "sampling_params": {"max_new_tokens": 50000, "temperature": 0, "ignore_eos": true}})
    .to_string();
    open_generate_stream(addr, &body)
}

/// Posts `body` (a streaming request) to `/generate` and returns once the server has answered
/// its headers with 200; the request is then in flight, and dropping the connection ends it.
pub fn open_generate_stream(addr: &str, body: &str) -> TcpStream {
    let mut c = connect(addr);
    write!(
        c,
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    let n = c.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    c
}
