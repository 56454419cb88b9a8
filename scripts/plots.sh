#!/usr/bin/env bash
# The README's pictures, regenerated from the shipped experiments and corpus into
# docs/plots/: the run dashboard (spec and plain on one chart), a comparison of two
# reports, the search frontier and the fidelity parity panels. Every one is deterministic,
# so a rerun changes a file only when the model or the rendering changed.
set -euo pipefail
cd "$(dirname "$0")/.."

kbench=${KBENCH:-target/release/kbench}
if [[ -z ${KBENCH:-} ]]; then
    cargo build --release --quiet
fi
kbench=$(realpath "$kbench")
out=docs/plots
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

echo "spec_vs_plain: the run dashboard"
"$kbench" experiment experiments/spec_vs_plain.toml --plot "$out/spec_vs_plain.svg" --quiet

echo "compare: topk1_v2 against topk1_v1"
"$kbench" experiment experiments/topk1_v2.toml --json "$scratch/v2.json" --quiet
"$kbench" experiment experiments/topk1_v1.toml --json "$scratch/v1.json" --quiet
(cd "$scratch" && "$kbench" compare v2.json v1.json --plot compare.svg > /dev/null)
mv "$scratch/compare.svg" "$out/compare.svg"

echo "search: the seed's space"
"$kbench" search experiments/search_kimi.toml --plot "$out/search_frontier.svg" > /dev/null

echo "fidelity: the shipped corpus"
"$kbench" fidelity --plot "$out/fidelity_parity.svg" > /dev/null

ls -l "$out"
