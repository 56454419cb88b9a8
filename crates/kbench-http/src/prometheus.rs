//! vLLM's speculative counters from `/metrics` (Prometheus text): read before and after a
//! level's measured requests, their difference is what the server itself counted.

use std::collections::BTreeMap;

use kbench_core::backend::ServerSpeculativeCounters;

const DRAFTS: &str = "vllm:spec_decode_num_drafts";
const DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens";
const ACCEPTED: &str = "vllm:spec_decode_num_accepted_tokens";
const PER_POS: &str = "vllm:spec_decode_num_accepted_tokens_per_pos";

/// One reading of the counters, summed over every label set but `position`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpeculativeReading {
    pub drafts: f64,
    pub draft_tokens: f64,
    pub accepted: f64,
    pub per_position: BTreeMap<u32, f64>,
}

/// The counters in a `/metrics` body; None where the server exposes none of them (SGLang,
/// or vLLM without speculation).
pub fn read(text: &str) -> Option<SpeculativeReading> {
    let mut r = SpeculativeReading::default();
    let mut seen = false;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        // counters are exposed with `_total`; older clients printed them without
        let name = name.trim().trim_end_matches("_total");
        match name {
            DRAFTS => r.drafts += value,
            DRAFT_TOKENS => r.draft_tokens += value,
            ACCEPTED => r.accepted += value,
            PER_POS => {
                let Some(pos) = label(labels, "position").and_then(|p| p.parse().ok()) else {
                    continue;
                };
                *r.per_position.entry(pos).or_default() += value;
            }
            _ => continue,
        }
        seen = true;
    }
    seen.then_some(r)
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

/// What changed between two readings, as `vllm bench serve` reports it.
pub fn delta(before: &SpeculativeReading, after: &SpeculativeReading) -> ServerSpeculativeCounters {
    let d = |a: f64, b: f64| (a - b).max(0.0).round() as u64;
    let drafts = d(after.drafts, before.drafts);
    let draft_tokens = d(after.draft_tokens, before.draft_tokens);
    let accepted = d(after.accepted, before.accepted);
    let per_position_acceptance_rates = after
        .per_position
        .iter()
        .map(|(pos, v)| {
            let was = before.per_position.get(pos).copied().unwrap_or(0.0);
            if drafts == 0 {
                0.0
            } else {
                kbench_core::report::round_to((v - was).max(0.0) / drafts as f64, 4)
            }
        })
        .collect();
    ServerSpeculativeCounters {
        source: "vllm:spec_decode_* deltas from /metrics".into(),
        num_drafts: drafts,
        num_draft_tokens: draft_tokens,
        num_accepted_tokens: accepted,
        acceptance_length: (drafts > 0)
            .then(|| kbench_core::report::round_to(1.0 + accepted as f64 / drafts as f64, 4)),
        acceptance_rate: (draft_tokens > 0)
            .then(|| kbench_core::report::round_to(accepted as f64 / draft_tokens as f64, 4)),
        per_position_acceptance_rates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# HELP vllm:spec_decode_num_drafts_total Number of drafts.\n\
# TYPE vllm:spec_decode_num_drafts_total counter\n\
vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 10.0\n\
vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"m\"} 10.0\n\
vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 60.0\n\
vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 30.0\n\
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\",position=\"0\"} 18.0\n\
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\",position=\"1\"} 12.0\n\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n";

    #[test]
    fn sums_engines_and_takes_deltas_per_position() {
        let before = read(BEFORE).unwrap();
        assert_eq!(before.drafts, 20.0);
        let after = read(
            &BEFORE
                .replace("} 10.0", "} 30.0")
                .replace("} 60.0", "} 180.0")
                .replace(
                    "} 30.0\nvllm:spec_decode_num_accepted_tokens_per_pos",
                    "} 90.0\nvllm:spec_decode_num_accepted_tokens_per_pos",
                )
                .replace("} 18.0", "} 48.0")
                .replace("} 12.0", "} 42.0"),
        )
        .unwrap();
        let d = delta(&before, &after);
        assert_eq!(
            (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens),
            (40, 120, 60)
        );
        assert_eq!(d.acceptance_length, Some(2.5));
        assert_eq!(d.acceptance_rate, Some(0.5));
        assert_eq!(d.per_position_acceptance_rates, vec![0.75, 0.75]);
    }

    #[test]
    fn a_server_without_the_counters_has_none() {
        assert_eq!(read("sglang:num_running_reqs{model_name=\"m\"} 1\n"), None);
        assert_eq!(read(""), None);
    }
}
