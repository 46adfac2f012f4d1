#!/usr/bin/env bash
# build.sh: configures (Release) and builds the course for the flavour GPU_LESSONS_TORCH names
# (auto, debian or 2.11; scripts/flavour.sh) into its build folder ($BUILD_DIR to override).
# Extra arguments go to CMake's configure step, e.g. -DCMAKE_PREFIX_PATH=/path/to/libtorch.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/flavour.sh"
generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DGPU_LESSONS_TORCH="$flavour" "$@"
cmake --build "$build" -j "$(nproc)"
