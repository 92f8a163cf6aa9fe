#include "report/html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace goodput {
namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v, int digits = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::string exact(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string pct(double v) { return num(v * 100.0, 2) + "%"; }

// Colours per phase and loss (one palette for the bar, the table and the timeline).
const char* phase_colour(Phase p) {
  switch (p) {
    case Phase::Training: return "#3a9d5d";
    case Phase::Scheduling: return "#e0a526";
    case Phase::WaitingForCapacity: return "#9e9e9e";
    case Phase::GaveUp: return "#444444";
    case Phase::Restart: return "#e4572e";
    case Phase::Rendezvous: return "#c2448f";
    case Phase::CheckpointLoad: return "#3f7fbf";
    default: return "#cccccc";
  }
}
const char* loss_colour(int i) {
  static const char* c[kLossCount] = {"#8c564b", "#e4572e", "#e0a526", "#c2448f", "#3f7fbf",
                                      "#d62728", "#17becf", "#bcbd22", "#9467bd", "#9e9e9e",
                                      "#5d4e8c", "#444444"};
  return c[i];
}

const char* kStyle = R"(<style>
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.sub{color:#666;margin-bottom:16px}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{border:1px solid #ddd;border-radius:8px;padding:10px 14px;min-width:150px}
.card .v{font-size:24px;font-weight:600}.card .k{color:#666;font-size:12px}
table{border-collapse:collapse;margin-top:6px}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left}
.sw{display:inline-block;width:10px;height:10px;margin-right:6px;border-radius:2px;vertical-align:middle}
.legend span{margin-right:14px;white-space:nowrap}
svg text{font:11px system-ui,sans-serif;fill:#444}
.note{color:#666;font-size:12px}
.warn{color:#b00020;font-weight:bold}
</style>)";

std::string head(const std::string& title) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + esc(title) +
         "</title>\n<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">" + kStyle + "</head>\n<body>\n";
}

// Time axis labels in days or hours.
std::string time_label(Duration d) {
  if (d >= 2 * kDay) return num(static_cast<double>(d) / kDay, d % kDay ? 1 : 0) + "d";
  if (d >= 2 * kHour) return num(static_cast<double>(d) / kHour, d % kHour ? 1 : 0) + "h";
  return num(static_cast<double>(d) / kMinute, 0) + "m";
}

void loss_section(std::ostringstream& o, const Report& r) {
  o << "<h2>Where the time went</h2>\n";
  const double W = 1100;
  o << "<svg id=\"breakdown\" width=\"" << W << "\" height=\"34\" role=\"img\" aria-label=\"breakdown of wall time\">";
  double x = 0;
  auto seg = [&](Duration d, const char* colour, const std::string& name) {
    if (d <= 0 || r.wall <= 0) return;
    const double w = W * static_cast<double>(d) / static_cast<double>(r.wall);
    o << "<rect x=\"" << num(x, 3) << "\" y=\"4\" width=\"" << num(w, 3) << "\" height=\"26\" fill=\"" << colour
      << "\"><title>" << esc(name) << ": " << format_duration(d) << " (" << pct(static_cast<double>(d) / r.wall)
      << ")</title></rect>";
    x += w;
  };
  seg(r.productive, "#3a9d5d", "productive");
  for (int i = 0; i < kLossCount; ++i) seg(r.loss[i], loss_colour(i), std::string(to_string(static_cast<Loss>(i))));
  o << "</svg>\n<table id=\"losses\"><tr><th>bucket</th><th>time</th><th>share of wall time</th></tr>\n";
  auto row = [&](const std::string& name, Duration d, const char* colour, bool productive) {
    o << "<tr data-bucket=\"" << name << "\" data-ns=\"" << d << "\"><td><span class=\"sw\" style=\"background:"
      << colour << "\"></span>" << esc(name) << "</td><td>" << format_duration(d) << "</td><td"
      << (productive ? " id=\"productive-share\"" : "") << ">" << pct(r.wall ? static_cast<double>(d) / r.wall : 0)
      << "</td></tr>\n";
  };
  row("productive", r.productive, "#3a9d5d", true);
  for (int i = 0; i < kLossCount; ++i)
    row(std::string(to_string(static_cast<Loss>(i))), r.loss[i], loss_colour(i), false);
  o << "<tr data-bucket=\"wall\" data-ns=\"" << r.wall << "\"><th>wall time</th><th>" << format_duration(r.wall)
    << "</th><th>100.00%</th></tr></table>\n";
}

void timeline_section(std::ostringstream& o, const Timeline& t, const Report& r) {
  const double W = 1100, left = 90;
  const double plotW = W - left - 10;
  const Duration span = std::max<Duration>(1, t.end - t.start);
  auto X = [&](Time v) { return left + plotW * static_cast<double>(v - t.start) / static_cast<double>(span); };
  const double phaseY = 20, phaseH = 18, progY = 52, progH = 120, markY = progY + progH + 16;
  const double lanesY = markY + 40, laneH = 16;
  const double H = lanesY + laneH * static_cast<double>(t.lanes.size()) + 30;
  int elements = 0;
  o << "<h2>Timeline</h2>\n<div class=\"legend\">";
  for (Phase p : {Phase::Training, Phase::Scheduling, Phase::Restart, Phase::Rendezvous, Phase::CheckpointLoad,
                  Phase::WaitingForCapacity, Phase::GaveUp})
    o << "<span><span class=\"sw\" style=\"background:" << phase_colour(p) << "\"></span>" << to_string(p) << "</span>";
  o << "<span><span class=\"sw\" style=\"background:#d62728\"></span>failure</span>"
    << "<span><span class=\"sw\" style=\"background:#1f77b4\"></span>checkpoint to memory</span>"
    << "<span><span class=\"sw\" style=\"background:#2ca02c\"></span>checkpoint to storage / persisted</span>"
    << "<span><span class=\"sw\" style=\"background:#ff7f0e\"></span>trainers restarted</span>"
    << "<span><span class=\"sw\" style=\"background:#9467bd\"></span>scale change</span></div>\n";
  o << "<svg id=\"timeline\" width=\"" << W << "\" height=\"" << num(H, 0) << "\" role=\"img\" aria-label=\"timeline\">\n";
  // Axis.
  for (int i = 0; i <= 8; ++i) {
    const Time v = t.start + span * i / 8;
    o << "<line x1=\"" << num(X(v), 1) << "\" y1=\"14\" x2=\"" << num(X(v), 1) << "\" y2=\"" << num(H - 16, 0)
      << "\" stroke=\"#eee\"/><text x=\"" << num(X(v), 1) << "\" y=\"" << num(H - 4, 0) << "\" text-anchor=\"middle\">"
      << time_label(v - t.start) << "</text>";
    elements += 2;
  }
  o << "<text x=\"4\" y=\"" << phaseY + 13 << "\">job phase</text>";
  for (const auto& sp : t.phases) {
    o << "<rect x=\"" << num(X(sp.start), 2) << "\" y=\"" << phaseY << "\" width=\""
      << num(std::max(0.5, X(sp.end) - X(sp.start)), 2) << "\" height=\"" << phaseH << "\" fill=\""
      << phase_colour(sp.phase) << "\"><title>" << to_string(sp.phase) << " " << format_duration(sp.end - sp.start)
      << "</title></rect>";
    ++elements;
  }
  // Progress: steps kept, and the cumulative progress thrown away.
  const Duration maxp = std::max<Duration>(1, std::max(r.productive + r.loss[static_cast<int>(Loss::Recompute)],
                                                       t.progress.empty() ? 1 : t.progress.back().progress));
  auto Y = [&](Duration p) { return progY + progH - progH * static_cast<double>(p) / static_cast<double>(maxp); };
  o << "<text x=\"4\" y=\"" << progY + 12 << "\">progress</text><text x=\"4\" y=\"" << progY + 26
    << "\" class=\"note\">kept / lost</text>";
  std::string kept, lost;
  for (const auto& p : t.progress) {
    kept += num(X(p.t), 1) + "," + num(Y(p.progress), 1) + " ";
    lost += num(X(p.t), 1) + "," + num(Y(p.lost), 1) + " ";
  }
  o << "<polyline id=\"progress-kept\" fill=\"none\" stroke=\"#3a9d5d\" stroke-width=\"1.5\" points=\"" << kept << "\"/>";
  o << "<polyline id=\"progress-lost\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"1\" points=\"" << lost << "\"/>";
  o << "<rect x=\"" << left << "\" y=\"" << progY << "\" width=\"" << plotW << "\" height=\"" << progH
    << "\" fill=\"none\" stroke=\"#ddd\"/>";
  elements += 3;
  // Markers.
  o << "<text x=\"4\" y=\"" << markY + 4 << "\">events</text>";
  for (const auto& m : t.markers) {
    const double x = X(m.t);
    std::string shape;
    if (m.kind == "failure")
      shape = "<path d=\"M" + num(x, 1) + " " + num(markY - 6, 1) + " l5 9 h-10z\" fill=\"#d62728\">";
    else if (m.kind == "restart")
      shape = "<circle cx=\"" + num(x, 1) + "\" cy=\"" + num(markY + 14, 1) + "\" r=\"3\" fill=\"#ff7f0e\">";
    else if (m.kind == "scale")
      shape = "<rect x=\"" + num(x - 3, 1) + "\" y=\"" + num(markY + 18, 1) + "\" width=\"6\" height=\"6\" fill=\"#9467bd\">";
    else
      shape = "<rect x=\"" + num(x, 1) + "\" y=\"" + num(m.kind == "checkpoint_memory" ? markY + 26 : markY + 31, 1) +
              "\" width=\"1\" height=\"4\" fill=\"" + (m.kind == "checkpoint_memory" ? "#1f77b4" : "#2ca02c") + "\">";
    const std::string tag = shape.substr(1, shape.find(' ') - 1);
    o << shape << "<title>" << time_label(m.t - t.start) << ": " << esc(m.label) << "</title></" << tag << ">";
    ++elements;
  }
  // Node lanes.
  for (size_t i = 0; i < t.lanes.size(); ++i) {
    const auto& lane = t.lanes[i];
    const double y = lanesY + laneH * static_cast<double>(i);
    o << "<text x=\"4\" y=\"" << num(y + 11, 0) << "\">" << esc(lane.name) << "</text>";
    o << "<rect x=\"" << left << "\" y=\"" << num(y + 3, 0) << "\" width=\"" << plotW
      << "\" height=\"10\" fill=\"#f3f3f3\"/>";
    for (const auto& sp : lane.spans)
      o << "<rect x=\"" << num(X(sp.start), 2) << "\" y=\"" << num(y + 3, 0) << "\" width=\""
        << num(std::max(0.5, X(sp.end) - X(sp.start)), 2) << "\" height=\"10\" fill=\"#a6d8b4\"><title>" << esc(lane.name)
        << " in the job " << format_duration(sp.end - sp.start) << "</title></rect>";
    for (const auto& m : lane.markers)
      o << "<path d=\"M" << num(X(m.t), 1) << " " << num(y + 2, 0) << " l4 6 l-4 6 l-4 -6z\" fill=\"#d62728\"><title>"
        << esc(m.label) << "</title></path>";
    elements += 2 + static_cast<int>(lane.spans.size() + lane.markers.size());
  }
  o << "</svg>\n<p class=\"note\" id=\"timeline-note\" data-elements=\"" << elements << "\">Lanes: nodes that failed or joined "
    << "after the start (" << t.lanes.size() << " shown"
    << (t.lanes_omitted ? ", " + std::to_string(t.lanes_omitted) + " more not drawn" : std::string()) << "); green: in the job. "
    << "Short phases and checkpoint ticks are folded per pixel column on long runs.</p>\n";
}

}  // namespace

std::string report_html(const Report& r, const Timeline& t, const std::string& title) {
  std::ostringstream o;
  o << head(title) << "<h1>" << esc(title) << "</h1>\n<div class=\"sub\">job <b>" << esc(r.job) << "</b>, policy <b>"
    << esc(r.policy) << "</b>, " << r.nodes << " nodes, " << r.accelerators << " accelerators, ended: "
    << esc(r.end_reason) << "</div>\n";
  if (r.gave_up) {
    o << "<p class=\"warn\" id=\"gave-up\">The job gave up after " << esc(format_duration(r.gave_up_after)) << " and "
      << r.failures << " failures";
    if (r.loss[static_cast<size_t>(Loss::GaveUp)] >= kMillisecond)
      o << "; the remaining " << esc(format_duration(r.wall - r.gave_up_after)) << " of its wall time are charged as gave_up";
    o << ". Why: " << esc(r.gave_up_reason) << "</p>\n";
  }
  o << "<div class=\"cards\">\n";
  auto card = [&](const char* id, const std::string& text, const std::string& value, const char* label) {
    o << "<div class=\"card\"><div class=\"v\" id=\"" << id << "\" data-value=\"" << value << "\">" << text
      << "</div><div class=\"k\">" << label << "</div></div>\n";
  };
  card("goodput", pct(r.goodput), exact(r.goodput), "goodput");
  card("accelerator-goodput", pct(r.accelerator_goodput), exact(r.accelerator_goodput), "accelerator-weighted goodput");
  card("wall", format_duration(r.wall), std::to_string(r.wall), "wall time");
  card("failures", std::to_string(r.failures), std::to_string(r.failures), "failures");
  card("steps", std::to_string(r.steps), std::to_string(r.steps), "steps kept");
  card("restarts", std::to_string(r.restarts), std::to_string(r.restarts), "restarts");
  o << "</div>\n<table id=\"diagnoses\"><tr><th>failures by diagnosis</th><th>count</th></tr>\n";
  for (int i = 0; i < kDiagnosisCount; ++i)
    o << "<tr data-diagnosis=\"" << to_string(static_cast<Diagnosis>(i)) << "\" data-count=\"" << r.by_diagnosis[i]
      << "\"><td>" << to_string(static_cast<Diagnosis>(i)) << "</td><td>" << r.by_diagnosis[i] << "</td></tr>\n";
  o << "</table>\n";
  loss_section(o, r);
  timeline_section(o, t, r);
  o << "<p class=\"note\">Generated by goodput from " << r.events << " events. Goodput = productive time / wall time; "
    << "accelerator-weighted goodput = productive accelerator-time / accelerator-time held.</p>\n</body></html>\n";
  return o.str();
}

std::string summaries_html(const std::vector<Summary>& rows, const std::string& title, const std::string& first_column,
                           const std::optional<SummaryPlot>& plot) {
  std::ostringstream o;
  o << head(title) << "<h1>" << esc(title) << "</h1>\n";
  o << "<table id=\"summaries\"><tr><th>" << esc(first_column) << "</th><th>runs</th><th>goodput</th><th>p5</th><th>p95</th>"
    << "<th>accelerator-weighted</th><th>failures</th><th>gave up</th></tr>\n";
  for (const Summary& s : rows)
    o << "<tr data-label=\"" << esc(s.label) << "\" data-goodput=\"" << exact(s.goodput_mean) << "\" data-p5=\""
      << exact(s.goodput_p5) << "\" data-p95=\"" << exact(s.goodput_p95) << "\" data-gave-up=\"" << exact(s.gave_up_share)
      << "\"><td>" << esc(s.label) << "</td><td>"
      << s.runs << "</td><td>" << pct(s.goodput_mean) << "</td><td>" << pct(s.goodput_p5) << "</td><td>"
      << pct(s.goodput_p95) << "</td><td>" << pct(s.accelerator_goodput_mean) << "</td><td>" << num(s.failures_mean, 1)
      << "</td><td>" << pct(s.gave_up_share) << "</td></tr>\n";
  o << "</table>\n";
  if (rows.empty()) return o.str() + "</body></html>\n";
  double lo = 1, hi = 0;
  for (const Summary& s : rows) {
    lo = std::min(lo, s.goodput_p5);
    hi = std::max(hi, s.goodput_p95);
  }
  const double pad = std::max(0.005, (hi - lo) * 0.1);
  lo = std::max(0.0, lo - pad);
  hi = std::min(1.0, hi + pad);
  const double W = 900, H = 320, left = 70, right = 20, top = 20, bottom = 50;
  auto Y = [&](double g) { return top + (H - top - bottom) * (1 - (g - lo) / std::max(1e-9, hi - lo)); };
  o << "<h2>Goodput (mean, p5 to p95)</h2>\n<svg id=\"summary-plot\" width=\"" << W << "\" height=\"" << H << "\">\n";
  for (int i = 0; i <= 4; ++i) {
    const double g = lo + (hi - lo) * i / 4;
    o << "<line x1=\"" << left << "\" x2=\"" << W - right << "\" y1=\"" << num(Y(g), 1) << "\" y2=\"" << num(Y(g), 1)
      << "\" stroke=\"#eee\"/><text x=\"" << left - 6 << "\" y=\"" << num(Y(g) + 4, 1) << "\" text-anchor=\"end\">"
      << pct(g) << "</text>";
  }
  if (plot && plot->x.size() == rows.size()) {
    double xl = *std::min_element(plot->x.begin(), plot->x.end()), xh = *std::max_element(plot->x.begin(), plot->x.end());
    if (plot->marker_x) {
      xl = std::min(xl, *plot->marker_x);
      xh = std::max(xh, *plot->marker_x);
    }
    if (xh <= xl) xh = xl + 1;
    auto X = [&](double v) { return left + (W - left - right) * (v - xl) / (xh - xl); };
    std::vector<size_t> idx(rows.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return plot->x[a] < plot->x[b]; });
    std::string band, line;
    for (size_t i : idx) band += num(X(plot->x[i]), 1) + "," + num(Y(rows[i].goodput_p95), 1) + " ";
    for (auto it = idx.rbegin(); it != idx.rend(); ++it) band += num(X(plot->x[*it]), 1) + "," + num(Y(rows[*it].goodput_p5), 1) + " ";
    for (size_t i : idx) line += num(X(plot->x[i]), 1) + "," + num(Y(rows[i].goodput_mean), 1) + " ";
    o << "<polygon id=\"band\" points=\"" << band << "\" fill=\"#3a9d5d\" fill-opacity=\"0.18\"/>";
    o << "<polyline id=\"mean\" points=\"" << line << "\" fill=\"none\" stroke=\"#3a9d5d\" stroke-width=\"2\"/>";
    for (size_t i : idx)
      o << "<circle cx=\"" << num(X(plot->x[i]), 1) << "\" cy=\"" << num(Y(rows[i].goodput_mean), 1)
        << "\" r=\"3\" fill=\"#3a9d5d\"><title>" << esc(rows[i].label) << ": " << pct(rows[i].goodput_mean)
        << "</title></circle><text x=\"" << num(X(plot->x[i]), 1) << "\" y=\"" << H - bottom + 16
        << "\" text-anchor=\"middle\">" << num(plot->x[i], plot->x[i] < 10 ? 2 : 0) << "</text>";
    if (plot->marker_x)
      o << "<line id=\"marker\" data-x=\"" << exact(*plot->marker_x) << "\" x1=\"" << num(X(*plot->marker_x), 1)
        << "\" x2=\"" << num(X(*plot->marker_x), 1) << "\" y1=\"" << top << "\" y2=\"" << H - bottom
        << "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/><text x=\"" << num(X(*plot->marker_x) + 4, 1) << "\" y=\""
        << top + 12 << "\" fill=\"#d62728\">" << esc(plot->marker_label) << "</text>";
    o << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 8 << "\" text-anchor=\"middle\">" << esc(plot->x_label)
      << "</text>";
  } else {
    const double slot = (W - left - right) / static_cast<double>(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const double cx = left + slot * (static_cast<double>(i) + 0.5);
      o << "<rect x=\"" << num(cx - slot * 0.3, 1) << "\" y=\"" << num(Y(rows[i].goodput_mean), 1) << "\" width=\""
        << num(slot * 0.6, 1) << "\" height=\"" << num(H - bottom - Y(rows[i].goodput_mean), 1)
        << "\" fill=\"#3a9d5d\" fill-opacity=\"0.7\"><title>" << esc(rows[i].label) << ": " << pct(rows[i].goodput_mean)
        << "</title></rect><line x1=\"" << num(cx, 1) << "\" x2=\"" << num(cx, 1) << "\" y1=\""
        << num(Y(rows[i].goodput_p5), 1) << "\" y2=\"" << num(Y(rows[i].goodput_p95), 1)
        << "\" stroke=\"#222\" stroke-width=\"1.5\"/><text x=\"" << num(cx, 1) << "\" y=\"" << H - bottom + 16
        << "\" text-anchor=\"middle\">" << esc(rows[i].label) << "</text><text x=\"" << num(cx, 1) << "\" y=\""
        << num(Y(rows[i].goodput_mean) - 6, 1) << "\" text-anchor=\"middle\">" << pct(rows[i].goodput_mean) << "</text>";
    }
  }
  o << "</svg>\n";
  // The largest losses, side by side.
  o << "<h2>Mean share of wall time lost, by cause</h2>\n<table id=\"loss-shares\"><tr><th>" << esc(first_column) << "</th>";
  for (int i = 0; i < kLossCount; ++i) o << "<th>" << to_string(static_cast<Loss>(i)) << "</th>";
  o << "</tr>\n";
  for (const Summary& s : rows) {
    o << "<tr><td>" << esc(s.label) << "</td>";
    for (int i = 0; i < kLossCount; ++i) o << "<td>" << pct(s.loss_share_mean[i]) << "</td>";
    o << "</tr>\n";
  }
  o << "</table>\n</body></html>\n";
  return o.str();
}

}  // namespace goodput
