# libtorch.cmake: finds the LibTorch of the chosen flavour and checks what its CMake config needs.
#
# GPU_LESSONS_TORCH picks the flavour, and an explicit flavour never falls back to the other:
#   debian  the system's LibTorch (Debian 12: libtorch-dev 1.13.1, CPU only); a Python PyTorch
#           that happens to be installed is never looked at.
#   2.11    PyTorch 2.11 from PyPI, in the project's virtual environment (.venv, made by
#           'GPU_LESSONS_TORCH=2.11 scripts/setup.sh') or the Python named by GPU_LESSONS_PYTHON.
#           Its LibTorch has CUDA: configure needs the CUDA toolkit of the same major version.
#   auto    what the caller named (Torch_DIR, CMAKE_PREFIX_PATH), else an installed PyTorch >= 2
#           (GPU_LESSONS_PYTHON's, else python3's: how GPU servers carry a CUDA LibTorch), else
#           the system's. A LibTorch named on the prefix path gets the Python whose torch owns it
#           (gpu_lessons_python_for_prefix), whether or not that Python is on the PATH.
# Sets Torch_* (find_package), GPU_LESSONS_CUDA, GPU_LESSONS_TORCH_ORIGIN and GPU_LESSONS_PYTHON_TORCH
# (a Python whose torch is the same build as this LibTorch, for the tests and the yardstick; empty
# when there is none).
set(GPU_LESSONS_TORCH "auto" CACHE STRING "Which LibTorch to build against: auto, debian or 2.11")
set_property(CACHE GPU_LESSONS_TORCH PROPERTY STRINGS auto debian 2.11)
set(GPU_LESSONS_PYTHON "" CACHE FILEPATH
    "Python whose PyTorch to use (2.11: default .venv/bin/python of the project; auto: the one whose torch owns the LibTorch)")
set(_flavours auto debian 2.11)
if(NOT GPU_LESSONS_TORCH IN_LIST _flavours)
  message(FATAL_ERROR "GPU_LESSONS_TORCH='${GPU_LESSONS_TORCH}' is not a flavour.\n"
    "HINT: use auto, debian or 2.11")
endif()
if(GPU_LESSONS_TORCH_FOUND_AS AND NOT GPU_LESSONS_TORCH_FOUND_AS STREQUAL GPU_LESSONS_TORCH)
  message(FATAL_ERROR "This build folder was configured for the '${GPU_LESSONS_TORCH_FOUND_AS}' "
    "flavour, not '${GPU_LESSONS_TORCH}'.\n"
    "HINT: use another build folder for each flavour (the scripts use build-debian and build-2.11)")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/torch_helpers.cmake)

# find_package(Torch) from one install only. TorchConfig looks for Caffe2's config and for its
# libraries (c10, ...) in the default places first and in its own folder last, so on a machine
# that also has Debian's libtorch-dev a wheel's config would pick up Debian's Caffe2 targets and
# 1.13 libc10.so: a mixed build that breaks at link or run time. Pin Caffe2's config and ignore
# the system prefixes (usrmerge makes / and /usr the same) while it runs. `cuda` is the CUDA
# version the install was built with ("" for a CPU build, "unknown" when it cannot be read):
# its toolkit is checked before the config runs.
macro(gpu_lessons_find_torch_in prefix cuda)
  if(NOT "${cuda}" STREQUAL "" AND NOT "${cuda}" STREQUAL "unknown")
    gpu_lessons_require_cuda_toolkit(${cuda})
  endif()
  set(Caffe2_DIR "${prefix}/Caffe2" CACHE PATH "Caffe2's config, next to Torch's" FORCE)
  set(_saved_ignore "${CMAKE_IGNORE_PREFIX_PATH}")
  list(APPEND CMAKE_IGNORE_PREFIX_PATH /usr /)
  find_package(Torch CONFIG QUIET PATHS "${prefix}" NO_DEFAULT_PATH)
  set(CMAKE_IGNORE_PREFIX_PATH "${_saved_ignore}")
endmacro()

# The system's LibTorch (Debian's packages): not from CMAKE_PREFIX_PATH or a Python package, for
# Torch and for the Caffe2 config and libraries its config looks up in turn. The system's Python
# is the same build when its torch has the same version (Debian's python3-torch).
macro(gpu_lessons_find_system_torch)
  set(CMAKE_FIND_USE_CMAKE_PATH FALSE)
  set(CMAKE_FIND_USE_CMAKE_ENVIRONMENT_PATH FALSE)
  find_package(Torch CONFIG QUIET PATHS /usr NO_DEFAULT_PATH)
  unset(CMAKE_FIND_USE_CMAKE_PATH)
  unset(CMAKE_FIND_USE_CMAKE_ENVIRONMENT_PATH)
  find_program(_system_python NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH NO_CACHE)
  if(Torch_FOUND AND _system_python)
    gpu_lessons_query_python_torch(${_system_python} _ok _version _cuda _prefix)
    if(_ok AND _version VERSION_EQUAL Torch_VERSION)
      set(_python_torch ${_system_python})
    endif()
  endif()
endmacro()

# The LibTorch inside the PyTorch that gpu_lessons_query_python_torch() described in _python,
# _version, _cuda and _prefix.
macro(gpu_lessons_find_python_torch)
  gpu_lessons_find_torch_in("${_prefix}" "${_cuda}")
  set(GPU_LESSONS_TORCH_ORIGIN "PyTorch ${_version} in ${_python}")
  set(_python_torch ${_python})
endmacro()

# A Python named with GPU_LESSONS_PYTHON must be the one whose torch owns the LibTorch under
# `prefix` (found as _python_torch): one Python for the lessons' LibTorch, the tests and the
# yardstick, never two builds of torch side by side.
macro(gpu_lessons_check_named_python prefix)
  if(GPU_LESSONS_PYTHON AND NOT GPU_LESSONS_PYTHON STREQUAL _python_torch)
    message(FATAL_ERROR "GPU_LESSONS_PYTHON is ${GPU_LESSONS_PYTHON}, and its torch is not the "
      "LibTorch this build uses (${prefix}).\n"
      "HINT: name the Python whose torch.utils.cmake_prefix_path is that folder, or leave "
      "GPU_LESSONS_PYTHON unset")
  endif()
endmacro()

# ---- the lookup ----------------------------------------------------------------------------------
set(_python_torch "")
if(GPU_LESSONS_TORCH_FOUND_AS AND Torch_DIR)
  # A reconfigure: the LibTorch found the first time (Torch_DIR is cached), checked then. Its
  # Python is looked for again when there was none, or when another one is named now.
  find_package(Torch CONFIG REQUIRED)
  set(_python_torch "${GPU_LESSONS_PYTHON_TORCH}")
  if(NOT Torch_DIR MATCHES "^/usr/" AND (NOT _python_torch OR
     (GPU_LESSONS_PYTHON AND NOT GPU_LESSONS_PYTHON STREQUAL _python_torch)))
    get_filename_component(_torch_prefix "${Torch_DIR}/.." ABSOLUTE)
    gpu_lessons_python_for_prefix("${_torch_prefix}" _python_torch)
    gpu_lessons_check_named_python("${_torch_prefix}")
  endif()
elseif(GPU_LESSONS_TORCH STREQUAL "debian")
  gpu_lessons_find_system_torch()
  set(GPU_LESSONS_TORCH_ORIGIN "Debian's libtorch-dev")
  if(NOT Torch_FOUND OR NOT Torch_DIR MATCHES "^/usr/")
    message(FATAL_ERROR "The debian flavour builds against Debian's LibTorch (under /usr), and "
      "found '${Torch_DIR}'.\n"
      "HINT: GPU_LESSONS_TORCH=debian scripts/setup.sh (or: sudo apt-get install libtorch-dev)")
  endif()
elseif(GPU_LESSONS_TORCH STREQUAL "2.11")
  set(_python "${GPU_LESSONS_PYTHON}")
  if(NOT _python)
    set(_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  endif()
  if(NOT EXISTS "${_python}")
    message(FATAL_ERROR "The 2.11 flavour needs PyTorch 2.11 in the project's virtual "
      "environment, and ${_python} does not exist.\n"
      "HINT: GPU_LESSONS_TORCH=2.11 scripts/setup.sh (or -DGPU_LESSONS_PYTHON=/path/to/python "
      "for a Python that has torch 2.11)")
  endif()
  gpu_lessons_query_python_torch(${_python} _ok _version _cuda _prefix)
  if(NOT _ok)
    set(_version "no torch")
  endif()
  if(NOT _version MATCHES "^2\\.11\\.")
    message(FATAL_ERROR "The 2.11 flavour needs PyTorch 2.11; ${_python} has ${_version}.\n"
      "HINT: GPU_LESSONS_TORCH=2.11 scripts/setup.sh installs torch==2.11.0 into .venv")
  endif()
  gpu_lessons_find_python_torch()
  if(NOT Torch_FOUND OR NOT Torch_VERSION MATCHES "^2\\.11\\.")
    message(FATAL_ERROR "The 2.11 flavour found LibTorch '${Torch_VERSION}' under ${_prefix}.\n"
      "HINT: GPU_LESSONS_TORCH=2.11 scripts/setup.sh reinstalls torch==2.11.0 into .venv")
  endif()
else()  # auto
  set(_torch_config_dir "${Torch_DIR}")
  if(NOT _torch_config_dir)
    # Where find_package would look first; found by hand, so that the toolkit can be checked
    # before the LibTorch's own config runs.
    foreach(_p IN LISTS CMAKE_PREFIX_PATH ENV{CMAKE_PREFIX_PATH})
      foreach(_suffix Torch share/cmake/Torch lib/cmake/Torch cmake/Torch .)
        if(NOT _torch_config_dir AND EXISTS "${_p}/${_suffix}/TorchConfig.cmake")
          get_filename_component(_torch_config_dir "${_p}/${_suffix}" ABSOLUTE)
        endif()
      endforeach()
    endforeach()
  endif()
  if(_torch_config_dir AND NOT _torch_config_dir MATCHES "^/usr/")
    gpu_lessons_torch_dir_cuda("${_torch_config_dir}" _cuda)
    get_filename_component(_torch_prefix "${_torch_config_dir}/.." ABSOLUTE)
    gpu_lessons_find_torch_in("${_torch_prefix}" "${_cuda}")
    set(GPU_LESSONS_TORCH_ORIGIN "Torch_DIR / CMAKE_PREFIX_PATH")
    if(Torch_FOUND)
      # The Python whose torch this is (a GPU server's venv that is not active, say): the
      # yardstick and the tests that read Python's files need that one, not python3 on the PATH.
      gpu_lessons_python_for_prefix("${_torch_prefix}" _python_torch)
      gpu_lessons_check_named_python("${_torch_prefix}")
    endif()
  endif()
  if(NOT Torch_FOUND)
    if(GPU_LESSONS_PYTHON)
      set(_python "${GPU_LESSONS_PYTHON}")
    else()
      find_program(_python NAMES python3 python NO_CACHE)
    endif()
    if(_python)
      gpu_lessons_query_python_torch(${_python} _ok _version _cuda _prefix)
      if(_ok AND _version VERSION_GREATER_EQUAL 2)
        gpu_lessons_find_python_torch()
      endif()
    endif()
  endif()
  if(NOT Torch_FOUND)
    gpu_lessons_find_system_torch()
    set(GPU_LESSONS_TORCH_ORIGIN "system")
  endif()
  if(NOT Torch_FOUND)
    message(FATAL_ERROR "LibTorch not found.\n"
      "HINT: run scripts/setup.sh (Debian's libtorch-dev), GPU_LESSONS_TORCH=2.11 scripts/setup.sh "
      "(PyTorch 2.11 with CUDA), or point CMake at a LibTorch with -DCMAKE_PREFIX_PATH=$(python3 "
      "-c 'import torch;print(torch.utils.cmake_prefix_path)')")
  endif()
endif()
set(GPU_LESSONS_TORCH_FOUND_AS "${GPU_LESSONS_TORCH}" CACHE INTERNAL "the flavour configured")
set(GPU_LESSONS_TORCH_ORIGIN "${GPU_LESSONS_TORCH_ORIGIN}" CACHE INTERNAL "where LibTorch came from")
set(GPU_LESSONS_PYTHON_TORCH "${_python_torch}" CACHE INTERNAL
    "a Python whose torch is this LibTorch's build")

if(TARGET torch_cuda)
  set(GPU_LESSONS_CUDA ON)
else()
  set(GPU_LESSONS_CUDA OFF)
endif()
message(STATUS "GPU Lessons: flavour ${GPU_LESSONS_TORCH}: LibTorch ${Torch_VERSION} "
               "(${GPU_LESSONS_TORCH_ORIGIN}: ${Torch_DIR})")
if(GPU_LESSONS_CUDA)
  message(STATUS "GPU Lessons: CUDA compiled in: yes")
else()
  message(STATUS "GPU Lessons: CUDA compiled in: no")
endif()
if(GPU_LESSONS_PYTHON_TORCH)
  message(STATUS "GPU Lessons: Python with the same torch: ${GPU_LESSONS_PYTHON_TORCH}")
else()
  message(STATUS "GPU Lessons: no Python with the same torch (the tests that need one skip)")
endif()
