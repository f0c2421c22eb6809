#include "model/safetensors.h"

#include <cstring>
#include <fstream>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "test_util.h"

namespace dstrain::model {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using testing::expect_error;
using testing::TempDir;

// Writes a file byte by byte: u64 header length (or `declared_len`), header text, then `data`.
void write_raw(const stdfs::path& path, const std::string& header, const std::string& data,
               int64_t declared_len = -1) {
  const uint64_t len = declared_len < 0 ? header.size() : static_cast<uint64_t>(declared_len);
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &len, 8);
  std::ofstream(path, std::ios::binary) << bytes << header << data;
}

std::string entry(const std::string& dtype, const std::string& shape, int b, int e) {
  return fmt::format("{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}", dtype, shape, b,
                     e);
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  torch::manual_seed(3);
  NamedTensors tensors = {
      {"f32", torch::randn({3, 5})},
      {"f16", torch::randn({7}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 3, 2}).to(torch::kBFloat16)},
      {"f64", torch::randn({4}, torch::kDouble)},
      {"i64", torch::arange(-5, 6, torch::kLong)},
      {"i32", torch::arange(0, 9, torch::kInt).view({3, 3})},
      {"i16", torch::arange(-3, 3, torch::kShort)},
      {"i8", torch::arange(-4, 4, torch::kChar)},
      {"u8", torch::arange(0, 255, torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(2.5f)},
      {"empty", torch::zeros({0, 4})},
  };
  write_safetensors(dir / "t.safetensors", tensors);
  const SafetensorsFile f(dir / "t.safetensors");
  ASSERT_EQ(f.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const torch::Tensor back = f.read(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(back, t)) << name;
  }
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.names().front(), "f32");  // data-section order = write order
}

TEST(Safetensors, HeaderIsPaddedWithSpacesToMultipleOf8) {
  TempDir dir;
  write_safetensors(dir / "t.safetensors", {{"abc", torch::ones({3}, torch::kByte)}});
  const std::string bytes = fs::read_file(dir / "t.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 3);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(json::parse(header)["__metadata__"]["format"], "pt");
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u);
}

TEST(Safetensors, CastOnWriteGivesBf16AndF16) {
  TempDir dir;
  const torch::Tensor t = torch::randn({4, 6});
  write_safetensors(dir / "b.safetensors", {{"w", t}}, torch::kBFloat16);
  write_safetensors(dir / "h.safetensors", {{"w", t}}, torch::kHalf);
  const SafetensorsFile b(dir / "b.safetensors"), h(dir / "h.safetensors");
  EXPECT_EQ(b.info("w").dtype, "BF16");
  EXPECT_EQ(h.info("w").dtype, "F16");
  EXPECT_TRUE(torch::equal(b.read("w"), t.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(h.read("w"), t.to(torch::kHalf)));
}

TEST(Safetensors, ReadRangeEqualsSlicingTheFullTensor) {
  TempDir dir;
  const torch::Tensor t = torch::randn({5, 7}).to(torch::kBFloat16);
  write_safetensors(dir / "t.safetensors", {{"pad", torch::ones({3}, torch::kByte)}, {"w", t}});
  const SafetensorsFile f(dir / "t.safetensors");
  const torch::Tensor flat = t.reshape({-1});
  for (auto [b, e] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 35}, {0, 0}, {3, 17}, {34, 35}, {12, 12}}) {
    EXPECT_TRUE(torch::equal(f.read_range("w", b, e), flat.slice(0, b, e))) << b << ".." << e;
  }
  expect_error([&] { f.read_range("w", 30, 36); }, ErrorKind::kInternal, {"'w'", "35 elements"});
  expect_error([&] { f.read_range("w", 5, 4); }, ErrorKind::kInternal, {"'w'"});
}

TEST(Safetensors, UnalignedTensorsAreCopiedCorrectly) {
  // A 3-byte tensor first puts the f32 tensor at an odd address inside the mapping.
  TempDir dir;
  const std::string header =
      "{\"a\":" + entry("U8", "[3]", 0, 3) + ",\"b\":" + entry("F32", "[2]", 3, 11) + "}";
  const float vals[2] = {1.5f, -2.25f};
  std::string data = "xyz";
  data.append(reinterpret_cast<const char*>(vals), 8);
  write_raw(dir / "u.safetensors", header, data);
  const SafetensorsFile f(dir / "u.safetensors");
  EXPECT_TRUE(torch::equal(f.read("b"), torch::tensor({1.5f, -2.25f})));
  EXPECT_EQ(f.read("a")[2].item<uint8_t>(), 'z');
}

TEST(Safetensors, MissingTensorNameIsInputError) {
  TempDir dir;
  write_safetensors(dir / "t.safetensors", {{"w", torch::ones({2})}});
  const SafetensorsFile f(dir / "t.safetensors");
  expect_error([&] { f.read("nope"); }, ErrorKind::kInput, {"'nope'", "t.safetensors"});
}

TEST(SafetensorsFormat, FileTooSmall) {
  TempDir dir;
  std::ofstream(dir / "s.safetensors") << "abc";
  expect_error([&] { SafetensorsFile f(dir / "s.safetensors"); }, ErrorKind::kInput, {"too small"});
}

struct BadFile {
  std::string what;
  std::string header;
  std::string data;
  std::vector<std::string> message_parts;
  int64_t declared_len = -1;
};

// One table of malformed files, each crafted byte by byte, and the words its error must contain.
TEST(SafetensorsFormat, EachMalformedFileIsRejectedWithItsReason) {
  const std::string u8_2 = entry("U8", "[2]", 0, 2);
  const std::vector<BadFile> cases = {
      {"header length over the limit", "{}", "", {"exceeds the limit"}, 200'000'000},
      {"header length past end of file", "{}", "", {"runs past the end"}, 64},
      {"header not JSON", "{\"a\": ", "", {"not valid JSON"}},
      {"header not an object", "[1, 2]", "", {"must be a JSON object"}},
      {"unknown dtype", "{\"w\":" + entry("F7", "[1]", 0, 1) + "}", "x", {"'w'", "'F7'"}},
      {"shape disagrees with span",
       "{\"w\":" + entry("F32", "[3]", 0, 8) + "}",
       std::string(8, '\0'),
       {"'w'", "needs 12 bytes", "span 8"}},
      {"negative dimension", "{\"w\":" + entry("U8", "[-1]", 0, 0) + "}", "", {"'w'", "'shape'"}},
      {"offsets reversed", "{\"w\":" + entry("U8", "[0]", 4, 2) + "}", "", {"'w'", "data_offsets"}},
      {"offsets missing", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", "x", {"'w'", "data_offsets"}},
      {"gap between tensors",
       "{\"a\":" + u8_2 + ",\"b\":" + entry("U8", "[2]", 3, 5) + "}",
       "xxxxx",
       {"'b'", "starts at byte 3", "expected 2"}},
      {"overlapping tensors",
       "{\"a\":" + entry("U8", "[4]", 0, 4) + ",\"b\":" + entry("U8", "[4]", 2, 6) + "}",
       "xxxxxx",
       {"'b'", "starts at byte 2", "expected 4"}},
      {"data not starting at 0",
       "{\"a\":" + entry("U8", "[2]", 1, 3) + "}",
       "xxx",
       {"'a'", "starts at byte 1"}},
      {"trailing bytes", "{\"a\":" + u8_2 + "}", "xxx", {"3 bytes", "cover 2"}},
      {"truncated data", "{\"a\":" + entry("U8", "[4]", 0, 4) + "}", "xx", {"2 bytes", "cover 4"}},
      {"duplicate name",
       "{\"a\":" + entry("U8", "[1]", 0, 1) + ",\"a\":" + entry("U8", "[1]", 1, 2) + "}",
       "xx",
       {"'a' twice"}},
      {"metadata value not a string",
       "{\"__metadata__\":{\"format\":1}}",
       "",
       {"__metadata__", "'format'"}},
      {"metadata not an object", "{\"__metadata__\":[]}", "", {"__metadata__"}},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    const stdfs::path path = dir / "bad.safetensors";
    write_raw(path, c.header, c.data, c.declared_len);
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << "accepted: " << c.header;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
      for (const auto& p : c.message_parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "lacks '" << p << "': " << e.what();
    }
  }
}

TEST(SafetensorsFormat, HeaderWithTrailingSpacesAndNoTensorsIsValid) {
  TempDir dir;
  write_raw(dir / "e.safetensors", "{}      ", "");
  const SafetensorsFile f(dir / "e.safetensors");
  EXPECT_TRUE(f.names().empty());
}

TEST(SafetensorsSet, ShardedIndexRoundTrip) {
  TempDir dir;
  torch::manual_seed(5);
  NamedTensors tensors;
  for (int i = 0; i < 5; ++i) tensors.emplace_back("t" + std::to_string(i), torch::randn({10, 10}));
  std::ofstream(dir / kSafetensorsFile) << "stale";
  const auto files =
      write_safetensors_dir(dir.path(), tensors, 1000);  // 400 bytes each: 2 per shard
  EXPECT_EQ(files.size(), 4u);                           // 3 shards + index
  EXPECT_FALSE(stdfs::exists(dir / kSafetensorsFile));
  EXPECT_TRUE(stdfs::exists(dir / "model-00003-of-00003.safetensors"));
  const json index = json::parse(fs::read_file(dir / kSafetensorsIndexFile));
  EXPECT_EQ(index["metadata"]["total_size"], 2000);
  EXPECT_EQ(index["weight_map"]["t4"], "model-00003-of-00003.safetensors");
  const SafetensorsSet set(dir.path());
  ASSERT_EQ(set.names().size(), 5u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::equal(set.read(name), t)) << name;
  EXPECT_TRUE(
      torch::equal(set.read_range("t3", 15, 40), tensors[3].second.reshape({-1}).slice(0, 15, 40)));
}

TEST(SafetensorsSet, SmallModelIsOneFileAndStaleIndexIsRemoved) {
  TempDir dir;
  std::ofstream(dir / kSafetensorsIndexFile) << "{}";
  write_safetensors_dir(dir.path(), {{"w", torch::ones({4})}}, 1 << 20);
  EXPECT_TRUE(stdfs::exists(dir / kSafetensorsFile));
  EXPECT_FALSE(stdfs::exists(dir / kSafetensorsIndexFile));
  EXPECT_TRUE(torch::equal(SafetensorsSet(dir.path()).read("w"), torch::ones({4})));
}

TEST(SafetensorsSet, IndexErrorsNameTheProblem) {
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"x", torch::ones({1})}});
  auto with_map = [&](const json& map) {
    std::ofstream(dir / kSafetensorsIndexFile) << json{{"weight_map", map}}.dump();
  };
  with_map({{"x", "missing.safetensors"}});
  expect_error([&] { SafetensorsSet s(dir.path()); }, ErrorKind::kInput,
               {"missing.safetensors", "'x'"});
  with_map({{"y", "a.safetensors"}});
  expect_error([&] { SafetensorsSet s(dir.path()); }, ErrorKind::kInput, {"'y'", "a.safetensors"});
  with_map({{"x", "../a.safetensors"}});
  expect_error([&] { SafetensorsSet s(dir.path()); }, ErrorKind::kInput, {"../a.safetensors"});
  std::ofstream(dir / kSafetensorsIndexFile) << "{\"metadata\": {}}";
  expect_error([&] { SafetensorsSet s(dir.path()); }, ErrorKind::kInput, {"weight_map"});
}

TEST(SafetensorsSet, DirectoryWithoutWeightsIsInputError) {
  TempDir dir;
  expect_error([&] { SafetensorsSet s(dir.path()); }, ErrorKind::kInput, {kSafetensorsFile});
}

TEST(SafetensorsWriter, RejectsDuplicateNamesAndLeavesNoFile) {
  TempDir dir;
  expect_error(
      [&] {
        write_safetensors(dir / "d.safetensors",
                          {{"a", torch::ones({1})}, {"a", torch::ones({1})}});
      },
      ErrorKind::kInput, {"'a'"});
  EXPECT_TRUE(stdfs::is_empty(dir.path()));
}

}  // namespace
}  // namespace dstrain::model
