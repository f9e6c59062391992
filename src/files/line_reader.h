// tpcli::files — a text file read one line at a time, each line bounded.
//
// std::getline reads a line whole however long it is: a file without newlines (or /dev/zero)
// is read into memory to its end. LineReader refuses what is not a regular file before opening
// it (files/regular_file.h) and stops at the first line past its bound, naming the file and the
// line, having held at most the bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

namespace tpcli::files {

// 16 MiB: a whole 128K-token context, as text escaped in JSON, several times over.
constexpr size_t MAX_LINE_BYTES = size_t{16} << 20;

class LineReader {
 public:
  // Throws std::runtime_error naming `path` when it is not a readable regular file; `what` names
  // the file's role ("a JSONL file"), as require_regular_file.
  LineReader(const std::string& path, const std::string& what, size_t max_line_bytes = MAX_LINE_BYTES);

  // The next line, without its '\n'; false at the end of the file. Throws std::runtime_error
  // "PATH:N: line N is longer than M bytes" as soon as a line passes the bound.
  bool next(std::string& line);
  int64_t number() const { return number_; }  // the last line read's, counted from 1
  std::string where() const { return path_ + ":" + std::to_string(number_); }  // "PATH:N", for errors

 private:
  std::string path_;
  size_t max_line_bytes_;
  std::ifstream in_;
  int64_t number_ = 0;
};

}  // namespace tpcli::files
