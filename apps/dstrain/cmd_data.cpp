// `dstrain data tokenize`: pre-tokenizes a corpus into a token file (lib/data/tokenize_file.h).

#include <cstdio>
#include <memory>

#include "apps/dstrain/commands.h"
#include "data/tokenize_file.h"

namespace dstrain::app {
namespace {

void set_tokenize_command(CLI::App& data, int* exit_code) {
  auto* cmd = data.add_subcommand("tokenize", "Tokenize a text/JSONL corpus into a token file");
  auto options = std::make_shared<data::TokenizeOptions>();
  cmd->add_option("--tokenizer", options->tokenizer, "\"byte\" or a tokenizer directory")
      ->required();
  cmd->add_option("--input", options->input, "Data file or directory")->required();
  cmd->add_option("--output", options->output, "Token file to write (atomically)")->required();
  cmd->add_option("--format", options->format, "auto | text | jsonl | tokens")
      ->check(CLI::IsMember({"auto", "text", "jsonl", "tokens", "parquet"}));
  cmd->add_option("--text-field", options->text_field, "JSONL key holding the text");
  cmd->add_option("--document", options->document, "text: one document per file or per line")
      ->check(CLI::IsMember({"file", "line"}));
  cmd->add_option("--threads", options->threads, "Tokenizer threads (0 = all cores, at most 16)");
  cmd->callback([options, exit_code] {
    const data::TokenizeSummary s = data::tokenize_to_file(*options);
    std::printf("wrote %s: %lld documents, %lld tokens (uint%d)\n", options->output.c_str(),
                static_cast<long long>(s.documents), static_cast<long long>(s.tokens),
                8 * s.token_bytes);
    *exit_code = 0;
  });
}

}  // namespace

void set_data_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand("data", "Data preparation tools");
  cmd->require_subcommand(1);
  set_tokenize_command(*cmd, exit_code);
}

}  // namespace dstrain::app
