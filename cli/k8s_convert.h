// `goodput k8s convert`: other operators' jobs (a Kubeflow PyTorchJob) as GoodputJobs.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace goodput {

struct ConvertedJob {
  nlohmann::ordered_json job;            // the GoodputJob (goodput.dev/v1alpha1)
  std::vector<std::string> not_carried;  // each field that has no GoodputJob counterpart, and why
};

// Throws std::runtime_error naming the field when the manifest is not a PyTorchJob Goodput can run.
ConvertedJob convert_pytorchjob(const nlohmann::json& manifest);

void add_k8s_commands(CLI::App& app, int& rc);

}  // namespace goodput
