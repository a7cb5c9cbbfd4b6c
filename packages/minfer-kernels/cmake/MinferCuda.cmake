# The CUDA build pipeline of minfer-kernels, one function per step (docs/BUILD.md is the reference):
#
#   1. minfer_find_nvcc()            nvcc from CUDA_HOME / CUDA_PATH, then PATH, then /usr/local/cuda/bin
#   2. minfer_probe_host_compiler()  nvcc's default host compiler, then g++-15 ... g++-11, g++, clang++
#                                    (MINFER_CUDA_CCBIN overrides); the winner is passed as -ccbin
#   3. minfer_probe_archs()          a one-line kernel compiled for every candidate sm_70 ... sm_121,
#                                    keeping those this nvcc accepts; MINFER_CUDA_ARCHS selects among them
#   4. minfer_add_kernel_archive()   csrc/kernels/*.cu, one nvcc command line, into libminfer_cuda.a
#   5. minfer_find_cudart()          cudart static (default) or shared (MINFER_CUDA_STATIC=0)
#
# Plain CMake + execute_process rather than CMake's CUDA language support: every flag nvcc receives is
# chosen here, in the open, and printed in the build log.

# Every knob can be given as an environment variable (pip install) or as a CMake definition
# (pip install -C cmake.define.NAME=VALUE); the definition wins.
function(minfer_knob name default out_var)
  if(DEFINED ${name})
    set(${out_var} "${${name}}" PARENT_SCOPE)
  elseif(DEFINED ENV{${name}} AND NOT "$ENV{${name}}" STREQUAL "")
    set(${out_var} "$ENV{${name}}" PARENT_SCOPE)
  else()
    set(${out_var} "${default}" PARENT_SCOPE)
  endif()
endfunction()

# Step 1. Sets MINFER_NVCC, MINFER_NVCC_VERSION, MINFER_CUDA_INCLUDE_DIR and MINFER_CUDA_LIBRARY_DIRS.
function(minfer_find_nvcc)
  set(hints "")
  foreach(var CUDA_HOME CUDA_PATH)
    if(DEFINED ENV{${var}} AND NOT "$ENV{${var}}" STREQUAL "")
      list(APPEND hints "$ENV{${var}}/bin")
    endif()
  endforeach()
  # HINTS are searched before PATH, PATHS after it: the order the build documents.
  find_program(nvcc NAMES nvcc HINTS ${hints} PATHS /usr/local/cuda/bin NO_CACHE)
  if(NOT nvcc)
    message(FATAL_ERROR
      "minfer-kernels needs the CUDA compiler nvcc, and none was found "
      "(looked in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH and /usr/local/cuda/bin).\n"
      "  - To build the GPU kernels: install the CUDA Toolkit (12.x or 13.x, https://developer.nvidia.com/cuda-downloads, "
      "or the pip packages nvidia-cuda-nvcc and nvidia-cuda-runtime), then set CUDA_HOME to its root or put its "
      "bin/ on PATH.\n"
      "  - To run minfer without a GPU: you do not need this package; `pip install minfer-runtime` alone gives "
      "the CPU engine.")
  endif()

  execute_process(COMMAND "${nvcc}" --version OUTPUT_VARIABLE version_text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT version_text MATCHES "release [0-9.]+, V([0-9.]+)")
    message(FATAL_ERROR "minfer-kernels: `${nvcc} --version` failed; is this CUDA installation complete?\n${version_text}")
  endif()
  set(version "${CMAKE_MATCH_1}")

  # nvcc knows where its own headers and libraries are (nvcc.profile); a dry run prints them. This is
  # right for every layout: /usr/local/cuda, distro packages, pip wheels, wrapper scripts on PATH.
  file(WRITE "${CMAKE_BINARY_DIR}/minfer_probe/empty.cu" "")
  execute_process(COMMAND "${nvcc}" --dryrun -c "${CMAKE_BINARY_DIR}/minfer_probe/empty.cu" -o empty.o
                  ERROR_VARIABLE dryrun OUTPUT_QUIET)
  if(NOT dryrun MATCHES "INCLUDES=\"-I([^\"]+)\"")
    message(FATAL_ERROR "minfer-kernels: could not read the CUDA include directory from `nvcc --dryrun`:\n${dryrun}")
  endif()
  file(REAL_PATH "${CMAKE_MATCH_1}" include_dir)
  set(library_dirs "")
  string(REGEX MATCHALL "-L([^\" ]+)" library_flags "${dryrun}")
  foreach(flag ${library_flags})
    string(SUBSTRING "${flag}" 2 -1 dir)
    if(NOT dir MATCHES "/stubs$")
      file(REAL_PATH "${dir}" dir)
      list(APPEND library_dirs "${dir}")
    endif()
  endforeach()

  set(MINFER_NVCC "${nvcc}" PARENT_SCOPE)
  set(MINFER_NVCC_VERSION "${version}" PARENT_SCOPE)
  set(MINFER_NVCC_DRYRUN "${dryrun}" PARENT_SCOPE)
  set(MINFER_CUDA_INCLUDE_DIR "${include_dir}" PARENT_SCOPE)
  set(MINFER_CUDA_LIBRARY_DIRS "${library_dirs}" PARENT_SCOPE)
  message(STATUS "minfer-kernels: nvcc ${nvcc} (CUDA ${version}), headers ${include_dir}")
endfunction()

# Compiles the host-compiler probe (a kernel plus host code that includes <cmath>, where a host compiler
# newer than this CUDA supports fails) with `-ccbin compiler`, or with nvcc's default when compiler is "".
function(minfer_try_host_compiler compiler ok_var log_var)
  set(ccbin "")
  if(compiler)
    set(ccbin -ccbin "${compiler}")
  endif()
  execute_process(
    COMMAND "${MINFER_NVCC}" ${ccbin} -c "${CMAKE_CURRENT_SOURCE_DIR}/cmake/probe_host.cu"
            -o "${CMAKE_BINARY_DIR}/minfer_probe/probe_host.o"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    set(${ok_var} TRUE PARENT_SCOPE)
  else()
    set(${ok_var} FALSE PARENT_SCOPE)
  endif()
  set(${log_var} "${out}" PARENT_SCOPE)
endfunction()

# Step 2. Sets MINFER_CCBIN (absolute path, always passed as -ccbin) and MINFER_HOST_COMPILER_INFO.
function(minfer_probe_host_compiler)
  minfer_knob(MINFER_CUDA_CCBIN "" override)
  set(winner "")
  set(how "")
  if(override)
    find_program(resolved NAMES "${override}" NO_CACHE)
    if(NOT resolved)
      message(FATAL_ERROR "minfer-kernels: MINFER_CUDA_CCBIN=${override} is not an executable on PATH.")
    endif()
    minfer_try_host_compiler("${resolved}" ok log)
    if(NOT ok)
      message(FATAL_ERROR "minfer-kernels: nvcc cannot build with MINFER_CUDA_CCBIN=${override}:\n${log}\n"
                          "Unset MINFER_CUDA_CCBIN to let the build probe for a compatible host compiler.")
    endif()
    set(winner "${resolved}")
    set(how "MINFER_CUDA_CCBIN")
  else()
    # nvcc's default: the host compiler its dry run invokes for the preprocessing step.
    if(MINFER_NVCC_DRYRUN MATCHES "#\\$ ([^ \n]+) [^\n]*-E -x c\\+\\+")
      find_program(default_compiler NAMES "${CMAKE_MATCH_1}" NO_CACHE)
      if(default_compiler)
        minfer_try_host_compiler("" ok log)
        if(ok)
          set(winner "${default_compiler}")
          set(how "nvcc's default")
        endif()
      endif()
    endif()
    if(NOT winner)
      set(tried "nvcc's default")
      foreach(candidate g++-15 g++-14 g++-13 g++-12 g++-11 g++ clang++)
        find_program(path NAMES ${candidate} NO_CACHE)
        if(path)
          list(APPEND tried "${candidate}")
          minfer_try_host_compiler("${path}" ok log)
          if(ok)
            set(winner "${path}")
            set(how "probed")
            break()
          endif()
        endif()
        unset(path)
      endforeach()
    endif()
    if(NOT winner)
      list(JOIN tried ", " tried)
      message(FATAL_ERROR
        "minfer-kernels: nvcc ${MINFER_NVCC_VERSION} accepted none of the host compilers tried (${tried}).\n"
        "Install a GCC this CUDA supports (see the CUDA release notes) or point MINFER_CUDA_CCBIN at one.\n"
        "Last error:\n${log}")
    endif()
  endif()
  execute_process(COMMAND "${winner}" --version OUTPUT_VARIABLE version_text ERROR_QUIET)
  string(REGEX REPLACE "\n.*" "" version_line "${version_text}")
  set(MINFER_CCBIN "${winner}" PARENT_SCOPE)
  set(MINFER_HOST_COMPILER_INFO "${winner} (${version_line}; ${how})" PARENT_SCOPE)
  message(STATUS "minfer-kernels: host compiler ${winner} (${version_line}) [${how}]")
endfunction()

# Turns "80;90", "80,90", "sm_80 sm_90" into the list 80;90.
function(minfer_parse_arch_list text out_var)
  string(REGEX REPLACE "[,; \t]+" ";" items "${text}")
  set(archs "")
  foreach(item ${items})
    string(REGEX REPLACE "^(sm_|compute_)" "" item "${item}")
    string(REPLACE "." "" item "${item}")
    if(NOT item MATCHES "^[0-9]+$")
      message(FATAL_ERROR "minfer-kernels: MINFER_CUDA_ARCHS: '${item}' is not an architecture like 90 or sm_90 "
                          "(accepted forms: native, all, 90, \"80;90\").")
    endif()
    list(APPEND archs "${item}")
  endforeach()
  list(REMOVE_DUPLICATES archs)
  set(${out_var} "${archs}" PARENT_SCOPE)
endfunction()

# The compute capabilities of the GPUs this machine has, for MINFER_CUDA_ARCHS=native.
function(minfer_native_archs out_var)
  get_filename_component(nvcc_dir "${MINFER_NVCC}" DIRECTORY)
  if(MINFER_NVCC_DRYRUN MATCHES "#\\$ _HERE_=([^\n]+)")
    set(nvcc_dir "${CMAKE_MATCH_1}")
  endif()
  set(found "")
  # nvcc ships this helper for its own -arch=native; it prints e.g. "90" or "86,89".
  if(EXISTS "${nvcc_dir}/__nvcc_device_query")
    execute_process(COMMAND "${nvcc_dir}/__nvcc_device_query" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
    if(rc EQUAL 0)
      string(REGEX MATCHALL "[0-9]+" found "${out}")
    endif()
  endif()
  if(NOT found)
    find_program(nvidia_smi nvidia-smi NO_CACHE)
    if(nvidia_smi)
      execute_process(COMMAND "${nvidia_smi}" --query-gpu=compute_cap --format=csv,noheader
                      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
      if(rc EQUAL 0)
        string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${out}")
        foreach(cap ${caps})
          string(REPLACE "." "" cap "${cap}")
          list(APPEND found "${cap}")
        endforeach()
      endif()
    endif()
  endif()
  if(NOT found)
    message(FATAL_ERROR
      "minfer-kernels: MINFER_CUDA_ARCHS=native, but no GPU is visible on this machine "
      "(neither __nvcc_device_query nor nvidia-smi reported one).\n"
      "Name the architecture instead (MINFER_CUDA_ARCHS=90 for an H100/H200, 89 for an L4/RTX 40xx, 80 for an "
      "A100), or unset MINFER_CUDA_ARCHS to build for every architecture this nvcc supports.")
  endif()
  list(REMOVE_DUPLICATES found)
  set(${out_var} "${found}" PARENT_SCOPE)
endfunction()

# Step 3. Sets MINFER_ARCHS_PROBED (what nvcc accepts), MINFER_ARCHS_SASS (native code embedded),
# MINFER_ARCHS_PTX (the lowest and the highest, for the driver to JIT) and MINFER_ARCH_REQUEST.
function(minfer_probe_archs)
  # Volta (sm_70) is the floor by choice, not by need: no older GPU is probed, so none is claimed. What the
  # kernels need outside their __CUDA_ARCH__-guarded paths is sm_53's half2 arithmetic (__hfma2 in gemm.cu's
  # f16 decode); ldmatrix and mma.sync are used from sm_75 (gemm.cu, a scalar path below), griddepcontrol,
  # cp.async.bulk and redux.sync from sm_90 (common.cuh, gemv_int8.cu). CUDA 13 accepts sm_75 and up.
  set(candidates 70 72 75 80 86 87 88 89 90 100 101 103 110 120 121)
  set(probe_dir "${CMAKE_BINARY_DIR}/minfer_probe")
  # execute_process runs its COMMANDs as one pipeline, that is concurrently: one probe compile per
  # candidate, all at once, then one exit code each. Device code only (-cubin), no host compiler needed.
  set(commands "")
  foreach(arch ${candidates})
    list(APPEND commands COMMAND "${MINFER_NVCC}" -cubin -arch=sm_${arch}
         "${CMAKE_CURRENT_SOURCE_DIR}/cmake/probe_kernel.cu" -o "${probe_dir}/probe_sm_${arch}.cubin")
  endforeach()
  execute_process(${commands} RESULTS_VARIABLE results OUTPUT_QUIET ERROR_QUIET)
  set(accepted "")
  set(rejected "")
  foreach(arch result IN ZIP_LISTS candidates results)
    if(result STREQUAL "0")
      list(APPEND accepted "${arch}")
    else()
      list(APPEND rejected "${arch}")
    endif()
  endforeach()
  list(JOIN accepted " sm_" accepted_text)
  list(JOIN rejected " sm_" rejected_text)
  if(rejected)
    message(STATUS "minfer-kernels: arch probe: nvcc ${MINFER_NVCC_VERSION} accepts sm_${accepted_text}; "
                   "skipped sm_${rejected_text} (not supported by this nvcc)")
  else()
    message(STATUS "minfer-kernels: arch probe: nvcc ${MINFER_NVCC_VERSION} accepts sm_${accepted_text}")
  endif()
  if(NOT accepted)
    message(FATAL_ERROR "minfer-kernels: nvcc ${MINFER_NVCC_VERSION} accepted none of sm_70 ... sm_121; "
                        "this CUDA installation cannot compile the kernels.")
  endif()

  minfer_knob(MINFER_CUDA_ARCHS "all" request)
  if(request STREQUAL "all")
    set(selected "${accepted}")
  elseif(request STREQUAL "native")
    minfer_native_archs(selected)
  else()
    minfer_parse_arch_list("${request}" selected)
  endif()
  foreach(arch ${selected})
    if(NOT arch IN_LIST accepted)
      message(FATAL_ERROR "minfer-kernels: MINFER_CUDA_ARCHS=${request} asks for sm_${arch}, which nvcc "
                          "${MINFER_NVCC_VERSION} does not accept (it accepts sm_${accepted_text}).")
    endif()
  endforeach()
  list(SORT selected COMPARE NATURAL)
  list(GET selected 0 lowest)
  list(GET selected -1 highest)
  set(ptx "${lowest}")
  if(NOT highest STREQUAL lowest)
    list(APPEND ptx "${highest}")
  endif()
  list(JOIN selected " sm_" sass_text)
  list(JOIN ptx " compute_" ptx_text)
  message(STATUS "minfer-kernels: MINFER_CUDA_ARCHS=${request}: SASS sm_${sass_text}; PTX compute_${ptx_text}")
  set(MINFER_ARCHS_PROBED "${accepted}" PARENT_SCOPE)
  set(MINFER_ARCHS_SASS "${selected}" PARENT_SCOPE)
  set(MINFER_ARCHS_PTX "${ptx}" PARENT_SCOPE)
  set(MINFER_ARCH_REQUEST "${request}" PARENT_SCOPE)
endfunction()

# Step 4. One nvcc command line (the same flags for every family file), each file compiled as its own
# object so ninja keeps every core busy, all archived into libminfer_cuda.a (target minfer_cuda).
function(minfer_add_kernel_archive)
  file(GLOB sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/csrc/kernels/*.cu")
  set(gencode "")
  foreach(arch ${MINFER_ARCHS_SASS})
    if(arch STREQUAL "90")
      # sm_90's SASS as sm_90a, the arch-specific target (it runs on every compute capability 9.0 device): the
      # prompt GEMM's warpgroup tiles need its wgmma; MINFER_SM90A_SASS tells the host code it is there.
      list(APPEND gencode "-gencode=arch=compute_90a,code=sm_90a" "-DMINFER_SM90A_SASS=1")
    else()
      list(APPEND gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
    endif()
  endforeach()
  foreach(arch ${MINFER_ARCHS_PTX})
    list(APPEND gencode "-gencode=arch=compute_${arch},code=compute_${arch}")
  endforeach()
  set(flags
    -ccbin "${MINFER_CCBIN}"
    -std=c++17 -O3
    -lineinfo                      # source lines in compute-sanitizer reports; no effect on speed
    -Xcompiler=-fPIC               # the archive goes into a shared library (the Python extension)
    -Xcompiler=-fvisibility=hidden # launchers link into _C but are not exported from it
    ${gencode})
  list(JOIN flags " " flags_text)
  message(STATUS "minfer-kernels: nvcc ${flags_text} -c csrc/kernels/<family>.cu")

  set(objects "")
  foreach(source ${sources})
    get_filename_component(name "${source}" NAME_WE)
    set(object "${CMAKE_CURRENT_BINARY_DIR}/kernels/${name}.o")
    add_custom_command(
      OUTPUT "${object}"
      COMMAND "${MINFER_NVCC}" ${flags} -MD -MF "${object}.d" -c "${source}" -o "${object}"
      DEPENDS "${source}"
      DEPFILE "${object}.d"
      COMMENT "nvcc ${name}.cu"
      VERBATIM)
    list(APPEND objects "${object}")
  endforeach()
  set_source_files_properties(${objects} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  add_library(minfer_cuda STATIC ${objects})
  set_target_properties(minfer_cuda PROPERTIES LINKER_LANGUAGE CXX)
endfunction()

# Step 5. Sets MINFER_CUDART_LIBRARIES (what _C links) and MINFER_CUDART_INFO. The driver library
# (libcuda.so.1) is never linked: cudart opens it at run time, so the module imports on machines without one.
function(minfer_find_cudart)
  minfer_knob(MINFER_CUDA_STATIC "1" static)
  if(static)
    find_library(cudart NAMES cudart_static HINTS ${MINFER_CUDA_LIBRARY_DIRS} NO_CACHE)
    if(NOT cudart)
      message(FATAL_ERROR "minfer-kernels: libcudart_static.a not found next to nvcc (${MINFER_CUDA_LIBRARY_DIRS}); "
                          "install the CUDA runtime development files or build with MINFER_CUDA_STATIC=0.")
    endif()
    find_package(Threads REQUIRED)
    set(MINFER_CUDART_LIBRARIES "${cudart}" Threads::Threads ${CMAKE_DL_LIBS} rt PARENT_SCOPE)
    set(MINFER_CUDART_INFO "static" PARENT_SCOPE)
    set(MINFER_CUDART_RPATH "" PARENT_SCOPE)
  else()
    find_library(cudart NAMES cudart HINTS ${MINFER_CUDA_LIBRARY_DIRS} NO_CACHE)
    if(NOT cudart)
      message(FATAL_ERROR "minfer-kernels: libcudart.so not found next to nvcc (${MINFER_CUDA_LIBRARY_DIRS}).")
    endif()
    get_filename_component(cudart_dir "${cudart}" DIRECTORY)
    # An rpath only for a toolkit outside the system directories: never shadow the system's libraries.
    if(cudart_dir MATCHES "^(/usr)?/lib")
      set(MINFER_CUDART_RPATH "" PARENT_SCOPE)
    else()
      set(MINFER_CUDART_RPATH "${cudart_dir}" PARENT_SCOPE)
    endif()
    set(MINFER_CUDART_LIBRARIES "${cudart}" PARENT_SCOPE)
    set(MINFER_CUDART_INFO "shared" PARENT_SCOPE)
  endif()
  message(STATUS "minfer-kernels: cudart ${cudart}")
  set(MINFER_CUDART_PATH "${cudart}" PARENT_SCOPE)
endfunction()
