//! Experiment files: schema, loading with overrides and sweeps, SGLang validation.

mod error;
mod file;
mod load;
mod locate;
mod resolve;
mod speculative;
mod vllm_speculative;
mod workload;

pub use error::{ExperimentError, SourceSpan};
pub use file::*;
pub use load::{
    apply_override, apply_overrides, load_experiment, load_experiment_str, load_experiment_variant,
    variant_files, Variant,
};
pub use locate::{locate, value_span};
pub use resolve::{
    Experiment, HardwareRef, DEFAULT_CUDA_GRAPH_MAX_BS, DEFAULT_MAX_RUNNING_REQUESTS,
    SPEC_DEFAULT_MAX_RUNNING_REQUESTS,
};
pub use speculative::{
    validate_speculative, NgramWindow, RuleViolation, SpeculativeConfig, VerifyMethod,
};
pub use vllm_speculative::{validate_vllm_speculative, DEFAULT_PROMPT_LOOKUP};
pub use workload::{
    ChunkedPrefill, EngineProfileRef, KvCacheDtype, KvSettings, RequestLengths, ServingEngine,
    ServingEngineKind, Workload, DEFAULT_MAX_PREFILL_TOKENS,
};
