// bench_train_llama: training throughput of a Llama with about 100M parameters in its
// products (grouped-query attention, SwiGLU, untied head) against the best sgemm of this
// machine (bench/train_benchmark.hpp).
#include "train_benchmark.hpp"

int main(int argc, char** argv) { return pipetrain::bench::train_benchmark(argc, argv, "llama"); }
