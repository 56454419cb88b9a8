//! The engine's own CUDA kernels (`src/cuda/engine_f32.cu`) compile through NVRTC. Needs no GPU;
//! skips when NVRTC is not installed (set KBENCH_REQUIRE_NVRTC=1 to make that a failure).

#[test]
fn engine_kernels_compile_with_nvrtc() {
    let n = match kbench_cuda::nvrtc::Nvrtc::get() {
        Ok(n) => n,
        Err(e) => {
            if std::env::var("KBENCH_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("NVRTC required but not found: {e}");
            }
            eprintln!("skipped: NVRTC not available ({e})");
            return;
        }
    };
    for arch in ["sm_90", "sm_120"] {
        match n.compile(&kbench_engine::cuda::ops::ENGINE_F32, arch) {
            Ok((cubin, log)) => {
                assert!(!cubin.is_empty());
                if !log.is_empty() {
                    eprintln!("{arch}: {log}");
                }
            }
            Err(log) => panic!("engine_f32.cu failed to compile for {arch}:\n{log}"),
        }
    }
}
