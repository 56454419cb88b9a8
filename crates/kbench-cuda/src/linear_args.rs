//! The arguments of one dense BF16 linear, shared by [`crate::Blas::bf16_linear`],
//! [`crate::ops::bf16_matmul`] and [`crate::Linear::run`]: fourteen positional numbers were
//! too easy to swap, so the operands are named.

/// One operand of a [`LinearArgs`]: a row-major matrix per batch entry, strides in elements
/// (not bytes), so sub-ranges of a buffer can be passed as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Device address of batch entry 0's first element.
    pub ptr: u64,
    /// Row stride; may exceed the row length (padded rows, or batch entries side by side in
    /// each row as the absorbed MLA layout has them).
    pub ld: usize,
    /// Batch stride, ignored when `batch` is 1. 0 shares an input between all batch entries;
    /// outputs must not overlap.
    pub batch_stride: usize,
}

impl Operand {
    /// A matrix with row stride `ld`, the same one for every batch entry (batch stride 0).
    pub fn matrix(ptr: u64, ld: usize) -> Self {
        Operand {
            ptr,
            ld,
            batch_stride: 0,
        }
    }

    /// Batch entry z at `ptr + z * batch_stride` elements, row stride `ld`.
    pub fn batched(ptr: u64, ld: usize, batch_stride: usize) -> Self {
        Operand {
            ptr,
            ld,
            batch_stride,
        }
    }

    /// (address, row stride, batch stride), for code that launches with them one by one.
    pub fn parts(self) -> (u64, usize, usize) {
        (self.ptr, self.ld, self.batch_stride)
    }
}

/// Batched BF16 linear, row-major NT: `Y[z][m, n] = sum_k X[z][m, k] W[z][n, k]` for
/// z < `batch`, X and W bf16 (weights stored `[out, in]`, as checkpoints hold them), f32
/// accumulation. Row strides must be at least the row length (ldx, ldw >= k; ldy >= n).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearArgs {
    /// Activations X, `[m, k]` per batch entry, bf16.
    pub x: Operand,
    /// Weights W, `[n, k]` per batch entry, bf16.
    pub w: Operand,
    /// Output Y, `[m, n]` per batch entry: f32 when `y_f32`, else bf16.
    pub y: Operand,
    pub y_f32: bool,
    /// Rows of X and Y (tokens).
    pub m: usize,
    /// Rows of W, columns of Y (output features).
    pub n: usize,
    /// The reduced dimension (input features).
    pub k: usize,
    pub batch: usize,
}

impl LinearArgs {
    /// One unbatched linear over packed rows (row strides k, k and n), bf16 out: what most of
    /// a model's projections are. Set `y_f32` on the result for an f32 output.
    pub fn dense(x: u64, w: u64, y: u64, m: usize, n: usize, k: usize) -> Self {
        LinearArgs {
            x: Operand::matrix(x, k),
            w: Operand::matrix(w, k),
            y: Operand::matrix(y, n),
            y_f32: false,
            m,
            n,
            k,
            batch: 1,
        }
    }

    /// Nothing to compute: no rows, no output features or no batch entries.
    pub fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.batch == 0
    }
}
