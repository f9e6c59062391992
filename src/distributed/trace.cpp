// tpcli::dist — Chrome-trace recorder.
#include "distributed/trace.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <stdexcept>

namespace tpcli::dist {

Trace::Trace() : origin_(std::chrono::steady_clock::now()) {}

int64_t Trace::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count();
}

int64_t Trace::ns_of(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count();
}

void Trace::record(Event event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(event));
}

std::vector<Trace::Event> Trace::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

static std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

static std::string track_name(int track) {
  if (track >= Trace::ASYNC_TRACK_BASE) return "device " + std::to_string(track - Trace::ASYNC_TRACK_BASE) + " transfers";
  return "device " + std::to_string(track);
}

std::string Trace::to_json() const {
  std::vector<Event> evs = events();
  std::set<int> tracks;
  for (const Event& e : evs) tracks.insert(e.track);
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] { out += first ? "" : ",\n"; first = false; };
  for (int t : tracks) {
    sep();
    out += "{\"ph\":\"M\",\"pid\":0,\"tid\":" + std::to_string(t) +
           ",\"name\":\"thread_name\",\"args\":{\"name\":\"" + track_name(t) + "\"}}";
  }
  char buf[128];
  for (const Event& e : evs) {
    sep();
    // Chrome trace times are microseconds (fractions allowed).
    std::snprintf(buf, sizeof buf, "\"ts\":%.3f,\"dur\":%.3f", e.start_ns / 1e3, e.duration_ns / 1e3);
    out += "{\"ph\":\"X\",\"pid\":0,\"tid\":" + std::to_string(e.track) + ",\"name\":\"" + json_escape(e.name) +
           "\",\"cat\":\"" + json_escape(e.category) + "\"," + buf;
    std::string args;
    if (e.bytes >= 0) args += "\"bytes\":" + std::to_string(e.bytes);
    if (e.modelled_ns >= 0) {
      std::snprintf(buf, sizeof buf, "\"modelled_us\":%.3f", e.modelled_ns / 1e3);
      args += (args.empty() ? "" : ",") + std::string(buf);
    }
    if (!args.empty()) out += ",\"args\":{" + args + "}";
    out += "}";
  }
  out += "\n]}\n";
  return out;
}

void Trace::write(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("trace: cannot open " + path + " for writing");
  f << to_json();
  if (!f.flush()) throw std::runtime_error("trace: failed writing " + path);
}

TraceSpan::TraceSpan(Trace* trace, int track, const char* name, const char* category, int64_t bytes)
    : trace_(trace), track_(track), name_(name), category_(category), bytes_(bytes) {
  if (trace_) start_ns_ = trace_->now_ns();
}

TraceSpan::~TraceSpan() {
  if (!trace_) return;
  int64_t end = trace_->now_ns();
  trace_->record({track_, name_, category_, start_ns_, end - start_ns_, bytes_});
}

}  // namespace tpcli::dist
