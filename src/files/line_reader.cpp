// tpcli::files — a text file read one line at a time, each line bounded (see line_reader.h).
#include "files/line_reader.h"

#include <stdexcept>

#include "files/regular_file.h"

namespace tpcli::files {

LineReader::LineReader(const std::string& path, const std::string& what, size_t max_line_bytes)
    : path_(path), max_line_bytes_(max_line_bytes) {
  require_regular_file(path, what);  // a FIFO would block the open, a device never end
  in_.open(path, std::ios::binary);
  if (!in_) throw std::runtime_error(path + ": cannot open " + what);
}

bool LineReader::next(std::string& line) {
  line.clear();
  std::streambuf& buffer = *in_.rdbuf();
  int c = buffer.sbumpc();
  if (c == std::char_traits<char>::eof()) return false;
  ++number_;
  for (; c != std::char_traits<char>::eof() && c != '\n'; c = buffer.sbumpc()) {
    if (line.size() == max_line_bytes_)
      throw std::runtime_error(where() + ": line " + std::to_string(number_) + " is longer than " +
                               std::to_string(max_line_bytes_) + " bytes");
    line.push_back(static_cast<char>(c));
  }
  return true;
}

}  // namespace tpcli::files
