use thiserror::Error;

/// Errors of the CUDA layer. Nothing here panics on a machine without CUDA. Library calls
/// keep their own error as the source (the driver's `DriverError`, cuBLAS's and NCCL's
/// status codes); print a whole chain with [`Chain`].
#[derive(Debug, Error)]
pub enum CudaError {
    #[error("no CUDA driver found (libcuda.so)")]
    NoDriver,
    #[error("no CUDA device with ordinal {0} (found {1})")]
    NoDevice(usize, usize),
    #[error("NVRTC not available: {0}")]
    NoNvrtc(String),
    /// A driver call that failed, with the driver's own error.
    #[error("CUDA driver call {call} failed")]
    Driver {
        call: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A driver error from cudarc's safe API, which does not say which call it was.
    #[error("CUDA driver error")]
    DriverCall(#[from] cudarc::driver::DriverError),
    #[error("NVRTC compile of {file} for {arch} failed:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    #[error("invalid kernel arguments: {0}")]
    Invalid(String),
    /// Something this crate expected of itself did not hold (a thread that panicked, a
    /// stream capture that produced nothing).
    #[error("internal error: {0}")]
    Internal(String),
    #[error("cuBLAS unavailable: {0}")]
    NoCublas(String),
    #[error("cuBLAS {call} returned {status}")]
    Cublas { call: String, status: String },
    #[error("NCCL unavailable: {0}")]
    NoNccl(String),
    #[error("NCCL {call} returned {status:?}")]
    Nccl {
        call: String,
        status: cudarc::nccl::sys::ncclResult_t,
    },
}

pub type Result<T> = std::result::Result<T, CudaError>;

/// A driver call's status as a `Result` naming the call.
pub(crate) fn driver(call: impl Into<String>, status: cudarc::driver::sys::CUresult) -> Result<()> {
    status.result().map_err(|source| CudaError::Driver {
        call: call.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The driver's error is not printed here: its Display asks libcuda for the description.
    #[test]
    fn a_failed_call_keeps_the_drivers_error_as_its_source() {
        let status = cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        let err = driver("cuMemsetD8Async", status).unwrap_err();
        assert_eq!(err.to_string(), "CUDA driver call cuMemsetD8Async failed");
        let source = std::error::Error::source(&err).expect("a source");
        let driver_error = source
            .downcast_ref::<cudarc::driver::DriverError>()
            .expect("the driver's error");
        assert_eq!(driver_error.0, status);
    }
}
