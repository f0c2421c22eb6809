// Writing safetensors files: one file atomically, or a directory with optional sharding and index.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "model/safetensors.h"

namespace dstrain::model {
namespace stdfs = std::filesystem;
using nlohmann::json;

namespace {

// A file written under a temporary name and renamed over the target only on commit(), so readers
// never see a half-written model file. Destruction without commit removes the temporary.
class AtomicFile {
 public:
  explicit AtomicFile(const stdfs::path& target) : target_(target) {
    tmp_ = target.string() + ".tmp." + std::to_string(::getpid()) + "." +
           std::to_string(std::random_device{}());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(ErrorKind::kIo, "cannot create {}: {}", tmp_.string(), std::strerror(errno));
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  void write(const void* data, size_t len) {
    const char* p = static_cast<const char*>(data);
    while (len > 0) {
      const ssize_t n = ::write(fd_, p, len);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(ErrorKind::kIo, "cannot write {}: {}", tmp_.string(), std::strerror(errno));
      p += n;
      len -= static_cast<size_t>(n);
    }
  }
  void commit() {
    if (::fsync(fd_) != 0)
      fail(ErrorKind::kIo, "cannot fsync {}: {}", tmp_.string(), std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), target_.c_str()) != 0)
      fail(ErrorKind::kIo, "cannot rename {} to {}: {}", tmp_.string(), target_.string(),
           std::strerror(errno));
    committed_ = true;
    fs::fsync_dir(target_.parent_path());
  }

 private:
  stdfs::path target_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

using Dtype = std::optional<torch::ScalarType>;

torch::ScalarType stored_type(const torch::Tensor& t, Dtype dtype) {
  return dtype.value_or(t.scalar_type());
}

uint64_t byte_size(const torch::Tensor& t, Dtype dtype) {
  return static_cast<uint64_t>(t.numel()) * c10::elementSize(stored_type(t, dtype));
}

std::string build_header(const stdfs::path& path, const NamedTensors& tensors, Dtype dtype,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__" || header.contains(name))
      fail(ErrorKind::kInput, "{}: tensor name '{}' is empty, reserved or repeated", path.string(),
           name);
    const uint64_t n = byte_size(t, dtype);
    header[name] = {{"dtype", safetensors_dtype_name(stored_type(t, dtype))},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

std::string shard_name(size_t i, size_t n) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
}

// Groups tensors in order into shards of at most max_bytes (a larger tensor gets a shard of its
// own).
std::vector<NamedTensors> plan_shards(const NamedTensors& tensors, uint64_t max_bytes,
                                      Dtype dtype) {
  std::vector<NamedTensors> shards(1);
  uint64_t used = 0;
  for (const auto& nt : tensors) {
    const uint64_t n = byte_size(nt.second, dtype);
    if (!shards.back().empty() && used + n > max_bytes) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(nt);
    used += n;
  }
  return shards;
}

void remove_if_present(const stdfs::path& p) {
  std::error_code ec;
  stdfs::remove(p, ec);
}

uint64_t spec_bytes(const TensorSpec& spec, torch::ScalarType dtype) {
  uint64_t n = 1;
  for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
  return n * c10::elementSize(dtype);
}

// One streamed file: header from the specs, then each tensor's bytes as `source` produces it.
void write_streamed_file(const stdfs::path& path, const std::vector<TensorSpec>& specs,
                         torch::ScalarType dtype, const TensorSource& source) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorSpec& spec : specs) {
    if (spec.name.empty() || spec.name == "__metadata__" || header.contains(spec.name))
      fail(ErrorKind::kInput, "{}: tensor name '{}' is empty, reserved or repeated", path.string(),
           spec.name);
    const uint64_t n = spec_bytes(spec, dtype);
    header[spec.name] = {{"dtype", safetensors_dtype_name(dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  AtomicFile out(path);
  const uint64_t len = text.size();
  out.write(&len, 8);
  out.write(text.data(), text.size());
  for (const TensorSpec& spec : specs) {
    const torch::Tensor t = source(spec);
    if (!t.defined() || t.sizes().vec() != spec.shape)
      fail(ErrorKind::kInternal, "{}: the values of '{}' do not have its declared shape ({} dims)",
           path.string(), spec.name, spec.shape.size());
    const torch::Tensor c = t.detach().to(torch::kCPU, dtype).contiguous();
    if (c.numel() > 0) out.write(c.data_ptr(), spec_bytes(spec, dtype));
  }
  out.commit();
}

// One file, or `shard_count` shard files and the index: `write_shard(i, path)` writes shard i and
// returns its tensors' names and stored byte sizes. Removes the layout not written (a single file
// replaces an index and the other way round). Returns the files written, the index last.
std::vector<stdfs::path> write_file_or_shards(
    const stdfs::path& dir, size_t shard_count,
    const std::function<std::vector<std::pair<std::string, uint64_t>>(size_t, const stdfs::path&)>&
        write_shard) {
  if (shard_count == 1) {
    write_shard(0, dir / kSafetensorsFile);
    remove_if_present(dir / kSafetensorsIndexFile);
    return {dir / kSafetensorsFile};
  }
  std::vector<stdfs::path> written;
  json weight_map = json::object();
  uint64_t total = 0;
  for (size_t i = 0; i < shard_count; ++i) {
    const std::string file = shard_name(i, shard_count);
    for (const auto& [name, bytes] : write_shard(i, dir / file)) {
      weight_map[name] = file;
      total += bytes;
    }
    written.push_back(dir / file);
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  fs::write_file_atomic(dir / kSafetensorsIndexFile, index.dump(2) + "\n");
  remove_if_present(dir / kSafetensorsFile);
  written.push_back(dir / kSafetensorsIndexFile);
  return written;
}

}  // namespace

void write_safetensors(const stdfs::path& path, const NamedTensors& tensors, Dtype dtype,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = build_header(path, tensors, dtype, metadata);
  if (!path.parent_path().empty()) fs::create_dirs(path.parent_path());
  AtomicFile out(path);
  const uint64_t len = header.size();
  out.write(&len, 8);
  out.write(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    const torch::Tensor c = t.detach().to(torch::kCPU, stored_type(t, dtype)).contiguous();
    if (c.numel() > 0) out.write(c.data_ptr(), byte_size(c, std::nullopt));
  }
  out.commit();
}

std::vector<stdfs::path> write_safetensors_dir(const stdfs::path& dir, const NamedTensors& tensors,
                                               uint64_t max_shard_bytes, Dtype dtype) {
  fs::create_dirs(dir);
  const std::vector<NamedTensors> shards = plan_shards(tensors, max_shard_bytes, dtype);
  return write_file_or_shards(dir, shards.size(), [&](size_t i, const stdfs::path& path) {
    write_safetensors(path, shards[i], dtype);
    std::vector<std::pair<std::string, uint64_t>> names;
    for (const auto& [name, t] : shards[i]) names.emplace_back(name, byte_size(t, dtype));
    return names;
  });
}

std::vector<stdfs::path> write_safetensors_dir_streamed(const stdfs::path& dir,
                                                        const std::vector<TensorSpec>& specs,
                                                        torch::ScalarType dtype,
                                                        const TensorSource& source,
                                                        uint64_t max_shard_bytes) {
  fs::create_dirs(dir);
  // Shards filled in order, a tensor larger than the limit alone in its own (as plan_shards).
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t used = 0;
  for (const TensorSpec& spec : specs) {
    const uint64_t n = spec_bytes(spec, dtype);
    if (!shards.back().empty() && used + n > max_shard_bytes) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(spec);
    used += n;
  }
  return write_file_or_shards(dir, shards.size(), [&](size_t i, const stdfs::path& path) {
    write_streamed_file(path, shards[i], dtype, source);
    std::vector<std::pair<std::string, uint64_t>> names;
    for (const TensorSpec& spec : shards[i]) names.emplace_back(spec.name, spec_bytes(spec, dtype));
    return names;
  });
}

}  // namespace dstrain::model
