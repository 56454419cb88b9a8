//! One CSV row per (variant, level), with the JSON report's key names as columns.

use kbench_core::report::Report;

const COLUMNS: &str = "experiment,variant,backend,concurrency,completed,duration_s,output_throughput,per_request_output_throughput,accept_length,mean_ttft_ms,median_ttft_ms,p99_ttft_ms,mean_tpot_ms,median_tpot_ms,p99_tpot_ms,mean_itl_ms,median_itl_ms,p99_itl_ms,median_e2e_latency_ms,p99_e2e_latency_ms,request_rate,max_concurrent_requests,median_queue_delay_ms,p99_queue_delay_ms";

pub fn levels_csv(reports: &[Report]) -> String {
    let mut s = String::from(COLUMNS);
    s.push('\n');
    for r in reports {
        for m in &r.levels {
            let fields = [
                quote(&r.experiment.name),
                quote(r.experiment.variant.as_deref().unwrap_or("")),
                quote(&r.backend.name),
                m.concurrency.to_string(),
                m.completed.to_string(),
                m.duration_s.to_string(),
                m.output_throughput.to_string(),
                m.per_request_output_throughput.to_string(),
                m.accept_length.map(|a| a.to_string()).unwrap_or_default(),
                latency(m.mean_ttft_ms),
                latency(m.median_ttft_ms),
                latency(m.p99_ttft_ms),
                latency(m.mean_tpot_ms),
                latency(m.median_tpot_ms),
                latency(m.p99_tpot_ms),
                latency(m.mean_itl_ms),
                latency(m.median_itl_ms),
                latency(m.p99_itl_ms),
                latency(m.median_e2e_latency_ms),
                latency(m.p99_e2e_latency_ms),
                opt(m.request_rate),
                m.max_concurrent_requests
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
                opt(m.median_queue_delay_ms),
                opt(m.p99_queue_delay_ms),
            ];
            s.push_str(&fields.join(","));
            s.push('\n');
        }
    }
    s
}

fn quote(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// An empty field where the level has no such latency.
fn latency(x: f64) -> String {
    if x.is_finite() {
        x.to_string()
    } else {
        String::new()
    }
}
