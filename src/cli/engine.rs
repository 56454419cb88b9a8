//! Commands served by the native engine: `model init`, `generate`, `trace record`, the
//! `engine` backend, and `kernels check`.

use kbench_core::backend::Backend;
use kbench_core::spec::Experiment;

use super::args::{GenerateArgs, KernelsCommand, ModelCommand, TraceRecordArgs};
use super::error::{CliError, CliResult};
use super::exit;

pub fn make_engine_backend(_exp: &Experiment) -> CliResult<Box<dyn Backend>> {
    Err(CliError::new(exit::FAILURE, "engine backend: not wired yet"))
}
pub fn model_command(_m: ModelCommand) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench model: not wired yet"))
}
pub fn generate(_a: GenerateArgs) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench generate: not wired yet"))
}
pub fn record_trace(_a: TraceRecordArgs) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench trace record: not wired yet"))
}
pub fn kernels_command(_k: KernelsCommand) -> CliResult<()> {
    Err(CliError::new(exit::FAILURE, "kbench kernels: not wired yet"))
}
