#include "ckpt/shards.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "ckpt/layout.h"
#include "core/error.h"
#include "core/fs.h"
#include "model/safetensors.h"

namespace dstrain::ckpt {
namespace stdfs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kSep = '|';

std::string piece_name(const Piece& p) {
  std::string name =
      fmt::format("{}{}{}{}{}{}{}", p.kind, kSep, p.param, kSep, p.begin, kSep, p.end);
  if (p.columns) name += fmt::format("{}c{}+{}", kSep, p.columns->offset, p.columns->length);
  return name;
}

// Splits "<kind>|<param>|<begin>|<end>[|c<offset>+<length>]"; false for extras and anything else.
bool parse_piece_name(const std::string& name, std::string* kind, std::string* param,
                      int64_t* begin, int64_t* end, std::optional<Columns>* columns) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t sep = name.find(kSep, start);
    parts.push_back(name.substr(start, sep == std::string::npos ? sep : sep - start));
    if (sep == std::string::npos) break;
    start = sep + 1;
  }
  if (parts.size() != 4 && parts.size() != 5) return false;
  try {
    *kind = parts[0];
    *param = parts[1];
    *begin = std::stoll(parts[2]);
    *end = std::stoll(parts[3]);
    columns->reset();
    if (parts.size() == 5) {
      const std::string& c = parts[4];
      const size_t plus = c.find('+');
      if (c.empty() || c[0] != 'c' || plus == std::string::npos) return false;
      *columns = Columns{std::stoll(c.substr(1, plus - 1)), std::stoll(c.substr(plus + 1))};
      if ((*columns)->offset < 0 || (*columns)->length <= 0) return false;
    }
  } catch (const std::exception&) {
    return false;
  }
  return *begin >= 0 && *end >= *begin;
}

std::string extra_name(const std::string& name) {
  return "extra" + std::string(1, kSep) + name;
}

json read_json_file(const stdfs::path& path) {
  try {
    return json::parse(fs::read_file(path));
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: not valid JSON: {}", path.string(), e.what());
  }
}

}  // namespace

std::string file_crc32(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) fail(ErrorKind::kIo, "cannot read {}", path);
  std::vector<unsigned char> buf(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    crc = crc32_z(crc, buf.data(), n);
  }
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) fail(ErrorKind::kIo, "cannot read {}", path);
  return fmt::format("{:08x}", static_cast<uint32_t>(crc));
}

void write_shard(const std::string& tag_dir, int rank, const std::vector<Piece>& pieces,
                 const ExtraTensors& extras, const json& rank_state) {
  model::NamedTensors tensors;
  json shapes = json::object();
  json names = json::array();
  for (const auto& p : pieces) {
    if (p.data.numel() != p.end - p.begin) {
      fail(ErrorKind::kInternal, "checkpoint piece {} has {} elements", piece_name(p),
           p.data.numel());
    }
    tensors.emplace_back(piece_name(p), p.data.to(torch::kFloat32));
    names.push_back(piece_name(p));
    shapes[p.param] = p.shape;
  }
  for (const auto& [name, t] : extras) tensors.emplace_back(extra_name(name), t);
  const stdfs::path shard = stdfs::path(tag_dir) / shard_file_name(rank);
  model::write_safetensors(shard, tensors, std::nullopt, {{"format", "dstrain-shard"}});
  json record = {{"rank", rank},
                 {"file", shard_file_name(rank)},
                 {"bytes", stdfs::file_size(shard)},
                 {"crc32", file_crc32(shard.string())},
                 {"shapes", shapes},
                 {"pieces", names},
                 {"state", rank_state}};
  fs::write_file_atomic(stdfs::path(tag_dir) / shard_state_file_name(rank), record.dump(1));
}

void finalize(const std::string& dir, Manifest manifest, int64_t keep_last) {
  const stdfs::path tag_dir = stdfs::path(dir) / manifest.tag;
  manifest.files.clear();
  for (int r = 0; r < manifest.world_size; ++r) {
    const stdfs::path p = tag_dir / shard_state_file_name(r);
    if (!stdfs::is_regular_file(p)) {
      fail(ErrorKind::kIo, "checkpoint {}: rank {} did not finish its shard ({} missing)",
           tag_dir.string(), r, p.filename().string());
    }
    const json rec = read_json_file(p);
    manifest.files.push_back({rec.at("file").get<std::string>(), rec.at("bytes").get<int64_t>(),
                              rec.at("crc32").get<std::string>()});
  }
  // Every other file of the checkpoint (rank records, config, tokenizer files) is small: record
  // its size and checksum too, after the shards, so `files[r]` stays rank r's shard.
  std::vector<stdfs::path> others;
  for (const auto& e : stdfs::directory_iterator(tag_dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name != kManifestFile && e.path().extension() != ".safetensors") {
      others.push_back(e.path());
    }
  }
  std::sort(others.begin(), others.end());
  for (const auto& p : others) {
    manifest.files.push_back(
        {p.filename().string(), static_cast<int64_t>(stdfs::file_size(p)), file_crc32(p.string())});
  }
  fs::write_file_atomic(tag_dir / kManifestFile, manifest_to_json(manifest).dump(1));
  write_latest(dir, manifest.tag);
  prune(dir, keep_last, manifest.tag);
}

CheckpointReader::CheckpointReader(std::string tag_dir) : dir_(std::move(tag_dir)) {
  manifest_ = read_manifest(dir_);
  world_size_ = manifest_.world_size;
  if (static_cast<int>(manifest_.files.size()) < world_size_) {
    fail(ErrorKind::kInput, "{}/{}: lists {} files for {} ranks", dir_, kManifestFile,
         manifest_.files.size(), world_size_);
  }
  files_.resize(world_size_);
  for (int r = 0; r < world_size_; ++r) index_rank(r);
}

CheckpointReader::~CheckpointReader() = default;

void CheckpointReader::index_rank(int rank) {
  const stdfs::path p = stdfs::path(dir_) / shard_state_file_name(rank);
  if (!stdfs::is_regular_file(p)) {
    fail(ErrorKind::kInput, "checkpoint {}: {} is missing", dir_, p.filename().string());
  }
  rank_json_.push_back(read_json_file(p));
  const json& rec = rank_json_.back();
  for (const auto& [param, shape] : rec.at("shapes").items()) {
    shapes_.emplace(param, shape.get<std::vector<int64_t>>());
  }
  // The piece list is in the small JSON, so indexing opens no shard; a shard is opened (and its
  // checksum verified) only when a read needs it.
  for (const auto& jn : rec.at("pieces")) {
    const auto name = jn.get<std::string>();
    std::string kind, param;
    int64_t begin = 0, end = 0;
    std::optional<Columns> columns;
    if (parse_piece_name(name, &kind, &param, &begin, &end, &columns)) {
      index_[{kind, param}].push_back(Entry{rank, name, begin, end, columns});
    }
  }
}

const model::SafetensorsFile& CheckpointReader::shard(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!files_[rank]) {
    const FileRecord& f = manifest_.files.at(rank);
    const std::string path = (stdfs::path(dir_) / f.name).string();
    if (!stdfs::is_regular_file(path)) {
      fail(ErrorKind::kInput, "checkpoint {}: shard {} is missing", dir_, path);
    }
    const std::string crc = file_crc32(path);
    if (crc != f.crc32) {
      fail(ErrorKind::kInput,
           "checkpoint shard {} is corrupted: crc32 {} but the manifest records {}", path, crc,
           f.crc32);
    }
    files_[rank] = std::make_unique<model::SafetensorsFile>(path);
  }
  return *files_[rank];
}

json CheckpointReader::rank_state(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    fail(ErrorKind::kInput, "checkpoint {} has no rank {}", dir_, rank);
  }
  return rank_json_.at(rank).at("state");
}

torch::Tensor CheckpointReader::read(const std::string& kind, const std::string& param,
                                     int64_t begin, int64_t end) const {
  auto out = torch::empty({end - begin}, torch::kFloat32);
  int64_t covered = 0;
  const auto it = index_.find({kind, param});
  if (it != index_.end()) {
    for (const Entry& e : it->second) {
      if (e.columns) {
        covered += read_columns(e, param, begin, end, out);
        continue;
      }
      const int64_t lo = std::max(begin, e.begin);
      const int64_t hi = std::min(end, e.end);
      if (lo >= hi) continue;
      auto part = shard(e.rank).read_range(e.tensor, lo - e.begin, hi - e.begin);
      out.narrow(0, lo - begin, hi - lo).copy_(part);
      covered += hi - lo;
    }
  }
  // Pieces never overlap (each element is owned by exactly one rank), so a full count is coverage.
  if (covered != end - begin) {
    fail(ErrorKind::kInput, "checkpoint {} does not hold {} of {} elements [{}, {})", dir_, kind,
         param, begin, end);
  }
  return out;
}

int64_t CheckpointReader::read_columns(const Entry& e, const std::string& param, int64_t begin,
                                       int64_t end, torch::Tensor& out) const {
  const std::vector<int64_t>& shape = shapes_.at(param);
  if (shape.size() != 2 || e.columns->offset + e.columns->length > shape[1]) {
    fail(ErrorKind::kInput, "checkpoint {}: piece {} is a column slice of {} {}", dir_, e.tensor,
         param, c10::str(c10::IntArrayRef(shape)));
  }
  const int64_t W = shape[1], o = e.columns->offset, l = e.columns->length;
  // The rows both the request and the piece reach, and the piece's elements of them, read once.
  const int64_t first = std::max(begin / W, e.begin / l);
  const int64_t last = std::min((end - 1) / W, (e.end - 1) / l);
  if (first > last) return 0;
  const int64_t from = std::max(e.begin, first * l), to = std::min(e.end, (last + 1) * l);
  const torch::Tensor data = shard(e.rank).read_range(e.tensor, from - e.begin, to - e.begin);
  int64_t copied = 0;
  // Local elements [a, b) of one row (a, b within [row·l, (row+1)·l)): whole row·W + o + ...
  const auto copy_row = [&](int64_t row, int64_t a, int64_t b) {
    const int64_t w0 = row * W + o + (a - row * l);
    const int64_t lo = std::max(w0, begin), hi = std::min(w0 + (b - a), end);
    if (lo >= hi) return;
    out.narrow(0, lo - begin, hi - lo).copy_(data.narrow(0, a - from + (lo - w0), hi - lo));
    copied += hi - lo;
  };
  // Rows whole in the piece and whose columns lie inside the request: one strided copy.
  int64_t full_first = std::max((from + l - 1) / l, (begin - o + W - 1) / W);
  const int64_t last_inside = end - o - l;  // row·W <= this: the row's columns end by `end`
  int64_t full_last = std::min(to / l - 1, last_inside >= 0 ? last_inside / W : -1);
  full_first = std::max(full_first, first);
  full_last = std::min(full_last, last);
  if (full_first <= full_last) {
    const int64_t rows = full_last - full_first + 1;
    torch::Tensor target =
        out.as_strided({rows, l}, {W, 1}, out.storage_offset() + full_first * W + o - begin);
    target.copy_(data.narrow(0, full_first * l - from, rows * l).view({rows, l}));
    copied += rows * l;
  }
  for (int64_t row = first; row <= last; ++row) {
    if (row >= full_first && row <= full_last) continue;
    copy_row(row, std::max(from, row * l), std::min(to, (row + 1) * l));
  }
  return copied;
}

torch::Tensor CheckpointReader::read_full(const std::string& kind, const std::string& param) const {
  const auto it = shapes_.find(param);
  if (it == shapes_.end())
    fail(ErrorKind::kInput, "checkpoint {} has no parameter {}", dir_, param);
  int64_t numel = 1;
  for (int64_t d : it->second) numel *= d;
  return read(kind, param, 0, numel).view(it->second);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> CheckpointReader::params(
    const std::string& kind) const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [p, shape] : shapes_) {  // a std::map: sorted by name
    if (index_.count({kind, p}) != 0) out.emplace_back(p, shape);
  }
  return out;
}

torch::Tensor CheckpointReader::read_extra(int rank, const std::string& name) const {
  const auto& f = shard(rank);
  const std::string n = extra_name(name);
  return f.contains(n) ? f.read(n) : torch::Tensor();
}

}  // namespace dstrain::ckpt
