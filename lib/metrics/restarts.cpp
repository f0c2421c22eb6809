#include "metrics/restarts.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace dstrain::metrics {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

}  // namespace

std::vector<RestartRecord> read_restarts(const std::string& file) {
  const stdfs::path path = file;
  std::error_code ec;
  if (!stdfs::is_regular_file(path, ec)) return {};
  std::vector<RestartRecord> records;
  try {
    const json doc = json::parse(fs::read_file(path));
    for (const json& r : doc.at("restarts")) {
      RestartRecord rec;
      rec.attempt = r.at("attempt").get<int>();
      rec.time = r.at("time").get<std::string>();
      rec.rank = r.at("rank").get<int>();
      rec.host = r.at("host").get<std::string>();
      rec.cause = r.at("cause").get<std::string>();
      rec.exit_code = r.at("exit_code").get<int>();
      rec.step = r.at("step").get<long>();
      rec.resumed_from = r.at("resumed_from").get<std::string>();
      rec.counted = r.at("counted").get<bool>();
      records.push_back(rec);
    }
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: not a restarts file of dstrain ({})", path.string(), e.what());
  }
  return records;
}

json to_json(const std::vector<RestartRecord>& records) {
  json list = json::array();
  for (const RestartRecord& r : records) {
    list.push_back({{"attempt", r.attempt},
                    {"time", r.time},
                    {"rank", r.rank},
                    {"host", r.host},
                    {"cause", r.cause},
                    {"exit_code", r.exit_code},
                    {"step", r.step},
                    {"resumed_from", r.resumed_from},
                    {"counted", r.counted}});
  }
  return list;
}

void write_restarts(const std::string& out_dir, const std::vector<RestartRecord>& records) {
  const stdfs::path path = restarts_file(out_dir);
  if (records.empty()) {
    std::error_code ec;
    stdfs::remove(path, ec);
    return;
  }
  fs::create_dirs(out_dir);
  fs::write_file_atomic(path, json{{"restarts", to_json(records)}}.dump(1) + "\n");
}

long last_logged_step(const std::string& metrics_file) {
  std::ifstream in(metrics_file);
  long step = -1;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer())
      step = j["step"].get<long>();
  }
  return step;
}

}  // namespace dstrain::metrics
