//! What a server needs to start at all, apart from any prediction: the GPU's profile, the
//! weights in memory, a KV cache (and vLLM's one request of max_model_len in it). A launch
//! line (`kbench sglang-args`, `kbench vllm-args`) is checked with these, so the command it
//! prints is one the engine would run; the acceptance a prediction replays, the engine
//! profile that prices it and the benchmark's requests are not needed to start.

use kbench_core::experiment::Experiment;

use crate::error::SimError;
use crate::presets::resolve_profile;
use crate::profile::HardwareProfile;

pub fn check_deployment(exp: &Experiment) -> Result<(), SimError> {
    let profile = resolve_profile(&exp.hardware).map_err(|e| e.in_file(&exp.path))?;
    check_weights_fit(exp, &profile)?;
    crate::kv::kv_pool(exp, &profile).map(drop)
}

/// The target's (and draft's) weights within what one GPU can give them.
pub(crate) fn check_weights_fit(
    exp: &Experiment,
    profile: &HardwareProfile,
) -> Result<(), SimError> {
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
