// load_tokenizer: picks the implementation from the name or the files present in the directory.

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_tokenizer.h"
#include "tokenizer/sentencepiece_bpe_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json_reader.h"
#include "tokenizer/vocab_merges_reader.h"

namespace dstrain::tokenizer {
namespace {

namespace stdfs = std::filesystem;

BpeSpec read_spec(const stdfs::path& dir) {
  auto has = [&](const char* name) { return stdfs::is_regular_file(dir / name); };
  if (has("tokenizer.json")) return read_tokenizer_json(dir / "tokenizer.json");
  if (has("vocab.json") && has("merges.txt"))
    return read_vocab_merges(dir, "vocab.json", "merges.txt");
  if (has("encoder.json") && has("vocab.bpe"))
    return read_vocab_merges(dir, "encoder.json", "vocab.bpe");
  fail(ErrorKind::kInput,
       "no usable tokenizer files in '{}': expected tokenizer.json, or "
       "vocab.json + merges.txt, or encoder.json + vocab.bpe",
       dir.string());
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name_or_dir) {
  if (name_or_dir == "byte") return std::make_unique<ByteTokenizer>();
  const stdfs::path dir(name_or_dir);
  if (!stdfs::is_directory(dir)) {
    fail(ErrorKind::kInput,
         "tokenizer '{}' is neither \"byte\" nor a directory with tokenizer.json "
         "or vocab.json + merges.txt",
         name_or_dir);
  }
  try {
    const BpeSpec spec = read_spec(dir);
    if (!spec.byte_level) return std::make_unique<SentencePieceBpeTokenizer>(spec);
    return std::make_unique<ByteLevelBpeTokenizer>(spec);
  } catch (const nlohmann::json::exception& e) {
    // Type mismatches that the readers do not check field by field (e.g. "special": "yes").
    fail(ErrorKind::kInput, "tokenizer files in '{}' are malformed: {}", name_or_dir, e.what());
  }
}

}  // namespace dstrain::tokenizer
