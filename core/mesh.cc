#include "core/mesh.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"

namespace braid {

std::string MeshShape::ToString() const {
  return absl::StrCat("tensor ", tensor, " x pipeline ", pipeline, " x data ", data);
}

absl::StatusOr<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(Communicator& world,
                                                              MeshShape shape) {
  if (shape.tensor < 1 || shape.pipeline < 1 || shape.data < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel layout ", shape.ToString(), ": every size must be at least 1"));
  }
  if (shape.size() != world.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel layout ", shape.ToString(), " needs ", shape.size(), " ranks but the job has ",
        world.size(), ": make tensor x pipeline x data equal the number of processes"));
  }
  const int t = shape.tensor, p = shape.pipeline, d = shape.data;
  auto rank_of = [&](int ti, int pi, int di) { return (di * p + pi) * t + ti; };
  auto mesh = std::unique_ptr<DeviceMesh>(new DeviceMesh());
  mesh->shape_ = shape;
  mesh->world_ = &world;
  const int r = world.rank();
  mesh->tensor_rank_ = r % t;
  mesh->pipeline_rank_ = (r / t) % p;
  mesh->data_rank_ = r / (t * p);
  // Every rank takes part in building every group (NewGroup's contract), in one fixed order.
  auto build = [&](const std::vector<std::vector<int>>& groups,
                   std::unique_ptr<Communicator>* mine) -> absl::Status {
    for (const std::vector<int>& ranks : groups) {
      BRAID_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> g, world.NewGroup(ranks));
      if (g != nullptr) *mine = std::move(g);
    }
    BRAID_CHECK(*mine != nullptr) << "rank " << r << " is in no group of the mesh";
    return absl::OkStatus();
  };
  std::vector<std::vector<int>> tensor, pipeline, data, replica;
  for (int di = 0; di < d; ++di) {
    for (int pi = 0; pi < p; ++pi) {
      std::vector<int> g;
      for (int ti = 0; ti < t; ++ti) g.push_back(rank_of(ti, pi, di));
      tensor.push_back(g);
    }
  }
  for (int di = 0; di < d; ++di) {
    for (int ti = 0; ti < t; ++ti) {
      std::vector<int> g;
      for (int pi = 0; pi < p; ++pi) g.push_back(rank_of(ti, pi, di));
      pipeline.push_back(g);
    }
  }
  for (int pi = 0; pi < p; ++pi) {
    for (int ti = 0; ti < t; ++ti) {
      std::vector<int> g;
      for (int di = 0; di < d; ++di) g.push_back(rank_of(ti, pi, di));
      data.push_back(g);
    }
  }
  for (int ti = 0; ti < t; ++ti) {
    std::vector<int> g;
    for (int di = 0; di < d; ++di) {
      for (int pi = 0; pi < p; ++pi) g.push_back(rank_of(ti, pi, di));
    }
    replica.push_back(g);
  }
  BRAID_RETURN_IF_ERROR(build(tensor, &mesh->tensor_));
  BRAID_RETURN_IF_ERROR(build(pipeline, &mesh->pipeline_));
  BRAID_RETURN_IF_ERROR(build(data, &mesh->data_));
  BRAID_RETURN_IF_ERROR(build(replica, &mesh->replica_));
  return mesh;
}

absl::StatusOr<Communicator*> DeviceMesh::GroupOf(const std::vector<std::string>& axes) const {
  auto has = [&](const char* a) { return std::find(axes.begin(), axes.end(), a) != axes.end(); };
  const bool t = has(kAxisTensor), p = has(kAxisPipeline), d = has(kAxisData);
  Communicator* g = nullptr;
  if (size_t(t) + size_t(p) + size_t(d) == axes.size()) {  // nothing but known axes
    if (t && !p && !d) g = tensor_.get();
    if (!t && p && !d) g = pipeline_.get();
    if (!t && !p && d) g = data_.get();
    if (!t && p && d) g = replica_.get();
    if (t && p && d) g = world_;
  }
  if (g == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no group of the mesh (", shape_.ToString(), ") spans the axes {", absl::StrJoin(axes, ", "),
        "}: a layer serves tensor, pipeline or data, or pipeline and data together"));
  }
  return g->size() == world_->size() ? world_ : g;
}

}  // namespace braid
