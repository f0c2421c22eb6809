#pragma once
// safetensors: the Hugging Face tensor file format, read and written without pickle.
//
// Layout: u64 little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"format": "pt"}}
// then the data section; offsets are bytes relative to its start. Tensors are contiguous from 0
// with no gaps or overlap and the file ends exactly at the last tensor's end.
//
// Reading memory-maps the file and validates the whole header up front, so a bad file fails at open
// with Error(kInput) naming the file and tensor, never later. Tensors are copied out of the mapping
// (no alignment is assumed, and the returned tensors own their memory). `read_range` copies a slice
// of a tensor's flattened elements, so a rank that owns one shard of a parameter reads only those
// bytes. Readable dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL; the writer handles any of them
// too.
//
// A model directory holds either `model.safetensors` or `model.safetensors.index.json`
//   {"metadata": {"total_size": bytes}, "weight_map": {"<tensor>": "<shard file>"}}
// plus the shard files; SafetensorsSet reads both forms through one interface.
//
// Thread safety: a reader is immutable after construction; concurrent reads are safe.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace dstrain::model {

// Largest accepted header, as in the reference implementation.
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
constexpr const char* kSafetensorsFile = "model.safetensors";
constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

struct TensorInfo {
  std::string name;
  std::string dtype;  // safetensors name, e.g. "BF16"
  torch::ScalarType scalar_type = torch::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets in the data section, [begin, end)
  uint64_t end = 0;
  int64_t numel() const;
};

// "BF16" etc. for a torch dtype; Error(kInput) for dtypes safetensors has no name for here.
std::string safetensors_dtype_name(torch::ScalarType type);

// One .safetensors file, memory-mapped read-only.
class SafetensorsFile {
 public:
  // Opens and validates; Error(kIo) if the file cannot be opened, Error(kInput) if it is malformed.
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::vector<std::string> names() const;  // in data-section order
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // Error(kInput) when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The whole tensor as a new CPU tensor of its stored dtype and shape.
  torch::Tensor read(const std::string& name) const;
  // Flattened elements [begin_elem, end_elem) as a new 1-D CPU tensor; Error(kInternal) when the
  // range is outside [0, numel].
  torch::Tensor read_range(const std::string& name, int64_t begin_elem, int64_t end_elem) const;

 private:
  void parse_header(uint64_t header_len);
  void check_layout() const;

  std::filesystem::path path_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of a model directory: model.safetensors, or the shards named by the index.
class SafetensorsSet {
 public:
  // Error(kInput) when the directory has neither file, the index is malformed or names a missing
  // shard or a tensor its shard does not hold. The index wins when both forms are present.
  explicit SafetensorsSet(const std::filesystem::path& dir);

  static bool present_in(const std::filesystem::path& dir);
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return owner_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  torch::Tensor read(const std::string& name) const { return file_of(name).read(name); }
  torch::Tensor read_range(const std::string& name, int64_t begin_elem, int64_t end_elem) const {
    return file_of(name).read_range(name, begin_elem, end_elem);
  }
  const SafetensorsFile& file_of(const std::string& name) const;

 private:
  void open_index(const std::filesystem::path& index);

  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> owner_;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes one file atomically (temp file + fsync + rename + fsync of the directory). Tensors are
// written in the given order, each converted on its own to contiguous CPU memory of `dtype` (or its
// own dtype), so writing never holds more than one converted tensor. The header is padded with
// spaces to a multiple of 8 bytes and carries `metadata` as __metadata__. Error(kInput) for
// duplicate or empty names or the reserved name "__metadata__"; Error(kIo) on I/O.
void write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                       std::optional<torch::ScalarType> dtype = std::nullopt,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes `tensors` into `dir` as model.safetensors when the total fits in `max_shard_bytes`, else
// as model-0000i-of-0000n.safetensors shards (filled in order) plus model.safetensors.index.json. A
// stale file of the other form is removed so the directory holds exactly one. Returns the files
// written.
std::vector<std::filesystem::path> write_safetensors_dir(
    const std::filesystem::path& dir, const NamedTensors& tensors, uint64_t max_shard_bytes,
    std::optional<torch::ScalarType> dtype = std::nullopt);

// A tensor written by write_safetensors_dir_streamed(): its name and full shape.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
// Produces the values of `spec` (that shape, any float dtype, any device) when they are written.
using TensorSource = std::function<torch::Tensor(const TensorSpec& spec)>;

// As write_safetensors_dir(), with every tensor stored as `dtype`, but the values are asked from
// `source` one tensor at a time, in order, as each is written (headers and the shard plan come
// from the specs alone), so the caller never holds more than one tensor. Error(kInternal) when
// `source` returns a tensor of another shape.
std::vector<std::filesystem::path> write_safetensors_dir_streamed(
    const std::filesystem::path& dir, const std::vector<TensorSpec>& specs, torch::ScalarType dtype,
    const TensorSource& source, uint64_t max_shard_bytes);

}  // namespace dstrain::model
