namespace dstrain::launcher {}
