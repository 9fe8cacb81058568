// Page-level advice for the large buffers a call writes. XLA:CPU allocates every buffer of a launch with the C
// library's allocator, and buffers above its mmap threshold (at most 32 MiB) are fresh mappings on every
// launch: the first write to each 4 KiB page faults, and on this project's machines those faults cost more
// than the copying itself (a 128 MiB memcpy into fresh memory: 71 ms of CPU with 4 KiB pages, 36 ms with
// 2 MiB pages, 13 ms into memory already mapped). Asking for transparent huge pages on the range a rank is about
// to write makes one fault per 2 MiB instead of 512. The advice changes no contents, so it is safe on memory
// that XLA owns and other buffers share.
#pragma once

#include <cstddef>

namespace jaxcoll {

// Advise transparent huge pages for the 2 MiB-aligned interior of [p, p + bytes) when it spans at least
// `huge_page_bytes()`; a no-op elsewhere (other systems, THP disabled, small ranges).
void advise_huge_pages(void* p, size_t bytes);

// The smallest range advised: JAXCOLL_HUGEPAGE_BYTES (read once), default 4 MiB; 0 turns the advice off.
size_t huge_page_bytes();

}  // namespace jaxcoll
