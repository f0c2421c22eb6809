#include <iostream>
#include <memory>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "hub/resolve.h"

namespace dstrain::app {
namespace {

struct DownloadArgs {
  std::string repo_id;
  std::string revision = "main";
};

}  // namespace

void set_download_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kDownloadCommand);
  cmd->footer(
      "Fetches config.json, generation_config.json, the tokenizer files and the safetensors\n"
      "weights (sharded ones with their index) into huggingface_hub's cache (HF_HUB_CACHE, else\n"
      "HF_HOME/hub), resuming an interrupted download; a model already cached is not fetched\n"
      "again. Prints the snapshot directory. HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE apply.\n"
      "Example:\n"
      "  dstrain download Qwen/Qwen2.5-0.5B --revision main");
  auto a = std::make_shared<DownloadArgs>();
  cmd->add_option("REPO", a->repo_id, "The hub id, Org/Name")->required()->type_name("");
  cmd->add_option("--revision", a->revision, "Branch, tag or commit")->default_val("main");
  cmd->callback([a, exit_code] {
    std::cout << hub::download_model(a->repo_id, a->revision).string() << std::endl;
    *exit_code = 0;
  });
}

}  // namespace dstrain::app
