//! Which library does each command's work. Filled in as the backends land.

use kbench_core::backend::Backend;
use kbench_core::spec::Experiment;

use super::args::{CalibrateArgs, GenerateArgs, KernelsCommand, ModelCommand, TraceCommand};
use super::error::{CliError, CliResult};
use super::exit;

pub fn make_backend(exp: &Experiment, _flag: Option<&str>) -> CliResult<Box<dyn Backend>> {
    Err(CliError::new(
        exit::INVALID_INPUT,
        format!("backend `{}` is not available in this build", exp.file.backend.kind),
    ))
}

pub fn trace_command(_t: TraceCommand) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench trace: not available in this build"))
}
pub fn calibrate(_a: CalibrateArgs) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench calibrate: not available in this build"))
}
pub fn model_command(_m: ModelCommand) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench model: not available in this build"))
}
pub fn generate(_a: GenerateArgs) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench generate: not available in this build"))
}
pub fn kernels_command(_k: KernelsCommand) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench kernels: not available in this build"))
}
