#!/usr/bin/env bash
# The GPU round of issue 14, in one go on a lent GPU machine (bare each time, no package index): environment
# facts, the prerequisites (carried wheels installed where missing), a build against that machine's own
# jax/jaxlib for its own GPU architecture only, the import check, the emulated-rank harness, compute-sanitizer,
# (its 256 MiB-per-rank cases a step of their own), JAX end to end on the one-GPU mesh, the network step of
# collectives across GPU hosts over a group of the one GPU, the peer that never arrives, and benchmarks/cuda.py.
#
# Every step runs under `timeout`. A step the later ones depend on (prereqs, build, import) stops the round when
# it fails; the others let it go on, so one round reports as much as it can. The round as a whole keeps within
# --total seconds (a device-tool command may run 600 s): a step is given what is left if that is less than its
# limit, and is not started with under 10 s left. Logs, facts and a markdown summary land in one folder of at
# most 8 files (what the device tool brings back). docs/cuda.md, "Running the GPU round", says how to call it.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ME="tools/gpu_round.sh"

# ---------------------------------------------------------------------------------------------------------------
# The steps, in order. Limits in seconds (the issue's budget: build <= 4 min, tests <= 4 min, sanitizer <= 2 min,
# bench <= 3 min); `stop` steps end the round when they fail.
# ---------------------------------------------------------------------------------------------------------------
STEPS=(env prereqs build import harness harness_large memcheck racecheck synccheck jax network never_arrives bench
       tune profile ncu)
# harness and harness_large: pytest's own time plus ~12 s of interpreter start and CUDA teardown (the round of
# 2026-11-26 on an H100: 84 s and 52 s in pytest, over 95 s and 55 s in all); jax took 23 and 33 s.
# profile: gpu_profile.py, then gpu_floor.cu's build and run (seconds), plus about 1 s for each of its 36 packet
# rows that fails (a late packet's spin gives up after 1 s), so even a wholly broken floor prints every row.
declare -A LIMIT=([env]=30 [prereqs]=60 [build]=240 [import]=60
                  [harness]=110 [harness_large]=65 [jax]=45 [network]=30 [never_arrives]=20
                  [memcheck]=50 [racecheck]=40 [synccheck]=30
                  [bench]=180 [tune]=60 [profile]=90 [ncu]=120)
declare -A ON_FAIL=([env]=continue [prereqs]=stop [build]=stop [import]=stop [harness]=continue
                    [harness_large]=continue [memcheck]=continue [racecheck]=continue [synccheck]=continue
                    [jax]=continue [network]=continue [never_arrives]=continue [bench]=continue
                    [tune]=continue [profile]=continue [ncu]=continue)
declare -A ABOUT=(
  [env]="GPU, driver, Python, jax/jaxlib, nvcc, cmake, sanitizer (env.txt)"
  [prereqs]="Python packages the build and tests need; carried wheels installed where missing or too old"
  [build]="the native module with the CUDA executor, for this GPU's architecture only, against this jaxlib"
  [import]="import jaxcoll; cuda_status(); a jaxcoll custom call compiles for XLA's CUDA platform"
  [harness]="tests/test_cuda.py: emulated ranks, every plan/dtype/op/size/offset, both protocols, vs numpy"
  [harness_large]="tests/test_cuda.py -m large: 256 MiB per rank at 8 ranks, against numpy"
  [memcheck]="compute-sanitizer memcheck: all_reduce on bulk (ring, also misaligned) and packets (direct, ring), N=4"
  [racecheck]="compute-sanitizer racecheck: the same plans"
  [synccheck]="compute-sanitizer synccheck: the same plans"
  [jax]="tests/test_cuda_jax.py: collectives, grads, 200-step scan, fused ops; CUDA graphs on and off; traced harness calls"
  [network]="jaxcoll_network (XLA's NCCL via the FFI collectives extension), every collective over one GPU, vs numpy"
  [never_arrives]="a wait whose signal is withheld ends in an error naming rank, lane, step and semaphore"
  [bench]="benchmarks/cuda.py: bulk vs copy bandwidth, packet latency, fused ops vs GEMM (bench.md)"
  [tune]="the cost model fitted on the emulated ranks per protocol, predicted vs measured for every plan (tune.md)"
  [profile]="where the packet latency goes, and its floor: tools/gpu_profile.py packet, tools/gpu_floor.cu (profile.md)"
  [ncu]="ncu on the packet kernel (each launch's kernel time alone, one launch's stalls and hottest SASS), then on a slow synthesized all_reduce (ncu.md)")
MIN_START_S=10   # a step is not started with less than this left of the round (unless its own limit is smaller)
KILL_AFTER_S=5   # after the limit, TERM; this much later, KILL

# What the build and the tests import, as requirement specifiers (jaxcoll's own range of jax: pyproject.toml).
# GPU_ROUND_REQUIRES replaces the list (tests). KINDS.md of the device tool lists all of these as present there;
# the carried wheels are for a machine whose versions differ.
REQUIRES_DEFAULT="nanobind>=2.0 numpy jax>=0.10.2,<0.13 jaxlib>=0.10.2,<0.13 ml_dtypes scipy rich matplotlib pytest hypothesis"

usage() {
  cat <<EOF
Usage: $ME [options]
       $ME --report DIR

Runs the GPU round (issue 14) on a machine with an NVIDIA GPU and writes its logs and summary to one folder.

Options:
  --out DIR            where logs and the summary go (default \$OUT/gpu-round when OUT is set, else build/gpu-round)
  --wheels DIR         carried wheels (and Python headers) from tools/gpu_round_wheels.sh (default .gpu-wheels)
  --python PY          the interpreter whose jax/jaxlib the build targets and the tests run on (default python3)
  --compute-cap X.Y    the GPU's compute capability, comma-separated for several (default: nvidia-smi's)
  --only STEP[,STEP]   run only these steps (in the round's order)
  --skip STEP[,STEP]   run all but these steps
  --limit STEP=S       this step's time limit in seconds (repeatable; also GPU_ROUND_LIMIT_<STEP>=S)
  --total S            the whole round's time budget in seconds (default 540; also GPU_ROUND_TOTAL_S)
  --dry-run            print the steps, their limits and commands; run nothing
  --report DIR         write DIR/summary.md from DIR/results.tsv and DIR/env.txt, and print it
  -h, --help           this text

Steps (limit in s, what a failure does):
EOF
  local s
  for s in "${STEPS[@]}"; do printf '  %-14s %4s  %-8s %s\n' "$s" "${LIMIT[$s]}" "${ON_FAIL[$s]}" "${ABOUT[$s]}"; done
  cat <<EOF

Environment: GPU_ROUND_LIMIT_<STEP>, GPU_ROUND_TOTAL_S; GPU_ROUND_CMD_<STEP> replaces a step's command (tests).
Exit status: 0 every selected step passed, 1 a step failed, timed out or did not run, 2 a usage error.
EOF
}

die_usage() {
  echo "$ME: $*" >&2
  echo "(see $ME --help)" >&2
  exit 2
}

is_step() {
  local s
  for s in "${STEPS[@]}"; do [[ $s == "$1" ]] && return 0; done
  return 1
}

# "--only a,b" and the like: every name must be a step; the names go to STEP_LIST.
parse_steps() {  # parse_steps OPTION VALUE
  local option=$1 name
  IFS=, read -r -a STEP_LIST <<<"$2"
  [[ ${#STEP_LIST[@]} -gt 0 ]] || die_usage "$option: expected step names, got '$2'"
  for name in "${STEP_LIST[@]}"; do
    is_step "$name" || die_usage "$option: '$name' is not a step; the steps are: ${STEPS[*]}"
  done
}

positive_int() {  # positive_int OPTION VALUE
  [[ $2 =~ ^[0-9]+$ && $2 -gt 0 ]] || die_usage "$1: expected a whole number of seconds > 0, got '$2'"
}

# CMAKE_CUDA_ARCHITECTURES for the given compute capabilities ("9.0" or "8.0, 9.0" or one per line): machine code
# for each, no PTX (the GPU is known, so no JIT at load and one nvcc pass per kernel file).
cuda_architectures() {  # cuda_architectures CAPS -> e.g. 90-real
  local cap out="" seen=" "
  local -a caps
  IFS=$', \n' read -r -d '' -a caps <<<"$1"
  [[ ${#caps[@]} -gt 0 ]] || return 1
  for cap in "${caps[@]}"; do
    [[ $cap =~ ^([0-9]{1,2})\.([0-9])$ ]] || return 1
    cap="${BASH_REMATCH[1]}${BASH_REMATCH[2]}-real"
    [[ $seen == *" $cap "* ]] && continue
    seen+="$cap "
    out+="${out:+;}$cap"
  done
  echo "$out"
}

now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------------------------------------------------------
# The env and prereqs steps (run under `timeout` like the others, so exported to their shell)
# ---------------------------------------------------------------------------------------------------------------
round_facts() {  # round_facts PY: "key: value" lines first (the summary reads them), then the long outputs
  local py=$1
  fact() { printf '%s: %s\n' "$1" "$(echo "${2:-(none)}" | head -1)"; }
  smi() {
    command -v nvidia-smi >/dev/null || { echo "(no nvidia-smi)"; return; }
    nvidia-smi --format=csv,noheader --query-gpu="$1" 2>&1 | paste -sd, | sed 's/, */, /g'
  }
  fact date "$(date -u +%Y-%m-%d)"
  fact gpu "$(smi name)"
  fact driver "$(smi driver_version)"
  fact compute_cap "$(smi compute_cap)"
  fact gpu_memory "$(smi memory.total)"
  fact python "$("$py" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
  fact jax "$("$py" -c 'import jax; print(jax.__version__)' 2>&1 | tail -1)"
  fact jaxlib "$("$py" -c 'import jaxlib.version as v; print(v.__version__)' 2>&1 | tail -1)"
  fact nvcc "$(nvcc --version 2>&1 | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  fact cmake "$(cmake --version 2>&1)"
  fact compute_sanitizer "$(compute-sanitizer --version 2>&1 | sed -n 's/.*Version \(.*\)/\1/p')"
  fact kernel "$(uname -sr)"
  fact cpus "$(nproc)"
  echo
  echo "--- nvidia-smi"; command -v nvidia-smi >/dev/null && nvidia-smi 2>&1
  echo "--- python packages"
  "$py" -m pip list 2>/dev/null | grep -iE '^(jax|nvidia-|nanobind|cmake|ninja|numpy|ml.dtypes|pytest|hypothesis|scikit)' || true
  echo "--- tools"
  local t
  for t in nvcc cmake ninja compute-sanitizer ncu g++; do printf '%s: %s\n' "$t" "$(command -v "$t" || echo missing)"; done
}

round_prereqs() {  # round_prereqs PY WHEELS SITE: install carried wheels for what is missing; check the headers
  local py=$1 wheels=$2 site=$3
  rm -rf "$site"   # only what this round installs
  "$py" - "$wheels" "$site" "${GPU_ROUND_REQUIRES:-$REQUIRES_DEFAULT}" <<'EOF'
import glob, importlib.metadata as md, os, re, subprocess, sys, sysconfig
wheels, site, requires = sys.argv[1], sys.argv[2], sys.argv[3].split()
try:
    from packaging.requirements import Requirement
except ImportError:  # packaging is on the GPU machine; without it, presence is all that is checked
    Requirement = None

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

carried = {norm(os.path.basename(w).split("-")[0]): w for w in sorted(glob.glob(os.path.join(wheels, "*.whl")))}
install, missing = [], []
for spec in requires:
    req = Requirement(spec) if Requirement else None
    name = req.name if req else re.split(r"[<>=!~ ]", spec)[0]
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have is not None and (req is None or req.specifier.contains(have, prereleases=True)):
        print(f"have {name} {have}")
        continue
    why = "not installed" if have is None else f"{have} does not satisfy {spec}"
    wheel = carried.get(norm(name))
    if wheel:
        print(f"{name}: {why}; installing the carried {os.path.basename(wheel)}")
        install.append((name, req, wheel))
    else:
        missing.append(f"{name} ({why}, none carried)")
if install:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", site, *(w for _, _, w in install)], check=True)
    got = {norm(d.metadata["Name"]): d.version for d in md.distributions(path=[site])}
    for name, req, wheel in install:
        if req is not None and not req.specifier.contains(got.get(norm(name), "0"), prereleases=True):
            missing.append(f"{name} (the carried {os.path.basename(wheel)} does not satisfy {req})")
if missing:
    sys.exit(f"missing: {'; '.join(missing)}. Bring wheels with tools/gpu_round_wheels.sh NAME==VERSION and "
             f"carry the folder ({wheels})")
include = sysconfig.get_paths()["include"]
headers = "its own Python headers"
if not os.path.exists(os.path.join(include, "Python.h")):
    fallback = os.path.join(wheels, "include", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    if not os.path.exists(os.path.join(fallback, "Python.h")):
        sys.exit(f"no Python.h in {include}, and none carried in {fallback}")
    headers = f"the carried Python headers (none in {include})"
installed = ", ".join(name for name, _, _ in install)
print(f"{len(requires)} requirements met{'; installed from carried wheels: ' + installed if install else ''}; {headers}")
EOF
}

# ---------------------------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------------------------
# The carried Python headers, where the interpreter has none of its own (a bare image without python3-dev).
python_include_option() {
  "$PY" - "$WHEELS" 2>/dev/null <<'EOF' || true
import os, sys, sysconfig
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    d = os.path.join(sys.argv[1], "include", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    if os.path.exists(os.path.join(d, "Python.h")):
        print(f"-DPython_INCLUDE_DIR={os.path.abspath(d)}")
EOF
}

q() { printf '%q' "$1"; }

step_command() {  # step_command STEP -> the shell command, run from the checkout's root
  local step=$1 hook="GPU_ROUND_CMD_${1^^}"
  if [[ -n ${!hook-} ]]; then echo "${!hook}"; return; fi
  local py pytest include
  py="$(q "$PY")"
  pytest="$py -m pytest -q -rfEs -p no:cacheprovider"
  case $step in
    env) echo "round_facts $py > $(q "$DIR/env.txt"); cat $(q "$DIR/env.txt")" ;;
    prereqs) echo "round_prereqs $py $(q "$WHEELS") $(q "$SITE")" ;;
    build)
      if [[ -z $ARCH ]]; then echo "echo $(q "$ARCH_ERROR") >&2; exit 1"; return; fi
      include="$(python_include_option)"
      echo "PYTHON=$py bash tools/build_inplace.sh -DJAXCOLL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$(q "$ARCH")${include:+ $(q "$include")}" ;;
    import) echo "$py tools/gpu_round_checks.py import" ;;
    # --maxfail: a plan that hangs costs test_cuda.py's 30 s timeout per test; three leave the round time to go on.
    harness) echo "$pytest --maxfail=3 tests/test_cuda.py -m 'not large' -k 'not never_signalled'" ;;
    # 8 ranks x 256 MiB in and out, with numpy's references on the host: seconds a case, hence a limit of its own.
    harness_large) echo "$pytest --maxfail=2 tests/test_cuda.py -m large" ;;
    memcheck | racecheck | synccheck)
      echo "$(q "$SANITIZER") --tool $step --error-exitcode 1 --print-limit 50 $py tools/gpu_round_checks.py sanitize" ;;
    # The checks' CPU-device runs passed where the round was prepared; on the GPU machine only the GPU's run.
    # tests/test_trace_cuda.py: traced calls of the emulated harness (a few seconds; its no-GPU tests run too).
    jax) echo "$pytest tests/test_cuda_jax.py tests/test_trace_cuda.py -k 'not cpu and not cases_program'" ;;
    network) echo "$py tools/gpu_round_checks.py network" ;;
    never_arrives) echo "$pytest tests/test_cuda.py -k never_signalled" ;;
    bench) echo "set -o pipefail; $py benchmarks/cuda.py --iters 20 | tee $(q "$DIR/bench.md")" ;;
    tune) echo "set -o pipefail; $py benchmarks/cuda.py --parts tune --iters 10 | tee $(q "$DIR/tune.md")" ;;
    # The per-call time by ranks and plan, then what a launch costs before it moves data and what a packet
    # all_reduce could cost (tools/gpu_floor.cu). The floor needs no jaxcoll build, so it runs whatever
    # gpu_profile.py did; the step fails if either did.
    profile)
      if [[ -z $ARCH ]]; then echo "echo $(q "$ARCH_ERROR") >&2; exit 1"; return; fi
      local floor="${TMPDIR:-/tmp}/gpu_floor"
      echo "set -o pipefail; { $py tools/gpu_profile.py packet && $py tools/gpu_profile.py bulk-plans; p=\$?;" \
           "nvcc -O3 -std=c++17 -arch=sm_${ARCH%%-*}" \
           "-o $(q "$floor") tools/gpu_floor.cu && $(q "$floor") && exit \$p; } | tee $(q "$DIR/profile.md")" ;;
    # The clocks stay as the card has them (--clock-control none). First every launch's kernel time alone (a
    # call's time less this is what surrounds the kernel), then the 8-rank all_reduce's third launch in detail.
    ncu)
      local ncu report="${TMPDIR:-/tmp}/gpu-round-ncu"
      ncu="$(q "$NCU") --clock-control none -k regex:plan_kernel"
      echo "set -o pipefail; { $ncu --metrics gpu__time_duration.sum $py tools/gpu_profile.py launches &&" \
           "$ncu --launch-skip 2 --launch-count 1 --set full -f -o $(q "$report") $py tools/gpu_profile.py launches &&" \
           "$(q "$NCU") -i $(q "$report.ncu-rep") --print-details all --section SpeedOfLight --section LaunchStats" \
           "--section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis &&" \
           "$py tools/gpu_profile.py hot-sass $(q "$NCU") $(q "$report.ncu-rep") &&" \
           "$ncu --launch-skip 1 --launch-count 1 --section SpeedOfLight --section LaunchStats --section" \
           "WarpStateStats --section MemoryWorkloadAnalysis $py tools/gpu_profile.py launches synth; } 2>&1 |" \
           "tee $(q "$DIR/ncu.md")" ;;
  esac
}

# One line that says how a step went: the pytest tally, the sanitizer's error summary, a build's first error, else
# the output's last line.
step_detail() {  # step_detail STEP STATUS LOG
  local line=""
  case $1 in
    harness | harness_large | jax | never_arrives)
      line="$(grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran' "$3" | tail -1)" ;;
    memcheck | racecheck | synccheck) line="$(grep -E 'ERROR SUMMARY' "$3" | tail -1)" ;;
    env) line="$(sed -n 's/^gpu: //p' "$DIR/env.txt" 2>/dev/null | head -1)" ;;
    prereqs) line="$(tail -n 1 "$3")" ;;
    build)  # a compiler's first error says more than ninja's last line
      if [[ $2 == passed ]]; then line="CMAKE_CUDA_ARCHITECTURES=$ARCH"; else line="$(grep -m1 -iE 'error' "$3")"; fi ;;
    bench) [[ $2 == passed ]] && line="tables in bench.md" ;;
  esac
  [[ -z $line && $2 != passed ]] && line="$(grep -v '^[[:space:]]*$' "$3" | tail -1)"
  line="$(echo "$line" | sed -e 's/=\{3,\}//g' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | tr '\t' ' ')"
  echo "${line:0:400}"
}

# Tests that pytest skipped with test_cuda*.py's no-GPU reasons (its -rs lines: "SKIPPED [n] file:line: reason").
no_gpu_skips() {  # no_gpu_skips LOG -> a count
  grep -E '^SKIPPED \[[0-9]+\].*(without the CUDA executor|no usable CUDA device|no CUDA backend)' "$1" |
    sed -E 's/^SKIPPED \[([0-9]+)\].*/\1/' | awk '{ n += $1 } END { print n + 0 }'
}

# ---------------------------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------------------------
md_cell() { local s=${1//|/\\|}; echo "${s//$'\n'/ }"; }

write_summary() {  # write_summary DIR: DIR/results.tsv + DIR/env.txt -> DIR/summary.md
  local dir=$1 env="$1/env.txt" results="$1/results.tsv"
  [[ -f $results ]] || { echo "$ME --report: no $results" >&2; return 2; }
  fact() { [[ -f $env ]] && sed -n "s/^$1: //p" "$env" | head -1; }
  local gpu driver jax jaxlib date python nvcc step status seconds limit command detail stopped="" unselected=""
  gpu="$(fact gpu)"; driver="$(fact driver)"; jax="$(fact jax)"; jaxlib="$(fact jaxlib)"; date="$(fact date)"
  python="$(fact python)"; nvcc="$(fact nvcc)"
  {
    echo "### GPU round of ${date:-(date not recorded)}: ${gpu:-(GPU not recorded)}"
    echo
    local cap python_version="${python%% *}"
    cap="$(fact compute_cap)"
    echo "Driver ${driver:--}, compute capability ${cap:--}, Python ${python_version:--}, jax ${jax:--}," \
         "jaxlib ${jaxlib:--}, nvcc ${nvcc:--}; \`$ME\` (logs: round.log)."
    echo
    echo "| step | command | status | seconds | result |"
    echo "|---|---|---|---|---|"
    while IFS=$'\t' read -r step status seconds limit command detail; do
      [[ $step == step ]] && continue   # the header
      if [[ $status == "not selected" ]]; then unselected+="${unselected:+, }$step"; continue; fi
      [[ $status == "not run (stopped at "* ]] && stopped=${status#not run (stopped at } && stopped=${stopped%)}
      echo "| $step | \`$(md_cell "$command")\` | $(md_cell "$status") | $seconds | $(md_cell "$detail") |"
    done <"$results"
    [[ -z $stopped ]] || printf '\nThe round stopped at %s: the steps after it need it.\n' "$stopped"
    [[ -z $unselected ]] || printf '\nNot selected in this round: %s.\n' "$unselected"
  } >"$dir/summary.md"
  cat "$dir/summary.md"
}

# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------
DIR="${OUT:+$OUT/gpu-round}"
DIR="${DIR:-$ROOT/build/gpu-round}"
WHEELS="$ROOT/.gpu-wheels"
PY=python3
CAPS=""
DRY=0
TOTAL="${GPU_ROUND_TOTAL_S:-540}"
declare -A SELECTED=()
for s in "${STEPS[@]}"; do SELECTED[$s]=1; done
for s in "${STEPS[@]}"; do
  var="GPU_ROUND_LIMIT_${s^^}"
  if [[ -n ${!var-} ]]; then positive_int "$var" "${!var}"; LIMIT[$s]=${!var}; fi
done

need_value() { [[ $# -ge 2 ]] || die_usage "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --out) need_value "$@"; DIR=$2; shift 2 ;;
    --wheels) need_value "$@"; WHEELS=$2; shift 2 ;;
    --python) need_value "$@"; PY=$2; shift 2 ;;
    --compute-cap) need_value "$@"; CAPS=$2; shift 2 ;;
    --only)
      need_value "$@"
      parse_steps --only "$2"
      for s in "${STEPS[@]}"; do SELECTED[$s]=0; done
      for s in "${STEP_LIST[@]}"; do SELECTED[$s]=1; done
      shift 2 ;;
    --skip)
      need_value "$@"
      parse_steps --skip "$2"
      for s in "${STEP_LIST[@]}"; do SELECTED[$s]=0; done
      shift 2 ;;
    --limit)
      need_value "$@"
      step=${2%%=*} seconds=${2#*=}
      [[ $2 == *=* ]] && is_step "$step" ||
        die_usage "--limit: expected STEP=SECONDS with STEP one of: ${STEPS[*]}; got '$2'"
      positive_int "--limit $step" "$seconds"
      LIMIT[$step]=$seconds
      shift 2 ;;
    --total) need_value "$@"; positive_int --total "$2"; TOTAL=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --report) need_value "$@"; write_summary "$2"; exit $? ;;
    *) die_usage "unknown argument '$1'" ;;
  esac
done
positive_int GPU_ROUND_TOTAL_S "$TOTAL"
command -v "$PY" >/dev/null || die_usage "--python: '$PY' is not an executable on PATH"

# The machine's CUDA tools may sit outside PATH (the toolkit's bin/, the sanitizer's own folder).
for tool in nvcc compute-sanitizer ncu; do
  command -v "$tool" >/dev/null && continue
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /usr/local/cuda/compute-sanitizer /usr/local/cuda-*/compute-sanitizer; do
    if [[ -x $d/$tool ]]; then PATH="$PATH:$d"; break; fi
  done
done
SANITIZER="$(command -v compute-sanitizer || echo compute-sanitizer)"
NCU="$(command -v ncu || echo ncu)"

if [[ -n $CAPS ]]; then
  ARCH="$(cuda_architectures "$CAPS")" ||
    die_usage "--compute-cap: expected MAJOR.MINOR (as nvidia-smi --query-gpu=compute_cap prints, e.g. 9.0), comma-separated for several; got '$CAPS'"
  ARCH_ERROR=""
else
  if command -v nvidia-smi >/dev/null; then
    smi="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>&1)"
  else
    smi="nvidia-smi is not on PATH"
  fi
  ARCH="$(cuda_architectures "$smi")" || ARCH=""
  ARCH_ERROR="no compute capability from nvidia-smi ($(echo "$smi" | head -1)): pass --compute-cap"
fi

# Wheels installed by prereqs go to SITE, ahead of the machine's packages only where prereqs put them there.
SITE="${TMPDIR:-/tmp}/gpu-round-site"
WHEELS="$(realpath -m -- "$WHEELS")"   # relative to where the script was called from
DIR="$(realpath -m -- "$DIR")"

if [[ $DRY == 1 ]]; then
  echo "GPU round (dry run): results in $DIR; python $PY; wheels $WHEELS; total $TOTAL s"
  echo "CMAKE_CUDA_ARCHITECTURES=${ARCH:-<none: $ARCH_ERROR>}"
  for s in "${STEPS[@]}"; do
    if [[ ${SELECTED[$s]} == 1 ]]; then
      printf '%-14s limit %4s s, on failure %-8s  %s\n' "$s" "${LIMIT[$s]}" "${ON_FAIL[$s]}" "$(step_command "$s")"
    else
      printf '%-14s not selected\n' "$s"
    fi
  done
  exit 0
fi

# ---------------------------------------------------------------------------------------------------------------
# The round
# ---------------------------------------------------------------------------------------------------------------
mkdir -p "$DIR" || exit 2
rm -f "$DIR/round.log" "$DIR/results.tsv" "$DIR/summary.md" "$DIR/bench.md" "$DIR/profile.md" "$DIR/ncu.md"
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1 \
       PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# A wait that never completes fails the call after a minute, not the default five (the tests set their own).
export JAXCOLL_TIMEOUT="${JAXCOLL_TIMEOUT:-60}"
export REQUIRES_DEFAULT
export -f round_facts round_prereqs

printf 'step\tstatus\tseconds\tlimit\tcommand\tdetail\n' >"$DIR/results.tsv"
round_start="$(now)"
stopped=""
failed=0
step_log="$DIR/.step.log"
for step in "${STEPS[@]}"; do
  cmd="$(step_command "$step")"
  limit=${LIMIT[$step]}
  if [[ ${SELECTED[$step]} != 1 ]]; then
    printf '%s\tnot selected\t-\t-\t%s\t\n' "$step" "$cmd" >>"$DIR/results.tsv"
    continue
  fi
  if [[ -n $stopped ]]; then
    printf '%s\tnot run (stopped at %s)\t-\t%s\t%s\t\n' "$step" "$stopped" "$limit" "$cmd" >>"$DIR/results.tsv"
    failed=1
    continue
  fi
  left=$(awk -v t="$TOTAL" -v e="$(seconds_since "$round_start")" 'BEGIN { printf "%d", t - e }')
  floor=$((limit < MIN_START_S ? limit : MIN_START_S))
  if ((left < floor)); then
    printf '%s\tnot run (no time left of the %s s round)\t-\t%s\t%s\t\n' "$step" "$TOTAL" "$limit" "$cmd" >>"$DIR/results.tsv"
    echo "== $step: not run, ${left} s left of the round's $TOTAL s"
    failed=1
    continue
  fi
  ((left < limit)) && limit=$left
  # Steps that use the GPU without XLA keep XLA from taking 75 % of its memory should jax start a GPU backend;
  # the JAX end to end step runs as users run it.
  step_env=()
  case $step in
    harness | harness_large | memcheck | racecheck | synccheck | bench | profile) step_env=(XLA_PYTHON_CLIENT_PREALLOCATE=false) ;;
  esac
  echo "== $step (limit $limit s): $cmd"
  printf '\n==== %s (limit %s s): %s\n' "$step" "$limit" "$cmd" >>"$DIR/round.log"
  start="$(now)"
  env "${step_env[@]}" timeout -k "$KILL_AFTER_S" "$limit" bash -c "$cmd" >"$step_log" 2>&1 </dev/null
  rc=$?
  seconds="$(seconds_since "$start")"
  case $rc in
    0) status=passed ;;
    124 | 137) status="TIMED OUT after $limit s" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  # On the GPU machine a test that skips for want of a GPU did not run: the step has not passed.
  no_gpu=$(no_gpu_skips "$step_log")
  [[ $status == passed && $no_gpu -gt 0 ]] && status="FAILED ($no_gpu skipped for want of a GPU)"
  # A huge log (an error repeated per element) keeps its head and tail.
  if (($(wc -l <"$step_log") > 3000)); then
    { head -n 1000 "$step_log"; echo "[... $(($(wc -l <"$step_log") - 3000)) lines left out ...]"; tail -n 2000 "$step_log"; } >>"$DIR/round.log"
  else
    cat "$step_log" >>"$DIR/round.log"
  fi
  detail="$(step_detail "$step" "$status" "$step_log")"
  printf '==== %s: %s in %s s\n' "$step" "$status" "$seconds" >>"$DIR/round.log"
  echo "== $step: $status in $seconds s${detail:+ ($detail)}"
  if [[ $status != passed ]]; then
    failed=1
    tail -n 25 "$step_log" | sed 's/^/   | /'
    if [[ ${ON_FAIL[$step]} == stop ]]; then
      stopped=$step
      echo "== the round stops at $step: the steps after it need it"
    fi
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$step" "$status" "$seconds" "$limit" "$cmd" "$detail" >>"$DIR/results.tsv"
done
rm -f "$step_log"

echo
echo "== GPU round: $(seconds_since "$round_start") s; ${stopped:+stopped at $stopped; }results in $DIR"
echo
write_summary "$DIR"
exit $failed
