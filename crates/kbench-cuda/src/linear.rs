//! Which kernels run a dense BF16 linear: cuBLAS when a [`Blas`] is at hand, the crate's own
//! [`ops::bf16_matmul`] otherwise. Both compute `Y[z][m, n] = sum_k X[z][m, k] W[z][n, k]` with
//! the same strides, so callers pick once and pass the choice around.

use crate::blas::Blas;
use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use crate::linear_args::LinearArgs;
use crate::ops::{self, Workspace};

/// The backend of a dense BF16 linear.
#[derive(Clone, Copy)]
pub enum Linear<'a> {
    Cublas(&'a Blas),
    /// `ops::bf16_matmul` with its split-K workspace (None: no split-K).
    Own(Workspace),
}

impl<'a> Linear<'a> {
    /// cuBLAS when `blas` is Some, else the own kernel with `ws`.
    pub fn pick(blas: Option<&'a Blas>, ws: Workspace) -> Self {
        match blas {
            Some(b) => Linear::Cublas(b),
            None => Linear::Own(ws),
        }
    }

    /// "cublas" or "own" (the values of the stack profile's `dense_linears`).
    pub fn name(&self) -> &'static str {
        match self {
            Linear::Cublas(_) => "cublas",
            Linear::Own(_) => "own",
        }
    }

    /// The linear of [`LinearArgs`] on the picked backend. The own kernel's extra limits
    /// (K % 32, strides % 8, 16-byte aligned X and W; see [`ops::bf16_matmul`]) apply only
    /// when it runs.
    pub fn run(&self, dev: &CudaDevice, args: LinearArgs) -> Result<()> {
        match *self {
            Linear::Cublas(b) => {
                // a handle on another stream would run unordered with the caller's kernels
                if !b.is_on(dev) {
                    return Err(CudaError::Invalid(
                        "cublas linear: the Blas handle belongs to another device / stream".into(),
                    ));
                }
                b.bf16_linear(args)
            }
            Linear::Own(ws) => ops::bf16_matmul(dev, args, ws),
        }
    }
}
