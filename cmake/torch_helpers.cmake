# torch_helpers.cmake: functions that cmake/libtorch.cmake uses to find and check a LibTorch
# (kept apart so that the tests can run the checks alone, with cmake -P).
# Asks `python` for its torch: version, CUDA version ("" for a CPU build) and CMake prefix.
function(gpu_lessons_query_python_torch python out_ok out_version out_cuda out_prefix)
  execute_process(
    COMMAND ${python} -c
      "import torch; print(torch.__version__.split('+')[0]); print(torch.version.cuda or ''); print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _out RESULT_VARIABLE _rc ERROR_VARIABLE _err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    set(${out_ok} FALSE PARENT_SCOPE)
    return()
  endif()
  string(REPLACE "\n" ";" _lines "${_out}")
  list(LENGTH _lines _n)
  if(_n LESS 3)
    set(${out_ok} FALSE PARENT_SCOPE)
    return()
  endif()
  list(GET _lines 0 _version)
  list(GET _lines 1 _cuda)
  list(GET _lines 2 _prefix)
  set(${out_ok} TRUE PARENT_SCOPE)
  set(${out_version} "${_version}" PARENT_SCOPE)
  set(${out_cuda} "${_cuda}" PARENT_SCOPE)
  set(${out_prefix} "${_prefix}" PARENT_SCOPE)
endfunction()

# A CUDA LibTorch's config (Caffe2's cuda.cmake) enables the CUDA language and finds the toolkit;
# without one it dies deep inside with a message about CUDA_TOOLKIT_ROOT_DIR. Check first, and
# insist on the same major version: code compiled against another toolkit's headers reads CUDA
# structs (cudaDeviceProp) with the wrong layout, a silent wrong answer.
function(gpu_lessons_require_cuda_toolkit torch_cuda)
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    set(CUDAToolkit_VERSION "")
  endif()
  gpu_lessons_check_cuda_toolkit("${torch_cuda}" "${CUDAToolkit_VERSION}" "${CUDAToolkit_BIN_DIR}")
endfunction()

# The check itself: `toolkit_version` is empty when no toolkit was found.
function(gpu_lessons_check_cuda_toolkit torch_cuda toolkit_version toolkit_dir)
  if(NOT toolkit_version)
    message(FATAL_ERROR "This LibTorch was built with CUDA ${torch_cuda}, and its CMake config "
      "needs the CUDA toolkit (nvcc, headers, libraries) to configure, even on a machine without "
      "a GPU; none was found.\n"
      "HINT: install the CUDA ${torch_cuda} toolkit and put its nvcc on the PATH, or point CMake "
      "at it with -DCUDAToolkit_ROOT=/usr/local/cuda-${torch_cuda}")
  endif()
  string(REGEX MATCH "^[0-9]+" _torch_major "${torch_cuda}")
  string(REGEX MATCH "^[0-9]+" _toolkit_major "${toolkit_version}")
  if(NOT _toolkit_major STREQUAL _torch_major)
    message(FATAL_ERROR "CUDA version mismatch: this LibTorch was built with CUDA ${torch_cuda}, "
      "the toolkit found (${toolkit_dir}) is CUDA ${toolkit_version}.\n"
      "HINT: install the CUDA ${_torch_major}.x toolkit and point CMake at it with "
      "-DCUDAToolkit_ROOT=/usr/local/cuda-${torch_cuda} (or put its nvcc first on the PATH), or "
      "use a PyTorch built for CUDA ${_toolkit_major}")
  endif()
  message(STATUS "GPU Lessons: CUDA toolkit ${toolkit_version} (${toolkit_dir}) matches "
                 "LibTorch's CUDA ${torch_cuda}")
endfunction()

# The CUDA version a LibTorch install was built with, read next to its config dir: a wheel's
# torch/version.py or a LibTorch archive's build-version ("2.11.0+cu130"). Empty for a CPU build.
function(gpu_lessons_torch_dir_cuda config_dir out)
  set(_cuda "")
  get_filename_component(_root "${config_dir}/../../.." ABSOLUTE)
  if(EXISTS "${_root}/lib/libtorch_cuda.so")
    set(_cuda "unknown")
    if(EXISTS "${_root}/version.py")
      file(STRINGS "${_root}/version.py" _line REGEX "^cuda")
      string(REGEX MATCH "[0-9]+\\.[0-9]+" _cuda "${_line}")
    elseif(EXISTS "${_root}/build-version")
      file(READ "${_root}/build-version" _line)
      if(_line MATCHES "cu([0-9]+)([0-9])")
        set(_cuda "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
      endif()
    endif()
  endif()
  set(${out} "${_cuda}" PARENT_SCOPE)
endfunction()


# The Python whose torch owns the LibTorch config under `prefix` (torch.utils.cmake_prefix_path of
# a wheel: .../site-packages/torch/share/cmake), or "" when none is found. Tried in turn: the
# Python named by GPU_LESSONS_PYTHON, the one in the environment that holds the wheel
# (<env>/bin/python3 for <env>/lib/pythonX.Y/site-packages/torch), python3 on the PATH. A Python
# counts only when its torch.utils.cmake_prefix_path is `prefix` itself, so that the tests and the
# yardstick never run another torch build than the lessons link.
function(gpu_lessons_python_for_prefix prefix out)
  set(${out} "" PARENT_SCOPE)
  file(REAL_PATH "${prefix}" _want)
  set(_candidates "")
  if(GPU_LESSONS_PYTHON)
    list(APPEND _candidates "${GPU_LESSONS_PYTHON}")
  endif()
  if(_want MATCHES "^(.*)/lib/python[0-9.]+/site-packages/torch/share/cmake$")
    list(APPEND _candidates "${CMAKE_MATCH_1}/bin/python3" "${CMAKE_MATCH_1}/bin/python")
  endif()
  find_program(_path_python NAMES python3 python NO_CACHE)
  if(_path_python)
    list(APPEND _candidates "${_path_python}")
  endif()
  foreach(_python IN LISTS _candidates)
    if(EXISTS "${_python}")
      gpu_lessons_query_python_torch("${_python}" _ok _version _cuda _prefix)
      if(_ok)
        file(REAL_PATH "${_prefix}" _have)
        if(_have STREQUAL _want)
          set(${out} "${_python}" PARENT_SCOPE)
          return()
        endif()
      endif()
    endif()
  endforeach()
endfunction()
