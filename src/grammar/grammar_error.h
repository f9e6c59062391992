// tpcli::grammar — the one error every grammar entry point throws: a bad GBNF text, a JSON schema
// using something the converter does not support, or a grammar too large to compile. One line
// naming where: "grammar line 3, column 7: undefined rule 'valu'" for GBNF, or the schema path and
// keyword ("schema at properties.age: unsupported keyword 'format': 'ipv6'") for a JSON schema.
#pragma once

#include <stdexcept>
#include <string>

namespace tpcli::grammar {

class GrammarError : public std::invalid_argument {
 public:
  explicit GrammarError(const std::string& message, std::string path = "")
      : std::invalid_argument(one_line(message)), path_(std::move(path)) {}
  // The schema path ("properties.age", "(root)") of a JSON-schema error; "" for GBNF errors.
  std::string path() const { return path_; }

 private:
  // Names and values quoted from the input may hold line breaks: written \n, \r.
  static std::string one_line(const std::string& message) {
    std::string out;
    for (const char c : message) {
      if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else out += c;
    }
    return out;
  }

  std::string path_;
};

}  // namespace tpcli::grammar
