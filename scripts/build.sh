#!/usr/bin/env bash
# build.sh: configures and builds the course for the flavour GPU_LESSONS_TORCH names (auto,
# debian or 2.11; scripts/flavour.sh), with CMakePresets.json's preset of that name, into its
# build folder ($BUILD_DIR to override). Extra arguments go to CMake's configure step, e.g.
# -DCMAKE_PREFIX_PATH=/path/to/libtorch.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/flavour.sh"
configure "$flavour" "$build" "$@"
cmake --build "$build" -j "$(nproc)"
