#pragma once
// Choosing which hosts and which device slots of a hostfile a job uses (DeepSpeed semantics):
//
//   --include "host1:0,2@host2"   only these: host1's slots 0 and 2, all of host2
//   --exclude "host1:0@host2"     everything but host1's slot 0 and all of host2
//   --num_nodes N                 the first N hosts
//   --num_gpus G                  the first G slots of every host
//
// --include and --exclude are mutually exclusive, and neither combines with --num_nodes/--num_gpus.
// Hostfile order is kept whatever order the filter names hosts in. Errors (kUsage) name the filter
// and the host or slot at fault: an unknown host, a slot outside 0..slots-1, a host named twice,
// nothing left.

#include <string>
#include <vector>

#include "launcher/hostfile.h"

namespace dstrain::launcher {

struct HostSelection {
  std::string include;  // "" = not given
  std::string exclude;
  int num_nodes = -1;  // -1 = all
  int num_gpus = -1;   // -1 = all slots
};

struct SelectedNode {
  HostEntry entry;
  std::vector<int> slots;  // chosen device indices, ascending, non-empty
};

// `hostfile_path` only appears in messages.
std::vector<SelectedNode> select_hosts(const std::vector<HostEntry>& hosts,
                                       const HostSelection& selection,
                                       const std::string& hostfile_path);

}  // namespace dstrain::launcher
