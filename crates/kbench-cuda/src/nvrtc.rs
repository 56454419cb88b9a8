//! NVRTC: finding the library and the CUDA headers, compiling kernels to CUBIN, caching.
//!
//! NVRTC is loaded by absolute path through our own `dlopen` (libloading), so it works from a
//! pip wheel directory that is not on the loader's search path. Search order for the library:
//! `KBENCH_NVRTC_LIB` (a file or a directory), the Python site-packages of this machine
//! (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib`), `/usr/local/cuda*/lib64` (and `targets/*/lib`),
//! `LD_LIBRARY_PATH`, the system library directories. Headers (`cuda_bf16.h`):
//! `KBENCH_CUDA_INCLUDE`, `<nvrtc lib dir>/../include`, site-packages `nvidia/cu13/include`,
//! `nvidia/cuda_runtime/include`, `/usr/local/cuda*/include`.

use crate::error::{CudaError, Result};
use crate::kernels::{KernelFile, HEADERS};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

type NvrtcProgram = *mut std::ffi::c_void;
type FCreate = unsafe extern "C" fn(
    *mut NvrtcProgram,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type FCompile = unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> c_int;
type FSize = unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int;
type FGet = unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int;
type FDestroy = unsafe extern "C" fn(*mut NvrtcProgram) -> c_int;
type FVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// A loaded NVRTC library and the header directory found beside it.
pub struct Nvrtc {
    _lib: libloading::Library,
    pub lib_path: PathBuf,
    pub include_dir: Option<PathBuf>,
    pub version: (i32, i32),
    create: FCreate,
    compile: FCompile,
    log_size: FSize,
    log: FGet,
    cubin_size: FSize,
    cubin: FGet,
    destroy: FDestroy,
}

unsafe impl Send for Nvrtc {}
unsafe impl Sync for Nvrtc {}

fn python_site_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Ok(v) = std::env::var(var) {
            roots.push(PathBuf::from(v).join("lib"));
        }
    }
    if let Ok(home) = std::env::var("HOME") {
        roots.push(PathBuf::from(&home).join(".local/lib"));
        if let Ok(rd) = std::fs::read_dir(PathBuf::from(&home).join(".pyenv/versions")) {
            for e in rd.flatten() {
                roots.push(e.path().join("lib"));
            }
        }
    }
    for r in ["/usr/lib", "/usr/local/lib", "/usr/lib64", "/opt/conda/lib"] {
        roots.push(PathBuf::from(r));
    }
    // /opt/*/.venv/lib and /opt/*/lib (e.g. the GPU image's /opt/torch/.venv)
    if let Ok(rd) = std::fs::read_dir("/opt") {
        for e in rd.flatten() {
            roots.push(e.path().join(".venv/lib"));
            roots.push(e.path().join("venv/lib"));
            roots.push(e.path().join("lib"));
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = std::env::var("KBENCH_PYTHON_SITE") {
        out.push(PathBuf::from(v));
    }
    for root in roots {
        if let Ok(rd) = std::fs::read_dir(&root) {
            let mut py: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("python3"))
                })
                .collect();
            py.sort();
            py.reverse();
            for p in py {
                out.push(p.join("site-packages"));
                out.push(p.join("dist-packages"));
            }
        }
    }
    out.retain(|p| p.is_dir());
    out
}

fn cuda_toolkit_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(p) = std::env::var("CUDA_HOME").or_else(|_| std::env::var("CUDA_PATH")) {
        v.push(PathBuf::from(p));
    }
    v.push(PathBuf::from("/usr/local/cuda"));
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut c: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("cuda-"))
            })
            .collect();
        c.sort();
        c.reverse();
        v.extend(c);
    }
    v
}

const NVRTC_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Candidate library directories, in search order (also used for cuBLAS / NCCL).
pub fn library_dirs(sub: &[&str]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for sp in python_site_dirs() {
        for s in sub {
            dirs.push(sp.join("nvidia").join(s).join("lib"));
        }
    }
    for tk in cuda_toolkit_dirs() {
        dirs.push(tk.join("lib64"));
        dirs.push(tk.join("targets/x86_64-linux/lib"));
        dirs.push(tk.join("targets/sbsa-linux/lib"));
    }
    if let Ok(lp) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(lp.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs.retain(|d| d.is_dir());
    dirs
}

/// Every NVRTC library this machine has, in preference order.
pub fn nvrtc_candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(p) = std::env::var("KBENCH_NVRTC_LIB") {
        let p = PathBuf::from(p);
        if p.is_dir() {
            for n in NVRTC_NAMES {
                out.push(p.join(n));
            }
        } else {
            out.push(p);
        }
    }
    for d in library_dirs(&["cu13", "cuda_nvrtc", "cu12"]) {
        for n in NVRTC_NAMES {
            out.push(d.join(n));
        }
    }
    out.retain(|p| p.is_file());
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(p.canonicalize().unwrap_or(p.clone())));
    out
}

fn has_bf16(dir: &Path) -> bool {
    dir.join("cuda_bf16.h").is_file()
}

/// The directory holding `cuda_bf16.h` for NVRTC, given the NVRTC library path.
pub fn find_cuda_include(nvrtc_lib: Option<&Path>) -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KBENCH_CUDA_INCLUDE") {
        return Some(PathBuf::from(p));
    }
    let mut c = Vec::new();
    if let Some(l) = nvrtc_lib.and_then(|p| p.parent()) {
        c.push(l.join("../include"));
    }
    for sp in python_site_dirs() {
        for s in ["cu13", "cuda_runtime", "cuda_nvrtc", "cu12"] {
            c.push(sp.join("nvidia").join(s).join("include"));
        }
    }
    for tk in cuda_toolkit_dirs() {
        c.push(tk.join("include"));
        c.push(tk.join("targets/x86_64-linux/include"));
    }
    c.into_iter()
        .find(|d| has_bf16(d))
        .map(|d| d.canonicalize().unwrap_or(d))
}

unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &[u8]) -> std::result::Result<T, String> {
    lib.get::<T>(name).map(|s| *s).map_err(|e| format!("{e}"))
}

impl Nvrtc {
    fn open(path: &Path) -> std::result::Result<Nvrtc, String> {
        unsafe {
            let lib =
                libloading::Library::new(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let version_fn: FVersion = sym(&lib, b"nvrtcVersion\0")?;
            let (mut ma, mut mi) = (0, 0);
            version_fn(&mut ma, &mut mi);
            Ok(Nvrtc {
                create: sym(&lib, b"nvrtcCreateProgram\0")?,
                compile: sym(&lib, b"nvrtcCompileProgram\0")?,
                log_size: sym(&lib, b"nvrtcGetProgramLogSize\0")?,
                log: sym(&lib, b"nvrtcGetProgramLog\0")?,
                cubin_size: sym(&lib, b"nvrtcGetCUBINSize\0")?,
                cubin: sym(&lib, b"nvrtcGetCUBIN\0")?,
                destroy: sym(&lib, b"nvrtcDestroyProgram\0")?,
                include_dir: find_cuda_include(Some(path)),
                lib_path: path.to_path_buf(),
                version: (ma, mi),
                _lib: lib,
            })
        }
    }

    /// The process-wide NVRTC (first candidate that loads).
    pub fn get() -> Result<&'static Nvrtc> {
        static N: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
        N.get_or_init(|| {
            let cands = nvrtc_candidates();
            let mut errs = Vec::new();
            for c in &cands {
                match Nvrtc::open(c) {
                    Ok(n) => return Ok(n),
                    Err(e) => errs.push(e),
                }
            }
            Err(format!(
                "no libnvrtc found (set KBENCH_NVRTC_LIB, or `pip install nvidia-cuda-nvrtc nvidia-cuda-runtime`); tried {} candidates {:?}",
                cands.len(),
                errs
            ))
        })
        .as_ref()
        .map_err(|e| CudaError::NoNvrtc(e.clone()))
    }

    /// Compile options used for every kernel.
    pub fn options(&self, arch: &str) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
            "-lineinfo".to_string(),
        ];
        if let Some(i) = &self.include_dir {
            o.push(format!("-I{}", i.display()));
        }
        o
    }

    /// Compile one kernel file to a CUBIN for `arch` (e.g. "sm_90"). Err carries the log.
    pub fn compile(
        &self,
        file: &KernelFile,
        arch: &str,
    ) -> std::result::Result<(Vec<u8>, String), String> {
        let src = CString::new(file.source).map_err(|e| e.to_string())?;
        let name = CString::new(file.name).unwrap();
        let hsrc: Vec<CString> = HEADERS
            .iter()
            .map(|(_, s)| CString::new(*s).unwrap())
            .collect();
        let hname: Vec<CString> = HEADERS
            .iter()
            .map(|(n, _)| CString::new(*n).unwrap())
            .collect();
        let hsp: Vec<*const c_char> = hsrc.iter().map(|s| s.as_ptr()).collect();
        let hnp: Vec<*const c_char> = hname.iter().map(|s| s.as_ptr()).collect();
        let opts: Vec<CString> = self
            .options(arch)
            .into_iter()
            .map(|s| CString::new(s).unwrap())
            .collect();
        let op: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
        unsafe {
            let mut prog: NvrtcProgram = std::ptr::null_mut();
            let r = (self.create)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                hsp.len() as c_int,
                hsp.as_ptr(),
                hnp.as_ptr(),
            );
            if r != 0 {
                return Err(format!("nvrtcCreateProgram failed ({r})"));
            }
            let rc = (self.compile)(prog, op.len() as c_int, op.as_ptr());
            let mut n = 0usize;
            (self.log_size)(prog, &mut n);
            let mut buf = vec![0u8; n.max(1)];
            (self.log)(prog, buf.as_mut_ptr() as *mut c_char);
            let log = String::from_utf8_lossy(&buf)
                .trim_end_matches('\0')
                .trim()
                .to_string();
            if rc != 0 {
                (self.destroy)(&mut prog);
                return Err(if log.is_empty() {
                    format!("nvrtcCompileProgram failed ({rc})")
                } else {
                    log
                });
            }
            let mut cn = 0usize;
            (self.cubin_size)(prog, &mut cn);
            let mut cubin = vec![0u8; cn];
            let r2 = (self.cubin)(prog, cubin.as_mut_ptr() as *mut c_char);
            (self.destroy)(&mut prog);
            if r2 != 0 || cn == 0 {
                return Err(format!("nvrtcGetCUBIN failed ({r2})"));
            }
            Ok((cubin, log))
        }
    }
}

fn fnv64(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = seed;
    for p in parts {
        for b in p.iter().chain(&[0xffu8]) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// Cache key: hash of source, headers, arch, options and NVRTC version.
pub fn cache_key(n: &Nvrtc, file: &KernelFile, arch: &str) -> String {
    let ver = format!("{}.{}", n.version.0, n.version.1);
    let opts = n.options(arch).join(" ");
    let mut parts: Vec<&[u8]> = vec![
        file.name.as_bytes(),
        file.source.as_bytes(),
        arch.as_bytes(),
        opts.as_bytes(),
        ver.as_bytes(),
    ];
    for (hn, hs) in HEADERS {
        parts.push(hn.as_bytes());
        parts.push(hs.as_bytes());
    }
    let a = fnv64(0xcbf29ce484222325, &parts);
    let b = fnv64(0x84222325cbf29ce4, &parts);
    format!(
        "{}-{}-{a:016x}{b:016x}",
        file.name.trim_end_matches(".cu"),
        arch
    )
}

/// On-disk cache directory: `KBENCH_KERNEL_CACHE`, else `$XDG_CACHE_HOME/kbench/kernels`,
/// else `~/.cache/kbench/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KBENCH_KERNEL_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Ok(p) = std::env::var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(p).join("kbench/kernels"));
    }
    std::env::var("HOME")
        .ok()
        .map(|h| PathBuf::from(h).join(".cache/kbench/kernels"))
}

/// Compile with the in-memory and on-disk caches. Disk-cache failures are ignored.
pub fn compile_cached(file: &KernelFile, arch: &str) -> Result<Arc<Vec<u8>>> {
    static MEM: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();
    let n = Nvrtc::get()?;
    let key = cache_key(n, file, arch);
    let mem = MEM.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(c) = mem.lock().unwrap().get(&key) {
        return Ok(c.clone());
    }
    let path = cache_dir().map(|d| d.join(format!("{key}.cubin")));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                let a = Arc::new(bytes);
                mem.lock().unwrap().insert(key, a.clone());
                return Ok(a);
            }
        }
    }
    let (cubin, _log) = n.compile(file, arch).map_err(|log| CudaError::Compile {
        file: file.name.to_string(),
        arch: arch.to_string(),
        log,
    })?;
    if let Some(p) = &path {
        if let Some(d) = p.parent() {
            let _ = std::fs::create_dir_all(d);
            let tmp = p.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, &cubin).is_ok() {
                let _ = std::fs::rename(&tmp, p);
            }
        }
    }
    let a = Arc::new(cubin);
    mem.lock().unwrap().insert(key, a.clone());
    Ok(a)
}
