// Named shared-memory segments (POSIX shm), which the same-host transport of cross-process groups maps
// (transport/shm.cc). A segment is created owner-only (mode 0600) and exclusively (O_EXCL), under a name that
// carries the job's random token, so no other user can map it and no other job can guess or collide with it; the
// creator unlinks it when the segment is dropped (or at exit), and clean_stale_segments() removes those a crashed
// process left.
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

// The prefix of every segment process `process` of the job with `token` creates: "/jaxcoll-<token>-p<process>-"
// (the job's process index, unique where pids are not: processes in several pid namespaces share /dev/shm).
std::string segment_prefix(const std::string& token, int32_t process);

// A process's presence: the segment "<prefix>alive", holding a random nonce and locked (flock, exclusive) for as
// long as the process lives. The lock tells liveness across pid namespaces (a pid names another process, or
// none, in another namespace; a lock on the one file is the same everywhere), and the nonce read by a peer tells
// that the two really share /dev/shm (two containers may share a hostname and kernel but not /dev/shm).
// open_presence creates this process's (once) and returns its nonce.
Status open_presence(const std::string& token, int32_t process, std::string& nonce);
// The nonce in process `process`'s presence as this process sees it; "" when there is none (another /dev/shm).
std::string read_presence(const std::string& token, int32_t process);
// An open presence of another process, -1 if there is none; whether its owner still lives.
int open_presence_fd(const std::string& token, int32_t process);
bool presence_alive(int fd);

// Unlink every jaxcoll segment in /dev/shm whose creating process no longer lives (its presence unlocked, for
// ten seconds at least); returns how many. Segments without a presence are another version's: left alone.
int clean_stale_segments();

}  // namespace jaxcoll
