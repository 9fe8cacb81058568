#include "csrc/cuda/plan_image.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "csrc/layout.hpp"

namespace jaxcoll::cuda {

const char* protocol_name(Protocol p) {
  switch (p) {
    case Protocol::kAuto: return "auto";
    case Protocol::kLL: return "ll";
    case Protocol::kBulk: return "bulk";
  }
  return "?";
}

namespace {

bool is_data(Op op) { return op != Op::kSignal && op != Op::kWait && op != Op::kBarrier; }

// What one data step of a lane touches: for the lane-meeting analysis.
struct Touch {
  ChunkRef ref;
  bool write;
};

bool overlaps(const ChunkRef& a, const ChunkRef& b) {
  return a.rank == b.rank && a.buffer == b.buffer && a.index < b.index + b.count && b.index < a.index + a.count;
}

// The thread blocks of a lane split every data step's element range the same way, so two steps touching
// exactly the same chunks give each block the same elements; a dependency between steps on different (but
// overlapping) chunk ranges crosses blocks, and the blocks must meet between them.
bool needs_meeting(const std::vector<Touch>& before, const Touch& t) {
  for (const Touch& b : before) {
    if (!(b.write || t.write) || !overlaps(b.ref, t.ref)) continue;
    if (b.ref.index != t.ref.index || b.ref.count != t.ref.count) return true;
  }
  return false;
}

}  // namespace

Status build_plan_image(const Plan& plan, PlanImage& im) {
  im = PlanImage{};
  if (plan.nranks > kMaxRanks)
    return Status::Error("the CUDA executor runs groups of at most " + std::to_string(kMaxRanks) +
                         " ranks, this plan has " + std::to_string(plan.nranks));
  im.nranks = plan.nranks;
  im.chunk_factor = plan.chunk_factor;
  im.in_blocks = plan.in_blocks;
  im.out_blocks = plan.out_blocks;
  im.collective = static_cast<int32_t>(plan.collective);
  im.in_place = plan.in_place;
  im.requested = static_cast<Protocol>(plan.protocol);
  im.max_semaphores = std::max(plan.max_semaphores, 1);
  im.signals_per_call.assign(size_t(plan.nranks) * im.max_semaphores, 0);

  // Which rank's buffers other ranks touch, and how often each chunk is written per call.
  std::vector<uint32_t> shared(plan.nranks, 0);
  std::map<std::tuple<int32_t, int32_t, int32_t>, int32_t> writes, reads;

  for (int32_t r = 0; r < plan.nranks; ++r) {
    const RankProgram& p = plan.ranks[r];
    DeviceRank dr{};
    dr.first_lane = static_cast<int32_t>(im.lanes.size());
    dr.nlanes = std::max(p.nlanes, 1);
    dr.input_chunks = p.input_chunks;
    dr.output_chunks = p.output_chunks;
    dr.scratch_chunks = p.scratch_chunks;
    dr.semaphores = p.semaphores;
    if (dr.nlanes > kMaxLanes)
      return Status::Error("rank " + std::to_string(r) + " has " + std::to_string(p.nlanes) +
                           " lanes; the CUDA executor runs at most " + std::to_string(kMaxLanes) + " per rank");
    std::vector<int32_t> waiter(p.semaphores, -1);  // the one lane that waits on each semaphore
    for (int32_t l = 0; l < dr.nlanes; ++l) {
      DeviceLane dl{static_cast<int32_t>(im.steps.size()), 0, 0, 0, static_cast<int32_t>(im.refs.size()), 0};
      if (l < p.nlanes) {
        const Lane& lane = plan.lanes[p.first_lane + l];
        dl.nsteps = lane.nsteps;
        std::vector<int32_t> waits(p.semaphores, 0);
        std::vector<Touch> since_meeting;
        for (int32_t i = 0; i < lane.nsteps; ++i) {
          const Step& s = plan.steps[lane.first_step + i];
          DeviceStep ds{static_cast<int32_t>(s.op), s.peer, s.sem, static_cast<int32_t>(im.refs.size()),
                        s.nsrc, s.ndst, 0, 0};
          if (s.nsrc + s.ndst > kMaxStepRefs)
            return Status::Error(plan.where(r, l, i) + ": names " + std::to_string(s.nsrc + s.ndst) +
                                 " chunks; the CUDA executor takes at most " + std::to_string(kMaxStepRefs));
          im.max_refs = std::max(im.max_refs, s.nsrc + s.ndst);
          if (s.op == Op::kWait) {
            if (waiter[s.sem] >= 0 && waiter[s.sem] != l)
              return Status::Error(plan.where(r, l, i) + ": semaphore " + std::to_string(s.sem) +
                                   " is also waited on by lane " + std::to_string(waiter[s.sem]) +
                                   "; the CUDA executor needs each semaphore waited on by one lane (the checker "
                                   "of jaxcoll.lang enforces it)");
            waiter[s.sem] = l;
            ds.ordinal = waits[s.sem]++;
          } else if (s.op == Op::kBarrier) {
            ds.ordinal = ++dl.nbarriers;
            dr.has_barriers = 1;
            since_meeting.clear();  // every block of every lane meets there
          } else if (s.op == Op::kSignal) {
            ++im.signals_per_call[size_t(s.peer) * im.max_semaphores + s.sem];
          }
          const ChunkRef* refs = plan.srcs(s);
          if (is_data(s.op)) {
            bool meet = false;
            for (int32_t j = 0; j < s.nsrc + s.ndst && !meet; ++j)
              meet = needs_meeting(since_meeting, {refs[j], j >= s.nsrc});
            if (meet) {
              ds.sync_before = ++dl.nsyncs;
              since_meeting.clear();
            }
            for (int32_t j = 0; j < s.nsrc + s.ndst; ++j) since_meeting.push_back({refs[j], j >= s.nsrc});
          }
          for (int32_t j = 0; j < s.nsrc + s.ndst; ++j) {
            const ChunkRef& c = refs[j];
            im.refs.push_back(c);
            if (c.rank != r) shared[c.rank] |= 1u << static_cast<int>(c.buffer);
            for (int32_t x = c.index; x < c.index + c.count; ++x)
              ++(j >= s.nsrc ? writes : reads)[{c.rank, static_cast<int32_t>(c.buffer), x}];
          }
          im.steps.push_back(ds);
        }
      }
      dl.nrefs = static_cast<int32_t>(im.refs.size()) - dl.first_ref;
      im.lanes.push_back(dl);
    }
    im.max_lanes = std::max(im.max_lanes, dr.nlanes);
    im.ranks.push_back(dr);
  }

  // The packet protocol: every chunk other ranks touch lives in packets (data and flag in one store), written
  // once per call, so a reader knows it is current from its flag alone and no call needs a rendezvous.
  im.ll_ok = true;
  if (plan.in_place) {
    im.ll_ok = false;
    im.ll_reason = "the plan is in place";
  }
  for (const auto& [key, n] : writes) {
    const auto [rank, buffer, index] = key;
    if (im.ll_ok && n > 1 && (shared[rank] >> buffer & 1)) {
      im.ll_ok = false;
      im.ll_reason = "chunk " + std::to_string(index) + " of rank " + std::to_string(rank) + "'s " +
                     buffer_name(static_cast<BufferKind>(buffer)) + " is written " + std::to_string(n) +
                     " times in one call, and other ranks touch that buffer";
    }
  }
  for (const auto& [key, n] : reads) {
    const auto [rank, buffer, index] = key;
    if (im.ll_ok && buffer != static_cast<int32_t>(BufferKind::kInput) && (shared[rank] >> buffer & 1) &&
        !writes.count(key)) {
      im.ll_ok = false;
      im.ll_reason = "chunk " + std::to_string(index) + " of rank " + std::to_string(rank) + "'s " +
                     buffer_name(static_cast<BufferKind>(buffer)) + " is read but never written in a call";
    }
  }
  for (int32_t r = 0; r < plan.nranks; ++r) {
    DeviceRank& dr = im.ranks[r];
    dr.shared = shared[r];
    dr.first_unpack = static_cast<int32_t>(im.unpack.size());
    if (!(shared[r] & kSharedOutput)) continue;
    const int32_t out = static_cast<int32_t>(BufferKind::kOutput);
    for (int32_t x = 0; x < dr.output_chunks; ++x) {
      if (!writes.count({r, out, x})) continue;
      if (!im.unpack.empty() && dr.nunpack && im.unpack.back().index + im.unpack.back().count == x)
        ++im.unpack.back().count;
      else
        im.unpack.push_back({x, 1}), ++dr.nunpack;
    }
  }
  return {};
}

Status choose_protocol(const PlanImage& im, int64_t input_bytes, int64_t ll_max_bytes, Protocol& out) {
  switch (im.requested) {
    case Protocol::kLL:
      if (!im.ll_ok)
        return Status::Error("the plan asks for the ll protocol, which cannot run it: " + im.ll_reason);
      out = Protocol::kLL;
      return {};
    case Protocol::kBulk:
      out = Protocol::kBulk;
      return {};
    case Protocol::kAuto:
      out = im.ll_ok && input_bytes <= ll_max_bytes ? Protocol::kLL : Protocol::kBulk;
      return {};
  }
  return Status::Error("unknown protocol code " + std::to_string(static_cast<int32_t>(im.requested)));
}

int64_t traffic_bytes(const PlanImage& im, int64_t block, size_t dsize, size_t asize) {
  int64_t total = 0;
  for (const DeviceStep& s : im.steps) {
    if (!is_data(static_cast<Op>(s.op))) continue;
    const ChunkRef* refs = im.refs.data() + s.first_ref;
    const int64_t n = chunk_range(im.chunk_factor, block, refs[0].index, refs[0].count).size();
    for (int32_t j = 0; j < s.nsrc + s.ndst; ++j)
      total += n * int64_t(refs[j].buffer == BufferKind::kScratch ? asize : dsize);
  }
  return total;
}

}  // namespace jaxcoll::cuda
