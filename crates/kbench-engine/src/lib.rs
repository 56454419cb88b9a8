//! kbench-engine: the native engine. A DeepSeek-V3 / Kimi-K2.5 target (MLA, sigmoid-routed
//! MoE, INT4 compressed-tensors experts) and an EAGLE-3 draft head, loaded from safetensors
//! in the real checkpoints' format, running SGLang's speculative round on a CPU reference
//! path (the correctness oracle), and on NVIDIA GPUs through kbench-cuda's kernels (module
//! `cuda`, chosen with [`Device`]). Where no CUDA driver or GPU is present, asking for one
//! is an error ([`EngineError::DeviceUnavailable`]), so the crate builds and tests anywhere.
#![recursion_limit = "256"]

mod backend;
pub mod batcher;
mod cpu;
pub mod cuda;
mod device;
mod draft;
mod error;
pub mod generate;
pub mod init;
pub mod linalg;
pub mod model;
mod names;
mod open;
pub mod passes;
mod rope;
mod session;
mod settings;
mod shapes;
pub mod speculative;
pub mod st;
pub mod target;
pub mod trace;

pub use backend::EngineBackend;
pub use cuda::{CudaEngineBackend, CudaModel, CudaOptions};
pub use device::Device;
pub use error::{EngineError, Result};
pub use generate::{generate, GenerateOptions, GenerateResult};
pub use init::{
    build_model, ensure_tiny_model, init_model, init_model_with, plan_checkpoint, Dims,
    InitOptions, Preset,
};
pub use model::Model;
pub use open::open;
pub use settings::EngineSettings;
pub use speculative::SpeculativeSettings;
pub use trace::{random_prompts, record_trace, TraceOptions};
