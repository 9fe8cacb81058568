#include "csrc/shared_memory.hpp"

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace jaxcoll {

namespace {

// Names this process created and has not unlinked yet: unlinked at exit, so a process that returns normally
// leaves nothing in /dev/shm even if its segments are still mapped.
struct Created {
  std::mutex mu;
  std::set<std::string> names;
  Created() {
    std::atexit([] {
      Created& c = created();
      std::lock_guard<std::mutex> lock(c.mu);
      for (const std::string& n : c.names) shm_unlink(n.c_str());
      c.names.clear();
    });
  }
  static Created& created();
};

Created& Created::created() {
  static Created* c = new Created();  // leaked on purpose: used from atexit
  return *c;
}

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

}  // namespace

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

SharedSegment::~SharedSegment() { reset(); }

void SharedSegment::reset() {
  if (data_) munmap(data_, size_);
  if (owner_) {
    shm_unlink(name_.c_str());
    Created& c = Created::created();
    std::lock_guard<std::mutex> lock(c.mu);
    c.names.erase(name_);
  }
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
  name_.clear();
}

Status SharedSegment::create(const std::string& name, size_t bytes, SharedSegment& out) {
  out.reset();
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return Status::Error("jaxcoll: cannot create the shared-memory segment " + name + ": " + errno_text(errno));
  {
    Created& c = Created::created();
    std::lock_guard<std::mutex> lock(c.mu);
    c.names.insert(name);
  }
  out.name_ = name;
  out.owner_ = true;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    out.reset();
    return Status::Error("jaxcoll: cannot size the shared-memory segment " + name + " to " + std::to_string(bytes) +
                         " bytes: " + errno_text(err) + " (is /dev/shm large enough?)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    out.reset();
    return Status::Error("jaxcoll: cannot map the shared-memory segment " + name + ": " + errno_text(err));
  }
  out.data_ = p;
  out.size_ = bytes;
  return {};
}

Status SharedSegment::open(const std::string& name, SharedSegment& out, Opened& opened) {
  out.reset();
  opened = Opened::kNotYet;
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) return {};
    return Status::Error("jaxcoll: cannot open the shared-memory segment " + name + ": " + errno_text(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size == 0) {
    close(fd);
    return {};  // created but not sized yet: try again
  }
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED)
    return Status::Error("jaxcoll: cannot map the shared-memory segment " + name + ": " + errno_text(err));
  out.data_ = p;
  out.size_ = static_cast<size_t>(st.st_size);
  out.name_ = name;
  opened = Opened::kMapped;
  return {};
}

std::string segment_prefix(const std::string& token) {
  return "/jaxcoll-" + token + "-" + std::to_string(getpid()) + "-";
}

int clean_stale_segments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  int removed = 0;
  while (dirent* e = readdir(dir)) {
    // jaxcoll-<token>-<pid>-<rest>
    const std::string name = e->d_name;
    if (name.rfind("jaxcoll-", 0) != 0) continue;
    const size_t a = name.find('-', 8);
    if (a == std::string::npos) continue;
    const size_t b = name.find('-', a + 1);
    if (b == std::string::npos) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + a + 1, &end, 10);
    if (end != name.c_str() + b || pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace jaxcoll
