// tpcli::engine — prompt lookup (see prompt_lookup.h).
#include "engine/prompt_lookup.h"

#include <algorithm>

namespace tpcli::engine {

std::vector<int> lookup_guesses(std::span<const int> tokens, int count, const PromptLookup& lookup) {
  const auto size = static_cast<ptrdiff_t>(tokens.size());
  for (ptrdiff_t n = std::min<ptrdiff_t>(lookup.longest, size - 1); n >= std::max(lookup.shortest, 1) && count > 0; --n) {
    const std::span<const int> end = tokens.last(static_cast<size_t>(n));
    // The latest start before the end's own whose n tokens equal the end's.
    for (ptrdiff_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(end.begin(), end.end(), tokens.begin() + start)) continue;
      const ptrdiff_t from = start + n, to = std::min(size, from + count);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

}  // namespace tpcli::engine
