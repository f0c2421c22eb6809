#pragma once
// Internal: the launchers compiled by nvcc. fused_ops.cpp validates arguments and turns the
// returned status into dstrain::Error, so the .cu file needs neither fmt nor exceptions.

#include <cuda_runtime_api.h>

#include "kernels/fused_ops.h"

namespace dstrain::kernels::detail {

// Each enqueues its kernel (arguments valid, at least one element) and returns
// cudaGetLastError().
cudaError_t launch_rope(const RopeArgs& args, cudaStream_t stream);
cudaError_t launch_swiglu(const SwigluArgs& args, cudaStream_t stream);
cudaError_t launch_swiglu_backward(const SwigluBackwardArgs& args, cudaStream_t stream);
cudaError_t launch_cross_entropy(const CrossEntropyArgs& args, cudaStream_t stream);
cudaError_t launch_add_rms_norm(const AddRmsNormArgs& args, cudaStream_t stream);
cudaError_t launch_add_rms_norm_backward(const AddRmsNormBackwardArgs& args, cudaStream_t stream);

}  // namespace dstrain::kernels::detail
