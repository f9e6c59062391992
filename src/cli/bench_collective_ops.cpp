#include "cli/bench_collective_ops.h"

#include <algorithm>
#include <stdexcept>

#include "cli/commands.h"

namespace tpcli::cli {

int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw UsageError("size '" + text + "' is not a number (e.g. 4K, 16M)");
  }
  const std::string unit = text.substr(used);
  double scale = 1;
  if (unit == "K" || unit == "KB" || unit == "k") scale = 1024;
  else if (unit == "M" || unit == "MB") scale = 1024 * 1024;
  else if (unit == "G" || unit == "GB") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") throw UsageError("unknown unit in size '" + text + "'");
  const auto bytes = static_cast<int64_t>(value * scale);
  if (bytes < 4) throw UsageError("size '" + text + "' is below one float");
  return bytes;
}

void check_collective_ops(const std::vector<std::string>& ops) {
  for (const std::string& op : ops)
    if (op != "all_sum" && op != "all_gather" && op != "reduce_scatter" && op != "all_to_all")
      throw UsageError("unknown op '" + op + "' (all_sum, all_gather, reduce_scatter, all_to_all)");
}

int iterations_for(int64_t bytes) { return static_cast<int>(std::clamp<int64_t>((8 << 20) / bytes, 1, 400)); }

CollectiveBuffers::CollectiveBuffers(const std::string& op, int64_t n, int D) {
  const size_t all = static_cast<size_t>(n), part = all / static_cast<size_t>(D);
  if (op == "all_sum") in.assign(all, 1.0f);
  if (op == "all_gather") { in.assign(part, 1.0f); out.assign(all, 0.0f); }
  if (op == "reduce_scatter") { in.assign(all, 1.0f); out.assign(part, 0.0f); }
  if (op == "all_to_all") { in.assign(all, 1.0f); out.assign(all, 0.0f); }
}

void run_collective(const std::string& op, dist::Group& group, CollectiveBuffers& b) {
  if (op == "all_sum") group.all_sum(b.in);
  else if (op == "all_gather") group.all_gather(b.in, b.out);
  else if (op == "reduce_scatter") group.reduce_scatter(b.in, b.out);
  else if (op == "all_to_all") group.all_to_all(b.in, b.out);
  else if (op == "barrier") group.barrier();
  else throw std::invalid_argument("run_collective: unknown op '" + op + "'");
}

}  // namespace tpcli::cli
