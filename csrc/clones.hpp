// The data kernels are compiled for several instruction sets and picked at load time (GCC/Clang function
// multiversioning), so the shipped build runs anywhere and still uses AVX-512/AVX2 (with FMA, and F16C for
// float16 conversions) where the CPU has them. Never -march=native in a wheel.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(JAXCOLL_NO_CLONES)
#define JAXCOLL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define JAXCOLL_CLONES
#endif
#define JAXCOLL_INLINE inline __attribute__((always_inline))
