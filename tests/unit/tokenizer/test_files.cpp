#include "test_files.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "tokenizer/byte_level.h"

namespace dstrain::tokenizer::testing {

stdfs::path shared_data(const std::string& rel) {
  // DSTRAIN_SHARED_DIR overrides the default location (for checkouts not beside shared/).
  const char* env = std::getenv("DSTRAIN_SHARED_DIR");
  const stdfs::path shared = env != nullptr && *env != '\0'
                                 ? stdfs::path(env)
                                 : stdfs::path(DSTRAIN_SOURCE_DIR) / ".." / "shared";
  return shared / "data" / rel;
}

TempDir::TempDir() {
  static int counter = 0;
  path_ = stdfs::temp_directory_path() / ("dstrain_tokenizer_test_" + std::to_string(::getpid()) +
                                          "_" + std::to_string(counter++));
  stdfs::remove_all(path_);
  stdfs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  stdfs::remove_all(path_, ec);
}

void TempDir::write(const std::string& name, const std::string& content) const {
  std::ofstream(path_ / name, std::ios::binary) << content;
}

nlohmann::json byte_vocab(const std::vector<std::string>& extra) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbols()[b]] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
  return vocab;
}

const std::vector<std::string>& hard_strings() {
  static const std::vector<std::string> strings = {
      "Hello world",
      "日本語のテキスト、中文字符。한국어 텍스트",
      "family 👩‍👩‍👧‍👦 and flag 🏳️‍🌈 and 👍🏽",
      "café naïve Ångström q\u0307 (combining dot above, no precomposed form)",
      "line one\r\nline two\r\n\r\n",
      "runs of spaces:     and     more      ",
      "\ttabs\t\tand\t \tmixed\t",
      "digits 1234567890 3.14159 1,000,000 ١٢٣",
      "contractions: it's we're they've I'm you'll he'd IT'S WE'RE",
      "special <|endoftext|> inside<|im_start|>user\nhi<|im_end|>\n text",
      "<|endoftext|><|endoftext|>",
      "partial <|endoftext and <|im_start without end",
      "    indented\n\n\n    code() { return x; }  // done",
      "",
      " ",
      "\n",
  };
  return strings;
}

std::string read_text(const stdfs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace dstrain::tokenizer::testing
