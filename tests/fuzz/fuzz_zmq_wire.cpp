// libFuzzer target: what a ZeroMQ peer sends: the start-up HELLO (text) and a chunk's header.
#include <cstdlib>
#include <span>
#include <string>

#include "distributed/zmq/zmq_wire.h"

using tpcli::dist::Hello;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (auto hello = Hello::decode(text)) {
    // What decode accepts, encode writes back to the same hello.
    auto again = Hello::decode(hello->encode());
    if (!again || again->encode() != hello->encode() || hello->rank >= tpcli::dist::MAX_PROCESSES) std::abort();
  }
  const auto bytes = std::as_bytes(std::span<const uint8_t>(data, size));
  const size_t header = sizeof(tpcli::dist::WireHeader);
  if (size >= header) {
    const size_t payload = size - header;
    if (auto h = tpcli::dist::parse_wire_header(bytes.first(header), payload, 4, 8)) {
      // A chunk that parses lies inside its message (receivers copy it to out + offset).
      if (h->kind == static_cast<uint32_t>(tpcli::dist::WireKind::DATA) &&
          (h->offset < 0 || h->offset + static_cast<int64_t>(payload / sizeof(float)) > h->total))
        std::abort();
    }
  }
  return 0;
}
