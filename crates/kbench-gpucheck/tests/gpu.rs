//! Every kernel against the CPU reference on the GPU. Ignored unless asked for
//! (`--include-ignored`); asked for without a GPU it fails. A kernel whose optional library
//! (cuBLAS) is missing reports "skip".
//! Run with --release (the references are slow unoptimised).

#[test]
#[ignore = "needs a CUDA GPU (run it with --include-ignored on one)"]
fn gpu_kernels_match_cpu_reference() {
    // run on purpose where there is no GPU, it fails: it would have checked nothing
    let dev = kbench_cuda::CudaDevice::new(0).expect("a CUDA device (this test needs a GPU)");
    let filter = std::env::var("KBENCH_GPU_TEST").unwrap_or_default();
    let res = kbench_gpucheck::selftest::run(&dev, &filter, 1);
    let mut bad = 0;
    for r in &res {
        eprintln!(
            "{:<20} {:<4} {:>8.0} ms  {}",
            r.name,
            r.status(),
            r.millis,
            r.detail
        );
        bad += (!r.ok) as usize;
    }
    assert_eq!(bad, 0, "{bad} GPU tests failed");
}
