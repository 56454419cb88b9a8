#!/usr/bin/env bash
# scripts/gpu-check.sh: kbench's CUDA path on a GPU machine, in one short run.
#
#   stages: machine facts -> binaries (prebuilt bundle, or cargo build --release) -> NVRTC
#   kernel check (sm_90) -> GPU tests (every kernel vs the CPU reference) -> engine GPU tests
#   (GPU vs CPU path) -> layer stack (decode + verify, profile TOML) -> per-pass calibration
#   of the simulator -> engine_tiny.toml on the GPU -> kernel bench table -> criterion (short).
#   Each stage is timed, logged, and bounded by a timeout; a failed stage is reported and the
#   script goes on. Exit status: 1 when a GPU is present and a GPU test stage (selftest,
#   engine) did not run or did not pass, 0 otherwise. Results (8 files at most, the device
#   tool's limit) go to $OUT if set, else ./gpu-results.
#   It never changes GPU settings (no nvidia-smi -pm/-lgc/-ac/-r ...), only reads them.
#
# Usage:
#   scripts/gpu-check.sh            run everything (total budget KBENCH_GPU_BUDGET_S, default 460 s)
#   scripts/gpu-check.sh --bundle   on a build machine: build release binaries into
#                                   target/gpu-bundle/ (carry that folder to a GPU box without cargo)
# Environment: KBENCH_NVRTC_LIB, KBENCH_CUDA_INCLUDE (override the NVRTC search),
#   KBENCH_GPU_BIN (folder with kbench-gpu and optionally kernels-bench), KBENCH_GPU_BUDGET_S,
#   KBENCH_STACK_LAYERS (3), KBENCH_STACK_CONTEXT (2048), KBENCH_SKIP_CRITERION=1,
#   KBENCH_SKIP_SANITIZER=1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ "${1:-}" == "--bundle" ]]; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
    B="$ROOT/target/gpu-bundle"
    mkdir -p "$B"
    cargo build --release -p kbench-gpucheck --bins
    cargo build --release --bin kbench
    cp "$CARGO_TARGET_DIR/release/kbench-gpu" "$B/kbench-gpu"
    cp "$CARGO_TARGET_DIR/release/kbench" "$B/kbench"
    exe=$(cargo bench -p kbench-gpucheck --bench kernels --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
    if [[ -n "$exe" && -f "$exe" ]]; then cp "$exe" "$B/kernels-bench"; fi
    # the engine's GPU tests (GPU vs CPU reference, token for token), as test binaries
    cargo test --release -p kbench-engine --test cuda_engine --test cuda_tuned --test cuda_backend --no-run 2>&1 |
        sed -n 's/.*Executable tests\/\([a-z_]*\)\.rs (\(.*\)).*/\1 \2/p' |
        while read -r name path; do cp "$path" "$B/engine-$name"; done
    for f in "$B"/*; do strip "$f" 2>/dev/null || true; done
    ls -la "$B"
    echo "bundle ready: carry target/gpu-bundle (run tool: carry [\"target/gpu-bundle\"])"
    exit 0
fi

RES="${OUT:-$ROOT/gpu-results}"
mkdir -p "$RES"
LOG="$RES/gpu-check.log"
: >"$LOG"
BUDGET="${KBENCH_GPU_BUDGET_S:-460}"
T0=$(date +%s)
SUMMARY=()
# each stage's outcome by name: the exit status is derived from the GPU test stages' at the end
declare -A STATUS=()
log() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - T0)); }
remaining() { echo $((BUDGET - $(elapsed))); }

# run_stage NAME MAX_SECONDS RESERVE_SECONDS OUTFILE cmd...   (never fails the script)
run_stage() {
    local name="$1" max="$2" reserve="$3" outfile="$4"
    shift 4
    local left=$(($(remaining) - reserve))
    local lim=$((left < max ? left : max))
    if ((lim < 15)); then
        log "=== [$name] SKIPPED: only ${left}s of the budget left"
        SUMMARY+=("$(printf '%-10s SKIPPED (budget)' "$name")")
        STATUS[$name]="SKIPPED (budget)"
        return 0
    fi
    log "=== [$name] $* (timeout ${lim}s, at +$(elapsed)s)"
    local t1 rc
    t1=$(date +%s.%N)
    set +e
    timeout --kill-after=10 "$lim" "$@" >>"$outfile" 2>&1
    rc=$?
    set -e
    local dt
    dt=$(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
    local status="ok"
    if ((rc == 124 || rc == 137)); then status="TIMEOUT"; elif ((rc != 0)); then status="FAILED(rc=$rc)"; fi
    log "=== [$name] $status in ${dt}s"
    STATUS[$name]="$status"
    SUMMARY+=("$(printf '%-10s %-14s %7ss  -> %s' "$name" "$status" "$dt" "$(basename "$outfile")")")
    return 0
}

# ---------------------------------------------------------------------------------------------
# 1. machine facts (read only)
MACH="$RES/machine.txt"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -a)"
    echo "cpus: $(nproc)"
    free -g 2>/dev/null | head -2 || true
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,persistence_mode,compute_mode,mig.mode.current --format=csv 2>&1 || true
        echo "--- nvidia-smi -q (summary)"
        nvidia-smi -q 2>&1 | grep -E "Product Name|Driver Version|CUDA Version|Product Architecture|Bus Id|Total|Persistence|Compute Mode|MIG Mode|Current  *:|Max Clocks|  SM  *:|  Memory  *:|Power Limit|Clocks Event|GPU Current Temp|Link Width|PCIe Generation" | head -60 || true
    else
        echo "nvidia-smi: not found"
    fi
    echo "--- toolchain"
    (command -v nvcc >/dev/null && nvcc --version | tail -2) || echo "nvcc: absent (fine: kernels are compiled by NVRTC)"
    (command -v cargo >/dev/null && cargo --version) || echo "cargo: absent"
    (command -v python3 >/dev/null && python3 --version) || echo "python3: absent"
} >"$MACH" 2>&1
log "=== [machine] $(grep -m1 -E '^NVIDIA|^name' "$MACH" || true)"
head -3 "$MACH" | tee -a "$LOG" >/dev/null
KBENCH_DRIVER_VERSION="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
export KBENCH_DRIVER_VERSION

# ---------------------------------------------------------------------------------------------
# 2. CUDA libraries: NVRTC (+ headers), cuBLAS, NCCL: KBENCH_NVRTC_LIB, else the toolkit in
#    /usr/local/cuda*, else Python's nvidia wheels, else a pip install into /tmp.
PYSITES=""
if command -v python3 >/dev/null; then
    PYSITES="$(python3 -c 'import site,sys; print("\n".join(site.getsitepackages()+[site.getusersitepackages()]))' 2>/dev/null || true)"
fi
find_lib() { # name, dirs...
    local n="$1"; shift
    local d
    for d in "$@"; do
        [[ -n "$d" && -f "$d/$n" ]] && { echo "$d/$n"; return 0; }
    done
    return 1
}
LIBDIRS=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64; do [[ -d "$d" ]] && LIBDIRS+=("$d"); done
while read -r sp; do
    [[ -z "$sp" ]] && continue
    for sub in cu13/lib cuda_nvrtc/lib cublas/lib nccl/lib cuda_runtime/lib; do
        [[ -d "$sp/nvidia/$sub" ]] && LIBDIRS+=("$sp/nvidia/$sub")
    done
done <<<"$PYSITES"
nvrtc_lib=""
if [[ -n "${KBENCH_NVRTC_LIB:-}" ]]; then nvrtc_lib="$KBENCH_NVRTC_LIB"; fi
if [[ -z "$nvrtc_lib" ]]; then nvrtc_lib="$(find_lib libnvrtc.so.13 "${LIBDIRS[@]}" || true)"; fi
if [[ -z "$nvrtc_lib" ]] && command -v python3 >/dev/null; then
    log "libnvrtc.so.13 not found; trying pip install nvidia-cuda-nvrtc nvidia-cuda-runtime (may be offline)"
    timeout 90 python3 -m pip install -q --target /tmp/kbench-pip "nvidia-cuda-nvrtc==13.*" "nvidia-cuda-runtime==13.*" >>"$LOG" 2>&1 || log "pip install failed (offline?)"
    for sub in cu13/lib cuda_nvrtc/lib; do [[ -d /tmp/kbench-pip/nvidia/$sub ]] && LIBDIRS+=("/tmp/kbench-pip/nvidia/$sub"); done
    nvrtc_lib="$(find_lib libnvrtc.so.13 "${LIBDIRS[@]}" || true)"
fi
if [[ -n "$nvrtc_lib" ]]; then
    export KBENCH_NVRTC_LIB="$nvrtc_lib"
    if [[ -z "${KBENCH_CUDA_INCLUDE:-}" ]]; then
        for inc in "$(dirname "$nvrtc_lib")/../include" /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include; do
            if [[ -f "$inc/cuda_bf16.h" ]]; then export KBENCH_CUDA_INCLUDE="$(cd "$inc" && pwd)"; break; fi
        done
    fi
    log "NVRTC: $KBENCH_NVRTC_LIB ; headers: ${KBENCH_CUDA_INCLUDE:-<not found>}"
else
    log "NVRTC: NOT FOUND (kernel stages will fail)"
fi
cublas_lib="$(find_lib libcublas.so.13 "${LIBDIRS[@]}" || true)"
nccl_lib="$(find_lib libnccl.so.2 "${LIBDIRS[@]}" || true)"
LDP="/usr/local/nvidia/lib64:/usr/local/nvidia/lib"
[[ -n "$cublas_lib" ]] && LDP="$(dirname "$cublas_lib"):$LDP"
if [[ -n "$nccl_lib" ]]; then
    mkdir -p /tmp/kbench-nccl && ln -sf "$nccl_lib" /tmp/kbench-nccl/libnccl.so
    LDP="$LDP:/tmp/kbench-nccl:$(dirname "$nccl_lib")"
fi
export LD_LIBRARY_PATH="${LDP}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "cuBLAS: ${cublas_lib:-not found (ceiling skipped)} ; NCCL: ${nccl_lib:-not found (single-rank NCCL test skipped)}"
export KBENCH_KERNEL_CACHE="${KBENCH_KERNEL_CACHE:-/tmp/kbench-kernels}"

# ---------------------------------------------------------------------------------------------
# 3. binaries: prebuilt bundle (carried) or cargo build --release
BIN="${KBENCH_GPU_BIN:-$ROOT/target/gpu-bundle}"
KB="" ; CB=""
if [[ -x "$BIN/kbench-gpu" ]]; then
    KB="$BIN/kbench-gpu"
    [[ -x "$BIN/kernels-bench" ]] && CB="$BIN/kernels-bench"
    log "=== [build] using prebuilt $KB ${CB:+and $CB}"
    SUMMARY+=("$(printf '%-10s %-14s' build "prebuilt")")
elif command -v cargo >/dev/null; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
    off=""
    [[ -d "$HOME/.cargo/registry/cache" ]] || off=""
    run_stage build 300 120 "$LOG" bash -c 'cargo build --release -p kbench-gpucheck --bins && cargo build --release --bin kbench'
    [[ -x "$CARGO_TARGET_DIR/release/kbench-gpu" ]] && KB="$CARGO_TARGET_DIR/release/kbench-gpu"
    if [[ -z "${KBENCH_SKIP_CRITERION:-}" ]]; then
        run_stage build-bench 120 100 "$LOG" cargo bench -p kbench-gpucheck --bench kernels --no-run
        CB="$(ls -t "$CARGO_TARGET_DIR"/release/deps/kernels-* 2>/dev/null | grep -v '\.d$' | head -1 || true)"
    fi
else
    log "=== [build] FAILED: no prebuilt bundle at $BIN and no cargo (run scripts/gpu-check.sh --bundle where cargo is, carry target/gpu-bundle)"
    SUMMARY+=("$(printf '%-10s %-14s' build "FAILED(no cargo, no bundle)")")
fi

if [[ -n "$KB" ]]; then
    "$KB" info >>"$MACH" 2>&1 || true
    # 4. NVRTC compile of every kernel for the target arch (no GPU needed)
    run_stage check 90 330 "$RES/selftest.txt" "$KB" check --arch sm_90
    # 5. GPU tests: every kernel against the f32 CPU reference (same tests as crates/kbench-gpucheck/tests/gpu.rs)
    run_stage selftest 150 260 "$RES/selftest.txt" "$KB" selftest --isolate
    # 5b. the engine on the GPU against its CPU path: exact kernels token for token, tuned
    #     kernels within bf16 bounds, the engine backend's round commits (engine-* test binaries)
    ENG=()
    for t in "$BIN"/engine-cuda_*; do [[ -x "$t" ]] && ENG+=("$t"); done
    if ((${#ENG[@]})); then
        run_stage engine 100 200 "$RES/engine.txt" bash -c 'rc=0; for t in "$@"; do echo "## $(basename "$t")"; "$t" --include-ignored --test-threads=1 --nocapture || rc=1; done; exit $rc' _ "${ENG[@]}"
    elif command -v cargo >/dev/null; then
        run_stage engine 200 200 "$RES/engine.txt" cargo test --release -p kbench-engine --test cuda_engine --test cuda_tuned --test cuda_backend -- --include-ignored --test-threads=1 --nocapture
    fi
    # 6. layer stack: decode and verify at batch 1..64, profile for the simulator's calibration
    run_stage stack 150 80 "$RES/stack.txt" "$KB" stack --layers "${KBENCH_STACK_LAYERS:-3}" --context "${KBENCH_STACK_CONTEXT:-2048}" --batches 1,2,4,8,16,32,64 --reps 10 --profile "$RES/profile.toml"
    # 6b. the simulator's per-pass prediction beside the stack (docs/gpu.md), and the profile
    #     with efficiency.in_model fitted to it
    KBIN=""
    if [[ -x "$BIN/kbench" ]]; then KBIN="$BIN/kbench"; elif [[ -x "${CARGO_TARGET_DIR:-$ROOT/target}/release/kbench" ]]; then KBIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/kbench"; fi
    HW=h200
    if grep -qi "RTX PRO 6000" "$MACH" 2>/dev/null; then HW=8x-rtx-pro-6000-server; fi
    if [[ -n "$KBIN" && -f "$RES/profile.toml" ]]; then
        run_stage calibrate 20 60 "$RES/stack.txt" "$KBIN" calibrate-passes "$RES/profile.toml" --hardware "$HW" --out "$RES/calibrated.toml"
    else
        why="no profile.toml from the stack"
        [[ -z "$KBIN" ]] && why="no kbench binary"
        log "=== [calibrate] SKIPPED: $why"
        SUMMARY+=("$(printf '%-10s SKIPPED (%s)' calibrate "$why")")
    fi
    # 6c. the same experiment file as on the CPU, on the GPU: engine_tiny on the engine backend
    if [[ -n "$KBIN" ]]; then
        run_stage experiment 45 50 "$RES/engine.txt" "$KBIN" experiment experiments/engine_tiny.toml --set 'backend.engine.device="cuda"'
    else
        log "=== [experiment] SKIPPED: no kbench binary"
        SUMMARY+=("$(printf '%-10s SKIPPED (no kbench binary)' experiment)")
    fi
    # 7. kernel table: achieved GB/s and TFLOP/s beside measured ceilings and SGLang's H200 numbers
    run_stage bench 100 10 "$RES/bench.txt" "$KB" bench
    # 8. criterion (short)
    if [[ -n "$CB" && -z "${KBENCH_SKIP_CRITERION:-}" ]]; then
        KBENCH_BENCH_QUICK=1 run_stage criterion 90 60 "$RES/bench.txt" "$CB" --bench
    fi
    # 9. with the time left: the small GPU tests under compute-sanitizer memcheck (out-of-bounds
    #    and misaligned accesses), appended to selftest.txt
    SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)"
    if [[ -n "$SAN" && -z "${KBENCH_SKIP_SANITIZER:-}" ]]; then
        echo "################ compute-sanitizer memcheck (KBENCH_SELFTEST_SMALL=1)" >>"$RES/selftest.txt"
        KBENCH_SELFTEST_SMALL=1 run_stage memcheck 150 5 "$RES/selftest.txt" "$SAN" --tool memcheck --error-exitcode 3 --print-limit 20 "$KB" selftest
    fi
fi

# ---------------------------------------------------------------------------------------------
# summary, short tables last
{
    echo
    echo "################ kernel check (selftest.txt)"
    grep -E "kernel compilations|FAILED" "$RES/selftest.txt" 2>/dev/null | head -n 5 || true
    echo "################ GPU tests (selftest.txt)"
    grep -vE "^sm_[0-9]+ " "$RES/selftest.txt" 2>/dev/null | grep -E " ok | FAIL |passed|skipped|error|ERROR SUMMARY|memcheck" | cut -c1-160 || true
    echo "################ kernels (bench.txt)"
    grep -E "ceiling|^int4|^bf16_matmul M(1|16|64) N7168|^moe|^mla|ref/us" "$RES/bench.txt" 2>/dev/null | head -40 || true
    echo "################ engine on the GPU (engine.txt)"
    grep -E "^## |^test |test result|skipped|output_throughput|^error" "$RES/engine.txt" 2>/dev/null | cut -c1-160 | tail -n 30 || true
    echo "################ layer stack and per-pass calibration (stack.txt; profile.toml, calibrated.toml)"
    grep -vE "^kernels compiled|^device:" "$RES/stack.txt" 2>/dev/null | tail -n 40 || true
    echo "################ stages"
    echo "kbench gpu-check: $(date -u +%FT%TZ), total $(elapsed)s of ${BUDGET}s budget"
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo none)"
    echo "NVRTC: ${KBENCH_NVRTC_LIB:-none}"
    printf '%s\n' "${SUMMARY[@]}"
} | tee -a "$LOG"

# Where a GPU is, a GPU test that did not run checked nothing: the run fails unless every GPU
# test stage ran and passed. Without one (a dry run of the script), the stages report the
# missing device and the run exits 0.
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    missed=()
    for stage in selftest engine; do
        [[ "${STATUS[$stage]:-not run}" == ok ]] || missed+=("$stage: ${STATUS[$stage]:-not run}")
    done
    if ((${#missed[@]})); then
        log "gpu-check: a GPU is present but its tests did not all run and pass ($(IFS=';'; echo "${missed[*]}"))"
        exit 1
    fi
fi
exit 0
