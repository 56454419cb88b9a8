//! The engine backend's one entry point: an experiment in, the backend its
//! `[backend.engine]` asks for (CPU reference or CUDA) out.

use kbench_core::backend::Backend;
use kbench_core::experiment::Experiment;

use crate::device::Device;
use crate::error::Result;
use crate::settings::EngineSettings;
use crate::{CudaEngineBackend, EngineBackend};

pub fn open(exp: &Experiment) -> Result<Box<dyn Backend>> {
    // Checked whatever the device, so a typo fails before a long CPU run, not on the GPU box.
    let settings = EngineSettings::of(exp)?;
    Ok(match settings.device()? {
        Device::Cuda(_) => Box::new(CudaEngineBackend::new(exp)?),
        Device::Cpu => Box::new(EngineBackend::new(exp)?),
    })
}
