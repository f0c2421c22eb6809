#pragma once
// A TCP port that is free right now, found by binding port 0 and reading back what the kernel
// chose. The port is released before returning, so another process may take it before rank 0's
// rendezvous store binds it; that window is the price of not holding sockets across exec, and the
// same trade-off torchrun makes. Pass --master-port to avoid it.

namespace dstrain::launcher {

// Throws Error(kIo) if no socket can be bound.
int find_free_port();

}  // namespace dstrain::launcher
