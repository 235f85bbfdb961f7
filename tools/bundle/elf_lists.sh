# Sourced by make_bundle.sh and check_bundle.sh: which shared libraries a bundle leaves to the
# machine it runs on. Two named lists (extended regular expressions on the file name), nothing
# else:
#   the C library (glibc's own objects: every Linux machine has them, and they must match its
#   loader and kernel), and
#   NVIDIA's (the driver's libcuda and the CUDA toolkit's runtime, cuBLAS/cuBLASLt, cuDNN, NCCL,
#   NVRTC, nvJitLink...: the GPU machine's, matched to its driver; env.sh finds them in its CUDA
#   toolkit and in the nvidia/*/lib folders of PyTorch's site-packages).
C_LIBRARY_RE='^(linux-vdso\.so\..*|ld-linux.*\.so\..*|libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnss_.*\.so\..*|libBrokenLocale\.so\.1)$'
NVIDIA_RE='^(libcuda\.so.*|libcudart\.so.*|libcublas\.so.*|libcublasLt\.so.*|libcudnn.*\.so.*|libnccl\.so.*|libnvrtc.*\.so.*|libnvJitLink\.so.*|libnvidia-.*\.so.*|libcufft.*\.so.*|libcurand\.so.*|libcusparse.*\.so.*|libcusolver.*\.so.*|libnvToolsExt\.so.*|libcupti\.so.*)$'

is_elf() { [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }
is_c_library() { [[ "$1" =~ $C_LIBRARY_RE ]]; }
is_nvidia_library() { [[ "$1" =~ $NVIDIA_RE ]]; }
