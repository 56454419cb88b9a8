//! kbench-sim: cost model, serving simulator (virtual time), calibration.
//!
//! - [`profile`]: hardware profiles with provenance; [`engine_profile`]: what the serving
//!   engine adds; [`presets`]: the embedded ones of both.
//! - [`optable`]: measured operator tables, interpolated; [`pricer`]: one operator's price.
//! - [`cost`]: passes and rounds priced, with breakdowns ([`cost::CostModel::explain_round`]).
//! - [`memory`]: whether the weights fit the GPUs at the experiment's tp_size.
//! - [`vllm_defaults`]: the batch limits `vllm serve` takes by GPU where the file is silent.
//! - [`sim`]: [`SimBackend`], the `sim` backend (continuous batching in virtual time).
//! - [`acceptance`]: acceptance models usable without a trace.
//! - [`predict`]: run an experiment's levels and read C=1 / saturation throughput.
//! - [`calibrate`]: fit a profile's free parameters to end-to-end measurements.
//! - [`passes`]: set a GPU's measured per-pass layer times beside the cost model's, fit
//!   `efficiency.in_model` to them.

pub mod acceptance;
pub mod calibrate;
pub mod client;
pub mod corpus;
pub mod cost;
mod deployment;
pub mod engine_profile;
pub mod error;
pub mod fidelity;
mod fit;
pub mod kv;
mod memo;
pub mod memory;
mod open;
pub mod optable;
pub mod passes;
pub mod predict;
pub mod presets;
pub mod pricer;
pub mod profile;
mod sched;
pub mod sglang_defaults;
pub mod sim;
pub mod vllm_defaults;

pub use cost::{CostModel, PassBreakdown, PassKind, RoundBreakdown, VllmStep};
pub use deployment::check_deployment;
pub use engine_profile::EngineProfile;
pub use error::SimError;
pub use open::{acceptance_for, open};
pub use profile::{HardwareProfile, Param, Provenance};
pub use sim::SimBackend;
