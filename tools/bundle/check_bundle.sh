#!/usr/bin/env bash
# Checks that a bundle (make_bundle.sh) is self-contained: for every ELF file in bin/, plugins/,
# tests/ and lib/,
#   - every RUNPATH/RPATH entry starts with $ORIGIN and stays inside the bundle;
#   - every NEEDED library is found in those folders, or is the C library or an NVIDIA library
#     (the two named lists of elf_lists.sh, left to the machine it runs on);
#   - the loader agrees (ldd, with an empty environment, from each program, plugin and test): each
#     library resolves inside the bundle, or is one of the two lists (an NVIDIA one may be missing
#     here); nothing else. ldd follows lib/ transitively, so lib/'s files need no run of their own.
# Prints one line per problem, naming the file, and exits 1 if there is any. One readelf and one
# awk for the whole bundle: a check of ~70 files stays cheap on a loaded machine.
#
#   check_bundle.sh BUNDLE_DIR
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/elf_lists.sh"
[ $# = 1 ] && [ -d "$1" ] || { echo "check_bundle: usage: check_bundle.sh BUNDLE_DIR (a folder)" >&2; exit 2; }
bundle="$(cd "$1" && pwd -P)"

elves=()
while IFS= read -r -d '' f; do is_elf "$f" && elves+=("$f"); done \
  < <(find "$bundle/bin" "$bundle/plugins" "$bundle/tests" "$bundle/lib" -type f -print0 2>/dev/null)
if [ ${#elves[@]} = 0 ]; then
  echo "check_bundle: no ELF files under $bundle/{bin,plugins,tests,lib}"
  exit 1
fi

# Static: RUNPATHs and NEEDED entries, for every file at once.
report=$( {
  find "$bundle" \( -type f -o -type l \) -printf 'EXISTS %p\n'
  LC_ALL=C readelf -d "${elves[@]}" 2>&1
} | awk -v bundle="$bundle" -v c_re="$C_LIBRARY_RE" -v nv_re="$NVIDIA_RE" '
  function norm(p,   n, i, k, parts, out, s) {  # resolves . and .. in an absolute path
    n = split(p, parts, "/"); k = 0
    for (i = 1; i <= n; i++) {
      if (parts[i] == "" || parts[i] == ".") continue
      if (parts[i] == "..") { if (k > 0) k--; continue }
      out[++k] = parts[i]
    }
    s = ""; for (i = 1; i <= k; i++) s = s "/" out[i]
    return s == "" ? "/" : s
  }
  function inside(p) { return p == bundle || index(p, bundle "/") == 1 }
  function rel(p) { return substr(p, length(bundle) + 2) }
  function finish(   i, j, lib, ok) {
    if (file == "") return
    for (i = 1; i <= nneeded; i++) {
      lib = needed[i]; ok = 0
      for (j = 1; j <= ndirs; j++) if ((dirs[j] "/" lib) in exists) { ok = 1; break }
      if (!ok && lib !~ c_re && lib !~ nv_re)
        print "check_bundle: " rel(file) " needs " lib ": not in its RUNPATH folders in the bundle, nor the C library, nor NVIDIA'"'"'s"
    }
  }
  $1 == "EXISTS" { exists[substr($0, 8)] = 1; next }
  /^File: / { finish(); file = substr($0, 7); nneeded = 0; ndirs = 0; origin = file; sub(/\/[^\/]*$/, "", origin); next }
  /^readelf: / { print "check_bundle: " $0; next }
  /\((RUNPATH|RPATH)\)/ {
    v = $0; sub(/.*\[/, "", v); sub(/\]$/, "", v)
    n = split(v, entries, ":")
    for (i = 1; i <= n; i++) {
      e = entries[i]; if (e == "") continue
      sub(/^\$\{ORIGIN\}/, "$ORIGIN", e)
      if (substr(e, 1, 7) != "$ORIGIN") { print "check_bundle: " rel(file) ": RUNPATH entry '"'"'" e "'"'"' is not relative to the bundle ($ORIGIN)"; continue }
      d = norm(origin "/" substr(e, 8))
      if (inside(d)) dirs[++ndirs] = d
      else print "check_bundle: " rel(file) ": RUNPATH entry '"'"'" e "'"'"' leads out of the bundle (" d ")"
    }
    next
  }
  /\(NEEDED\)/ { v = $0; sub(/.*\[/, "", v); sub(/\]$/, "", v); needed[++nneeded] = v; next }
  END { finish() }
')
[ -z "$report" ] || echo "$report"
problems=$(grep -c . <<<"$report")

# Dynamic: what the loader itself finds, with no LD_LIBRARY_PATH (a wrongly kept system library
# shows up here as a path outside the bundle).
for f in "${elves[@]}"; do
  case "${f#"$bundle"/}" in lib/*) continue ;; esac
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      is_nvidia_library "$name" && continue
      echo "check_bundle: ${f#"$bundle"/}: the loader cannot find $name"; problems=$((problems + 1))
      continue
    fi
    case "$(realpath -m "$path")" in "$bundle"/*) continue ;; esac
    is_c_library "$name" && continue
    is_nvidia_library "$name" && continue
    echo "check_bundle: ${f#"$bundle"/}: the loader takes $name from outside the bundle ($path)"
    problems=$((problems + 1))
  done < <(env -i /usr/bin/ldd "$f" 2>&1)
done

if [ "$problems" -gt 0 ]; then
  echo "check_bundle: $problems problem(s) in ${#elves[@]} ELF files of $bundle"
  exit 1
fi
echo "check_bundle: ${#elves[@]} ELF files of $bundle: every library resolves in the bundle or is the C library or NVIDIA's; every RUNPATH stays inside"
