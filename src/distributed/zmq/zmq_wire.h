// tpcli::dist — what the ZeroMQ transport puts on the wire, and the checks made on what it reads.
//
// Start-up: each rank sends rank 0's coordinator one text frame,
//   HELLO rank world devices_per_process mesh_size version binary config inbox host rings job
// (fields without spaces). `job` is the launch's random token (TPCLI_JOB): a rank of another job
// that reaches this coordinator (same port, a job that died, a stray process) is refused by it.
//
// Traffic: two frames per chunk, a WireHeader (fixed 48 bytes, host byte order) and the payload
// (floats for DATA, text for ABORT and ATTACH). A frame that does not parse as ours is ignored.
// Both parsers take bytes from the network: every number is bounded before it is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace tpcli::dist {

struct Hello {
  int rank = -1, world = 0, devices_per_process = 0, mesh_size = 0;
  std::string version, binary, config, inbox;
  std::string host = "-";   // hash of host_identity()
  std::string rings = "-";  // ShmSegment descriptor, "-" without shared memory
  std::string job = "-";    // the launch's token; "-" outside `tpcli launch`

  std::string encode() const;
  // nullopt for anything else than a well-formed hello with counts in range (see MAX_* below).
  static std::optional<Hello> decode(std::string_view text);
  // This rank's entry in the coordinator's table: how the others reach it.
  std::string table_entry() const { return inbox + "|" + host + "|" + rings; }
};

constexpr int MAX_PROCESSES = 1 << 16;         // ranks of one run
constexpr int MAX_MESH_DEVICES = 1 << 20;      // devices of one mesh
constexpr int64_t MAX_MESSAGE_FLOATS = int64_t{1} << 36;

constexpr uint32_t WIRE_MAGIC = 0x7470636c;  // "tpcl"
enum class WireKind : uint32_t { DATA = 1, ABORT = 2, BYE = 3, ATTACH = 4 };  // ATTACH text: "1" rings mapped, "0" not

struct WireHeader {
  uint32_t magic = WIRE_MAGIC;
  uint32_t kind = 0;
  uint64_t comm = 0;
  uint64_t seq = 0;
  int32_t src = 0;  // mesh rank (DATA) or process (ABORT, BYE, ATTACH)
  int32_t dst = 0;
  int64_t total = 0;   // floats in the whole message
  int64_t offset = 0;  // of this chunk
};

// The header of a chunk whose payload has `payload_bytes`, if it is one of ours and consistent:
// known kind; DATA: src and dst mesh ranks below mesh_size, 0 <= offset, offset + payload floats
// <= total <= MAX_MESSAGE_FLOATS, whole floats; control kinds: src a process below world_size.
std::optional<WireHeader> parse_wire_header(std::span<const std::byte> frame, size_t payload_bytes, int world_size,
                                            int mesh_size);

}  // namespace tpcli::dist
