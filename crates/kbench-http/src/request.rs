//! One generation request against the server: sent with exact lengths (token ids,
//! `ignore_eos`), its server-sent events timestamped on arrival, token counts read from the
//! cumulative counters, speculative statistics from SGLang's finished `meta_info`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use kbench_core::backend::{ChunkEvent, Nanos, RequestRecord};

use crate::client::Client;
use crate::event::Event;
use crate::settings::Api;

pub struct Sent {
    pub id: u64,
    pub warmup: bool,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    /// false: the server stops at EOS (the workload's `ignore_eos = false`).
    pub ignore_eos: bool,
    pub temperature: f64,
    pub submitted_ns: Nanos,
}

/// What the stream told about one request.
pub struct Outcome {
    pub record: RequestRecord,
    pub chunks: Vec<ChunkEvent>,
    /// The request failed in transport (no connection, a reset, no answer in time), which
    /// may mean the server is gone: the session then asks `/health` before going on.
    pub transport_failed: bool,
    /// Per chunk, when the server says it sent it (`kbench serve --sim` stamps
    /// `meta_info.kbench_sent_unix_ns`): what the client-overhead benchmark compares the
    /// arrival timestamps with. Empty for other servers.
    pub sent_unix_ns: Vec<Option<u64>>,
}

/// Why a request failed, and whether the connection itself failed.
struct Failure {
    message: String,
    transport: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure {
            message,
            transport: false,
        }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::from(message.to_string())
    }
}

fn transport(message: String) -> Failure {
    Failure {
        message,
        transport: true,
    }
}

/// What the server said of a request's verify rounds.
#[derive(Default)]
struct Rounds {
    /// SGLang's `spec_verify_ct`, vLLM's `num_spec_steps` (steps that verified drafts:
    /// an n-gram step that found no match is not one).
    count: Option<u32>,
    /// vLLM's `per_step_accepted` (`--per-request-spec-decode-metrics detailed`): each
    /// round's accepted drafts, so its commit is that plus the bonus token.
    accepted: Option<Vec<u32>>,
    /// vLLM's `per_step_drafted`, beside it: each round's proposed drafts.
    drafted: Option<Vec<u32>>,
    /// vLLM's `num_accepted_draft_tokens` and `num_draft_tokens` (`summary` and
    /// `detailed`): what the rounds accepted and proposed in all.
    accepted_total: Option<u64>,
    drafted_total: Option<u64>,
}

/// Error text is kept and printed at most this long: a server's message can be megabytes.
pub const MAX_ERROR_BYTES: usize = 4096;

/// A server's text as kbench stores and prints it: at most [`MAX_ERROR_BYTES`], control
/// characters escaped so none reaches a terminal raw.
pub fn sanitized(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.char_indices() {
        if out.len() >= MAX_ERROR_BYTES {
            out.push_str(&format!("... ({} more bytes)", text.len() - i));
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The server's round counts, checked against what the request could hold: every round
/// commits at least one of its `tokens` (the accepted drafts plus the bonus), and accepts
/// at most what it proposed, at most `max_drafts`. A count past that fails the request,
/// and none of its counts is used: an accept length above its bound cannot be reported.
fn within_bounds(rounds: Rounds, tokens: usize, max_drafts: u32) -> Result<Rounds, Failure> {
    let tokens = tokens as u64;
    let max_drafts = u64::from(max_drafts);
    let fail = |what: String| Err(Failure::from(what));
    if let Some(n) = rounds.count.filter(|&n| u64::from(n) > tokens) {
        return fail(format!(
            "the server claims {n} verify rounds for a request of {tokens} tokens (each round commits at least one)"
        ));
    }
    if let Some(accepted) = &rounds.accepted {
        let committed: u64 = accepted.iter().map(|&a| u64::from(a) + 1).sum();
        if committed > tokens {
            return fail(format!(
                "the server's per-step accepted drafts commit {committed} tokens, more than the request's {tokens}"
            ));
        }
        if let Some((i, a)) = accepted
            .iter()
            .enumerate()
            .find(|(_, &a)| u64::from(a) > max_drafts)
        {
            return fail(format!(
                "the server says round {i} accepted {a} drafts, more than the {max_drafts} a round proposes"
            ));
        }
        if let Some(drafted) = &rounds.drafted {
            if drafted.len() != accepted.len() {
                return fail(format!(
                    "the server lists {} per-step drafted counts for {} per-step accepted counts",
                    drafted.len(),
                    accepted.len()
                ));
            }
            if let Some((i, (a, d))) = accepted
                .iter()
                .zip(drafted)
                .enumerate()
                .find(|(_, (&a, &d))| a > d || u64::from(d) > max_drafts)
            {
                return fail(format!(
                    "the server says round {i} accepted {a} of {d} drafts (at most {max_drafts} are proposed)"
                ));
            }
        }
    }
    if let (Some(n), Some(accepted)) = (rounds.count, rounds.accepted_total) {
        let n = u64::from(n);
        let drafted = rounds.drafted_total.unwrap_or(n * max_drafts);
        if accepted > drafted || drafted > n * max_drafts || n + accepted > tokens {
            return fail(format!(
                "the server says {n} rounds accepted {accepted} of {drafted} drafts in a request of {tokens} tokens (at most {max_drafts} drafts a round)"
            ));
        }
    }
    // a count alone: SGLang's accept length is the tokens over it
    if let (Some(n), None, None) = (rounds.count, &rounds.accepted, rounds.accepted_total) {
        let n = u64::from(n);
        if n > 0 && tokens.saturating_sub(1) > n * (max_drafts + 1) {
            return fail(format!(
                "the server claims {n} verify rounds for {tokens} tokens: more than the {} a round can commit",
                max_drafts + 1
            ));
        }
    }
    Ok(rounds)
}

/// vLLM's per-request `metrics.speculative_decoding` (final usage chunk).
fn vllm_rounds(v: &Event, rounds: &mut Rounds) {
    let Some(spec) = v
        .metrics
        .as_ref()
        .and_then(|m| m.speculative_decoding.as_ref())
    else {
        return;
    };
    if let Some(n) = spec.num_spec_steps {
        rounds.count = Some(u32::try_from(n).unwrap_or(u32::MAX));
    }
    rounds.accepted_total = spec.num_accepted_draft_tokens;
    rounds.drafted_total = spec.num_draft_tokens;
    if let Some(steps) = &spec.per_step_accepted {
        rounds.accepted = Some(steps.clone());
    }
    if let Some(steps) = &spec.per_step_drafted {
        rounds.drafted = Some(steps.clone());
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn body(api: Api, model: Option<&str>, s: &Sent) -> Value {
    match api {
        Api::Sglang => json!({
            "input_ids": s.prompt,
            "sampling_params": {"max_new_tokens": s.max_tokens, "temperature": s.temperature, "ignore_eos": s.ignore_eos},
            "stream": true,
        }),
        Api::OpenAiCompletions | Api::OpenAiChat => {
            let mut b = json!({
                "max_tokens": s.max_tokens, "temperature": s.temperature,
                "ignore_eos": s.ignore_eos, "stream": true,
                "stream_options": {"include_usage": true, "continuous_usage_stats": true},
            });
            if api == Api::OpenAiChat {
                b["messages"] = json!([{"role": "user", "content": prompt_text(&s.prompt)}]);
            } else {
                b["prompt"] = json!(s.prompt);
            }
            if let Some(m) = model {
                b["model"] = json!(m);
            }
            b
        }
    }
}

/// The chat API takes text: one `w<id>` word per prompt token (`kbench serve` without a
/// tokenizer reads each back as one token; a real tokenizer splits them further).
pub fn prompt_text(ids: &[u32]) -> String {
    let words: Vec<String> = ids.iter().map(|id| format!("w{id}")).collect();
    words.join(" ")
}

fn path(api: Api) -> &'static str {
    match api {
        Api::Sglang => "/generate",
        Api::OpenAiCompletions => "/v1/completions",
        Api::OpenAiChat => "/v1/chat/completions",
    }
}

/// Runs the request to its end; a failure comes back as a record with `error` set.
pub async fn run(
    client: &Client,
    api: Api,
    model: Option<&str>,
    // the most drafts a round proposes; None without speculation
    max_drafts: Option<u32>,
    s: Sent,
    start: Instant,
    limit: Duration,
) -> Outcome {
    let now = || start.elapsed().as_nanos() as Nanos;
    let mut record = RequestRecord {
        id: s.id,
        warmup: s.warmup,
        input_len: s.prompt.len() as u32,
        requested_tokens: s.max_tokens,
        submitted_ns: s.submitted_ns,
        retractions: None,
        token_times_ns: Vec::new(),
        round_commits: Vec::new(),
        undrafted_rounds: 0,
        reported_rounds: None,
        reported_accepted: None,
        error: None,
    };
    let mut chunks = Vec::new();
    let mut sent_unix_ns = Vec::new();
    let result = tokio::time::timeout(
        limit,
        stream(
            client,
            api,
            model,
            &s,
            &mut record,
            &mut chunks,
            &mut sent_unix_ns,
            now,
        ),
    )
    .await;
    let verify = match result {
        Err(_) => Err(transport(format!("no complete answer within {limit:?}"))),
        Ok(r) => r,
    };
    let mut transport_failed = false;
    let tokens = record.token_times_ns.len();
    let verify = verify.and_then(|rounds| match max_drafts {
        Some(k) => within_bounds(rounds, tokens, k),
        None => Ok(rounds),
    });
    match verify {
        Err(e) => {
            record.error = Some(sanitized(&e.message));
            transport_failed = e.transport;
        }
        Ok(rounds) if max_drafts.is_some() => {
            let deltas: Vec<u32> = chunks.iter().map(|c| c.tokens).collect();
            // one chunk per round after prefill's: the deltas are the rounds
            let one_per_round =
                |n: u32| deltas.len() == n as usize + 1 && deltas.first() == Some(&1);
            if rounds.count.is_some_and(one_per_round) {
                for c in chunks.iter_mut().skip(1) {
                    c.spec_round = true;
                }
            }
            match (rounds.accepted, rounds.count) {
                (Some(accepted), _) => {
                    record.round_commits = accepted.iter().map(|a| a + 1).collect();
                }
                // a chunk per round, where the server's totals (if any) agree: an n-gram
                // step without a draft commits a token but is no round, so chunks that
                // add up to more than the rounds committed are not the rounds
                (None, Some(n))
                    if one_per_round(n)
                        && rounds.accepted_total.is_none_or(|a| {
                            deltas[1..].iter().map(|&d| u64::from(d)).sum::<u64>()
                                == u64::from(n) + a
                        }) =>
                {
                    record.round_commits = deltas[1..].to_vec();
                }
                (None, Some(n)) if rounds.accepted_total.is_some() => {
                    record.reported_rounds = Some(n);
                    record.reported_accepted = rounds
                        .accepted_total
                        .map(|a| u32::try_from(a).unwrap_or(u32::MAX));
                }
                (None, Some(n)) => record.reported_rounds = Some(n),
                (None, None) => {}
            }
        }
        Ok(_) => {}
    }
    if sent_unix_ns.iter().all(Option::is_none) {
        sent_unix_ns.clear();
    }
    Outcome {
        record,
        chunks,
        transport_failed,
        sent_unix_ns,
    }
}

/// Reads the stream; returns what the server said of the request's verify rounds.
#[allow(clippy::too_many_arguments)]
async fn stream(
    client: &Client,
    api: Api,
    model: Option<&str>,
    s: &Sent,
    record: &mut RequestRecord,
    chunks: &mut Vec<ChunkEvent>,
    sent_unix_ns: &mut Vec<Option<u64>>,
    now: impl Fn() -> Nanos,
) -> Result<Rounds, Failure> {
    let req = body(api, model, s);
    let mut resp = client
        .send("POST", path(api), Some(&req), Duration::from_secs(3600))
        .await
        .map_err(transport)?;
    if resp.status != 200 {
        let status = resp.status;
        let body = resp.all(Duration::from_secs(30)).await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| {
                v["error"]["message"]
                    .as_str()
                    .or(v["message"].as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| text.chars().take(200).collect());
        return Err(format!("HTTP {status}: {message}").into());
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut seen: u64 = 0;
    let mut rounds = Rounds::default();
    let mut finished = false;
    let mut done = false;
    while let Some(bytes) = resp.next().await.map_err(transport)? {
        let at = now();
        pending.extend_from_slice(&bytes);
        let mut consumed = 0;
        while let Some(i) = find(&pending[consumed..], b"\n\n") {
            let event = &pending[consumed..consumed + i];
            consumed += i + 2;
            for line in event.split(|&b| b == b'\n') {
                let Some(data) = line.strip_prefix(b"data:") else {
                    continue;
                };
                let data = data.trim_ascii();
                if data == b"[DONE]" {
                    done = true;
                    continue;
                }
                let v: Event = serde_json::from_slice(data).map_err(|e| {
                    Failure::from(format!(
                        "malformed server-sent event ({e}): {}",
                        String::from_utf8_lossy(data)
                            .chars()
                            .take(120)
                            .collect::<String>()
                    ))
                })?;
                if let Some(message) = v.error_message() {
                    return Err(format!("error mid-stream: {message}").into());
                }
                let (cumulative, last) = match api {
                    Api::Sglang => {
                        let Some(meta) = &v.meta_info else {
                            return Err("a chunk without meta_info".into());
                        };
                        if let Some(n) = meta.spec_verify_ct {
                            rounds.count = Some(u32::try_from(n).unwrap_or(u32::MAX));
                        }
                        (meta.completion_tokens, meta.finish_reason.is_some())
                    }
                    Api::OpenAiCompletions | Api::OpenAiChat => {
                        vllm_rounds(&v, &mut rounds);
                        let usage = v.usage.as_ref();
                        if let Some(n) = usage.and_then(|u| u.prompt_tokens) {
                            if api == Api::OpenAiChat {
                                record.input_len = n as u32;
                            }
                        }
                        let Some(first) = v.choices.as_ref().and_then(|c| c.first()) else {
                            // the usage-only chunk after the last content chunk
                            continue;
                        };
                        let last = first.finish_reason.is_some();
                        match usage.and_then(|u| u.completion_tokens) {
                            Some(n) => (Some(n), last),
                            None => return Err(Failure::from("the server sent a content chunk without `usage` (it needs stream_options.continuous_usage_stats)")),
                        }
                    }
                };
                let Some(n) = cumulative else {
                    return Err("a chunk without completion_tokens".into());
                };
                if n < seen {
                    return Err(format!("completion_tokens went back from {seen} to {n}").into());
                }
                if n > u64::from(s.max_tokens) {
                    return Err(format!(
                        "the server claims {n} completion tokens for a request of at most {} (max_tokens)",
                        s.max_tokens
                    )
                    .into());
                }
                let delta = (n - seen) as u32;
                seen = n;
                if delta > 0 {
                    record
                        .token_times_ns
                        .extend(std::iter::repeat_n(at, delta as usize));
                    sent_unix_ns.push(v.meta_info.as_ref().and_then(|m| m.kbench_sent_unix_ns));
                    chunks.push(ChunkEvent {
                        id: s.id,
                        visible_ns: at,
                        tokens: delta,
                        spec_round: false,
                        finished: last,
                    });
                }
                finished |= last;
            }
        }
        pending.drain(..consumed);
        if done {
            break;
        }
    }
    if !finished {
        return Err(transport(format!(
            "the stream ended after {seen} tokens without finishing"
        )));
    }
    if let Some(c) = chunks.last_mut() {
        c.finished = true;
    }
    Ok(rounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(ignore_eos: bool) -> Sent {
        Sent {
            id: 1,
            warmup: false,
            prompt: vec![5, 6],
            max_tokens: 300,
            ignore_eos,
            temperature: 0.0,
            submitted_ns: 0,
        }
    }

    /// One request against a server that answers with `response` (status line onwards)
    /// and closes: what the client made of it.
    fn against(response: Vec<u8>, speculative: bool) -> Outcome {
        against_api(response, Api::Sglang, speculative.then_some(3))
    }

    fn against_api(response: Vec<u8>, api: Api, max_drafts: Option<u32>) -> Outcome {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 65536];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(&response).await;
                let _ = socket.shutdown().await;
            });
            let target =
                crate::settings::Target::parse(&format!("http://127.0.0.1:{port}")).unwrap();
            let client = Client::new(target, None);
            let outcome = run(
                &client,
                api,
                None,
                max_drafts,
                sent(true),
                Instant::now(),
                Duration::from_secs(10),
            )
            .await;
            let _ = server.await;
            outcome
        })
    }

    fn stream_of(events: &[&str]) -> Vec<u8> {
        let mut r =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                .to_vec();
        for e in events {
            r.extend_from_slice(format!("data: {e}\n\n").as_bytes());
        }
        r.extend_from_slice(b"data: [DONE]\n\n");
        r
    }

    #[test]
    fn a_server_claiming_more_tokens_than_the_request_allows_fails_it() {
        // 1e9 tokens used to be taken at their word: an 8 GB allocation for their times
        for claim in [1000u64, 20_000_000, 1_000_000_000] {
            let o = against(
                stream_of(&[&format!(
                    r#"{{"meta_info": {{"completion_tokens": {claim}, "finish_reason": {{"type": "length"}}}}}}"#
                )]),
                false,
            );
            let e = o.record.error.unwrap_or_default();
            assert!(
                e.contains(&format!("claims {claim} completion tokens"))
                    && e.contains("at most 300"),
                "{e}"
            );
            assert!(o.record.token_times_ns.is_empty());
        }
    }

    #[test]
    fn a_servers_round_counts_past_the_requests_tokens_fail_it() {
        let o = against(
            stream_of(&[
                r#"{"meta_info": {"completion_tokens": 1}}"#,
                r#"{"meta_info": {"completion_tokens": 10, "spec_verify_ct": 50, "finish_reason": {"type": "length"}}}"#,
            ]),
            true,
        );
        let e = o.record.error.unwrap_or_default();
        assert!(
            e.contains("claims 50 verify rounds for a request of 10 tokens"),
            "{e}"
        );
        assert!(o.record.round_commits.is_empty() && o.record.reported_rounds.is_none());
        // vLLM's per-step accepted counts: u32::MAX used to wrap its commit to 0
        let wrapped = Rounds {
            count: Some(1),
            accepted: Some(vec![u32::MAX]),
            ..Rounds::default()
        };
        let e = within_bounds(wrapped, 10, 3).err().unwrap().message;
        assert!(
            e.contains("commit 4294967296 tokens, more than the request's 10"),
            "{e}"
        );
        let fine = Rounds {
            count: Some(3),
            accepted: Some(vec![2, 0, 3]),
            ..Rounds::default()
        };
        assert!(within_bounds(fine, 10, 3).is_ok());
    }

    /// vLLM's OpenAI stream: a token per content chunk with continuous usage, then the
    /// usage-only chunk that carries `metrics.speculative_decoding` (the shape of
    /// vllm/v1/metrics/stats.py RequestSpecDecodeMetrics.to_dict in 0.32).
    fn vllm_stream(tokens: u32, spec: &str) -> Vec<u8> {
        let mut events: Vec<String> = (1..=tokens)
            .map(|n| {
                let finish = if n == tokens { r#""length""# } else { "null" };
                format!(
                    r#"{{"choices": [{{"index": 0, "text": " w1", "finish_reason": {finish}}}], "usage": {{"prompt_tokens": 32, "completion_tokens": {n}}}}}"#
                )
            })
            .collect();
        events.push(format!(
            r#"{{"choices": [], "usage": {{"prompt_tokens": 32, "completion_tokens": {tokens}}}, "metrics": {{"speculative_decoding": {spec}}}}}"#
        ));
        let refs: Vec<&str> = events.iter().map(String::as_str).collect();
        stream_of(&refs)
    }

    fn level_accept_length(r: &RequestRecord) -> f64 {
        let mut m = kbench_core::metrics::LevelAccumulator::default();
        m.add(r);
        m.finish(1).accept_length.unwrap()
    }

    #[test]
    fn vllms_summary_metrics_give_the_accept_length_of_the_drafted_steps_only() {
        // 30 tokens: 1 from prefill, 8 drafted steps accepting 10 drafts (18 tokens), and
        // 11 n-gram steps that found nothing (1 token each). Decode tokens over rounds
        // said 29 / 8 = 3.6; vLLM's own counters say 1 + 10 / 8 = 2.25.
        let spec = r#"{"mean_acceptance_length": 2.25, "draft_acceptance_rate": 0.4167, "acceptance_histogram": [2, 3, 2, 1], "num_spec_steps": 8, "num_accepted_draft_tokens": 10, "num_draft_tokens": 24, "num_spec_tokens": 3}"#;
        let o = against_api(vllm_stream(30, spec), Api::OpenAiCompletions, Some(3));
        assert_eq!(o.record.error, None);
        assert_eq!(o.record.reported_rounds, Some(8));
        assert_eq!(o.record.reported_accepted, Some(10));
        assert_eq!(level_accept_length(&o.record), 2.25);
    }

    #[test]
    fn vllms_detailed_metrics_are_each_rounds_commit_and_bounded_by_its_drafts() {
        let spec = r#"{"mean_acceptance_length": 2.25, "draft_acceptance_rate": 0.5, "acceptance_histogram": [1, 1, 1, 1], "num_spec_steps": 4, "num_accepted_draft_tokens": 6, "num_draft_tokens": 12, "num_spec_tokens": 3, "per_step_accepted": [0, 3, 1, 2], "per_step_drafted": [3, 3, 3, 3]}"#;
        let o = against_api(vllm_stream(20, spec), Api::OpenAiCompletions, Some(3));
        assert_eq!(o.record.error, None);
        assert_eq!(o.record.round_commits, vec![1, 4, 2, 3]);
        assert_eq!(level_accept_length(&o.record), 2.5);
        // a round that accepts more than it proposed, or than a round proposes
        for (accepted, drafted, why) in [
            (
                "[0, 3, 1, 2]",
                "[3, 2, 3, 3]",
                "round 1 accepted 3 of 2 drafts",
            ),
            (
                "[0, 4, 1, 2]",
                "[3, 4, 3, 3]",
                "round 1 accepted 4 drafts, more than the 3",
            ),
        ] {
            let spec = format!(
                r#"{{"num_spec_steps": 4, "num_accepted_draft_tokens": 7, "num_draft_tokens": 13, "per_step_accepted": {accepted}, "per_step_drafted": {drafted}}}"#
            );
            let o = against_api(vllm_stream(20, &spec), Api::OpenAiCompletions, Some(3));
            let e = o.record.error.unwrap_or_default();
            assert!(e.contains(why), "{e}");
            assert!(o.record.round_commits.is_empty());
        }
    }

    #[test]
    fn an_accept_length_above_its_bound_cannot_be_reported() {
        // summary counts past K drafts a round
        let spec =
            r#"{"num_spec_steps": 2, "num_accepted_draft_tokens": 9, "num_draft_tokens": 9}"#;
        let e = against_api(vllm_stream(20, spec), Api::OpenAiCompletions, Some(3))
            .record
            .error
            .unwrap_or_default();
        assert!(e.contains("2 rounds accepted 9 of 9 drafts"), "{e}");
        // SGLang's count alone: 30 tokens in 3 rounds of a 3-step chain is 10 a round
        let o = against(
            stream_of(&[
                r#"{"meta_info": {"completion_tokens": 1}}"#,
                r#"{"meta_info": {"completion_tokens": 30, "spec_verify_ct": 3, "finish_reason": {"type": "length"}}}"#,
            ]),
            true,
        );
        let e = o.record.error.unwrap_or_default();
        assert!(e.contains("more than the 4 a round can commit"), "{e}");
    }

    #[test]
    fn an_error_message_is_capped_and_its_control_characters_escaped() {
        let message = format!("\u{1b}[31mboom{}", "x".repeat(8 << 20));
        let body = serde_json::json!({"error": {"message": message}}).to_string();
        let mut response = format!(
            "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        response.extend_from_slice(body.as_bytes());
        let e = against(response, false).record.error.unwrap();
        assert!(e.starts_with("HTTP 500: \\u{1b}[31mboom"), "{}", &e[..40]);
        assert!(!e.contains('\u{1b}'));
        assert!(e.len() < MAX_ERROR_BYTES + 64, "{} bytes", e.len());
        assert!(e.ends_with("more bytes)"), "{}", &e[e.len() - 40..]);
    }

    #[test]
    fn bodies_carry_the_drawn_length_and_eos_choice() {
        let b = body(Api::Sglang, None, &sent(false));
        assert_eq!(b["sampling_params"]["max_new_tokens"], 300);
        assert_eq!(b["sampling_params"]["ignore_eos"], false);
        for api in [Api::OpenAiCompletions, Api::OpenAiChat] {
            let b = body(api, Some("m"), &sent(true));
            assert_eq!(b["max_tokens"], 300);
            assert_eq!(b["ignore_eos"], true);
            let b = body(api, Some("m"), &sent(false));
            assert_eq!(b["ignore_eos"], false);
        }
    }
}
