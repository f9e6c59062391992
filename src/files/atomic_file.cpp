#include "files/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

namespace tpcli::files {

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

void remove_folder_quietly(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

// The letters of a temporary folder's six-letter suffix.
constexpr char TEMPORARY_LETTERS[] = "abcdefghijklmnopqrstuvwxyz0123456789";

// Creates a new folder DIR.tmp-XXXXXX beside `dir` (mode 0777 less the umask, as mkdir -p would
// give `dir`; mkdtemp's 0700 would stay on the renamed folder) and returns its path.
std::string make_temporary_folder(const std::filesystem::path& dir) {
  constexpr size_t LETTER_COUNT = sizeof TEMPORARY_LETTERS - 1;
  std::mt19937_64 random(std::random_device{}() ^ static_cast<uint64_t>(::getpid()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string path = dir.string() + ".tmp-";
    for (int i = 0; i < 6; ++i) path += TEMPORARY_LETTERS[random() % LETTER_COUNT];
    if (::mkdir(path.c_str(), 0777) == 0) return path;
    if (errno != EEXIST) throw std::runtime_error(path + ": cannot create the temporary folder: " + errno_text(errno));
  }
  throw std::runtime_error(dir.string() + ".tmp-XXXXXX: no free temporary folder name after 100 tries");
}

std::filesystem::path without_trailing_slash(const std::string& dir) {
  const std::filesystem::path path(dir);
  return path.has_filename() ? path : path.parent_path();
}

}  // namespace

void write_directory_atomically(const std::string& dir, const std::function<void(const std::string&)>& write) {
  const std::filesystem::path target = without_trailing_slash(dir);
  require_new_folder(target.string());
  const std::filesystem::path parent = target.parent_path().empty() ? "." : target.parent_path();
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) throw std::runtime_error(parent.string() + ": cannot create the folder: " + ec.message());
  const std::string tmp = make_temporary_folder(target);
  try {
    write(tmp);
    if (const int err = sync_path(tmp, true); err != 0) throw std::runtime_error(tmp + ": fsync failed: " + errno_text(err));
    if (std::rename(tmp.c_str(), target.c_str()) != 0) {
      const int err = errno;
      throw std::runtime_error(target.string() + ": cannot rename " + tmp + " into place: " + errno_text(err));
    }
  } catch (...) {
    remove_folder_quietly(tmp);
    throw;
  }
  if (const int err = sync_path(parent.string(), true); err != 0)
    throw std::runtime_error(parent.string() + ": fsync of the folder after writing " + target.string() +
                             " failed: " + errno_text(err));
}

void replace_directory_atomically(const std::string& dir, const std::function<void(const std::string&)>& write) {
  const std::filesystem::path target = without_trailing_slash(dir);
  if (!std::filesystem::is_directory(target)) return write_directory_atomically(dir, write);
  const std::string fresh = make_temporary_folder(target);
  try {
    write(fresh);
    if (const int err = sync_path(fresh, true); err != 0) throw std::runtime_error(fresh + ": fsync failed: " + errno_text(err));
    if (renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      const std::string aside = target.string() + ".old";  // no exchange here: the old folder steps aside first
      remove_folder_quietly(aside);
      if (std::rename(target.c_str(), aside.c_str()) != 0 || std::rename(fresh.c_str(), target.c_str()) != 0) {
        const int err = errno;
        throw std::runtime_error(target.string() + ": cannot rename " + fresh + " into place: " + errno_text(err));
      }
      remove_folder_quietly(aside);
      return;
    }
  } catch (...) {
    remove_folder_quietly(fresh);
    throw;
  }
  remove_folder_quietly(fresh);  // the old contents, after the exchange
  const std::string parent = target.parent_path().empty() ? "." : target.parent_path().string();
  if (const int err = sync_path(parent, true); err != 0)
    throw std::runtime_error(parent + ": fsync of the folder after replacing " + target.string() + " failed: " + errno_text(err));
}

void require_new_folder(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::symlink_status(dir, ec);
  if (!std::filesystem::exists(status)) return;
  if (!std::filesystem::is_directory(status))
    throw std::runtime_error(dir + ": already exists and is not a folder: choose a new folder");
  if (!std::filesystem::is_empty(dir, ec) || ec)
    throw std::runtime_error(dir + ": already exists and is not empty: choose a new folder");
}

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

int remove_stale_folder_temporaries(const std::string& dir) {
  const std::filesystem::path target = without_trailing_slash(dir);
  const std::filesystem::path parent = target.parent_path().empty() ? "." : target.parent_path();
  const std::string prefix = target.filename().string() + ".tmp-";
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    // Exactly the names make_temporary_folder draws: PREFIX and six of its letters.
    const bool ours = name.size() == prefix.size() + 6 && name.starts_with(prefix) &&
                      name.find_first_not_of(TEMPORARY_LETTERS, prefix.size()) == std::string::npos;
    if (ours && entry.is_directory(ec)) stale.push_back(entry.path());
  }
  for (const auto& path : stale) remove_folder_quietly(path.string());
  return static_cast<int>(stale.size());
}

}  // namespace tpcli::files
