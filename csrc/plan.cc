#include "csrc/plan.hpp"

#include <algorithm>
#include <optional>
#include <string>

namespace jaxcoll {

const char* op_name(Op op) {
  switch (op) {
    case Op::kCopy: return "copy";
    case Op::kReduce: return "reduce";
    case Op::kPut: return "put";
    case Op::kGet: return "get";
    case Op::kReadReduce: return "read_reduce";
    case Op::kReducePut: return "reduce_put";
    case Op::kReadReducePut: return "read_reduce_put";
    case Op::kZero: return "zero";
    case Op::kSignal: return "signal";
    case Op::kWait: return "wait";
    case Op::kBarrier: return "barrier";
  }
  return "?";
}

const char* buffer_name(BufferKind b) {
  switch (b) {
    case BufferKind::kInput: return "input";
    case BufferKind::kOutput: return "output";
    case BufferKind::kScratch: return "scratch";
  }
  return "?";
}

std::string Plan::where(int32_t rank, int32_t lane, int32_t step) const {
  std::string s = "rank " + std::to_string(rank) + ", lane " + std::to_string(lane) + ", step " + std::to_string(step);
  const RankProgram& p = ranks[rank];
  if (lane < p.nlanes && step < lanes[p.first_lane + lane].nsteps)
    s += std::string(" (") + op_name(steps[lanes[p.first_lane + lane].first_step + step].op) + ")";
  return s;
}

namespace {

constexpr int32_t kNumOps = 11, kNumBuffers = 3, kNumProtocols = 3;

// Reads words one field at a time; every read is bounds-checked so a truncated plan fails cleanly.
class WordReader {
 public:
  explicit WordReader(std::span<const int32_t> w) : w_(w) {}
  bool take(size_t n, const int32_t*& out) {
    if (n > w_.size() - pos_) return false;
    out = w_.data() + pos_;
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return w_.size() - pos_; }

 private:
  std::span<const int32_t> w_;
  size_t pos_ = 0;
};

Status truncated(const WordReader& r, size_t need) {
  return Status::Error("serialized plan is truncated at word " + std::to_string(r.pos()) + " (needs " +
                       std::to_string(need) + " more, has " + std::to_string(r.left()) + ")");
}

std::string ref_str(const ChunkRef& r) {
  std::string span = r.count == 1 ? std::to_string(r.index)
                                  : std::to_string(r.index) + ":" + std::to_string(int64_t{r.index} + r.count);
  return "r" + std::to_string(r.rank) + "." + buffer_name(r.buffer) + "[" + span + "]";
}

Status validate(Plan& plan) {
  const int32_t n = plan.nranks, k = plan.chunk_factor;
  for (int32_t r = 0; r < n; ++r) {
    const RankProgram& p = plan.ranks[r];
    const std::string rk = "rank " + std::to_string(r) + ": ";
    if (p.input_chunks < 1 || p.input_chunks % plan.in_blocks)
      return Status::Error(rk + "input_chunks=" + std::to_string(p.input_chunks) +
                           " is not a positive multiple of in_blocks=" + std::to_string(plan.in_blocks));
    if (p.input_chunks / plan.in_blocks != k)
      return Status::Error(rk + "input_chunks=" + std::to_string(p.input_chunks) + " gives " +
                           std::to_string(p.input_chunks / plan.in_blocks) + " chunks per block, rank 0 gives " +
                           std::to_string(k) + "; every rank must split blocks alike");
    if (int64_t{p.output_chunks} != int64_t{plan.out_blocks} * k)
      return Status::Error(rk + "output_chunks=" + std::to_string(p.output_chunks) + ", expected out_blocks*k=" +
                           std::to_string(int64_t{plan.out_blocks} * k));
    if (p.scratch_chunks < 0 || p.scratch_chunks % k)
      return Status::Error(rk + "scratch_chunks=" + std::to_string(p.scratch_chunks) + " is not a multiple of k=" +
                           std::to_string(k));
    if (p.semaphores < 0)
      return Status::Error(rk + "semaphores=" + std::to_string(p.semaphores) + " is negative");
    plan.buffer_chunks += int64_t{p.input_chunks} + p.output_chunks;
    plan.scratch_chunks += p.scratch_chunks;
  }
  for (int32_t r = 0; r < n; ++r) {
    const RankProgram& p = plan.ranks[r];
    for (int32_t l = 0; l < p.nlanes; ++l) {
      const Lane& lane = plan.lanes[p.first_lane + l];
      for (int32_t i = 0; i < lane.nsteps; ++i) {
        const Step& s = plan.steps[lane.first_step + i];
        const std::string where = plan.where(r, l, i) + ": ";
        if (s.is_data()) {
          if (s.ndst < 1) return Status::Error(where + "a data step needs at least one destination chunk");
          plan.traffic_chunks += int64_t{s.nsrc + s.ndst} * plan.refs[s.first_ref].count;
          if (s.op == Op::kZero && s.nsrc != 0) return Status::Error(where + "a zero step takes no sources");
          if (s.op != Op::kZero && s.nsrc < 1) return Status::Error(where + "a data step needs at least one source");
        } else {
          if (s.nsrc || s.ndst) return Status::Error(where + "a sync step moves no data but names chunks");
          if (s.op != Op::kBarrier && s.sem < 0)
            return Status::Error(where + "needs a semaphore index >= 0, got sem=" + std::to_string(s.sem));
        }
        const ChunkRef* refs = plan.srcs(s);
        const int32_t nref = s.nsrc + s.ndst;
        for (int32_t j = 0; j < nref; ++j) {
          const ChunkRef& ref = refs[j];
          if (ref.count < 1)
            return Status::Error(where + "chunk count must be >= 1, got count=" + std::to_string(ref.count));
          if (ref.index < 0)
            return Status::Error(where + "chunk index must be >= 0, got index=" + std::to_string(ref.index));
          if (ref.rank < 0 || ref.rank >= n)
            return Status::Error(where + "rank " + std::to_string(ref.rank) + " is out of range for nranks=" +
                                 std::to_string(n));
          const int64_t have = plan.ranks[ref.rank].chunks(ref.buffer);
          if (int64_t{ref.index} + ref.count > have)
            return Status::Error(where + ref_str(ref) + " is out of range: rank " + std::to_string(ref.rank) + "'s " +
                                 buffer_name(ref.buffer) + " buffer holds " + std::to_string(have) + " chunks");
          if (ref.count != refs[0].count)
            return Status::Error(where + "step mixes chunk counts " + std::to_string(refs[0].count) + " and " +
                                 std::to_string(ref.count));
          if (ref.index % k != refs[0].index % k)
            return Status::Error(where + "chunks at different positions within their blocks (index mod k=" +
                                 std::to_string(k) + ") may differ in size and cannot be combined");
          if (j >= s.nsrc && ref.buffer == BufferKind::kInput && !plan.in_place)
            return Status::Error(where + "an out-of-place plan never writes its input buffer");
        }
        if (s.op == Op::kSignal) {
          if (s.peer < 0 || s.peer >= n)
            return Status::Error(where + "signal peer " + std::to_string(s.peer) + " is out of range for nranks=" +
                                 std::to_string(n));
          if (s.sem >= plan.ranks[s.peer].semaphores)
            return Status::Error(where + "semaphore " + std::to_string(s.sem) + " does not exist on rank " +
                                 std::to_string(s.peer) + " (it has " +
                                 std::to_string(plan.ranks[s.peer].semaphores) + ")");
        }
        if (s.op == Op::kWait && s.sem >= p.semaphores)
          return Status::Error(where + "semaphore " + std::to_string(s.sem) + " does not exist on rank " +
                               std::to_string(r) + " (it has " + std::to_string(p.semaphores) + ")");
      }
    }
  }
  return {};
}

}  // namespace

Status decode_plan(std::span<const int32_t> words, Plan& plan) {
  plan = Plan{};
  WordReader rd(words);
  const int32_t* h;
  if (!rd.take(8, h)) return truncated(rd, 8);
  if (h[0] != kPlanMagic || h[1] != kPlanVersion)
    return Status::Error("not a jaxcoll plan of version " + std::to_string(kPlanVersion) + ": magic=" +
                         std::to_string(h[0]) + ", version=" + std::to_string(h[1]));
  const std::optional<Collective> collective = collective_from_code(h[2]);
  if (!collective)
    return Status::Error("serialized plan has an unknown collective code " + std::to_string(h[2]) + " at word 2");
  if (h[3] < 1) return Status::Error("plan needs nranks >= 1, got nranks=" + std::to_string(h[3]));
  if (h[4] < 1 || h[5] < 1)
    return Status::Error("plan needs in_blocks and out_blocks >= 1, got in_blocks=" + std::to_string(h[4]) +
                         ", out_blocks=" + std::to_string(h[5]));
  if (h[7] < 0 || h[7] >= kNumProtocols)
    return Status::Error("serialized plan has an unknown protocol code " + std::to_string(h[7]) + " at word 7");
  plan.collective = *collective;
  plan.nranks = h[3];
  plan.in_blocks = h[4];
  plan.out_blocks = h[5];
  plan.in_place = (h[6] & kFlagInPlace) != 0;
  plan.protocol = h[7];
  // Each rank takes at least 5 words: a corrupt nranks cannot make us reserve unbounded memory.
  if (static_cast<size_t>(plan.nranks) > rd.left() / 5) return truncated(rd, size_t(plan.nranks) * 5);
  plan.ranks.resize(plan.nranks);
  for (int32_t r = 0; r < plan.nranks; ++r) {
    const int32_t* p;
    if (!rd.take(5, p)) return truncated(rd, 5);
    if (p[4] < 0 || static_cast<size_t>(p[4]) > rd.left())
      return Status::Error("rank " + std::to_string(r) + ": lane count " + std::to_string(p[4]) + " at word " +
                           std::to_string(rd.pos() - 1) + " is negative or exceeds the plan's length");
    RankProgram& prog = plan.ranks[r];
    prog = {p[0], p[1], p[2], p[3], static_cast<int32_t>(plan.lanes.size()), p[4]};
    plan.max_lanes = std::max(plan.max_lanes, prog.nlanes);
    plan.max_semaphores = std::max(plan.max_semaphores, prog.semaphores);
    for (int32_t l = 0; l < prog.nlanes; ++l) {
      const int32_t* ns;
      if (!rd.take(1, ns)) return truncated(rd, 1);
      if (ns[0] < 0 || static_cast<size_t>(ns[0]) > rd.left() / 5)
        return Status::Error("rank " + std::to_string(r) + ", lane " + std::to_string(l) + ": step count " +
                             std::to_string(ns[0]) + " at word " + std::to_string(rd.pos() - 1) +
                             " is negative or exceeds the plan's length");
      plan.lanes.push_back({static_cast<int32_t>(plan.steps.size()), ns[0]});
      for (int32_t i = 0; i < ns[0]; ++i) {
        const int32_t* s;
        if (!rd.take(5, s)) return truncated(rd, 5);
        const std::string where = "rank " + std::to_string(r) + ", lane " + std::to_string(l) + ", step " +
                                  std::to_string(i) + " (word " + std::to_string(rd.pos() - 5) + "): ";
        if (s[0] < 0 || s[0] >= kNumOps) return Status::Error(where + "unknown op code " + std::to_string(s[0]));
        if (s[3] < 0 || s[4] < 0 || (int64_t{s[3]} + s[4]) * 4 > static_cast<int64_t>(rd.left()))
          return Status::Error(where + "source/destination counts nsrc=" + std::to_string(s[3]) + ", ndst=" +
                               std::to_string(s[4]) + " are negative or exceed the plan's length");
        plan.steps.push_back({static_cast<Op>(s[0]), s[1], s[2], static_cast<int32_t>(plan.refs.size()), s[3], s[4]});
        for (int32_t j = 0; j < s[3] + s[4]; ++j) {
          const int32_t* c;
          if (!rd.take(4, c)) return truncated(rd, 4);
          if (c[1] < 0 || c[1] >= kNumBuffers)
            return Status::Error(where + "unknown buffer code " + std::to_string(c[1]) + " at word " +
                                 std::to_string(rd.pos() - 3));
          plan.refs.push_back({c[0], static_cast<BufferKind>(c[1]), c[2], c[3]});
        }
      }
    }
  }
  if (rd.left()) return Status::Error("serialized plan has " + std::to_string(rd.left()) + " trailing words");
  plan.chunk_factor = plan.ranks[0].input_chunks / plan.in_blocks;
  if (plan.chunk_factor < 1)
    return Status::Error("rank 0: input_chunks=" + std::to_string(plan.ranks[0].input_chunks) +
                         " is not a positive multiple of in_blocks=" + std::to_string(plan.in_blocks));
  return validate(plan);
}

}  // namespace jaxcoll
