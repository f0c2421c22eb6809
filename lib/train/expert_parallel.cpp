#include "train/expert_parallel.h"

#include "comm/autograd.h"
#include "core/error.h"

namespace dstrain::train {
namespace {

class ExpertShapes final : public model::ExpertParallel {
 public:
  explicit ExpertShapes(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  torch::Tensor exchange_counts(const torch::Tensor&) override { refuse(); }
  torch::Tensor exchange_rows(const torch::Tensor&, std::vector<int64_t>,
                              std::vector<int64_t>) override {
    refuse();
  }

 private:
  [[noreturn]] static void refuse() {
    fail(ErrorKind::kInternal, "a model built for its shapes alone ran an expert-parallel forward");
  }
  int size_;
};

}  // namespace

std::shared_ptr<model::ExpertParallel> expert_parallel_shapes(int size) {
  return std::make_shared<ExpertShapes>(size);
}

void check_expert_parallel(const config::Config& config, const model::ModelConfig& model,
                           const std::string& name, const std::string& config_path) {
  const int64_t ep = config.parallel.expert_parallel_size;
  if (ep <= 1) return;
  if (model.moe.experts == 0) {
    fail(ErrorKind::kConfig,
         "{}: parallel.expert_parallel_size is {} but {} ({}) has no experts; expert parallelism "
         "spreads a Mixture-of-Experts model's experts (set it to 1)",
         config_path, ep, name, model.model_type);
  }
  if (model.moe.experts % ep != 0) {
    fail(ErrorKind::kConfig,
         "{}: parallel.expert_parallel_size ({}) does not divide the {} experts of {}: each rank "
         "of an expert-parallel group holds an equal share of them",
         config_path, ep, model.moe.experts, name);
  }
  if (config.lora.enabled && !config.lora.target_parameters.empty()) {
    fail(ErrorKind::kConfig,
         "{}: lora.target_parameters (LoRA on a Mixture-of-Experts model's experts) with "
         "parallel.expert_parallel_size {} is not supported yet; adapt the experts with "
         "expert_parallel_size 1, or adapt the attention alone (lora.target_modules)",
         config_path, ep);
  }
}

torch::Tensor ExpertParallelGroup::exchange_counts(const torch::Tensor& counts) {
  torch::Tensor input = counts.detach().contiguous();
  torch::Tensor output = torch::empty_like(input);
  group_.all_to_all(output, input)->wait();
  return output;
}

torch::Tensor ExpertParallelGroup::exchange_rows(const torch::Tensor& x,
                                                 std::vector<int64_t> receive,
                                                 std::vector<int64_t> send) {
  return comm::all_to_all_v(group_, x, std::move(receive), std::move(send));
}

}  // namespace dstrain::train
