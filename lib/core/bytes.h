#pragma once
// Byte counts for people: "512 B", "1.50 KiB", "3.2 GiB" (binary units, B up to TiB), and their
// padding.

#include <cstdint>
#include <string>

namespace dstrain {

// `bytes` in the largest unit that keeps the value at least 1, with `decimals` digits after the
// point (none for plain bytes).
std::string human_bytes(int64_t bytes, int decimals = 2);

// `value` rounded up to a multiple of `multiple` (> 0): the padding of a buffer split in equal
// parts.
inline int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace dstrain
