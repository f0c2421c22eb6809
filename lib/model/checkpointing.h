#pragma once
// Activation checkpointing of the layer blocks (model.gradient_checkpointing), the one
// representation of the setting: the config keeps the user's word, the run plan
// (lib/train/run_plan.h) turns it into this, and everything after reads this.

#include <array>
#include <optional>
#include <string>

namespace dstrain::model {

enum class Checkpointing {
  kNone,       // every layer keeps what its backward needs (nothing is recomputed)
  kSelective,  // a layer keeps its input and its attention's results; the rest is recomputed
  kPlain,      // a layer keeps its input and is recomputed in backward (activation_checkpoint.h)
  kOffload,    // kPlain with the inputs in host memory on a GPU (activation_offload.h)
};

// Fastest first: what `gradient_checkpointing: auto` tries in turn.
inline constexpr std::array<Checkpointing, 4> kCheckpointingSettings = {
    Checkpointing::kNone, Checkpointing::kSelective, Checkpointing::kPlain,
    Checkpointing::kOffload};

// The config's word for it: "false", "selective", "true", "offload".
const char* checkpointing_word(Checkpointing setting);

// A config's word (as checkpointing_word() writes it, any case) as the setting; "auto" and
// anything else: none.
std::optional<Checkpointing> checkpointing_from_word(const std::string& word);

}  // namespace dstrain::model
