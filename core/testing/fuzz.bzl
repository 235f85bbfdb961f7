"""braid_fuzzer: one libFuzzer target, and the test that replays its kept corpus.

A fuzz target is a source file defining LLVMFuzzerTestOneInput, next to the parser it feeds, and
a folder `fuzz_corpus/<name>/` beside it with the inputs worth keeping (seeds, and what fuzzing
found that reaches new code). One line in the package's BUILD:

    braid_fuzzer(name = "config_fuzzer", srcs = ["config_fuzzer.cc"], deps = [":config"])

makes
  - `<name>`: the target. In the ordinary build (g++) it links a main that runs the target over
    the files it is given; under `--config=fuzz` (clang-14, libFuzzer, ASan and UBSan: use
    tools/fuzz/run.sh, which keeps that build in an output root of its own) it is a fuzzer.
  - `<name>_corpus_test`: `bazel test` replays the corpus in seconds, so a crash once found and
    kept stays fixed.
"""

def braid_fuzzer(name, srcs, deps = [], data = [], size = "small"):
    corpus = name + "_corpus"
    native.filegroup(
        name = corpus,
        srcs = native.glob(["fuzz_corpus/" + name + "/**"]),
    )
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs,
        data = data,
        deps = deps + select({
            "//core/testing:fuzz_build": [],
            "//conditions:default": ["//core/testing:fuzz_replay_main"],
        }),
        linkopts = select({
            "//core/testing:fuzz_build": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = size,
        srcs = srcs,
        data = data + [":" + corpus],
        args = ["$(locations :" + corpus + ")"],
        deps = deps + ["//core/testing:fuzz_replay_main"],
    )
