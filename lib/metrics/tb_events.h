#pragma once
// TensorBoard Event messages, serialized (proto/tensorboard_events.proto; the generated classes
// stay inside lib/metrics). Each function returns the bytes of one Event, to be framed with
// tfrecord_frame() and appended to an events.out.tfevents.* file.
//
// What TensorBoard makes of them:
//  - scalars: Summary values with simple_value (float32), the form every TensorBoard version, the
//    Scalars tab and `wandb sync --sync-tensorboard` read (PyTorch's SummaryWriter writes the
//    same).
//  - text: a scalar DT_STRING tensor with the "text" plugin's metadata (Text tab, Markdown).
//  - hparams: the HParams plugin's SessionStartInfo / SessionEndInfo under the tags
//    "_hparams_/session_start_info" and "_hparams_/session_end_info".
//  - SessionLog START at step S: a reader drops every event it has seen with step >= S, so a
//    resumed run that logs steps again replaces them instead of duplicating them.

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dstrain::metrics::tb {

// Written first in every file; TensorBoard's purge logic (SessionLog) needs version 2.
std::string file_version_event(double wall_time);

std::string session_start_event(double wall_time, int64_t step);

std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, double>>& values);

std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& markdown);

// A hyper-parameter as the HParams tab shows it.
using HParamValue = std::variant<bool, double, std::string>;
struct HParam {
  std::string name;
  HParamValue value;
};

std::string hparams_start_event(double wall_time, int64_t step, const std::vector<HParam>& hparams,
                                double start_time_secs);

enum class SessionStatus { kSuccess, kFailure, kRunning };
std::string hparams_end_event(double wall_time, int64_t step, SessionStatus status,
                              double end_time_secs);

}  // namespace dstrain::metrics::tb
