// tpcli::files — files written whole or not at all.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace tpcli::files {

// Writes `path` through `path + ".tmp"` renamed into place, so a reader, a crash or a kill at any
// moment sees either the previous file or the complete new one. Durable: the temporary is
// fsynced before the rename and the directory after it. `write` fills the stream; a failed stream
// (disk full) or an exception leaves the previous file and no temporary behind. Errors name the
// file and keep the system's reason (errno is read before any cleanup).
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

// Fills the folder `dir` whole or not at all: `write` fills a fresh sibling folder DIR.tmp-XXXXXX
// (its argument), which is then renamed to `dir`, so a full disk, an error or a kill never leaves
// a partial `dir` (a kill -9 can leave the temporary, under a name no later call reuses). `dir`
// must not exist or be an empty folder (the rename replaces it); anything else is refused before
// `write` runs. On any failure the temporary folder is removed and the error rethrown. Missing
// parent folders are created. Durable as write_atomically, if `write` syncs its files.
void write_directory_atomically(const std::string& dir, const std::function<void(const std::string&)>& write);

// The same for a folder that a run rewrites (a checkpoint's PEFT adapter/): when `dir` exists, the
// fresh folder and it trade places in one step (renameat2's RENAME_EXCHANGE), so a reader always
// finds a whole `dir`, old or new; then the old one is removed. On a file system without the
// exchange, the old folder is renamed aside first (a moment with no `dir`).
void replace_directory_atomically(const std::string& dir, const std::function<void(const std::string&)>& write);

// Removes the folders DIR.tmp-XXXXXX beside `dir` that killed calls of the two functions above left
// (a kill -9 mid-write, or between the exchange and the removal of the old folder); returns how
// many. Only for a `dir` no other process writes at the same time: their temporaries look alike.
int remove_stale_folder_temporaries(const std::string& dir);

// Throws std::runtime_error "DIR: already exists and is not empty: choose a new folder" (or "... is
// not a folder") unless write_directory_atomically(dir) may write there.
void require_new_folder(const std::string& dir);

// The temporary write_atomically uses for `path`.
std::string temporary_path(const std::string& path);

// Removes the temporary a killed write_atomically(path) left behind (kill -9 or power cut
// mid-write; nothing else ever leaves one). True when there was one.
bool remove_stale_temporary(const std::string& path);

}  // namespace tpcli::files
