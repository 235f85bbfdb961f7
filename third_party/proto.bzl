"""C++ code from a .proto file with the system protoc (Debian's protobuf-compiler).

Bazel's own proto rules want to build protoc from source, which is not possible offline.
"""

def braid_cc_proto(name, src, deps = [], imports = [], visibility = None):
    """`imports`: the .proto files `src` imports (labels), for protoc to read; `deps` the
    libraries of their generated code."""
    base = src[:-len(".proto")]
    pkg = native.package_name()
    native.genrule(
        name = name + "_gen",
        srcs = [src] + imports,
        outs = [base + ".pb.h", base + ".pb.cc"],
        cmd = "/usr/bin/protoc --proto_path=. --cpp_out=$(GENDIR) " + pkg + "/" + src,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        deps = deps + ["//third_party:protobuf"],
        visibility = visibility,
    )
