// Named shared-memory segments (POSIX shm), the same-host transport of groups that span processes (spanning.hpp).
// A segment is created owner-only (mode 0600) and exclusively (O_EXCL), under a name that carries the job's
// random token, so no other user can map it and no other job can guess or collide with it; the creator unlinks it
// when the segment is dropped (or at exit), and clean_stale_segments() removes those a crashed process left.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "csrc/status.hpp"

namespace jaxcoll {

class SharedSegment {
 public:
  SharedSegment() = default;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  SharedSegment(SharedSegment&& other) noexcept { *this = std::move(other); }
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  ~SharedSegment();

  // Create `name` ("/jaxcoll-...") of `bytes` bytes, zero-filled, owned by this object (unlinked when dropped).
  static Status create(const std::string& name, size_t bytes, SharedSegment& out);
  // Map an existing segment another process created. kNotYet (with an OK status) when it does not exist yet.
  enum class Opened { kMapped, kNotYet };
  static Status open(const std::string& name, SharedSegment& out, Opened& opened);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool mapped() const { return data_ != nullptr; }

 private:
  void reset();
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
};

// The prefix of every segment jaxcoll creates: "/jaxcoll-<token>-<pid>-"; the pid lets a later run tell a
// crashed process's segments from live ones.
std::string segment_prefix(const std::string& token);

// Unlink every jaxcoll segment in /dev/shm whose creating process no longer exists; returns how many.
int clean_stale_segments();

}  // namespace jaxcoll
