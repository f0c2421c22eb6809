#include "lora/base_checksum.h"

#include <zlib.h>

#include <fmt/format.h>

namespace dstrain::lora {
namespace {

uLong crc_bytes(uLong crc, const void* data, size_t n) {
  return crc32_z(crc, static_cast<const Bytef*>(data), n);
}

}  // namespace

TensorCrc tensor_crc(const std::string& name, const torch::Tensor& value) {
  const torch::Tensor t = value.detach().to(torch::kCPU).contiguous();
  const std::string head = name + '\0' + c10::toString(t.scalar_type()) + '\0';
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc_bytes(crc, head.data(), head.size());
  crc = crc_bytes(crc, t.data_ptr(), static_cast<size_t>(t.nbytes()));
  return {static_cast<uint32_t>(crc), head.size() + static_cast<uint64_t>(t.nbytes())};
}

// crc32(A || B) from crc32(A), crc32(B) and B's length: the parts need not be read in one pass.
std::string combine_checksum(const std::vector<TensorCrc>& parts) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const TensorCrc& p : parts) {
    crc = crc32_combine(crc, p.crc, static_cast<z_off_t>(p.bytes));
  }
  return fmt::format("{:08x}", static_cast<uint32_t>(crc));
}

std::string base_checksum(model::DecoderModelImpl& model) {
  std::vector<TensorCrc> parts;
  for (const auto& item : model.named_parameters()) {
    parts.push_back(tensor_crc(item.key(), item.value()));
  }
  return combine_checksum(parts);
}

}  // namespace dstrain::lora
