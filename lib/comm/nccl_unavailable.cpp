// Built instead of the NCCL communicator when configure found no CUDA toolkit or no NCCL, so
// callers need no #if: asking for NCCL is then a clear error.

#include "comm/nccl_communicator.h"
#include "core/error.h"

namespace dstrain::comm {

bool nccl_available() {
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(const RendezvousOptions& options,
                                                     NcclCommunicatorOptions nccl_options) {
  fail(ErrorKind::kNotImplemented,
       "this dstrain was built without NCCL (no CUDA toolkit or NCCL found at configure time); "
       "rebuild on a machine with them, see docs/gpu.md");
}

void synchronize(Work& work) {
  work.wait();
}

}  // namespace dstrain::comm
