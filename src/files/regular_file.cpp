#include "files/regular_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace tpcli::files {

static const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    throw std::runtime_error(path + ": cannot open " + what + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    throw std::runtime_error(path + ": is " + file_kind(st.st_mode) + ", not " + what);
  }
}

std::string read_text_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw std::runtime_error(path + ": cannot open " + what + ": " + std::strerror(err));
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace tpcli::files
