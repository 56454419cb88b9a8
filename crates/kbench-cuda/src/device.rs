//! The CUDA device: context, one stream, kernel modules (NVRTC -> CUBIN, cached), buffers,
//! raw kernel launches, event timing, CUDA graph capture.

use crate::error::{driver, CudaError, Result};
use crate::kernels::KernelFile;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// True when the CUDA driver library (libcuda.so) can be loaded. Never panics.
pub fn driver_present() -> bool {
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Number of CUDA devices (0 without a driver).
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// A device buffer of `len` elements of `T`.
pub struct DBuf<T> {
    pub(crate) s: CudaSlice<T>,
    stream: Arc<CudaStream>,
}

impl<T> DBuf<T> {
    pub fn len(&self) -> usize {
        self.s.len()
    }
    pub fn is_empty(&self) -> bool {
        self.s.len() == 0
    }
    /// Raw device address (stays valid while the buffer lives).
    pub fn ptr(&self) -> u64 {
        let (p, _g) = self.s.device_ptr(&self.stream);
        p
    }
    /// Address of element `i` (no bounds check beyond debug assertion).
    pub fn ptr_at(&self, i: usize) -> u64 {
        debug_assert!(i <= self.len());
        self.ptr() + (i * std::mem::size_of::<T>()) as u64
    }
    pub fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
}

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}
impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::I32(v)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Self {
        Arg::F32(v)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::I64(v)
    }
}
impl<T> From<&DBuf<T>> for Arg {
    fn from(b: &DBuf<T>) -> Self {
        Arg::Ptr(b.ptr())
    }
}

/// A CUDA device with one stream. All work is ordered on that stream.
pub struct CudaDevice {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub ordinal: usize,
    pub name: String,
    pub cc: (i32, i32),
    pub sm_count: usize,
    pub max_smem_optin: usize,
    pub l2_bytes: usize,
    pub total_mem: usize,
    pub driver_version: i32,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    funcs: Mutex<HashMap<String, CudaFunction>>,
}

impl CudaDevice {
    /// Open device `ordinal`. Returns `CudaError::NoDriver` ("no CUDA driver found (libcuda.so)")
    /// where the driver library is absent, `NoDevice` where there is no such GPU.
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        let n = CudaContext::device_count().map_err(|source| CudaError::Driver {
            call: "cuInit/cuDeviceGetCount".into(),
            source,
        })?;
        if ordinal >= n.max(0) as usize {
            return Err(CudaError::NoDevice(ordinal, n.max(0) as usize));
        }
        let ctx = CudaContext::new(ordinal)?;
        // one stream: no cross-stream event tracking needed
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let cc = ctx.compute_capability()?;
        use sys::CUdevice_attribute as A;
        let sm_count = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let max_smem_optin =
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        let l2_bytes = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
        let total_mem = ctx.total_mem()?;
        let mut driver_version = 0;
        unsafe { sys::cuDriverGetVersion(&mut driver_version) };
        Ok(CudaDevice {
            name: ctx.name()?,
            ctx,
            stream,
            ordinal,
            cc,
            sm_count,
            max_smem_optin,
            l2_bytes,
            total_mem,
            driver_version,
            modules: Mutex::new(HashMap::new()),
            funcs: Mutex::new(HashMap::new()),
        })
    }

    /// "sm_90" etc.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }

    pub fn module(&self, f: &KernelFile) -> Result<Arc<CudaModule>> {
        if let Some(m) = self.modules.lock().unwrap().get(f.name) {
            return Ok(m.clone());
        }
        let cubin = crate::nvrtc::compile_cached(f, &self.arch())?;
        let m = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.as_ref().clone()))?;
        self.modules.lock().unwrap().insert(f.name, m.clone());
        Ok(m)
    }

    /// Compile (or load from the caches) and load every kernel module now, in parallel.
    pub fn precompile(&self) -> Result<()> {
        let arch = self.arch();
        let res: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = crate::kernels::ALL
                .iter()
                .map(|f| {
                    let arch = arch.clone();
                    s.spawn(move || crate::nvrtc::compile_cached(f, &arch).map(|_| ()))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(CudaError::Internal(
                            "a kernel compile thread panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        for r in res {
            r?;
        }
        for f in crate::kernels::ALL {
            self.module(f)?;
        }
        Ok(())
    }

    /// A kernel function; `dyn_smem` > 48 KB raises the function's dynamic shared-memory limit.
    pub fn func(&self, f: &KernelFile, name: &str, dyn_smem: usize) -> Result<CudaFunction> {
        let key = format!("{}::{name}::{dyn_smem}", f.name);
        if let Some(x) = self.funcs.lock().unwrap().get(&key) {
            return Ok(x.clone());
        }
        let m = self.module(f)?;
        let func = m.load_function(name)?;
        if dyn_smem > 48 * 1024 {
            if dyn_smem > self.max_smem_optin {
                return Err(CudaError::Invalid(format!(
                    "{name} needs {dyn_smem} B of shared memory, device allows {}",
                    self.max_smem_optin
                )));
            }
            let r = unsafe {
                sys::cuFuncSetAttribute(
                    func.cu_function(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dyn_smem as i32,
                )
            };
            driver(format!("cuFuncSetAttribute({name}, {dyn_smem})"), r)?;
        }
        self.funcs.lock().unwrap().insert(key, func.clone());
        Ok(func)
    }

    /// Launch `name` from kernel file `f` on the device's stream.
    pub fn launch(
        &self,
        f: &KernelFile,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: usize,
        args: &[Arg],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(()); // nothing to do
        }
        if grid.1 > 65535 || grid.2 > 65535 || block.0 * block.1 * block.2 > 1024 {
            return Err(CudaError::Invalid(format!(
                "{name}: bad launch config grid {grid:?} block {block:?}"
            )));
        }
        self.ctx.bind_to_thread()?;
        let func = self.func(f, name, smem)?;
        let mut store: Vec<[u8; 8]> = args
            .iter()
            .map(|a| {
                let mut b = [0u8; 8];
                match *a {
                    Arg::Ptr(p) => b.copy_from_slice(&p.to_ne_bytes()),
                    Arg::I64(v) => b.copy_from_slice(&v.to_ne_bytes()),
                    Arg::I32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
                    Arg::F32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
                }
                b
            })
            .collect();
        let mut ptrs: Vec<*mut c_void> = store
            .iter_mut()
            .map(|b| b.as_mut_ptr() as *mut c_void)
            .collect();
        unsafe {
            cudarc::driver::result::launch_kernel(
                func.cu_function(),
                grid,
                block,
                smem as u32,
                self.stream.cu_stream(),
                &mut ptrs,
            )
        }
        .map_err(|source| CudaError::Driver {
            call: format!("launch {name} grid {grid:?} block {block:?} smem {smem}"),
            source,
        })?;
        Ok(())
    }

    pub fn alloc<T: DeviceRepr>(&self, n: usize) -> Result<DBuf<T>> {
        let s = unsafe { self.stream.alloc::<T>(n.max(1)) }?;
        Ok(DBuf {
            s,
            stream: self.stream.clone(),
        })
    }
    /// Allocate and fill every byte with 0xFF (NaN for f32/bf16, -1 for ints): poisoned output.
    pub fn alloc_poison<T: DeviceRepr>(&self, n: usize) -> Result<DBuf<T>> {
        let b = self.alloc::<T>(n)?;
        self.fill_bytes(&b, 0xff)?;
        Ok(b)
    }
    pub fn fill_bytes<T>(&self, b: &DBuf<T>, v: u8) -> Result<()> {
        self.ctx.bind_to_thread()?;
        let r = unsafe {
            sys::cuMemsetD8Async(
                b.ptr(),
                v,
                b.s.len() * std::mem::size_of::<T>(),
                self.stream.cu_stream(),
            )
        };
        driver("cuMemsetD8Async", r)
    }
    pub fn upload<T: DeviceRepr>(&self, h: &[T]) -> Result<DBuf<T>> {
        if h.is_empty() {
            return self.alloc(1);
        }
        let s = self.stream.clone_htod(h)?;
        Ok(DBuf {
            s,
            stream: self.stream.clone(),
        })
    }
    pub fn download<T: DeviceRepr + Default + Clone>(&self, b: &DBuf<T>) -> Result<Vec<T>> {
        Ok(self.stream.clone_dtoh(&b.s)?)
    }
    /// Device-to-device copy of `bytes` bytes.
    pub fn copy_d2d(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.ctx.bind_to_thread()?;
        let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream.cu_stream()) };
        driver("cuMemcpyDtoDAsync", r)
    }
    /// Fill `n` 32-bit words at `ptr` with `word` (weights for timing runs).
    pub fn fill_u32(&self, ptr: u64, word: u32, n: usize) -> Result<()> {
        self.ctx.bind_to_thread()?;
        let r = unsafe { sys::cuMemsetD32Async(ptr, word, n, self.stream.cu_stream()) };
        driver("cuMemsetD32Async", r)
    }
    /// Strided 2-D device copy: `height` rows of `width_bytes`.
    pub fn copy2d(
        &self,
        src: u64,
        src_pitch: usize,
        dst: u64,
        dst_pitch: usize,
        width_bytes: usize,
        height: usize,
    ) -> Result<()> {
        self.ctx.bind_to_thread()?;
        let c = copy2d_descriptor(src, src_pitch, dst, dst_pitch, width_bytes, height);
        let r = unsafe { sys::cuMemcpy2DAsync_v2(&c, self.stream.cu_stream()) };
        driver("cuMemcpy2DAsync", r)
    }
    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }
    pub fn sync(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// Time `f` (already warmed up by the caller or not) with CUDA events: median of `reps`
    /// single runs, in milliseconds.
    pub fn time_ms(&self, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let a = self.ctx.new_event(flags)?;
        let b = self.ctx.new_event(flags)?;
        let mut v = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            a.record(&self.stream)?;
            f()?;
            b.record(&self.stream)?;
            b.synchronize()?;
            v.push(a.elapsed_ms(&b)? as f64);
        }
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
        Ok(v[v.len() / 2])
    }

    /// Capture everything `f` enqueues on the stream into a CUDA graph.
    pub fn capture(&self, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let r = f();
        let g = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        r?;
        match g? {
            Some(graph) => Ok(Graph { graph }),
            None => Err(CudaError::Internal(
                "stream capture produced no graph".into(),
            )),
        }
    }
}

/// A captured, instantiated CUDA graph (e.g. one per decode / verify batch bucket).
pub struct Graph {
    graph: cudarc::driver::CudaGraph,
}
impl Graph {
    pub fn launch(&self) -> Result<()> {
        Ok(self.graph.launch()?)
    }
}

/// Captured graphs per batch bucket (decode: batch size; verify: tokens), replayed when the
/// batch fits a bucket (the smallest bucket >= the batch; the caller pads inputs).
#[derive(Default)]
pub struct GraphCache {
    graphs: std::collections::BTreeMap<usize, Graph>,
}
impl GraphCache {
    pub fn insert(&mut self, bucket: usize, g: Graph) {
        self.graphs.insert(bucket, g);
    }
    /// The smallest captured bucket holding `n`.
    pub fn bucket_for(&self, n: usize) -> Option<usize> {
        self.graphs.range(n..).next().map(|(k, _)| *k)
    }
    pub fn launch(&self, bucket: usize) -> Result<bool> {
        match self.graphs.get(&bucket) {
            Some(g) => {
                g.launch()?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
    pub fn len(&self) -> usize {
        self.graphs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.graphs.is_empty()
    }
}

/// The descriptor of a device-to-device 2-D copy, written out field by field: the struct holds
/// `CUmemorytype`, an enum with no zero value, so `mem::zeroed()` of it is undefined behaviour,
/// which Rust turns into an abort at run time (seen on the first H200 run).
pub(crate) fn copy2d_descriptor(
    src: u64,
    src_pitch: usize,
    dst: u64,
    dst_pitch: usize,
    width_bytes: usize,
    height: usize,
) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width_bytes,
        Height: height,
    }
}

#[cfg(test)]
mod copy2d_tests {
    use super::*;

    #[test]
    fn copy2d_descriptor_is_built_without_a_gpu() {
        let c = copy2d_descriptor(0x1000, 256, 0x9000, 512, 128, 7);
        assert_eq!(c.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(c.dstMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(
            (c.srcDevice, c.srcPitch, c.dstDevice, c.dstPitch),
            (0x1000, 256, 0x9000, 512)
        );
        assert_eq!(
            (c.WidthInBytes, c.Height, c.srcXInBytes, c.dstY),
            (128, 7, 0, 0)
        );
        assert!(c.srcHost.is_null() && c.dstArray.is_null());
    }
}
