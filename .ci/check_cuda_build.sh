#!/usr/bin/env bash
# Compiles every CUDA source for sm_90 with nvcc and links them into a shared object, and
# type-checks the CUDA launchers in csrc/*.cpp (REPCAP_WITH_CUDA) against the torch
# headers. Nothing here runs on a GPU; it catches what a GPU-less build host can catch.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
ARCH=${REPCAP_CI_CUDA_ARCH:-sm_90}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
shopt -s nullglob
sources=(csrc/cuda/*.cu)
[ ${#sources[@]} -gt 0 ] || { echo "no .cu files found" >&2; exit 1; }
for f in "${sources[@]}"; do
  echo "nvcc -arch=$ARCH -c $f"
  "$NVCC" -std=c++20 -O3 -arch="$ARCH" --expt-relaxed-constexpr -Xcompiler -fPIC -Werror all-warnings \
    -c "$f" -o "$out/$(basename "$f" .cu).o"
done
"$NVCC" -arch="$ARCH" -shared "$out"/*.o -o "$out/librepcap_cuda_check.so"
echo "linked ${#sources[@]} CUDA object(s) into a shared library for $ARCH"

CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")
[ -f "$CUDA_ROOT/include/cuda_runtime_api.h" ] || CUDA_ROOT=/usr/local/cuda
read -r -a torch_inc < <(python -c "import torch.utils.cpp_extension as c; print(' '.join('-I' + p for p in c.include_paths()))")
py_inc=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
# The CPU torch wheel ships the c10/cuda headers but not this generated one.
mkdir -p "$out/shim/c10/cuda/impl"
printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$out/shim/c10/cuda/impl/cuda_cmake_macros.h"
for f in csrc/*.cpp; do
  echo "g++ -fsyntax-only -DREPCAP_WITH_CUDA $f"
  g++ -std=c++20 -fsyntax-only -I"$out/shim" -fopenmp -DREPCAP_WITH_CUDA -DREPCAP_CUDA_ARCH_LIST='"9.0"' \
    -DTORCH_EXTENSION_NAME=_C "${torch_inc[@]}" -I"$CUDA_ROOT/include" -I"$py_inc" "$f" &
done
wait_all=0
for job in $(jobs -p); do wait "$job" || wait_all=1; done
[ "$wait_all" -eq 0 ] || { echo "a CUDA launcher does not type-check" >&2; exit 1; }
echo "CUDA launchers in csrc/*.cpp type-check"
