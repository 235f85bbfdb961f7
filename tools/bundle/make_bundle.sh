#!/usr/bin/env bash
# Makes a relocatable folder of built Braid programs (docs/GPU.md, "The bundle"): the programs,
# plugins and test binaries given, every shared library they need copied into lib/ except the C
# library and the NVIDIA ones (the driver, CUDA, cuBLAS, cuDNN, NCCL: the GPU machine has its own,
# matched to its driver, and env.sh finds them there), stripped, with RUNPATHs relative to the
# bundle ($ORIGIN/../lib for programs and plugins, $ORIGIN for lib/ itself, whose libraries need
# each other: a RUNPATH serves only its own object's NEEDED entries).
#
#   make_bundle.sh OUT_DIR [--bin FILE]... [--plugin FILE]... [--test FILE]... [--config FILE]...
#                  [--data FILE]... [--file DEST=FILE]... [--no-strip]
#
# --data takes a data set file by its path under a node_modules folder (…/node_modules/<rel>) and
# keeps <rel> under OUT_DIR/data/node_modules, where the programs look (BRAID_DATA_DIR, set by
# env.sh). --file copies FILE to OUT_DIR/DEST. Libraries are found as the build machine's loader
# finds them (ldd), so run it where the programs were built. Fails, naming the file, on anything
# it cannot resolve.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/elf_lists.sh"

die() { echo "make_bundle: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: make_bundle.sh OUT_DIR [--bin FILE]... [--plugin FILE]... [--test FILE]... [--config FILE]... [--data FILE]... [--file DEST=FILE]..."
out="$1"; shift
strip=1
bins=(); plugins=(); tests=(); configs=(); data=(); files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin|--plugin|--test|--config|--data|--file)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --bin) bins+=("$2") ;; --plugin) plugins+=("$2") ;; --test) tests+=("$2") ;;
        --config) configs+=("$2") ;; --data) data+=("$2") ;; --file) files+=("$2") ;;
      esac
      shift 2 ;;
    --no-strip) strip=0; shift ;;
    *) die "unknown argument '$1'" ;;
  esac
done
for tool in patchelf readelf ldd strip; do
  command -v "$tool" >/dev/null || die "'$tool' is missing: run tools/setup.sh (patchelf is a Debian package)"
done

rm -rf "$out"
mkdir -p "$out"/{bin,lib,plugins,tests,configs}
copy_exe() {  # FILE DEST_DIR
  [ -f "$1" ] || die "$1: no such file (was it built?)"
  cp -L "$1" "$2/" && chmod u+w,a+rx "$2/$(basename "$1")"
}
for f in "${bins[@]+"${bins[@]}"}"; do copy_exe "$f" "$out/bin"; done
for f in "${plugins[@]+"${plugins[@]}"}"; do copy_exe "$f" "$out/plugins"; done
for f in "${tests[@]+"${tests[@]}"}"; do copy_exe "$f" "$out/tests"; done
for f in "${configs[@]+"${configs[@]}"}"; do
  [ -f "$f" ] || die "$f: no such config"
  cp -L "$f" "$out/configs/"
done
for f in "${data[@]+"${data[@]}"}"; do
  case "$f" in */node_modules/*) ;; *) die "--data $f: not under a node_modules folder" ;; esac
  [ -f "$f" ] || die "--data $f: no such file (tools/setup.sh installs the data sets)"
  rel="${f##*/node_modules/}"
  mkdir -p "$out/data/node_modules/$(dirname "$rel")"
  cp -L "$f" "$out/data/node_modules/$rel"
done
for spec in "${files[@]+"${files[@]}"}"; do
  dest="${spec%%=*}"; src="${spec#*=}"
  [ -f "$src" ] || die "--file $spec: no such file"
  mkdir -p "$out/$(dirname "$dest")"
  cp -L "$src" "$out/$dest"
done

# Every library the ELF files need, transitively, as this machine's loader resolves them. An
# unresolved one is an error here, not a surprise on the GPU machine.
elves=()
while IFS= read -r -d '' f; do is_elf "$f" && elves+=("$f"); done \
  < <(find "$out/bin" "$out/plugins" "$out/tests" -type f -print0)
[ ${#elves[@]} -gt 0 ] || die "nothing to bundle: give --bin, --plugin or --test files"
declare -A wanted=() nvidia=()
for f in "${elves[@]}"; do
  # The original's search path (its RUNPATH, e.g. the CUDA toolkit's lib64) still applies here.
  listing=$(ldd "$f" 2>&1) || die "ldd $f failed: $listing"
  if grep -q 'not found' <<<"$listing"; then
    die "$f needs libraries this machine cannot find: $(grep 'not found' <<<"$listing" | xargs)"
  fi
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_c_library "$name" && continue
    if is_nvidia_library "$name"; then nvidia["$name"]=1; continue; fi
    wanted["$name"]="$path"
  done <<<"$listing"
done
for name in "${!wanted[@]}"; do
  cp -L "${wanted[$name]}" "$out/lib/$name"
  chmod u+w "$out/lib/$name"
done

# Strip first (strip after patchelf can undo its layout), then point every RUNPATH inside.
if [ "$strip" = 1 ]; then
  for f in "${elves[@]}"; do strip --strip-unneeded "$f"; done
  for f in "$out"/lib/*; do [ -f "$f" ] && strip --strip-unneeded "$f"; done
fi
for f in "${elves[@]}"; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$out"/lib/*; do [ -f "$f" ] && patchelf --set-rpath '$ORIGIN' "$f"; done

# The newest glibc symbol version each part needs. GCC's runtime (libstdc++, libgcc_s) is built
# against the newest glibc of all (Debian 12's libstdc++ wants 2.36's arc4random), so it gets
# its own figure: on an older C library env.sh uses the machine's own GCC runtime instead, when
# that one has the GLIBCXX version the rest needs; otherwise it refuses, naming the versions,
# instead of the loader's "version GLIBC_2.xx not found" per program.
newest() { grep -o "$1[0-9.]*[0-9]" | sort -V -u | tail -1 | sed "s/^$1//"; }
own=(); runtime=()
for f in "${elves[@]}" "$out"/lib/*; do
  [ -f "$f" ] || continue
  case "$(basename "$f")" in libstdc++.so.*|libgcc_s.so.*) runtime+=("$f") ;; *) own+=("$f") ;; esac
done
glibc=$(for f in "${own[@]}"; do objdump -T "$f" 2>/dev/null; done | newest GLIBC_2.)
glibc_runtime=$(for f in "${runtime[@]+"${runtime[@]}"}"; do objdump -T "$f" 2>/dev/null; done | newest GLIBC_2.)
glibcxx=$(for f in "${own[@]}"; do objdump -T "$f" 2>/dev/null; done | newest GLIBCXX_3.)
{
  echo "glibc_min=2.${glibc:-0}"
  echo "glibc_min_gcc_runtime=2.${glibc_runtime:-0}"
  echo "glibcxx_min=3.${glibcxx:-0}"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nvidia_needed=$(printf '%s\n' "${!nvidia[@]}" | sort | xargs)"
  echo "build_host_glibc=$(ldd --version | head -1 | awk '{print $NF}')"
} > "$out/BUNDLE_INFO"
cp "$here/env.sh" "$out/env.sh"
chmod +x "$out/env.sh"
echo "make_bundle: $out: ${#elves[@]} programs/plugins/tests, $(ls "$out/lib" | wc -l) libraries, needs glibc >= 2.${glibc:-0} (2.${glibc_runtime:-0} with its own libstdc++)"
