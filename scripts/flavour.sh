# flavour.sh (sourced by the scripts): the LibTorch flavour and its build folder.
#   GPU_LESSONS_TORCH  auto (default) | debian | 2.11    (see cmake/libtorch.cmake)
#   BUILD_DIR          default: build for auto, build-debian and build-2.11 for the others
#                      (CMakePresets.json's folders), so that the two flavours never share a
#                      folder; run-tests always uses the preset's
# Sets: flavour, build.
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
