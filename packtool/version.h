#ifndef STRATA_PACKTOOL_VERSION_H_
#define STRATA_PACKTOOL_VERSION_H_

#include <string>

namespace strata::packtool {

// "strata-pack <project version>", recorded in every manifest this library writes.
std::string ToolVersion();

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_VERSION_H_
