#include "model/storage.h"

#include <c10/core/StorageImpl.h>

#include "core/error.h"

namespace dstrain::model {

void release_storage(const torch::Tensor& tensor) {
  c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, impl->data_ptr().device()));
  impl->set_nbytes(0);
}

void allocate_storage(const torch::Tensor& tensor, int64_t nbytes) {
  c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
  if (static_cast<int64_t>(impl->nbytes()) == nbytes) return;
  if (impl->allocator() == nullptr) {
    fail(ErrorKind::kInternal, "a released tensor buffer has storage without an allocator");
  }
  impl->set_data_ptr_noswap(impl->allocator()->allocate(static_cast<size_t>(nbytes)));
  impl->set_nbytes(static_cast<size_t>(nbytes));
}

torch::Tensor unmaterialized(c10::IntArrayRef shape, const torch::TensorOptions& options) {
  // An empty tensor given the sizes: nothing is allocated, whatever the shape, and the storage
  // keeps its device and allocator for allocate_storage().
  torch::Tensor t = torch::empty({0}, options);
  release_storage(t);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

int64_t storage_bytes(const torch::Tensor& tensor) {
  return static_cast<int64_t>(tensor.storage().nbytes());
}

}  // namespace dstrain::model
