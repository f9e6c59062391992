// tpcli::files — refusing what is not a regular file before opening it.
//
// Opening a FIFO for reading blocks until a writer appears (forever, for a typo'd path); reading
// a directory fails deep inside the stream with no file name; a device never ends. Every loader
// asks first, by name (stat), so none of them opens such a path.
#pragma once

#include <string>

namespace tpcli::files {

// Throws std::runtime_error "PATH: cannot open WHAT: No such file or directory", "PATH: is a
// directory, not WHAT", "PATH: is a FIFO (named pipe), not WHAT", ... when `path` is not a
// readable regular file (symbolic links are followed). `what` names the file's role
// ("a checkpoint", "a llama2.c tokenizer", "the corpus (data.path)").
void require_regular_file(const std::string& path, const std::string& what);

// The whole of the regular file `path` (require_regular_file first); the same one-line errors.
std::string read_text_file(const std::string& path, const std::string& what);

}  // namespace tpcli::files
