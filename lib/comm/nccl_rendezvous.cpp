#include "comm/nccl_rendezvous.h"

#include <cstring>

#include "comm/nccl_check.h"
#include "comm/rendezvous.h"
#include "core/error.h"

namespace dstrain::comm {
namespace {

const char* const kUniqueIdKey = "dstrain/nccl/unique_id";

}  // namespace

ncclUniqueId exchange_unique_id(c10d::Store& store, const std::string& key, int rank,
                                const std::string& where) {
  ncclUniqueId id;
  if (rank == 0) {
    id = NcclGroup::new_unique_id();
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    return id;
  }
  std::vector<uint8_t> bytes;
  try {
    bytes = store.get(key);
  } catch (const std::exception& e) {
    std::string cause = e.what();
    fail(ErrorKind::kTimeout, "rank {}: did not receive the NCCL unique id from rank 0 at {}: {}",
         rank, where, cause.substr(0, cause.find('\n')));
  }
  if (bytes.size() != sizeof(id)) {
    fail(ErrorKind::kComm, "rank {}: the NCCL unique id from rank 0 has {} bytes, expected {}",
         rank, bytes.size(), sizeof(id));
  }
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

NcclConnection connect_nccl(const RendezvousOptions& options, int device) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    fail(ErrorKind::kUsage, "rank {} is not valid in a world of size {}", options.rank,
         options.world_size);
  }
  cuda_device_count();  // fail before the rendezvous when this machine has no GPU
  NcclConnection connection;
  ncclUniqueId id;
  if (options.world_size > 1) {
    connection.store = rendezvous(options);
    id = exchange_unique_id(*connection.store, kUniqueIdKey, options.rank, store_endpoint(options));
  } else {
    id = NcclGroup::new_unique_id();
  }
  NcclGroupOptions group_options;
  group_options.rank = options.rank;
  group_options.world_size = options.world_size;
  group_options.device = device;
  group_options.timeout = options.timeout;
  connection.group = std::make_unique<NcclGroup>(id, group_options);
  return connection;
}

}  // namespace dstrain::comm
