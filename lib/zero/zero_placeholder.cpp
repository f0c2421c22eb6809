// Placeholder until this module lands; keeps the target buildable.
namespace dstrain::zero {}
