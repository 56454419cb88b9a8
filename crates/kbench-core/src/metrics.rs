//! One metrics code path for every backend. Definitions (docs/report.md):
//! - TTFT: first output token visible - request submitted.
//! - TPOT: (last token - first token) / (output tokens - 1), per request; requests with one
//!   token have none.
//! - ITL: gaps between successive *chunks* of a request (tokens that became visible at the
//!   same instant form one chunk, as one speculative round streams them), pooled.
//! - E2E: last token - submitted.
//! - output_throughput: output tokens of measured requests / duration, where duration runs
//!   from the first measured submission to the last measured completion.
//! - accept_length: committed tokens / verify rounds over measured requests (SGLang's
//!   "accept len", bonus token included); None without speculation.

use serde::{Deserialize, Serialize};

use crate::backend::RequestRecord;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelMetrics {
    /// Closed-loop clients; at a `request_rate` level, its `max_concurrency` (0: no cap).
    pub concurrency: u32,
    /// A rate level's requests per second (`vllm bench serve`'s `request_rate`); all at once
    /// is written `"inf"`, which JSON numbers cannot hold.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rate_json")]
    pub request_rate: Option<f64>,
    /// A rate level's most requests in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<u32>,
    /// A rate level's wait at the client between a request's arrival and its sending (only
    /// under `max_concurrency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_queue_delay_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_queue_delay_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_queue_delay_ms: Option<f64>,
    pub completed: u32,
    /// Measured requests that failed (bench_serving's `failed`), and their distinct reasons.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    pub duration_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    /// What the measured requests asked for (`max_tokens`), where some stopped short of it
    /// (as if at EOS, `ignore_eos = false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_output_tokens: Option<u64>,
    /// KV-cache retractions (SGLang) / preemptions (vLLM) of measured requests, where the
    /// backend knows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_retractions: Option<u64>,
    pub request_throughput: f64,
    pub input_throughput: f64,
    pub output_throughput: f64,
    /// Mean over requests of output tokens / E2E latency.
    pub per_request_output_throughput: f64,
    pub accept_length: Option<f64>,
    pub verify_rounds: u64,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    pub mean_tpot_ms: f64,
    pub median_tpot_ms: f64,
    pub p99_tpot_ms: f64,
    pub mean_itl_ms: f64,
    pub median_itl_ms: f64,
    pub p99_itl_ms: f64,
    pub mean_e2e_latency_ms: f64,
    pub median_e2e_latency_ms: f64,
    pub p99_e2e_latency_ms: f64,
    /// The KV pool in tokens per GPU, and the largest share of it in use during the level
    /// (warm-up included), where the backend knows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_kv_cache_usage: Option<f64>,
    /// What the server counted itself over the level (vLLM's `/metrics`), beside what the
    /// requests reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_spec: Option<crate::backend::ServerSpecCounters>,
}

const MS: f64 = 1e6;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub fn level_metrics(concurrency: u32, records: &[RequestRecord]) -> LevelMetrics {
    let measured: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| !r.warmup && r.error.is_none())
        .collect();
    let failures: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| !r.warmup && r.error.is_some())
        .collect();
    let mut errors: Vec<String> = failures.iter().filter_map(|r| r.error.clone()).collect();
    errors.sort();
    errors.dedup();
    let start = measured.iter().map(|r| r.submitted_ns).min().unwrap_or(0);
    let end = measured.iter().map(|r| r.finished_ns()).max().unwrap_or(0);
    let duration_s = end.saturating_sub(start) as f64 / 1e9;
    let total_input_tokens: u64 = measured.iter().map(|r| r.input_len as u64).sum();
    let total_output_tokens: u64 = measured.iter().map(|r| r.output_tokens() as u64).sum();
    let requested: u64 = measured.iter().map(|r| r.requested_tokens as u64).sum();
    let requested_output_tokens = (requested != total_output_tokens).then_some(requested);
    let num_retractions = measured.iter().any(|r| r.retractions.is_some()).then(|| {
        measured
            .iter()
            .filter_map(|r| r.retractions)
            .map(u64::from)
            .sum()
    });
    let rate = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };

    let mut ttft = Vec::with_capacity(measured.len());
    let mut tpot = Vec::new();
    let mut itl = Vec::new();
    let mut e2e = Vec::with_capacity(measured.len());
    let mut per_request = Vec::with_capacity(measured.len());
    let (mut committed, mut rounds) = (0u64, 0u64);
    for r in &measured {
        let Some(&first) = r.token_times_ns.first() else {
            continue;
        };
        let last = r.finished_ns();
        ttft.push((first - r.submitted_ns) as f64 / MS);
        let e2e_ns = last - r.submitted_ns;
        e2e.push(e2e_ns as f64 / MS);
        if e2e_ns > 0 {
            per_request.push(r.output_tokens() as f64 / (e2e_ns as f64 / 1e9));
        }
        if r.token_times_ns.len() > 1 {
            tpot.push((last - first) as f64 / MS / (r.token_times_ns.len() - 1) as f64);
        }
        let mut prev = first;
        for &t in &r.token_times_ns[1..] {
            if t != prev {
                itl.push((t - prev) as f64 / MS);
                prev = t;
            }
        }
        match (r.round_commits.is_empty(), r.reported_rounds) {
            (true, Some(n)) => {
                committed += r.output_tokens().saturating_sub(1) as u64;
                rounds += n as u64;
            }
            _ => {
                committed += r.round_commits.iter().map(|&c| c as u64).sum::<u64>();
                rounds += r.round_commits.len() as u64;
            }
        }
    }
    let s = |v: &mut Vec<f64>| Summary::of(v);
    let (ttft, tpot, itl, e2e) = (s(&mut ttft), s(&mut tpot), s(&mut itl), s(&mut e2e));
    LevelMetrics {
        concurrency,
        completed: measured.len() as u32,
        failed: failures.len() as u32,
        errors,
        duration_s,
        total_input_tokens,
        total_output_tokens,
        requested_output_tokens,
        num_retractions,
        request_throughput: rate(measured.len() as f64),
        input_throughput: rate(total_input_tokens as f64),
        output_throughput: rate(total_output_tokens as f64),
        per_request_output_throughput: mean(&per_request),
        accept_length: (rounds > 0).then(|| committed as f64 / rounds as f64),
        verify_rounds: rounds,
        mean_ttft_ms: ttft.mean,
        median_ttft_ms: ttft.median,
        p99_ttft_ms: ttft.p99,
        mean_tpot_ms: tpot.mean,
        median_tpot_ms: tpot.median,
        p99_tpot_ms: tpot.p99,
        mean_itl_ms: itl.mean,
        median_itl_ms: itl.median,
        p99_itl_ms: itl.p99,
        mean_e2e_latency_ms: e2e.mean,
        median_e2e_latency_ms: e2e.median,
        p99_e2e_latency_ms: e2e.p99,
        kv_cache_tokens: None,
        peak_kv_cache_usage: None,
        server_spec: None,
        request_rate: None,
        max_concurrent_requests: None,
        mean_queue_delay_ms: None,
        median_queue_delay_ms: None,
        p99_queue_delay_ms: None,
    }
}

struct Summary {
    mean: f64,
    median: f64,
    p99: f64,
}

impl Summary {
    fn of(v: &mut [f64]) -> Summary {
        v.sort_by(f64::total_cmp);
        Summary {
            mean: mean(v),
            median: percentile(v, 50.0),
            p99: percentile(v, 99.0),
        }
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Linear interpolation between closest ranks (numpy's default), on sorted input.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64, submitted: u64, times: &[u64], rounds: &[u32]) -> RequestRecord {
        RequestRecord {
            id,
            warmup: false,
            input_len: 10,
            requested_tokens: times.len() as u32,
            submitted_ns: submitted,
            retractions: None,
            token_times_ns: times.to_vec(),
            round_commits: rounds.to_vec(),
            reported_rounds: None,
            error: None,
        }
    }

    #[test]
    fn chunked_tokens_count_one_itl_gap() {
        // Token 1 at 10 ms, then a round committing 3 tokens at 30 ms, then 1 at 40 ms.
        let r = rec(
            1,
            0,
            &[10_000_000, 30_000_000, 30_000_000, 30_000_000, 40_000_000],
            &[3, 1],
        );
        let m = level_metrics(1, &[r]);
        assert_eq!(m.completed, 1);
        assert!((m.mean_ttft_ms - 10.0).abs() < 1e-9);
        assert!((m.mean_tpot_ms - 7.5).abs() < 1e-9);
        assert!((m.mean_itl_ms - 15.0).abs() < 1e-9);
        assert_eq!(m.accept_length, Some(2.0));
        assert!((m.output_throughput - 125.0).abs() < 1e-9);
    }

    #[test]
    fn warmup_is_excluded() {
        let mut w = rec(2, 0, &[1_000_000_000], &[]);
        w.warmup = true;
        let r = rec(1, 1_000_000_000, &[1_500_000_000, 2_000_000_000], &[]);
        let m = level_metrics(1, &[w, r]);
        assert_eq!(m.completed, 1);
        assert!((m.duration_s - 1.0).abs() < 1e-12);
        assert_eq!(m.accept_length, None);
    }

    #[test]
    fn percentile_interpolates() {
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.5);
        assert_eq!(percentile(&[5.0], 99.0), 5.0);
    }
}

/// Request rates in JSON: each a number, or `"inf"` (which JSON numbers cannot hold); for
/// one optional rate and for a list.
pub(crate) mod rate_json {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// One rate as it is written.
    struct Rate(f64);

    impl Serialize for Rate {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            if self.0.is_infinite() {
                s.serialize_str("inf")
            } else {
                s.serialize_f64(self.0)
            }
        }
    }

    impl<'de> Deserialize<'de> for Rate {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
            #[derive(Deserialize)]
            #[serde(untagged)]
            enum Written {
                Number(f64),
                Text(String),
            }
            match Written::deserialize(d)? {
                Written::Number(r) => Ok(Rate(r)),
                Written::Text(t) if t == "inf" => Ok(Rate(f64::INFINITY)),
                Written::Text(t) => Err(serde::de::Error::custom(format!(
                    "request_rate `{t}`: a number or \"inf\""
                ))),
            }
        }
    }

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        v.map(Rate).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Ok(Option::<Rate>::deserialize(d)?.map(|r| r.0))
    }

    pub mod list {
        use super::Rate;
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
            let rates: Vec<Rate> = v.iter().map(|&r| Rate(r)).collect();
            rates.serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
            Ok(Vec::<Rate>::deserialize(d)?
                .into_iter()
                .map(|r| r.0)
                .collect())
        }
    }
}
