#!/usr/bin/env bash
# A machine without the CUDA toolkit, with the torch wheel (a CUDA LibTorch) in the environment:
# configure must succeed and build for the CPU against the wheel's CPU libraries
# (cmake/DstrainTorch.cmake), not stop in Torch's own CMake files. The toolkit of this machine is
# hidden for the test: a private mount namespace binds an empty directory over it, and PATH loses
# its CUDA entries. Configure only (the build itself is the CPU build every test here runs).
#   no_cuda_toolkit_test.sh SOURCE_DIR TORCH_PREFIX_PATH PYTHON
# Exits 77 (skipped) where that cannot be arranged: not root, no unshare, no toolkit to hide, or a
# CPU-only LibTorch (whose CMake files need no toolkit anyway).
set -euo pipefail
src=$1 prefix=$2 python=$3
[ "$(id -u)" = 0 ] || { echo "skipped: needs root for a private mount namespace"; exit 77; }
command -v unshare >/dev/null || { echo "skipped: no unshare"; exit 77; }
# The toolkit's directory: CUDA_HOME, /usr/local/cuda, or that of an nvcc binary on PATH (not a
# wrapper script that execs another).
toolkit=${CUDA_HOME:-}
[ -n "$toolkit" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || toolkit=/usr/local/cuda
if [ -z "$toolkit" ] && nvcc=$(command -v nvcc) && file -L "$nvcc" | grep -q ELF; then
  toolkit=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
fi
[ -n "$toolkit" ] || { echo "skipped: no CUDA toolkit to hide"; exit 77; }
toolkit=$(readlink -f "$toolkit")
torch_lib=$(dirname "$(dirname "$prefix")")/lib  # PREFIX: torch/share/cmake
[ -e "$torch_lib/libtorch_cuda.so" ] || { echo "skipped: $torch_lib has no libtorch_cuda.so"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/empty" "$tmp/build"
set +e
unshare -m bash -c '
  mount --bind "$1" "$2" || exit 90
  PATH=$(tr ":" "\n" <<<"$PATH" | grep -v cuda | paste -sd:)
  ! nvcc --version >/dev/null 2>&1 || { echo "nvcc still works: $(command -v nvcc)"; exit 91; }
  cmake -S "$3" -B "$4" -G Ninja -DCMAKE_PREFIX_PATH="$5" -DPython3_EXECUTABLE="$6" \
    -DDSTRAIN_TESTS=OFF' _ "$tmp/empty" "$toolkit" "$src" "$tmp/build" "$prefix" "$python" \
  >"$tmp/configure.log" 2>&1
rc=$?
set -e
[ $rc != 90 ] || { echo "skipped: cannot bind-mount over $toolkit"; exit 77; }
if [ $rc != 0 ]; then
  echo "configure without the CUDA toolkit ($toolkit hidden) failed (exit $rc):"
  tail -30 "$tmp/configure.log"
  exit 1
fi
for line in "no CUDA toolkit found" "building for the CPU against the CPU libraries of the CUDA LibTorch" \
            "device code: OFF"; do
  grep -q "$line" "$tmp/configure.log" || { echo "configure did not say: $line"; cat "$tmp/configure.log"; exit 1; }
done
grep "dstrain:" "$tmp/configure.log"
echo "no_cuda_toolkit_test: configure without $toolkit builds for the CPU against $torch_lib"
