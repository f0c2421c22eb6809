// Checkpoint shards as ranks write them and any world size reads them: pieces written by N ranks
// (each its own element ranges of each parameter) are assembled by the reader into any requested
// range; the manifest records every file's size and crc32; a corrupted shard is an input error.
#include "ckpt/shards.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "ckpt/layout.h"
#include "core/error.h"
#include "tests/common/expect_error.h"

namespace dstrain::ckpt {
namespace {
namespace stdfs = std::filesystem;
using ::dstrain::testing::expect_error;
using nlohmann::json;

// A parameter "w" of shape [4, 5] (20 elements) and "b" of shape [7], with master = 100 + index.
torch::Tensor values(int64_t offset, int64_t begin, int64_t end) {
  return torch::arange(begin, end, torch::kFloat32) + static_cast<float>(offset);
}

// Rank r of `world` owns elements [r·n/world, (r+1)·n/world) of each parameter, for each kind.
std::vector<Piece> rank_pieces(int rank, int world) {
  std::vector<Piece> pieces;
  for (const auto& [name, shape, offset] :
       {std::tuple<std::string, std::vector<int64_t>, int64_t>{"w", {4, 5}, 100},
        {"b", {7}, 500}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t begin = rank * n / world;
    const int64_t end = (rank + 1) * n / world;
    if (begin == end) continue;
    pieces.push_back({"master", name, shape, begin, end, values(offset, begin, end)});
    pieces.push_back({"exp_avg", name, shape, begin, end, values(offset + 1000, begin, end)});
  }
  return pieces;
}

class ShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = stdfs::temp_directory_path() / ("dstrain_ckpt_shards_" + std::to_string(::getpid()));
    stdfs::remove_all(dir_);
    stdfs::create_directories(dir_);
  }
  void TearDown() override { stdfs::remove_all(dir_); }
  // Saves a checkpoint of step 10 as `world` ranks would; returns the tag directory.
  std::string save(int world) {
    const std::string tag = tag_for_step(10);
    stdfs::create_directories(dir_ / tag);
    for (int r = 0; r < world; ++r) {
      write_shard((dir_ / tag).string(), r, rank_pieces(r, world),
                  {{"rng", torch::full({3}, r, torch::kInt64)}}, json{{"rank", r}});
    }
    Manifest m;
    m.tag = tag;
    m.step = 10;
    m.world_size = world;
    finalize(dir_.string(), m, 0);
    return (dir_ / tag).string();
  }
  stdfs::path dir_;
};

TEST_F(ShardsTest, PiecesOfAnyWorldSizeAssembleIntoAnyRange) {
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE(world);
    const CheckpointReader reader(save(world));
    EXPECT_EQ(reader.world_size(), world);
    EXPECT_TRUE(torch::equal(reader.read("master", "w", 0, 20), values(100, 0, 20)));
    // A range crossing every rank's boundary, and one inside a single piece.
    EXPECT_TRUE(torch::equal(reader.read("exp_avg", "w", 3, 17), values(1100, 3, 17)));
    EXPECT_TRUE(torch::equal(reader.read("master", "b", 5, 6), values(500, 5, 6)));
    EXPECT_TRUE(torch::equal(reader.read("exp_avg", "b", 0, 7), values(1500, 0, 7)));
    EXPECT_TRUE(torch::equal(reader.read_full("master", "w"), values(100, 0, 20).view({4, 5})));
    const auto params = reader.params("master");
    ASSERT_EQ(params.size(), 2u);
    EXPECT_EQ(params[0].first, "b");
    EXPECT_EQ(params[1].second, (std::vector<int64_t>{4, 5}));
    EXPECT_TRUE(torch::equal(reader.read_extra(world - 1, "rng"),
                             torch::full({3}, world - 1, torch::kInt64)));
    EXPECT_EQ(reader.rank_state(0).at("rank"), 0);
    stdfs::remove_all(dir_);
    stdfs::create_directories(dir_);
  }
}

// 8 ranks: more than "b" has elements, so some ranks (rank 0 among them) hold no piece of it.
TEST_F(ShardsTest, RanksWithoutAPieceOfAParameterStillAssembleIt) {
  const CheckpointReader reader(save(8));
  EXPECT_TRUE(torch::equal(reader.read("exp_avg", "b", 0, 7), values(1500, 0, 7)));
  EXPECT_TRUE(torch::equal(reader.read("master", "b", 2, 5), values(500, 2, 5)));
  EXPECT_TRUE(torch::equal(reader.read_full("master", "w"), values(100, 0, 20).view({4, 5})));
  const auto params = reader.params("exp_avg");
  const std::map<std::string, std::vector<int64_t>> shapes(params.begin(), params.end());
  EXPECT_EQ(shapes, (std::map<std::string, std::vector<int64_t>>{{"b", {7}}, {"w", {4, 5}}}));
}

// Column pieces (a tensor-parallel rank's slice of a row-parallel weight): "w" [4, 6] saved by 4
// ranks, ranks 2t and 2t+1 holding columns [3t, 3t + 3) and each a range of them that ends inside
// a row; any range of the whole tensor assembles from them, also mixed with plain pieces.
TEST_F(ShardsTest, ColumnPiecesAssembleIntoAnyRangeOfTheWholeTensor) {
  const std::string tag = tag_for_step(10);
  stdfs::create_directories(dir_ / tag);
  const torch::Tensor whole = values(100, 0, 24).view({4, 6});
  for (int r = 0; r < 4; ++r) {
    const int64_t t = r / 2, first = (r % 2) * 5, last = r % 2 == 0 ? 5 : 12;
    const torch::Tensor columns = whole.narrow(1, 3 * t, 3).reshape({-1});
    Piece p{"master", "w", {4, 6}, first, last, columns.narrow(0, first, last - first)};
    p.columns = Columns{3 * t, 3};
    std::vector<Piece> pieces = {p};
    if (r == 0) pieces.push_back({"master", "b", {7}, 0, 7, values(500, 0, 7)});
    write_shard((dir_ / tag).string(), r, pieces, {}, json::object());
  }
  Manifest m;
  m.tag = tag;
  m.step = 10;
  m.world_size = 4;
  finalize(dir_.string(), m, 0);
  const CheckpointReader reader((dir_ / tag).string());
  EXPECT_TRUE(torch::equal(reader.read_full("master", "w"), whole));
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 24}, {1, 23}, {4, 5}, {5, 19}, {6, 12}, {13, 14}, {17, 24}}) {
    EXPECT_TRUE(torch::equal(reader.read("master", "w", begin, end), values(100, begin, end)))
        << begin << ", " << end;
  }
  EXPECT_TRUE(torch::equal(reader.read("master", "b", 2, 6), values(500, 2, 6)));
  // A column slice that is not there: the range is not covered.
  expect_error([&] { reader.read("exp_avg", "w", 0, 24); }, ErrorKind::kInput,
               {"does not hold exp_avg of w elements [0, 24)"});
}

TEST_F(ShardsTest, ManifestRecordsEveryFileWithSizeAndCrc) {
  const std::string tag_dir = save(2);
  std::ifstream in(stdfs::path(tag_dir) / kManifestFile);
  const json m = json::parse(in);
  EXPECT_EQ(m.at("world_size"), 2);
  EXPECT_EQ(m.at("files").size(), 4u);  // 2 shards first, then the 2 rank JSONs
  EXPECT_EQ(m.at("files")[1].at("name"), shard_file_name(1));
  for (const json& f : m.at("files")) {
    const stdfs::path p = stdfs::path(tag_dir) / f.at("name").get<std::string>();
    EXPECT_EQ(f.at("bytes").get<uint64_t>(), stdfs::file_size(p));
    EXPECT_EQ(f.at("crc32").get<std::string>(), file_crc32(p.string()));
  }
  EXPECT_EQ(read_latest(dir_.string()), tag_for_step(10));
}

TEST_F(ShardsTest, CorruptedShardIsAnInputErrorNamingTheFile) {
  const std::string tag_dir = save(2);
  const stdfs::path shard = stdfs::path(tag_dir) / shard_file_name(1);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  const CheckpointReader reader(tag_dir);
  EXPECT_TRUE(torch::equal(reader.read("master", "w", 0, 10), values(100, 0, 10)));  // rank 0's
  try {
    reader.read("master", "w", 0, 20);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find(shard_file_name(1)), std::string::npos) << e.what();
  }
}

TEST_F(ShardsTest, ARangeNoPieceCoversIsAnInputErrorNamingIt) {
  const std::string tag = tag_for_step(10);
  const std::string tag_dir = (dir_ / tag).string();
  stdfs::create_directories(tag_dir);
  write_shard(tag_dir, 0, rank_pieces(0, 2), {}, json::object());
  write_shard(tag_dir, 1, {}, {}, json::object());  // rank 1 saved nothing: upper halves missing
  Manifest m;
  m.tag = tag;
  m.world_size = 2;
  finalize(dir_.string(), m, 0);
  const CheckpointReader reader(tag_dir);
  EXPECT_TRUE(torch::equal(reader.read("master", "w", 0, 10), values(100, 0, 10)));
  expect_error([&] { reader.read("master", "w", 5, 15); }, ErrorKind::kInput,
               {"does not hold", "master of w", "[5, 15)"});
  expect_error([&] { reader.read("exp_avg_sq", "w", 0, 1); }, ErrorKind::kInput,
               {"exp_avg_sq of w"});
  expect_error([&] { reader.read_full("master", "nope"); }, ErrorKind::kInput,
               {"no parameter nope"});
  EXPECT_FALSE(reader.read_extra(0, "rng").defined());
}

TEST_F(ShardsTest, MissingShardIsAnInputErrorNamingTheFile) {
  const std::string tag_dir = save(2);
  stdfs::remove(stdfs::path(tag_dir) / shard_file_name(1));
  const CheckpointReader reader(tag_dir);  // shards are opened only when a read needs one
  EXPECT_TRUE(torch::equal(reader.read("master", "w", 0, 10), values(100, 0, 10)));
  expect_error([&] { reader.read("master", "w", 10, 20); }, ErrorKind::kInput,
               {shard_file_name(1), "missing"});
}

TEST(FileCrc32, IsTheStandardCrc32AsEightHexDigits) {
  const stdfs::path p =
      stdfs::temp_directory_path() / ("dstrain_ckpt_crc_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(p, std::ios::binary) << "123456789";
  EXPECT_EQ(file_crc32(p.string()), "cbf43926");  // the CRC-32 check value
  std::ofstream(p, std::ios::binary | std::ios::trunc).flush();
  EXPECT_EQ(file_crc32(p.string()), "00000000");
  stdfs::remove(p);
}

TEST_F(ShardsTest, MissingRankIsAnIoErrorAtFinalize) {
  const std::string tag = tag_for_step(20);
  stdfs::create_directories(dir_ / tag);
  write_shard((dir_ / tag).string(), 0, rank_pieces(0, 2), {}, json::object());
  Manifest m;
  m.tag = tag;
  m.world_size = 2;
  EXPECT_THROW(finalize(dir_.string(), m, 0), Error);
  EXPECT_FALSE(stdfs::exists(dir_ / tag / kManifestFile));
  EXPECT_FALSE(read_latest(dir_.string()).has_value());
}

}  // namespace
}  // namespace dstrain::ckpt
