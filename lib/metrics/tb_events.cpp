#include "metrics/tb_events.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <metrics/proto/tensorboard_events.pb.h>

namespace dstrain::metrics::tb {
namespace {

namespace pb = dstrain::tbproto;

constexpr const char* kFileVersion = "brain.Event:2";
constexpr const char* kHparamsPlugin = "hparams";
constexpr const char* kHparamsStartTag = "_hparams_/session_start_info";
constexpr const char* kHparamsEndTag = "_hparams_/session_end_info";
constexpr int kHparamsDataVersion = 0;  // tensorboard/plugins/hparams/metadata.py
constexpr const char* kTextPlugin = "text";

// Map entries (SessionStartInfo.hparams) come out sorted by key, so equal inputs give equal bytes.
std::string serialize(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

pb::Event event_at(double wall_time, int64_t step) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  return e;
}

std::string hparams_event(double wall_time, int64_t step, const char* tag,
                          const pb::HParamsPluginData& data) {
  pb::Event e = event_at(wall_time, step);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* plugin = v->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name(kHparamsPlugin);
  plugin->set_content(serialize(data));
  return serialize(e);
}

}  // namespace

std::string file_version_event(double wall_time) {
  pb::Event e = event_at(wall_time, 0);
  e.set_file_version(kFileVersion);
  return serialize(e);
}

std::string session_start_event(double wall_time, int64_t step) {
  pb::Event e = event_at(wall_time, step);
  e.mutable_session_log()->set_status(pb::SessionLog::START);
  return serialize(e);
}

std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, double>>& values) {
  pb::Event e = event_at(wall_time, step);
  pb::Summary* summary = e.mutable_summary();
  for (const auto& [tag, value] : values) {
    pb::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return serialize(e);
}

std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& markdown) {
  pb::Event e = event_at(wall_time, step);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* plugin = v->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name(kTextPlugin);
  plugin->set_content(serialize(pb::TextPluginData()));
  pb::TensorProto* t = v->mutable_tensor();
  t->set_dtype(pb::DT_STRING);
  // No tensor_shape: absent means a scalar, as in the reference files TensorBoard's writer makes.
  t->add_string_val(markdown);
  return serialize(e);
}

std::string hparams_start_event(double wall_time, int64_t step, const std::vector<HParam>& hparams,
                                double start_time_secs) {
  pb::HParamsPluginData data;
  data.set_version(kHparamsDataVersion);
  pb::SessionStartInfo* start = data.mutable_session_start_info();
  start->set_start_time_secs(start_time_secs);
  for (const auto& h : hparams) {
    google::protobuf::Value& value = (*start->mutable_hparams())[h.name];
    if (const auto* b = std::get_if<bool>(&h.value)) {
      value.set_bool_value(*b);
    } else if (const auto* d = std::get_if<double>(&h.value)) {
      value.set_number_value(*d);
    } else {
      value.set_string_value(std::get<std::string>(h.value));
    }
  }
  return hparams_event(wall_time, step, kHparamsStartTag, data);
}

std::string hparams_end_event(double wall_time, int64_t step, SessionStatus status,
                              double end_time_secs) {
  pb::HParamsPluginData data;
  data.set_version(kHparamsDataVersion);
  pb::SessionEndInfo* end = data.mutable_session_end_info();
  switch (status) {
    case SessionStatus::kSuccess:
      end->set_status(pb::STATUS_SUCCESS);
      break;
    case SessionStatus::kFailure:
      end->set_status(pb::STATUS_FAILURE);
      break;
    case SessionStatus::kRunning:
      end->set_status(pb::STATUS_RUNNING);
      break;
  }
  end->set_end_time_secs(end_time_secs);
  return hparams_event(wall_time, step, kHparamsEndTag, data);
}

}  // namespace dstrain::metrics::tb
