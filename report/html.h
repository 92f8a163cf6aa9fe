// Self-contained HTML pages (inline CSS and SVG, no scripts, nothing fetched) from the same report
// model as the text and JSON output. Every number a test may compare carries its exact value in a
// data- attribute next to the text people read.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/report.h"
#include "report/timeline.h"

namespace goodput {

std::string report_html(const Report& report, const Timeline& timeline, const std::string& title);

// Compare and sweep. With `x` (one value per row, e.g. the checkpoint interval in seconds) the
// page draws goodput against x with the p5-p95 band, and `marker_x` as a vertical line (Young/Daly).
struct SummaryPlot {
  std::string x_label;
  std::vector<double> x;
  std::optional<double> marker_x;
  std::string marker_label;
};
std::string summaries_html(const std::vector<Summary>& rows, const std::string& title, const std::string& first_column,
                           const std::optional<SummaryPlot>& plot);

}  // namespace goodput
