// The merge behind Communicator::reduce_softmax_partials: rows [m, s, a(k), b(k)] of
// softmax partials over disjoint column sets (a vocabulary slice each) combined into the
// partials of their union — the log-sum-exp rescaling that lets each slice normalise by its
// own maximum and still give the whole row's softmax-weighted sums after one reduction.
// Exports: merge_softmax_partials.
#pragma once
#include <cstdint>

namespace pipetrain {

// inout[n] = in[n] (+) inout[n] for `rows` rows of width 2 + 2k, in place; `in` is the
// earlier operand (MPI's order for a non-commutative operation).
void merge_softmax_partials(const float* in, float* inout, int64_t rows, int k);

}  // namespace pipetrain
