#include "gpu_main.h"

int main(int argc, char** argv) {
  return dstrain::testing::run_gpu_tests(argc, argv);
}
