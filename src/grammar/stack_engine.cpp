#include "grammar/stack_engine.h"

#include <algorithm>

namespace tpcli::grammar {

int32_t StackArena::intern(int32_t state, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent);
  const auto [it, inserted] = index_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({state, parent});
  return it->second;
}

void StackWalker::expand(std::span<const int32_t> seeds, StackSet& out) {
  out.nodes.clear();
  out.end = false;
  if (++epoch_ == 0) {
    std::fill(stamp_.begin(), stamp_.end(), 0);
    epoch_ = 1;
  }
  work_.assign(seeds.begin(), seeds.end());
  while (!work_.empty()) {
    const int32_t id = work_.back();
    work_.pop_back();
    if (stamp_.size() <= static_cast<size_t>(id)) stamp_.resize(arena_.size() * 2 + 16, 0);
    if (stamp_[static_cast<size_t>(id)] == epoch_) continue;
    stamp_[static_cast<size_t>(id)] = epoch_;
    const StackNode node = arena_.node(id);
    const AutomatonState& state = a_.states[static_cast<size_t>(node.state)];
    if (!state.bytes.empty()) out.nodes.push_back(id);
    for (const CallEdge& call : state.calls) {
      const int32_t caller = arena_.intern(call.to, node.parent);
      work_.push_back(arena_.intern(a_.rule_start[static_cast<size_t>(call.rule)], caller));
    }
    if (state.accepting) {
      if (node.parent == NO_PARENT)
        out.end = true;
      else
        work_.push_back(node.parent);
    }
  }
  std::sort(out.nodes.begin(), out.nodes.end());
}

void StackWalker::advance(const StackSet& from, uint8_t byte, StackSet& out) {
  seeds_.clear();
  for (const int32_t id : from.nodes) {
    const StackNode node = arena_.node(id);
    const int32_t to = a_.next(node.state, byte);
    if (to >= 0) seeds_.push_back(arena_.intern(to, node.parent));
  }
  expand(seeds_, out);
}

void compact_stacks(const StackArena& from, StackSet& set, StackArena& to) {
  std::unordered_map<int32_t, int32_t> moved;
  std::vector<int32_t> chain;
  auto copy = [&](int32_t id) {
    chain.clear();
    for (int32_t at = id; at != NO_PARENT && !moved.contains(at); at = from.node(at).parent) chain.push_back(at);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const StackNode& node = from.node(*it);
      const int32_t parent = node.parent == NO_PARENT ? NO_PARENT : moved.at(node.parent);
      moved.emplace(*it, to.intern(node.state, parent));
    }
    return moved.at(id);
  };
  for (int32_t& id : set.nodes) id = copy(id);
  std::sort(set.nodes.begin(), set.nodes.end());
}

}  // namespace tpcli::grammar
