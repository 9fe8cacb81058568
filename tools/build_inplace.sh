#!/usr/bin/env bash
# Build jaxcoll's native module in the checkout, so `PYTHONPATH=<checkout> python ...` works without installing:
# configures build/inplace once (incremental afterwards) and copies _jaxcoll*.so into jaxcoll/ (.gitignored).
# Usage: tools/build_inplace.sh [extra cmake -D options]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python}"
build="$root/build/inplace"
generator=()
if [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v "$python")" "$@" >/dev/null
cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)"
rm -f "$root"/jaxcoll/_jaxcoll*.so
cp "$build"/_jaxcoll*.so "$root/jaxcoll/"
echo "built $(ls "$root"/jaxcoll/_jaxcoll*.so)"
