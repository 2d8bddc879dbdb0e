// Communicator::all_to_all_v's default: one send and one receive per peer, in a group.
#include <numeric>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

// Requests that complete together.
class RequestSet final : public CommRequest {
 public:
  explicit RequestSet(std::vector<std::unique_ptr<CommRequest>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& r : parts_) r->wait();
  }
  bool test() override {
    bool done = true;
    for (auto& r : parts_) done = r->test() && done;  // tests every part: each progresses
    return done;
  }
  void wait_on(Stream& stream) override {
    for (auto& r : parts_) r->wait_on(stream);
  }

 private:
  std::vector<std::unique_ptr<CommRequest>> parts_;
};

}  // namespace

void check_all_to_all_counts(const std::string& comm, int size, const Tensor& send,
                             const std::vector<int64_t>& send_counts, const Tensor& recv,
                             const std::vector<int64_t>& recv_counts) {
  if (static_cast<int>(send_counts.size()) != size || static_cast<int>(recv_counts.size()) != size)
    fail("all-to-all on the {} communicator: {} send and {} receive counts for {} ranks", comm, send_counts.size(),
         recv_counts.size(), size);
  const int64_t out = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t in = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  if (out > send.numel() || in > recv.numel())
    fail("all-to-all on the {} communicator: {} elements to send from {}, {} to receive into {}", comm, out,
         send.numel(), in, recv.numel());
}

std::unique_ptr<CommRequest> Communicator::all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                                                        const Tensor& recv, const std::vector<int64_t>& recv_counts,
                                                        Stream& stream) {
  check_all_to_all_counts(name(), size(), send, send_counts, recv, recv_counts);
  std::vector<std::unique_ptr<CommRequest>> parts;
  int64_t out = 0, in = 0;
  group_begin();
  for (int p = 0; p < size(); ++p) {
    const auto i = static_cast<size_t>(p);
    if (recv_counts[i] > 0) parts.push_back(this->recv(recv.view(in, {recv_counts[i]}), p, 0, stream));
    if (send_counts[i] > 0) parts.push_back(this->send(send.view(out, {send_counts[i]}), p, 0, stream));
    in += recv_counts[i];
    out += send_counts[i];
  }
  group_end();
  return std::make_unique<RequestSet>(std::move(parts));
}

}  // namespace pipetrain
