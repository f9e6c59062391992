// tpcli::files — reading the JSON files of a model or tokenizer directory (config.json,
// generation_config.json, model.safetensors.index.json, tokenizer.json, tokenizer_config.json)
// and safetensors headers, with one-line errors naming the file.
//
// Nesting is bounded before nlohmann::json sees the text: its parser is iterative, but copying a
// value, dump() and our own pipeline builders recurse once per level, so a hostile file nested
// 100,000 deep would overflow the stack. Real files nest under 10 levels.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tpcli::files {

constexpr int MAX_JSON_DEPTH = 256;

// Parses `text`, the contents of `path` (named in errors): "PATH: not valid JSON at byte N: ...",
// or "PATH: KEY: JSON nested deeper than 256 levels at byte N" (KEY: the top-level key it is under).
nlohmann::json parse_json_text(std::string_view text, const std::string& path);

// `text` as a JSON string literal, escaped and cut to 100 bytes: a value from a hostile file
// (a newline in a type name, a megabyte-long key) keeps an error message on one short line.
std::string quoted_value(std::string_view text);

// Reads and parses `path`, refusing first what is not a regular file ("PATH: is a directory, not
// WHAT"; `what` names the file's role, as for require_regular_file).
nlohmann::json read_json_file(const std::string& path, const std::string& what);

}  // namespace tpcli::files
