#!/usr/bin/env bash
# Build jaxcoll's native module in the checkout, so `PYTHONPATH=<checkout> python ...` works without installing:
# configures build/inplace-<interpreter> once (incremental afterwards; one folder per interpreter, so a 3.11 and a
# 3.12 build never share a CMake cache) and copies _jaxcoll*.so into jaxcoll/ (.gitignored; the file name carries
# the interpreter's ABI tag, so builds for several interpreters sit side by side).
# Usage: [PYTHON=python3.12] tools/build_inplace.sh [extra cmake -D options]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$(command -v "${PYTHON:-python}")"
tag="$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
build="$root/build/inplace-$tag"
generator=()
if [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$python" "$@" >/dev/null
cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)"
suffix="$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
rm -f "$root/jaxcoll/_jaxcoll$suffix"
cp "$build/_jaxcoll$suffix" "$root/jaxcoll/"
echo "built $root/jaxcoll/_jaxcoll$suffix"
