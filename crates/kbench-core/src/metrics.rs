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
//!   "accept len", bonus token included), rounds that drafted nothing left out (vLLM's
//!   1 + accepted / drafts); None without speculation.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::backend::{Nanos, RequestRecord};
use crate::distribution::{Distribution, Summary};

pub use crate::distribution::percentile;

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
    /// Failed requests whose reason is not in `errors`: past [`MAX_DISTINCT_ERRORS`]
    /// distinct reasons, a level stops keeping new ones.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub errors_not_listed: u32,
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
    #[serde(deserialize_with = "null_as_nan")]
    pub mean_ttft_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub median_ttft_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub p99_ttft_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub mean_tpot_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub median_tpot_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub p99_tpot_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub mean_itl_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub median_itl_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub p99_itl_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub mean_e2e_latency_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub median_e2e_latency_ms: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub p99_e2e_latency_ms: f64,
    /// Whether the percentiles above (and the queueing delay's) are exact.
    #[serde(default)]
    pub percentiles: Percentiles,
    /// The KV pool in tokens per GPU, and the largest share of it in use during the level
    /// (warm-up included), where the backend knows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_kv_cache_usage: Option<f64>,
    /// What the server counted itself over the level (vLLM's `/metrics`), beside what the
    /// requests reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_spec: Option<crate::backend::ServerSpeculativeCounters>,
}

const MS: f64 = 1e6;

/// A latency a level has no value for (no request completed, or none had a second token) is
/// NaN here and null in JSON, which serde_json writes for NaN; read back as NaN.
fn null_as_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The metrics of a level's records, held all at once (a test, a recorded trace).
pub fn level_metrics(concurrency: u32, records: &[RequestRecord]) -> LevelMetrics {
    let mut level = LevelAccumulator::default();
    records.iter().for_each(|r| level.add(r));
    level.finish(concurrency)
}

/// Distinct failure reasons a level keeps: a server that words each failure differently
/// (a request id in the message) must not grow a level's memory with its requests.
pub const MAX_DISTINCT_ERRORS: usize = 32;

/// A level's metrics folded one finished request at a time, so a level's memory does not
/// grow with its requests or their tokens (see [`crate::distribution`]).
#[derive(Debug, Clone, Default)]
pub struct LevelAccumulator {
    completed: u32,
    failed: u32,
    errors: BTreeSet<String>,
    errors_not_listed: u32,
    first_submitted: Option<Nanos>,
    last_finished: Nanos,
    input_tokens: u64,
    output_tokens: u64,
    requested_tokens: u64,
    retractions: Option<u64>,
    ttft: Distribution,
    tpot: Distribution,
    itl: Distribution,
    e2e: Distribution,
    /// Only the mean is reported, summed in the order requests finished.
    per_request_sum: f64,
    per_request_count: u64,
    committed: u64,
    rounds: u64,
}

impl LevelAccumulator {
    /// One that reports means and counts only (percentiles NaN), storing no latencies: for
    /// a fit that reads means, where sorting every token gap of every evaluation is most
    /// of the work.
    pub fn means_only() -> LevelAccumulator {
        LevelAccumulator {
            ttft: Distribution::means_only(),
            tpot: Distribution::means_only(),
            itl: Distribution::means_only(),
            e2e: Distribution::means_only(),
            ..LevelAccumulator::default()
        }
    }

    /// Counts one finished request; warm-up requests are left out.
    pub fn add(&mut self, r: &RequestRecord) {
        if r.warmup {
            return;
        }
        if let Some(e) = &r.error {
            self.failed += 1;
            if !self.errors.contains(e) {
                if self.errors.len() < MAX_DISTINCT_ERRORS {
                    self.errors.insert(e.clone());
                } else {
                    self.errors_not_listed += 1;
                }
            }
            return;
        }
        self.completed += 1;
        self.first_submitted = Some(
            self.first_submitted
                .map_or(r.submitted_ns, |t| t.min(r.submitted_ns)),
        );
        self.last_finished = self.last_finished.max(r.finished_ns());
        self.input_tokens += r.input_len as u64;
        self.output_tokens += r.output_tokens() as u64;
        self.requested_tokens += r.requested_tokens as u64;
        if let Some(n) = r.retractions {
            *self.retractions.get_or_insert(0) += u64::from(n);
        }
        let Some(&first) = r.token_times_ns.first() else {
            return;
        };
        let last = r.finished_ns();
        self.ttft.push((first - r.submitted_ns) as f64 / MS);
        let e2e_ns = last - r.submitted_ns;
        self.e2e.push(e2e_ns as f64 / MS);
        if e2e_ns > 0 {
            self.per_request_sum += r.output_tokens() as f64 / (e2e_ns as f64 / 1e9);
            self.per_request_count += 1;
        }
        if r.token_times_ns.len() > 1 {
            self.tpot
                .push((last - first) as f64 / MS / (r.token_times_ns.len() - 1) as f64);
        }
        let mut prev = first;
        for &t in &r.token_times_ns[1..] {
            if t != prev {
                self.itl.push((t - prev) as f64 / MS);
                prev = t;
            }
        }
        match (r.round_commits.is_empty(), r.reported_rounds) {
            (true, Some(n)) => {
                self.committed += match r.reported_accepted {
                    Some(accepted) => u64::from(n) + u64::from(accepted),
                    None => r.output_tokens().saturating_sub(1) as u64,
                };
                self.rounds += n as u64;
            }
            _ => {
                // an undrafted round committed exactly one token and verified nothing
                let undrafted = (r.undrafted_rounds as usize).min(r.round_commits.len());
                self.committed +=
                    r.round_commits.iter().map(|&c| c as u64).sum::<u64>() - undrafted as u64;
                self.rounds += (r.round_commits.len() - undrafted) as u64;
            }
        }
    }

    /// The level's metrics, labelled with its concurrency.
    pub fn finish(self, concurrency: u32) -> LevelMetrics {
        let start = self.first_submitted.unwrap_or(0);
        let duration_s = self.last_finished.saturating_sub(start) as f64 / 1e9;
        let rate = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let requested_output_tokens =
            (self.requested_tokens != self.output_tokens).then_some(self.requested_tokens);
        let (ttft, tpot, itl, e2e) = (
            self.ttft.summary(),
            self.tpot.summary(),
            self.itl.summary(),
            self.e2e.summary(),
        );
        let percentiles = Percentiles::of(&[ttft, tpot, itl, e2e]);
        let (committed, rounds) = (self.committed, self.rounds);
        LevelMetrics {
            concurrency,
            completed: self.completed,
            failed: self.failed,
            errors: self.errors.into_iter().collect(),
            errors_not_listed: self.errors_not_listed,
            duration_s,
            total_input_tokens: self.input_tokens,
            total_output_tokens: self.output_tokens,
            requested_output_tokens,
            num_retractions: self.retractions,
            request_throughput: rate(self.completed as f64),
            input_throughput: rate(self.input_tokens as f64),
            output_throughput: rate(self.output_tokens as f64),
            per_request_output_throughput: if self.per_request_count == 0 {
                0.0
            } else {
                self.per_request_sum / self.per_request_count as f64
            },
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
            percentiles,
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
}

/// How a level's percentiles were computed: from every value, or (for levels with more
/// than [`crate::distribution::EXACT_LIMIT`] values of one metric) from a histogram within
/// a stated relative error. Means and counts are exact either way.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Percentiles {
    #[default]
    Exact,
    Approximate {
        relative_error: f64,
    },
}

impl Percentiles {
    pub fn of(summaries: &[Summary]) -> Percentiles {
        if summaries.iter().all(|s| s.exact) {
            Percentiles::Exact
        } else {
            Percentiles::Approximate {
                relative_error: crate::distribution::SKETCH_RELATIVE_ERROR,
            }
        }
    }

    /// Folds in another metric's summary (a rate level's queueing delays).
    pub fn and(self, other: &Summary) -> Percentiles {
        match self {
            Percentiles::Exact if !other.exact => Percentiles::of(&[*other]),
            p => p,
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
            undrafted_rounds: 0,
            reported_rounds: None,
            reported_accepted: None,
            error: None,
        }
    }

    #[test]
    fn a_means_only_level_reports_the_same_means_and_no_percentiles() {
        let records: Vec<RequestRecord> = (0..40u64)
            .map(|i| rec(i, i * 7, &[100 + i * 13, 150 + i * 29, 260 + i * 31], &[]))
            .collect();
        let full = level_metrics(1, &records);
        let mut lean = LevelAccumulator::means_only();
        records.iter().for_each(|r| lean.add(r));
        let lean = lean.finish(1);
        for (a, b) in [
            (full.mean_ttft_ms, lean.mean_ttft_ms),
            (full.mean_tpot_ms, lean.mean_tpot_ms),
            (full.mean_itl_ms, lean.mean_itl_ms),
            (full.mean_e2e_latency_ms, lean.mean_e2e_latency_ms),
        ] {
            assert!((a - b).abs() <= 1e-12 * a.abs(), "{a} against {b}");
        }
        assert_eq!(full.output_throughput, lean.output_throughput);
        assert!(lean.median_tpot_ms.is_nan() && lean.p99_ttft_ms.is_nan());
    }

    #[test]
    fn rounds_that_drafted_nothing_are_not_verify_rounds() {
        // 1 prefill token + rounds committing 3, 1 (no draft), 1 (no draft), 2
        let r = RequestRecord {
            undrafted_rounds: 2,
            ..rec(1, 0, &[10, 20, 20, 20, 30, 40, 50, 50], &[3, 1, 1, 2])
        };
        let mut level = LevelAccumulator::default();
        level.add(&r);
        let m = level.finish(1);
        assert_eq!(m.verify_rounds, 2);
        assert_eq!(m.accept_length, Some(2.5));
    }

    #[test]
    fn a_level_keeps_a_bounded_number_of_failure_reasons() {
        let failed = |id: u64, why: String| RequestRecord {
            error: Some(why),
            ..rec(id, 0, &[], &[])
        };
        let mut level = LevelAccumulator::default();
        for id in 0..1000 {
            // each reason twice: a repeat is not a new reason, kept or not
            level.add(&failed(id, format!("request {} refused", id / 2)));
        }
        let m = level.finish(1);
        assert_eq!(m.failed, 1000);
        assert_eq!(m.errors.len(), MAX_DISTINCT_ERRORS);
        assert_eq!(m.errors_not_listed, 1000 - 2 * MAX_DISTINCT_ERRORS as u32);
        assert!(m.errors.contains(&"request 0 refused".to_string()));
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
    fn a_level_past_the_exact_limit_says_its_percentiles_are_approximate() {
        // 21,000 requests of 201 tokens, one per chunk: 4.2 million gaps, past the limit
        let gaps = |id: u64, i: u64| 1_000_000 + (id * 7_919 + i * 104_729) % 50_000_000;
        let mut level = LevelAccumulator::default();
        let mut itl = Vec::new();
        let mut t = 0u64;
        for id in 0..21_000u64 {
            let submitted = t;
            let mut times = Vec::with_capacity(201);
            t += 5_000_000;
            times.push(t);
            for i in 0..200 {
                let g = gaps(id, i);
                t += g;
                times.push(t);
                itl.push(g as f64 / MS);
            }
            level.add(&rec(id, submitted, &times, &[]));
        }
        assert!(itl.len() > crate::distribution::EXACT_LIMIT);
        let m = level.finish(1);
        assert_eq!(
            m.percentiles,
            Percentiles::Approximate {
                relative_error: crate::distribution::SKETCH_RELATIVE_ERROR
            }
        );
        itl.sort_by(f64::total_cmp);
        for (got, p) in [(m.median_itl_ms, 50.0), (m.p99_itl_ms, 99.0)] {
            let want = percentile(&itl, p);
            assert!(
                (got - want).abs() <= crate::distribution::SKETCH_RELATIVE_ERROR * want,
                "p{p}: {got} vs {want}"
            );
        }
        let mean = itl.iter().sum::<f64>() / itl.len() as f64;
        assert!((m.mean_itl_ms - mean).abs() < 1e-9 * mean);
        // TTFT has 21,000 values: still exact, and every request's is 5 ms
        assert_eq!((m.median_ttft_ms, m.p99_ttft_ms), (5.0, 5.0));
        assert_eq!(m.total_output_tokens, 21_000 * 201);
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
