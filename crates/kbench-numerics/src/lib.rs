//! The number formats and formulas that the engine's CPU path, its CUDA path and the CUDA
//! kernels' references must agree on bit for bit, written once. Std only, so every crate
//! that needs them can depend on it.

pub mod bf16;
pub mod int4;
pub mod rope;
