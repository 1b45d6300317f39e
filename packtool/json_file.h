#ifndef STRATA_PACKTOOL_JSON_FILE_H_
#define STRATA_PACKTOOL_JSON_FILE_H_

// Reading a JSON file of a Hugging Face checkpoint (config.json, tokenizer.json, tokenizer_config.json).

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::packtool {

// The parsed file: NOT_FOUND when it cannot be opened (so optional files can be told apart), INVALID_ARGUMENT
// naming the path when it is not valid JSON. Any thread.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_JSON_FILE_H_
