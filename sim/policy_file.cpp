#include "sim/policy_file.h"

#include <fstream>
#include <sstream>

namespace goodput {

PolicySet load_policy_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw PolicyError(path + ": cannot open policy file");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw PolicyError(path + ": not valid JSON: " + e.what());
  }
  try {
    return load_policy(j);
  } catch (const PolicyError& e) {
    throw PolicyError(path + ": " + e.what());
  }
}

}  // namespace goodput
