// tpcli::dist — the worker thread behind started collectives (see async_worker.h).
#include "distributed/async_worker.h"

#include <exception>

namespace tpcli::dist {

struct AsyncWorker::Job {
  std::mutex mutex;  // guards the fields below
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  std::chrono::steady_clock::time_point at;

  void complete(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      error = std::move(e);
      at = std::chrono::steady_clock::now();
    }
    finished.notify_all();
  }

  std::chrono::steady_clock::time_point wait_done() {
    std::unique_lock<std::mutex> lock(mutex);
    finished.wait(lock, [&] { return done; });
    return at;
  }
};

namespace {

class WorkerPending : public PendingCollective {
 public:
  WorkerPending(std::shared_ptr<AsyncWorker::Job> job, std::function<void(const std::string&)> abandon)
      : job_(std::move(job)), abandon_(std::move(abandon)) {}

  std::chrono::steady_clock::time_point wait() override {
    waited_ = true;
    const auto at = job_->wait_done();
    std::lock_guard<std::mutex> lock(job_->mutex);
    if (job_->error) std::rethrow_exception(job_->error);
    return at;
  }

  ~WorkerPending() override {
    if (waited_) return;
    if (std::uncaught_exceptions() > 0) abandon_("a started collective was left unfinished by an error");
    job_->wait_done();  // its buffers must outlive the call; its error reaches the run anyway
  }

 private:
  std::shared_ptr<AsyncWorker::Job> job_;
  std::function<void(const std::string&)> abandon_;
  bool waited_ = false;
};

}  // namespace

AsyncWorker::AsyncWorker(std::shared_ptr<Communicator> channel, std::function<void(const std::string&)> abandon)
    : channel_(std::move(channel)), abandon_(std::move(abandon)), thread_([this] { run(); }) {}

AsyncWorker::~AsyncWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::unique_ptr<PendingCollective> AsyncWorker::submit(CollectiveCall call) {
  auto job = std::make_shared<Job>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(std::move(call), job);
  }
  wake_.notify_one();
  return std::make_unique<WorkerPending>(std::move(job), abandon_);
}

void AsyncWorker::run() {
  for (;;) {
    std::pair<CollectiveCall, std::shared_ptr<Job>> next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      next.first(*channel_);
      next.second->complete(nullptr);
    } catch (...) {
      next.second->complete(std::current_exception());
    }
  }
}

}  // namespace tpcli::dist
