# Source this from a Braid bundle (tools/gpu_bundle.sh made it) before running its programs:
#
#   source braid-gpu/env.sh        # or: . ./env.sh inside the folder
#
# It sets PATH (bin/), BRAID_PLUGIN_PATH (plugins/), BRAID_DATA_DIR (data/), and finds the NVIDIA
# libraries the bundle leaves to this machine (BUNDLE_INFO's nvidia_needed: the CUDA runtime,
# cuBLAS, cuDNN, NCCL...) in, in this order: $BRAID_CUDA_LIBS (colon-separated folders), the CUDA
# toolkit ($CUDA_HOME, $CUDA_PATH, nvcc's, /usr/local/cuda*), the nvidia/*/lib folders of the
# site-packages of $BRAID_PYTHON (default python3: PyTorch's pip wheels ship them), and the
# system's loader cache. Those folders go on LD_LIBRARY_PATH; it prints what it found where, and
# sets BRAID_ENV_PROBLEMS to what is missing (empty when all is well). It never exits the shell
# that sources it.
BRAID_BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
export BRAID_BUNDLE
export PATH="$BRAID_BUNDLE/bin:$PATH"
export BRAID_PLUGIN_PATH="$BRAID_BUNDLE/plugins"
export BRAID_DATA_DIR="$BRAID_BUNDLE/data"
BRAID_ENV_PROBLEMS=""

_braid_info() { sed -n "s/^$1=//p" "$BRAID_BUNDLE/BUNDLE_INFO" 2>/dev/null; }

# The loader cache's listing (ldconfig -p): ldconfig from PATH, else /sbin's (not on every
# user's PATH).
_braid_ldconfig_p() {
  if command -v ldconfig >/dev/null 2>&1; then ldconfig -p 2>/dev/null; else /sbin/ldconfig -p 2>/dev/null; fi
}

# The C library: the bundle carries everything but glibc, which must be at least the version its
# programs were linked against. GCC's runtime in lib/ may want a newer one than the rest; then the
# machine's own libstdc++ and libgcc_s are used instead (put first on LD_LIBRARY_PATH through a
# folder of links), if they have the GLIBCXX version the programs need.
_braid_older() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ] && [ "$1" != "$2" ]; }
# The decision, from what this machine has: its glibc version (getconf GNU_LIBC_VERSION) and the
# loader cache's libstdc++.so.6 and libgcc_s.so.1, against BUNDLE_INFO's glibc_min,
# glibc_min_gcc_runtime and glibcxx_min. Sets _braid_gcc_dir (a folder of links to the system's
# two libraries, to go first on LD_LIBRARY_PATH; empty when the bundled ones serve) and appends
# to BRAID_ENV_PROBLEMS; prints a line when it falls back. Without a glibc version (not glibc?)
# it decides nothing. tools/bundle/env_glibc_test.sh drives it with a fake getconf and ldconfig.
_braid_choose_gcc_runtime() {
  _braid_gcc_dir=""
  local have sys gcc
  have="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
  [ -n "$have" ] || return 0
  if _braid_older "$have" "$(_braid_info glibc_min)"; then
    BRAID_ENV_PROBLEMS="${BRAID_ENV_PROBLEMS:+$BRAID_ENV_PROBLEMS; }glibc $have here, the bundle's programs need >= $(_braid_info glibc_min): build the bundle on an older distribution"
  elif _braid_older "$have" "$(_braid_info glibc_min_gcc_runtime)"; then
    sys=$(_braid_ldconfig_p | awk '$1 == "libstdc++.so.6" && /x86-64/ {print $NF; exit}')
    gcc=$(_braid_ldconfig_p | awk '$1 == "libgcc_s.so.1" && /x86-64/ {print $NF; exit}')
    if [ -n "$sys" ] && [ -n "$gcc" ] && grep -aq "GLIBCXX_$(_braid_info glibcxx_min)" "$sys"; then
      _braid_gcc_dir="$(mktemp -d "${TMPDIR:-/tmp}/braid-gcc-runtime.XXXXXX")"
      ln -s "$sys" "$_braid_gcc_dir/libstdc++.so.6"
      ln -s "$gcc" "$_braid_gcc_dir/libgcc_s.so.1"
      echo "env.sh: glibc $have is older than the bundled libstdc++ wants ($(_braid_info glibc_min_gcc_runtime)): using the system's $sys and $gcc"
    else
      BRAID_ENV_PROBLEMS="${BRAID_ENV_PROBLEMS:+$BRAID_ENV_PROBLEMS; }glibc $have here is older than the bundled libstdc++ needs ($(_braid_info glibc_min_gcc_runtime)), and the system's libstdc++ (${sys:-none}) lacks GLIBCXX_$(_braid_info glibcxx_min): install a newer libstdc++6, or build the bundle on an older distribution"
    fi
  fi
}
_braid_choose_gcc_runtime

# Candidate folders for the NVIDIA libraries, in order.
_braid_dirs=()
IFS=: read -r -a _braid_extra <<< "${BRAID_CUDA_LIBS:-}"
for _d in "${_braid_extra[@]+"${_braid_extra[@]}"}"; do [ -n "$_d" ] && _braid_dirs+=("$_d"); done
for _root in "${CUDA_HOME:-}" "${CUDA_PATH:-}" \
             "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")")" \
             /usr/local/cuda /usr/local/cuda-*; do
  [ -n "$_root" ] || continue
  for _d in "$_root/lib64" "$_root/lib" "$_root/targets/x86_64-linux/lib"; do
    [ -d "$_d" ] && _braid_dirs+=("$_d")
  done
done
_braid_py="${BRAID_PYTHON:-python3}"
if command -v "$_braid_py" >/dev/null 2>&1; then
  while IFS= read -r _d; do [ -d "$_d" ] && _braid_dirs+=("$_d"); done < <(
    "$_braid_py" - 2>/dev/null <<'PY'
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
seen = set()
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        d = os.path.realpath(d)
        if d not in seen:
            seen.add(d)
            print(d)
PY
  )
fi

# Each needed library: the first candidate folder holding it, else the loader cache.
_braid_ld=()
for _lib in $(_braid_info nvidia_needed); do
  _found=""
  for _d in "${_braid_dirs[@]+"${_braid_dirs[@]}"}"; do
    if [ -e "$_d/$_lib" ]; then _found="$_d"; break; fi
  done
  if [ -n "$_found" ]; then
    echo "env.sh: $_lib: $_found"
    case " ${_braid_ld[*]-} " in *" $_found "*) ;; *) _braid_ld+=("$_found") ;; esac
  elif _cached=$(_braid_ldconfig_p | awk -v l="$_lib" '$1 == l {print $NF; exit}') &&
       [ -n "$_cached" ]; then
    echo "env.sh: $_lib: $_cached (the system's)"
  else
    echo "env.sh: $_lib: NOT FOUND (set BRAID_CUDA_LIBS to the folder holding it)"
    BRAID_ENV_PROBLEMS="${BRAID_ENV_PROBLEMS:+$BRAID_ENV_PROBLEMS; }$_lib not found"
  fi
done
# The driver (libcuda.so.1), which the CUDA runtime opens itself: only the system has it.
if [ -n "$(_braid_info nvidia_needed)" ]; then
  _drv=$(_braid_ldconfig_p | awk '$1 == "libcuda.so.1" {print $NF; exit}')
  echo "env.sh: libcuda.so.1 (the driver): ${_drv:-not in the loader cache}"
fi
[ -n "$_braid_gcc_dir" ] && _braid_ld=("$_braid_gcc_dir" "${_braid_ld[@]+"${_braid_ld[@]}"}")
# Prepended, each once (sourcing twice changes nothing).
for ((_i = ${#_braid_ld[@]} - 1; _i >= 0; _i--)); do
  _d="${_braid_ld[$_i]}"
  case ":${LD_LIBRARY_PATH:-}:" in *":$_d:"*) ;; *) LD_LIBRARY_PATH="$_d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
done
export LD_LIBRARY_PATH
export BRAID_ENV_PROBLEMS
[ -z "$BRAID_ENV_PROBLEMS" ] || echo "env.sh: PROBLEM: $BRAID_ENV_PROBLEMS"
unset _braid_dirs _braid_extra _braid_py _braid_ld _i _d _root _lib _found _cached _drv \
  _braid_gcc_dir
unset -f _braid_info _braid_older _braid_ldconfig_p _braid_choose_gcc_runtime
