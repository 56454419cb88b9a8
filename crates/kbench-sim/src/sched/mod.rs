//! The serving engine's scheduler, one implementation per engine: what the next forward
//! runs over (which requests decode, which prompts are prefilled and how far), priced by
//! the cost model and committed to the session. The simulator core
//! ([`crate::sim::SimSession`]) owns the queues, the KV pool, the front end and virtual
//! time; it never asks which engine it plays. A new engine is one file here and one line
//! in [`for_engine`].

use kbench_core::backend::{BackendError, CudaGraphBound};
use kbench_core::experiment::{Experiment, SpeculativeConfig};

use crate::error::SimError;
use crate::profile::HardwareProfile;
use crate::sim::SimSession;

mod sglang;
mod vllm;

pub(crate) trait Scheduler: Send + Sync {
    /// Runs one forward over what the session holds; called only when some request is
    /// waiting, prefilling or running.
    fn step(&self, s: &mut SimSession<'_>) -> Result<(), BackendError>;

    /// Whether the engine chooses each forward's batch while the previous forward still runs
    /// (an overlapped event loop): a request that reaches it during forward k then misses
    /// forward k + 1, already chosen, and joins k + 2.
    fn schedules_ahead(&self, spec: &SpeculativeConfig) -> bool;

    /// The largest decode-type forward the engine replays from a CUDA graph, in its own
    /// unit: the file's setting or the engine's default for the GPU.
    fn graph_bound(&self, exp: &Experiment, profile: &HardwareProfile) -> CudaGraphBound;
}

/// The scheduler of the engine an engine profile describes (its `engine` key).
pub(crate) fn for_engine(engine: &str) -> Result<Box<dyn Scheduler>, SimError> {
    match engine {
        "sglang" => Ok(Box::new(sglang::Sglang)),
        "vllm" => Ok(Box::new(vllm::Vllm)),
        other => Err(SimError::Model(format!(
            "no scheduler for engine `{other}`: kbench simulates sglang and vllm"
        ))),
    }
}
