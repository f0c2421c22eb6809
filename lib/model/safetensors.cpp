#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this reader copies bytes as they are");

namespace dstrain::model {
namespace {

using nlohmann::json;

struct DtypeEntry {
  const char* name;
  torch::ScalarType type;
};

constexpr DtypeEntry kDtypes[] = {
    {"F64", torch::kDouble},    {"F32", torch::kFloat}, {"F16", torch::kHalf},
    {"BF16", torch::kBFloat16}, {"I64", torch::kLong},  {"I32", torch::kInt},
    {"I16", torch::kShort},     {"I8", torch::kChar},   {"U8", torch::kByte},
    {"BOOL", torch::kBool},
};

const DtypeEntry* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += std::string(s.empty() ? "" : ", ") + d.name;
  return s;
}

// Non-negative integer that fits in int64 (shape dims, offsets).
bool as_u64(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) return false;
  out = v.get<uint64_t>();
  return out <= static_cast<uint64_t>(INT64_MAX);
}

// Parses the header JSON, failing on duplicate top-level keys (the JSON library would keep the
// last).
json parse_header_json(const char* text, size_t len, const std::string& where) {
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 &&
        !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  json doc;
  try {
    doc = json::parse(text, text + len, on_event);
  } catch (const json::parse_error& e) {
    fail(ErrorKind::kInput, "{}: safetensors header is not valid JSON: {}", where, e.what());
  }
  if (!duplicate.empty())
    fail(ErrorKind::kInput, "{}: safetensors header names tensor '{}' twice", where, duplicate);
  if (!doc.is_object())
    fail(ErrorKind::kInput, "{}: safetensors header must be a JSON object", where);
  return doc;
}

TensorInfo parse_entry(const std::string& name, const json& e, const std::string& where) {
  auto bad = [&](const std::string& what) {
    fail(ErrorKind::kInput, "{}: safetensors tensor '{}': {}", where, name, what);
  };
  if (!e.is_object()) bad("entry must be an object");
  TensorInfo t;
  t.name = name;
  if (!e.contains("dtype") || !e["dtype"].is_string()) bad("'dtype' must be a string");
  t.dtype = e["dtype"].get<std::string>();
  const DtypeEntry* d = find_dtype(t.dtype);
  if (d == nullptr)
    bad("unknown or unsupported dtype '" + t.dtype + "' (supported: " + known_dtypes() + ")");
  t.scalar_type = d->type;
  if (!e.contains("shape") || !e["shape"].is_array()) bad("'shape' must be a list of integers");
  for (const json& dim : e["shape"]) {
    uint64_t v = 0;
    if (!as_u64(dim, v))
      bad("'shape' must be a list of non-negative integers, got " + e["shape"].dump());
    t.shape.push_back(static_cast<int64_t>(v));
  }
  const json& off = e.contains("data_offsets") ? e["data_offsets"] : json();
  if (!off.is_array() || off.size() != 2 || !as_u64(off[0], t.begin) || !as_u64(off[1], t.end) ||
      t.begin > t.end)
    bad("'data_offsets' must be [begin, end] with 0 <= begin <= end");
  // numel * element size must equal the byte span, computed without overflow.
  unsigned __int128 bytes = c10::elementSize(t.scalar_type);
  for (int64_t dim : t.shape) bytes = dim == 0 ? 0 : bytes * static_cast<uint64_t>(dim);
  if (bytes != t.end - t.begin)
    bad(fmt::format("shape {} of {} needs {} bytes but data_offsets span {}", e["shape"].dump(),
                    t.dtype, static_cast<uint64_t>(std::min<unsigned __int128>(bytes, UINT64_MAX)),
                    t.end - t.begin));
  return t;
}

std::map<std::string, std::string> parse_metadata(const json& m, const std::string& where) {
  if (!m.is_object())
    fail(ErrorKind::kInput, "{}: safetensors __metadata__ must be an object of strings", where);
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : m.items()) {
    if (!v.is_string())
      fail(ErrorKind::kInput, "{}: safetensors __metadata__ value of '{}' must be a string, got {}",
           where, k, v.dump());
    out[k] = v.get<std::string>();
  }
  return out;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string safetensors_dtype_name(torch::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  fail(ErrorKind::kInput, "dtype {} cannot be stored in safetensors here (supported: {})",
       c10::toString(type), known_dtypes());
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "cannot open {}: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "cannot stat {}: {}", path.string(), std::strerror(err));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED)
      fail(ErrorKind::kIo, "cannot mmap {}: {}", path.string(), std::strerror(err));
    map_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  try {
    if (size_ < 8)
      fail(ErrorKind::kInput, "{}: file is {} bytes, too small for a safetensors header length",
           path.string(), size_);
    uint64_t header_len = 0;
    std::memcpy(&header_len, map_, 8);
    parse_header(header_len);
    check_layout();
  } catch (...) {
    if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
}

void SafetensorsFile::parse_header(uint64_t header_len) {
  const std::string where = path_.string();
  if (header_len > kSafetensorsMaxHeaderBytes)
    fail(ErrorKind::kInput, "{}: safetensors header length {} exceeds the limit of {} bytes", where,
         header_len, kSafetensorsMaxHeaderBytes);
  if (header_len > size_ - 8)
    fail(ErrorKind::kInput,
         "{}: safetensors header length {} runs past the end of the {}-byte file", where,
         header_len, size_);
  data_start_ = 8 + header_len;
  const json doc = parse_header_json(reinterpret_cast<const char*>(map_ + 8), header_len, where);
  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      metadata_ = parse_metadata(entry, where);
      continue;
    }
    tensors_.emplace(name, parse_entry(name, entry, where));
  }
}

// Tensors must tile the data section exactly: sorted by offset, each starts where the previous
// ended, the first at 0 and the last at the end of the file.
void SafetensorsFile::check_layout() const {
  std::vector<const TensorInfo*> order;
  for (const auto& [name, t] : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const std::string where = path_.string();
  uint64_t expected = 0;
  for (const TensorInfo* t : order) {
    if (t->begin != expected)
      fail(ErrorKind::kInput,
           "{}: safetensors tensor '{}' starts at byte {} of the data section; "
           "expected {} (tensors must be contiguous, without gaps or overlap)",
           where, t->name, t->begin, expected);
    expected = t->end;
  }
  const uint64_t data_size = size_ - data_start_;
  if (expected != data_size)
    fail(ErrorKind::kInput,
         "{}: safetensors data section is {} bytes but the tensors cover {} "
         "(the file must end exactly at the last tensor)",
         where, data_size, expected);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<const TensorInfo*> order;
  for (const auto& [name, t] : tensors_) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  std::vector<std::string> out;
  for (const TensorInfo* t : order) out.push_back(t->name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    fail(ErrorKind::kInput, "{}: no tensor named '{}'", path_.string(), name);
  return it->second;
}

torch::Tensor SafetensorsFile::read(const std::string& name) const {
  const TensorInfo& t = info(name);
  torch::Tensor out = torch::empty(t.shape, torch::TensorOptions().dtype(t.scalar_type));
  if (t.end > t.begin) std::memcpy(out.data_ptr(), map_ + data_start_ + t.begin, t.end - t.begin);
  return out;
}

torch::Tensor SafetensorsFile::read_range(const std::string& name, int64_t begin_elem,
                                          int64_t end_elem) const {
  const TensorInfo& t = info(name);
  if (begin_elem < 0 || begin_elem > end_elem || end_elem > t.numel())
    fail(ErrorKind::kInternal, "{}: tensor '{}' has {} elements; cannot read range [{}, {})",
         path_.string(), name, t.numel(), begin_elem, end_elem);
  const size_t elem = c10::elementSize(t.scalar_type);
  torch::Tensor out =
      torch::empty({end_elem - begin_elem}, torch::TensorOptions().dtype(t.scalar_type));
  const size_t bytes = static_cast<size_t>(end_elem - begin_elem) * elem;
  if (bytes > 0)
    std::memcpy(out.data_ptr(),
                map_ + data_start_ + t.begin + static_cast<size_t>(begin_elem) * elem, bytes);
  return out;
}

}  // namespace dstrain::model
