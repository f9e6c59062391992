#include "cli/bench_collective_ops.h"

#include <algorithm>
#include <stdexcept>

#include "cli/commands.h"

namespace tpcli::cli {

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
