// DeviceMesh: the world's ranks laid out as tensor × pipeline × data, with every group built
// once at start. Megatron's order puts tensor parallel innermost (its groups are contiguous
// ranks, the fastest links), pipeline across, data outermost:
//   rank = (data_index * pipeline + pipeline_index) * tensor + tensor_index.
// The composer hands each layer of a strategy stack the group of the axes it serves (GroupOf,
// StrategyContext::comm); data is sharded over the data axis only.
#ifndef BRAID_CORE_MESH_H_
#define BRAID_CORE_MESH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/communicator.h"

namespace braid {

// The mesh axes a strategy can serve as one layer of a composed stack (StrategyTraits::axes).
inline constexpr char kAxisTensor[] = "tensor";
inline constexpr char kAxisPipeline[] = "pipeline";
inline constexpr char kAxisData[] = "data";

struct MeshShape {
  int tensor = 1, pipeline = 1, data = 1;
  int size() const { return tensor * pipeline * data; }
  std::string ToString() const;  // "tensor 2 x pipeline 2 x data 2"
};

class DeviceMesh {
 public:
  // Collective over `world` (every rank calls it with the same shape), which must outlive the
  // mesh. InvalidArgument when the shape's product is not the world size, naming both.
  static absl::StatusOr<std::unique_ptr<DeviceMesh>> Create(Communicator& world, MeshShape shape);

  const MeshShape& shape() const { return shape_; }
  int rank() const { return world_->rank(); }  // in the world
  int tensor_rank() const { return tensor_rank_; }
  int pipeline_rank() const { return pipeline_rank_; }
  int data_rank() const { return data_rank_; }

  // This rank's groups. Each is a communicator of its axis' size (a size-1 group when the axis
  // is 1). `model_replica`: the pipeline × data ranks with this rank's tensor index, ordered
  // pipeline fastest (rank pipeline_index + pipeline * data_index), the layout the pipeline
  // strategy grids; what a data-parallel or pipeline strategy runs over under tensor parallelism.
  Communicator& tensor() const { return *tensor_; }
  Communicator& pipeline() const { return *pipeline_; }
  Communicator& data() const { return *data_; }
  Communicator& model_replica() const { return *replica_; }

  // The group of the ranks a layer serving `axes` works over, with this rank: {tensor},
  // {pipeline}, {data}, or {pipeline, data} (model_replica). A group of every rank is the world
  // the mesh was built over (a stack of one data layer trains over the world, as without a
  // mesh). InvalidArgument, naming the axes, for a set no group spans.
  absl::StatusOr<Communicator*> GroupOf(const std::vector<std::string>& axes) const;

 private:
  DeviceMesh() = default;
  MeshShape shape_;
  int tensor_rank_ = 0, pipeline_rank_ = 0, data_rank_ = 0;
  Communicator* world_ = nullptr;  // outlives the mesh (Create's contract)
  std::unique_ptr<Communicator> tensor_, pipeline_, data_, replica_;
};

}  // namespace braid

#endif  // BRAID_CORE_MESH_H_
