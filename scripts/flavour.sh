# flavour.sh (sourced by the scripts): the LibTorch flavour and its build folder.
#   GPU_LESSONS_TORCH  auto (default) | debian | 2.11    (see cmake/libtorch.cmake)
#   BUILD_DIR          default: build for auto, build-debian and build-2.11 for the others
#                      (CMakePresets.json's folders), so that the two flavours never share a
#                      folder; run-tests always uses the preset's
# auto on a machine with an NVIDIA GPU (its driver's device node, /dev/nvidia0) whose python3 has
# no PyTorch 2 is the 2.11 flavour: Debian's LibTorch has no CUDA, and a learner with a GPU
# would run every lesson on the CPU. (GPU_LESSONS_NVIDIA_DEVICE names another node: the tests'.)
# Sets: flavour, build, flavour_why (why auto became 2.11; "" otherwise). Defines: configure,
# require_cuda_toolkit.
flavour=${GPU_LESSONS_TORCH:-auto}
case "$flavour" in
  auto|debian|2.11) ;;
  *) echo "GPU_LESSONS_TORCH='$flavour' is not a flavour" >&2
     echo "HINT: use GPU_LESSONS_TORCH=debian (LibTorch 1.13, CPU), 2.11 (PyTorch 2.11 with CUDA) or auto" >&2
     exit 2 ;;
esac
flavour_why=""
nvidia_device=${GPU_LESSONS_NVIDIA_DEVICE:-/dev/nvidia0}
if [ "$flavour" = auto ] && [ -e "$nvidia_device" ] &&
   ! python3 -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  flavour=2.11
  flavour_why="an NVIDIA GPU is here ($nvidia_device) and python3 has no PyTorch 2: the 2.11 flavour (PyTorch 2.11 with CUDA 13, in .venv), not Debian's LibTorch 1.13, which has no CUDA"
fi
if [ -n "${BUILD_DIR:-}" ]; then
  build=$BUILD_DIR
elif [ "$flavour" = auto ]; then
  build=$root/build
else
  build=$root/build-$flavour
fi

# require_cuda_toolkit MAJOR.MINOR: returns when nvcc on the PATH is of that CUDA major version (a
# CUDA LibTorch's CMake config needs the toolkit it was built with); else says what to install
# and exits 2.
require_cuda_toolkit() {
  local want=$1 have
  if ! command -v nvcc >/dev/null; then
    echo "setup: PyTorch is built with CUDA $want; building the course against it needs the CUDA" \
         "$want toolkit (nvcc), and nvcc is not on the PATH" >&2
    echo "HINT: install NVIDIA's CUDA ${want%%.*}.x toolkit (https://developer.nvidia.com/cuda-downloads," \
         "or Debian's cuda-toolkit-${want%%.*}-${want#*.} from NVIDIA's repository) and add its bin/" \
         "to the PATH (export PATH=/usr/local/cuda/bin:\$PATH), or use GPU_LESSONS_TORCH=debian" \
         "(the CPU only)" >&2
    exit 2
  fi
  have=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  if [ "${have%%.*}" != "${want%%.*}" ]; then
    echo "setup: PyTorch is built with CUDA $want, but nvcc ($(command -v nvcc)) is CUDA $have:" \
         "code compiled against the wrong headers reads CUDA's structs wrongly" >&2
    echo "HINT: put the CUDA ${want%%.*}.x toolkit's nvcc first on the PATH" >&2
    exit 2
  fi
}

# configure PRESET DIR [ARGS...]: CMake's configure step, CMakePresets.json's PRESET into DIR.
# CMake cannot change the compiler of a configured folder (it then half-forgets the folder's
# settings): a folder configured with another compiler than the one PRESET names (build-debian
# from before the debian preset named clang) is configured afresh.
configure() {
  local preset=$1 dir=$2 want have
  local fresh=()
  shift 2
  want=$(cd "$root" && cmake --preset "$preset" -N | sed -n 's/^  CMAKE_CXX_COMPILER="\(.*\)"$/\1/p')
  have=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$dir/CMakeCache.txt" 2>/dev/null || true)
  if [ -n "$want" ] && [ -n "$have" ] && [ "$(basename "$have")" != "$want" ]; then
    fresh=(--fresh)
  fi
  cmake -S "$root" --preset "$preset" -B "$dir" "${fresh[@]}" "$@"
}
