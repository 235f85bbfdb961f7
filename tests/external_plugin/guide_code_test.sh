#!/usr/bin/env bash
# The guide's code blocks cannot drift from code that compiles: every block of
# docs/WRITING_A_STRATEGY.md preceded by `<!-- code: FILE#REGION -->` must equal, line for line
# (indentation removed), the lines between `// [START REGION]` and `// [END REGION]` in FILE,
# which Bazel compiles (tests/external_plugin/external_example.cc, core/wrapping_strategy_test.cc)
# and the tests run. The test fails if a tagged block differs, if a region is missing, or if
# there are no tagged blocks.
set -u
root="$TEST_SRCDIR/braid"
/usr/bin/python3 - "$root" <<'PY'
import os, re, sys, textwrap
root = sys.argv[1]
guide = open(os.path.join(root, "docs/WRITING_A_STRATEGY.md")).read()
tags = list(re.finditer(r"<!-- code: ([^#\s]+)#(\w+) -->\n```\w*\n(.*?)```\n", guide, re.S))
fails = 0
if len(tags) < 3:
    print(f"FAIL only {len(tags)} tagged code block(s) in the guide; want the setup, train_step and register regions")
    fails += 1
for m in tags:
    path, name, block = m.group(1), m.group(2), m.group(3)
    src = open(os.path.join(root, path)).read()
    r = re.search(r"[ \t]*// \[START " + name + r"\]\n(.*?)[ \t]*// \[END " + name + r"\]\n", src, re.S)
    if r is None:
        print(f"FAIL {path} has no region {name}"); fails += 1; continue
    want = textwrap.dedent(r.group(1)).rstrip("\n")
    got = block.rstrip("\n")
    if want != got:
        import difflib
        print(f"FAIL the guide's block {path}#{name} differs from the code:")
        sys.stdout.writelines(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "code", "guide"))
        fails += 1
    else:
        print(f"ok   {path}#{name}: {len(want.splitlines())} lines")
sys.exit(1 if fails else 0)
PY
