//! What a server needs to start at all, apart from any prediction: the GPU's profile, the
//! weights in memory, a KV cache (and vLLM's one request of max_model_len in it). A launch
//! line (`kbench sglang-args`, `kbench vllm-args`) is checked with these, so the command it
//! prints is one the engine would run; the acceptance a prediction replays, the engine
//! profile's prices and the benchmark's requests are not needed to start (of a vLLM
//! profile only its model runner is, whose profile run sizes the KV cache).

use kbench_core::experiment::{Experiment, ServingEngineKind};

use crate::engine_profile::ModelRunner;
use crate::error::SimError;
use crate::presets::{resolve_engine_profile, resolve_profile};
use crate::profile::HardwareProfile;

pub fn check_deployment(exp: &Experiment) -> Result<(), SimError> {
    let profile = resolve_profile(&exp.hardware).map_err(|e| e.in_file(&exp.path))?;
    let runner = match exp.engine.kind {
        ServingEngineKind::Vllm => {
            resolve_engine_profile(exp, &profile)
                .map_err(|e| e.in_file(&exp.path))?
                .memory
                .model_runner
        }
        ServingEngineKind::Sglang => ModelRunner::V1,
    };
    server_starts(exp, &profile, runner).map(drop)
}

/// What the server checks before it serves, in its order: the weights fit, vLLM's graph
/// sizes leave a speculative decode, and a KV cache is left; the cache, where it starts.
pub(crate) fn server_starts(
    exp: &Experiment,
    profile: &HardwareProfile,
    runner: ModelRunner,
) -> Result<crate::kv::KvPool, SimError> {
    check_weights_fit(exp, profile)?;
    crate::vllm_defaults::check_capture_size(exp, profile, runner)?;
    crate::kv::kv_pool(exp, profile, runner)
}

/// The target's (and draft's) weights within what one GPU can give them.
fn check_weights_fit(exp: &Experiment, profile: &HardwareProfile) -> Result<(), SimError> {
    crate::memory::check_weights_fit(
        profile,
        &exp.model,
        &exp.speculative,
        exp.draft.as_ref(),
        exp.tp_size,
    )
    .map(drop)
    .map_err(|e| match e {
        SimError::DoesNotFit(m) => SimError::DoesNotFit(format!("{}: {m}", exp.path.display())),
        e => e,
    })
}
