// The CUDA part of the native module jaxcoll._jaxcoll (built when CMake finds a CUDA toolkit): the CUDA
// handler's capsules for jaxcoll.runtime to register, and the emulated-rank harness for tests and benchmarks.
#pragma once

#include <nanobind/nanobind.h>

namespace jaxcoll::xla_cuda {

void add_bindings(nanobind::module_& m);

}  // namespace jaxcoll::xla_cuda
