//! Tensor-parallel communication: BF16 all-reduce (sum) over NCCL.
//! World size 1 needs no NCCL at all ([`TpComm::single`]). For several GPUs in one process,
//! [`TpComm::group`] makes one communicator per device (ncclCommInitAll); each rank's
//! all-reduce is enqueued on that rank's device stream.
//! NCCL is loaded dynamically (cudarc); its library must be loadable by name (`libnccl.so`:
//! the pip wheel `nvidia-nccl-cu13` ships `libnccl.so.2` only, so put a `libnccl.so` link to it
//! in a directory on LD_LIBRARY_PATH; scripts/gpu-check.sh does this).

use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use cudarc::nccl::sys as nc;

/// A tensor-parallel communicator for one rank.
pub struct TpComm {
    comm: Option<nc::ncclComm_t>,
    pub rank: usize,
    pub world: usize,
}

unsafe impl Send for TpComm {}

/// True when the NCCL library can be loaded.
pub fn nccl_present() -> bool {
    unsafe { nc::is_culib_present() }
}

fn check(r: nc::ncclResult_t, what: &str) -> Result<()> {
    if r == nc::ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(CudaError::Nccl {
            call: what.into(),
            status: r,
        })
    }
}

impl TpComm {
    /// World size 1: all-reduce is the identity; no NCCL needed.
    pub fn single() -> Self {
        TpComm {
            comm: None,
            rank: 0,
            world: 1,
        }
    }

    /// A real one-rank NCCL communicator (exercises the NCCL path on one GPU).
    pub fn nccl_single(dev: &CudaDevice) -> Result<Self> {
        let mut v = Self::group(&[dev])?;
        Ok(v.remove(0))
    }

    /// One communicator per device (single process, ncclCommInitAll).
    pub fn group(devs: &[&CudaDevice]) -> Result<Vec<Self>> {
        if !nccl_present() {
            return Err(CudaError::NoNccl(
                "libnccl not loadable (need libnccl.so on the library path)".into(),
            ));
        }
        let n = devs.len();
        let mut comms: Vec<nc::ncclComm_t> = vec![std::ptr::null_mut(); n];
        let list: Vec<i32> = devs.iter().map(|d| d.ordinal as i32).collect();
        for d in devs {
            d.ctx.bind_to_thread()?;
        }
        check(
            unsafe { nc::ncclCommInitAll(comms.as_mut_ptr(), n as i32, list.as_ptr()) },
            "ncclCommInitAll",
        )?;
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(i, c)| TpComm {
                comm: Some(c),
                rank: i,
                world: n,
            })
            .collect())
    }

    /// In-place sum over ranks of `n` bf16 values at `buf` (enqueued on `dev`'s stream).
    /// With several ranks in one thread, wrap the per-rank calls in [`group_start`]/[`group_end`].
    pub fn all_reduce_bf16(&self, dev: &CudaDevice, buf: u64, n: usize) -> Result<()> {
        match self.comm {
            None => Ok(()),
            Some(c) => check(
                unsafe {
                    nc::ncclAllReduce(
                        buf as *const std::ffi::c_void,
                        buf as *mut std::ffi::c_void,
                        n,
                        nc::ncclDataType_t::ncclBfloat16,
                        nc::ncclRedOp_t::ncclSum,
                        c,
                        dev.stream.cu_stream() as nc::cudaStream_t,
                    )
                },
                "ncclAllReduce",
            ),
        }
    }
}

/// ncclGroupStart (when driving several ranks from one thread).
pub fn group_start() -> Result<()> {
    check(unsafe { nc::ncclGroupStart() }, "ncclGroupStart")
}
/// ncclGroupEnd.
pub fn group_end() -> Result<()> {
    check(unsafe { nc::ncclGroupEnd() }, "ncclGroupEnd")
}

impl Drop for TpComm {
    fn drop(&mut self) {
        if let Some(c) = self.comm.take() {
            unsafe {
                nc::ncclCommDestroy(c);
            }
        }
    }
}
