# Sourced by gpu-bundle/run and gpu-bundle/dstrain: where the device's LibTorch and CUDA libraries
# are. The bundle carries everything else (scripts/gpu/bundle); LibTorch, the CUDA runtime and its
# libraries (cuBLAS, cuDNN, NCCL, ...) are the device's own, from its torch wheel:
#   <site-packages>/torch/lib          libtorch*.so, libc10*.so
#   <site-packages>/nvidia/*/lib       libcudart.so.13 (nvidia/cu13/lib), libnccl.so.2, cuDNN, ...
# The torch package is located with the device's python3 without importing it (no CUDA or NumPy
# start-up). DSTRAIN_TORCH_LIB overrides that (the CPU rehearsal takes LibTorch from a directory of
# links elsewhere); DSTRAIN_PYTHON names another python3.
# Exports DSTRAIN_BUNDLE, DSTRAIN_TORCH_LIB and DSTRAIN_LD_PATH (what LD_LIBRARY_PATH must hold for
# the bundle's binaries). glibc and libstdc++ are the device's: manifest.json says which symbol
# versions they must have, and ldd in the run's first step says whether they do.

DSTRAIN_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${DSTRAIN_TORCH_LIB:-}" ]; then
  DSTRAIN_TORCH_LIB=$("${DSTRAIN_PYTHON:-python3}" -c '
import importlib.util, os
spec = importlib.util.find_spec("torch")
print(os.path.join(os.path.dirname(spec.origin), "lib") if spec and spec.origin else "")')
fi
if [ -z "$DSTRAIN_TORCH_LIB" ] || [ ! -e "$DSTRAIN_TORCH_LIB/libtorch.so" ]; then
  echo "gpu-bundle/env.sh: no LibTorch found ('${DSTRAIN_TORCH_LIB}'): ${DSTRAIN_PYTHON:-python3}" \
       "has no torch package; set DSTRAIN_TORCH_LIB=<site-packages>/torch/lib" >&2
  return 2 2>/dev/null || exit 2
fi
DSTRAIN_LD_PATH=$DSTRAIN_TORCH_LIB
for dir in "$(dirname "$(dirname "$DSTRAIN_TORCH_LIB")")"/nvidia/*/lib; do
  [ -d "$dir" ] && DSTRAIN_LD_PATH=$DSTRAIN_LD_PATH:$dir
done
export DSTRAIN_BUNDLE DSTRAIN_TORCH_LIB DSTRAIN_LD_PATH
