#pragma once
// A world of one rank in this process: every collective is what it is over one rank (a reduction
// or a gather leaves the values as they are) and nothing is opened, no store, no port. For what
// runs the training code on one process without a launcher (`dstrain debug forward`).

#include <memory>

#include "comm/communicator.h"

namespace dstrain::comm {

std::unique_ptr<Communicator> make_solo_communicator();

}  // namespace dstrain::comm
