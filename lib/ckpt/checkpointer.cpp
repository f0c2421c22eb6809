#include "ckpt/checkpointer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "ckpt/layout.h"
#include "ckpt/shards.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"

namespace dstrain::ckpt {
namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);

// One of `slots` write slots of this node, held while alive: an flock'ed file per slot, so a
// crashed holder frees its slot with its last file descriptor.
class WriterSlot {
 public:
  WriterSlot(const std::string& lock_dir, const std::string& key, int slots) {
    if (slots <= 0) return;
    const std::string dir = lock_dir.empty() ? default_dir() : lock_dir;
    for (;;) {
      for (int i = 0; i < slots; ++i) {
        const std::string path = fmt::format("{}/dstrain-ckpt-{}-{}.lock", dir, key, i);
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd_ < 0) fail(ErrorKind::kIo, "cannot open the writer slot {}", path);
        if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
        ::close(fd_);
        fd_ = -1;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  ~WriterSlot() {
    if (fd_ >= 0) ::close(fd_);
  }
  WriterSlot(const WriterSlot&) = delete;
  WriterSlot& operator=(const WriterSlot&) = delete;

 private:
  static std::string default_dir() {
    const char* t = std::getenv("TMPDIR");
    return t != nullptr && *t != '\0' ? t : "/tmp";
  }
  int fd_ = -1;
};

// Rank 0's commit: waits for every rank's done record, then writes the manifest and `latest`.
void wait_for_ranks(const stdfs::path& tag_dir, int world_size, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (int r = 1; r < world_size; ++r) {
    for (;;) {
      if (stdfs::is_regular_file(tag_dir / shard_state_file_name(r))) break;
      const stdfs::path err = tag_dir / shard_error_file_name(r);
      if (stdfs::is_regular_file(err)) {
        fail(ErrorKind::kIo, "rank {} could not write its shard: {}", r, fs::read_file(err));
      }
      if (Clock::now() > deadline) {
        fail(ErrorKind::kIo, "rank {} did not record its shard in {} within {} s", r,
             tag_dir.string(), timeout_s);
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }
}

class ReaderStateIn : public StateIn {
 public:
  ReaderStateIn(const CheckpointReader& reader, const ComponentRecord& rec, std::string origin,
                int rank)
      : reader_(reader), rec_(rec), origin_(std::move(origin)), rank_(rank) {}
  int version() const override { return rec_.version; }
  const nlohmann::json& json() const override { return rec_.state; }
  torch::Tensor read(const std::string& kind, const std::string& param, int64_t begin,
                     int64_t end) const override {
    return reader_.read(kind, param, begin, end);
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> params(
      const std::string& kind) const override {
    return reader_.params(kind);
  }
  torch::Tensor rank_tensor(const std::string& name) const override {
    return rank_ < reader_.world_size() ? reader_.read_extra(rank_, name) : torch::Tensor();
  }
  const std::string& origin() const override { return origin_; }

 private:
  const CheckpointReader& reader_;
  const ComponentRecord& rec_;
  std::string origin_;
  int rank_;
};

}  // namespace

torch::Tensor host_copy(const torch::Tensor& t) {
  if (!t.is_cuda()) return t.clone(at::MemoryFormat::Contiguous);
  auto out = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
  return out.copy_(t);
}

torch::Tensor snapshot_tensor(const torch::Tensor& t, Snapshot how) {
  return how == Snapshot::kView && t.device().is_cpu() ? t : host_copy(t);
}

struct Checkpointer::Job {
  int64_t step = 0;
  std::string tag;
  stdfs::path tag_dir;
  std::vector<Piece> pieces;
  ExtraTensors extras;
  Manifest manifest;  // rank 0
  std::vector<std::pair<std::string, std::string>> small_files;
  double snapshot_s = 0;
};

Checkpointer::Checkpointer(CheckpointerOptions options, std::function<void()> barrier)
    : options_(std::move(options)), barrier_(std::move(barrier)) {
  if (options_.job_key.empty()) {
    options_.job_key = fmt::format("{:x}", std::hash<std::string>{}(options_.dir));
  }
}

Checkpointer::~Checkpointer() {
  if (in_flight_.valid()) in_flight_.wait();
}

void Checkpointer::add(std::string name, Stateful* component) {
  for (const auto& [n, c] : components_) {
    if (n == name) fail(ErrorKind::kInternal, "checkpoint component {} added twice", name);
  }
  components_.emplace_back(std::move(name), component);
}

void Checkpointer::save(int64_t step, Manifest header,
                        std::vector<std::pair<std::string, std::string>> small_files) {
  Stopwatch stall;
  collect(/*block=*/true);
  auto job = std::make_shared<Job>();
  job->step = step;
  job->tag = tag_for_step(step);
  job->tag_dir = stdfs::path(options_.dir) / job->tag;
  if (options_.rank == 0) prepare_tag_dir(options_.dir, job->tag);
  barrier_();
  header.tag = job->tag;
  header.step = step;
  header.world_size = options_.world_size;
  for (const auto& [name, component] : components_) {
    State s = component->snapshot_state(options_.async ? Snapshot::kCopy : Snapshot::kView);
    for (auto& p : s.pieces) job->pieces.push_back(std::move(p));
    for (auto& t : s.rank_tensors) job->extras.push_back(std::move(t));
    header.components[name] = {component->state_version(), std::move(s.json)};
  }
  job->manifest = std::move(header);
  job->small_files = std::move(small_files);
  job->snapshot_s = stall.seconds();
  if (options_.async) {
    in_flight_ = std::async(std::launch::async, [this, job] { return write(*job); });
  } else {
    finished_.push_back(write(*job));
  }
}

SaveResult Checkpointer::write(Job& job) const {
  SaveResult r;
  r.step = job.step;
  r.tag_dir = job.tag_dir.string();
  r.snapshot_s = job.snapshot_s;
  Stopwatch t;
  const int rank = options_.rank;
  if (options_.async) trace::name_thread("checkpoint");
  try {
    try {
      WriterSlot slot(options_.node_lock_dir, options_.job_key, options_.max_writers_per_node);
      const trace::Span span("checkpoint", "write shard", {"step", job.step});
      write_shard(r.tag_dir, rank, job.pieces, job.extras, {{"rank", rank}});
    } catch (const std::exception& e) {
      if (rank != 0) {
        try {
          fs::write_file_atomic(job.tag_dir / shard_error_file_name(rank), e.what());
        } catch (const std::exception&) {  // the disk may be full: rank 0 then times out
        }
      }
      throw;
    }
    job.pieces.clear();  // free the snapshot before the commit's wait
    job.extras.clear();
    r.bytes = static_cast<int64_t>(stdfs::file_size(job.tag_dir / shard_file_name(rank)));
    if (rank == 0) {
      const trace::Span span("checkpoint", "commit", {"step", job.step});
      wait_for_ranks(job.tag_dir, options_.world_size, options_.commit_timeout_s);
      for (const auto& [name, bytes] : job.small_files) {
        fs::write_file_atomic(job.tag_dir / name, bytes);
      }
      finalize(options_.dir, std::move(job.manifest), options_.keep_last);
      r.committed = true;
    }
    r.ok = true;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  r.write_s = t.seconds();
  return r;
}

void Checkpointer::collect(bool block) {
  if (!in_flight_.valid()) return;
  if (!block && in_flight_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  finished_.push_back(in_flight_.get());
}

std::vector<SaveResult> Checkpointer::take_finished() {
  collect(/*block=*/false);
  return std::exchange(finished_, {});
}

void Checkpointer::wait() {
  collect(/*block=*/true);
}

Manifest Checkpointer::restore(const std::string& tag_dir) {
  const CheckpointReader reader(tag_dir);
  const Manifest& m = reader.manifest();
  for (const auto& [name, rec] : m.components) {
    const bool known = std::any_of(components_.begin(), components_.end(),
                                   [&](const auto& c) { return c.first == name; });
    if (!known) {
      fail(ErrorKind::kInput, "checkpoint {} holds \"{}\" state, which this run does not have",
           tag_dir, name);
    }
  }
  for (const auto& [name, component] : components_) {
    const ComponentRecord* rec = m.component(name);
    if (rec == nullptr) {
      fail(ErrorKind::kInput, "checkpoint {} has no \"{}\" state, which this run needs", tag_dir,
           name);
    }
    if (rec->version > component->state_version()) {
      fail(ErrorKind::kInput,
           "checkpoint {}: \"{}\" state version {} is newer than this dstrain reads ({})", tag_dir,
           name, rec->version, component->state_version());
    }
    component->restore_state(
        ReaderStateIn(reader, *rec, fmt::format("{}: state \"{}\"", tag_dir, name), options_.rank));
  }
  return m;
}

}  // namespace dstrain::ckpt
