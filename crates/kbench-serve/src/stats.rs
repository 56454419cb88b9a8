//! Server-wide counters: `/metrics` (vLLM's speculative counter names, SGLang's gauges) and
//! `internal_states[0].avg_spec_accept_length` in `/get_server_info`. Every figure is
//! summed from finished requests' own numbers, so the two views always agree.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::gen::SpecTotals;

/// Window of `sglang:gen_throughput`.
const THROUGHPUT_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Default, Clone)]
struct Totals {
    requests: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    /// vLLM: drafts = verify rounds; draft tokens = tokens proposed; accepted.
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
    accepted_per_pos: Vec<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    totals: Totals,
    /// Since the last `/flush_cache`: tokens committed by verify rounds (bonus included) and
    /// rounds, as SGLang's scheduler counts them for `avg_spec_accept_length`.
    flushed_round_tokens: u64,
    flushed_rounds: u64,
    recent: VecDeque<(Instant, u64)>,
}

#[derive(Debug, Default)]
pub struct Stats {
    inner: Mutex<Inner>,
}

/// What one finished request adds.
pub struct Finished<'a> {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub spec: &'a SpecTotals,
}

impl Stats {
    pub fn record(&self, f: Finished<'_>) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut g.totals;
        t.requests += 1;
        t.prompt_tokens += f.prompt_tokens;
        t.generation_tokens += f.completion_tokens;
        t.drafts += f.spec.verify_ct;
        t.draft_tokens += f.spec.proposed;
        t.accepted += f.spec.accepted;
        if t.accepted_per_pos.len() < f.spec.accepted_per_pos.len() {
            t.accepted_per_pos.resize(f.spec.accepted_per_pos.len(), 0);
        }
        for (a, b) in t.accepted_per_pos.iter_mut().zip(&f.spec.accepted_per_pos) {
            *a += b;
        }
        g.flushed_round_tokens += f.spec.round_tokens;
        g.flushed_rounds += f.spec.verify_ct;
        let now = Instant::now();
        g.recent.push_back((now, f.completion_tokens));
        while g
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > THROUGHPUT_WINDOW)
        {
            g.recent.pop_front();
        }
    }

    /// SGLang's `avg_spec_accept_length`: tokens per verify round since start or the last
    /// flush (bonus token included); 0 before any round.
    pub fn avg_spec_accept_length(&self) -> f64 {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.flushed_rounds == 0 {
            0.0
        } else {
            g.flushed_round_tokens as f64 / g.flushed_rounds as f64
        }
    }

    pub fn flush(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.flushed_round_tokens = 0;
        g.flushed_rounds = 0;
    }

    fn gen_throughput(g: &Inner) -> f64 {
        let tokens: u64 = g.recent.iter().map(|(_, n)| n).sum();
        tokens as f64 / THROUGHPUT_WINDOW.as_secs_f64()
    }

    pub fn last_gen_throughput(&self) -> f64 {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Self::gen_throughput(&g)
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn prometheus(
        &self,
        model: &str,
        running: usize,
        waiting: usize,
        num_draft_positions: usize,
    ) -> String {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let t = &g.totals;
        let m = escape(model);
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name}{{model_name=\"{m}\",engine=\"0\"}} {value}");
        };
        counter(
            "vllm:spec_decode_num_drafts_total",
            "Number of spec decoding drafts (verify rounds).",
            t.drafts,
        );
        counter(
            "vllm:spec_decode_num_draft_tokens_total",
            "Number of draft tokens.",
            t.draft_tokens,
        );
        counter(
            "vllm:spec_decode_num_accepted_tokens_total",
            "Number of accepted tokens.",
            t.accepted,
        );
        counter(
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            t.prompt_tokens,
        );
        counter(
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            t.generation_tokens,
        );
        counter(
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            t.requests,
        );
        let name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
        let _ = writeln!(out, "# HELP {name} Accepted tokens per draft position.");
        let _ = writeln!(out, "# TYPE {name} counter");
        for pos in 0..num_draft_positions.max(t.accepted_per_pos.len()) {
            let v = t.accepted_per_pos.get(pos).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{name}{{model_name=\"{m}\",engine=\"0\",position=\"{pos}\"}} {v}"
            );
        }
        let accept_length = if g.flushed_rounds == 0 {
            0.0
        } else {
            g.flushed_round_tokens as f64 / g.flushed_rounds as f64
        };
        let accept_rate = if t.draft_tokens == 0 {
            0.0
        } else {
            t.accepted as f64 / t.draft_tokens as f64
        };
        let mut gauge = |name: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name}{{model_name=\"{m}\"}} {value}");
        };
        gauge(
            "sglang:num_running_reqs",
            "The number of running requests.",
            running.to_string(),
        );
        gauge(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            waiting.to_string(),
        );
        gauge(
            "sglang:gen_throughput",
            "The generation throughput (token/s).",
            fmt_f64(Self::gen_throughput(&g)),
        );
        gauge(
            "sglang:spec_accept_length",
            "The average acceptance length of speculative decoding.",
            fmt_f64(accept_length),
        );
        gauge(
            "sglang:spec_accept_rate",
            "The average acceptance rate of speculative decoding.",
            fmt_f64(accept_rate),
        );
        let mut c2 = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name}{{model_name=\"{m}\"}} {value}");
        };
        c2(
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            t.prompt_tokens,
        );
        c2(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            t.generation_tokens,
        );
        c2(
            "sglang:num_requests_total",
            "Number of requests processed.",
            t.requests,
        );
        out
    }
}

fn fmt_f64(x: f64) -> String {
    format!("{x}")
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
