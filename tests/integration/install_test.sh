#!/usr/bin/env bash
# `cmake --install BUILD --prefix P`: dstrain and dstrain-worker side by side in P/bin, and the
# installed `dstrain`, started from another directory, runs a command in the installed worker
# (`estimate`: LibTorch loaded through the run path the install kept).
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
for program in dstrain dstrain-worker; do
  [ -x "$tmp/prefix/bin/$program" ] || { echo "no $tmp/prefix/bin/$program"; cat "$tmp/install.log"; exit 1; }
done
mkdir "$tmp/run"
cp -r "$src/configs" "$tmp/run/configs"
cd "$tmp/run"
out=$("$tmp/prefix/bin/dstrain" estimate configs/tiny.yaml 2>&1) || { echo "$out"; exit 1; }
grep -q "^Model states per rank for configs/models/tiny: 1017216 trainable parameters" <<<"$out" ||
  { echo "unexpected output of the installed dstrain estimate:"; echo "$out"; exit 1; }
echo "install_test: dstrain and dstrain-worker installed in $tmp/prefix/bin ran estimate"
