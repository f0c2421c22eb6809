// Tokenizer throughput: load time, a cold encode (empty pre-token cache), warm encodes and a decode
// of one text file, with a round-trip check.
//   tokenizer_bench <tokenizer dir or "byte"> <text file> [repeats]

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "core/timer.h"
#include "tokenizer/tokenizer.h"

namespace {

int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <tokenizer dir or \"byte\"> <text file> [repeats]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::max(1, std::stoi(argv[3])) : 5;
  const std::string text = dstrain::fs::read_file(argv[2]);

  dstrain::Stopwatch sw;
  auto tok = dstrain::tokenizer::load_tokenizer(argv[1]);
  const double load_s = sw.seconds();

  sw.reset();
  std::vector<int32_t> ids = tok->encode(text);
  const double cold_s = sw.seconds();

  double best_s = 1e9;
  for (int i = 0; i < repeats; ++i) {
    sw.reset();
    ids = tok->encode(text);
    best_s = std::min(best_s, sw.seconds());
  }
  sw.reset();
  const std::string back = tok->decode(ids);
  const double decode_s = sw.seconds();

  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("file %s: %.2f MB, %zu tokens (%.2f bytes/token), vocab %lld\n", argv[2], mb,
              ids.size(), static_cast<double>(text.size()) / ids.size(),
              static_cast<long long>(tok->vocab_size()));
  std::printf("load %.3f s\n", load_s);
  std::printf("encode cold %.3f s (%.1f MB/s)\n", cold_s, mb / cold_s);
  std::printf("encode warm best of %d %.3f s (%.1f MB/s)\n", repeats, best_s, mb / best_s);
  std::printf("decode %.3f s\n", decode_s);
  std::printf("round trip %s\n", back == text ? "ok" : "MISMATCH");
  return back == text ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const dstrain::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return dstrain::exit_code(e.kind());
  }
}
