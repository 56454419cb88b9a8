//! The whole search as one value: every candidate (run or skipped, and why), the ranking,
//! the frontier, the winner's and runner-up's rounds. JSON and CSV come from it.

use std::collections::BTreeMap;

use kbench_core::metrics::LevelMetrics;
use serde::Serialize;

use crate::error::SearchError;
use crate::evaluate::{Evaluated, Outcome};
use crate::explain::{decompose, Decomposition};
use crate::objective::{metric_value, Objective};
use crate::prepare::Prepared;
use crate::select::{at_concurrency, frontier, rank, FrontierPoint, Ranking, Score};
use crate::space::Axis;

pub const SEARCH_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize)]
pub struct SearchReport {
    pub format_version: u32,
    pub experiment: String,
    pub file: String,
    pub objective: Objective,
    pub slos: Vec<String>,
    pub space: Vec<Axis>,
    /// Candidates the space declares (plain configurations once), before any rule.
    pub space_size: u128,
    /// Candidates run or skipped, baselines the space lacks included.
    pub candidates_total: usize,
    pub ran: usize,
    pub skipped_by_rule: BTreeMap<String, usize>,
    pub skipped_by_slo: BTreeMap<String, usize>,
    pub without_value: usize,
    /// Indices into `candidates`, best first.
    pub ranked: Vec<usize>,
    pub baseline: Option<usize>,
    /// The candidate that is the file's own configuration, where the space holds it.
    pub file_configuration: Option<usize>,
    pub frontier: Vec<FrontierPoint>,
    /// The winner's and the runner-up's rounds at the objective's concurrency.
    pub decomposition: Vec<(usize, Decomposition)>,
    pub candidates: Vec<CandidateRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CandidateRow {
    pub id: usize,
    pub label: String,
    /// false: a plain baseline run for the margin, not part of the space.
    pub in_space: bool,
    pub overrides: BTreeMap<String, String>,
    /// `ran` or `skipped`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<CandidateConfig>,
    /// Settings SGLang rejects, run because the search allowed it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective: Option<f64>,
    /// Over the best plain configuration's objective, better positive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub margin: Option<f64>,
    /// The level the objective was read at, and its index in `levels`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<LevelMetrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_level: Option<usize>,
    pub saturation_output_throughput: Option<f64>,
    pub levels: Vec<LevelPoint>,
}

/// A level in brief: where it ran and its two throughputs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LevelPoint {
    /// Its concurrency (a rate level: its cap, else the most requests in flight).
    pub concurrency: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_rate: Option<f64>,
    pub output_throughput: f64,
    pub per_request_output_throughput: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateConfig {
    pub algorithm: String,
    pub num_steps: u32,
    pub eagle_topk: u32,
    pub num_draft_tokens: u32,
    pub spec_v2: bool,
    pub tp_size: u32,
    pub max_running_requests: u32,
    pub cuda_graph_max_bs: u32,
    /// `tokens` where the bound counts tokens (vLLM's `max_cudagraph_capture_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_graph_unit: Option<String>,
}

/// Ranks, finds the frontier, explains the top two, and lays every candidate out.
pub fn build(prepared: &Prepared, evaluated: &[Evaluated]) -> Result<SearchReport, SearchError> {
    let s = &prepared.settings;
    let ranking = rank(evaluated, &s.objective, &s.slos);
    let frontier = frontier(evaluated, &s.slos);
    let mut decomposition = Vec::new();
    for score in ranking.ranked.iter().take(2) {
        let Some(run) = evaluated[score.candidate].run() else {
            continue;
        };
        let level = &run.report.levels[score.level];
        let batch = at_concurrency(&s.objective.at, level);
        decomposition.push((
            score.candidate,
            decompose(&run.experiment, batch, level.accept_length)?,
        ));
    }
    let ranks: BTreeMap<usize, usize> = ranking
        .ranked
        .iter()
        .enumerate()
        .map(|(r, sc)| (sc.candidate, r + 1))
        .collect();
    let scores: BTreeMap<usize, Score> = ranking
        .ranked
        .iter()
        .chain(ranking.baseline.iter())
        .map(|sc| (sc.candidate, *sc))
        .collect();
    let candidates = evaluated
        .iter()
        .enumerate()
        .map(|(i, e)| row(i, e, &ranking, &s.objective, ranks.get(&i), scores.get(&i)))
        .collect();
    let own = config_of(&prepared.base);
    let file_configuration = evaluated.iter().position(|e| {
        e.candidate.in_space && e.run().is_some_and(|r| config_of(&r.experiment) == own)
    });
    Ok(SearchReport {
        format_version: SEARCH_FORMAT_VERSION,
        experiment: prepared.base.file.name.clone(),
        file: prepared.path.display().to_string(),
        objective: s.objective.clone(),
        slos: s.slos.iter().map(|x| x.to_string()).collect(),
        space: s.axes.clone(),
        space_size: prepared.space_size,
        candidates_total: evaluated.len(),
        ran: evaluated.iter().filter(|e| e.run().is_some()).count(),
        skipped_by_rule: ranking.skipped_by_rule.clone(),
        skipped_by_slo: ranking.skipped_by_slo.clone(),
        without_value: ranking.without_value,
        ranked: ranking.ranked.iter().map(|x| x.candidate).collect(),
        baseline: ranking.baseline.map(|b| b.candidate),
        file_configuration,
        frontier,
        decomposition,
        candidates,
    })
}

fn row(
    id: usize,
    e: &Evaluated,
    ranking: &Ranking,
    objective: &Objective,
    rank: Option<&usize>,
    score: Option<&Score>,
) -> CandidateRow {
    let mut r = CandidateRow {
        id,
        label: label(e),
        in_space: e.candidate.in_space,
        overrides: e.candidate.overrides.iter().cloned().collect(),
        status: "skipped",
        rule: None,
        message: None,
        config: None,
        unsupported: Vec::new(),
        rank: rank.copied(),
        objective: score.map(|s| s.value),
        margin: score.and_then(|s| ranking.margin(objective, s)),
        at: None,
        at_level: None,
        saturation_output_throughput: None,
        levels: Vec::new(),
    };
    match &e.outcome {
        Outcome::Skipped { rule, message } => {
            r.rule = Some(rule.clone());
            r.message = Some(message.clone());
        }
        Outcome::Ran(run) => {
            let x = &run.experiment;
            r.status = "ran";
            // the cap and the graph bound the simulator served with, where the engine chose
            // them for the GPU (vLLM's max_num_seqs, either engine's graph bound)
            let mut config = config_of(x);
            config.max_running_requests = run.report.experiment.max_running_requests;
            config.cuda_graph_max_bs = run.report.experiment.cuda_graph_max_bs;
            config.cuda_graph_unit = run.report.experiment.cuda_graph_unit.clone();
            r.config = Some(config);
            r.unsupported = x.speculative.unsupported.clone();
            r.at = score.map(|s| run.report.levels[s.level].clone());
            r.at_level = score.map(|s| s.level);
            r.saturation_output_throughput = Some(run.report.saturation_output_throughput);
            r.levels = run
                .report
                .levels
                .iter()
                .map(|m| LevelPoint {
                    concurrency: crate::select::level_concurrency(m),
                    request_rate: m.request_rate.filter(|r| r.is_finite()),
                    output_throughput: m.output_throughput,
                    per_request_output_throughput: m.per_request_output_throughput,
                })
                .collect();
        }
    }
    r
}

fn config_of(x: &kbench_core::experiment::Experiment) -> CandidateConfig {
    CandidateConfig {
        algorithm: x.speculative.algorithm.name_in(x.engine.kind).into(),
        num_steps: x.speculative.shape.num_steps,
        eagle_topk: x.speculative.shape.topk,
        num_draft_tokens: x.speculative.shape.num_draft_tokens,
        spec_v2: x.speculative.spec_v2,
        tp_size: x.tp_size,
        max_running_requests: x.max_running_requests,
        cuda_graph_max_bs: x.cuda_graph_max_bs,
        cuda_graph_unit: None,
    }
}

/// `plain` or `EAGLE3 2/1/3 v2`, then the space's other keys.
pub fn label(e: &Evaluated) -> String {
    let spec = match &e.outcome {
        Outcome::Ran(run) => {
            let s = &run.experiment.speculative;
            if s.is_speculative() {
                format!(
                    "{} {}/{}/{} {}",
                    s.algorithm.name_in(run.experiment.engine.kind),
                    s.shape.num_steps,
                    s.shape.topk,
                    s.shape.num_draft_tokens,
                    if s.spec_v2 { "v2" } else { "v1" }
                )
            } else {
                "plain".to_string()
            }
        }
        Outcome::Skipped { .. } => {
            let v = |k: &str| {
                e.candidate
                    .value(&format!("speculative.{k}"))
                    .unwrap_or("-")
            };
            if e.candidate
                .value("speculative.algorithm")
                .is_some_and(|a| a.trim_matches('"').eq_ignore_ascii_case("none"))
            {
                "plain".to_string()
            } else {
                format!(
                    "{} {}/{}/{} {}",
                    e.candidate
                        .value("speculative.algorithm")
                        .map_or("EAGLE3", |a| a.trim_matches('"')),
                    v("num_steps"),
                    v("eagle_topk"),
                    v("num_draft_tokens"),
                    match v("spec_v2") {
                        "true" => "v2",
                        "false" => "v1",
                        _ => "",
                    }
                )
                .trim_end()
                .to_string()
            }
        }
    };
    let others: Vec<String> = e
        .candidate
        .overrides
        .iter()
        .filter(|(k, _)| !k.starts_with("speculative."))
        .map(|(k, v)| format!("{}={v}", k.rsplit('.').next().unwrap_or(k)))
        .collect();
    if others.is_empty() {
        spec
    } else {
        format!("{spec} {}", others.join(" "))
    }
}

/// One row per candidate, with the objective's level's SLO metrics.
pub fn csv(report: &SearchReport) -> String {
    let slo_metrics: Vec<String> = {
        let mut m: Vec<String> = report
            .slos
            .iter()
            .filter_map(|s| s.split_whitespace().next().map(str::to_string))
            .collect();
        m.dedup();
        m
    };
    let mut out = String::from(
        "id,label,in_space,status,rule,algorithm,num_steps,eagle_topk,num_draft_tokens,spec_v2,tp_size,max_running_requests,cuda_graph_max_bs,rank,objective,margin,at_concurrency,accept_length,saturation_output_throughput",
    );
    for m in &slo_metrics {
        out.push(',');
        out.push_str(m);
    }
    out.push('\n');
    let q = |s: &str| {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.6}")).unwrap_or_default();
    for c in &report.candidates {
        let cfg = c.config.as_ref();
        let fields = [
            c.id.to_string(),
            q(&c.label),
            c.in_space.to_string(),
            c.status.to_string(),
            q(c.rule.as_deref().unwrap_or("")),
            cfg.map(|x| x.algorithm.clone()).unwrap_or_default(),
            cfg.map(|x| x.num_steps.to_string()).unwrap_or_default(),
            cfg.map(|x| x.eagle_topk.to_string()).unwrap_or_default(),
            cfg.map(|x| x.num_draft_tokens.to_string())
                .unwrap_or_default(),
            cfg.map(|x| x.spec_v2.to_string()).unwrap_or_default(),
            cfg.map(|x| x.tp_size.to_string()).unwrap_or_default(),
            cfg.map(|x| x.max_running_requests.to_string())
                .unwrap_or_default(),
            cfg.map(|x| x.cuda_graph_max_bs.to_string())
                .unwrap_or_default(),
            c.rank.map(|r| r.to_string()).unwrap_or_default(),
            opt(c.objective),
            opt(c.margin),
            c.at.as_ref()
                .map(|m| crate::select::level_concurrency(m).to_string())
                .unwrap_or_default(),
            opt(c.at.as_ref().and_then(|m| m.accept_length)),
            opt(c.saturation_output_throughput),
        ];
        out.push_str(&fields.join(","));
        for m in &slo_metrics {
            out.push(',');
            out.push_str(&opt(c.at.as_ref().and_then(|l| metric_value(l, m))));
        }
        out.push('\n');
    }
    out
}
