// `dstrain data tokenize`: pre-tokenizes a corpus into a token file (lib/data/tokenize_file.h).

#include <cstdio>
#include <memory>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "data/tokenize_file.h"

namespace dstrain::app {
namespace {

void set_tokenize_command(CLI::App& data, int* exit_code) {
  auto* cmd =
      data.add_subcommand("tokenize", "Tokenize a text/JSONL/Parquet corpus into a token file");
  cmd->footer(
      "Writes every document's token ids to one token file (atomically), which training reads\n"
      "with data.format: tokens (docs/data.md).\n"
      "Example:\n"
      "  dstrain data tokenize --tokenizer byte --input configs/data/tiny_corpus.txt \\\n"
      "      --document line --output runs/tiny_corpus.tokens");
  auto options = std::make_shared<data::TokenizeOptions>();
  cmd->add_option("--tokenizer", options->tokenizer, "\"byte\" or a tokenizer directory")
      ->required();
  cmd->add_option("--input", options->input, "Data file, directory or glob pattern")->required();
  cmd->add_option("--output", options->output, "Token file to write (atomically)")->required();
  cmd->add_option("--format", options->format,
                  "auto | text | jsonl | tokens | parquet | prompt_completion")
      ->check(CLI::IsMember({"auto", "text", "jsonl", "tokens", "parquet", "prompt_completion"}));
  cmd->add_option("--text-field", options->text_field,
                  "JSONL key or Parquet column holding the text");
  cmd->add_option("--prompt-field", options->prompt_field,
                  "prompt_completion: the JSONL key or Parquet column of the prompt");
  cmd->add_option("--completion-field", options->completion_field,
                  "prompt_completion: the JSONL key or Parquet column of the completion");
  cmd->add_option("--document", options->document, "text: one document per file or per line")
      ->check(CLI::IsMember({"file", "line"}));
  cmd->add_option("--add-bos", options->add_bos,
                  "auto (what the tokenizer's post-processor puts first, e.g. Llama's bos) | true "
                  "| false, as data.add_bos")
      ->check(CLI::IsMember({"auto", "true", "false"}));
  cmd->add_option("--threads", options->threads, "Tokenizer threads (0 = all cores)");
  cmd->callback([options, exit_code] {
    const data::TokenizeSummary s = data::tokenize_to_file(*options);
    std::printf("wrote %s: %lld documents, %lld tokens (uint%d), %lld NULL rows skipped\n",
                options->output.c_str(), static_cast<long long>(s.documents),
                static_cast<long long>(s.tokens), 8 * s.token_bytes,
                static_cast<long long>(s.null_rows));
    *exit_code = 0;
  });
}

}  // namespace

void set_data_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kDataCommand);
  cmd->footer(
      "Example:\n"
      "  dstrain data tokenize --tokenizer byte --input configs/data/tiny_corpus.txt \\\n"
      "      --document line --output runs/tiny_corpus.tokens");
  cmd->require_subcommand(1);
  set_tokenize_command(*cmd, exit_code);
}

}  // namespace dstrain::app
