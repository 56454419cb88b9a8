//! Every kernel against the CPU reference on the GPU. Without a driver / GPU: "skipped: no CUDA
//! device" and pass; a test whose optional library (cuBLAS) is missing reports "skip" and passes.
//! Run with --release (the references are slow unoptimised).

#[test]
fn gpu_kernels_match_cpu_reference() {
    let dev = match kbench_cuda::CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let filter = std::env::var("KBENCH_GPU_TEST").unwrap_or_default();
    let res = kbench_cuda::selftest::run(&dev, &filter, 1);
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
