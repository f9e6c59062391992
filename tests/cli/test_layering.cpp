// The architecture's layering (README, "Architecture"): a file under src/X includes only the folders
// layer X may use, the same ones X's library links in CMakeLists.txt; and a backend folder of distributed/
// does not include another backend's (the MPI backend may use the thread backend for the devices
// inside one process).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Layer -> the folders of src/ its files may include. config/ fills the lower layers' own types (the
// mesh and its links, the model's config, the training options); cli/ is the top and may include everything.
const std::map<std::string, std::set<std::string>>& allowed_includes() {
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"tensor", {"tensor"}},
      {"distributed", {"tensor", "distributed"}},
      {"nn", {"tensor", "distributed", "nn"}},
      {"files", {"files"}},
      {"text", {"files", "text"}},
      {"grammar", {"grammar"}},
      {"model", {"tensor", "distributed", "nn", "files", "model"}},
      {"formats", {"tensor", "distributed", "nn", "files", "text", "model", "formats"}},  // text: a GGUF file's tokenizer
      {"engine", {"tensor", "distributed", "nn", "files", "text", "grammar", "model", "engine"}},
      {"train", {"tensor", "distributed", "nn", "files", "text", "grammar", "model", "formats", "engine", "train"}},
      {"perf", {"tensor", "distributed", "nn", "files", "text", "grammar", "model", "formats", "engine", "train", "perf"}},
      {"serve", {"tensor", "distributed", "nn", "files", "text", "grammar", "model", "engine", "serve"}},
      {"config", {"tensor", "distributed", "nn", "files", "text", "grammar", "model", "formats", "engine", "train", "config"}},
      {"cli", {"tensor", "distributed", "nn", "files", "text", "grammar", "model", "formats", "engine", "train", "perf", "serve",
               "config", "cli"}},
  };
  return allowed;
}

// Backend folders of distributed/ -> the other distributed/ sub-folders they may include.
const std::map<std::string, std::set<std::string>>& allowed_backend_includes() {
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"threads", {}}, {"zmq", {}}, {"mpi", {"threads"}}, {"launch", {}}};
  return allowed;
}

// The violations in one file; `relative` is its path under src/ ("train/loop.cpp").
std::vector<std::string> layering_violations(const std::string& relative, const std::string& text) {
  std::vector<std::string> found;
  const std::string layer = relative.substr(0, relative.find('/'));
  const auto rule = allowed_includes().find(layer);
  if (rule == allowed_includes().end()) return {"src/" + relative + ": folder '" + layer + "' is no layer of the table"};
  std::string backend;  // "zmq" for distributed/zmq/x.cpp, "" for distributed/x.cpp
  if (layer == "distributed" && std::count(relative.begin(), relative.end(), '/') >= 2) {
    const size_t start = layer.size() + 1;
    backend = relative.substr(start, relative.find('/', start) - start);
  }
  static const std::regex include(R"(^\s*#\s*include\s*"([a-z_]+)/([^"]*)\")");
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    std::smatch m;
    if (!std::regex_search(line, m, include)) continue;
    const std::string target = m[1].str(), where = "src/" + relative + ":" + std::to_string(number) + ": includes ";
    if (!allowed_includes().contains(target)) continue;  // "support/..." and the like are no layers
    if (!rule->second.contains(target)) {
      found.push_back(where + target + "/" + m[2].str() + ", a folder above layer " + layer);
      continue;
    }
    const std::string rest = m[2].str();
    if (backend.empty() || target != "distributed" || rest.find('/') == std::string::npos) continue;
    const std::string other = rest.substr(0, rest.find('/'));
    const auto backend_rule = allowed_backend_includes().find(backend);
    if (other != backend && (backend_rule == allowed_backend_includes().end() || !backend_rule->second.contains(other)))
      found.push_back(where + "distributed/" + rest + ", another backend's folder (from distributed/" + backend + "/)");
  }
  return found;
}

}  // namespace

TEST_CASE("layering: no file under src/ includes a folder above its own layer") {
  const fs::path src = fs::path(TPCLI_SOURCE_DIR) / "src";
  int files = 0;
  std::vector<std::string> violations;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".h") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    for (std::string& v : layering_violations(fs::relative(entry.path(), src).generic_string(), text.str()))
      violations.push_back(std::move(v));
    ++files;
  }
  CHECK(files > 100);  // the walk found the sources
  for (const std::string& v : violations) UNSCOPED_INFO(v);
  CHECK(violations.empty());
}

TEST_CASE("layering: the check names an include from above, and another backend's folder") {
  const auto up = layering_violations("train/train_setup.cpp", "#include <vector>\n#include \"model/llama.h\"\n"
                                                               "#include \"config/run_config.h\"\n");
  REQUIRE(up.size() == 1);
  CHECK(up[0] == "src/train/train_setup.cpp:3: includes config/run_config.h, a folder above layer train");
  CHECK(layering_violations("config/run_config.cpp", "#include \"serve/http_server.h\"\n").size() == 1);
  CHECK(layering_violations("cli/train.cpp", "#include \"config/run_config.h\"\n#include \"train/loop.h\"\n").empty());

  const auto sideways = layering_violations("distributed/zmq/zmq_backend.cpp", "  # include \"distributed/mpi/mpi_backend.h\"\n");
  REQUIRE(sideways.size() == 1);
  CHECK(sideways[0].find("another backend's folder") != std::string::npos);
  CHECK(layering_violations("distributed/mpi/mpi_backend.cpp", "#include \"distributed/threads/thread_backend.h\"\n").empty());
  CHECK(layering_violations("distributed/select_backend.cpp", "#include \"distributed/zmq/zmq_backend.h\"\n").empty());
  CHECK(layering_violations("util/x.cpp", "").size() == 1);  // a new folder must be placed in the table
}
