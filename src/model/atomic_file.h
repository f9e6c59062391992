// tpcli::model — files written whole or not at all.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace tpcli::model {

// Writes `path` through `path + ".tmp"` renamed into place, so a reader, a crash or a kill at any
// moment sees either the previous file or the complete new one. `write` fills the stream; a
// failed stream (disk full) or an exception leaves the previous file and no temporary behind.
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace tpcli::model
