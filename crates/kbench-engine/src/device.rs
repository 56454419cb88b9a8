//! Where the engine computes. The CPU reference path is always available; the CUDA path
//! (kernels in `kbench-cuda`) is not part of this build yet and says so clearly.

use serde::Serialize;

use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// f32 math over BF16 / INT4 weights on the host: the correctness oracle.
    #[default]
    Cpu,
    /// An NVIDIA GPU by ordinal.
    Cuda(u32),
}

impl Device {
    /// `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
    pub fn parse(s: &str) -> Result<Device> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
                Some(n) => Ok(Device::Cuda(n)),
                None => Err(EngineError::Invalid(format!(
                    "unknown device `{s}` (use `cpu`, `cuda` or `cuda:N`)"
                ))),
            },
        }
    }

    /// Fails for devices this build cannot compute on.
    pub fn ensure_available(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(n) => {
                let found = kbench_cuda::device::device_count();
                if (n as usize) < found {
                    Ok(())
                } else {
                    let why = if kbench_cuda::device::driver_present() {
                        "no such GPU"
                    } else {
                        "no CUDA driver found (libcuda.so)"
                    };
                    Err(EngineError::DeviceUnavailable {
                        device: self.to_string(),
                        why,
                        found,
                    })
                }
            }
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
