//! NVRTC compiles every kernel (no GPU needed). Without the NVRTC wheels the test cannot
//! run, so it is ignored and says why; `.ci/run` installs the wheels and runs it with
//! `--ignored nvrtc_`, where a missing NVRTC fails it.

#[test]
#[ignore = "needs the NVRTC wheels (pip install -r scripts/cuda-wheels.txt; .ci/run runs it with --ignored nvrtc_)"]
fn nvrtc_compiles_every_kernel() {
    if let Err(e) = kbench_cuda::nvrtc_info() {
        panic!("asked to compile the kernels, but {e}");
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
