#include "model/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace tpcli::model {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// fsync(path): the bytes of a file, or the entries of a directory, reach the disk. Returns errno, 0 on success.
int sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return errno;
  const int err = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

void remove_quietly(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
}

}  // namespace

std::string temporary_path(const std::string& path) { return path + ".tmp"; }

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = temporary_path(path);
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(tmp + ": cannot open for writing: " + errno_text(errno));
    write(out);
    out.close();  // flushes; a full disk shows here at the latest
    if (!out) throw std::runtime_error(tmp + ": write failed: " + errno_text(errno) + " (disk full?)");
    // The data must be on disk before the rename makes it the file: otherwise a power cut after
    // the rename can leave an empty or partial file under the final name.
    if (const int err = sync_path(tmp, false); err != 0)
      throw std::runtime_error(tmp + ": fsync failed: " + errno_text(err));
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;  // before the cleanup below can overwrite it
    remove_quietly(tmp);
    throw std::runtime_error(path + ": cannot rename " + tmp + " into place: " + errno_text(err));
  }
  // The rename itself is an entry of the directory: sync it, or a crash may forget it.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (const int err = sync_path(parent.empty() ? "." : parent.string(), true); err != 0)
    throw std::runtime_error(parent.string() + ": fsync of the directory after writing " + path + " failed: " + errno_text(err));
}

bool remove_stale_temporary(const std::string& path) {
  std::error_code ec;
  return std::filesystem::remove(temporary_path(path), ec) && !ec;
}

}  // namespace tpcli::model
