# flavour.sh (sourced by the scripts): the LibTorch flavour and its build folder.
#   GPU_LESSONS_TORCH  auto (default) | debian | 2.11    (see cmake/libtorch.cmake)
#   BUILD_DIR          default: build for auto, build-debian and build-2.11 for the others
#                      (CMakePresets.json's folders), so that the two flavours never share a
#                      folder; run-tests always uses the preset's
# Sets: flavour, build. Defines: configure.
flavour=${GPU_LESSONS_TORCH:-auto}
case "$flavour" in
  auto|debian|2.11) ;;
  *) echo "GPU_LESSONS_TORCH='$flavour' is not a flavour" >&2
     echo "HINT: use GPU_LESSONS_TORCH=debian (LibTorch 1.13, CPU), 2.11 (PyTorch 2.11 with CUDA) or auto" >&2
     exit 2 ;;
esac
if [ -n "${BUILD_DIR:-}" ]; then
  build=$BUILD_DIR
elif [ "$flavour" = auto ]; then
  build=$root/build
else
  build=$root/build-$flavour
fi

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
