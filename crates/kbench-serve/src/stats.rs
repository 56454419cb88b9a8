//! Server-wide counters: `/metrics` (vLLM's speculative counter names, SGLang's gauges) and
//! `internal_states[0].avg_spec_accept_length` in `/get_server_info`. Every figure is
//! summed from finished requests' own numbers, so the two views always agree.
//!
//! A flush restarts every speculative gauge (SGLang's scheduler zeroes the sums they come
//! from) but never a `_total` counter: Prometheus counters only go up, and a client
//! reading them takes the difference of two scrapes.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::gen::SpeculativeTotals;

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

/// Since start or the last flush: what the speculative gauges are computed from, so that
/// one flush restarts all of them together.
#[derive(Debug, Default, Clone)]
struct SinceFlush {
    /// Tokens committed by verify rounds (bonus included) and rounds, as SGLang's scheduler
    /// counts them for `avg_spec_accept_length`.
    round_tokens: u64,
    rounds: u64,
    accepted: u64,
    proposed: u64,
}

impl SinceFlush {
    fn accept_length(&self) -> f64 {
        ratio(self.round_tokens, self.rounds)
    }

    fn accept_rate(&self) -> f64 {
        ratio(self.accepted, self.proposed)
    }
}

#[derive(Debug, Default)]
struct Inner {
    totals: Totals,
    since_flush: SinceFlush,
    recent: VecDeque<(Instant, u64)>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[derive(Debug, Default)]
pub struct Stats {
    inner: Mutex<Inner>,
}

/// What one finished request adds.
pub struct Finished<'a> {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub spec: &'a SpeculativeTotals,
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
        let sf = &mut g.since_flush;
        sf.round_tokens += f.spec.round_tokens;
        sf.rounds += f.spec.verify_ct;
        sf.accepted += f.spec.accepted;
        sf.proposed += f.spec.proposed;
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
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .since_flush
            .accept_length()
    }

    /// Restarts every speculative gauge (`/flush_cache`, `/reset_prefix_cache`).
    pub fn flush(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.since_flush = SinceFlush::default();
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
        // vLLM labels its counters with the engine too; SGLang only with the model
        let vllm = format!("model_name=\"{m}\",engine=\"0\"");
        let sglang = format!("model_name=\"{m}\"");
        let mut out = String::new();
        for (name, help, value) in [
            (
                "vllm:spec_decode_num_drafts_total",
                "Number of spec decoding drafts (verify rounds).",
                t.drafts,
            ),
            (
                "vllm:spec_decode_num_draft_tokens_total",
                "Number of draft tokens.",
                t.draft_tokens,
            ),
            (
                "vllm:spec_decode_num_accepted_tokens_total",
                "Number of accepted tokens.",
                t.accepted,
            ),
            (
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                t.prompt_tokens,
            ),
            (
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                t.generation_tokens,
            ),
            (
                "vllm:request_success_total",
                "Count of successfully processed requests.",
                t.requests,
            ),
        ] {
            family(
                &mut out,
                name,
                "counter",
                help,
                &[(vllm.clone(), value.to_string())],
            );
        }
        let positions = num_draft_positions.max(t.accepted_per_pos.len());
        let per_pos: Vec<(String, String)> = (0..positions)
            .map(|pos| {
                let v = t.accepted_per_pos.get(pos).copied().unwrap_or(0);
                (format!("{vllm},position=\"{pos}\""), v.to_string())
            })
            .collect();
        family(
            &mut out,
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            "Accepted tokens per draft position.",
            &per_pos,
        );
        for (name, help, value) in [
            (
                "sglang:num_running_reqs",
                "The number of running requests.",
                running.to_string(),
            ),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                waiting.to_string(),
            ),
            (
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                Self::gen_throughput(&g).to_string(),
            ),
            (
                "sglang:spec_accept_length",
                "The average acceptance length of speculative decoding.",
                g.since_flush.accept_length().to_string(),
            ),
            (
                "sglang:spec_accept_rate",
                "The average acceptance rate of speculative decoding.",
                g.since_flush.accept_rate().to_string(),
            ),
        ] {
            family(&mut out, name, "gauge", help, &[(sglang.clone(), value)]);
        }
        for (name, help, value) in [
            (
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                t.prompt_tokens,
            ),
            (
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                t.generation_tokens,
            ),
            (
                "sglang:num_requests_total",
                "Number of requests processed.",
                t.requests,
            ),
        ] {
            family(
                &mut out,
                name,
                "counter",
                help,
                &[(sglang.clone(), value.to_string())],
            );
        }
        out
    }
}

/// One metric family: its HELP and TYPE lines, then one sample per label set.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, String)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, name: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn a_flush_restarts_every_speculative_gauge_and_no_counter() {
        let stats = Stats::default();
        let spec = SpeculativeTotals {
            verify_ct: 4,
            proposed: 12,
            accepted: 6,
            round_tokens: 10,
            accepted_per_pos: vec![4, 2, 0],
            histogram: vec![1, 2, 1, 0],
            ..SpeculativeTotals::default()
        };
        stats.record(Finished {
            prompt_tokens: 5,
            completion_tokens: 11,
            spec: &spec,
        });
        let before = stats.prometheus("m", 0, 0, 3);
        assert_eq!(sample(&before, "sglang:spec_accept_length{"), 2.5);
        assert_eq!(sample(&before, "sglang:spec_accept_rate{"), 0.5);
        assert_eq!(stats.avg_spec_accept_length(), 2.5);

        stats.flush();
        let after = stats.prometheus("m", 0, 0, 3);
        assert_eq!(sample(&after, "sglang:spec_accept_length{"), 0.0);
        assert_eq!(sample(&after, "sglang:spec_accept_rate{"), 0.0);
        assert_eq!(stats.avg_spec_accept_length(), 0.0);
        for counter in [
            "vllm:spec_decode_num_drafts_total{",
            "vllm:spec_decode_num_draft_tokens_total{",
            "vllm:spec_decode_num_accepted_tokens_total{",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",engine=\"0\",position=\"0\"}",
            "vllm:generation_tokens_total{",
            "sglang:num_requests_total{",
        ] {
            assert_eq!(sample(&before, counter), sample(&after, counter), "{counter}");
        }

        // after the flush, the gauges describe only what finished since
        let spec = SpeculativeTotals {
            verify_ct: 2,
            proposed: 6,
            accepted: 0,
            round_tokens: 2,
            ..SpeculativeTotals::default()
        };
        stats.record(Finished {
            prompt_tokens: 5,
            completion_tokens: 3,
            spec: &spec,
        });
        let later = stats.prometheus("m", 0, 0, 3);
        assert_eq!(sample(&later, "sglang:spec_accept_length{"), 1.0);
        assert_eq!(sample(&later, "sglang:spec_accept_rate{"), 0.0);
        assert_eq!(sample(&later, "vllm:spec_decode_num_drafts_total{"), 6.0);
    }
}
