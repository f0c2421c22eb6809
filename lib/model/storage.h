#pragma once
// Freeing and re-allocating a tensor's storage in place, keeping every view of it valid.
//
// ZeRO-3 keeps each unit's gathered parameters in one flat buffer whose storage exists only while
// the unit is in use. The parameters are views of that buffer, and autograd saves views of them
// (e.g. W.t() for a matmul) that outlive the forward. Replacing the parameters' data would leave
// those saved views pointing at the old memory, which would then never be freed. Emptying and
// refilling the shared StorageImpl instead frees the memory for real and makes every view — the
// parameters' and autograd's — see the re-gathered values. Accessing a view while its storage is
// released is a bug of the caller (the data pointer is null).

#include <torch/types.h>

namespace dstrain::model {

// Drops the memory of `tensor`'s storage (nbytes becomes 0); views keep their sizes and strides.
void release_storage(const torch::Tensor& tensor);
// Gives `tensor`'s storage `nbytes` of fresh, uninitialised memory from its own allocator (no-op
// when it already holds that many bytes).
void allocate_storage(const torch::Tensor& tensor, int64_t nbytes);
// Bytes the storage holds now.
int64_t storage_bytes(const torch::Tensor& tensor);
// A tensor of `shape` and `options` whose storage holds no memory (a placeholder that knows its
// shape, dtype and device; give it memory with allocate_storage or replace its data).
torch::Tensor unmaterialized(c10::IntArrayRef shape, const torch::TensorOptions& options);

}  // namespace dstrain::model
