// NcclGroup collectives on raw device memory: a world of one in this process, and a world of two
// processes (this binary re-run with --nccl-rank) when the machine has two devices.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "comm/nccl_communicator.h"
#include "comm/nccl_group.h"
#include "comm/nccl_rendezvous.h"
#include "core/error.h"
#include "gpu_main.h"
#include "tests/common/free_port.h"

extern char** environ;

namespace dstrain::comm {
namespace {

std::vector<float> iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<float>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(&data, n * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host.data(), n * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data); }
  std::vector<float> read() const {
    std::vector<float> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  float* data = nullptr;
  size_t n;
};

std::unique_ptr<NcclGroup> world_of_one() {
  NcclGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  return std::make_unique<NcclGroup>(NcclGroup::new_unique_id(), options);
}

TEST(NcclGroupWorldOfOne, AllReduceSumAvgMaxLeaveTheBufferUnchanged) {
  auto group = world_of_one();
  for (ncclRedOp_t op : {ncclSum, ncclAvg, ncclMax}) {
    DeviceBuffer buffer(iota(1000, 1));
    group->all_reduce(buffer.data, buffer.n, ncclFloat32, op, cudaStreamLegacy)->synchronize();
    EXPECT_EQ(buffer.read(), iota(1000, 1)) << "op " << op;
  }
}

TEST(NcclGroupWorldOfOne, AllToAllSendsItsOneChunkToItself) {
  auto group = world_of_one();
  DeviceBuffer in(iota(64, 1)), out(std::vector<float>(64, 0));
  group->all_to_all(in.data, out.data, 64, ncclFloat32, sizeof(float), cudaStreamLegacy)
      ->synchronize();
  EXPECT_EQ(out.read(), iota(64, 1));
}

TEST(NcclGroupWorldOfOne, ReduceScatterAllGatherAndBroadcastCopyTheirInput) {
  auto group = world_of_one();
  DeviceBuffer input(iota(64, 3)), output(std::vector<float>(64, 0));
  group->reduce_scatter(input.data, output.data, 64, ncclFloat32, ncclSum, cudaStreamLegacy)
      ->synchronize();
  EXPECT_EQ(output.read(), iota(64, 3));
  DeviceBuffer gathered(std::vector<float>(64, 0));
  group->all_gather(input.data, gathered.data, 64, ncclFloat32, cudaStreamLegacy)->synchronize();
  EXPECT_EQ(gathered.read(), iota(64, 3));
  group->broadcast(input.data, 64, ncclFloat32, 0, cudaStreamLegacy)->synchronize();
  EXPECT_EQ(input.read(), iota(64, 3));
}

TEST(NcclGroupWorldOfOne, StreamWaitOrdersTheComputeStreamAfterTheCollective) {
  auto group = world_of_one();
  cudaStream_t compute;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer input(iota(4096, 0)), output(std::vector<float>(4096, -1));
  auto work = group->all_gather(input.data, output.data, 4096, ncclFloat32, compute);
  work->wait(compute);  // the host does not block here
  std::vector<float> host(4096);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), output.data, 4096 * sizeof(float), cudaMemcpyDeviceToHost,
                            compute),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  EXPECT_EQ(host, iota(4096, 0));
  EXPECT_TRUE(work->done());
  cudaStreamDestroy(compute);
}

TEST(NcclGroupWorldOfOne, GroupedBucketsCompleteWithOneWork) {
  auto group = world_of_one();
  DeviceBuffer a(iota(100, 0)), b(iota(300, 7));
  group
      ->all_reduce_buckets({{a.data, a.n, ncclFloat32}, {b.data, b.n, ncclFloat32}}, ncclSum,
                           cudaStreamLegacy)
      ->synchronize();
  EXPECT_EQ(a.read(), iota(100, 0));
  EXPECT_EQ(b.read(), iota(300, 7));
}

TEST(NcclCommunicatorWorldOfOne, CpuTensorIsRefusedAndCountersStayZero) {
  auto comm = make_nccl_communicator(RendezvousOptions{});
  torch::Tensor cpu = torch::ones({16});
  try {
    comm->all_reduce(cpu, ReduceOp::kSum);
    FAIL() << "a CPU tensor was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  }
  EXPECT_EQ(comm->stats().total_bytes(), 0u);
  comm->barrier();
}

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
TEST(NcclCommunicatorWorldOfOne, CollectivesOnCudaTensorsInEveryDtype) {
  auto comm = make_nccl_communicator(RendezvousOptions{});
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    auto options = torch::TensorOptions().device(torch::kCUDA, 0).dtype(dtype);
    torch::Tensor t = torch::arange(32, options);
    synchronize(*comm->all_reduce(t, ReduceOp::kAvg));
    EXPECT_TRUE(torch::equal(t, torch::arange(32, options)));
    torch::Tensor out = torch::empty({32}, options);
    comm->all_gather(out, t)->wait();
    EXPECT_TRUE(torch::equal(out, t));
  }
  EXPECT_EQ(comm->stats().total_bytes(), 0u);  // a world of one sends nothing
}
#endif

// ----- two processes, one device each -----

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// All-reduce of `count` 16-bit elements holding `value` on this rank; returns what came back as
// float. bf16 and fp16 hold small integers exactly, so sums and maxima are exact.
template <typename Half>
std::vector<float> reduce_16bit(NcclGroup& group, float value, ncclDataType_t dtype, ncclRedOp_t op,
                                size_t count) {
  std::vector<Half> host(count, Half(value));
  void* device = nullptr;
  cudaMalloc(&device, count * sizeof(Half));
  cudaMemcpy(device, host.data(), count * sizeof(Half), cudaMemcpyHostToDevice);
  group.all_reduce(device, count, dtype, op, cudaStreamLegacy)->synchronize();
  cudaMemcpy(host.data(), device, count * sizeof(Half), cudaMemcpyDeviceToHost);
  cudaFree(device);
  std::vector<float> out;
  for (const Half& h : host) out.push_back(static_cast<float>(h));
  return out;
}

TEST(NcclGroupWorldOfOne, Bf16AndFp16SumAvgMaxKeepTheValue) {
  auto group = world_of_one();
  for (ncclRedOp_t op : {ncclSum, ncclAvg, ncclMax}) {
    EXPECT_EQ(reduce_16bit<__nv_bfloat16>(*group, 3.0f, ncclBfloat16, op, 100),
              std::vector<float>(100, 3.0f));
    EXPECT_EQ(reduce_16bit<__half>(*group, 3.0f, ncclFloat16, op, 100),
              std::vector<float>(100, 3.0f));
  }
}

// One rank of the two-process world: fp32 sum, reduce_scatter (avg) and all_gather, bf16 sum and
// fp16 max, all with known results.
int run_rank() {
  RendezvousOptions options = rendezvous_options_from_env();
  NcclConnection connection = connect_nccl(options, -1);
  NcclGroup& group = *connection.group;
  const int r = group.rank(), n = group.world_size();
  const size_t count = 1024;
  DeviceBuffer sum(std::vector<float>(count * n, static_cast<float>(r + 1)));
  group.all_reduce(sum.data, sum.n, ncclFloat32, ncclSum, cudaStreamLegacy)->synchronize();
  DeviceBuffer chunk(std::vector<float>(count, 0));
  group.reduce_scatter(sum.data, chunk.data, count, ncclFloat32, ncclAvg, cudaStreamLegacy)
      ->synchronize();
  DeviceBuffer mine(std::vector<float>(count, static_cast<float>(r)));
  DeviceBuffer all(std::vector<float>(count * n, -1));
  group.all_gather(mine.data, all.data, count, ncclFloat32, cudaStreamLegacy)->synchronize();
  const float total = n * (n + 1) / 2.0f;
  for (float x : sum.read()) {
    if (x != total)
      return std::printf("rank %d: all_reduce gave %g, expected %g\n", r, x, total), 1;
  }
  for (float x : chunk.read()) {
    if (x != total) return std::printf("rank %d: reduce_scatter avg gave %g\n", r, x), 1;
  }
  std::vector<float> gathered = all.read();
  for (size_t i = 0; i < gathered.size(); ++i) {
    if (gathered[i] != static_cast<float>(i / count)) {
      return std::printf("rank %d: all_gather element %zu is %g\n", r, i, gathered[i]), 1;
    }
  }
  for (float x : reduce_16bit<__nv_bfloat16>(group, r + 1.0f, ncclBfloat16, ncclSum, count)) {
    if (x != total) return std::printf("rank %d: bf16 all_reduce sum gave %g\n", r, x), 1;
  }
  for (float x : reduce_16bit<__half>(group, r + 1.0f, ncclFloat16, ncclMax, count)) {
    if (x != n) return std::printf("rank %d: fp16 all_reduce max gave %g\n", r, x), 1;
  }
  // all_to_all: chunk j of rank r's input holds 100 r + 10 j + i; chunk j of its output must be
  // rank j's chunk r.
  std::vector<float> send(count * n);
  for (size_t i = 0; i < send.size(); ++i) send[i] = 100.0f * r + 10.0f * (i / count) + (i % count);
  DeviceBuffer to_send(send), received(std::vector<float>(count * n, -1));
  group
      .all_to_all(to_send.data, received.data, count, ncclFloat32, sizeof(float), cudaStreamLegacy)
      ->synchronize();
  std::vector<float> got = received.read();
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = 100.0f * (i / count) + 10.0f * r + (i % count);
    if (got[i] != want)
      return std::printf("rank %d: all_to_all element %zu is %g\n", r, i, got[i]), 1;
  }
  // Point-to-point as NcclCommunicator::exchange issues it: each rank sends its buffer to the
  // next and receives the previous one's, both in one NCCL group (no deadlock).
  DeviceBuffer outgoing(std::vector<float>(count, 7.0f * r + 1)),
      incoming(std::vector<float>(count, -1));
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  group
      .grouped(
          CollectiveKind::kSend,
          {[&](ncclComm_t comm, cudaStream_t stream) {
             return ncclSend(outgoing.data, count * sizeof(float), ncclUint8, next, comm, stream);
           },
           [&](ncclComm_t comm, cudaStream_t stream) {
             return ncclRecv(incoming.data, count * sizeof(float), ncclUint8, prev, comm, stream);
           }},
          cudaStreamLegacy)
      ->synchronize();
  for (float x : incoming.read()) {
    if (x != 7.0f * prev + 1) return std::printf("rank %d: recv gave %g\n", r, x), 1;
  }
  return 0;
}

pid_t spawn_rank(int rank, int port) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=2");
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port));
  env.push_back("DSTRAIN_COMM_TIMEOUT=60");
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", flag = "--nccl-rank";
  char* argv[] = {self.data(), flag.data(), nullptr};
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  return pid;
}

TEST(NcclGroupTwoProcesses, CollectivesInEveryDtypeGiveTheExpectedResultsOnBothRanks) {
  if (device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const int port = dstrain::testing::free_port();
  pid_t pids[2] = {spawn_rank(0, port), spawn_rank(1, port)};
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " failed";
  }
}

}  // namespace
}  // namespace dstrain::comm

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--nccl-rank") == 0) {
    try {
      return dstrain::comm::run_rank();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  }
  return dstrain::testing::run_gpu_tests(argc, argv);
}
