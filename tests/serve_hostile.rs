//! `kbench serve` under hostile and broken clients: each bad request gets its 4xx with an
//! OpenAI-shaped JSON body (snapshotted), slow and idle connections cannot hold the server,
//! a client that goes away frees its slot, and `/health` answers throughout.

mod serve_support;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_support::*;

fn server(extra: &[&str]) -> ServerProc {
    let m = tiny_model().to_str().unwrap().to_string();
    let mut args = vec!["--model", m.as_str()];
    args.extend_from_slice(extra);
    ServerProc::start(&args)
}

fn error_of(r: &Resp) -> Value {
    let v = r.json();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v
}

fn healthy(addr: &str) {
    assert_eq!(
        get(addr, "/health").status,
        200,
        "the server stopped answering"
    );
}

#[test]
fn bad_requests_get_4xx_with_openai_error_bodies() {
    let s = server(&[
        "--api-key",
        "sekrit",
        "--max-body-bytes",
        "2048",
        "--context-length",
        "64",
    ]);
    let auth = [("Authorization", "Bearer sekrit")];
    let post_auth = |path: &str, body: &str| request(&s.addr, "POST", path, &auth, body);
    let cases: Vec<(&str, u16, Resp)> = vec![
        (
            "no_api_key",
            401,
            post(&s.addr, "/generate", r#"{"text":"bo"}"#),
        ),
        (
            "wrong_api_key",
            401,
            request(
                &s.addr,
                "POST",
                "/v1/completions",
                &[("Authorization", "Bearer nope")],
                r#"{"prompt":"bo"}"#,
            ),
        ),
        (
            "malformed_json",
            400,
            post_auth("/v1/completions", r#"{"prompt": "bo", "#),
        ),
        (
            "unknown_field",
            400,
            post_auth("/v1/completions", r#"{"prompt": "bo", "max_tokenz": 3}"#),
        ),
        (
            "unknown_sampling_param",
            400,
            post_auth(
                "/generate",
                r#"{"text": "bo", "sampling_params": {"temprature": 0}}"#,
            ),
        ),
        (
            "empty_prompt",
            400,
            post_auth("/v1/completions", r#"{"prompt": ""}"#),
        ),
        (
            "empty_ids",
            400,
            post_auth("/generate", r#"{"input_ids": []}"#),
        ),
        (
            "token_outside_vocab",
            400,
            post_auth("/v1/completions", r#"{"prompt": [3, 99999]}"#),
        ),
        (
            "beyond_context",
            400,
            post_auth(
                "/v1/completions",
                r#"{"prompt": "bo bu", "max_tokens": 63}"#,
            ),
        ),
        (
            "zero_max_tokens",
            400,
            post_auth(
                "/generate",
                r#"{"text": "bo", "sampling_params": {"max_new_tokens": 0}}"#,
            ),
        ),
        (
            "negative_temperature",
            400,
            post_auth("/v1/completions", r#"{"prompt": "bo", "temperature": -1}"#),
        ),
        (
            "batched_prompt",
            400,
            post_auth("/v1/completions", r#"{"prompt": ["bo", "bu"]}"#),
        ),
        (
            "unsupported_logprobs",
            400,
            post_auth("/v1/completions", r#"{"prompt": "bo", "logprobs": 2}"#),
        ),
        (
            "unsupported_n",
            400,
            post_auth(
                "/v1/chat/completions",
                r#"{"messages": [{"role":"user","content":"bo"}], "n": 2}"#,
            ),
        ),
        (
            "unknown_role",
            400,
            post_auth(
                "/v1/chat/completions",
                r#"{"messages": [{"role":"robot","content":"bo"}]}"#,
            ),
        ),
        (
            "text_and_ids",
            400,
            post_auth("/generate", r#"{"text": "bo", "input_ids": [3]}"#),
        ),
        (
            "ids_given_as_text",
            400,
            post_auth("/generate", r#"{"input_ids": "abc"}"#),
        ),
        (
            "too_many_stop_strings",
            400,
            post_auth(
                "/v1/completions",
                &json!({"prompt": "bo", "stop": vec!["x"; 65]}).to_string(),
            ),
        ),
        (
            "stop_string_too_long",
            400,
            post_auth(
                "/generate",
                &json!({"text": "bo",
                    "sampling_params": {"max_new_tokens": 4, "stop": "y".repeat(241)}})
                .to_string(),
            ),
        ),
        (
            "body_too_large",
            413,
            post_auth(
                "/v1/completions",
                &format!(r#"{{"prompt": "{}"}}"#, "bo ".repeat(1000)),
            ),
        ),
        ("empty_body", 400, post_auth("/v1/completions", "")),
        (
            "unknown_path",
            404,
            request(&s.addr, "GET", "/v2/nothing", &auth, ""),
        ),
        (
            "wrong_method",
            405,
            request(&s.addr, "GET", "/v1/completions", &auth, ""),
        ),
    ];
    for (name, status, r) in cases {
        assert_eq!(r.status, status, "{name}: {}", r.text());
        insta::assert_json_snapshot!(format!("error_{name}"), error_of(&r));
    }
    // /health needs no key (load balancers probe it); everything else does
    healthy(&s.addr);
    assert_eq!(
        request(&s.addr, "GET", "/get_server_info", &auth, "").status,
        200
    );
    let info = request(&s.addr, "GET", "/get_server_info", &auth, "").text();
    assert!(!info.contains("sekrit"), "the key leaked into server info");
    let log: Vec<String> = s.log.try_iter().collect();
    assert!(!log.join("\n").contains("sekrit"), "the key was logged");
    // requests are not logged unless asked for
    assert!(
        !log.iter().any(|l| l.contains("request id=")),
        "{}",
        log.join("\n")
    );
}

#[test]
fn probes_and_scrapes_need_no_api_key_and_everything_else_does() {
    let s = server(&["--api-key", "sekrit"]);
    // as SGLang leaves /health* and /metrics open
    for path in ["/health", "/health_generate", "/metrics"] {
        let r = get(&s.addr, path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    assert!(get(&s.addr, "/metrics")
        .text()
        .contains("vllm:request_success_total"));
    let auth = [("Authorization", "Bearer sekrit")];
    let cases = [
        (
            "POST",
            "/generate",
            r#"{"text": "bo", "sampling_params": {"max_new_tokens": 2}}"#,
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": "bo", "max_tokens": 2}"#,
        ),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "bo"}], "max_tokens": 2}"#,
        ),
        ("POST", "/flush_cache", ""),
        ("GET", "/flush_cache", ""),
        ("POST", "/reset_prefix_cache", ""),
        ("GET", "/v1/models", ""),
        ("GET", "/get_server_info", ""),
        ("GET", "/get_model_info", ""),
    ];
    for (method, path, body) in cases {
        let r = request(&s.addr, method, path, &[], body);
        assert_eq!(
            r.status,
            401,
            "{method} {path} without the key: {}",
            r.text()
        );
        assert_eq!(error_of(&r)["error"]["code"], "invalid_api_key");
        let r = request(&s.addr, method, path, &auth, body);
        assert_eq!(r.status, 200, "{method} {path} with the key: {}", r.text());
    }
    // an open path is open by its exact name only
    assert_eq!(get(&s.addr, "/healthz").status, 401);
}

/// The `--log-requests` lines seen so far, waiting (bounded) until there are `n`.
fn request_lines(s: &ServerProc, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lines = Vec::new();
    while lines.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match s.log.recv_timeout(left) {
            Ok(l) if l.starts_with("kbench serve: request ") => lines.push(l),
            Ok(_) => {}
            Err(_) => panic!("{} of {n} request lines: {lines:?}", lines.len()),
        }
    }
    lines
}

/// A line's `key=value` fields (values may be JSON-quoted).
fn fields(line: &str) -> std::collections::HashMap<String, String> {
    let rest = line
        .strip_prefix("kbench serve: request ")
        .expect("a request line");
    let mut out = std::collections::HashMap::new();
    let mut chars = rest.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let value = if chars.peek() == Some(&'"') {
            let mut quoted = String::from(chars.next().unwrap());
            let mut escaped = false;
            for c in chars.by_ref() {
                quoted.push(c);
                if c == '"' && !escaped {
                    break;
                }
                escaped = c == '\\' && !escaped;
            }
            let _ = chars.next(); // the space after
            serde_json::from_str::<String>(&quoted).expect("a JSON string")
        } else {
            chars.by_ref().take_while(|&c| c != ' ').collect()
        };
        out.insert(key, value);
    }
    out
}

#[test]
fn log_requests_writes_one_line_per_finished_request() {
    let s = server(&["--log-requests", "--api-key", "sekrit"]);
    let auth = [("Authorization", "Bearer sekrit")];
    let r = request(
        &s.addr,
        "POST",
        "/v1/completions",
        &auth,
        r#"{"prompt": "bo bu da", "max_tokens": 5, "ignore_eos": true}"#,
    );
    assert_eq!(r.status, 200);
    let completion = r.json();
    let id = completion["id"].as_str().unwrap().to_string();
    let prompt_tokens = completion["usage"]["prompt_tokens"].to_string();
    let r = request(
        &s.addr,
        "POST",
        "/generate",
        &auth,
        r#"{"text": "bo bu", "rid": "my \"rid\" 1", "stream": true,
            "sampling_params": {"max_new_tokens": 7, "ignore_eos": true}}"#,
    );
    assert!(r.done());
    let generate_prompt = r.event_json().last().unwrap()["meta_info"]["prompt_tokens"].to_string();
    let bad = request(
        &s.addr,
        "POST",
        "/v1/completions",
        &auth,
        r#"{"prompt": "bo", "#,
    );
    assert_eq!(bad.status, 400);
    assert_eq!(post(&s.addr, "/generate", r#"{"text": "bo"}"#).status, 401);

    let lines = request_lines(&s, 4);
    let logged: Vec<_> = lines.iter().map(|l| fields(l)).collect();
    let want = [
        (
            id.as_str(),
            "/v1/completions",
            "200",
            prompt_tokens.as_str(),
            "5",
        ),
        (
            "my \"rid\" 1",
            "/generate",
            "200",
            generate_prompt.as_str(),
            "7",
        ),
        ("-", "/v1/completions", "400", "0", "0"),
        ("-", "/generate", "401", "0", "0"),
    ];
    for (id, endpoint, status, prompt, completion) in want {
        // each line is written as its answer is done with, so order is not promised
        let f = logged
            .iter()
            .find(|f| f["endpoint"] == endpoint && f["status"] == status)
            .unwrap_or_else(|| panic!("no {endpoint} {status} line in {lines:?}"));
        assert_eq!(f["id"], id, "{f:?}");
        assert_eq!(f["method"], "POST", "{f:?}");
        assert_eq!(f["prompt_tokens"], prompt, "{f:?}");
        assert_eq!(f["completion_tokens"], completion, "{f:?}");
        let ms: f64 = f["duration_ms"].parse().unwrap();
        assert!((0.0..60_000.0).contains(&ms), "{f:?}");
    }
    // logging keeps the answer's framing: a JSON body still has its length
    assert!(bad.headers.iter().any(|(k, _)| k == "content-length"));
    assert!(!lines.join("\n").contains("sekrit"), "the key was logged");
}

#[test]
fn too_many_requests_get_429_and_a_gone_client_frees_its_slot() {
    let s = server(&["--max-running-requests", "1", "--max-queued-requests", "0"]);
    // a long stream holds the only slot
    let c = hold_a_request(&s.addr, "bo bu");
    let r = post(
        &s.addr,
        "/v1/completions",
        r#"{"prompt": "bo", "max_tokens": 2}"#,
    );
    assert_eq!(r.status, 429, "{}", r.text());
    insta::assert_json_snapshot!("error_too_many_requests", error_of(&r));
    // flushing is refused while it runs
    assert_eq!(post(&s.addr, "/flush_cache", "").status, 400);
    // the client disconnects mid-stream: its slot comes back
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = post(
            &s.addr,
            "/v1/completions",
            r#"{"prompt": "bo", "max_tokens": 2}"#,
        );
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        assert!(Instant::now() < deadline, "the slot was never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    healthy(&s.addr);
}

#[test]
fn slow_and_idle_connections_cannot_hold_the_server() {
    let s = server(&["--read-timeout-secs", "1"]);
    // slowloris: headers trickle in and never end; the server hangs up within its timeout
    let mut slow = connect(&s.addr);
    let started = Instant::now();
    slow.write_all(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut buf = [0u8; 256];
    let mut closed = false;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        if slow.write_all(b"X-Slow: 1\r\n").is_err() {
            closed = true;
            break;
        }
        slow.set_read_timeout(Some(Duration::from_millis(1)))
            .unwrap();
        match slow.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(_) => {
                closed = true;
                break;
            }
            Err(_) => {}
        }
    }
    assert!(
        closed,
        "a request whose headers never end held its connection"
    );
    assert!(started.elapsed() < Duration::from_secs(4));

    // a slow body: headers promise 100 bytes, 10 arrive; 408 once the timeout passes
    let mut slow_body = connect(&s.addr);
    slow_body
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
        )
        .unwrap();
    let r = read_response(&mut slow_body);
    assert_eq!(r.status, 408, "{}", r.text());
    insta::assert_json_snapshot!("error_slow_body", error_of(&r));

    // 1,000 idle connections, then the server still answers
    let idle: Vec<_> = (0..1000).map(|_| connect(&s.addr)).collect();
    healthy(&s.addr);
    let r = post(
        &s.addr,
        "/v1/completions",
        r#"{"prompt": "bo", "max_tokens": 3}"#,
    );
    assert_eq!(r.status, 200);
    drop(idle);
    healthy(&s.addr);
}

/// What hyper answers by itself (before any route runs) still carries an OpenAI-shaped body,
/// and a body declared larger than the limit is refused before any of it is read.
#[test]
fn protocol_errors_have_json_bodies_and_a_huge_length_is_refused_at_once() {
    let s = server(&["--read-timeout-secs", "30"]);
    let raw = |bytes: &[u8]| {
        let mut c = connect(&s.addr);
        c.write_all(bytes).unwrap();
        read_response(&mut c)
    };
    let many_headers: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let long_uri = format!("/v1/models?{}", "q".repeat(70_000));
    let cases: Vec<(&str, u16, Resp)> = vec![
        (
            "malformed_request_line",
            400,
            raw(b"NOT HTTP AT ALL\r\n\r\n"),
        ),
        (
            "malformed_header",
            400,
            raw(b"GET /health HTTP/1.1\r\nHost x\r\n\r\n"),
        ),
        (
            "too_many_headers",
            431,
            raw(format!("GET /health HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").as_bytes()),
        ),
        (
            "uri_too_long",
            414,
            raw(format!("GET {long_uri} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()),
        ),
    ];
    for (name, status, r) in cases {
        assert_eq!(r.status, status, "{name}: {}", r.text());
        let v = error_of(&r);
        assert_eq!(v["error"]["code"], status, "{name}: {v}");
        let length = r.headers.iter().find(|(k, _)| k == "content-length");
        assert_eq!(
            length.map(|(_, v)| v.parse::<usize>().unwrap()),
            Some(r.body.len()),
            "{name}"
        );
    }
    insta::assert_json_snapshot!(
        "error_malformed_request_line",
        error_of(&raw(b"NOT HTTP AT ALL\r\n\r\n"))
    );
    // a body declared at 1 TB: 413 at once, not the body's read timeout
    let started = Instant::now();
    let mut c = connect(&s.addr);
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n{",
    )
    .unwrap();
    let r = read_response(&mut c);
    assert_eq!(r.status, 413, "{}", r.text());
    error_of(&r);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the 413 took {:?}",
        started.elapsed()
    );
    healthy(&s.addr);
}

/// Six 4 MB text prompts at once: parsing and tokenizing them runs off the threads that
/// answer, so `/health` keeps answering within 100 ms (median) while they are worked on.
#[test]
fn huge_text_prompts_do_not_stall_health() {
    let exp = format!("{}/experiments/topk1_v2.toml", env!("CARGO_MANIFEST_DIR"));
    let s = ServerProc::start(&[
        "--sim",
        &exp,
        "--speed",
        "50",
        "--max-body-bytes",
        "8000000",
    ]);
    let text: String = (0..850_000)
        .map(|i| format!("w{} ", 100 + i % 900))
        .collect();
    assert!(text.len() > 4_000_000);
    let body = Arc::new(json!({"prompt": text, "max_tokens": 2}).to_string());
    let senders: Vec<_> = (0..6)
        .map(|_| {
            let (addr, body) = (s.addr.clone(), body.clone());
            std::thread::spawn(move || post(&addr, "/v1/completions", &body))
        })
        .collect();
    let mut health = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while senders.iter().any(|t| !t.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "the prompts took over two minutes"
        );
        let t = Instant::now();
        assert_eq!(get(&s.addr, "/health").status, 200);
        health.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    for t in senders {
        let r = t.join().unwrap();
        // beyond the modelled context: refused by its length, once it was tokenized
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(error_of(&r)["error"]["code"], "context_length_exceeded");
    }
    health.sort();
    let median = health[health.len() / 2];
    eprintln!(
        "/health during six 4 MB prompts: median {median:?}, worst {:?}, {} probes",
        health.last().unwrap(),
        health.len()
    );
    assert!(
        health.len() >= 3,
        "too few probes to judge: {}",
        health.len()
    );
    assert!(
        median < Duration::from_millis(100),
        "/health median {median:?}"
    );
    healthy(&s.addr);
}

#[test]
fn injected_faults_take_the_shapes_clients_see_from_sglang_and_vllm() {
    for (kind, status) in [
        ("rate_limit", 429),
        ("server_error", 500),
        ("context_length", 400),
        ("invalid_api_key", 401),
    ] {
        let s = server(&["--fail-rate", "1", "--fail-kinds", kind]);
        let r = post(
            &s.addr,
            "/v1/completions",
            r#"{"prompt": "bo", "max_tokens": 3}"#,
        );
        assert_eq!(r.status, status, "{kind}");
        insta::assert_json_snapshot!(format!("fault_{kind}"), error_of(&r));
        healthy(&s.addr);
    }
    // a dropped connection: the first chunk, then the stream ends without [DONE]
    let s = server(&["--fail-rate", "1", "--fail-kinds", "drop"]);
    let body =
        json!({"prompt": "bo", "max_tokens": 20, "stream": true, "ignore_eos": true}).to_string();
    let r = post(&s.addr, "/v1/completions", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.events.len(), 1);
    assert!(!r.complete && !r.done());
    healthy(&s.addr);
    // a stall: the first chunk, silence for the stall, then the connection closes
    let s = server(&[
        "--fail-rate",
        "1",
        "--fail-kinds",
        "stall",
        "--fail-stall-secs",
        "0.6",
    ]);
    let started = Instant::now();
    let r = post(
        &s.addr,
        "/generate",
        &json!({"text": "bo", "stream": true,
        "sampling_params": {"max_new_tokens": 20, "ignore_eos": true}})
        .to_string(),
    );
    assert!(started.elapsed() >= Duration::from_millis(550));
    assert_eq!(r.events.len(), 1);
    assert!(!r.complete);
    healthy(&s.addr);
    // a seeded fraction: which requests fail is the seed's, request by request
    let s = server(&[
        "--fail-rate",
        "0.3",
        "--fail-kinds",
        "rate_limit,server_error",
        "--fail-seed",
        "5",
    ]);
    let faults = kbench_serve::Faults {
        rate: 0.3,
        kinds: vec![
            kbench_serve::FaultKind::RateLimit,
            kbench_serve::FaultKind::ServerError,
        ],
        seed: 5,
        ..kbench_serve::Faults::none()
    };
    let mut failed = 0;
    for n in 0..40u64 {
        let r = post(
            &s.addr,
            "/v1/completions",
            r#"{"prompt": "bo", "max_tokens": 1}"#,
        );
        let want = match faults.pick(n) {
            None => 200,
            Some(kbench_serve::FaultKind::RateLimit) => 429,
            Some(_) => 500,
        };
        failed += (want != 200) as u32;
        assert_eq!(r.status, want, "request {n}");
    }
    assert!(
        (4..=20).contains(&failed),
        "{failed} of 40 failed at rate 0.3"
    );
}

#[test]
fn bad_flags_are_refused_by_name() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(["serve", "--model", "x", "--enable-dp-attention"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--enable-dp-attention"));
    // a flag's value is a usage error (exit 2): its stderr
    let usage_error = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "a flag's value is a usage error"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let tiny = tiny_model();
    let tiny = tiny.to_str().unwrap();
    assert!(usage_error(&[
        "serve",
        "--model",
        tiny,
        "--speculative-algorithm",
        "MEDUSA"
    ])
    .contains("MEDUSA"));
    // SGLang's switch off the overlap scheduler: plain decoding without it is not modelled
    let baseline =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/baseline.toml");
    let e = usage_error(&[
        "serve",
        "--sim",
        baseline.to_str().unwrap(),
        "--disable-overlap-schedule",
    ]);
    assert!(
        e.contains("--disable-overlap-schedule without speculation"),
        "{e}"
    );
    let e = usage_error(&[
        "serve",
        "--model",
        tiny,
        "--fail-kinds",
        "meteor",
        "--fail-rate",
        "0.1",
    ]);
    assert!(e.contains("meteor"), "{e}");
}

/// Durations and rates too large or too small for the clock are refused when parsed, with
/// the bound, before anything binds: they used to panic at start or on the first request.
#[test]
fn extreme_durations_and_speeds_are_refused_with_their_bound() {
    let exp = format!("{}/experiments/topk1_v2.toml", env!("CARGO_MANIFEST_DIR"));
    for (flag, value, says) in [
        ("--read-timeout-secs", "1e300", "365 days"),
        ("--read-timeout-secs", "1e19", "365 days"),
        ("--drain-timeout-secs", "1e20", "365 days"),
        ("--fail-stall-secs", "1e300", "365 days"),
        ("--read-timeout-secs", "0", "positive"),
        ("--speed", "1e-300", "between 1e-6 and 1e6"),
        ("--speed", "1e300", "between 1e-6 and 1e6"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
            .args(["serve", "--sim", &exp, "--port", "0", flag, value])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("kbench runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flag} {value}: a usage error, not a panic: {stderr}"
        );
        assert!(
            stderr.contains(flag) && stderr.contains(says),
            "{flag} {value}: {stderr}"
        );
    }
}
