// Steps<T>: a computation that pauses where its communication is in flight, so that its
// driver can run another computation meanwhile — the executor's F&B pairs (DualPipeV's
// overlap, runtime/executor.hpp) hide one microbatch's expert all-to-all behind the other's
// products. A Steps is a C++20 coroutine:
//   co_await InFlight{request}   pauses after posting `request` (a null request: no pause);
//                                on resumption the request is waited for
//   co_await InFlight{request, true}  a brief pause (a few bytes, such as the counts that
//                                size an exchange): once it completes, a driver may resume
//                                this one from between another computation's products, so
//                                the large exchange it posts next is not held back until
//                                that computation pauses
//   co_await other_steps(...)    runs another Steps in line; its pauses pause this one
//   co_return value
// Nothing runs before the first step(). A driver calls step() until done(); paused_on()
// names the request the computation waits for, which the driver may wait for itself (to
// time it) or leave in flight while it steps another Steps. run() drives one alone.
// Where a computation pauses never depends on data or timing (InFlight pauses even when
// the request has completed), so ranks running the same program post their collectives in
// the same order however their drivers interleave them.
// Exports: Steps, InFlight.
#pragma once
#include <coroutine>
#include <exception>
#include <optional>
#include <utility>

#include "pipetrain/comm/communicator.hpp"

namespace pipetrain {

namespace steps_detail {

// Shared by a top-level Steps and every Steps it awaits: where to resume, and on what the
// chain paused.
struct Chain {
  std::coroutine_handle<> innermost;
  CommRequest* paused_on = nullptr;
  bool brief = false;
};

struct PromiseBase {
  Chain own;                       // used when this coroutine is the top level
  Chain* chain = &own;             // the top level's
  std::coroutine_handle<> caller;  // null at the top level
  std::exception_ptr error;

  std::suspend_always initial_suspend() noexcept { return {}; }
  struct Final {
    bool await_ready() noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      PromiseBase& p = h.promise();
      if (!p.caller) return std::noop_coroutine();  // the top level: back to the driver
      p.chain->innermost = p.caller;
      return p.caller;
    }
    void await_resume() noexcept {}
  };
  Final final_suspend() noexcept { return {}; }
  void unhandled_exception() { error = std::current_exception(); }
};

template <class T>
struct Promise : PromiseBase {
  std::optional<T> value;
  void return_value(T v) { value = std::move(v); }
  T take() { return std::move(*value); }
};
template <>
struct Promise<void> : PromiseBase {
  void return_void() {}
  void take() {}
};

}  // namespace steps_detail

// A posted request to pause on (see the header comment).
struct InFlight {
  CommRequest* request = nullptr;
  bool brief = false;
  bool await_ready() const noexcept { return request == nullptr; }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) const noexcept {
    steps_detail::Chain& c = *h.promise().chain;
    c.innermost = h;
    c.paused_on = request;
    c.brief = brief;
  }
  void await_resume() const {
    if (request) request->wait();  // a no-op where the driver has waited already
  }
};

template <class T = void>
class [[nodiscard]] Steps {
 public:
  struct promise_type : steps_detail::Promise<T> {
    Steps get_return_object() { return Steps(std::coroutine_handle<promise_type>::from_promise(*this)); }
  };

  Steps(Steps&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Steps& operator=(Steps&& o) noexcept {
    if (this != &o) {
      destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~Steps() { destroy(); }

  // ---- top level: the driver's side ----
  bool done() const { return h_.done(); }
  CommRequest* paused_on() const { return h_.promise().chain->paused_on; }
  bool paused_briefly() const { return paused_on() && h_.promise().chain->brief; }
  // Runs until the next pause or the end; an exception thrown inside comes out here.
  void step() {
    steps_detail::Chain& c = *h_.promise().chain;
    if (!c.innermost) c.innermost = h_;
    c.paused_on = nullptr;
    c.innermost.resume();
    if (h_.done() && h_.promise().error) std::rethrow_exception(h_.promise().error);
  }
  // The value, once done.
  T result() { return h_.promise().take(); }
  // Alone: each pause waits for its request at once.
  T run() {
    while (!done()) step();
    return result();
  }

  // ---- awaited by another Steps: runs in line, sharing its chain ----
  bool await_ready() const noexcept { return false; }
  template <class P>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<P> caller) noexcept {
    promise_type& p = h_.promise();
    p.chain = caller.promise().chain;
    p.caller = caller;
    p.chain->innermost = h_;
    return h_;
  }
  T await_resume() {
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
    return h_.promise().take();
  }

 private:
  explicit Steps(std::coroutine_handle<promise_type> h) : h_(h) {}
  void destroy() {
    if (h_) h_.destroy();
  }
  std::coroutine_handle<promise_type> h_;
};

}  // namespace pipetrain
