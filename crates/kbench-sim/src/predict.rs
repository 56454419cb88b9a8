//! Runs an experiment on the sim backend and reads the numbers the seed reports:
//! output throughput at a concurrency, and saturation (max over levels).

use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::experiment::Experiment;
use kbench_core::harness::{run_levels, LevelResult, LoadPlan, NoProgress};
use serde::Serialize;

use crate::acceptance::DepthRateAcceptance;
use crate::error::SimError;
use crate::sim::SimBackend;

pub fn load_plan(exp: &Experiment) -> LoadPlan {
    LoadPlan::from_experiment(exp)
}

/// The acceptance model used when no trace model is supplied: synthetic chat-like rates.
pub fn default_acceptance(exp: &Experiment) -> Arc<dyn AcceptanceModel> {
    Arc::new(DepthRateAcceptance::kimi_chat(exp.file.seed))
}

#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub experiment: String,
    /// (concurrency, output tok/s) per level.
    pub output_throughput: Vec<(u32, f64)>,
    pub accept_length: Vec<(u32, Option<f64>)>,
    pub saturation_output_throughput: f64,
    pub flagged_queries: Vec<String>,
}

impl Prediction {
    pub fn at(&self, concurrency: u32) -> Option<f64> {
        self.output_throughput
            .iter()
            .find(|(c, _)| *c == concurrency)
            .map(|(_, v)| *v)
    }
}

pub fn run(
    exp: &Experiment,
    backend: &mut SimBackend,
) -> Result<(Vec<LevelResult>, Prediction), SimError> {
    let levels = run_levels(backend, &load_plan(exp), &mut NoProgress).map_err(|source| {
        SimError::Backend {
            experiment: exp.path.display().to_string(),
            source: Box::new(source),
        }
    })?;
    let output_throughput: Vec<(u32, f64)> = levels
        .iter()
        .map(|l| (l.concurrency, l.metrics.output_throughput))
        .collect();
    let prediction = Prediction {
        experiment: exp.file.name.clone(),
        saturation_output_throughput: output_throughput.iter().map(|x| x.1).fold(0.0, f64::max),
        accept_length: levels
            .iter()
            .map(|l| (l.concurrency, l.metrics.accept_length))
            .collect(),
        output_throughput,
        flagged_queries: backend.flagged_queries(),
    };
    Ok((levels, prediction))
}
