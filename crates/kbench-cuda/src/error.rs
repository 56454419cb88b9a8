use thiserror::Error;

/// Errors of the CUDA layer. Nothing here panics on a machine without CUDA.
#[derive(Debug, Error)]
pub enum CudaError {
    #[error("no CUDA driver found (libcuda.so)")]
    NoDriver,
    #[error("no CUDA device with ordinal {0} (found {1})")]
    NoDevice(usize, usize),
    #[error("NVRTC not available: {0}")]
    NoNvrtc(String),
    #[error("CUDA driver error: {0}")]
    Driver(String),
    /// A driver call's own error, kept typed (its code and the driver's description). Not
    /// a `#[source]`: the GPU check prints errors by their message alone, so the message
    /// carries it, once.
    #[error("CUDA driver error: {0}")]
    DriverCall(cudarc::driver::DriverError),
    #[error("NVRTC compile of {file} for {arch} failed:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    #[error("invalid kernel arguments: {0}")]
    Invalid(String),
    #[error("cuBLAS: {0}")]
    Cublas(String),
    #[error("NCCL: {0}")]
    Nccl(String),
}

pub type Result<T> = std::result::Result<T, CudaError>;

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::DriverCall(e)
    }
}
