// Communicator requests never block in their destructor: an error unwinding past a
// posted receive (whose sender may be gone) must not wait for it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <vector>

#include "mpi/mpi_fixtures.hpp"
#include "pipetrain/comm/mpi_communicator.hpp"

namespace pipetrain {
namespace {

using namespace testing;

TEST(CommRequests, DestroyingAnUnmatchedReceiveReturnsAtOnce) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  {
    MpiCommunicator comm(dup, "test");
    std::vector<float> buf(1024);
    const auto t0 = std::chrono::steady_clock::now();
    {
      // Rank 0 waits for a message rank 1 never sends; the request goes out of scope.
      auto req = comm.irecv(buf.data(), buf.size(), (comm.rank() + 1) % comm.size(), 4242);
      EXPECT_FALSE(req->test());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 5.0) << "the destructor waited for the message";
    comm.barrier();  // the communicator still works afterwards
    float x = 1.0f;
    comm.allreduce_sum(&x, 1);
    EXPECT_EQ(x, static_cast<float>(comm.size()));
  }
}

}  // namespace
}  // namespace pipetrain
