#include "config/run_config.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <filesystem>
#include <functional>
#include <glob.h>
#include <sstream>
#include <toml++/toml.h>
#include <tuple>

namespace fs = std::filesystem;

namespace tpcli::config {

namespace {

constexpr std::string_view SET_PREFIX = "--set ";

// ---------------------------------------------------------------- locations and messages

// "FILE:LINE:COL" of a node; overrides carry "--set KEY=VALUE" as their source path.
std::string location(const toml::source_region& source, const std::string& fallback_file) {
  const std::string file = source.path ? *source.path : fallback_file;
  if (file.rfind(SET_PREFIX, 0) == 0 || source.begin.line == 0) return file;
  return file + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
}

// Keys inserted by --set carry no source of their own: use their value's.
std::string key_location(const toml::key& key, const toml::node& node, const std::string& file) {
  return location(key.source().path ? key.source() : node.source(), file);
}

// Errors are one line: TOML++ quotes the offending text, which may hold a newline (found by
// fuzz_run_config: `x = tru` then a line break), so control characters are written escaped.
std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20) out += '?';
    else out += c;
  }
  return out;
}

[[noreturn]] void fail(const std::string& where, const std::string& message) {
  throw ConfigError(one_line(where + ": " + message));
}

std::string format_number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::string show(const toml::node& node) {
  if (node.is_string()) {
    const std::string& text = node.as_string()->get();
    return "\"" + (text.size() > 40 ? text.substr(0, 37) + "..." : text) + "\"";
  }
  std::ostringstream out;
  node.visit([&](auto&& concrete) { out << concrete; });
  std::string text = out.str();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string unknown_key_message(const std::string& full_key, std::string_view key,
                                const std::vector<std::string_view>& known) {
  std::string message = "unknown key '" + full_key + "'";
  for (auto candidate : known) {
    const bool prefix = key.size() >= 3 && (candidate.starts_with(key) || key.starts_with(candidate));
    if (edit_distance(key, candidate) <= 2 || prefix) return message + " (did you mean '" + std::string(candidate) + "'?)";
  }
  message += "; known: ";
  for (size_t i = 0; i < known.size(); ++i) {
    if (i) message += ", ";
    message += known[i];
  }
  return message;
}

// ---------------------------------------------------------------- typed reads of one table

// Reads the keys of one TOML table, recording where each came from and rejecting unknown keys.
class Reader {
 public:
  // `prefix` is "train." for the [train] section, "" for a models/*.toml file's top level.
  Reader(const toml::table& table, std::string prefix, std::string file, SourceMap& source)
      : table_(table), prefix_(std::move(prefix)), file_(std::move(file)), source_(source) {}

  void reject_unknown(const std::vector<std::string_view>& known) const {
    for (auto&& [key, node] : table_) {
      if (std::find(known.begin(), known.end(), key.str()) == known.end())
        fail(key_location(key, node, file_), unknown_key_message(prefix_ + std::string(key.str()), key.str(), known));
    }
  }

  const toml::node* find(std::string_view key) const {
    const toml::node* node = table_.get(key);
    if (node) source_.set(prefix_ + std::string(key), where(*node));
    return node;
  }
  std::string where(const toml::node& node) const { return location(node.source(), file_); }
  std::string full(std::string_view key) const { return prefix_ + std::string(key); }

  [[noreturn]] void wrong_type(std::string_view key, const toml::node& node, const char* wanted) const {
    fail(where(node), full(key) + " must be " + wanted + ", got " + type_name(node) + " " + show(node));
  }

  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max = INT_MAX) const {
    const toml::node* node = find(key);
    if (!node) return std::nullopt;
    if (!node->is_integer()) wrong_type(key, *node, "an integer");
    const int64_t value = node->as_integer()->get();
    if (value < min) fail(where(*node), full(key) + " = " + std::to_string(value) + " must be >= " + std::to_string(min));
    if (value > max) fail(where(*node), full(key) + " = " + std::to_string(value) + " must be <= " + std::to_string(max));
    return value;
  }
  std::optional<int> int32(std::string_view key, int min) const {
    auto value = integer(key, min);
    return value ? std::optional<int>(static_cast<int>(*value)) : std::nullopt;
  }

  // `check` returns "" when the value is fine, else what it must be ("must be > 0").
  std::optional<double> number(std::string_view key, const std::function<std::string(double)>& check) const {
    const toml::node* node = find(key);
    if (!node) return std::nullopt;
    double value = 0;
    if (node->is_integer())
      value = static_cast<double>(node->as_integer()->get());
    else if (node->is_floating_point())
      value = node->as_floating_point()->get();
    else
      wrong_type(key, *node, "a number");
    if (!std::isfinite(value)) fail(where(*node), full(key) + " = " + show(*node) + " must be finite");
    if (std::string problem = check(value); !problem.empty())
      fail(where(*node), full(key) + " = " + show(*node) + " " + problem);
    return value;
  }

  // An array of integers, each >= min, strictly ascending (a set of indices written in order).
  std::optional<std::vector<int>> ascending_integers(std::string_view key, int64_t min) const {
    const toml::node* node = find(key);
    if (!node) return std::nullopt;
    if (!node->is_array()) wrong_type(key, *node, "an array of integers, e.g. [0, 2]");
    std::vector<int> values;
    for (const toml::node& item : *node->as_array()) {
      if (!item.is_integer())
        fail(where(item), full(key) + " must hold integers, got " + type_name(item) + " " + show(item));
      const int64_t value = item.as_integer()->get();
      if (value < min || value > INT_MAX)
        fail(where(item), full(key) + ": " + std::to_string(value) + " must be in [" + std::to_string(min) + ", " +
                              std::to_string(INT_MAX) + "]");
      if (!values.empty() && value <= values.back())
        fail(where(item), full(key) + ": " + std::to_string(value) + " must be above the " + std::to_string(values.back()) +
                              " before it (ascending, no repeats)");
      values.push_back(static_cast<int>(value));
    }
    return values;
  }

  std::optional<bool> boolean(std::string_view key) const {
    const toml::node* node = find(key);
    if (!node) return std::nullopt;
    if (!node->is_boolean()) wrong_type(key, *node, "a boolean (true or false)");
    return node->as_boolean()->get();
  }

  std::optional<std::string> string(std::string_view key) const {
    const toml::node* node = find(key);
    if (!node) return std::nullopt;
    if (!node->is_string()) wrong_type(key, *node, "a string");
    std::string value = node->as_string()->get();
    if (value.empty()) fail(where(*node), full(key) + " must not be empty");
    return value;
  }

  // One of `choices`; returns its index.
  std::optional<size_t> choice(std::string_view key, const std::vector<std::string_view>& choices) const {
    auto value = string(key);
    if (!value) return std::nullopt;
    for (size_t i = 0; i < choices.size(); ++i)
      if (*value == choices[i]) return i;
    std::string message = full(key) + " = \"" + *value + "\" must be one of";
    for (size_t i = 0; i < choices.size(); ++i) message += (i ? ", \"" : " \"") + std::string(choices[i]) + "\"";
    fail(where(*table_.get(key)), message);
  }

  // A path that must exist: relative paths are tried against `base_dir` first, then the
  // current directory.
  std::optional<std::string> existing_path(std::string_view key, const fs::path& base_dir) const {
    auto value = string(key);
    if (!value) return std::nullopt;
    const fs::path written(*value);
    if (written.is_absolute()) {
      if (exists(written)) return *value;
    } else {
      const fs::path beside = (base_dir / written).lexically_normal();
      if (exists(beside)) return beside.string();
      if (exists(written)) return written.lexically_normal().string();
    }
    std::string looked = written.is_absolute() ? "" : " (looked in " + (base_dir.empty() ? std::string(".") : base_dir.string()) +
                                                          "/ and in the current directory)";
    fail(where(*table_.get(key)), full(key) + " = \"" + *value + "\": no such file" + looked);
  }

  // A glob pattern (token shards) that matches at least one file, looked up like existing_path:
  // beside the config file first, then in the current directory.
  std::optional<std::string> matching_pattern(std::string_view key, const fs::path& base_dir) const {
    auto value = string(key);
    if (!value) return std::nullopt;
    auto matches = [](const std::string& pattern) {
      glob_t found{};
      const bool any = ::glob(pattern.c_str(), 0, nullptr, &found) == 0 && found.gl_pathc > 0;
      ::globfree(&found);
      return any;
    };
    const fs::path written(*value);
    if (!written.is_absolute() && matches((base_dir / written).lexically_normal().string()))
      return (base_dir / written).lexically_normal().string();
    if (matches(*value)) return *value;
    std::string looked = written.is_absolute() ? "" : " (looked in " + (base_dir.empty() ? std::string(".") : base_dir.string()) +
                                                          "/ and in the current directory)";
    fail(where(*table_.get(key)), full(key) + " = \"" + *value + "\" matches no file" + looked +
                                      ": write token shards with tpcli tokenize --out DIR FILES...");
  }

 private:
  // A name too long for the system, or a component that is no folder, exists no more than a
  // missing file does: "no such file" naming the key, never std::filesystem's exception.
  static bool exists(const fs::path& p) {
    std::error_code ignored;
    return fs::exists(p, ignored);
  }

  const toml::table& table_;
  std::string prefix_;
  std::string file_;
  SourceMap& source_;
};

// ---------------------------------------------------------------- sections

const std::vector<std::string_view> MODEL_DIM_KEYS = {
    "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len", "n_experts", "top_k",
    "moe_aux_loss", "expert_hidden_dim", "capacity_factor", "shared_classifier", "norm_eps", "rope_theta",
    "head_dim", "qkv_bias", "qk_norm", "norm_topk_prob", "dense_layers", "hf_architecture"};

// Reads the model dims present in `reader`'s table into `model` (only keys that are present).
void read_model_dims(const Reader& r, ModelSection& model) {
  auto set_int = [&](std::optional<int>& field, std::string_view key, int min) {
    if (auto value = r.int32(key, min)) field = value;
  };
  set_int(model.dim, "dim", 1);
  set_int(model.hidden_dim, "hidden_dim", 1);
  set_int(model.n_layers, "n_layers", 1);
  set_int(model.n_heads, "n_heads", 1);
  set_int(model.n_kv_heads, "n_kv_heads", 1);
  set_int(model.vocab_size, "vocab_size", 1);
  set_int(model.seq_len, "seq_len", 1);
  set_int(model.n_experts, "n_experts", 0);
  set_int(model.top_k, "top_k", 1);
  set_int(model.expert_hidden_dim, "expert_hidden_dim", 1);
  set_int(model.head_dim, "head_dim", 1);
  auto set_number = [&](std::optional<double>& field, std::string_view key, std::function<std::string(double)> check) {
    if (auto value = r.number(key, check)) field = value;
  };
  set_number(model.moe_aux_loss, "moe_aux_loss", [](double v) { return v < 0 ? std::string("must be >= 0") : ""; });
  set_number(model.capacity_factor, "capacity_factor", [](double v) { return v <= 0 ? std::string("must be > 0") : ""; });
  set_number(model.norm_eps, "norm_eps", [](double v) { return v <= 0 ? std::string("must be > 0") : ""; });
  set_number(model.rope_theta, "rope_theta", [](double v) { return v <= 0 ? std::string("must be > 0") : ""; });
  auto set_bool = [&](std::optional<bool>& field, std::string_view key) {
    if (auto value = r.boolean(key)) field = value;
  };
  set_bool(model.shared_classifier, "shared_classifier");
  set_bool(model.qkv_bias, "qkv_bias");
  set_bool(model.qk_norm, "qk_norm");
  set_bool(model.norm_topk_prob, "norm_topk_prob");
  if (auto value = r.ascending_integers("dense_layers", 0)) model.dense_layers = value;
  if (auto value = r.string("hf_architecture")) model.hf_architecture = value;
}

// Inline "model.KEY" entries of the run config win over the model file's "KEY"; afterwards both
// maps know every dim's location.
void merge_model_sources(SourceMap& run, SourceMap& model) {
  for (auto key : MODEL_DIM_KEYS) {
    const std::string run_key = "model." + std::string(key);
    if (run.has(run_key))
      model.set(std::string(key), run.where(run_key));
    else if (model.has(key))
      run.set(run_key, model.where(key));
  }
}

const toml::table& section_table(const toml::table& root, std::string_view name, const std::string& file) {
  static const toml::table empty;
  const toml::node* node = root.get(name);
  if (!node) return empty;
  if (!node->is_table())
    fail(location(node->source(), file), std::string(name) + " must be a table ([" + std::string(name) + "]), got " +
                                             type_name(*node) + " " + show(*node));
  return *node->as_table();
}

bool valid_axis_name(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

// The axis names of [mesh] axes in the order the file writes them.
std::vector<std::string> axis_order_in_file(const toml::table& root) {
  const toml::node* axes = root.at_path("mesh.axes").node();
  if (!axes || !axes->is_table()) return {};
  std::vector<std::tuple<uint32_t, uint32_t, std::string>> positions;
  for (auto&& [key, node] : *axes->as_table())
    positions.emplace_back(node.source().begin.line, node.source().begin.column, std::string(key.str()));
  std::sort(positions.begin(), positions.end());
  std::vector<std::string> names;
  for (auto& [line, column, name] : positions) names.push_back(name);
  return names;
}

// [mesh.links]: one table per axis, { gb_per_s = N, latency_us = N, topology = "ring" | "switch" }.
void read_links(const Reader& mesh_reader, const toml::node& node, const std::string& file, SourceMap& source,
                MeshSection& mesh) {
  if (!node.is_table()) mesh_reader.wrong_type("links", node, "a table of axis links, e.g. model = { gb_per_s = 100, latency_us = 1 }");
  for (auto&& [key, link_node] : *node.as_table()) {
    const std::string axis(key.str());
    if (!valid_axis_name(axis)) fail(key_location(key, link_node, file), "mesh.links: '" + axis + "' is not an axis name");
    const std::string prefix = "mesh.links." + axis + ".";
    if (!link_node.is_table())
      fail(key_location(key, link_node, file), "mesh.links." + axis + " must be a table like { gb_per_s = 100, latency_us = 1 }, got " +
                                                   type_name(link_node));
    Reader r(*link_node.as_table(), prefix, file, source);
    r.reject_unknown({"gb_per_s", "latency_us", "topology"});
    source.set("mesh.links." + axis, key_location(key, link_node, file));
    dist::AxisLink link;
    const auto bw = r.number("gb_per_s", [](double v) -> std::string {
      if (v <= 0) return "must be > 0";
      if (v < dist::MIN_GB_PER_S)
        return "is below " + format_number(dist::MIN_GB_PER_S) + " GB/s (1 MB/s, a slow WAN)";
      if (v > dist::MAX_GB_PER_S)
        return "is beyond " + format_number(dist::MAX_GB_PER_S) + " GB/s (10 TB/s, faster than any interconnect)";
      return "";
    });
    if (!bw) fail(key_location(key, link_node, file), "mesh.links." + axis + " needs gb_per_s (GB/s per direction per link)");
    link.gb_per_s = *bw;
    const auto latency_check = [](double v) -> std::string {
      if (v < 0) return "must be >= 0";
      if (v > dist::MAX_LATENCY_US)
        return "is beyond " + format_number(dist::MAX_LATENCY_US) + " us (1 s, more than a satellite hop)";
      return "";
    };
    if (auto lat = r.number("latency_us", latency_check)) link.latency_us = *lat;
    if (auto topo = r.choice("topology", {"ring", "switch"})) link.topology = *topo == 0 ? dist::Topology::Ring : dist::Topology::Switch;
    mesh.links[axis] = link;
  }
}

// [mesh]. `file_axis_order` is axis_order_in_file() of the file before --set; `override_sources`
// the "--set ..." origins in flag order.
void read_mesh(const toml::table& table, const std::string& file, const std::vector<std::string>& file_axis_order,
               const std::vector<std::string>& override_sources, SourceMap& source, MeshSection& mesh) {
  Reader r(table, "mesh.", file, source);
  r.reject_unknown({"axes", "data_axis", "tensor_axis", "expert_axis", "backend", "links", "sequence_parallel"});
  if (const toml::node* axes_node = r.find("axes")) {
    if (!axes_node->is_table()) r.wrong_type("axes", *axes_node, "a table of axis sizes, e.g. { data = 2, model = 4 }");
    const toml::table& axes = *axes_node->as_table();
    if (axes.empty()) fail(r.where(*axes_node), "mesh.axes must name at least one axis");
    Reader axis_reader(axes, "mesh.axes.", file, source);
    // toml++ keeps tables sorted by key: the file's order comes from source positions (taken
    // before --set moved any node), axes added by --set follow in the order of the flags.
    using Order = std::tuple<size_t, size_t, uint32_t, uint32_t>;  // (file index, nth --set, line, column)
    std::vector<std::pair<Order, dist::MeshAxis>> ordered;
    for (auto&& [key, node] : axes) {
      const std::string name(key.str());
      if (!valid_axis_name(name))
        fail(key_location(key, node, file), "mesh axis name '" + name + "' must be letters, digits, '_' or '-'");
      const int size = static_cast<int>(*axis_reader.integer(name, 1, 1 << 16));
      const size_t in_file = static_cast<size_t>(std::find(file_axis_order.begin(), file_axis_order.end(), name) -
                                                 file_axis_order.begin());
      size_t nth_set = 0;
      if (node.source().path && *node.source().path != file)
        nth_set = static_cast<size_t>(std::find(override_sources.begin(), override_sources.end(), *node.source().path) -
                                      override_sources.begin());
      ordered.push_back({Order{in_file, nth_set, node.source().begin.line, node.source().begin.column}, {name, size}});
    }
    std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [order, axis] : ordered) mesh.axes.push_back(axis);
  }
  auto axis_name = [&](std::string_view key) -> std::optional<std::string> {
    auto value = r.string(key);
    if (value && !valid_axis_name(*value))
      fail(r.where(*table.get(key)), "mesh." + std::string(key) + " = \"" + *value + "\" is not an axis name");
    return value;
  };
  if (auto value = axis_name("data_axis")) mesh.data_axis = *value;
  if (auto value = axis_name("tensor_axis")) mesh.tensor_axis = *value;
  if (auto value = axis_name("expert_axis")) mesh.expert_axis = *value;
  if (auto value = r.choice("backend", {"threads", "zmq", "mpi"}))
    mesh.backend = std::array{BackendKind::Threads, BackendKind::Zmq, BackendKind::Mpi}[*value];
  if (const toml::node* links = r.find("links")) read_links(r, *links, file, source, mesh);
  if (auto value = r.boolean("sequence_parallel")) mesh.sequence_parallel = *value;
}

// init_from's checkpoint brings its own dims: one given beside it would be silently ignored.
void reject_dims_beside_init_from(const Reader& r, const std::string& init_from) {
  std::vector<std::string_view> keys = {"config"};
  keys.insert(keys.end(), MODEL_DIM_KEYS.begin(), MODEL_DIM_KEYS.end());
  for (auto key : keys)
    if (const toml::node* node = r.find(key))
      fail(r.where(*node), r.full(key) + " cannot be set with model.init_from (the dims come from " + init_from + ")");
}

// The models/NAME.toml file that model.config names; its errors also name the key that led there.
ModelSection model_file_named_by(const Reader& r, const std::string& path) {
  try {
    return load_model_config(path);
  } catch (const ConfigError& e) {
    fail(r.where(*r.find("config")), r.full("config") + ": " + e.what());
  }
}

void read_model(const toml::table& table, const std::string& file, const fs::path& base_dir, SourceMap& source,
                ModelSection& model) {
  Reader r(table, "model.", file, source);
  std::vector<std::string_view> known = {"config", "init_from"};
  known.insert(known.end(), MODEL_DIM_KEYS.begin(), MODEL_DIM_KEYS.end());
  r.reject_unknown(known);
  if (auto path = r.existing_path("config", base_dir)) {
    model = model_file_named_by(r, *path);  // the file's dims first ...
    model.config = *path;
  } else {
    model.source = SourceMap(file);
  }
  read_model_dims(r, model);  // ... then inline keys override them
  merge_model_sources(source, model.source);
  model.init_from = r.existing_path("init_from", base_dir);
  if (model.init_from) reject_dims_beside_init_from(r, *model.init_from);
}

void read_data(const toml::table& table, const std::string& file, const fs::path& base_dir, SourceMap& source,
               DataSection& data) {
  Reader r(table, "data.", file, source);
  r.reject_unknown({"path", "tokenizer", "shuffle", "format", "val_path", "template", "train_on_prompt", "truncate"});
  if (auto format = r.choice("format", {"text", "shards", "chat", "completions", "jsonl-text"})) {
    constexpr DataFormat formats[] = {DataFormat::Text, DataFormat::Shards, DataFormat::Chat, DataFormat::Completions,
                                      DataFormat::JsonlText};
    data.format = formats[*format];
  }
  const bool sft = is_sft_format(data.format);
  for (const char* key : {"train_on_prompt", "truncate"})
    if (const toml::node* node = r.find(key); node && !sft)
      fail(r.where(*node), std::string("data.") + key + " is for the fine-tuning formats (format = \"chat\", \"completions\" or \"jsonl-text\")");
  if (const toml::node* node = r.find("template"); node && data.format != DataFormat::Chat)
    fail(r.where(*node), "data.template is for format = \"chat\"");
  if (data.format == DataFormat::Shards) {
    data.path = r.matching_pattern("path", base_dir);
    data.val_path = r.matching_pattern("val_path", base_dir);
  } else if (sft) {
    data.path = r.existing_path("path", base_dir);
    data.val_path = r.existing_path("val_path", base_dir);
    data.chat_template = r.string("template");
    if (auto v = r.boolean("train_on_prompt")) data.train_on_prompt = *v;
    if (auto v = r.boolean("truncate")) data.truncate = *v;
  } else {
    data.path = r.existing_path("path", base_dir);
    if (const toml::node* val = r.find("val_path"))
      fail(r.where(*val), "data.val_path is for format = \"shards\" (a text corpus is split 90/10 into train and validation)");
  }
  if (auto tokenizer = r.string("tokenizer")) {
    data.tokenizer_given = true;
    if (*tokenizer == "chars") {
      data.tokenizer = TokenizerKind::Chars;
    } else if (*tokenizer == "bytes") {
      data.tokenizer = TokenizerKind::Bytes;
    } else {
      data.tokenizer = TokenizerKind::File;
      data.tokenizer_path = *r.existing_path("tokenizer", base_dir);
    }
  }
  if (auto shuffle = r.boolean("shuffle")) data.shuffle = *shuffle;
}

// [train.lora]
LoraSection read_lora(const toml::table& table, const std::string& file, const fs::path& base_dir, SourceMap& source) {
  Reader r(table, "train.lora.", file, source);
  r.reject_unknown({"rank", "alpha", "dropout", "targets", "layers", "init_from"});
  LoraSection lora;
  for (const char* key : {"rank", "alpha", "targets", "layers"})
    if (r.find(key)) lora.written.insert(key);
  lora.init_from = r.existing_path("init_from", base_dir);
  if (auto rank = r.integer("rank", 1, 65536)) lora.rank = static_cast<int>(*rank);
  if (auto alpha = r.number("alpha", [](double v) { return v <= 0 ? std::string("must be > 0") : ""; })) lora.alpha = *alpha;
  if (auto dropout = r.number("dropout", [](double v) { return v < 0 || v >= 1 ? std::string("must be in [0, 1)") : ""; }))
    lora.dropout = *dropout;
  if (const toml::node* node = r.find("targets")) {
    if (!node->is_array() || node->as_array()->empty())
      r.wrong_type("targets", *node, "a non-empty array of module names, e.g. [\"q_proj\", \"v_proj\"]");
    lora.targets.clear();
    for (const toml::node& item : *node->as_array()) {
      const auto* name = item.as_string();
      std::string known;
      for (const auto& m : LORA_MODULES) known += (known.empty() ? "" : ", ") + m;
      if (!name || std::ranges::find(LORA_MODULES, name->get()) == LORA_MODULES.end())
        fail(r.where(item), "train.lora.targets: " + show(item) + " is not a module LoRA adapts (" + known + ")");
      if (std::ranges::find(lora.targets, name->get()) != lora.targets.end())
        fail(r.where(item), "train.lora.targets: \"" + name->get() + "\" is listed twice");
      lora.targets.push_back(name->get());
    }
  }
  if (const toml::node* node = r.find("layers")) {
    if (node->is_integer()) {
      const int64_t n = node->as_integer()->get();
      if (n < 1 || n > INT_MAX)  // the model's block count bounds it further (config/train_setup)
        fail(r.where(*node), "train.lora.layers = " + std::to_string(n) + " must be \"all\" or a count >= 1");
      lora.layers = static_cast<int>(n);
    } else if (!node->is_string() || node->as_string()->get() != "all") {
      r.wrong_type("layers", *node, "\"all\" or a number of blocks (the last ones)");
    }
  }
  return lora;
}

void read_train(const toml::table& table, const std::string& file, const fs::path& base_dir, SourceMap& source,
                TrainSection& train) {
  Reader r(table, "train.", file, source);
  r.reject_unknown({"steps", "batch_size", "seq_len", "seed", "lr", "min_lr", "warmup_steps", "decay", "weight_decay",
                    "beta1", "beta2", "eps", "grad_clip", "eval_every", "eval_batches", "out_dir", "log_every",
                    "sample_tokens", "save_every", "grad_accum", "recompute", "shard_optimizer", "bucket_kb",
                    "overlap_buckets", "lora"});
  auto int_key = [&](int& field, std::string_view key, int min) {
    if (auto value = r.int32(key, min)) field = *value;
  };
  int_key(train.steps, "steps", 1);
  int_key(train.batch_size, "batch_size", 1);
  train.seq_len = r.int32("seq_len", 1);
  if (auto seed = r.integer("seed", 0, INT64_MAX)) train.seed = static_cast<uint64_t>(*seed);
  int_key(train.warmup_steps, "warmup_steps", 0);
  int_key(train.eval_every, "eval_every", 0);
  int_key(train.eval_batches, "eval_batches", 0);  // 0 = no validation (a corpus too short to split)
  int_key(train.log_every, "log_every", 1);
  int_key(train.sample_tokens, "sample_tokens", 0);
  train.save_every = r.int32("save_every", 1);
  int_key(train.grad_accum, "grad_accum", 1);
  int_key(train.bucket_kb, "bucket_kb", 1);
  if (auto value = r.boolean("recompute")) train.recompute = *value;
  if (auto value = r.boolean("shard_optimizer")) train.shard_optimizer = *value;
  if (auto value = r.boolean("overlap_buckets")) train.overlap_buckets = *value;
  auto non_negative = [](double v) { return v < 0 ? std::string("must be >= 0") : ""; };
  auto unit_interval = [](double v) { return v < 0 || v >= 1 ? std::string("must be in [0, 1)") : ""; };
  auto number_key = [&](double& field, std::string_view key, std::function<std::string(double)> check) {
    if (auto value = r.number(key, check)) field = *value;
  };
  number_key(train.lr, "lr", non_negative);
  number_key(train.min_lr, "min_lr", non_negative);
  number_key(train.weight_decay, "weight_decay", non_negative);
  number_key(train.beta1, "beta1", unit_interval);
  number_key(train.beta2, "beta2", unit_interval);
  number_key(train.eps, "eps", [](double v) { return v <= 0 ? std::string("must be > 0") : ""; });
  number_key(train.grad_clip, "grad_clip", non_negative);
  if (train.min_lr > train.lr)
    fail(source.where(source.has("train.min_lr") ? "train.min_lr" : "train.lr"),
         "train.min_lr = " + format_number(train.min_lr) + " must be <= train.lr = " + format_number(train.lr));
  if (auto decay = r.choice("decay", {"cosine", "constant"})) train.decay = *decay == 0 ? DecayKind::Cosine : DecayKind::Constant;
  if (auto out_dir = r.string("out_dir")) train.out_dir = *out_dir;
  if (const toml::node* node = r.find("lora")) {
    if (!node->is_table()) r.wrong_type("lora", *node, "a table ([train.lora] rank = 8 ...)");
    train.lora = read_lora(*node->as_table(), file, base_dir, source);
  }
}

// Checks that need the mesh and the other sections together; re-run when flags change the mesh.
void check_roles(const RunConfig& config) {
  const MeshSection& mesh = config.mesh;
  auto role_where = [&](const char* key) { return config.where(std::string("mesh.") + key); };
  if (mesh.data_axis == mesh.tensor_axis)
    fail(role_where(config.source.has("mesh.tensor_axis") ? "tensor_axis" : "data_axis"),
         "mesh.data_axis and mesh.tensor_axis must differ (both are \"" + mesh.data_axis + "\")");
  if (mesh.experts_axis() == mesh.tensor_axis)
    fail(role_where("expert_axis"), "mesh.expert_axis must differ from mesh.tensor_axis (both are \"" + mesh.tensor_axis + "\")");
  if (mesh.axes.empty()) return;
  const std::string axes = mesh.axes_string();
  // A role named explicitly must exist (a typo would otherwise silently mean "size 1").
  const std::pair<const char*, std::string> roles[] = {
      {"mesh.data_axis", mesh.data_axis}, {"mesh.tensor_axis", mesh.tensor_axis}, {"mesh.expert_axis", mesh.experts_axis()}};
  for (const auto& [key, role_axis] : roles) {
    if (!config.source.has(key)) continue;
    const std::string& name = role_axis;  // a lambda may not capture a structured binding in clang 14 (make fuzz)
    if (std::none_of(mesh.axes.begin(), mesh.axes.end(), [&](const auto& a) { return a.name == name; }))
      fail(config.where(key), std::string(key) + " = \"" + name + "\" names no axis of the mesh " + axes);
  }
  // Every axis longer than 1 needs a role, or its devices would all do the same work.
  for (const auto& axis : mesh.axes) {
    if (axis.size == 1 || axis.name == mesh.data_axis || axis.name == mesh.tensor_axis || axis.name == mesh.experts_axis())
      continue;
    fail(config.where("mesh.axes." + axis.name),
         "mesh axis '" + axis.name + "' (size " + std::to_string(axis.size) + ") has no role: name it in mesh.data_axis, " +
             "mesh.tensor_axis or mesh.expert_axis (now \"" + mesh.data_axis + "\", \"" + mesh.tensor_axis + "\", \"" +
             mesh.experts_axis() + "\")");
  }
  for (const auto& [axis, link] : mesh.links) {
    const std::string& name = axis;  // clang 14 cannot capture a structured binding (make fuzz)
    if (std::none_of(mesh.axes.begin(), mesh.axes.end(), [&](const auto& a) { return a.name == name; }))
      fail(config.where("mesh.links." + name), "mesh.links." + name + " names no axis of the mesh " + axes);
  }
  const int data_size = mesh.axis_size(mesh.data_axis);
  if (config.train.batch_size % data_size != 0)
    fail(config.where("train.batch_size"), "train.batch_size = " + std::to_string(config.train.batch_size) +
                                               " is not divisible by the data axis '" + mesh.data_axis +
                                               "' = " + std::to_string(data_size) + " (mesh " + axes + ")");
}

void check_cross_sections(const RunConfig& config) {
  if (config.train.seq_len && config.model.seq_len && *config.train.seq_len > *config.model.seq_len)
    fail(config.where("train.seq_len"), "train.seq_len = " + std::to_string(*config.train.seq_len) +
                                            " exceeds the model's seq_len = " + std::to_string(*config.model.seq_len) +
                                            " (" + config.model.source.where("seq_len") + ")");
}

// ---------------------------------------------------------------- --set overrides

// Moves every leaf of `from` into `into`, merging tables that both have.
void merge_tables(toml::table& into, toml::table& from, const std::string& origin) {
  for (auto&& [key, node] : from) {
    toml::node* existing = into.get(key.str());
    if (existing && existing->is_table() && node.is_table()) {
      merge_tables(*existing->as_table(), *node.as_table(), origin);
    } else if (existing && !existing->is_table() && node.is_table()) {
      fail(origin, "'" + std::string(key.str()) + "' is " + type_name(*existing) + " in the file, not a table");
    } else {
      into.insert_or_assign(key, std::move(node));
    }
  }
}

std::string toml_basic_string(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

// "train.steps=10": the value as TOML (10, 1e-3, true, "x", { data = 2 }) and, failing that, as a
// plain string. Parsed as the TOML line `train.steps = 10` whose nodes carry the override as
// their source, so errors about it name the flag.
void apply_override(toml::table& root, const std::string& text) {
  const std::string origin = std::string(SET_PREFIX) + text;
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) fail(origin, "expected SECTION.KEY=VALUE (e.g. train.steps=10)");
  const std::string key_path = text.substr(0, eq);
  const std::string value_text = text.substr(eq + 1);
  if (key_path.find('.') == std::string::npos)
    fail(origin, "expected SECTION.KEY=VALUE (e.g. train.steps=10), got key '" + key_path + "'");
  toml::table snippet;
  try {
    snippet = toml::parse(key_path + " = " + value_text, std::string_view(origin));
  } catch (const toml::parse_error&) {
    try {
      snippet = toml::parse(key_path + " = " + toml_basic_string(value_text), std::string_view(origin));
    } catch (const toml::parse_error& e) {
      fail(origin, "'" + key_path + "' is not a valid key path (" + std::string(e.description()) + ")");
    }
  }
  merge_tables(root, snippet, origin);
}

}  // namespace

// ---------------------------------------------------------------- public

std::string SourceMap::where(std::string_view key) const {
  auto it = where_.find(key);
  return it == where_.end() ? file_ : it->second;
}

dist::Mesh MeshSection::mesh() const {
  if (axes.empty()) return dist::Mesh::line(1, tensor_axis);
  return dist::Mesh(axes);
}

int MeshSection::device_count() const {
  int n = 1;
  for (const auto& axis : axes) n *= axis.size;
  return n;
}

int MeshSection::axis_size(std::string_view name) const {
  for (const auto& axis : axes)
    if (axis.name == name) return axis.size;
  return 1;
}

std::string MeshSection::axes_string() const {
  std::string text;
  for (const auto& axis : axes) text += (text.empty() ? "" : ",") + axis.name + "=" + std::to_string(axis.size);
  return text;
}

namespace {
toml::table parse_toml_file(const std::string& path) {
  std::error_code status_error;  // a name too long, a component that is no folder: as missing
  const fs::file_status status = fs::status(path, status_error);
  if (!fs::exists(status)) throw ConfigError(path + ": no such file");
  if (fs::is_directory(status)) throw ConfigError(path + ": is a directory, not a TOML file");
  if (!fs::is_regular_file(status)) throw ConfigError(path + ": is not a regular file, not a TOML file");
  try {
    return toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    fail(location(e.source(), path), "TOML syntax error: " + std::string(e.description()));
  }
}

}  // namespace

ModelSection load_model_config(const std::string& path) {
  toml::table root = parse_toml_file(path);
  ModelSection model;
  model.source = SourceMap(path);
  if (root.get("model") && root.get("model")->is_table())
    fail(location(root.get("model")->source(), path),
         "a model file holds its dims at top level (dim = 64 ...), not under [model]");
  Reader r(root, "", path, model.source);
  r.reject_unknown(MODEL_DIM_KEYS);
  read_model_dims(r, model);
  return model;
}

bool is_model_file(const std::string& path) {
  const toml::table root = parse_toml_file(path);
  bool has_dims = false;
  for (auto&& [key, node] : root) {
    if (node.is_table()) return false;
    has_dims = has_dims || std::find(MODEL_DIM_KEYS.begin(), MODEL_DIM_KEYS.end(), key.str()) != MODEL_DIM_KEYS.end();
  }
  return has_dims;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides,
                          const std::function<void(RunConfig&)>& apply_flags) {
  toml::table root = parse_toml_file(path);
  const std::vector<std::string> file_axis_order = axis_order_in_file(root);
  std::vector<std::string> override_sources;
  for (const auto& text : overrides) {
    apply_override(root, text);
    override_sources.push_back(std::string(SET_PREFIX) + text);
  }
  RunConfig config;
  config.path = path;
  config.source = SourceMap(path);
  for (auto&& [key, node] : root) {
    static const std::vector<std::string_view> sections = {"mesh", "model", "data", "train"};
    if (std::find(sections.begin(), sections.end(), key.str()) == sections.end())
      fail(key_location(key, node, path), unknown_key_message(std::string(key.str()), key.str(), sections));
  }
  const fs::path base_dir = fs::path(path).parent_path();
  read_mesh(section_table(root, "mesh", path), path, file_axis_order, override_sources, config.source, config.mesh);
  read_model(section_table(root, "model", path), path, base_dir, config.source, config.model);
  read_data(section_table(root, "data", path), path, base_dir, config.source, config.data);
  read_train(section_table(root, "train", path), path, base_dir, config.source, config.train);
  if (config.train.out_dir.empty()) config.train.out_dir = (fs::path("runs") / fs::path(path).stem()).string();
  if (apply_flags) apply_flags(config);  // before the checks, which must see the flags' axes, not the file's
  check_roles(config);
  check_cross_sections(config);
  return config;
}

std::vector<dist::MeshAxis> parse_mesh_axes(std::string_view text) {
  const std::string origin = "--mesh " + std::string(text);
  std::vector<dist::MeshAxis> axes;
  if (text.empty()) fail(origin, "expected NAME=SIZE[,NAME=SIZE...], e.g. data=2,model=4");
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      fail(origin, "'" + std::string(item) + "' is not NAME=SIZE (expected e.g. data=2,model=4)");
    const std::string name(item.substr(0, eq));
    const std::string_view size_text = item.substr(eq + 1);
    if (!valid_axis_name(name)) fail(origin, "axis name '" + name + "' must be letters, digits, '_' or '-'");
    int size = 0;
    auto [end, error] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), size);
    if (error != std::errc() || end != size_text.data() + size_text.size() || size_text.empty())
      fail(origin, "size of axis '" + name + "' must be an integer, got '" + std::string(size_text) + "'");
    if (size < 1) fail(origin, "axis " + name + " = " + std::to_string(size) + " must be >= 1");
    for (const auto& axis : axes)
      if (axis.name == name) fail(origin, "axis '" + name + "' appears twice");
    axes.push_back({name, size});
    start = comma + 1;
  }
  return axes;
}

void set_mesh_axes(RunConfig& config, std::vector<dist::MeshAxis> axes, const std::string& origin) {
  config.mesh.axes = std::move(axes);
  for (const auto& axis : config.mesh.axes) config.source.set("mesh.axes." + axis.name, origin);
  config.source.set("mesh.axes", origin);
  check_roles(config);
}

void set_link(RunConfig& config, const std::string& axis, const dist::AxisLink& link, const std::string& origin) {
  config.mesh.links[axis] = link;
  config.source.set("mesh.links." + axis, origin);
  check_roles(config);
}

void set_backend(RunConfig& config, const std::string& value, const std::string& origin) {
  if (value == "threads")
    config.mesh.backend = BackendKind::Threads;
  else if (value == "zmq")
    config.mesh.backend = BackendKind::Zmq;
  else if (value == "mpi")
    config.mesh.backend = BackendKind::Mpi;
  else
    fail(origin, "backend must be \"threads\", \"zmq\" or \"mpi\", got \"" + value + "\"");
  config.source.set("mesh.backend", origin);
}

std::string to_string(BackendKind kind) {
  return kind == BackendKind::Threads ? "threads" : kind == BackendKind::Zmq ? "zmq" : "mpi";
}
std::string to_string(TokenizerKind kind) {
  return kind == TokenizerKind::Chars ? "chars" : kind == TokenizerKind::Bytes ? "bytes" : "file";
}
std::string to_string(DecayKind kind) { return kind == DecayKind::Cosine ? "cosine" : "constant"; }
std::string to_string(DataFormat format) {
  switch (format) {
    case DataFormat::Text: return "text";
    case DataFormat::Shards: return "shards";
    case DataFormat::Chat: return "chat";
    case DataFormat::Completions: return "completions";
    case DataFormat::JsonlText: return "jsonl-text";
  }
  return "?";
}

}  // namespace tpcli::config
