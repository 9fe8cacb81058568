#!/usr/bin/env bash
# What the GPU round (tools/gpu_round.sh) brings to the GPU machine, which has no package index: wheels for its
# Python (3.12, manylinux x86_64), downloaded here with pip, and a copy of Python's headers for that version in
# case its interpreter has none (the build includes Python.h). The round's prereqs step installs a wheel only
# where the machine's own package is missing or too old, so carrying one costs nothing when it is not needed.
#
# The folder travels as a `carry` path of the device tool, which moves the working tree and the carried paths,
# 64 MiB in all: this script says what each file weighs and refuses a folder that would not fit.
#
# Usage: tools/gpu_round_wheels.sh [--dry-run] [--python-version X.Y] [DIR] [NAME==VERSION ...]
#   DIR defaults to .gpu-wheels (gitignored); the packages default to the ones below.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ME="tools/gpu_round_wheels.sh"
CARRY_LIMIT=$((64 << 20))

# The build's Python-side needs whose version on the GPU machine nobody has read yet (the device tool's KINDS.md
# lists them as present, without versions): nanobind (>= 2.0, CMakeLists.txt asks `python -m nanobind`) and
# ninja (the build's generator where present). Pinned to the versions this project builds with here.
DEFAULT_PACKAGES=(nanobind==3.1.0 ninja==1.13.0)
# pip matches manylinux_2_N exactly: the tags a wheel for the GPU machine's glibc may carry.
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }
die_usage() { echo "$ME: $*" >&2; echo "(see $ME --help)" >&2; exit 2; }

dry=0 pyver=3.12 dir="" packages=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --dry-run) dry=1; shift ;;
    --python-version)
      [[ $# -ge 2 && $2 =~ ^3\.[0-9]+$ ]] || die_usage "--python-version: expected 3.N, got '${2-}'"
      pyver=$2; shift 2 ;;
    -*) die_usage "unknown argument '$1'" ;;
    *==*) packages+=("$1"); shift ;;
    *)
      [[ -z $dir ]] || die_usage "one folder only, got '$dir' and '$1' (packages are NAME==VERSION)"
      dir=$1; shift ;;
  esac
done
dir="${dir:-$ROOT/.gpu-wheels}"
[[ ${#packages[@]} -gt 0 ]] || packages=("${DEFAULT_PACKAGES[@]}")

pip_cmd=(python3 -m pip download --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp)
for p in "${PLATFORMS[@]}"; do pip_cmd+=(--platform "$p"); done
pip_cmd+=(-d "$dir" "${packages[@]}")

# Headers of the same minor version (pyenv's, or an interpreter on PATH): the C API is stable within a minor
# version, so a 3.12.1 header set builds a module for 3.12.3.
headers=""
for py in "$(command -v "python$pyver" || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$pyver".*/bin/python"$pyver"; do
  if [[ -x $py ]]; then
    h="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)"
    if [[ -f $h/Python.h ]]; then headers=$h; break; fi
  fi
done

if [[ $dry == 1 ]]; then
  echo "${pip_cmd[*]}"
  echo "headers: ${headers:-none found for Python $pyver} -> $dir/include/python$pyver"
  exit 0
fi

mkdir -p "$dir"
# One version of each package: pip refuses to install two, and the round would pick either.
for spec in "${packages[@]}"; do
  name="${spec%%==*}" version="${spec#*==}"
  norm="$(echo "$name" | tr 'A-Z-.' 'a-z__')"
  for w in "$dir"/*.whl; do
    [[ -e $w ]] || continue
    base="$(basename "$w")"
    wname="$(echo "${base%%-*}" | tr 'A-Z-.' 'a-z__')" wversion="$(echo "$base" | cut -d- -f2)"
    if [[ $wname == "$norm" && $wversion != "$version" ]]; then rm -f "$w"; echo "removed $base"; fi
  done
done
"${pip_cmd[@]}"

rm -rf "$dir/include"
if [[ -n $headers ]]; then
  mkdir -p "$dir/include"
  cp -r "$headers" "$dir/include/python$pyver"
else
  echo "$ME: no Python $pyver headers found here (pyenv or python$pyver on PATH); the round builds only where the GPU machine has its own" >&2
fi

# What travels: this folder, and the working tree (tracked files and untracked ones git does not ignore).
echo
echo "carried in $dir:"
(cd "$dir" && for f in *.whl; do [[ -e $f ]] && printf '  %8s KiB  %s\n' "$(($(stat -c %s "$f") / 1024))" "$f"; done)
[[ -d $dir/include ]] && printf '  %8s KiB  include/python%s (%s files)\n' "$(($(du -sb "$dir/include" | cut -f1) >> 10))" "$pyver" \
  "$(find "$dir/include" -type f | wc -l)"
carried=$(du -sb "$dir" | cut -f1)
tree=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null |
  awk '{ s += $1 } END { print s + 0 }')
echo "  total $((carried >> 10)) KiB; with the working tree ($((tree >> 10)) KiB): $(((carried + tree) >> 10)) KiB of the device tool's $((CARRY_LIMIT >> 10)) KiB"
if ((carried + tree > CARRY_LIMIT)); then
  echo "$ME: $dir and the working tree come to more than the 64 MiB the device tool carries" >&2
  exit 1
fi
echo "carry it: run(command=\"bash tools/gpu_round.sh\", carry=[\"$(realpath --relative-to="$ROOT" "$dir")\"], timeout_s=600)"
