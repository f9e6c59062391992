// tpcli::dist — a mesh of devices with named, ordered axes (JAX's Mesh).
//
// Ranks are row-major over the axes in declaration order: for axes (data=2, model=4), rank =
// data * 4 + model. A sub-group "along" some axes is the set of devices that share every other
// coordinate — the devices JAX's psum(x, 'model') sums over.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tpcli::dist {

struct MeshAxis {
  std::string name;
  int size = 1;
  bool operator==(const MeshAxis&) const = default;
};

class Mesh {
 public:
  Mesh() : Mesh(std::vector<MeshAxis>{}) {}
  explicit Mesh(std::vector<MeshAxis> axes);  // throws on empty names, duplicates, sizes < 1
  static Mesh line(int devices, std::string axis_name = "model");

  const std::vector<MeshAxis>& axes() const { return axes_; }
  int size() const { return size_; }  // number of devices
  bool has_axis(std::string_view name) const;
  int axis_index(std::string_view name) const;  // throws if absent, naming the axes present
  int axis_size(std::string_view name) const;   // 1 if the axis is absent
  std::string to_string() const;                // "data=2,model=4"

  std::vector<int> coords(int rank) const;
  int rank_of(const std::vector<int>& coords) const;
  // Ranks (ascending) that share all coordinates of `rank` except those along `along`.
  // The position of `rank` in the result is its rank within that sub-group.
  std::vector<int> group_members(int rank, const std::vector<std::string>& along) const;

 private:
  std::vector<MeshAxis> axes_;
  int size_ = 1;
};

}  // namespace tpcli::dist
