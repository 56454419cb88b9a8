//! kbench-gpucheck: the stages of the GPU check (scripts/gpu-check.sh), kept out of kbench-cuda.
//!
//! kbench-cuda is the library the engine links; it ships no self-tests and no benchmarks, and it
//! knows nothing of the simulator. The checks that run on a GPU need both the CUDA layer and the
//! simulator (the benchmarks print SGLang's H200 time from its op tables beside each kernel), so
//! they live here, above both:
//!
//! - [`selftest`]: every kernel against its f32 CPU reference (`tests/gpu.rs`, `kbench-gpu
//!   selftest`);
//! - [`bench`]: timings with CUDA events, the layer stack and its calibration profile
//!   (`benches/kernels.rs`, `kbench-gpu bench` / `stack`);
//! - the `kbench-gpu` binary, the driver the script runs.

pub mod bench;
pub mod selftest;
