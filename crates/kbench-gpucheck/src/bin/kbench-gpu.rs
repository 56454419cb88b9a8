//! kbench-gpu: the GPU check driver used by scripts/gpu-check.sh.
//!   kbench-gpu info
//!   kbench-gpu check [--arch sm_90,sm_120]
//!   kbench-gpu selftest [FILTER | =NAME] [--seed N] [--isolate]
//!   kbench-gpu bench [--quick]
//!   kbench-gpu stack [--layers 3] [--context 2048] [--batches 1,2,4,8,16,32,64] [--reps 10] [--profile FILE]
//! Exit status: 0 ok, 1 failures, 2 usage, 3 skipped (no CUDA device: nothing was checked).
use kbench_core::error_chain::Chain;
use kbench_cuda::{check_kernels, device, CudaDevice, CudaError};
use kbench_gpucheck::{bench, selftest};
use std::process::ExitCode;

/// A check that needs a GPU found none: not a pass (it checked nothing), not a failure.
const SKIPPED: u8 = 3;

fn arg_val(args: &[String], key: &str) -> Option<String> {
    args.iter()
        .position(|a| a == key)
        .and_then(|i| args.get(i + 1).cloned())
}

fn open_dev() -> Result<CudaDevice, ExitCode> {
    match CudaDevice::new(0) {
        Ok(d) => {
            let t0 = std::time::Instant::now();
            if let Err(e) = d.precompile() {
                println!("error: kernel compile/load failed: {}", Chain(&e));
                return Err(ExitCode::from(1));
            }
            println!(
                "kernels compiled/loaded for {} in {:.1} s",
                d.arch(),
                t0.elapsed().as_secs_f64()
            );
            println!("device: {} (sm_{}{}, {} SMs, {:.1} GiB, max smem/block {} B, L2 {} MB, driver CUDA {})",
                d.name, d.cc.0, d.cc.1, d.sm_count, d.total_mem as f64 / (1u64 << 30) as f64, d.max_smem_optin, d.l2_bytes >> 20, d.driver_version);
            Ok(d)
        }
        Err(e @ (CudaError::NoDriver | CudaError::NoDevice(..))) => {
            println!("skipped: no CUDA device ({e})");
            Err(ExitCode::from(SKIPPED))
        }
        Err(e) => {
            println!("error: {}", Chain(&e));
            Err(ExitCode::from(1))
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map(|s| s.as_str()).unwrap_or("help");
    match cmd {
        "info" => {
            match kbench_cuda::nvrtc_info() {
                Ok(s) => println!("{s}"),
                Err(e) => println!("NVRTC: {e}"),
            }
            println!(
                "driver library present: {}; devices: {}",
                device::driver_present(),
                device::device_count()
            );
            println!(
                "NCCL library present: {}",
                kbench_cuda::comm::nccl_present()
            );
            match kbench_cuda::blas::cublas_status() {
                Ok(v) => println!("cuBLAS library present: true ({v})"),
                Err(e) => println!("cuBLAS library present: false ({e})"),
            }
            ExitCode::SUCCESS
        }
        "check" => {
            let archs = arg_val(&args, "--arch").unwrap_or_else(|| "sm_90,sm_120".into());
            let archs: Vec<&str> = archs.split(',').filter(|s| !s.is_empty()).collect();
            match kbench_cuda::nvrtc_info() {
                Ok(s) => println!("{s}"),
                Err(e) => println!("NVRTC: {e}"),
            }
            let res = check_kernels(&archs);
            let mut bad = 0;
            for r in &res {
                println!(
                    "{:<8} {:<18} {:<4} {:>8.0} ms",
                    r.arch,
                    r.file,
                    if r.ok { "ok" } else { "FAIL" },
                    r.millis
                );
                if !r.ok {
                    bad += 1;
                    println!("{}", r.log);
                }
            }
            println!(
                "{} of {} kernel compilations ok",
                res.len() - bad,
                res.len()
            );
            if bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        "selftest" if args.iter().any(|a| a == "--isolate") => {
            // one process per test: a sticky device error (e.g. an illegal address) in one test
            // cannot fail the others
            if let Err(c) = open_dev() {
                return c;
            }
            let exe = std::env::current_exe().expect("current exe");
            let seed = arg_val(&args, "--seed").unwrap_or_else(|| "1".into());
            let mut bad = 0;
            for (name, _) in selftest::TESTS {
                let out = std::process::Command::new(&exe)
                    .args(["selftest", &format!("={name}"), "--seed", &seed])
                    .output();
                match out {
                    Ok(o) => {
                        let text = String::from_utf8_lossy(&o.stdout);
                        let line = text
                            .lines()
                            .find(|l| l.starts_with(name))
                            .map(|l| l.to_string());
                        match line {
                            Some(l) => println!("{l}"),
                            None => println!(
                                "{name:<20} FAIL  (no result; exit {:?}) {}",
                                o.status.code(),
                                text.lines().last().unwrap_or("")
                            ),
                        }
                        if !o.status.success() {
                            bad += 1;
                            let err = String::from_utf8_lossy(&o.stderr);
                            if !err.trim().is_empty() {
                                println!(
                                    "  stderr: {}",
                                    err.trim().lines().take(5).collect::<Vec<_>>().join(" | ")
                                );
                            }
                        }
                    }
                    Err(e) => {
                        bad += 1;
                        println!("{name:<20} FAIL  could not start: {}", Chain(&e));
                    }
                }
            }
            println!(
                "{} of {} GPU tests passed (isolated)",
                selftest::TESTS.len() - bad,
                selftest::TESTS.len()
            );
            if bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        "selftest" => {
            let filter = args
                .get(1)
                .filter(|a| !a.starts_with("--"))
                .cloned()
                .unwrap_or_default();
            let seed = arg_val(&args, "--seed")
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            let dev = match open_dev() {
                Ok(d) => d,
                Err(c) => return c,
            };
            let res = selftest::run(&dev, &filter, seed);
            let mut bad = 0;
            for r in &res {
                println!(
                    "{:<20} {:<4} {:>8.0} ms  {}",
                    r.name,
                    r.status(),
                    r.millis,
                    r.detail
                );
                bad += (!r.ok) as usize;
            }
            let skipped = res.iter().filter(|r| r.skipped).count();
            println!(
                "{} of {} GPU tests passed ({skipped} skipped)",
                res.len() - bad,
                res.len()
            );
            if bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        "bench" => {
            let dev = match open_dev() {
                Ok(d) => d,
                Err(c) => return c,
            };
            match bench::kernel_table(&dev, args.iter().any(|a| a == "--quick")) {
                Ok((s, _)) => {
                    print!("{s}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    println!("bench failed: {}", Chain(&e));
                    ExitCode::from(1)
                }
            }
        }
        "stack" => {
            let dev = match open_dev() {
                Ok(d) => d,
                Err(c) => return c,
            };
            let layers = arg_val(&args, "--layers")
                .and_then(|s| s.parse().ok())
                .unwrap_or(3);
            let context = arg_val(&args, "--context")
                .and_then(|s| s.parse().ok())
                .unwrap_or(2048);
            let reps = arg_val(&args, "--reps")
                .and_then(|s| s.parse().ok())
                .unwrap_or(10);
            let batches: Vec<usize> = arg_val(&args, "--batches")
                .unwrap_or_else(|| "1,2,4,8,16,32,64".into())
                .split(',')
                .filter_map(|s| s.parse().ok())
                .collect();
            match bench::layer_stack(&dev, layers, context, &batches, reps) {
                Ok((table, _, toml)) => {
                    if let Some(p) = arg_val(&args, "--profile") {
                        if let Err(e) = std::fs::write(&p, &toml) {
                            println!("could not write {p}: {e}");
                        } else {
                            println!("profile written to {p}");
                        }
                    }
                    print!("{table}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    println!("stack failed: {}", Chain(&e));
                    ExitCode::from(1)
                }
            }
        }
        _ => {
            println!("usage: kbench-gpu info | check [--arch sm_90,sm_120] | selftest [FILTER] [--seed N] | bench [--quick] | stack [--layers N] [--context N] [--batches LIST] [--reps N] [--profile FILE]");
            ExitCode::from(2)
        }
    }
}
