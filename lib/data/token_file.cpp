#include "data/token_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/fs.h"

namespace dstrain::data {
namespace {

namespace stdfs = std::filesystem;

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void read_exact(std::ifstream& in, void* dst, size_t n, const std::string& path) {
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  if (static_cast<size_t>(in.gcount()) != n) {
    fail(ErrorKind::kInput, "{}: token file is truncated (read failed)", path);
  }
}

TokenFileHeader parse_header(const unsigned char* h, uint64_t file_size, const std::string& path) {
  if (std::memcmp(h, kTokenFileMagic, 8) != 0) {
    fail(
        ErrorKind::kInput,
        "{}: not a dstrain token file (bad magic at byte 0, expected \"DSTOKENS\"); write one with "
        "'dstrain data tokenize'",
        path);
  }
  TokenFileHeader hd;
  hd.version = static_cast<uint32_t>(get_le(h + 8, 4));
  hd.token_bytes = static_cast<uint32_t>(get_le(h + 12, 4));
  hd.vocab_size = get_le(h + 16, 8);
  hd.token_count = get_le(h + 24, 8);
  hd.document_count = get_le(h + 32, 8);
  if (hd.version != kTokenFileVersion && hd.version != kTokenFileVersionPrompts) {
    fail(ErrorKind::kInput,
         "{}: token file version {} is not supported (this build reads versions {} and {})", path,
         hd.version, kTokenFileVersion, kTokenFileVersionPrompts);
  }
  if (hd.token_bytes != 2 && hd.token_bytes != 4) {
    fail(ErrorKind::kInput, "{}: token file dtype field (byte 12) is {}, expected 2 or 4", path,
         hd.token_bytes);
  }
  const uint64_t limit = std::numeric_limits<uint64_t>::max() / 16;
  if (hd.token_count > limit || hd.document_count > limit) {
    fail(ErrorKind::kInput, "{}: token file header counts are implausible", path);
  }
  const uint64_t prompts = hd.version == kTokenFileVersionPrompts ? 8 * hd.document_count : 0;
  const uint64_t expected = kTokenFileHeaderBytes + 8 * (hd.document_count + 1) +
                            uint64_t{hd.token_bytes} * hd.token_count + prompts;
  if (file_size < expected) {
    fail(ErrorKind::kInput,
         "{}: token file is truncated: it has {} bytes, its header ({} documents, {} tokens) needs "
         "{}",
         path, file_size, hd.document_count, hd.token_count, expected);
  }
  if (file_size > expected) {
    fail(ErrorKind::kInput, "{}: token file has {} trailing bytes after its data", path,
         file_size - expected);
  }
  return hd;
}

std::vector<int64_t> read_offsets(std::ifstream& in, const TokenFileHeader& hd,
                                  const std::string& path) {
  std::vector<unsigned char> raw(8 * (hd.document_count + 1));
  read_exact(in, raw.data(), raw.size(), path);
  std::vector<int64_t> offsets(hd.document_count + 1);
  for (size_t i = 0; i < offsets.size(); ++i) {
    const uint64_t v = get_le(raw.data() + 8 * i, 8);
    const bool bad = (i == 0 && v != 0) || (i > 0 && v < static_cast<uint64_t>(offsets[i - 1])) ||
                     v > hd.token_count || (i + 1 == offsets.size() && v != hd.token_count);
    if (bad) {
      fail(ErrorKind::kInput, "{}: bad document offset {} at index {} (byte {}) in token file",
           path, v, i, kTokenFileHeaderBytes + 8 * static_cast<int64_t>(i));
    }
    offsets[i] = static_cast<int64_t>(v);
  }
  return offsets;
}

std::vector<int32_t> read_tokens(std::ifstream& in, const TokenFileHeader& hd,
                                 const std::string& path) {
  std::vector<int32_t> tokens(hd.token_count);
  const size_t chunk = 1 << 20;
  std::vector<unsigned char> raw(chunk * hd.token_bytes);
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min(chunk, tokens.size() - done);
    read_exact(in, raw.data(), n * hd.token_bytes, path);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t t = get_le(raw.data() + i * hd.token_bytes, static_cast<int>(hd.token_bytes));
      if (t >= hd.vocab_size || t > uint64_t{std::numeric_limits<int32_t>::max()}) {
        fail(ErrorKind::kInput, "{}: token {} at token index {} is not below the vocab_size {}",
             path, t, done + i, hd.vocab_size);
      }
      tokens[done + i] = static_cast<int32_t>(t);
    }
    done += n;
  }
  return tokens;
}

std::vector<int64_t> read_prompt_lengths(std::ifstream& in, const TokenFileHeader& hd,
                                         const std::vector<int64_t>& offsets,
                                         const std::string& path) {
  std::vector<unsigned char> raw(8 * hd.document_count);
  read_exact(in, raw.data(), raw.size(), path);
  std::vector<int64_t> lengths(hd.document_count);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const uint64_t v = get_le(raw.data() + 8 * i, 8);
    if (v > static_cast<uint64_t>(offsets[i + 1] - offsets[i])) {
      fail(ErrorKind::kInput,
           "{}: document {} has a prompt of {} tokens in a token file, longer than its {} tokens",
           path, i, v, offsets[i + 1] - offsets[i]);
    }
    lengths[i] = static_cast<int64_t>(v);
  }
  return lengths;
}

}  // namespace

void write_token_file(const std::string& path, const Corpus& corpus, int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 32)) {
    fail(ErrorKind::kInput, "{}: vocab_size {} cannot be stored in a token file", path, vocab_size);
  }
  const int bytes = vocab_size <= 65536 ? 2 : 4;
  std::string out;
  out.reserve(kTokenFileHeaderBytes + 8 * corpus.offsets.size() + bytes * corpus.tokens.size());
  out.append(kTokenFileMagic, 8);
  const bool prompts = !corpus.prompt_lengths.empty();
  put_le(out, prompts ? kTokenFileVersionPrompts : kTokenFileVersion, 4);
  put_le(out, static_cast<uint64_t>(bytes), 4);
  put_le(out, static_cast<uint64_t>(vocab_size), 8);
  put_le(out, static_cast<uint64_t>(corpus.num_tokens()), 8);
  put_le(out, static_cast<uint64_t>(corpus.num_documents()), 8);
  for (int64_t off : corpus.offsets) put_le(out, static_cast<uint64_t>(off), 8);
  for (size_t i = 0; i < corpus.tokens.size(); ++i) {
    const int32_t t = corpus.tokens[i];
    if (t < 0 || t >= vocab_size) {
      fail(ErrorKind::kInput, "{}: token {} at index {} is outside the vocabulary [0, {})", path, t,
           i, vocab_size);
    }
    put_le(out, static_cast<uint64_t>(t), bytes);
  }
  for (int64_t d = 0; prompts && d < corpus.num_documents(); ++d) {
    put_le(out, static_cast<uint64_t>(corpus.prompt_length(d)), 8);
  }
  fs::write_file_atomic(path, out);
}

Corpus read_token_file(const std::string& path, TokenFileHeader* header) {
  std::error_code ec;
  if (!stdfs::is_regular_file(path, ec)) {
    fail(ErrorKind::kInput, "{}: token file not found", path);
  }
  const uint64_t size = stdfs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) fail(ErrorKind::kIo, "cannot read {}", path);
  if (size < static_cast<uint64_t>(kTokenFileHeaderBytes)) {
    fail(ErrorKind::kInput, "{}: token file is truncated: {} bytes, the header alone needs {}",
         path, size, kTokenFileHeaderBytes);
  }
  unsigned char raw[kTokenFileHeaderBytes];
  read_exact(in, raw, sizeof raw, path);
  const TokenFileHeader hd = parse_header(raw, size, path);
  Corpus corpus;
  corpus.offsets = read_offsets(in, hd, path);
  corpus.tokens = read_tokens(in, hd, path);
  if (hd.version == kTokenFileVersionPrompts) {
    corpus.prompt_lengths = read_prompt_lengths(in, hd, corpus.offsets, path);
  }
  if (header) *header = hd;
  return corpus;
}

bool has_token_file_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  return in.gcount() == 8 && std::memcmp(magic, kTokenFileMagic, 8) == 0;
}

}  // namespace dstrain::data
