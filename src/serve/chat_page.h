// tpcli::serve — the chat page served at GET /, built into the binary.
#pragma once

#include <string_view>

namespace tpcli::serve {

std::string_view chat_page();

}  // namespace tpcli::serve
