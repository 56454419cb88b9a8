//! NVRTC compiles every kernel (no GPU needed). Skips (with a message) where libnvrtc is absent,
//! unless KBENCH_REQUIRE_NVRTC=1 (CI sets it after `pip install nvidia-cuda-nvrtc nvidia-cuda-runtime`).

#[test]
fn kernels_compile_with_nvrtc() {
    let required = std::env::var("KBENCH_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if let Err(e) = kbench_cuda::nvrtc_info() {
        assert!(!required, "KBENCH_REQUIRE_NVRTC=1 but {e}");
        eprintln!("skipped: NVRTC not found ({e})");
        return;
    }
    let res = kbench_cuda::check_kernels(&["sm_90", "sm_120"]);
    assert_eq!(res.len(), 2 * kbench_cuda::kernels::ALL.len());
    let bad: Vec<_> = res.iter().filter(|r| !r.ok).collect();
    for r in &bad {
        eprintln!("{} {}: {}", r.arch, r.file, r.log);
    }
    assert!(bad.is_empty(), "{} kernel compilations failed", bad.len());
}

#[test]
fn check_kernels_reports_every_file_even_without_nvrtc() {
    let res = kbench_cuda::check_kernels(&["sm_90"]);
    assert_eq!(res.len(), kbench_cuda::kernels::ALL.len());
    assert!(res.iter().all(|r| r.arch == "sm_90"));
}

#[test]
fn device_constructor_never_panics() {
    match kbench_cuda::CudaDevice::new(0) {
        Ok(d) => eprintln!("device {}", d.name),
        Err(e) => eprintln!("no device: {e}"),
    }
}
