#include "train/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "files/atomic_file.h"

namespace tpcli::train {

// ---- reading ----

static void add_if_finite(std::vector<LossPoint>& curve, int64_t step, const nlohmann::json& value) {
  if (value.is_number() && std::isfinite(value.get<double>())) curve.push_back({step, value.get<double>()});
}

LossCurves read_loss_curves(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  if (!in) throw std::runtime_error(metrics_path + ": cannot open (is this a run directory? it holds metrics.jsonl)");
  LossCurves curves;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw std::runtime_error(metrics_path + ":" + std::to_string(number) + ": not a JSON object");
    }
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      throw std::runtime_error(metrics_path + ":" + std::to_string(number) + ": no integer \"step\"");
    const auto step = record["step"].get<int64_t>();
    if (record.contains("loss")) add_if_finite(curves.train, step, record["loss"]);
    if (record.contains("val_loss")) add_if_finite(curves.validation, step, record["val_loss"]);
  }
  return curves;
}

// ---- drawing ----

namespace {

constexpr double WIDTH = 760, HEIGHT = 420;
constexpr double LEFT = 64, RIGHT = 24, TOP = 44, BOTTOM = 52;  // margins around the plot area
constexpr size_t MAX_TRAIN_POINTS = 1500;                        // longer runs: means of consecutive steps

// Round tick spacing (1, 2 or 5 times a power of ten) giving about `count` ticks over [lo, hi].
double tick_spacing(double lo, double hi, int count) {
  const double raw = std::max(hi - lo, 1e-12) / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * power) return m * power;
  return 10 * power;
}

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x + 0.0);  // + 0.0: a tick at -0 (a rounded -1e-17) reads "0"
  return buf;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// Means of consecutive points, so a long run stays a light file.
std::vector<LossPoint> thinned(const std::vector<LossPoint>& points) {
  if (points.size() <= MAX_TRAIN_POINTS) return points;
  const size_t group = (points.size() + MAX_TRAIN_POINTS - 1) / MAX_TRAIN_POINTS;
  std::vector<LossPoint> out;
  for (size_t i = 0; i < points.size(); i += group) {
    const size_t end = std::min(points.size(), i + group);
    double sum = 0;
    for (size_t j = i; j < end; ++j) sum += points[j].loss;
    out.push_back({points[end - 1].step, sum / static_cast<double>(end - i)});
  }
  return out;
}

struct Axes {
  double x_lo, x_hi, y_lo, y_hi;
  double x(double step) const { return LEFT + (step - x_lo) / (x_hi - x_lo) * (WIDTH - LEFT - RIGHT); }
  double y(double loss) const { return HEIGHT - BOTTOM - (loss - y_lo) / (y_hi - y_lo) * (HEIGHT - TOP - BOTTOM); }
};

Axes axes_for(const LossCurves& c) {
  Axes a{0, 1, 0, 1};
  bool any = false;
  for (const auto* curve : {&c.train, &c.validation})
    for (const LossPoint& p : *curve) {
      if (!any) a = {double(p.step), double(p.step), p.loss, p.loss};
      any = true;
      a.x_lo = std::min(a.x_lo, double(p.step)), a.x_hi = std::max(a.x_hi, double(p.step));
      a.y_lo = std::min(a.y_lo, p.loss), a.y_hi = std::max(a.y_hi, p.loss);
    }
  a.x_lo = std::min(a.x_lo, 0.0);
  if (a.x_hi <= a.x_lo) a.x_hi = a.x_lo + 1;
  const double pad = std::max((a.y_hi - a.y_lo) * 0.05, 1e-3);
  a.y_lo -= pad, a.y_hi += pad;
  return a;
}

std::string grid_and_ticks(const Axes& a) {
  std::string s;
  const double dy = tick_spacing(a.y_lo, a.y_hi, 6), dx = tick_spacing(a.x_lo, a.x_hi, 8);
  for (double v = std::ceil(a.y_lo / dy) * dy; v <= a.y_hi; v += dy)
    s += "<line x1=\"" + number(LEFT) + "\" x2=\"" + number(WIDTH - RIGHT) + "\" y1=\"" + number(a.y(v)) + "\" y2=\"" +
         number(a.y(v)) + "\" stroke=\"#e4e4e4\"/>\n<text x=\"" + number(LEFT - 6) + "\" y=\"" + number(a.y(v) + 4) +
         "\" text-anchor=\"end\">" + number(std::round(v / dy) * dy) + "</text>\n";
  for (double v = std::ceil(a.x_lo / dx) * dx; v <= a.x_hi; v += dx)
    s += "<line x1=\"" + number(a.x(v)) + "\" x2=\"" + number(a.x(v)) + "\" y1=\"" + number(TOP) + "\" y2=\"" +
         number(HEIGHT - BOTTOM) + "\" stroke=\"#e4e4e4\"/>\n<text x=\"" + number(a.x(v)) + "\" y=\"" +
         number(HEIGHT - BOTTOM + 18) + "\" text-anchor=\"middle\">" + number(std::round(v / dx) * dx) + "</text>\n";
  return s;
}

std::string polyline(const Axes& a, const std::vector<LossPoint>& points, const std::string& id, const std::string& color,
                     double width) {
  std::string s = "<polyline id=\"" + id + "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"" + number(width) +
                  "\" points=\"";
  for (const LossPoint& p : points) s += number(a.x(double(p.step))) + "," + number(a.y(p.loss)) + " ";
  return s + "\"/>\n";
}

}  // namespace

std::string loss_svg(const LossCurves& curves, const std::string& title) {
  const Axes a = axes_for(curves);
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                  number(WIDTH) + "\" height=\"" + number(HEIGHT) + "\" viewBox=\"0 0 " + number(WIDTH) + " " +
                  number(HEIGHT) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + number(WIDTH / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" + xml_escape(title) + "</text>\n";
  s += grid_and_ticks(a);
  s += "<rect x=\"" + number(LEFT) + "\" y=\"" + number(TOP) + "\" width=\"" + number(WIDTH - LEFT - RIGHT) +
       "\" height=\"" + number(HEIGHT - TOP - BOTTOM) + "\" fill=\"none\" stroke=\"#888\"/>\n";
  s += "<text x=\"" + number((LEFT + WIDTH - RIGHT) / 2) + "\" y=\"" + number(HEIGHT - 14) +
       "\" text-anchor=\"middle\">step</text>\n";
  s += "<text transform=\"translate(16 " + number((TOP + HEIGHT - BOTTOM) / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">loss (cross-entropy, nats)</text>\n";
  s += polyline(a, thinned(curves.train), "train", "#4c78a8", 1.2);
  s += polyline(a, curves.validation, "validation", "#e45756", 2);
  for (const LossPoint& p : curves.validation)
    s += "<circle cx=\"" + number(a.x(double(p.step))) + "\" cy=\"" + number(a.y(p.loss)) +
         "\" r=\"3\" fill=\"#e45756\"><title>step " + std::to_string(p.step) + ": " + number(p.loss) + "</title></circle>\n";
  const double lx = WIDTH - RIGHT - 150, ly = TOP + 16;
  s += "<line x1=\"" + number(lx) + "\" x2=\"" + number(lx + 24) + "\" y1=\"" + number(ly) + "\" y2=\"" + number(ly) +
       "\" stroke=\"#4c78a8\" stroke-width=\"2\"/><text x=\"" + number(lx + 30) + "\" y=\"" + number(ly + 4) +
       "\">train loss</text>\n";
  s += "<line x1=\"" + number(lx) + "\" x2=\"" + number(lx + 24) + "\" y1=\"" + number(ly + 18) + "\" y2=\"" +
       number(ly + 18) + "\" stroke=\"#e45756\" stroke-width=\"2\"/><text x=\"" + number(lx + 30) + "\" y=\"" +
       number(ly + 22) + "\">validation loss</text>\n";
  return s + "</svg>\n";
}

std::string write_loss_plot(const std::string& out_dir) {
  const std::filesystem::path dir(out_dir);
  const LossCurves curves = read_loss_curves((dir / "metrics.jsonl").string());
  std::string title = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  const std::string svg = loss_svg(curves, title.empty() ? std::string("loss") : title);
  const std::string path = (dir / "loss.svg").string();
  files::write_atomically(path, [&](std::ostream& out) { out << svg; });
  return path;
}

void refresh_loss_plot(const std::string& out_dir) noexcept {
  try {
    write_loss_plot(out_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: loss.svg not written: %s\n", e.what());
  }
}

}  // namespace tpcli::train
