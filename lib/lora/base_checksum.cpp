#include "lora/base_checksum.h"

#include <zlib.h>

#include <fmt/format.h>

namespace dstrain::lora {
namespace {

uLong crc_bytes(uLong crc, const void* data, size_t n) {
  return crc32_z(crc, static_cast<const Bytef*>(data), n);
}

}  // namespace

std::string base_checksum(model::DecoderModelImpl& model) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor t = item.value().detach().to(torch::kCPU).contiguous();
    const std::string head = item.key() + '\0' + c10::toString(t.scalar_type()) + '\0';
    crc = crc_bytes(crc, head.data(), head.size());
    crc = crc_bytes(crc, t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
  return fmt::format("{:08x}", static_cast<uint32_t>(crc));
}

}  // namespace dstrain::lora
