// Fuzz-target support: the fuzzer's bytes as a file the loaders open by path (an anonymous
// memory file, /proc/self/fd/N: no disk traffic), and the promise every loader makes about its
// errors: one line that names the file.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tpcli::fuzz {

class InputFile {
 public:
  InputFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A loader's error must be one line naming the file: anything else is a finding.
inline void check_error_names(const std::string& message, const std::string& path) {
  if (message.find('\n') != std::string::npos || message.find(path) == std::string::npos) {
    std::fprintf(stderr, "error message breaks the one-line-naming-the-file rule: %s\n", message.c_str());
    std::abort();
  }
}

}  // namespace tpcli::fuzz
