#!/usr/bin/env bash
# setup.sh: installs what the flavour GPU_LESSONS_TORCH names needs (only what is missing), with
# sudo when not root. Safe to run again.
#   debian  Debian's packages: libtorch-dev (LibTorch 1.13, CPU) and python3-torch (the same
#           build, for the Python yardstick and the tests that read files Python wrote) with
#           python3-torchvision (the tutorial's data pipeline, for the yardstick), and
#           OpenBLAS (OpenMP) selected as the system BLAS: LibTorch runs on whatever BLAS the
#           system provides, and the reference BLAS is about 30x slower; clang, this
#           flavour's compiler, with libclang-rt-dev for its sanitizers and fuzz targets.
#   2.11    torch==2.11.0 from PyPI (CUDA 13) and its torchvision==0.26.0 (the tutorial's data
#           pipeline, for the yardstick) in the project's virtual environment .venv; needs
#           the CUDA toolkit of the same major version (nvcc on the PATH) to configure;
#           clang, this flavour's compiler too.
#   auto    2.11's way with the installed PyTorch when python3 has torch >= 2; else, on a machine
#           with an NVIDIA GPU, 2.11 (scripts/flavour.sh says why, first); else debian.
# Both: cmake, g++, ninja, GoogleTest, Google Benchmark, CLI11, zlib, doxygen, Fashion-MNIST,
# Gloo's headers, matplotlib (the benchmark charts and lesson 20's timeline pictures).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/flavour.sh"
venv=$root/.venv
torch_pin=2.11.0
torch_pin_cuda=13.0     # the CUDA of the wheel torch_pin installs (torch.version.cuda)
torchvision_pin=0.26.0  # the torchvision release built against torch 2.11
[ -z "$flavour_why" ] || echo "setup: flavour 2.11: $flavour_why"

if [ "$flavour" = auto ]; then
  if python3 -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
    flavour=installed
  else
    flavour=debian
  fi
fi

# libgloo-dev: Gloo's headers, which c10d's ProcessGroupGloo.hpp includes (lessons 09, 17 and 18, CPU ranks);
# neither LibTorch flavour ships them.
# clang-format: Debian 12's is version 14, the one scripts/check-format (the suite's style check) uses.
packages=(cmake g++ ninja-build libgtest-dev libbenchmark-dev libcli11-dev zlib1g-dev doxygen
          clang-format dataset-fashion-mnist libgloo-dev python3 python3-matplotlib)
case "$flavour" in
  # clang: the presets' compiler (on LibTorch's headers it compiles in less than half the time
  # g++ takes); its runtimes: the sanitizers and the fuzz targets (libFuzzer).
  debian) packages+=(libtorch-dev python3-torch python3-torchvision libopenblas0-openmp clang
                     libclang-rt-dev) ;;
  2.11) packages+=(python3-venv clang) ;;
esac

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

if [ "$flavour" = debian ]; then
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
fi

if [ "$flavour" = 2.11 ]; then
  # The toolkit first: without it nothing can be built, and the wheel is 3 GB.
  require_cuda_toolkit "$torch_pin_cuda"
  have=$("$venv/bin/python" -c 'import numpy, torch; print(torch.__version__)' 2>/dev/null || true)
  if [ "${have%%+*}" != "$torch_pin" ]; then
    echo "setup: installing torch==$torch_pin from PyPI into $venv (about 3 GB to download)"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "torch==$torch_pin" numpy
  fi
  if ! "$venv/bin/python" -c 'import torchvision' 2>/dev/null; then
    echo "setup: installing torchvision==$torchvision_pin from PyPI into $venv"
    "$venv/bin/python" -m pip install -q "torch==$torch_pin" "torchvision==$torchvision_pin"
  fi
fi

if [ "$flavour" = installed ]; then
  # A CUDA LibTorch's CMake config needs the CUDA toolkit, of the major version it was built with.
  torch_cuda=$(python3 -c 'import torch; print(torch.version.cuda or "")')
  [ -z "$torch_cuda" ] || require_cuda_toolkit "$torch_cuda"
fi
