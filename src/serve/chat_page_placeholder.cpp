#include "serve/chat_page.h"

namespace tpcli::serve {

std::string_view chat_page() { return "<!doctype html><title>tpcli</title><p>tpcli serve</p>"; }

}  // namespace tpcli::serve
