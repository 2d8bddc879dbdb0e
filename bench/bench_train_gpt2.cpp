// bench_train_gpt2: GPT-2 124M-shape training throughput against the best sgemm of this
// machine (bench/train_benchmark.hpp).
#include "train_benchmark.hpp"

int main(int argc, char** argv) { return pipetrain::bench::train_benchmark(argc, argv, "gpt2"); }
