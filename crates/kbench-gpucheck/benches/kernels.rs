//! Criterion benches of the GPU kernels (event-timed via iter_custom), with the ceilings measured
//! in the same run printed first. Without a GPU: prints "skipped: no CUDA device" and exits.
//! KBENCH_BENCH_QUICK=1 runs the short set (what scripts/gpu-check.sh uses).
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kbench_cuda::CudaDevice;
use kbench_gpucheck::bench;
use std::time::Duration;

fn kernels(c: &mut Criterion) {
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    match bench::copy_bandwidth(&dev) {
        Ok(g) => println!("ceiling: device-to-device copy {g:.0} GB/s"),
        Err(e) => println!("copy ceiling failed: {e}"),
    }
    match bench::cublas_bf16_tflops(&dev, 8192) {
        Ok(t) => println!("ceiling: cuBLAS bf16 8192^3 {t:.0} TFLOP/s"),
        Err(e) => println!("cuBLAS ceiling unavailable: {e}"),
    }
    let quick = std::env::var("KBENCH_BENCH_QUICK").is_ok_and(|v| v == "1");
    let cases = match bench::kernel_cases(&dev, quick) {
        Ok(c) => c,
        Err(e) => {
            println!("bench setup failed: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("gpu");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(10);
    for mut case in cases {
        g.throughput(Throughput::Bytes(case.bytes as u64));
        let name = case.name.clone();
        if let Some(r) = case.ref_ms {
            println!("{name}: SGLang reference {r:.4} ms ({})", case.ref_name);
        }
        g.bench_function(&name, |b| {
            b.iter_custom(|iters| {
                let ms = dev.time_ms(1, || {
                    for _ in 0..iters {
                        (case.run)()?;
                    }
                    Ok(())
                });
                Duration::from_secs_f64(ms.unwrap_or(f64::NAN) * 1e-3)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
