#include "csrc/shared_memory.hpp"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
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

std::string segment_prefix(const std::string& token, int32_t process) {
  return "/jaxcoll-" + token + "-p" + std::to_string(process) + "-";
}

namespace {
constexpr size_t kPresenceBytes = 64;
}

Status open_presence(const std::string& token, int32_t process, std::string& nonce) {
  static std::mutex mu;
  static std::string* mine = new std::string();  // the nonce, once made; the fd stays open (and locked) for good
  std::lock_guard<std::mutex> lock(mu);
  if (!mine->empty()) {
    nonce = *mine;
    return {};
  }
  char bytes[16];
  const int random = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const bool got = random >= 0 && read(random, bytes, sizeof(bytes)) == ssize_t(sizeof(bytes));
  if (random >= 0) close(random);
  if (!got) return Status::Error("jaxcoll: cannot read /dev/urandom for this process's presence nonce");
  std::string made;
  for (unsigned char b : bytes) made += "0123456789abcdef"[b >> 4], made += "0123456789abcdef"[b & 15];
  const std::string name = segment_prefix(token, process) + "alive";
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return Status::Error("jaxcoll: cannot create this process's presence segment " + name + ": " + errno_text(errno));
  {
    Created& c = Created::created();
    std::lock_guard<std::mutex> names(c.mu);
    c.names.insert(name);
  }
  char text[kPresenceBytes] = {};
  std::memcpy(text, made.data(), made.size());
  if (flock(fd, LOCK_EX) != 0 || ftruncate(fd, kPresenceBytes) != 0 || pwrite(fd, text, sizeof(text), 0) !=
                                                                             ssize_t(sizeof(text))) {
    const int err = errno;
    close(fd);
    return Status::Error("jaxcoll: cannot write this process's presence segment " + name + ": " + errno_text(err));
  }
  *mine = made;
  nonce = made;
  return {};
}

int open_presence_fd(const std::string& token, int32_t process) {
  return shm_open((segment_prefix(token, process) + "alive").c_str(), O_RDONLY | O_CLOEXEC, 0);
}

std::string read_presence(const std::string& token, int32_t process) {
  const int fd = open_presence_fd(token, process);
  if (fd < 0) return {};
  char text[kPresenceBytes] = {};
  const bool got = pread(fd, text, sizeof(text), 0) == ssize_t(sizeof(text));
  close(fd);
  return got ? std::string(text, strnlen(text, sizeof(text))) : std::string();
}

bool presence_alive(int fd) {
  if (flock(fd, LOCK_SH | LOCK_NB) == 0) {  // its owner's exclusive lock is gone: so is the owner
    flock(fd, LOCK_UN);
    return false;
  }
  return errno == EWOULDBLOCK || errno == EINTR;
}

int clean_stale_segments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  // jaxcoll-<token>-p<process>-<rest>: the segments of one process, and whether its presence is unlocked (dead).
  std::map<std::string, std::vector<std::string>> groups;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("jaxcoll-", 0) != 0) continue;
    const size_t a = name.find('-', 8);
    const size_t b = a == std::string::npos ? a : name.find('-', a + 1);
    if (b == std::string::npos) continue;
    groups[name.substr(0, b + 1)].push_back(name);
  }
  closedir(dir);
  int removed = 0;
  const time_t now = time(nullptr);
  for (const auto& [prefix, names] : groups) {
    const int fd = shm_open(("/" + prefix + "alive").c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;  // no presence: not ours to judge
    struct stat st {};
    const bool dead = fstat(fd, &st) == 0 && now - st.st_mtime >= 10 && !presence_alive(fd);
    close(fd);
    if (!dead) continue;
    for (const std::string& name : names)
      if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace jaxcoll
