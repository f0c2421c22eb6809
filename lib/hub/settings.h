#pragma once
// Where the Hugging Face Hub is and how to talk to it, read from the same environment variables
// huggingface_hub reads, so that both tools agree on the cache, the endpoint and the token:
//   cache   HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub; HF_HOME defaults to
//           $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface
//   endpoint HF_ENDPOINT (default https://huggingface.co), without a trailing '/'
//   token   HF_TOKEN, else HUGGING_FACE_HUB_TOKEN, else the file HF_TOKEN_PATH, else $HF_HOME/token
//           (line breaks and surrounding spaces removed; empty = no token)
//   offline HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set to 1/ON/YES/TRUE: no request is made
//   timeouts HF_HUB_ETAG_TIMEOUT (metadata requests, s), HF_HUB_DOWNLOAD_TIMEOUT (seconds a
//           download may go without receiving a byte); both default to 10 as in huggingface_hub

#include <filesystem>
#include <string>

namespace dstrain::hub {

struct HubSettings {
  std::string endpoint = "https://huggingface.co";
  std::filesystem::path cache_dir;
  std::string token;
  std::string token_source;  // "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN" or the token file; "" if none
  bool offline = false;
  int metadata_timeout_s = 10;
  int download_timeout_s = 10;
  int max_retries = 5;  // per request, for transport failures and 408/429/5xx answers
};

// The settings from the environment. Error(kConfig) for a timeout that is not a positive integer.
HubSettings settings_from_env();

// $HF_HOME, or its default.
std::filesystem::path hf_home();

// The hub cache root (the path need not exist).
std::filesystem::path hub_cache_dir();

}  // namespace dstrain::hub
