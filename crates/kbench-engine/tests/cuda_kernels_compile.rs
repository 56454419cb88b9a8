//! The engine's own CUDA kernels (`src/cuda/engine_f32.cu`) compile through NVRTC. Needs no
//! GPU, but the NVRTC wheels: ignored without them; `.ci/run` runs it with `--ignored nvrtc_`.

#[test]
#[ignore = "needs the NVRTC wheels (pip install -r scripts/cuda-wheels.txt; .ci/run runs it with --ignored nvrtc_)"]
fn nvrtc_compiles_the_engine_kernels() {
    let n = kbench_cuda::nvrtc::Nvrtc::get()
        .unwrap_or_else(|e| panic!("asked to compile the engine's kernels, but NVRTC: {e}"));
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
