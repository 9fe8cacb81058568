#include "xla_ffi/sparse.hpp"

#include <climits>
#include <cstdint>
#include <string>

#include "csrc/abi.hpp"
#include "csrc/topk.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcoll::xla_cpu {
namespace {

// Every operand and result is (*batch, length): under vmap (vmap_method="broadcast_all") they gain the same
// leading batch dimensions, and each handler runs its stage once per batch item.
struct Items {
  int64_t count = 1;
  ffi::Span<const int64_t> batch;
};

ffi::Error Invalid(const char* target, const std::string& message) {
  return ffi::Error::InvalidArgument(std::string(target) + ": " + message);
}

std::string Shape(ffi::Span<const int64_t> dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

// The batch of an operand with `item_rank` trailing item dimensions; false when it has fewer dimensions.
bool BatchOf(ffi::Span<const int64_t> dims, size_t item_rank, Items& items) {
  if (dims.size() < item_rank) return false;
  items.batch = dims.first(dims.size() - item_rank);
  items.count = 1;
  for (int64_t d : items.batch) items.count *= d;
  return true;
}

bool SameBatch(const Items& a, ffi::Span<const int64_t> dims, size_t item_rank) {
  Items b;
  if (!BatchOf(dims, item_rank, b) || b.batch.size() != a.batch.size()) return false;
  for (size_t i = 0; i < a.batch.size(); ++i)
    if (a.batch[i] != b.batch[i]) return false;
  return true;
}

// A bucket array of N buckets, flat: (*batch, N * 2 * capacity) with the batch of x. Flat, so that its jax type
// is x's with another length (jaxcoll/compress/sparse.py); its capacity, or an error naming the operand.
ffi::Error BucketDims(const char* target, const char* name, ffi::Span<const int64_t> dims, const Items& items,
                      int64_t nranks, int64_t& capacity) {
  if (nranks < 1) return Invalid(target, "nranks=" + std::to_string(nranks) + " must be >= 1");
  if (!SameBatch(items, dims, 1) || dims.back() % (2 * nranks))
    return Invalid(target, std::string(name) + " has shape " + Shape(dims) + "; expected (*batch, " +
                               std::to_string(nranks) + " * 2 * capacity) with the batch of x");
  capacity = dims.back() / (2 * nranks);
  return ffi::Error::Success();
}

ffi::Error Fail(const char* target, const Status& st) {
  return ffi::Error::Internal(std::string(target) + ": " + st.message());
}

ffi::Error Select(ffi::Buffer<ffi::F32> x, int64_t k, int64_t nranks, float threshold,
                  ffi::ResultBuffer<ffi::S32> buckets) {
  const char* target = kTopkSelectTarget;
  Items items;
  if (!BatchOf(x.dimensions(), 1, items)) return Invalid(target, "x must have at least one dimension");
  const int64_t elements = x.dimensions().back();
  int64_t capacity = 0;
  if (ffi::Error e = BucketDims(target, "the buckets result", buckets->dimensions(), items, nranks, capacity);
      e.failure())
    return e;
  if (k < 1 || k > elements)
    return Invalid(target, "k=" + std::to_string(k) + " is out of range for x of " + std::to_string(elements) +
                               " elements; it must be in [1, " + std::to_string(elements) + "]");
  if (!(threshold >= 0)) return Invalid(target, "threshold=" + std::to_string(threshold) + " must be >= 0");
  const TopkRegions regions{elements, nranks};
  const int64_t stride = nranks * 2 * capacity;
  for (int64_t b = 0; b < items.count; ++b) {
    const float* xb = x.typed_data() + b * elements;
    topk_select(xb, regions, topk_threshold(xb, elements, k, threshold), capacity, buckets->typed_data() + b * stride);
  }
  return ffi::Error::Success();
}

ffi::Error Reduce(ffi::Buffer<ffi::S32> received, int64_t nranks, int64_t region, ffi::ResultBuffer<ffi::S32> out) {
  const char* target = kTopkReduceTarget;
  Items items;
  if (!BatchOf(received.dimensions(), 1, items)) return Invalid(target, "received must have at least one dimension");
  int64_t capacity = 0, kept = 0;
  if (ffi::Error e = BucketDims(target, "received", received.dimensions(), items, nranks, capacity); e.failure())
    return e;
  if (ffi::Error e = BucketDims(target, "the kept bucket", out->dimensions(), items, 1, kept); e.failure()) return e;
  if (region < 1 || region > INT32_MAX)
    return Invalid(target, "region=" + std::to_string(region) + " must be in [1, 2^31)");
  for (int64_t b = 0; b < items.count; ++b) {
    const Status st = topk_reduce(received.typed_data() + b * nranks * 2 * capacity, nranks, capacity, region, kept,
                                  out->typed_data() + b * 2 * kept);
    if (!st.ok()) return Fail(target, st);
  }
  return ffi::Error::Success();
}

ffi::Error Result(ffi::Buffer<ffi::S32> gathered, int64_t nranks, ffi::ResultBuffer<ffi::F32> out) {
  const char* target = kTopkResultTarget;
  Items items;
  if (!BatchOf(out->dimensions(), 1, items)) return Invalid(target, "the result must have at least one dimension");
  int64_t kept = 0;
  if (ffi::Error e = BucketDims(target, "gathered", gathered.dimensions(), items, nranks, kept); e.failure()) return e;
  const TopkRegions regions{out->dimensions().back(), nranks};
  for (int64_t b = 0; b < items.count; ++b) {
    const Status st = topk_result(gathered.typed_data() + b * nranks * 2 * kept, regions, kept,
                                  out->typed_data() + b * regions.elements);
    if (!st.ok()) return Fail(target, st);
  }
  return ffi::Error::Success();
}

ffi::Error Residual(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> sent, ffi::Buffer<ffi::S32> gathered,
                    int64_t nranks, ffi::ResultBuffer<ffi::F32> residual) {
  const char* target = kTopkResidualTarget;
  Items items;
  if (!BatchOf(x.dimensions(), 1, items)) return Invalid(target, "x must have at least one dimension");
  int64_t capacity = 0, kept = 0;
  if (ffi::Error e = BucketDims(target, "sent", sent.dimensions(), items, nranks, capacity); e.failure()) return e;
  if (ffi::Error e = BucketDims(target, "gathered", gathered.dimensions(), items, nranks, kept); e.failure())
    return e;
  if (residual->element_count() != x.element_count()) return Invalid(target, "the residual's shape differs from x's");
  const TopkRegions regions{x.dimensions().back(), nranks};
  for (int64_t b = 0; b < items.count; ++b) {
    const Status st = topk_residual(x.typed_data() + b * regions.elements,
                                    sent.typed_data() + b * nranks * 2 * capacity, capacity,
                                    gathered.typed_data() + b * nranks * 2 * kept, kept, regions,
                                    residual->typed_data() + b * regions.elements);
    if (!st.ok()) return Fail(target, st);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcoll::xla_cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcoll_topk_select_handler, jaxcoll::xla_cpu::Select,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("nranks")
                                  .Attr<float>("threshold")
                                  .Ret<ffi::Buffer<ffi::S32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcoll_topk_reduce_handler, jaxcoll::xla_cpu::Reduce,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("nranks")
                                  .Attr<int64_t>("region")
                                  .Ret<ffi::Buffer<ffi::S32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcoll_topk_result_handler, jaxcoll::xla_cpu::Result,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("nranks")
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcoll_topk_residual_handler, jaxcoll::xla_cpu::Residual,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("nranks")
                                  .Ret<ffi::Buffer<ffi::F32>>());

namespace jaxcoll::xla_cpu {

std::array<std::pair<const char*, XLA_FFI_Handler*>, 4> sparse_handlers() {
  return {{{kTopkSelectTarget, jaxcoll_topk_select_handler},
           {kTopkReduceTarget, jaxcoll_topk_reduce_handler},
           {kTopkResultTarget, jaxcoll_topk_result_handler},
           {kTopkResidualTarget, jaxcoll_topk_residual_handler}}};
}

}  // namespace jaxcoll::xla_cpu
