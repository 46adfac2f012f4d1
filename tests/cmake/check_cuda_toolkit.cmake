# Runs configure's CUDA toolkit check alone: cmake -DTORCH_CUDA=13.0 -DTOOLKIT=12.4 -P this.
# TOOLKIT empty means no toolkit was found. The tests read the message it stops with.
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/torch_helpers.cmake)
gpu_lessons_check_cuda_toolkit("${TORCH_CUDA}" "${TOOLKIT}" "/opt/cuda-${TOOLKIT}/bin")
