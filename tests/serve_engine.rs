//! `kbench serve --model`: the engine behind SGLang's and OpenAI's APIs gives the tokens
//! `kbench generate` gives, streams one chunk per verify round, and its server-wide counters
//! add up to the per-request numbers.

mod serve_support;

use std::time::Duration;

use serde_json::{json, Value};
use serve_support::*;

const PROMPT: &str = "bo bu da de di";

/// `kbench generate --json` on the same model, prompt and speculative settings.
fn generate(max_tokens: u32) -> Value {
    let m = tiny_model().to_str().unwrap().to_string();
    let out = kbench(&[
        "generate",
        "--model",
        &m,
        "--draft",
        &format!("{m}/draft"),
        "--num-steps",
        "3",
        "--eagle-topk",
        "1",
        "--num-draft-tokens",
        "4",
        "--prompt",
        PROMPT,
        "--max-tokens",
        &max_tokens.to_string(),
        "--json",
    ]);
    serde_json::from_str(&out).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// SGLang's `--incremental-streaming-output`: each chunk carries only its new ids and text,
/// which together make the answer the default stream's last chunk repeats whole.
#[test]
fn incremental_streaming_output_sends_each_chunk_once() {
    let server = spec_server(3, 1, 4, &["--incremental-streaming-output"]);
    let reference = generate(40);
    let info = get(&server.addr, "/get_server_info").json();
    assert_eq!(info["incremental_streaming_output"], true);
    let body = json!({"text": PROMPT, "stream": true,
        "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": true}});
    let r = post(&server.addr, "/generate", &body.to_string());
    let meta = finished_meta(&r);
    let chunks = r.event_json();
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut seen = 0;
    for c in &chunks {
        let n = c["meta_info"]["completion_tokens"].as_u64().unwrap();
        let new = ids(&c["output_ids"]);
        assert_eq!(new.len() as u64, n - seen, "{c}");
        seen = n;
        tokens.extend(new);
        text.push_str(c["text"].as_str().unwrap());
    }
    assert_eq!(tokens, ids(&reference["tokens"]));
    assert_eq!(json!(text), reference["text"]);
    assert_eq!(meta["completion_tokens"], 40);
    // kbench's own client reads the counts, not the text, so either kind of stream serves it
    assert!(chunks.len() > 2);
}

#[test]
fn greedy_tokens_and_rounds_match_kbench_generate() {
    let server = spec_server(3, 1, 4, &[]);
    let reference = generate(40);
    let want_tokens = ids(&reference["tokens"]);
    let want_rounds = ids(&reference["round_commits"]);

    // SGLang /generate, streaming
    let body = json!({"text": PROMPT, "stream": true,
        "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": true}});
    let r = post(&server.addr, "/generate", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.done() && r.complete);
    let chunks = r.event_json();
    let last = chunks.last().unwrap();
    assert_eq!(ids(&last["output_ids"]), want_tokens);
    let meta = &last["meta_info"];
    assert_eq!(
        meta["prompt_tokens"],
        json!(reference["prompt_tokens"].as_array().unwrap().len())
    );
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "length", "length": 40})
    );
    // one chunk per forward: prefill's first token, then one per verify round
    let mut seen = 0;
    let deltas: Vec<u64> = chunks
        .iter()
        .map(|c| {
            let n = c["meta_info"]["completion_tokens"].as_u64().unwrap();
            let d = n - seen;
            seen = n;
            d
        })
        .collect();
    assert_eq!(deltas[0], 1);
    assert_eq!(deltas[1..], want_rounds[..]);
    assert_eq!(meta["spec_verify_ct"], json!(chunks.len() - 1));
    assert_eq!(meta["spec_verify_ct"], json!(want_rounds.len()));
    let accept_len = meta["spec_accept_length"].as_f64().unwrap();
    assert!((accept_len - 40.0 / want_rounds.len() as f64).abs() < 1e-9);
    let correct: u64 = want_rounds.iter().map(|c| c - 1).sum();
    assert_eq!(meta["spec_num_correct_drafts"], json!(correct));
    assert_eq!(
        meta["spec_num_proposed_drafts"],
        json!(3 * want_rounds.len())
    );
    let hist = ids(&meta["spec_correct_drafts_histogram"]);
    assert_eq!(hist.iter().sum::<u64>(), want_rounds.len() as u64);
    for (n, count) in hist.iter().enumerate() {
        assert_eq!(
            *count,
            want_rounds.iter().filter(|&&c| c - 1 == n as u64).count() as u64
        );
    }
    // the text is the tokens' text
    assert_eq!(last["text"], reference["text"]);

    // SGLang /generate with input_ids, not streaming
    let body = json!({"input_ids": reference["prompt_tokens"],
        "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": true}});
    let r = post(&server.addr, "/generate", &body.to_string());
    assert_eq!(ids(&r.json()["output_ids"]), want_tokens);

    // OpenAI /v1/completions, streaming with usage
    let body = json!({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}});
    let r = post(&server.addr, "/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let chunks = r.event_json();
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .map(|ch| ch["text"].as_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(text, reference["text"].as_str().unwrap());
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], json!(40));
    let content: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"] != json!([]))
        .collect();
    assert_eq!(content.len(), want_rounds.len() + 1);
    assert_eq!(
        content.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    let mut prev = 0;
    for (c, want) in content.iter().zip(std::iter::once(&1).chain(&want_rounds)) {
        let n = c["usage"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(n - prev, *want);
        prev = n;
    }

    // OpenAI /v1/completions with token ids, not streaming
    let body = json!({"prompt": reference["prompt_tokens"], "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let r = post(&server.addr, "/v1/completions", &body.to_string()).json();
    assert_eq!(r["choices"][0]["text"], reference["text"]);
    assert_eq!(r["usage"]["completion_tokens"], json!(40));
    assert_eq!(r["object"], "text_completion");
}

#[test]
fn server_counters_add_up_to_the_requests() {
    let server = spec_server(3, 1, 4, &["--max-running-requests", "4"]);
    // several requests at once, batched together
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let addr = server.addr.clone();
            std::thread::spawn(move || {
                let prompt: Vec<u32> = (0..5).map(|j| 3 + ((i * 7 + j * 13) % 250)).collect();
                let body = json!({"input_ids": prompt, "stream": true,
                    "sampling_params": {"max_new_tokens": 17 + i, "temperature": 0, "ignore_eos": true}});
                post(&addr, "/generate", &body.to_string())
            })
        })
        .collect();
    let (mut rounds, mut completion, mut prompt_tokens, mut correct, mut proposed) =
        (0, 0, 0, 0, 0);
    for h in handles {
        // every round is its own chunk, also when batched with others
        let meta = &finished_meta(&h.join().unwrap());
        rounds += meta["spec_verify_ct"].as_u64().unwrap();
        completion += meta["completion_tokens"].as_u64().unwrap();
        prompt_tokens += meta["prompt_tokens"].as_u64().unwrap();
        correct += meta["spec_num_correct_drafts"].as_u64().unwrap();
        proposed += meta["spec_num_proposed_drafts"].as_u64().unwrap();
    }
    let info = get(&server.addr, "/get_server_info").json();
    let avg = info["internal_states"][0]["avg_spec_accept_length"]
        .as_f64()
        .unwrap();
    // SGLang's server-wide figure counts round tokens (the prefill token is in no round)
    let want = (completion - 6) as f64 / rounds as f64;
    assert!((avg - want).abs() < 1e-9, "{avg} vs {want}");
    assert_eq!(info["speculative_num_steps"], 3);
    assert!(info["version"].as_str().unwrap().starts_with("kbench-"));

    let metrics = get(&server.addr, "/metrics").text();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("vllm:spec_decode_num_drafts_total{") as u64, rounds);
    assert_eq!(
        value("vllm:spec_decode_num_draft_tokens_total{") as u64,
        proposed
    );
    assert_eq!(
        value("vllm:spec_decode_num_accepted_tokens_total{") as u64,
        correct
    );
    assert_eq!(value("vllm:generation_tokens_total{") as u64, completion);
    assert_eq!(value("vllm:prompt_tokens_total{") as u64, prompt_tokens);
    let per_pos: f64 = (0..3)
        .map(|p| value(&format!("vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name=\"{}\",engine=\"0\",position=\"{p}\"}}", info["served_model_name"].as_str().unwrap())))
        .sum();
    assert_eq!(per_pos as u64, correct);
    // vLLM's acceptance length and SGLang's agree
    assert!((1.0 + correct as f64 / rounds as f64 - avg).abs() < 1e-9);
    assert!((value("sglang:spec_accept_length{") - avg).abs() < 1e-9);
    assert_eq!(value("sglang:num_running_reqs{"), 0.0);

    assert!(value("sglang:spec_accept_rate{") > 0.0);

    // flushing restarts every speculative gauge and leaves the counters counting
    assert_eq!(post(&server.addr, "/flush_cache", "").status, 200);
    let info = get(&server.addr, "/get_server_info").json();
    assert_eq!(
        info["internal_states"][0]["avg_spec_accept_length"],
        json!(0.0)
    );
    let flushed = get(&server.addr, "/metrics").text();
    let after = |name: &str| -> f64 {
        flushed
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("{name} missing:\n{flushed}"))
            .parse()
            .unwrap()
    };
    assert_eq!(after("sglang:spec_accept_length{"), 0.0);
    assert_eq!(after("sglang:spec_accept_rate{"), 0.0);
    assert_eq!(after("vllm:spec_decode_num_drafts_total{") as u64, rounds);
    assert_eq!(
        after("vllm:spec_decode_num_accepted_tokens_total{") as u64,
        correct
    );
}

/// `avg_spec_accept_length` from `/get_server_info`.
fn avg_accept_length(addr: &str) -> f64 {
    get(addr, "/get_server_info").json()["internal_states"][0]["avg_spec_accept_length"]
        .as_f64()
        .unwrap()
}

#[test]
fn reset_prefix_cache_is_the_flush_under_vllms_contract() {
    let server = spec_server(3, 1, 4, &[]);
    let body = json!({"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0,
        "ignore_eos": true}});
    assert_eq!(
        post(&server.addr, "/generate", &body.to_string()).status,
        200
    );
    let avg = avg_accept_length(&server.addr);
    assert!(avg > 0.0);

    // vLLM routes it for POST only
    assert_eq!(get(&server.addr, "/reset_prefix_cache").status, 405);
    let r = post(
        &server.addr,
        "/reset_prefix_cache?reset_running_requests=maybe",
        "",
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "reset_running_requests");

    // while a request runs: 200 as vLLM answers, and nothing is reset, unless told to
    let held = hold_a_request(&server.addr, PROMPT);
    let r = post(&server.addr, "/reset_prefix_cache", "");
    assert_eq!((r.status, r.text()), (200, String::new()));
    assert_eq!(avg_accept_length(&server.addr), avg);
    let r = post(
        &server.addr,
        "/reset_prefix_cache?reset_running_requests=true&reset_external=false",
        "",
    );
    assert_eq!((r.status, r.text()), (200, String::new()));
    assert_eq!(avg_accept_length(&server.addr), 0.0);
    drop(held);

    // idle: the same reset as /flush_cache, with vLLM's empty 200
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while get(&server.addr, "/metrics")
        .text()
        .lines()
        .any(|l| l.starts_with("sglang:num_running_reqs{") && !l.ends_with(" 0"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the held request never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        post(&server.addr, "/generate", &body.to_string()).status,
        200
    );
    assert!(avg_accept_length(&server.addr) > 0.0);
    let r = post(&server.addr, "/reset_prefix_cache", "");
    assert_eq!((r.status, r.text()), (200, String::new()));
    assert_eq!(avg_accept_length(&server.addr), 0.0);
    let metrics = get(&server.addr, "/metrics").text();
    for gauge in ["sglang:spec_accept_length{", "sglang:spec_accept_rate{"] {
        let line = metrics.lines().find(|l| l.starts_with(gauge)).unwrap();
        assert!(line.ends_with(" 0"), "{line}");
    }
}

#[test]
fn requests_may_name_the_model_by_its_served_name_or_its_path() {
    let path = tiny_model().to_str().unwrap().to_string();
    let server = ServerProc::start(&["--model", &path, "--served-model-name", "tiny-kimi"]);
    for model in ["tiny-kimi", path.as_str()] {
        let r = post(
            &server.addr,
            "/v1/completions",
            &json!({"model": model, "prompt": PROMPT, "max_tokens": 2}).to_string(),
        );
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        // answers name the model by its served name, as vLLM's do
        assert_eq!(r.json()["model"], "tiny-kimi");
        let r = post(
            &server.addr,
            "/v1/chat/completions",
            &json!({"model": model, "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 2})
            .to_string(),
        );
        assert_eq!(r.status, 200, "{model}: {}", r.text());
    }
    let slashed = format!("{path}/");
    for other in ["other", "tiny", slashed.as_str()] {
        let r = post(
            &server.addr,
            "/v1/completions",
            &json!({"model": other, "prompt": PROMPT, "max_tokens": 2}).to_string(),
        );
        assert_eq!(r.status, 404, "{other}: {}", r.text());
    }
    // the listing is unchanged: the served name, with the path as its root
    let models = get(&server.addr, "/v1/models").json();
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert_eq!(models["data"][0]["id"], "tiny-kimi");
    assert_eq!(models["data"][0]["root"], json!(path));
}

#[test]
fn usage_reports_the_prompt_tokens_served_from_cache() {
    let server = spec_server(3, 1, 4, &[]);
    // the engine keeps no prefix cache, so even a repeated prompt has none cached
    let cached = |usage: &Value| usage["prompt_tokens_details"]["cached_tokens"].clone();
    for chat in [false, true] {
        let (path, mut body) = if chat {
            (
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": PROMPT}]}),
            )
        } else {
            ("/v1/completions", json!({"prompt": PROMPT}))
        };
        body["max_tokens"] = json!(6);
        body["ignore_eos"] = json!(true);
        for _ in 0..2 {
            let r = post(&server.addr, path, &body.to_string()).json();
            assert_eq!(cached(&r["usage"]), json!(0), "{path}: {r}");
        }
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
        let chunks = post(&server.addr, path, &streamed.to_string()).event_json();
        assert!(chunks.len() > 2);
        for c in &chunks {
            assert_eq!(cached(&c["usage"]), json!(0), "{path}: {c}");
        }
        assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    }
    let body = json!({"text": PROMPT, "sampling_params": {"max_new_tokens": 4}});
    let r = post(&server.addr, "/generate", &body.to_string()).json();
    assert_eq!(r["meta_info"]["cached_tokens"], json!(0));
}

#[test]
fn stops_end_requests_where_sglang_would() {
    let server = spec_server(3, 1, 4, &[]);
    let reference = generate(30);
    let tokens = ids(&reference["tokens"]);
    // a stop token id: the output ends with it
    let stop_id = tokens[5];
    let first = tokens.iter().position(|&t| t == stop_id).unwrap();
    let body = json!({"text": PROMPT, "sampling_params": {"max_new_tokens": 30, "temperature": 0,
        "stop_token_ids": [stop_id]}});
    let r = post(&server.addr, "/generate", &body.to_string()).json();
    assert_eq!(ids(&r["output_ids"]), tokens[..=first]);
    assert_eq!(
        r["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": stop_id})
    );

    // a stop string: the text ends before it, finish_reason "stop" with matched_stop
    let words: Vec<&str> = reference["text"].as_str().unwrap().split(' ').collect();
    let stop = words[4];
    let cut = reference["text"].as_str().unwrap().find(stop).unwrap();
    for stream in [false, true] {
        let body = json!({"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "ignore_eos": true,
            "stop": [stop], "stream": stream});
        let r = post(&server.addr, "/v1/completions", &body.to_string());
        let (text, finish, matched) = if stream {
            let chunks = r.event_json();
            let last = chunks.last().unwrap()["choices"][0].clone();
            let text: String = chunks
                .iter()
                .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
                .collect();
            (
                text,
                last["finish_reason"].clone(),
                last["matched_stop"].clone(),
            )
        } else {
            let c = r.json()["choices"][0].clone();
            (
                c["text"].as_str().unwrap().to_string(),
                c["finish_reason"].clone(),
                c["matched_stop"].clone(),
            )
        };
        assert_eq!(
            text,
            reference["text"].as_str().unwrap()[..cut],
            "stream={stream}"
        );
        assert_eq!(finish, "stop");
        assert_eq!(matched, json!(stop));
    }

    // the chat endpoint: the template's prompt, role in the first chunk, usage
    let body = json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8,
        "temperature": 0, "ignore_eos": true});
    let r = post(&server.addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["usage"]["completion_tokens"], json!(8));
    let body = json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8,
        "temperature": 0, "ignore_eos": true, "stream": true});
    let chunks = post(&server.addr, "/v1/chat/completions", &body.to_string()).event_json();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let streamed: String = chunks
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        streamed,
        r["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // a seeded sampled request is reproducible
    let body = json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0.9, "seed": 7, "ignore_eos": true});
    let a = post(&server.addr, "/v1/completions", &body.to_string()).json();
    let b = post(&server.addr, "/v1/completions", &body.to_string()).json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

#[test]
fn info_endpoints_answer_as_sglang_and_openai_do() {
    let server = spec_server(3, 1, 4, &["--served-model-name", "tiny-kimi"]);
    assert_eq!(get(&server.addr, "/health").status, 200);
    assert_eq!(get(&server.addr, "/health_generate").status, 200);
    let models = get(&server.addr, "/v1/models").json();
    assert_eq!(models["data"][0]["id"], "tiny-kimi");
    assert_eq!(models["data"][0]["object"], "model");
    assert!(models["data"][0]["max_model_len"].as_u64().unwrap() > 0);
    let info = get(&server.addr, "/get_model_info").json();
    assert_eq!(info["is_generation"], true);
    assert!(info["model_path"].as_str().is_some());
    // a request naming another model is refused
    let r = post(
        &server.addr,
        "/v1/completions",
        &json!({"model": "other", "prompt": "bo"}).to_string(),
    );
    assert_eq!(r.status, 404);
}

#[test]
fn sigterm_drains_running_requests_then_exits() {
    let mut server = spec_server(3, 1, 4, &["--drain-timeout-secs", "20"]);
    let addr = server.addr.clone();
    let client = std::thread::spawn(move || {
        let body = json!({"text": PROMPT, "stream": true,
            "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": true}});
        post(&addr, "/generate", &body.to_string())
    });
    // the request is running when the signal comes
    std::thread::sleep(Duration::from_millis(150));
    server.sigterm();
    let status = server
        .wait_exit(Duration::from_secs(30))
        .expect("exits within the drain bound");
    assert!(status.success(), "{status:?}");
    let r = client.join().unwrap();
    assert_eq!(r.status, 200);
    assert!(r.done(), "the running request was cut off");
    let last = r.event_json().pop().unwrap();
    assert_eq!(last["meta_info"]["completion_tokens"], 400);
}
