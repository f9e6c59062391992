// The chat page compiled into tpcli_serve (cmake/embed_text.cmake) is the .html byte for byte, and
// is self-contained: GET / must work with no network and no file beside the binary.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "serve/chat_page.h"

namespace {

std::string read_source_file(const std::string& relative) {
  std::ifstream in(std::string(TPCLI_SOURCE_DIR) + "/" + relative, std::ios::binary);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("chat page: the embedded page is src/serve/chat_page.html byte for byte") {
  std::string_view page = tpcli::serve::chat_page();
  CHECK(page == read_source_file("src/serve/chat_page.html"));
  CHECK(page.substr(0, 15) == "<!doctype html>");
}

TEST_CASE("chat page: no external assets, model text only through textContent") {
  std::string page(tpcli::serve::chat_page());
  for (const char* outside : {"src=\"http", "href=\"http", "src=\"//", "href=\"//", "<link", "@import", "<script src"}) {
    INFO(outside);
    CHECK(page.find(outside) == std::string::npos);
  }
  CHECK(page.find("innerHTML") == std::string::npos);
  CHECK(page.find("insertAdjacentHTML") == std::string::npos);
  for (const char* id : {"id=\"messages\"", "id=\"input\"", "id=\"send\"", "id=\"stop\"", "id=\"system\"",
                         "id=\"temperature\"", "id=\"max-tokens\"", "id=\"api-key\"", "id=\"json-mode\"", "id=\"status\""}) {
    INFO(id);
    CHECK(page.find(id) != std::string::npos);
  }
}
