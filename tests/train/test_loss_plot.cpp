// loss.svg: well-formed XML holding the training curve (every step) and the validation curve (the
// evaluations), drawn from metrics.jsonl; bad metrics lines are errors naming the file and line.
#include <catch2/catch.hpp>

#include <cmath>

#include <fstream>
#include <regex>
#include <vector>

#include "support/temp_dir.h"
#include "train/loss_plot.h"

using namespace tpcli;
using tpcli::testing::TempDir;

namespace {

// A small XML well-formedness check: every tag closes in order, attributes are quoted, text holds
// no bare '<' or '&' outside entities. Returns "" or what is wrong.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  size_t i = 0;
  if (xml.rfind("<?xml", 0) == 0) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    if (xml[i] == '&') {
      const size_t semi = xml.find(';', i);
      const std::string entity = xml.substr(i, semi == std::string::npos ? 0 : semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;") return "bare & at " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.find('<') != std::string::npos) return "'<' inside a tag: " + tag;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "</" + tag.substr(1) + "> closes nothing open";
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    if (self_closing) tag.pop_back();
    static const std::regex attributes(R"(^[A-Za-z][\w:-]*(\s+[A-Za-z][\w:-]*="[^"<]*")*\s*$)");
    if (!std::regex_match(tag, attributes)) return "malformed tag <" + tag + ">";
    if (!self_closing) open.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

// The "x,y" pairs of <polyline id="ID" ... points="...">.
std::vector<std::pair<double, double>> polyline_points(const std::string& svg, const std::string& id) {
  const size_t at = svg.find("<polyline id=\"" + id + "\"");
  if (at == std::string::npos) return {};
  const size_t p = svg.find("points=\"", at) + 8;
  std::istringstream in(svg.substr(p, svg.find('"', p) - p));
  std::vector<std::pair<double, double>> points;
  double x, y;
  char comma;
  while (in >> x >> comma >> y) points.push_back({x, y});
  return points;
}

}  // namespace

TEST_CASE("loss.svg: well-formed, with the training curve at every step and the validation curve at evaluations") {
  TempDir dir;
  {
    std::ofstream m(dir.path() / "metrics.jsonl");
    for (int s = 1; s <= 20; ++s) {
      m << "{\"step\": " << s << ", \"loss\": " << 4.0 - 0.1 * s << ", \"lr\": 0.001";
      if (s % 10 == 0) m << ", \"val_loss\": " << 4.1 - 0.1 * s;
      m << "}\n";
    }
    m << "{\"step\": 21, \"loss\": null}\n";  // a non-finite loss is written as null: not drawn
  }
  const std::string path = train::write_loss_plot(dir.path().string());
  CHECK(path == (dir.path() / "loss.svg").string());
  const std::string svg = tpcli::testing::slurp(path);
  CHECK(xml_problem(svg).empty());
  INFO(xml_problem(svg));
  const auto train_points = polyline_points(svg, "train"), val_points = polyline_points(svg, "validation");
  REQUIRE(train_points.size() == 20);
  REQUIRE(val_points.size() == 2);
  // Falling loss: y (downwards in SVG) grows along each curve; steps go right.
  CHECK(train_points.back().second > train_points.front().second);
  CHECK(train_points.back().first > train_points.front().first);
  CHECK(val_points[1].second > val_points[0].second);
  CHECK(val_points[1].first == Approx(train_points[19].first));  // step 20 at the same x on both curves
  CHECK(svg.find("train loss") != std::string::npos);
  CHECK(svg.find("validation loss") != std::string::npos);

  const train::LossCurves curves = train::read_loss_curves((dir.path() / "metrics.jsonl").string());
  CHECK(curves.train.size() == 20);
  CHECK(curves.validation.size() == 2);
  CHECK(curves.validation[0].step == 10);
  CHECK(curves.validation[0].loss == Approx(3.1));
}

TEST_CASE("loss.svg: the checker catches what it must, the title is escaped") {
  CHECK_FALSE(xml_problem("<svg><g></svg>").empty());
  CHECK_FALSE(xml_problem("<svg a=b/>").empty());
  CHECK_FALSE(xml_problem("<svg>a & b</svg>").empty());
  const std::string svg = train::loss_svg({}, "runs/<a&b>");
  CHECK(xml_problem(svg).empty());
  CHECK(svg.find("&lt;a&amp;b&gt;") != std::string::npos);
}

TEST_CASE("loss.svg: a bad metrics line is an error naming the file and line") {
  TempDir dir;
  std::ofstream(dir.path() / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n{\"loss\": 2}\n";
  CHECK_THROWS_WITH(train::read_loss_curves((dir.path() / "metrics.jsonl").string()),
                    Catch::Contains("metrics.jsonl:2: no integer \"step\""));
  CHECK_THROWS_WITH(train::write_loss_plot((dir.path() / "nothing").string()), Catch::Contains("nothing/metrics.jsonl"));
}

TEST_CASE("loss.svg: a tick at zero reads 0, not -0") {
  train::LossCurves curves;
  for (int64_t s = 1; s <= 300; ++s) curves.train.push_back({s, 0.6 * std::exp(-0.03 * static_cast<double>(s)) + 0.0005});
  const std::string svg = train::loss_svg(curves, "fine-tune");
  CHECK(svg.find(">0</text>") != std::string::npos);
  CHECK(svg.find(">-0</text>") == std::string::npos);
}
