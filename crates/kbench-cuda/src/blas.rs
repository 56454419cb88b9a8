//! cuBLAS for the dense BF16 linears: one handle bound to a [`CudaDevice`]'s stream, with a
//! user-owned workspace so that its GEMMs can be captured into CUDA graphs.
//!
//! Layout. The crate's linears are row-major "NT": `Y[m, n] = X[m, k] · W[n, k]^T` (weights stored
//! `[out, in]`, as checkpoints hold them). cuBLAS is column-major, and a row-major `[r, c]` matrix
//! with row stride `ld` is the column-major `[c, r]` matrix with leading dimension `ld`. So
//! `Y^T[n, m] = W[n, k] · X^T[k, m]` in column-major terms: A is W's memory seen as `[k, n]`
//! (lda = ldw) taken transposed (`OP_T`), B is X's memory seen as `[k, m]` (ldb = ldx) taken as is
//! (`OP_N`), C is Y's memory seen as `[n, m]` (ldc = ldy); cuBLAS's (m, n, k) are our (n, m, k).
//! cuBLAS requires lda >= k (transposed A), ldb >= k, ldc >= n, which are our ldw >= k, ldx >= k,
//! ldy >= n.

use crate::device::{CudaDevice, DBuf};
use crate::error::{CudaError, Result};
use crate::linear_args::LinearArgs;
use cudarc::cublas::sys as cb;
use cudarc::driver::{CudaContext, CudaStream};
use std::ffi::c_void;
use std::sync::Arc;

/// Workspace handed to cuBLAS: its recommendation for Hopper (4 MiB suffices elsewhere).
pub const WORKSPACE_BYTES: usize = 32 << 20;
/// cublasSetWorkspace rejects workspaces not aligned to 256 bytes.
const WORKSPACE_ALIGN: usize = 256;

/// Every cuBLAS entry point used here. cudarc resolves symbols lazily and panics on a missing one,
/// so they are looked up once before a handle is made (an old libcublas may lack some).
const SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasSetMathMode",
    "cublasSetPointerMode_v2",
    "cublasGemmEx",
    "cublasGemmStridedBatchedEx",
    "cublasGetStatusString",
    "cublasGetProperty",
];

/// The loadable cuBLAS's version ("cuBLAS 13.0.2"), or why cuBLAS cannot be used. Never panics.
pub fn cublas_status() -> std::result::Result<String, String> {
    if !unsafe { cb::is_culib_present() } {
        return Err(
            "libcublas not loadable (add the directory of libcublas.so.13 to LD_LIBRARY_PATH)"
                .into(),
        );
    }
    // safe to call now: is_culib_present succeeded with the same candidate list culib() uses
    let lib = unsafe { cb::culib() };
    let missing: Vec<&str> = SYMBOLS
        .iter()
        .copied()
        .filter(|s| unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!("libcublas lacks {} (too old?)", missing.join(", ")));
    }
    let prop = |p: cb::libraryPropertyType| {
        let mut v = -1;
        unsafe { cb::cublasGetProperty(p, &mut v) };
        v
    };
    Ok(format!(
        "cuBLAS {}.{}.{}",
        prop(cb::libraryPropertyType::MAJOR_VERSION),
        prop(cb::libraryPropertyType::MINOR_VERSION),
        prop(cb::libraryPropertyType::PATCH_LEVEL)
    ))
}

/// True when cuBLAS can be used ([`cublas_status`] is Ok).
pub fn cublas_present() -> bool {
    cublas_status().is_ok()
}

fn status_text(st: cb::cublasStatus_t) -> String {
    let p = unsafe { cb::cublasGetStatusString(st) };
    if p.is_null() {
        return format!("{st:?}");
    }
    let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy();
    format!("{st:?} ({s})")
}

fn check(st: cb::cublasStatus_t, what: &str) -> Result<()> {
    if st == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Cublas {
            call: what.into(),
            status: status_text(st),
        })
    }
}

fn inv(msg: String) -> CudaError {
    CudaError::Invalid(msg)
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| inv(format!("cublas linear: {what} {v} exceeds i32")))
}

fn to_i64(v: usize, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| inv(format!("cublas linear: {what} {v} exceeds i64")))
}

/// A cuBLAS handle on one device's stream, with its own workspace. Everything it enqueues is
/// ordered on that stream with the crate's kernels. CUDA graphs captured with it use its
/// workspace, so they must not be replayed after it is dropped.
pub struct Blas {
    handle: cb::cublasHandle_t,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Dropped after the handle (fields drop after `Drop::drop`), so no GEMM outlives it.
    _workspace: DBuf<u8>,
    /// "cuBLAS 13.0.2"
    pub version: String,
}

// The handle is used only with `ctx` bound to the calling thread (done before every call), which
// is what cuBLAS needs to move a handle between threads. Not Sync: one thread at a time.
unsafe impl Send for Blas {}

impl Blas {
    /// A handle bound to `dev`'s stream with a 32 MiB workspace of its own, f32 reductions and
    /// host-side alpha / beta. `CudaError::NoCublas` when libcublas is absent or unusable.
    pub fn new(dev: &CudaDevice) -> Result<Blas> {
        let version = cublas_status().map_err(CudaError::NoCublas)?;
        dev.ctx.bind_to_thread()?;
        // over-allocated so the workspace can start on a 256-byte boundary whatever the stream's
        // memory pool returns
        let workspace = dev.alloc::<u8>(WORKSPACE_BYTES + WORKSPACE_ALIGN)?;
        let mut handle: cb::cublasHandle_t = std::ptr::null_mut();
        check(unsafe { cb::cublasCreate_v2(&mut handle) }, "cublasCreate")?;
        // from here on Drop destroys the handle on every error path
        let blas = Blas {
            handle,
            ctx: dev.ctx.clone(),
            stream: dev.stream.clone(),
            _workspace: workspace,
            version,
        };
        check(
            unsafe { cb::cublasSetStream_v2(handle, dev.stream.cu_stream() as cb::cudaStream_t) },
            "cublasSetStream",
        )?;
        // after cublasSetStream, which resets the handle to cuBLAS's own pool; with a fixed
        // workspace no GEMM allocates, so a captured GEMM brings no allocation into the graph
        // and repeated captures do not grow memory
        let base = (blas._workspace.ptr() as usize).next_multiple_of(WORKSPACE_ALIGN);
        check(
            unsafe { cb::cublasSetWorkspace_v2(handle, base as *mut c_void, WORKSPACE_BYTES) },
            "cublasSetWorkspace",
        )?;
        // split-K partial sums in f32, not in the bf16 output type: the crate's numerics (f32
        // accumulation everywhere) and the selftest bounds assume it
        check(
            unsafe {
                cb::cublasSetMathMode(
                    handle,
                    cb::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
                )
            },
            "cublasSetMathMode",
        )?;
        check(
            unsafe {
                cb::cublasSetPointerMode_v2(
                    handle,
                    cb::cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST,
                )
            },
            "cublasSetPointerMode",
        )?;
        Ok(blas)
    }

    /// True when this handle enqueues on `dev`'s stream.
    pub fn is_on(&self, dev: &CudaDevice) -> bool {
        Arc::ptr_eq(&self.stream, &dev.stream)
    }

    /// The linear of [`LinearArgs`], the semantics of [`crate::ops::bf16_matmul`]. Any k > 0,
    /// any strides and element-aligned addresses are taken (cuBLAS picks slower kernels when
    /// rows are not 16-byte aligned).
    pub fn bf16_linear(&self, args: LinearArgs) -> Result<()> {
        let Some(g) = plan(args)? else {
            return Ok(());
        };
        let LinearArgs {
            y_f32,
            m,
            n,
            k: kdim,
            batch,
            ..
        } = args;
        // CUBLAS_COMPUTE_32F takes f32 alpha / beta; in host pointer mode they are read at call
        // time, so a captured graph keeps the values, not these stack addresses
        let (alpha, beta) = (1.0f32, 0.0f32);
        let pa = &alpha as *const f32 as *const c_void;
        let pb = &beta as *const f32 as *const c_void;
        let compute = cb::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        self.ctx.bind_to_thread()?;
        let st = if g.batch == 1 {
            unsafe {
                cb::cublasGemmEx(
                    self.handle,
                    g.transa,
                    g.transb,
                    g.m,
                    g.n,
                    g.k,
                    pa,
                    g.a as *const c_void,
                    g.ab_type,
                    g.lda,
                    g.b as *const c_void,
                    g.ab_type,
                    g.ldb,
                    pb,
                    g.c as *mut c_void,
                    g.c_type,
                    g.ldc,
                    compute,
                    algo,
                )
            }
        } else {
            unsafe {
                cb::cublasGemmStridedBatchedEx(
                    self.handle,
                    g.transa,
                    g.transb,
                    g.m,
                    g.n,
                    g.k,
                    pa,
                    g.a as *const c_void,
                    g.ab_type,
                    g.lda,
                    g.stride_a,
                    g.b as *const c_void,
                    g.ab_type,
                    g.ldb,
                    g.stride_b,
                    pb,
                    g.c as *mut c_void,
                    g.c_type,
                    g.ldc,
                    g.stride_c,
                    g.batch,
                    compute,
                    algo,
                )
            }
        };
        let what = if g.batch == 1 {
            "cublasGemmEx"
        } else {
            "cublasGemmStridedBatchedEx"
        };
        check(
            st,
            &format!("{what} (M {m} N {n} K {kdim} batch {batch}, f32 out {y_f32})"),
        )
    }
}

/// The column-major GEMM that computes one row-major NT linear (cuBLAS's argument names).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Gemm {
    transa: cb::cublasOperation_t,
    transb: cb::cublasOperation_t,
    m: i32,
    n: i32,
    k: i32,
    a: u64,
    lda: i32,
    stride_a: i64,
    b: u64,
    ldb: i32,
    stride_b: i64,
    c: u64,
    ldc: i32,
    stride_c: i64,
    batch: i32,
    ab_type: cb::cudaDataType,
    c_type: cb::cudaDataType,
}

/// Check a linear's arguments and map them onto cuBLAS's (see the module doc); None when there
/// is nothing to compute.
fn plan(args: LinearArgs) -> Result<Option<Gemm>> {
    if args.is_empty() {
        return Ok(None);
    }
    let ((x, ldx, sxz), (w, ldw, swz), (y, ldy, syz)) =
        (args.x.parts(), args.w.parts(), args.y.parts());
    let LinearArgs {
        y_f32,
        m,
        n,
        k: kdim,
        batch,
        ..
    } = args;
    if kdim == 0 || ldx < kdim || ldw < kdim || ldy < n {
        return Err(inv(format!(
            "cublas linear: K {kdim} (> 0), ldx {ldx} and ldw {ldw} (>= K), ldy {ldy} (>= N {n})"
        )));
    }
    let ysize = if y_f32 { 4 } else { 2 };
    for (p, a, what) in [(x, 2, "X"), (w, 2, "W"), (y, ysize, "Y")] {
        if p == 0 {
            return Err(inv(format!("cublas linear: {what} is null")));
        }
        if p % a != 0 {
            return Err(inv(format!(
                "cublas linear: {what} address {p:#x} not {a}-byte aligned"
            )));
        }
    }
    if batch > 1 {
        // batch entries side by side within each row (the absorbed MLA layout), or one after
        // another; anything else could have two entries write one element
        let side_by_side = syz >= n && (batch - 1).saturating_mul(syz).saturating_add(n) <= ldy;
        let stacked = syz >= (m - 1).saturating_mul(ldy).saturating_add(n);
        if !side_by_side && !stacked {
            return Err(inv(format!(
                "cublas linear: outputs of the {batch} batch entries overlap (syz {syz}, ldy {ldy}, M {m}, N {n})"
            )));
        }
    }
    let (sa, sb, sc) = if batch > 1 {
        (swz, sxz, syz)
    } else {
        (0, 0, 0)
    };
    Ok(Some(Gemm {
        transa: cb::cublasOperation_t::CUBLAS_OP_T,
        transb: cb::cublasOperation_t::CUBLAS_OP_N,
        m: to_i32(n, "N")?,
        n: to_i32(m, "M")?,
        k: to_i32(kdim, "K")?,
        a: w,
        lda: to_i32(ldw, "ldw")?,
        stride_a: to_i64(sa, "swz")?,
        b: x,
        ldb: to_i32(ldx, "ldx")?,
        stride_b: to_i64(sb, "sxz")?,
        c: y,
        ldc: to_i32(ldy, "ldy")?,
        stride_c: to_i64(sc, "syz")?,
        batch: to_i32(batch, "batch")?,
        ab_type: cb::cudaDataType::CUDA_R_16BF,
        c_type: if y_f32 {
            cb::cudaDataType::CUDA_R_32F
        } else {
            cb::cudaDataType::CUDA_R_16BF
        },
    }))
}

impl Drop for Blas {
    fn drop(&mut self) {
        if self.handle.is_null() {
            return;
        }
        // nothing to report to from a destructor; a failure here only leaks the handle
        let _ = self.ctx.bind_to_thread();
        unsafe { cb::cublasDestroy_v2(self.handle) };
        self.handle = std::ptr::null_mut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear_args::Operand;
    use cb::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};

    #[test]
    fn nt_linear_maps_to_transposed_weights_times_activations() {
        // q_b-like: Y[7, 12288] = X[7, 1536] W[12288, 1536]^T, padded rows
        let g = plan(LinearArgs {
            x: Operand::matrix(0x1000, 1600),
            w: Operand::matrix(0x2000, 1536),
            y: Operand::matrix(0x3000, 12300),
            y_f32: false,
            m: 7,
            n: 12288,
            k: 1536,
            batch: 1,
        })
        .unwrap()
        .unwrap();
        assert_eq!((g.transa, g.transb), (CUBLAS_OP_T, CUBLAS_OP_N));
        assert_eq!((g.m, g.n, g.k), (12288, 7, 1536));
        assert_eq!(
            (g.a, g.lda, g.b, g.ldb, g.c, g.ldc),
            (0x2000, 1536, 0x1000, 1600, 0x3000, 12300)
        );
        assert_eq!((g.stride_a, g.stride_b, g.stride_c, g.batch), (0, 0, 0, 1));
        assert_eq!(g.c_type, cb::cudaDataType::CUDA_R_16BF);
    }

    #[test]
    fn absorbed_mla_batch_keeps_strides() {
        // W_UK: q [T, 64 * 192] (nope part of each head), W [64][512][128], out [T, 64 * 576]
        let g = plan(LinearArgs {
            x: Operand::batched(0x1000, 64 * 192, 192),
            w: Operand::batched(0x2000, 128, 512 * 128),
            y: Operand::batched(0x3000, 64 * 576, 576),
            y_f32: true,
            m: 5,
            n: 512,
            k: 128,
            batch: 64,
        })
        .unwrap()
        .unwrap();
        assert_eq!((g.m, g.n, g.k, g.batch), (512, 5, 128, 64));
        assert_eq!((g.lda, g.ldb, g.ldc), (128, 64 * 192, 64 * 576));
        assert_eq!((g.stride_a, g.stride_b, g.stride_c), (512 * 128, 192, 576));
        assert_eq!(g.c_type, cb::cudaDataType::CUDA_R_32F);
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        let ok = |r: Result<Option<Gemm>>| r.map(|g| g.is_some());
        // a valid linear; each bad case changes what its comment says
        let base = LinearArgs::dense(0x10, 0x20, 0x30, 2, 8, 8);
        assert!(ok(plan(base)).unwrap());
        // nothing to do
        let null = Operand::matrix(0, 0);
        let empty = LinearArgs {
            x: null,
            w: null,
            y: null,
            m: 0,
            ..base
        };
        assert!(!ok(plan(empty)).unwrap());
        let bad = [
            LinearArgs { k: 0, ..base }, // K 0
            LinearArgs {
                x: Operand::matrix(0x10, 7), // ldx < K
                ..base
            },
            LinearArgs {
                w: Operand::matrix(0x20, 7), // ldw < K
                ..base
            },
            LinearArgs {
                y: Operand::matrix(0x30, 7), // ldy < N
                ..base
            },
            LinearArgs {
                x: Operand::matrix(0, 8), // null X
                ..base
            },
            LinearArgs {
                x: Operand::matrix(0x11, 8), // odd X
                ..base
            },
            LinearArgs {
                y: Operand::matrix(0x32, 8), // f32 Y not 4-aligned
                y_f32: true,
                ..base
            },
            LinearArgs {
                // outputs overlap
                x: Operand::batched(0x10, 16, 8),
                w: Operand::batched(0x20, 8, 64),
                y: Operand::batched(0x30, 16, 4),
                batch: 2,
                ..base
            },
            LinearArgs {
                x: Operand::matrix(0x10, 1 << 31), // ldx > i32
                ..base
            },
        ];
        for (i, a) in bad.into_iter().enumerate() {
            let r = plan(a);
            assert!(matches!(r, Err(CudaError::Invalid(_))), "case {i}: {r:?}");
        }
        // stacked batches and shared weights (stride 0) are fine
        assert!(ok(plan(LinearArgs {
            x: Operand::batched(0x10, 8, 16),
            y: Operand::batched(0x30, 8, 16),
            batch: 3,
            ..base
        }))
        .unwrap());
    }

    /// cuBLAS's column-major semantics, C = op(A) op(B) per batch entry, on host arrays.
    fn emulate(g: &Gemm, a: &[f64], b: &[f64], c: &mut [f64]) {
        let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
        let (lda, ldb, ldc) = (g.lda as usize, g.ldb as usize, g.ldc as usize);
        for p in 0..g.batch as usize {
            let (pa, pb, pc) = (
                p * g.stride_a as usize,
                p * g.stride_b as usize,
                p * g.stride_c as usize,
            );
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0;
                    for l in 0..k {
                        let av = match g.transa {
                            CUBLAS_OP_N => a[pa + i + l * lda],
                            _ => a[pa + l + i * lda],
                        };
                        let bv = match g.transb {
                            CUBLAS_OP_N => b[pb + l + j * ldb],
                            _ => b[pb + j + l * ldb],
                        };
                        acc += av * bv;
                    }
                    c[pc + i + j * ldc] = acc;
                }
            }
        }
    }

    #[test]
    fn column_major_gemm_of_the_plan_is_the_row_major_nt_linear() {
        // (m, n, k, batch, pad): single, padded strides, absorbed-MLA-like side-by-side batches
        for &(m, n, k, batch, pad) in &[
            (1usize, 5usize, 3usize, 1usize, 0usize),
            (7, 9, 6, 1, 3),
            (4, 6, 5, 3, 0),
            (3, 4, 7, 2, 2),
        ] {
            let (ldx, sxz) = (batch * k + pad, k);
            let (ldw, swz) = (k + pad, n * (k + pad));
            let (ldy, syz) = (batch * n + pad, n);
            let val = |i: usize| ((i * 7 + 3) % 11) as f64 - 5.0;
            let x: Vec<f64> = (0..m * ldx).map(val).collect();
            let w: Vec<f64> = (0..batch * swz).map(|i| val(i + 5)).collect();
            // distinct fake addresses tell which host array cuBLAS would read as A and as B
            let (px, pw, py) = (0x100u64, 0x200u64, 0x300u64);
            let g = plan(LinearArgs {
                x: Operand::batched(px, ldx, sxz),
                w: Operand::batched(pw, ldw, swz),
                y: Operand::batched(py, ldy, syz),
                y_f32: false,
                m,
                n,
                k,
                batch,
            })
            .unwrap()
            .unwrap();
            let host = |p: u64| {
                if p == px {
                    &x
                } else {
                    assert_eq!(p, pw);
                    &w
                }
            };
            assert_eq!(g.c, py);
            let mut y = vec![f64::NAN; m * ldy];
            emulate(&g, host(g.a), host(g.b), &mut y);
            for z in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|t| x[i * ldx + z * sxz + t] * w[z * swz + j * ldw + t])
                            .sum();
                        assert_eq!(y[i * ldy + z * syz + j], want, "m{m} n{n} k{k} b{batch}");
                    }
                }
            }
            // nothing written into the row padding
            for i in 0..m {
                assert!(y[i * ldy + batch * n..(i + 1) * ldy]
                    .iter()
                    .all(|v| v.is_nan()));
            }
        }
    }

    #[test]
    fn status_never_panics() {
        match cublas_status() {
            Ok(v) => assert!(v.starts_with("cuBLAS ")),
            Err(e) => assert!(e.contains("libcublas")),
        }
    }
}
