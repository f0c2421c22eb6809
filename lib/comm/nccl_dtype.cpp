#include "comm/nccl_dtype.h"

#include "core/error.h"

namespace dstrain::comm {

ncclDataType_t nccl_dtype(CollectiveKind kind, c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return ncclFloat32;
    case c10::ScalarType::Double:
      return ncclFloat64;
    case c10::ScalarType::BFloat16:
      return ncclBfloat16;
    case c10::ScalarType::Half:
      return ncclFloat16;
    default:
      fail(ErrorKind::kInternal,
           "{}: dtype {} is not supported by the NCCL communicator (float32, float64, bfloat16, "
           "float16 are)",
           to_string(kind), c10::toString(type));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  fail(ErrorKind::kInternal, "unknown ReduceOp {}", static_cast<int>(op));
}

void check_cuda_buffer(CollectiveKind kind, const char* name, const at::Tensor& t, int device) {
  if (!t.defined())
    fail(ErrorKind::kInternal, "{}: {} is an undefined tensor", to_string(kind), name);
  const bool on_device = t.is_cuda() && t.get_device() == device;
  if (!on_device || !t.is_contiguous() || !at::isFloatingType(t.scalar_type())) {
    fail(
        ErrorKind::kInternal,
        "{}: {} must be a contiguous floating-point CUDA tensor on device {}, got a {}{} {} tensor "
        "(the NCCL communicator moves device memory only; use the Gloo communicator for CPU "
        "tensors)",
        to_string(kind), name, device, t.is_contiguous() ? "" : "non-contiguous ", t.device().str(),
        c10::toString(t.scalar_type()));
  }
}

}  // namespace dstrain::comm
