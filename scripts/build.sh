#!/usr/bin/env bash
# build.sh: configures (Release) and builds the course into $BUILD_DIR (default: build/).
# Extra arguments go to CMake's configure step, e.g. -DCMAKE_PREFIX_PATH=/path/to/libtorch.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j "$(nproc)"
