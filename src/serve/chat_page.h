// tpcli::serve — the chat page served at GET / (src/serve/chat_page.html), compiled into the binary:
// the build turns the HTML into a raw string literal (cmake/embed_text.cmake), so tpcli serve reads
// no file at run time. Edit the .html; `make` regenerates the source.
#pragma once

#include <string_view>

namespace tpcli::serve {

// The page's bytes, exactly as in chat_page.html (UTF-8, text/html).
std::string_view chat_page();

}  // namespace tpcli::serve
