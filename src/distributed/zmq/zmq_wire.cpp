#include "distributed/zmq/zmq_wire.h"

#include <charconv>
#include <cstring>
#include <sstream>
#include <vector>

namespace tpcli::dist {

std::string Hello::encode() const {
  std::ostringstream s;
  s << "HELLO " << rank << ' ' << world << ' ' << devices_per_process << ' ' << mesh_size << ' ' << version << ' '
    << binary << ' ' << config << ' ' << inbox << ' ' << host << ' ' << rings << ' ' << job;
  return s.str();
}

namespace {

std::vector<std::string_view> split_spaces(std::string_view text) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    const size_t start = i;
    while (i < text.size() && text[i] != ' ') ++i;
    if (i > start) words.push_back(text.substr(start, i - start));
  }
  return words;
}

bool parse_count(std::string_view word, int min, int max, int& out) {
  auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), out);
  return ec == std::errc() && end == word.data() + word.size() && out >= min && out <= max;
}

}  // namespace

std::optional<Hello> Hello::decode(std::string_view text) {
  const std::vector<std::string_view> w = split_spaces(text);
  if (w.size() != 12 || w[0] != "HELLO") return std::nullopt;
  for (std::string_view word : w)
    for (char c : word)
      if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) return std::nullopt;
  Hello h;
  if (!parse_count(w[1], 0, MAX_PROCESSES - 1, h.rank) || !parse_count(w[2], 1, MAX_PROCESSES, h.world) ||
      !parse_count(w[3], 1, MAX_MESH_DEVICES, h.devices_per_process) ||
      !parse_count(w[4], 1, MAX_MESH_DEVICES, h.mesh_size))
    return std::nullopt;
  h.version = w[5];
  h.binary = w[6];
  h.config = w[7];
  h.inbox = w[8];
  h.host = w[9];
  h.rings = w[10];
  h.job = w[11];
  return h;
}

std::optional<WireHeader> parse_wire_header(std::span<const std::byte> frame, size_t payload_bytes, int world_size,
                                            int mesh_size) {
  WireHeader h;
  if (frame.size() != sizeof h) return std::nullopt;
  std::memcpy(&h, frame.data(), sizeof h);
  if (h.magic != WIRE_MAGIC) return std::nullopt;
  switch (static_cast<WireKind>(h.kind)) {
    case WireKind::DATA: {
      if (h.src < 0 || h.src >= mesh_size || h.dst < 0 || h.dst >= mesh_size) return std::nullopt;
      if (payload_bytes % sizeof(float) != 0) return std::nullopt;
      const auto floats = static_cast<int64_t>(payload_bytes / sizeof(float));
      if (h.total < 0 || h.total > MAX_MESSAGE_FLOATS || h.offset < 0 || h.offset > h.total - floats)
        return std::nullopt;
      return h;
    }
    case WireKind::ABORT:
    case WireKind::BYE:
    case WireKind::ATTACH:
      if (h.src < 0 || h.src >= world_size) return std::nullopt;
      return h;
  }
  return std::nullopt;
}

}  // namespace tpcli::dist
