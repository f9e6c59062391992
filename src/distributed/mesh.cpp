// tpcli::dist — Mesh: named axes, rank <-> coordinates (row-major in declaration order).
#include "distributed/mesh.h"

#include <algorithm>
#include <stdexcept>

namespace tpcli::dist {

Mesh::Mesh(std::vector<MeshAxis> axes) : axes_(std::move(axes)) {
  for (size_t i = 0; i < axes_.size(); ++i) {
    const MeshAxis& a = axes_[i];
    if (a.name.empty()) throw std::invalid_argument("mesh: axis " + std::to_string(i) + " has an empty name");
    if (a.size < 1)
      throw std::invalid_argument("mesh: axis '" + a.name + "' has size " + std::to_string(a.size) + " (must be >= 1)");
    for (size_t j = 0; j < i; ++j)
      if (axes_[j].name == a.name) throw std::invalid_argument("mesh: duplicate axis name '" + a.name + "'");
    if (size_ > (1 << 20) / a.size) throw std::invalid_argument("mesh: too many devices (" + to_string() + ")");
    size_ *= a.size;
  }
}

Mesh Mesh::line(int devices, std::string axis_name) { return Mesh({{std::move(axis_name), devices}}); }

bool Mesh::has_axis(std::string_view name) const {
  return std::any_of(axes_.begin(), axes_.end(), [&](const MeshAxis& a) { return a.name == name; });
}

int Mesh::axis_index(std::string_view name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return static_cast<int>(i);
  throw std::invalid_argument("mesh: no axis '" + std::string(name) + "' in mesh (" + to_string() + ")");
}

int Mesh::axis_size(std::string_view name) const {
  for (const MeshAxis& a : axes_)
    if (a.name == name) return a.size;
  return 1;
}

std::string Mesh::to_string() const {
  std::string s;
  for (size_t i = 0; i < axes_.size(); ++i) s += (i ? "," : "") + axes_[i].name + "=" + std::to_string(axes_[i].size);
  return s.empty() ? "(no axes)" : s;
}

std::vector<int> Mesh::coords(int rank) const {
  if (rank < 0 || rank >= size_)
    throw std::out_of_range("mesh: rank " + std::to_string(rank) + " outside mesh of " + std::to_string(size_) +
                            " devices (" + to_string() + ")");
  std::vector<int> c(axes_.size());
  for (size_t i = axes_.size(); i-- > 0;) {
    c[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return c;
}

int Mesh::rank_of(const std::vector<int>& coords) const {
  if (coords.size() != axes_.size())
    throw std::invalid_argument("mesh: " + std::to_string(coords.size()) + " coordinates for a mesh with " +
                                std::to_string(axes_.size()) + " axes (" + to_string() + ")");
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= axes_[i].size)
      throw std::out_of_range("mesh: coordinate " + std::to_string(coords[i]) + " outside axis '" + axes_[i].name +
                              "' of size " + std::to_string(axes_[i].size));
    rank = rank * axes_[i].size + coords[i];
  }
  return rank;
}

std::vector<int> Mesh::group_members(int rank, const std::vector<std::string>& along) const {
  std::vector<bool> free(axes_.size(), false);
  for (const std::string& name : along) {
    if (!has_axis(name)) continue;  // an absent axis has size 1: it adds no members
    free[static_cast<size_t>(axis_index(name))] = true;
  }
  const std::vector<int> base = coords(rank);
  std::vector<int> members;
  for (int r = 0; r < size_; ++r) {
    std::vector<int> c = coords(r);
    bool same = true;
    for (size_t i = 0; i < c.size() && same; ++i) same = free[i] || c[i] == base[i];
    if (same) members.push_back(r);
  }
  return members;  // ascending by construction
}

}  // namespace tpcli::dist
