// HTML reports rendered by a real browser (Debian's headless Chromium): the page loads without
// console errors, and the numbers in its DOM are the JSON report's numbers, as are the text's.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "test_util.h"

using namespace goodput::test;

namespace {

const char* kChromium = "/usr/bin/chromium";

std::string chromium(const std::string& args, const TempDir& dir) {
  REQUIRE_MESSAGE(std::filesystem::exists(kChromium), "Debian's chromium is needed (scripts/install-deps.sh installs it)");
  // As root in a container: no sandbox; no network: background networking off.
  const std::string cmd = std::string(kChromium) +
                          " --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update"
                          " --no-first-run --disable-sync --user-data-dir=" + dir.file("profile") +
                          " --enable-logging=stderr --v=0 " + args;
  auto r = run_command("timeout 120 " + cmd);
  INFO(r.output.substr(0, 2000));
  REQUIRE(r.exit_code == 0);
  return r.output;
}

// Attribute `attr` of the element whose `key` attribute is `value`, from the rendered DOM.
std::string attr_of(const std::string& dom, const std::string& key, const std::string& value, const std::string& attr) {
  const std::string quoted = std::regex_replace(value, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
  const std::regex re("<[^>]*" + key + "=\"" + quoted + "\"[^>]*>");
  std::smatch m;
  if (!std::regex_search(dom, m, re)) return "";
  const std::regex a(attr + "=\"([^\"]*)\"");
  std::smatch am;
  const std::string tag = m.str();
  return std::regex_search(tag, am, a) ? am[1].str() : "";
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("the replay report renders in Chromium and its numbers equal the JSON and text reports") {
  TempDir dir("html-replay");
  const std::string trace = source_path("traces/small-2048gpu-7d.jsonl");
  const std::string html = dir.file("report.html");
  auto j = run_command(goodput_cmd("replay " + trace + " --format json --html " + html));
  REQUIRE(j.exit_code == 0);
  const auto json = nlohmann::json::parse(j.output.substr(j.output.find('{'), j.output.rfind('}') - j.output.find('{') + 1));
  const auto text = run_command(goodput_cmd("replay " + trace)).output;

  const std::string out = chromium("--dump-dom file://" + html, dir);
  const std::string dom = out;
  CHECK(out.find("Uncaught") == std::string::npos);
  CHECK(out.find(":CONSOLE(") == std::string::npos);
  CHECK(std::stod(attr_of(dom, "id", "goodput", "data-value")) == json["goodput"].get<double>());
  CHECK(std::stod(attr_of(dom, "id", "accelerator-goodput", "data-value")) == json["accelerator_goodput"].get<double>());
  CHECK(std::stoll(attr_of(dom, "id", "wall", "data-value")) == json["wall_ns"].get<int64_t>());
  CHECK(std::stoll(attr_of(dom, "id", "failures", "data-value")) == json["failures"].get<int64_t>());
  CHECK(std::stoll(attr_of(dom, "data-bucket", "productive", "data-ns")) == json["productive_ns"].get<int64_t>());
  int64_t sum = std::stoll(attr_of(dom, "data-bucket", "productive", "data-ns"));
  for (const auto& [name, ns] : json["losses_ns"].items()) {
    CAPTURE(name);
    CHECK(std::stoll(attr_of(dom, "data-bucket", name, "data-ns")) == ns.get<int64_t>());
    sum += ns.get<int64_t>();
  }
  CHECK(sum == std::stoll(attr_of(dom, "data-bucket", "wall", "data-ns")));
  for (const auto& [name, n] : json["failures_by_diagnosis"].items())
    CHECK(std::stoll(attr_of(dom, "data-diagnosis", name, "data-count")) == n.get<int64_t>());
  // The text report shows the same goodput, to the same two decimals.
  const std::regex visible("id=\"goodput\"[^>]*>([0-9.]+%)<");
  std::smatch m;
  REQUIRE(std::regex_search(dom, m, visible));
  CHECK(text.find("goodput              " + m[1].str()) != std::string::npos);

  const std::string png = dir.file("report.png");
  chromium("--window-size=1200,1600 --screenshot=" + png + " file://" + html, dir);
  CHECK(std::filesystem::file_size(png) > 20'000);
}

TEST_CASE("a 54-day log stays a page a browser opens quickly: a few thousand SVG elements at most") {
  TempDir dir("html-long");
  const std::string html = dir.file("llama.html");
  REQUIRE(run_command(goodput_cmd("replay " + source_path("traces/llama3-405b-54d.jsonl") + " --html " + html)).exit_code == 0);
  const std::string page = read(html);
  std::smatch m;
  REQUIRE(std::regex_search(page, m, std::regex("data-elements=\"([0-9]+)\"")));
  CHECK(std::stoi(m[1].str()) < 4000);
  CHECK(page.size() < 2'000'000);
  CHECK(page.find("http") == std::string::npos);  // nothing fetched: self-contained
}

TEST_CASE("compare and sweep pages carry the Monte Carlo numbers and mark Daly's optimum") {
  TempDir dir("html-compare");
  const std::string trace = source_path("traces/small-2048gpu-7d.jsonl");
  const std::string cmp = dir.file("compare.html");
  auto j = run_command(goodput_cmd("compare " + trace + " --policy " + source_path("examples/policies/flash-diagnose.json") +
                                   " --policy " + source_path("examples/policies/restart-all.json") +
                                   " --runs 8 --format json --html " + cmp));
  REQUIRE(j.exit_code == 0);
  const auto json = nlohmann::json::parse(j.output.substr(j.output.find('{'), j.output.rfind('}') - j.output.find('{') + 1));
  const std::string dom = chromium("--dump-dom file://" + cmp, dir);
  for (const auto& p : json["policies"])
    CHECK(std::stod(attr_of(dom, "data-label", p["label"].get<std::string>(), "data-goodput")) ==
          p["goodput_mean"].get<double>());

  const std::string sw = dir.file("sweep.html");
  REQUIRE(run_command(goodput_cmd("sweep " + trace + " --set checkpoint.interval=1m,2m,5m,10m --runs 4 --html " + sw)).exit_code == 0);
  const std::string page = read(sw);
  CHECK(page.find("id=\"band\"") != std::string::npos);
  CHECK(page.find("id=\"marker\"") != std::string::npos);
  CHECK(page.find("Daly optimum (memory)") != std::string::npos);
}

TEST_CASE("a job that gave up says so on its page, in its text and JSON reports, and in compare's table") {
  TempDir dir("html-gave-up");
  const std::string trace = source_path("traces/small-2048gpu-7d.jsonl");
  const std::string policy = dir.write("quit.json", R"({"name":"quit","recovery":{"policy":"diagnose","max_failures":1}})");
  const std::string html = dir.file("quit.html");
  auto j = run_command(goodput_cmd("replay " + trace + " --policy " + policy + " --format json --html " + html));
  REQUIRE(j.exit_code == 0);
  const auto json = nlohmann::json::parse(j.output.substr(j.output.find('{'), j.output.rfind('}') - j.output.find('{') + 1));
  CHECK(json["gave_up"] == true);
  CHECK(json["end"] == "gave-up");
  CHECK(json["losses_ns"]["gave_up"].get<int64_t>() == json["wall_ns"].get<int64_t>() - json["gave_up_after_ns"].get<int64_t>());
  const std::string dom = chromium("--dump-dom file://" + html, dir);
  CHECK(dom.find("id=\"gave-up\"") != std::string::npos);
  CHECK(std::stoll(attr_of(dom, "data-bucket", "gave_up", "data-ns")) == json["losses_ns"]["gave_up"].get<int64_t>());
  CHECK(run_command(goodput_cmd("replay " + trace + " --policy " + policy)).output.find("GAVE UP after") != std::string::npos);
  auto c = run_command(goodput_cmd("compare " + trace + " --policy " + policy + " --policy " +
                                   source_path("examples/policies/flash-diagnose.json") + " --runs 4 --format json"));
  REQUIRE(c.exit_code == 0);
  const auto cj = nlohmann::json::parse(c.output.substr(c.output.find('{'), c.output.rfind('}') - c.output.find('{') + 1));
  CHECK(cj["policies"][0]["gave_up_share"].get<double>() == 1.0);
  CHECK(cj["policies"][1]["gave_up_share"].get<double>() == 0.0);
}
