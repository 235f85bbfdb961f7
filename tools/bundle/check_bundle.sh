#!/usr/bin/env bash
# Checks that a bundle (make_bundle.sh) is self-contained: for every ELF file in bin/, plugins/,
# tests/ and lib/,
#   - every RUNPATH/RPATH entry starts with $ORIGIN and stays inside the bundle;
#   - every NEEDED library is found in those folders, or is the C library or an NVIDIA library
#     (the two named lists of elf_lists.sh, left to the machine it runs on);
#   - the loader agrees (ldd, with an empty environment): each library resolves inside the
#     bundle, or is one of the two lists (an NVIDIA one may be missing here); nothing else.
# Prints one line per problem, naming the file, and exits 1 if there is any.
#
#   check_bundle.sh BUNDLE_DIR
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/elf_lists.sh"
[ $# = 1 ] && [ -d "$1" ] || { echo "check_bundle: usage: check_bundle.sh BUNDLE_DIR (a folder)" >&2; exit 2; }
bundle="$(cd "$1" && pwd -P)"
problems=0
problem() { echo "check_bundle: $*"; problems=$((problems + 1)); }
inside() { case "$1" in "$bundle"|"$bundle"/*) return 0 ;; esac; return 1; }

count=0
while IFS= read -r -d '' f; do
  is_elf "$f" || continue
  count=$((count + 1))
  rel="${f#"$bundle"/}"
  dynamic=$(readelf -d "$f" 2>/dev/null) || { problem "$rel: readelf cannot read it"; continue; }
  origin="$(dirname "$f")"
  dirs=()
  paths=$(sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]$/\2/p' <<<"$dynamic" | tr ':' '\n')
  while IFS= read -r entry; do
    [ -n "$entry" ] || continue
    case "$entry" in
      '$ORIGIN'*|'${ORIGIN}'*) ;;
      *) problem "$rel: RUNPATH entry '$entry' is not relative to the bundle (\$ORIGIN)"; continue ;;
    esac
    entry="${entry/\$\{ORIGIN\}/\$ORIGIN}"
    dir=$(realpath -m "$origin/${entry#\$ORIGIN}")
    if inside "$dir"; then dirs+=("$dir"); else problem "$rel: RUNPATH entry '$entry' leads out of the bundle ($dir)"; fi
  done <<<"$paths"
  for lib in $(sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' <<<"$dynamic"); do
    found=""
    for d in "${dirs[@]+"${dirs[@]}"}"; do [ -e "$d/$lib" ] && { found="$d/$lib"; break; }; done
    [ -n "$found" ] && continue
    is_c_library "$lib" && continue
    is_nvidia_library "$lib" && continue
    problem "$rel needs $lib: not in its RUNPATH folders in the bundle, nor the C library, nor NVIDIA's"
  done
  # What the loader itself finds, with no LD_LIBRARY_PATH (a wrongly kept system library shows up
  # here as a path outside the bundle).
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      is_nvidia_library "$name" || problem "$rel: the loader cannot find $name"
      continue
    fi
    resolved=$(realpath -m "$path")
    inside "$resolved" && continue
    is_c_library "$name" && continue
    is_nvidia_library "$name" && continue
    problem "$rel: the loader takes $name from outside the bundle ($path)"
  done < <(env -i /usr/bin/ldd "$f" 2>&1)
done < <(find "$bundle/bin" "$bundle/plugins" "$bundle/tests" "$bundle/lib" -type f -print0 2>/dev/null)

[ "$count" -gt 0 ] || problem "no ELF files under $bundle/{bin,plugins,tests,lib}"
if [ "$problems" -gt 0 ]; then
  echo "check_bundle: $problems problem(s) in $count ELF files of $bundle"
  exit 1
fi
echo "check_bundle: $count ELF files of $bundle: every library resolves in the bundle or is the C library or NVIDIA's; every RUNPATH stays inside"
