// Published chat templates rendered against Python jinja2 + transformers' environment, byte for
// byte (../shared/reference/chat-templates: 28 templates x 33 cases, made by its render.py).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/shared_data.h"
#include "text/jinja_template.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using tpcli::text::JinjaTemplate;
using tpcli::text::RenderOptions;
using tpcli::text::TemplateError;

namespace {

const char* const REFERENCE = "reference/chat-templates";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<ordered_json> read_jsonl(const fs::path& path) {
  std::vector<ordered_json> lines;
  std::ifstream in(path, std::ios::binary);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(ordered_json::parse(line));
  return lines;
}

// What apply_chat_template passes: the case's inputs, the tokenizer's special tokens that have a
// value, and the case's extra keyword arguments (which win over a token of the same name).
ordered_json chat_variables(const ordered_json& chat_case, const ordered_json& tokens) {
  ordered_json v = ordered_json::object();
  v["messages"] = chat_case["messages"];
  v["tools"] = chat_case.contains("tools") ? chat_case["tools"] : ordered_json(nullptr);
  v["documents"] = chat_case.contains("documents") ? chat_case["documents"] : ordered_json(nullptr);
  v["add_generation_prompt"] = chat_case.value("add_generation_prompt", false);
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                           "additional_special_tokens"}) {
    if (!tokens.contains(name)) continue;
    const ordered_json& t = tokens[name];
    const bool has_value = !t.is_null() && !(t.is_string() && t.get<std::string>().empty()) && !(t.is_array() && t.empty());
    if (has_value) v[name] = t;
  }
  if (chat_case.contains("extra"))
    for (const auto& [k, e] : chat_case["extra"].items()) v[k] = e;
  return v;
}

// The fixed clock of render.py: 2026-07-26 00:00:00, a Sunday.
RenderOptions fixed_clock() {
  RenderOptions options;
  std::tm t{};
  t.tm_year = 2026 - 1900, t.tm_mon = 6, t.tm_mday = 26, t.tm_wday = 0, t.tm_yday = 206, t.tm_isdst = -1;
  options.now = t;
  return options;
}

std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i > 60 ? i - 60 : 0;
  return "at byte " + std::to_string(i) + "\n  got:  " + ordered_json(got.substr(from, 160)).dump() +
         "\n  want: " + ordered_json(want.substr(from, 160)).dump();
}

}  // namespace

TEST_CASE("jinja reference: every published template x case renders as Python jinja2 does") {
  TPCLI_REQUIRE_SHARED(REFERENCE);
  const fs::path dir = tpcli::testing::shared_path(REFERENCE);
  const auto cases = read_jsonl(dir / "cases.jsonl");
  std::vector<fs::path> templates;
  for (const auto& entry : fs::directory_iterator(dir / "templates"))
    if (entry.path().extension() == ".jinja") templates.push_back(entry.path());
  std::sort(templates.begin(), templates.end());
  REQUIRE(templates.size() >= 28);
  const RenderOptions options = fixed_clock();
  int total = 0, matched = 0, errors_expected = 0, errors_raised = 0, reported = 0;
  for (const auto& path : templates) {
    const std::string name = path.stem().string();
    const ordered_json tokens = ordered_json::parse(read_file(dir / "templates" / (name + ".json")));
    const auto renders = read_jsonl(dir / "renders" / (name + ".jsonl"));
    REQUIRE(renders.size() == cases.size());
    std::optional<JinjaTemplate> chat;
    std::string compile_error;
    try {
      chat.emplace(read_file(path));
    } catch (const TemplateError& e) {
      compile_error = e.what();
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      ++total;
      const ordered_json& want = renders[i];
      REQUIRE(want["id"] == cases[i]["id"]);
      std::string got, error = compile_error;
      if (chat) {
        try {
          got = chat->render(chat_variables(cases[i], tokens), options);
        } catch (const TemplateError& e) {
          error = e.what();
        }
      }
      const std::string where = name + " / " + want["id"].get<std::string>();
      if (want.contains("error")) {
        ++errors_expected;
        if (!error.empty()) ++errors_raised, ++matched;
        else if (reported++ < 20) UNSCOPED_INFO(where + ": rendered, Python raised " + want["error"].dump());
        continue;
      }
      const std::string text = want["text"].get<std::string>();
      if (error.empty() && got == text) ++matched;
      else if (reported++ < 20) UNSCOPED_INFO(where + ": " + (error.empty() ? first_difference(got, text) : "raised: " + error));
    }
  }
  WARN("jinja reference: " << matched << " / " << total << " renders match (" << errors_raised << " / "
                           << errors_expected << " expected errors raised)");
  CHECK(errors_raised == errors_expected);
  CHECK(matched == total);
}
