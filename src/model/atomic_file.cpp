#include "model/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace tpcli::model {

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(tmp + ": cannot open for writing");
    write(out);
    out.flush();
    if (!out) throw std::runtime_error(tmp + ": write failed (disk full?)");
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error(path + ": cannot rename " + tmp + " into place: " + ec.message());
  }
}

}  // namespace tpcli::model
