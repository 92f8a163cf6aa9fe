// Reading a policy file: the file system stays out of policies/, which only parses JSON.
#pragma once

#include <string>

#include "policies/policy.h"

namespace goodput {

// Throws PolicyError naming the file and the field.
PolicySet load_policy_file(const std::string& path);

}  // namespace goodput
