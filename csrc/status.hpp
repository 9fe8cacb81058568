// An error as a value: every fallible function of the runtime returns one, and the FFI layer turns it into an
// ffi::Error, the Python layer into an exception. Success carries no message.
#pragma once

#include <string>
#include <utility>

namespace jaxcoll {

class Status {
 public:
  Status() = default;
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : message_(message.empty() ? "unknown error" : std::move(message)) {}
  std::string message_;
};

}  // namespace jaxcoll
