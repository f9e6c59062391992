// tpcli::model — files written whole or not at all.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace tpcli::model {

// Writes `path` through `path + ".tmp"` renamed into place, so a reader, a crash or a kill at any
// moment sees either the previous file or the complete new one. Durable: the temporary is
// fsynced before the rename and the directory after it. `write` fills the stream; a failed stream
// (disk full) or an exception leaves the previous file and no temporary behind. Errors name the
// file and keep the system's reason (errno is read before any cleanup).
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

// The temporary write_atomically uses for `path`.
std::string temporary_path(const std::string& path);

// Removes the temporary a killed write_atomically(path) left behind (kill -9 or power cut
// mid-write; nothing else ever leaves one). True when there was one.
bool remove_stale_temporary(const std::string& path);

}  // namespace tpcli::model
