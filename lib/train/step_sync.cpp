#include "train/step_sync.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include "comm/nccl_communicator.h"
#include "core/error.h"

namespace dstrain::train {

torch::Tensor gather_from_ranks(comm::Communicator& comm, const torch::Tensor& local,
                                const torch::Device& device) {
  std::vector<int64_t> shape = local.sizes().vec();
  shape.insert(shape.begin(), comm.world_size());
  if (comm.world_size() == 1) return local.reshape(shape);
  const torch::Tensor input = local.to(device).reshape({-1});
  torch::Tensor output = torch::empty({comm.world_size() * input.numel()}, input.options());
  comm::synchronize(*comm.all_gather(output, input));
  return output.cpu().reshape(shape);
}

void DeferredSum::start(const std::vector<double>& values) {
  if (pending()) fail(ErrorKind::kInternal, "DeferredSum::start while a sum is pending");
  torch::Tensor host = torch::tensor(values, torch::kFloat64);
  if (!device_.is_cuda()) {
    values_ = host;
    work_ = comm_.all_reduce(values_, comm::ReduceOp::kSum);
    return;
  }
  // Page-locked both ways, so that neither copy makes the host wait for the device queue.
  values_ = host.pin_memory().to(device_, /*non_blocking=*/true);
  work_ = comm_.all_reduce(values_, comm::ReduceOp::kSum);
  work_->wait();  // the compute stream waits for the collective; the host does not
  host_ = torch::empty_like(host).pin_memory();
  host_.copy_(values_, /*non_blocking=*/true);
  const c10::impl::VirtualGuardImpl guard(device_.type());
  copied_.emplace(device_.type());
  copied_->record(guard.getStream(device_));
}

std::vector<double> DeferredSum::finish() {
  if (!pending()) fail(ErrorKind::kInternal, "DeferredSum::finish without a pending sum");
  comm::synchronize(*work_);
  torch::Tensor sums = values_;
  if (copied_) {
    copied_->synchronize();
    sums = host_;
  }
  work_.reset();
  copied_.reset();
  std::vector<double> out(static_cast<size_t>(sums.numel()));
  const double* p = sums.data_ptr<double>();
  for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  return out;
}

}  // namespace dstrain::train
