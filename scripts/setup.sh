#!/usr/bin/env bash
# setup.sh: installs the Debian packages the course needs (only those missing), with sudo when
# not root, and makes sure LibTorch runs on OpenBLAS (OpenMP flavour) rather than the reference
# BLAS, which is about 30x slower. Safe to run again.
set -euo pipefail

packages=(cmake g++ ninja-build libtorch-dev libgtest-dev libbenchmark-dev libcli11-dev
          zlib1g-dev doxygen dataset-fashion-mnist libopenblas0-openmp)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else echo "setup: need root (or sudo) to run: $*" >&2; exit 2
  fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# libblas.so.3 is chosen by update-alternatives. The reference BLAS would make every CPU figure
# of the course meaningless; OpenBLAS's pthread flavour oversubscribes the cores when LibTorch
# runs its own threads too. Select the OpenMP flavour unless the user chose another optimized one.
blas=/usr/lib/x86_64-linux-gnu/libblas.so.3
openmp=/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
current=$(readlink -f "$blas" || true)
case "$current" in
  */openblas-openmp/*) ;;
  */blas/libblas.so.3*|"")
    echo "setup: selecting OpenBLAS (OpenMP) instead of the reference BLAS"
    as_root update-alternatives --set libblas.so.3-x86_64-linux-gnu "$openmp" >/dev/null ;;
  *) echo "setup: note: libblas.so.3 is $current (the course is measured with $openmp)" ;;
esac
