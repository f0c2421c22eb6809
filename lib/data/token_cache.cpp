#include "data/token_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "data/content_hash.h"
#include "data/token_file.h"
#include "data/tokenize.h"

namespace dstrain::data {
namespace {

namespace stdfs = std::filesystem;

constexpr int kCacheVersion = 1;
constexpr int32_t kIdsPerBlock = 4096;  // fingerprint work unit; fixed, so threads don't matter

// Texts whose ids depend on normalization, pre-tokenization and merges beyond single tokens.
constexpr const char* kProbes[] = {
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\nand\r\nnewlines \n\n  ",
    "Numbers 1234567890 3.14159 1e-9 and symbols #$%&*()[]{}<>~^|\\",
    "I'm you're they'll we've she'd it's DON'T",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 中文字符, 日本語のテキスト, 한국어, العربية, "
    "עברית, हिन्दी",
    "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD, decomposed e\xCC\x81 and composed "
    "\xC3\xA9",
    "code: for (int i = 0; i < n; ++i) { x += y[i]; }",
};

std::string_view id_bytes(const std::vector<int32_t>& ids) {
  return {reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t)};
}

// Hash of ids [begin, end): each id's text, and that text encoded again.
std::string hash_id_block(const tokenizer::Tokenizer& tok, int32_t begin, int32_t end) {
  ContentHash h;
  for (int32_t id = begin; id < end; ++id) {
    try {
      const std::string text = tok.decode({id});
      h.update(text);
      h.update(std::string_view("\0", 1));
      h.update(id_bytes(tok.encode(text)));
    } catch (const Error& e) {
      h.update(fmt::format("!{}", to_string(e.kind())));  // a hole in the vocabulary, or bytes
    }
  }
  return h.hex();
}

std::vector<std::string> hash_vocabulary(const tokenizer::Tokenizer& tok, int threads) {
  const int64_t vocab = tok.vocab_size();
  const size_t blocks = static_cast<size_t>((vocab + kIdsPerBlock - 1) / kIdsPerBlock);
  std::vector<std::string> digests(blocks);
  std::vector<std::exception_ptr> errors(blocks);
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t b = next++; b < blocks; b = next++) {
      const auto begin = static_cast<int32_t>(b * kIdsPerBlock);
      try {
        digests[b] = hash_id_block(
            tok, begin,
            static_cast<int32_t>(std::min<int64_t>(vocab, int64_t{begin} + kIdsPerBlock)));
      } catch (...) {
        errors[b] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> workers;
  const size_t n = std::min<size_t>(static_cast<size_t>(tokenize_threads(threads)), blocks);
  for (size_t t = 1; t < n; ++t) workers.emplace_back(work);
  work();
  for (auto& w : workers) w.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return digests;
}

std::string format_name(Format f) {
  switch (f) {
    case Format::kAuto:
      return "auto";
    case Format::kText:
      return "text";
    case Format::kJsonl:
      return "jsonl";
    case Format::kTokens:
      return "tokens";
    case Format::kPromptCompletion:
      return "prompt_completion";
    case Format::kParquet:
      return "parquet";
  }
  return "?";
}

// An exclusive flock(2) on `path`, held for the object's lifetime.
class FileLock {
 public:
  FileLock(const std::string& path, const std::string& source) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(ErrorKind::kIo, "cannot open {}: {}", path, std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
    log::info("data: waiting for another process to tokenize {} (it holds {})", source, path);
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) fail(ErrorKind::kIo, "cannot lock {}: {}", path, std::strerror(errno));
    }
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

struct Entry {
  stdfs::path tokens, meta, lock;
};

Entry entry_files(const std::string& dir, const std::string& key) {
  const stdfs::path d(dir);
  return {d / (key + ".tokens"), d / (key + ".json"), d / (key + ".lock")};
}

std::optional<Corpus> read_entry(const Entry& e, const std::string& key_text, SourceStats& stats) {
  std::error_code ec;
  if (!stdfs::exists(e.tokens, ec) || !stdfs::exists(e.meta, ec)) return std::nullopt;
  try {
    const auto meta = nlohmann::json::parse(fs::read_file(e.meta));
    if (meta.at("key_text").get<std::string>() != key_text) {
      log::warn("data: cache entry {} belongs to other data; making it again", e.meta.string());
      return std::nullopt;
    }
    Corpus corpus = read_token_file(e.tokens.string());
    if (corpus.num_documents() != meta.at("documents").get<int64_t>() ||
        corpus.num_tokens() != meta.at("tokens").get<int64_t>()) {
      log::warn("data: cache entry {} does not match its description; making it again",
                e.tokens.string());
      return std::nullopt;
    }
    stats.null_rows = meta.at("null_rows").get<int64_t>();
    return corpus;
  } catch (const std::exception& ex) {  // Error from the reader, or bad JSON
    log::warn("data: cache entry {} does not read back ({}); making it again", e.tokens.string(),
              ex.what());
    return std::nullopt;
  }
}

void write_entry(const Entry& e, const std::string& key_text, const std::string& source,
                 const Corpus& corpus, const SourceStats& stats, int64_t vocab_size) {
  try {
    write_token_file(e.tokens.string(), corpus, vocab_size);
    const nlohmann::json meta = {{"key_text", key_text},
                                 {"source", source},
                                 {"documents", corpus.num_documents()},
                                 {"tokens", corpus.num_tokens()},
                                 {"null_rows", stats.null_rows}};
    fs::write_file_atomic(e.meta, meta.dump(2) + "\n");
    log::info("data: {}: tokens cached in {}", source, e.tokens.string());
  } catch (const Error& ex) {
    log::warn("data: cannot cache the tokens of {}: {}", source, ex.what());
  }
}

// The entry `key` of a staged copy, when it is there and reads back.
std::optional<Corpus> read_staged_entry(const std::string& staged_dir, const std::string& key,
                                        const std::string& key_text, SourceStats& stats) {
  if (staged_dir.empty()) return std::nullopt;
  const Entry entry = entry_files(staged_dir, key);
  std::optional<Corpus> hit = read_entry(entry, key_text, stats);
  if (hit) log::info("data: tokens from the node-local copy {}", entry.tokens.string());
  return hit;
}

}  // namespace

std::string tokenizer_fingerprint(const tokenizer::Tokenizer& tok, int threads) {
  ContentHash h;
  const auto id = [](std::optional<int32_t> v) { return v ? std::to_string(*v) : "none"; };
  h.update(fmt::format("vocab_size {} eos {} bos {} pad {}\n", tok.vocab_size(), id(tok.eos_id()),
                       id(tok.bos_id()), id(tok.pad_id())));
  for (const std::string& digest : hash_vocabulary(tok, threads)) h.update(digest);
  for (const char* probe : kProbes) {
    try {
      h.update(id_bytes(tok.encode(probe)));
    } catch (const Error& e) {
      h.update(fmt::format("!{}", to_string(e.kind())));
    }
  }
  return h.hex();
}

std::string cache_key_text(const std::vector<std::string>& files, const SourceOptions& o,
                           int64_t max_length, const tokenizer::Tokenizer& tokenizer) {
  const Format requested = parse_format(o.format);
  std::string text = fmt::format(
      "dstrain token cache {}\ntokenizer {}\nmax_length {}\nformat {} text_field {} document "
      "{}\n",
      kCacheVersion, tokenizer_fingerprint(tokenizer, o.threads), max_length,
      nlohmann::json(o.format).dump(), nlohmann::json(o.text_field).dump(),
      nlohmann::json(o.document).dump());
  if (requested == Format::kPromptCompletion) {  // other formats keep their keys
    text +=
        fmt::format("prompt_field {} completion_field {}\n", nlohmann::json(o.prompt_field).dump(),
                    nlohmann::json(o.completion_field).dump());
  }
  for (const std::string& file : files) {
    text +=
        fmt::format("file {} {}\n", hash_file(file), format_name(resolve_format(file, requested)));
  }
  return text;
}

Corpus load_corpus_cached(const std::string& path, const SourceOptions& options,
                          const CacheOptions& cache, const tokenizer::Tokenizer& tokenizer,
                          SourceStats* stats) {
  const Format requested = parse_format(options.format);
  const std::vector<std::string> files = list_source_files(path);
  const bool tokenizes = std::any_of(files.begin(), files.end(), [&](const std::string& f) {
    return resolve_format(f, requested) != Format::kTokens;
  });
  if (cache.dir.empty() || !tokenizes) return load_corpus(path, options, tokenizer, stats);

  const std::string key_text = cache_key_text(files, options, cache.max_length, tokenizer);
  const std::string key = hash_bytes(key_text);
  SourceStats seen;
  if (std::optional<Corpus> hit = read_staged_entry(cache.staged_dir, key, key_text, seen)) {
    if (stats) *stats = seen;
    return std::move(*hit);
  }
  const Entry entry = entry_files(cache.dir, key);
  std::optional<FileLock> lock;
  try {
    fs::create_dirs(cache.dir);
    lock.emplace(entry.lock.string(), path);
  } catch (const Error& e) {
    log::warn("data: no token cache for {}: {}", path, e.what());
    return load_corpus(path, options, tokenizer, stats);
  }
  if (std::optional<Corpus> hit = read_entry(entry, key_text, seen)) {
    log::info("data: {}: tokens from the cache {}", path, entry.tokens.string());
    if (stats) *stats = seen;
    return std::move(*hit);
  }
  Corpus corpus = load_corpus(path, options, tokenizer, &seen);
  if (corpus.num_tokens() > 0) {
    write_entry(entry, key_text, path, corpus, seen, tokenizer.vocab_size());
  }
  if (stats) *stats = seen;
  return corpus;
}

}  // namespace dstrain::data
