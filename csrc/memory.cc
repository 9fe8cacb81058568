#include "csrc/memory.hpp"

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "csrc/env.hpp"

namespace jaxcoll {

size_t huge_page_bytes() {
  static const size_t t = env_settings().hugepage_bytes.value_or(size_t{4} << 20);
  return t;
}

void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const size_t threshold = huge_page_bytes();
  if (threshold == 0 || bytes < threshold) return;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  // Failure (EINVAL where THP is compiled out) only means 4 KiB pages: nothing to report.
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace jaxcoll
