// GBNF parsing and the matcher's masks against the byte-by-byte stack moves.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "grammar/compiled_grammar.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_error.h"
#include "grammar/matcher.h"
#include "grammar_checks.h"

using namespace tpcli::grammar;
using namespace tpcli::grammar::testing;

namespace {

std::string error_of(const std::string& gbnf) {
  try {
    compile_gbnf(gbnf, make_vocabulary(synthetic_vocabulary()));
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

bool matches(const std::string& gbnf, const std::string& text) {
  Matcher m(compile_gbnf(gbnf, make_vocabulary(synthetic_vocabulary())));
  return m.accept_bytes(text) && m.can_end();
}

}  // namespace

TEST_CASE("gbnf: literals, classes, groups and repetitions match what they say") {
  CHECK(matches(R"(root ::= "ab" [0-9]+)", "ab123"));
  CHECK_FALSE(matches(R"(root ::= "ab" [0-9]+)", "ab"));
  CHECK(matches(R"(root ::= ("x" | "yz"){2,3})", "xyzx"));
  CHECK_FALSE(matches(R"(root ::= ("x" | "yz"){2,3})", "x"));
  CHECK_FALSE(matches(R"(root ::= ("x" | "yz"){2,3})", "xxxx"));
  CHECK(matches(R"(root ::= "a"{3})", "aaa"));
  CHECK_FALSE(matches(R"(root ::= "a"{3})", "aa"));
  CHECK(matches(R"(root ::= "a"{2,})", "aaaaa"));
  CHECK(matches("root ::= [^\"\\\\]* # comment\n", "h\xc3\xa9llo"));
  CHECK_FALSE(matches("root ::= [^\"\\\\]*", "a\"b"));
  CHECK(matches(R"(root ::= "\x41\u00e9\n\t\"\\")", "A\xc3\xa9\n\t\"\\"));
  CHECK(matches(R"(root ::= [\u00e0-\u00ff] .)", "\xc3\xa9\xf0\x9f\x98\x80"));
  CHECK_FALSE(matches(R"(root ::= .)", "\xc3"));  // half a character is no character
  CHECK(matches("root ::= item (\",\" item)*\nitem ::= [a-z]+ |\n  \"(\" root \")\"", "ab,(c,(d)),e"));
  CHECK(matches("root ::= x?\nx ::= \"q\"", ""));
}

TEST_CASE("gbnf: errors are one line naming line and column") {
  CHECK(error_of("root ::= foo") == "grammar line 1, column 10: undefined rule 'foo'");
  CHECK(error_of("a ::= \"x\"") == "grammar line 1, column 1: the grammar has no 'root' rule (the start rule)");
  CHECK(error_of("root ::= \"a\\q\"") == "grammar line 1, column 12: bad escape '\\q'");
  CHECK(error_of("root ::= \"a\"\nroot ::= \"b\"") == "grammar line 2, column 1: rule 'root' is defined twice");
  CHECK(error_of("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"") ==
        "grammar line 2, column 1: rule 'expr' is left-recursive (it can call itself before reading a character)");
  CHECK(error_of("root ::= \"a\"{3,2}").find("line 1, column 13: repetition {m,n} with n < m") != std::string::npos);
  CHECK(error_of("root ::= [z-a]").find("backwards") != std::string::npos);
  CHECK(error_of("root ::= (\"a\"").find("expected ')'") != std::string::npos);
  CHECK(error_of("root ::= \"abc").find("unterminated literal") != std::string::npos);
  CHECK(error_of("root ::= x\nx ::= \"a\" x") == "grammar line 1, column 1: rule 'root' derives no finite string");
  CHECK(error_of("root ::= \"a\"{99999}").find("repetition count above") != std::string::npos);
  for (const std::string& e : {error_of("root ::= foo"), error_of("root ::= ((")}) CHECK(e.find('\n') == std::string::npos);
}
