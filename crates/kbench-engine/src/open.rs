//! The engine backend's one entry point: an experiment in, the backend its
//! `[backend.engine]` asks for (CPU reference or CUDA) out.

use kbench_core::backend::Backend;
use kbench_core::experiment::{Algorithm, Experiment};

use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::settings::EngineSettings;
use crate::{CudaEngineBackend, EngineBackend};

pub fn open(exp: &Experiment) -> Result<Box<dyn Backend>> {
    let algorithm = exp.speculative.algorithm;
    if exp.speculative.is_speculative() && algorithm != Algorithm::Eagle3 {
        // its draft is an EAGLE-3 head checkpoint; MTP layers, EAGLE-1 heads and n-gram
        // lookup are priced by the simulator and measured through the http backend
        return Err(EngineError::Invalid(format!(
            "{}: the engine drafts with an EAGLE-3 head only, not `{}`: run it with --backend sim, or against a server with --backend http",
            exp.path.display(),
            algorithm.name_in(exp.engine.kind)
        )));
    }
    // Checked whatever the device, so a typo fails before a long CPU run, not on the GPU box.
    let settings = EngineSettings::of(exp)?;
    Ok(match settings.device()? {
        Device::Cuda(_) => Box::new(CudaEngineBackend::new(exp)?),
        Device::Cpu => Box::new(EngineBackend::new(exp)?),
    })
}
