//! kbench-cuda: the CUDA path of kbench's engine, kernel layer.
//!
//! - [`check_kernels`]: compile every kernel in `kernels/` through NVRTC for given archs; needs
//!   no GPU and no driver, only libnvrtc (pip `nvidia-cuda-nvrtc`) and the CUDA headers
//!   (pip `nvidia-cuda-runtime`).
//! - [`CudaDevice::new`]: a device, or a typed error on machines without a driver / GPU.
//! - [`ops`]: launch wrappers for every kernel; [`blas::Blas`]: cuBLAS for the dense BF16 linears
//!   (a handle on the device's stream with its own workspace, graph-capturable);
//!   [`linear::Linear`]: cuBLAS or the own `bf16_matmul`, picked once; [`reference`]: f32 CPU
//!   references; [`comm`]: tensor-parallel all-reduce (NCCL; world size 1 needs none);
//!   [`device::Graph`]: CUDA graph capture.
//!
//! The GPU self-tests, kernel benchmarks and the `kbench-gpu` driver are in `kbench-gpucheck`,
//! not here: this is the library the engine links, and the benchmarks price against the
//! simulator's op tables, which the CUDA layer must not depend on.

pub mod blas;
pub mod comm;
pub mod device;
mod error;
pub mod kernels;
mod linear;
mod linear_args;
pub mod nvrtc;
pub mod ops;
pub mod reference;

pub use blas::Blas;
pub use cudarc::driver::DeviceRepr;
pub use device::{CudaDevice, DBuf};
pub use error::{CudaError, Result};
pub use linear::Linear;
pub use linear_args::{LinearArgs, Operand};

/// The result of compiling one kernel file for one architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelCheck {
    pub file: String,
    pub arch: String,
    pub ok: bool,
    /// NVRTC's log (warnings on success, errors on failure) or why nothing could be compiled.
    pub log: String,
    pub millis: f64,
}

/// Compile every kernel file through NVRTC for each arch ("sm_90", "sm_120", ...).
/// Needs no GPU. If NVRTC cannot be found, every entry is `ok: false` with the reason.
pub fn check_kernels(archs: &[&str]) -> Vec<KernelCheck> {
    let n = nvrtc::Nvrtc::get();
    let jobs: Vec<(&str, &kernels::KernelFile)> = archs
        .iter()
        .flat_map(|a| kernels::ALL.iter().map(move |f| (*a, f)))
        .collect();
    // NVRTC compiles independent programs concurrently; a few threads at a time
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8);
    let mut out: Vec<Option<KernelCheck>> = vec![None; jobs.len()];
    for (ci, chunk) in jobs.chunks(threads).enumerate() {
        let res: Vec<KernelCheck> = std::thread::scope(|s| {
            let hs: Vec<_> = chunk
                .iter()
                .map(|(arch, f)| {
                    let n = &n;
                    s.spawn(move || {
                        let t0 = std::time::Instant::now();
                        let (ok, log) = match n {
                            Err(e) => (false, e.to_string()),
                            Ok(n) => match n.compile(f, arch) {
                                Ok((_, log)) => (true, log),
                                Err(log) => (false, log),
                            },
                        };
                        KernelCheck {
                            file: f.name.to_string(),
                            arch: arch.to_string(),
                            ok,
                            log,
                            millis: t0.elapsed().as_secs_f64() * 1e3,
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("nvrtc thread"))
                .collect()
        });
        for (j, r) in res.into_iter().enumerate() {
            out[ci * threads + j] = Some(r);
        }
    }
    out.into_iter().map(|r| r.unwrap()).collect()
}

/// Where NVRTC and the headers were found (for `kbench kernels check` to print).
pub fn nvrtc_info() -> std::result::Result<String, String> {
    match nvrtc::Nvrtc::get() {
        Ok(n) => Ok(format!(
            "NVRTC {}.{} at {}; headers {}",
            n.version.0,
            n.version.1,
            n.lib_path.display(),
            n.include_dir
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "(none found)".into())
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// bf16 <-> f32 on the host (bf16 values are carried as `u16` bits), shared with the
/// engine's CPU path.
pub use kbench_numerics::bf16;
