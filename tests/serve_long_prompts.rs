//! `kbench serve` (the engine) and long prompts: the longest prompt it accepts is stated and
//! enforced, a long prefill runs a chunk at a time with the other requests' rounds between
//! chunks, `/health` answers meanwhile, and a long prompt whose client leaves is dropped
//! between chunks.

mod serve_support;

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_support::{
    connect, get, open_generate_stream, post, read_response, tiny_model, ServerProc,
};

fn ids(n: usize) -> Vec<u32> {
    (0..n).map(|i| 3 + (i * 13 % 200) as u32).collect()
}

fn generate(prompt: &[u32], max_new: u32, stream: bool) -> String {
    json!({"input_ids": prompt, "stream": stream,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": true}})
    .to_string()
}

fn running(addr: &str) -> u64 {
    get(addr, "/get_server_info").json()["internal_states"][0]["num_running_reqs"]
        .as_u64()
        .expect("num_running_reqs")
}

#[test]
fn the_longest_prompt_is_stated_and_enforced() {
    let m = tiny_model().display().to_string();
    let server = ServerProc::start(&["--model", &m, "--max-prompt-tokens", "64"]);
    let a = &server.addr;
    let models = get(a, "/v1/models").json();
    assert_eq!(models["data"][0]["max_prompt_tokens"], 64);
    assert_eq!(get(a, "/get_server_info").json()["max_prompt_tokens"], 64);
    let r = post(a, "/generate", &generate(&ids(65), 2, false));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "prompt_too_long");
    assert_eq!(e["param"], "prompt");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("65 tokens") && message.contains("at most 64"),
        "{message}"
    );
    let body = json!({"model": "x", "prompt": ids(65), "max_tokens": 2}).to_string();
    let r = post(
        a,
        "/v1/completions",
        &body.replace("\"x\"", &format!("{:?}", m)),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "prompt_too_long");
    let r = post(a, "/generate", &generate(&ids(64), 2, false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["meta_info"]["prompt_tokens"], 64);
}

#[test]
fn without_the_flag_the_bound_comes_from_a_timed_prefill() {
    let m = tiny_model().display().to_string();
    let server = ServerProc::start(&["--model", &m]);
    let info = get(&server.addr, "/get_server_info").json();
    let max = info["max_prompt_tokens"]
        .as_u64()
        .expect("a measured bound");
    let context = info["context_length"].as_u64().unwrap();
    // at least the probe's 256 tokens, and below the tiny model's 262,144 context: a CPU
    // engine does not prefill that in 30 s
    assert!((256..context).contains(&max), "{max} of {context}");
    assert_eq!(info["chunked_prefill_size"], 256);
}

/// A streaming request's events, read on a thread until it ends or `stop` is set.
fn stream_events(addr: String, body: String) -> std::thread::JoinHandle<serve_support::Resp> {
    std::thread::spawn(move || {
        let mut c = connect(&addr);
        write!(
            c,
            "POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        read_response(&mut c)
    })
}

#[test]
fn a_long_prefill_leaves_the_others_their_rounds_and_health_answers() {
    let m = tiny_model().display().to_string();
    let server = ServerProc::start(&[
        "--model",
        &m,
        "--chunked-prefill-size",
        "64",
        "--max-prompt-tokens",
        "4000",
    ]);
    let a = server.addr.clone();
    // a short request decoding for a while
    let short = stream_events(a.clone(), generate(&ids(5), 400, true));
    let deadline = Instant::now() + Duration::from_secs(60);
    while running(&a) == 0 {
        assert!(Instant::now() < deadline, "the short request never ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    // then a long prompt: 2,000 tokens, 32 chunks
    let long_started = Instant::now();
    let long = {
        let a = a.clone();
        std::thread::spawn(move || {
            let r = post(&a, "/generate", &generate(&ids(2000), 1, false));
            (r, Instant::now())
        })
    };
    let mut health = Vec::new();
    while !long.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the long prompt took over a minute"
        );
        let t = Instant::now();
        assert_eq!(get(&a, "/health").status, 200);
        health.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (r, long_done) = long.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let short = short.join().unwrap();
    assert!(
        short.done(),
        "the short stream ended early: {}",
        short.text()
    );
    let during = short
        .events
        .iter()
        .filter(|(t, _)| *t > long_started && *t < long_done)
        .count();
    health.sort();
    let median = health[health.len() / 2];
    let worst = *health.last().unwrap();
    eprintln!(
        "long prefill {:.2} s; short stream chunks during it: {during}; /health median {:.1} ms, \
         worst {:.1} ms over {} probes",
        (long_done - long_started).as_secs_f64(),
        median.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3,
        health.len()
    );
    // one forward per chunk and one round of the short request after each: 31 rounds
    assert!(
        during >= 20,
        "only {during} chunks of the short stream during the prefill"
    );
    assert!(
        median < Duration::from_millis(100),
        "/health median {median:?}"
    );
    assert!(worst < Duration::from_secs(1), "/health worst {worst:?}");
}

#[test]
fn a_long_prompt_whose_client_leaves_is_dropped_between_chunks() {
    let m = tiny_model().display().to_string();
    let server = ServerProc::start(&[
        "--model",
        &m,
        "--chunked-prefill-size",
        "32",
        "--max-prompt-tokens",
        "8000",
    ]);
    let a = &server.addr;
    // about 8,000 tokens: tens of seconds of prefill on this engine
    let c = open_generate_stream(a, &generate(&ids(7900), 4, true));
    // the stream's head goes out at submission; the batcher takes the request a moment later
    let submitted = Instant::now();
    while running(a) == 0 {
        assert!(
            submitted.elapsed() < Duration::from_secs(5),
            "the long request never started its prefill"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let left = Instant::now();
    drop(c);
    while running(a) > 0 {
        assert!(
            left.elapsed() < Duration::from_secs(5),
            "the request still holds its slot {:?} after its client left",
            left.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // and the server serves the next one
    let r = post(a, "/generate", &generate(&ids(5), 3, false));
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = r.json();
    assert_eq!(v["meta_info"]["completion_tokens"], 3);
}
